"""Building manifest nodes from a native object: the pieces every describer shares.

Attribute reads only, through :mod:`kvcompat.inspection._static`. A leaf pool
is described from the buffers its adapter declares (``LeafAdapter.buffers``, see
:class:`kvcompat.adapters.Buffer`); whatever else it holds that is a tensor becomes
an ``opaque`` entry.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

import torch

from kvcompat._errors import KVCompatError
from kvcompat._families import Family, family_of, qualified_name
from kvcompat._protocol import KVPoolProtocol, PoolKind
from kvcompat.adapters import Buffer, LeafAdapter
from kvcompat.inspection._model import (
    PoolManifest,
    Role,
    RowUnit,
    Scalar,
    TensorManifest,
    TransferGroup,
    TransferRegion,
)
from kvcompat.inspection._static import (
    enum_value,
    join_path,
    static_attr,
    static_path,
    tensors_in,
    vars_of,
)

__all__ = [
    "Walk",
    "details_of",
    "entry",
    "int_or_none",
    "leaf_node",
    "opaque_node",
    "row_bytes",
]

# -- layout names ----------------------------------------------------------------------------


def _layout_name(native: Any, leaf: type[LeafAdapter] | None = None) -> str | None:
    """The byte-layout name of a native part, as its family (or ``leaf``) declares it.

    The adapter's ``layout(l).key.name`` (the layout it reads and writes with) when one
    can be built and has a codec; else the leaf adapter's ``layout_name`` hook; None
    for a class no leaf family serves (a composite, an unsupported class). ``leaf`` is
    the adapter class serving the part when it is not the family's (a DSA pool's
    index keys).

    Example:
        >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool, ReferenceMLATokenToKVPool
        >>> _layout_name(ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64))
        'v4'
        >>> _layout_name(ReferenceMLATokenToKVPool(size=16, page_size=16))
        'mla_512+64_bf16'
    """
    if leaf is None:
        family = family_of(native)
        leaf = None if family is None else family.leaf
    if leaf is None:
        return None
    try:
        adapter = leaf(native)
        if adapter.layer_ids:
            return adapter.layout(adapter.layer_ids[0]).key.name
    except KVCompatError:
        pass  # no codec for this configuration, or no buffers: the family's own name
    return leaf.layout_name(native)


# -- building blocks ---------------------------------------------------------------------------


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def row_bytes(tensor: torch.Tensor) -> int:
    """Bytes of one index of the leading axis (SGLang's ``buf[0].nbytes``; 0 when empty)."""
    if tensor.ndim == 0 or tensor.shape[0] == 0:
        return 0
    return math.prod(tensor.shape[1:]) * tensor.element_size()


def _storage(tensor: torch.Tensor) -> tuple[int, int]:
    try:
        storage = tensor.untyped_storage()
        return int(storage.data_ptr()), int(storage.nbytes())
    except (RuntimeError, NotImplementedError):  # meta or otherwise storage-less tensors
        return 0, 0


def entry(
    tensor: torch.Tensor,
    *,
    path: str,
    role: Role,
    component: str,
    layer_ids: tuple[int, ...] = (),
    row_unit: RowUnit | None = None,
    alias_of: str | None = None,
    regions: tuple[TransferRegion, ...] = (),
) -> TensorManifest:
    storage_ptr, storage_nbytes = _storage(tensor)
    data_ptr = int(tensor.data_ptr())
    return TensorManifest(
        path=path,
        role=role,
        component=component,
        layer_ids=layer_ids,
        shape=tuple(int(n) for n in tensor.shape),
        stride=tuple(int(n) for n in tensor.stride()),
        dtype=_dtype_name(tensor.dtype),
        nbytes=int(tensor.nbytes),
        device=str(tensor.device),
        data_ptr=data_ptr,
        storage_ptr=storage_ptr,
        storage_nbytes=storage_nbytes,
        storage_offset=int(tensor.storage_offset()) * tensor.element_size(),
        row_unit=row_unit,
        alias_of=alias_of,
        regions=regions,
    )


_DETAIL_NAMES = (
    "dtype",
    "store_dtype",
    "start_layer",
    "head_num",
    "head_dim",
    "v_head_dim",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "kv_cache_dim",
    "kv_cache_total_dim",
    "bytes_per_page_padded",
    "global_page_size",
    "index_head_dim",
    "use_fp4_indexer",
    "ratio",
    "ring_size",
    "request_scoped",
    "online",
    "last_dim",
    "swa_pages",
    "swa_page_size",
    "capacity",
    "num_slots",
    "fp8",
)


def details_of(native: Any, **extra: Scalar) -> Mapping[str, Scalar]:
    found: dict[str, Scalar] = {}
    for name in _DETAIL_NAMES:
        value = enum_value(static_attr(native, name, None))
        if isinstance(value, torch.dtype):
            found[name] = _dtype_name(value)
        elif isinstance(value, (bool, int, float, str)):
            found[name] = value
    if hasattr(type(native), "translate_loc_to_hisparse_device"):
        # Rows are HiSparse device slots, not the locations a request holds.
        found["slots"] = "hisparse_device"
    found.update(extra)
    return MappingProxyType(found)


def int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


class Walk:
    """State shared while describing one pool: which tensors are already reported."""

    def __init__(self) -> None:
        self.seen: set[int] = set()

    def claim(self, tensor: torch.Tensor) -> bool:
        """True the first time a tensor object is met."""
        if id(tensor) in self.seen:
            return False
        self.seen.add(id(tensor))
        return True

    def opaque(
        self, native: Any, path: str, component: str, *, skip: frozenset[str] = frozenset()
    ) -> list[TensorManifest]:
        """Unknown tensors in ``vars(native)`` (not under ``skip``, not yet reported)."""
        found: list[TensorManifest] = []
        for name, value in vars_of(native).items():
            if name in skip:
                continue
            for sub, tensor in tensors_in(value, join_path(path, name)):
                if self.claim(tensor):
                    found.append(entry(tensor, path=sub, role=Role.OPAQUE, component=component))
        return found


# -- leaf pools --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Part:
    """A per-layer buffer list (or one tensor) a leaf family keeps, and what it holds."""

    attr: str
    role: Role
    group: TransferGroup | None = TransferGroup.KV
    rows: Literal["token", "page", "auto"] = "auto"
    value_prefix: str | None = None  # attribute naming the width of a value prefix view


def _part(declared: Buffer, owner: type) -> _Part:
    try:
        role = Role(declared.role)
        group = None if declared.group is None else TransferGroup(declared.group)
    except ValueError:
        msg = (
            f"{owner.__qualname__}.buffers declares {declared!r}: role must be one of "
            f"{[r.value for r in Role]} and group one of {[g.value for g in TransferGroup]} "
            "(or None)."
        )
        raise KVCompatError(msg) from None
    return _Part(declared.attr, role, group, declared.rows, declared.value_prefix)


def _leaf_spec(
    family: Family | None, leaf: type[LeafAdapter] | None = None
) -> tuple[Role, tuple[_Part, ...], type[LeafAdapter]] | None:
    """The node role, buffers and class of the leaf adapter serving a pool.

    ``leaf`` is the adapter actually serving the pool (when one was given), else the
    family's; its ``buffers`` (``LeafAdapter.buffers``) are the node's declared parts.
    """
    if leaf is None:
        leaf = None if family is None else family.leaf
    if leaf is None or not leaf.buffers:
        return None
    parts = tuple(_part(declared, leaf) for declared in leaf.buffers)
    role = Role.KEY_VALUE if leaf.kind is PoolKind.SPLIT else parts[0].role
    return role, parts, leaf


def _attached_nodes(
    walk: Walk,
    native: Any,
    leaf: type[LeafAdapter],
    *,
    path: str,
    slots: Mapping[int, int],
    regroup: Mapping[TransferGroup, TransferGroup | None] | None,
) -> tuple[PoolManifest, ...]:
    """Child nodes for the stores a leaf adapter serves as components of its native pool.

    ``attached_parts`` (a DSA pool's ``indexer``) names each store's adapter class and
    layers; each child lists the buffers that class declares.
    """
    attached = inspect.getattr_static(leaf, "attached_parts", None)
    if attached is None:
        return ()
    found = getattr(leaf, "attached_parts")(native, slots, static_attr)  # noqa: B009
    return tuple(
        leaf_node(
            walk,
            native,
            name=part,
            path=path,
            slots=served,
            regroup=regroup,
            leaf=part_leaf,
            attached=True,
        )
        for part, (part_leaf, served) in found.items()
    )


def _standalone_slots(native: Any, buffers: Any) -> dict[int, int]:
    """Absolute layer id -> buffer index of a pool described on its own (``start_layer + i``)."""
    start = int_or_none(static_attr(native, "start_layer", 0)) or 0
    count = len(buffers) if isinstance(buffers, (list, tuple)) else 0
    return {start + index: index for index in range(count)}


def leaf_node(
    walk: Walk,
    native: Any,
    *,
    name: str,
    path: str,
    slots: Mapping[int, int] | None = None,
    regroup: Mapping[TransferGroup, TransferGroup | None] | None = None,
    pages_per_item: int = 1,
    order: int = 0,
    role: Role | None = None,
    extra: Mapping[str, Scalar] | None = None,
    leaf: type[LeafAdapter] | None = None,
    attached: bool = False,
) -> PoolManifest:
    """A leaf pool: its declared buffers, its attached stores, then unknown tensors as opaque.

    The buffers are those ``leaf`` (the adapter class serving the pool) declares, or
    the pool's family's adapter when no adapter was given. Stores the adapter serves as
    components of the same native pool (``attached_parts``) become child nodes; such a
    child (``attached=True``) leaves the pool's other tensors to its parent and names its
    layout from the static ``layout_name`` hook (building its adapter would read the store
    through the pool's properties).
    """
    family = family_of(native)
    spec = _leaf_spec(family, leaf)
    if spec is None:
        return opaque_node(walk, native, name=name, path=path, role=role)
    node_role, parts, serving = spec
    # An attached store (DSA's index keys) may page and size itself apart from its pool.
    size = int_or_none(static_attr(native, getattr(serving, "size_attr", "size"), None))
    page = int_or_none(static_attr(native, getattr(serving, "page_size_attr", "page_size"), None))
    size = size or int_or_none(static_attr(native, "size", None))
    page = page or int_or_none(static_attr(native, "page_size", None))
    if slots is None:
        slots = _standalone_slots(native, static_path(native, parts[0].attr, None))
    layers_of: dict[int, list[int]] = {}
    for layer, slot in slots.items():
        layers_of.setdefault(slot, []).append(layer)
    regroup = regroup or {}
    tensors: list[TensorManifest] = []
    for part in parts:
        value = static_path(native, part.attr, None)
        items = list(enumerate(value)) if isinstance(value, (list, tuple)) else [(None, value)]
        for index, tensor in items:
            if not isinstance(tensor, torch.Tensor) or not walk.claim(tensor):
                continue
            where = join_path(path, part.attr) + ("" if index is None else f"[{index}]")
            layer_ids = () if index is None else tuple(sorted(layers_of.get(index, ())))
            unit = _row_unit(tensor, part.rows, size, page)
            group = regroup.get(part.group, part.group) if part.group is not None else None
            regions: tuple[TransferRegion, ...] = ()
            if group is not None:
                rows_per_item = (page if unit == "token" and page else 1) * pages_per_item
                item = row_bytes(tensor) * rows_per_item
                regions = (TransferRegion(group, 0, int(tensor.nbytes), item, order),)
            tensors.append(
                entry(
                    tensor,
                    path=where,
                    role=part.role,
                    component=name,
                    layer_ids=layer_ids,
                    row_unit=unit,
                    regions=regions,
                )
            )
            prefix = part.value_prefix
            width = None if prefix is None else int_or_none(static_attr(native, prefix, None))
            if width is not None:
                tensors.append(
                    entry(
                        tensor[..., :width],
                        path=f"{where}[..., :{width}]",
                        role=Role.VALUE,
                        component=name,
                        layer_ids=layer_ids,
                        row_unit=unit,
                        alias_of=where,
                    )
                )
    children = _attached_nodes(walk, native, serving, path=path, slots=slots, regroup=regroup)
    if not attached:
        claimed = frozenset(part.attr.split(".", 1)[0] for part in parts)
        tensors.extend(walk.opaque(native, path, name, skip=claimed))
    return PoolManifest(
        name=name,
        path=path,
        role=role or node_role,
        kind=serving.kind if leaf is not None else (None if family is None else family.kind),
        native_class=qualified_name(type(native)),
        layer_ids=tuple(sorted(slots)),
        page_size=page,
        token_capacity=size,
        layout=serving.layout_name(native) if attached else _layout_name(native, leaf),
        tensors=tuple(tensors),
        children=children,
        details=details_of(native, **(extra or {})),
    )


def _row_unit(
    tensor: torch.Tensor, rows: Literal["token", "page", "auto"], size: int | None, page: int | None
) -> RowUnit:
    if rows != "auto":
        return rows
    if size is not None and page is not None and tensor.ndim and tensor.shape[0] == size + page:
        return "token"
    return "page"


def opaque_node(
    walk: Walk,
    native: Any,
    *,
    name: str,
    path: str,
    role: Role | None = None,
    adapter: KVPoolProtocol | None = None,
) -> PoolManifest:
    """A part kvcompat has no storage spec for: every tensor it holds, as opaque."""
    family = family_of(native)
    layer_ids = tuple(adapter.layer_ids) if adapter is not None else ()
    return PoolManifest(
        name=name,
        path=path,
        role=role or Role.OPAQUE,
        kind=None if family is None else family.kind,
        native_class=qualified_name(type(native)),
        layer_ids=layer_ids,
        page_size=int_or_none(static_attr(native, "page_size", None)),
        token_capacity=int_or_none(static_attr(native, "size", None)),
        layout=_layout_name(native),
        tensors=tuple(walk.opaque(native, path, name)),
        details=details_of(native),
    )
