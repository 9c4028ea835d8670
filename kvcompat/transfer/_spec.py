"""A pool as a transfer engine sees it: its registered buffers, serialisable as JSON.

A :class:`PoolSpec` is what two processes exchange before a transfer: every
buffer SGLang would register for PD (from
:func:`kvcompat.inspection.transfer_descriptors`, in SGLang's order), with the
facts a plan must check (item bytes, dtype, row shape, layer id) and the
configuration of each component (layout, page size, compress ratio, ring
size...). It holds addresses, so it is only meaningful while the pool lives.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from kvcompat.inspection import PoolManifest, TransferGroup, describe, transfer_descriptors
from kvcompat.inspection._static import static_attr
from kvcompat.transfer._errors import TransferPlanError

__all__ = ["BufferSpec", "ComponentSpec", "PoolSpec", "pool_spec"]

SPEC_VERSION = 1
"""Version of the JSON form; :meth:`PoolSpec.from_dict` refuses other versions."""

# Details that size a pool rather than shape it: two pools of one model may differ here.
_CAPACITY_DETAILS = frozenset(
    {"swa_pages", "capacity", "num_slots", "start_layer", "swa_ring_size"}
)
# DeepSeek-V4 ``unified_kv``: the composite's window and ring stride, which the
# ring rows of a request depend on (SGLang's PD path reads them off the composite).
_RING_ATTRS = (("unified_swa_window", "swa_window"), ("unified_swa_ring_size", "swa_ring_size"))
_INDEX = re.compile(r"\[\d+\]")


@dataclass(frozen=True)
class BufferSpec:
    """One registered buffer range of a pool.

    Attributes:
        group: the transfer group (``"kv"``, ``"state"``, ...; see
            :class:`~kvcompat.inspection.TransferGroup`).
        component: manifest component owning it (``"swa"``, ``"c4"``, ...).
        path: attribute path from the pool (``"kv_pools[4].kv_buffer[0]"``).
        layer_id: absolute layer id, or None for per-request rows.
        role: what it holds (``"packed_kv"``, ``"key"``, ...).
        device: device string (``"cpu"``, ``"cuda:0"``).
        ptr: address of the first byte.
        length: bytes in the range.
        item_length: bytes of one page (transfer item); page ``i`` starts at
            ``ptr + i * item_length``.
        dtype: element dtype of the tensor.
        row_shape: the tensor's shape without its leading axis.
        row_bytes: bytes of one row (one index of the leading axis).
        row_unit: what one row is (``"token"``, ``"page"``, ``"slot"``, ``"state"``),
            or None.

    Example:
        >>> from kvcompat.transfer import pool_spec
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool
        >>> buf = pool_spec(ReferenceMHATokenToKVPool(32, 16, layer_num=1)).buffers[0]
        >>> buf.label, buf.items, buf.item_length
        ('k_buffer[0] (layer 0)', 3, 4096)
    """

    group: str
    component: str
    path: str
    layer_id: int | None
    role: str
    device: str
    ptr: int
    length: int
    item_length: int
    dtype: str
    row_shape: tuple[int, ...]
    row_bytes: int = 0
    row_unit: str | None = None

    @property
    def items(self) -> int:
        """Whole pages in the range.

        Example:
            >>> from kvcompat.transfer import pool_spec
            >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
            >>> pool_spec(ReferenceDeepSeekV4SingleKVPool(64, 64)).buffers[0].items
            2
        """
        return self.length // self.item_length if self.item_length else 0

    @property
    def label(self) -> str:
        """How errors name the buffer: its path and layer.

        Example:
            >>> from kvcompat.transfer import pool_spec
            >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
            >>> pool_spec(ReferenceDeepSeekV4SingleKVPool(64, 64)).buffers[0].label
            'kv_buffer[0] (layer 0)'
        """
        layer = "no layer" if self.layer_id is None else f"layer {self.layer_id}"
        return f"{self.path} ({layer})"

    @property
    def key(self) -> tuple[str, str, str, int | None, str]:
        """What pairs it with the other pool's buffer: group, component, role, layer, path shape.

        Indices are dropped from the path, so that a pipeline stage's
        ``kv_buffer[0]`` of layer 4 pairs with a whole model's ``kv_buffer[4]``.

        Example:
            >>> from kvcompat.transfer import pool_spec
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> pool_spec(ReferenceMHATokenToKVPool(16, 16, layer_num=1)).buffers[1].key
            ('kv', 'ReferenceMHATokenToKVPool', 'value', 0, 'v_buffer[]')
        """
        return (self.group, self.component, self.role, self.layer_id, _INDEX.sub("[]", self.path))

    @property
    def memory(self) -> tuple[str, int]:
        """``(mem_type, device_id)`` as NIXL names them: ``("DRAM", 0)`` or ``("VRAM", n)``.

        Example:
            >>> from kvcompat.transfer import pool_spec
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> pool_spec(ReferenceMHATokenToKVPool(16, 16)).buffers[0].memory
            ('DRAM', 0)
        """
        if self.device.startswith("cuda"):
            _, _, index = self.device.partition(":")
            return ("VRAM", int(index or 0))
        return ("DRAM", 0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form.

        Example:
            >>> from kvcompat.transfer import BufferSpec, pool_spec
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> buf = pool_spec(ReferenceMHATokenToKVPool(16, 16)).buffers[0]
            >>> BufferSpec.from_dict(buf.to_dict()) == buf
            True
        """
        return {
            "group": self.group,
            "component": self.component,
            "path": self.path,
            "layer_id": self.layer_id,
            "role": self.role,
            "device": self.device,
            "ptr": self.ptr,
            "length": self.length,
            "item_length": self.item_length,
            "dtype": self.dtype,
            "row_shape": list(self.row_shape),
            "row_bytes": self.row_bytes,
            "row_unit": self.row_unit,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BufferSpec:
        """Inverse of :meth:`to_dict`.

        Example:
            >>> from kvcompat.transfer import BufferSpec, pool_spec
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> data = pool_spec(ReferenceMHATokenToKVPool(16, 16)).buffers[0].to_dict()
            >>> BufferSpec.from_dict(data).path
            'k_buffer[0]'
        """
        layer = data["layer_id"]
        return cls(
            group=str(data["group"]),
            component=str(data["component"]),
            path=str(data["path"]),
            layer_id=None if layer is None else int(layer),
            role=str(data["role"]),
            device=str(data["device"]),
            ptr=int(data["ptr"]),
            length=int(data["length"]),
            item_length=int(data["item_length"]),
            dtype=str(data["dtype"]),
            row_shape=tuple(int(n) for n in data["row_shape"]),
            row_bytes=int(data.get("row_bytes", 0)),
            row_unit=None if data.get("row_unit") is None else str(data["row_unit"]),
        )


@dataclass(frozen=True)
class ComponentSpec:
    """The configuration of one component (sub-pool, state pool) that a plan compares.

    Attributes:
        name: the component's manifest name.
        kind: its :class:`~kvcompat.PoolKind` value, or None.
        layout: the byte-layout name, or None.
        page_size: tokens (or rows) per page, or None.
        layer_ids: absolute layer ids it serves.
        details: plain facts read from the native object (compress ratio,
            ring size, head dims...).

    Example:
        >>> from kvcompat.transfer import pool_spec
        >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
        >>> spec = pool_spec(ReferenceDeepSeekV4SingleKVPool(64, 64, layer_num=2))
        >>> part = spec.components["ReferenceDeepSeekV4SingleKVPool"]
        >>> part.layout, part.page_size, part.layer_ids
        ('v4', 64, (0, 1))
    """

    name: str
    kind: str | None
    layout: str | None
    page_size: int | None
    layer_ids: tuple[int, ...]
    details: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), hash=False)

    def config(self) -> dict[str, Any]:
        """What must be equal on both sides of a transfer (capacities may differ).

        Example:
            >>> from kvcompat.transfer import pool_spec
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> spec = pool_spec(ReferenceMHATokenToKVPool(16, 16))
            >>> spec.components["ReferenceMHATokenToKVPool"].config()["page_size"]
            16
        """
        details = {k: v for k, v in self.details.items() if k not in _CAPACITY_DETAILS}
        return {"kind": self.kind, "layout": self.layout, "page_size": self.page_size, **details}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form.

        Example:
            >>> from kvcompat.transfer import ComponentSpec
            >>> ComponentSpec("c4", "single_kv", "v4", 64, (1,)).to_dict()["layer_ids"]
            [1]
        """
        return {
            "name": self.name,
            "kind": self.kind,
            "layout": self.layout,
            "page_size": self.page_size,
            "layer_ids": list(self.layer_ids),
            "details": dict(self.details),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ComponentSpec:
        """Inverse of :meth:`to_dict`.

        Example:
            >>> from kvcompat.transfer import ComponentSpec
            >>> part = ComponentSpec("c4", "single_kv", "v4", 64, (1,))
            >>> ComponentSpec.from_dict(part.to_dict()) == part
            True
        """
        page = data.get("page_size")
        return cls(
            name=str(data["name"]),
            kind=None if data.get("kind") is None else str(data["kind"]),
            layout=None if data.get("layout") is None else str(data["layout"]),
            page_size=None if page is None else int(page),
            layer_ids=tuple(int(n) for n in data.get("layer_ids", ())),
            details=MappingProxyType(dict(data.get("details", {}))),
        )


@dataclass(frozen=True)
class PoolSpec:
    """Every buffer a pool registers for transfer, and each component's configuration.

    Build one with :func:`pool_spec`; send it to the peer process as
    :meth:`to_json` and rebuild it there with :meth:`from_json`.

    Attributes:
        name: the pool's class name.
        native_class: ``"module.QualName"`` of the pool.
        page_size: the pool's page size (tokens), or None.
        buffers: the registered buffers, in SGLang's registration order.
        components: configuration per component name.

    Example:
        >>> from kvcompat.transfer import PoolSpec, pool_spec
        >>> from kvcompat.testing import reference_swa_pool
        >>> spec = pool_spec(reference_swa_pool())
        >>> PoolSpec.from_json(spec.to_json()) == spec
        True
        >>> sorted({b.group for b in spec.buffers})
        ['kv', 'state']
    """

    name: str
    native_class: str
    page_size: int | None
    buffers: tuple[BufferSpec, ...]
    components: Mapping[str, ComponentSpec] = field(hash=False)

    def groups(self) -> tuple[str, ...]:
        """The transfer groups the pool registers, in :class:`TransferGroup` order.

        Example:
            >>> from kvcompat.transfer import pool_spec
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> pool_spec(ReferenceMHATokenToKVPool(16, 16)).groups()
            ('kv',)
        """
        present = {b.group for b in self.buffers}
        return tuple(g.value for g in TransferGroup if g.value in present)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (with a version number).

        Example:
            >>> from kvcompat.transfer import pool_spec
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> pool_spec(ReferenceMHATokenToKVPool(16, 16)).to_dict()["version"]
            1
        """
        return {
            "version": SPEC_VERSION,
            "name": self.name,
            "native_class": self.native_class,
            "page_size": self.page_size,
            "buffers": [b.to_dict() for b in self.buffers],
            "components": [c.to_dict() for c in self.components.values()],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PoolSpec:
        """Inverse of :meth:`to_dict`.

        Raises:
            TransferPlanError: the data is not a pool spec of this version.

        Example:
            >>> from kvcompat.transfer import PoolSpec
            >>> try:
            ...     PoolSpec.from_dict({"version": 99})
            ... except ValueError as exc:
            ...     print(exc.args[0].splitlines()[0])
            not a kvcompat pool spec of version 1: got version 99.
        """
        version = data.get("version") if isinstance(data, Mapping) else None
        if version != SPEC_VERSION:
            msg = (
                f"not a kvcompat pool spec of version {SPEC_VERSION}: got version {version!r}.\n"
                "Hint: build the spec with kvcompat.transfer.pool_spec(pool).to_dict() "
                "from the same kvcompat version on both sides."
            )
            raise TransferPlanError(msg)
        page = data.get("page_size")
        parts = [ComponentSpec.from_dict(c) for c in data["components"]]
        return cls(
            name=str(data["name"]),
            native_class=str(data["native_class"]),
            page_size=None if page is None else int(page),
            buffers=tuple(BufferSpec.from_dict(b) for b in data["buffers"]),
            components=MappingProxyType({c.name: c for c in parts}),
        )

    def to_json(self) -> str:
        """The spec as a JSON string.

        Example:
            >>> import json
            >>> from kvcompat.transfer import pool_spec
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> json.loads(pool_spec(ReferenceMHATokenToKVPool(16, 16)).to_json())["page_size"]
            16
        """
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> PoolSpec:
        """Inverse of :meth:`to_json`.

        Example:
            >>> from kvcompat.transfer import PoolSpec, pool_spec
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> text = pool_spec(ReferenceMHATokenToKVPool(16, 16)).to_json()
            >>> PoolSpec.from_json(text).name
            'ReferenceMHATokenToKVPool'
        """
        return cls.from_dict(json.loads(text))


def _ring_details(pool: Any) -> dict[str, int]:
    """``swa_window`` and ``swa_ring_size`` of a ``unified_kv`` composite (read statically)."""
    found: dict[str, int] = {}
    for obj in (pool, static_attr(pool, "native", None)):
        if obj is None:
            continue
        for attr, key in _RING_ATTRS:
            value = static_attr(obj, attr, None)
            if isinstance(value, int) and not isinstance(value, bool):
                found.setdefault(key, int(value))
    return found


def _component(node: PoolManifest) -> ComponentSpec:
    return ComponentSpec(
        name=node.name,
        kind=None if node.kind is None else node.kind.value,
        layout=node.layout,
        page_size=node.page_size,
        layer_ids=tuple(node.layer_ids),
        details=MappingProxyType(dict(node.details)),
    )


def pool_spec(pool: Any) -> PoolSpec:
    """The :class:`PoolSpec` of a pool (native, adapter, manifest, spec, or its dict/JSON form).

    Built from :func:`kvcompat.inspection.describe` and
    :func:`~kvcompat.inspection.transfer_descriptors`, so no native getter runs.

    Raises:
        UnsupportedPoolError: ``pool`` is not a pool kvcompat knows.
        TransferPlanError: a dict or JSON string that is not a pool spec.

    Example:
        >>> from kvcompat.transfer import pool_spec
        >>> from kvcompat.testing import ReferenceMLATokenToKVPool
        >>> spec = pool_spec(ReferenceMLATokenToKVPool(size=16, page_size=16, layer_num=2))
        >>> [(b.path, b.item_length, b.items) for b in spec.buffers]
        [('kv_buffer[0]', 18432, 2), ('kv_buffer[1]', 18432, 2)]
    """
    if isinstance(pool, PoolSpec):
        return pool
    if isinstance(pool, (str, bytes)):
        return PoolSpec.from_json(pool)
    if isinstance(pool, Mapping):
        return PoolSpec.from_dict(pool)
    manifest = pool if isinstance(pool, PoolManifest) else describe(pool)
    tensors = {t.path: t for t in manifest.iter_tensors()}
    buffers = []
    for d in transfer_descriptors(manifest):
        tensor = tensors[d.path]
        buffers.append(
            BufferSpec(
                group=d.group.value,
                component=d.component,
                path=d.path,
                layer_id=d.layer_id,
                role=d.role.value,
                device=d.device,
                ptr=d.ptr,
                length=d.length,
                item_length=d.item_length,
                dtype=tensor.dtype,
                row_shape=tuple(tensor.shape[1:]),
                row_bytes=tensor.nbytes // tensor.shape[0]
                if tensor.shape and tensor.shape[0]
                else 0,
                row_unit=tensor.row_unit,
            )
        )
    parts = {node.name: _component(node) for node in manifest.walk()}
    ring = {} if isinstance(pool, PoolManifest) else _ring_details(pool)
    if ring and "unified" in parts:
        part = parts["unified"]
        parts["unified"] = replace(part, details=MappingProxyType({**part.details, **ring}))
    return PoolSpec(
        name=manifest.name,
        native_class=manifest.native_class,
        page_size=manifest.page_size,
        buffers=tuple(buffers),
        components=MappingProxyType(parts),
    )
