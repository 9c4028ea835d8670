"""The manifest's value types: nodes, tensor entries, transfer regions, roles.

Frozen dataclasses with a JSON-ready ``to_dict()`` and a readable ``__str__``;
:func:`kvcompat.inspection.describe` builds them.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from kvcompat._protocol import PoolKind

__all__ = [
    "PoolManifest",
    "Role",
    "RowUnit",
    "Scalar",
    "TensorManifest",
    "TransferGroup",
    "TransferRegion",
    "format_bytes",
    "format_ids",
]

Scalar = str | int | float | bool | None
RowUnit = Literal["token", "page", "slot", "state"]


class Role(str, enum.Enum):
    """What a manifest node or tensor holds.

    Example:
        >>> from kvcompat.inspection import Role
        >>> Role("packed_kv") is Role.PACKED_KV, str(Role.INDEX_KEYS)
        (True, 'index_keys')
    """

    COMPOSITE = "composite"
    """A pool that routes layers to sub-pools (a node role only)."""
    KEY_VALUE = "key_value"
    """A pool with separate key and value tensors (a node role only)."""
    KEY = "key"
    """Key storage (MHA ``k_buffer``, key-only pools)."""
    VALUE = "value"
    """Value storage (MHA ``v_buffer``; the latent prefix view of MLA pools)."""
    LATENT = "latent"
    """One MLA/DSA latent row per token; the value is a prefix view of it."""
    PACKED_KV = "packed_kv"
    """DeepSeek-V4 packed single-KV pages: key and value in one buffer."""
    INDEX_KEYS = "index_keys"
    """Indexer keys (DSA ``IndexKeyCache``, DeepSeek-V4 indexer pools)."""
    INDEX_SCALES = "index_scales"
    """Indexer scales kept apart from the keys (HIP fp4 indexer layout)."""
    KEY_SCALES = "key_scales"
    """Quantization scales of the keys (quantized MHA pools)."""
    VALUE_SCALES = "value_scales"
    """Quantization scales of the values (quantized MHA pools)."""
    COMPRESS_STATE = "compress_state"
    """DeepSeek-V4 compressor state (``CompressStatePool``: kv and score rows)."""
    UNIFIED = "unified"
    """DeepSeek-V4 ``unified_kv`` rows: SWA ring then compressed rows."""
    UNIFIED_ROPE = "unified_rope"
    """The bf16 rope half of fp8 ``unified_kv`` rows."""
    REQUEST_WINDOW = "request_window"
    """DeepSeek-V4.1 per-request sliding window (a node role only)."""
    WORKSPACE = "workspace"
    """Scratch a pool copies into on read (the request window's workspace)."""
    MAMBA_STATE = "mamba_state"
    """Linear-attention (mamba) state of a hybrid pool; its bytes are opaque to kvcompat."""
    OPAQUE = "opaque"
    """A tensor kvcompat does not know (pointer tables, index maps, new attributes)."""

    def __str__(self) -> str:
        return self.value


class TransferGroup(str, enum.Enum):
    """Which SGLang registration a transferable range belongs to, in the order listed.

    Example:
        >>> from kvcompat.inspection import TransferGroup
        >>> [group.value for group in TransferGroup][:3]
        ['kv', 'state', 'request_state']
    """

    KV = "kv"
    """``get_contiguous_buf_infos()``: the KV (and indexer) pages."""
    STATE = "state"
    """``get_state_buf_infos()``: SWA pages, page-scoped compress states, DSA index keys, mamba."""
    REQUEST_STATE = "request_state"
    """``get_request_state_buf_infos()``: request-scoped DeepSeek-V4 compress states."""
    SWA_RING = "swa_ring"
    """``get_unified_swa_ring_buf_infos()``: the SWA ring rows of ``unified_kv``."""
    REQUEST_ROW = "request_row"
    """``get_swa_valid_from_buf_infos()``: per-request draft SWA marks."""
    KV_SCALE = "kv_scale"
    """``get_kv_scale_buf_infos()``: scale buffers of quantized MHA pools."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class TransferRegion:
    """One transferable byte range of a tensor, as a PD / offload engine registers it.

    Attributes:
        group: which SGLang registration the range belongs to (:class:`TransferGroup`).
        offset: bytes from the tensor's ``data_ptr`` to the start of the range.
        length: bytes in the range.
        item_length: bytes of one transfer item: one page of this buffer (a
            page-major row, or ``page_size`` token rows), one ring of a
            compress state.
        order: position of the range within its group, before manifest order
            (SGLang interleaves some groups by compress ratio or by layer).

    Example:
        >>> from kvcompat.inspection import TransferGroup, TransferRegion
        >>> TransferRegion(TransferGroup.KV, 0, 4096, 1024).items
        4
    """

    group: TransferGroup
    offset: int
    length: int
    item_length: int
    order: int = 0

    @property
    def items(self) -> int:
        """Whole items in the range (0 when the item length is 0).

        Example:
            >>> from kvcompat.inspection import TransferGroup, TransferRegion
            >>> TransferRegion(TransferGroup.STATE, 0, 100, 0).items
            0
        """
        return self.length // self.item_length if self.item_length else 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form.

        Example:
            >>> from kvcompat.inspection import TransferGroup, TransferRegion
            >>> TransferRegion(TransferGroup.KV, 0, 8, 4).to_dict()["items"]
            2
        """
        return {
            "group": self.group.value,
            "offset": self.offset,
            "length": self.length,
            "item_length": self.item_length,
            "items": self.items,
            "order": self.order,
        }


@dataclass(frozen=True)
class TensorManifest:
    """One tensor of a pool: where it lives, what it holds, and which storage it views.

    Attributes:
        path: attribute path from the described pool (``"k_buffer[3]"``,
            ``"kv_pools[4].kv_buffer[0]"``); evaluating it on the native pool
            gives the tensor (``kv_buffer[0][..., :512]`` for derived views).
        role: what the tensor holds.
        component: name of the manifest node that owns the entry.
        layer_ids: absolute model layer ids the tensor serves (several when
            layers share a compressed buffer; empty when not per-layer).
        shape, stride: geometry, in elements.
        dtype: element dtype name (``"uint8"``, ``"bfloat16"``...).
        nbytes: bytes of the elements the tensor addresses (numel x element size).
        device: device string (``"cpu"``, ``"cuda:0"``).
        data_ptr: address of the first element.
        storage_ptr: address of the underlying storage (``untyped_storage().data_ptr()``).
        storage_nbytes: size of the underlying storage in bytes.
        storage_offset: bytes from the storage start to ``data_ptr``.
        row_unit: what one index of the leading axis is: ``"token"``,
            ``"page"``, ``"slot"`` (a request slot), ``"state"`` (a state row),
            or None when unknown.
        alias_of: path of another listed tensor whose storage this one re-uses
            (the MLA value view of its latent row); such entries own no bytes.
        regions: the transferable byte ranges of the tensor (empty: not transferred).

    Example:
        >>> from kvcompat.inspection import describe
        >>> from kvcompat.testing import ReferenceMLATokenToKVPool
        >>> manifest = describe(ReferenceMLATokenToKVPool(size=16, page_size=16, layer_num=1))
        >>> [(t.path, t.role.value, t.alias_of) for t in manifest.tensors]
        [('kv_buffer[0]', 'latent', None), ('kv_buffer[0][..., :512]', 'value', 'kv_buffer[0]')]
    """

    path: str
    role: Role
    component: str
    layer_ids: tuple[int, ...]
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    nbytes: int
    device: str
    data_ptr: int
    storage_ptr: int
    storage_nbytes: int
    storage_offset: int
    row_unit: RowUnit | None = None
    alias_of: str | None = None
    regions: tuple[TransferRegion, ...] = ()

    @property
    def layer_id(self) -> int | None:
        """The layer owning the buffer (the lowest of ``layer_ids``), or None.

        Example:
            >>> from kvcompat.inspection import describe
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> native = ReferenceMHATokenToKVPool(16, 16, layer_num=2, start_layer=4)
            >>> [t.layer_id for t in describe(native).tensors]
            [4, 5, 4, 5]
        """
        return min(self.layer_ids) if self.layer_ids else None

    @property
    def storage_key(self) -> tuple[str, int]:
        """``(device, storage_ptr)``: equal for every view of one allocation.

        Example:
            >>> from kvcompat.inspection import describe
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> k, v = describe(ReferenceMHATokenToKVPool(16, 16, layer_num=1)).tensors
            >>> k.storage_key == v.storage_key  # K and V are halves of one allocation
            True
        """
        return (self.device, self.storage_ptr)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form.

        Example:
            >>> import json
            >>> from kvcompat.inspection import describe
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> entry = describe(ReferenceMHATokenToKVPool(16, 16, layer_num=1)).tensors[0]
            >>> json.loads(json.dumps(entry.to_dict()))["role"]
            'key'
        """
        return {
            "path": self.path,
            "role": self.role.value,
            "component": self.component,
            "layer_ids": list(self.layer_ids),
            "layer_id": self.layer_id,
            "shape": list(self.shape),
            "stride": list(self.stride),
            "dtype": self.dtype,
            "nbytes": self.nbytes,
            "device": self.device,
            "data_ptr": self.data_ptr,
            "storage_ptr": self.storage_ptr,
            "storage_nbytes": self.storage_nbytes,
            "storage_offset": self.storage_offset,
            "row_unit": self.row_unit,
            "alias_of": self.alias_of,
            "regions": [region.to_dict() for region in self.regions],
        }

    def describe_line(self) -> str:
        """One line for the tree view.

        Example:
            >>> from kvcompat.inspection import describe
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> describe(ReferenceMHATokenToKVPool(16, 16, layer_num=1)).tensors[0].describe_line()
            'k_buffer[0]  key  layer 0  bfloat16[32, 1, 128]  8.0 KiB  cpu'
        """
        layers = f"layer {format_ids(self.layer_ids)}" if self.layer_ids else "no layer"
        shape = ", ".join(map(str, self.shape))
        line = (
            f"{self.path}  {self.role.value}  {layers}  {self.dtype}[{shape}]  "
            f"{format_bytes(self.nbytes)}  {self.device}"
        )
        if self.alias_of is not None:
            line += f"  (view of {self.alias_of})"
        return line


@dataclass(frozen=True)
class PoolManifest:
    """A node of the manifest tree: the pool, or one part it owns.

    Attributes:
        name: the pool's class name at the root; the component name below it
            (``"swa"``, ``"c4"``, ``"c4_indexer"``, ``"c4_state"``, ``"mamba"``...).
        path: attribute path of the part's native object from the described
            pool (``""`` for the root, ``"kv_pools[4]"``).
        role: what the part holds.
        kind: the kvcompat :class:`~kvcompat.PoolKind` of the part's native
            class, or None for parts that are not KV pools.
        native_class: ``"module.QualName"`` of the part's native class.
        layer_ids: absolute model layer ids the part serves.
        page_size: tokens per page of the part (rows per page for state pools).
        token_capacity: the native ``size``: tokens for main pools, compressed
            slots for compressed pools; None when the part has no such notion.
        layout: the byte-layout name the adapter reads and writes with
            (``"mha_8x128_bf16"``, ``"mla_512+64_bf16"``, ``"dsa_fp8"``, ``"v4"``,
            ``"v41"``, ``"uniform_fp8"``, ``"dsv4_indexer_fp8"``; descriptive names such
            as ``"mha-hnd"`` or ``"dsv4-unified-bf16"`` for parts without a codec, from
            the leaf adapter's ``layout_name`` hook or the family's describer), or None.
        tensors: the part's own tensors.
        children: the parts this part owns.
        details: further plain facts read from the native object (dtypes,
            head dims, compress ratio, ring size...).

    Example:
        >>> from kvcompat.inspection import describe
        >>> from kvcompat.testing import reference_swa_pool
        >>> manifest = describe(reference_swa_pool())
        >>> for node in manifest.walk():
        ...     print(node.name, node.role.value, node.layer_ids)
        ReferenceSWAKVPool composite (0, 1, 2, 3)
        full key_value (1, 3)
        swa key_value (0, 2)
    """

    name: str
    path: str
    role: Role
    kind: PoolKind | None
    native_class: str
    layer_ids: tuple[int, ...]
    page_size: int | None
    token_capacity: int | None
    layout: str | None
    tensors: tuple[TensorManifest, ...] = ()
    children: tuple[PoolManifest, ...] = ()
    details: Mapping[str, Scalar] = field(default_factory=lambda: MappingProxyType({}), hash=False)

    def walk(self) -> Iterator[PoolManifest]:
        """This node and every node below it, depth first, in manifest order.

        Example:
            >>> from kvcompat.inspection import describe
            >>> from kvcompat.testing import reference_swa_pool
            >>> [node.name for node in describe(reference_swa_pool()).walk()]
            ['ReferenceSWAKVPool', 'full', 'swa']
        """
        yield self
        for child in self.children:
            yield from child.walk()

    def iter_tensors(self) -> Iterator[TensorManifest]:
        """Every tensor entry of this node and the nodes below it, in manifest order.

        Example:
            >>> from kvcompat.inspection import describe
            >>> from kvcompat.testing import reference_swa_pool
            >>> len(list(describe(reference_swa_pool()).iter_tensors()))
            8
        """
        for node in self.walk():
            yield from node.tensors

    def find(self, name: str) -> PoolManifest:
        """The node called ``name`` (this one or a descendant).

        Raises:
            KeyError: no node has that name; the message lists the names.

        Example:
            >>> from kvcompat.inspection import describe
            >>> from kvcompat.testing import reference_swa_pool
            >>> describe(reference_swa_pool()).find("swa").layer_ids
            (0, 2)
        """
        for node in self.walk():
            if node.name == name:
                return node
        names = ", ".join(repr(node.name) for node in self.walk())
        msg = f"no part named {name!r} in the manifest of {self.name}; parts: {names}."
        raise KeyError(msg)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form of the whole subtree.

        Example:
            >>> import json
            >>> from kvcompat.inspection import describe
            >>> from kvcompat.testing import reference_swa_pool
            >>> data = json.loads(json.dumps(describe(reference_swa_pool()).to_dict()))
            >>> data["kind"], [child["name"] for child in data["children"]]
            ('composite', ['full', 'swa'])
        """
        return {
            "name": self.name,
            "path": self.path,
            "role": self.role.value,
            "kind": None if self.kind is None else self.kind.value,
            "native_class": self.native_class,
            "layer_ids": list(self.layer_ids),
            "page_size": self.page_size,
            "token_capacity": self.token_capacity,
            "layout": self.layout,
            "details": dict(self.details),
            "tensors": [tensor.to_dict() for tensor in self.tensors],
            "children": [child.to_dict() for child in self.children],
        }

    def header(self) -> str:
        """The node's one-line summary used by the tree view.

        Example:
            >>> from kvcompat.inspection import describe
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> print(describe(ReferenceMHATokenToKVPool(16, 16, layer_num=2)).header())
            ReferenceMHATokenToKVPool  key_value (split pool)  layers 0..1  page 16  capacity 16
            layout mha_1x128_bf16
        """
        parts = [self.name, self.role.value]
        if self.kind is not None and self.kind.value != self.role.value:
            parts[-1] += f" ({self.kind.value} pool)"
        short = self.native_class.rsplit(".", 1)[-1]
        if short != self.name:
            parts.append(short)
        parts.append(f"layers {format_ids(self.layer_ids)}")
        if self.page_size is not None:
            parts.append(f"page {self.page_size}")
        if self.token_capacity is not None:
            parts.append(f"capacity {self.token_capacity}")
        if self.layout is not None:
            parts.append(f"layout {self.layout}")
        return "  ".join(parts)

    def __str__(self) -> str:
        lines = [self.header()]
        self._render(lines, "")
        return "\n".join(lines)

    def _render(self, lines: list[str], indent: str) -> None:
        inner = indent + ("│  " if self.children else "   ")
        lines.extend(f"{inner}{tensor.describe_line()}" for tensor in self.tensors)
        for index, child in enumerate(self.children):
            last = index == len(self.children) - 1
            lines.append(f"{indent}{'└─ ' if last else '├─ '}{child.header()}")
            child._render(lines, indent + ("   " if last else "│  "))


# -- formatting ------------------------------------------------------------------------------


def format_bytes(nbytes: int) -> str:
    """Human-readable byte count (binary units).

    Example:
        >>> format_bytes(512), format_bytes(1536), format_bytes(3 << 30)
        ('512 B', '1.5 KiB', '3.0 GiB')
    """
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{nbytes} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover  (the loop always returns)


def format_ids(ids: tuple[int, ...] | list[int]) -> str:
    """Layer ids compactly: ``0..31`` for a run, ``[1, 3]`` otherwise, ``none`` if empty.

    Example:
        >>> format_ids((0, 1, 2)), format_ids([1, 3]), format_ids(()), format_ids([5])
        ('0..2', '[1, 3]', 'none', '5')
    """
    ordered = sorted(ids)
    if not ordered:
        return "none"
    if len(ordered) == 1:
        return str(ordered[0])
    if ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}..{ordered[-1]}"
    return "[" + ", ".join(map(str, ordered)) + "]"
