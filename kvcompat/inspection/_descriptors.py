"""Transfer descriptors: ``(ptr, length, item_length)`` per buffer, for PD / offload engines.

A descriptor says where a transferable range of a buffer starts, how long it
is, and how long one *item* is — the unit a transfer engine indexes by (NIXL,
Mooncake and SGLang's own disaggregation address items by page id):

* page-major buffers (DeepSeek-V4 ``kv_buffer[i]``, indexer pools, DSA index
  keys, HND MHA): one row is one page, so the item is one row;
* token-major buffers (NHD MHA, MLA latents): one row is one token, so the
  item is ``bytes_per_token * page_size``;
* compress states: one ring of rows (page-scoped) or one request's pending
  rows (request-scoped), as SGLang registers them.

Descriptors are grouped the way SGLang registers them — ``kv`` is what
``get_contiguous_buf_infos()`` returns, ``state`` ``get_state_buf_infos()``,
``request_state`` ``get_request_state_buf_infos()``, ``swa_ring``
``get_unified_swa_ring_buf_infos()``, ``request_row``
``get_swa_valid_from_buf_infos()`` and ``kv_scale``
``get_kv_scale_buf_infos()`` — and are defined for pools that have no such
method too (DeepSeek-V4 single and indexer pools, key-only pools).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvcompat.inspection._manifest import describe
from kvcompat.inspection._model import PoolManifest, Role, TransferGroup

__all__ = ["TransferDescriptor", "as_buf_infos", "transfer_descriptors"]

_RANK = {group: rank for rank, group in enumerate(TransferGroup)}


@dataclass(frozen=True)
class TransferDescriptor:
    """One transferable byte range of a pool buffer.

    Attributes:
        ptr: address of the first byte.
        length: bytes in the range.
        item_length: bytes of one transfer item (see the module docstring).
        group: the SGLang registration the range belongs to.
        component: the manifest node owning the buffer (``"swa"``, ``"c4"``...).
        path: the buffer's attribute path from the described pool.
        layer_id: the layer owning the buffer, or None.
        role: what the buffer holds.
        device: device string.

    Example:
        >>> from kvcompat.inspection import transfer_descriptors
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool
        >>> first = transfer_descriptors(ReferenceMHATokenToKVPool(16, 16, layer_num=1))[0]
        >>> first.path, first.length, first.item_length, first.items
        ('k_buffer[0]', 8192, 4096, 2)
    """

    ptr: int
    length: int
    item_length: int
    group: TransferGroup
    component: str
    path: str
    layer_id: int | None
    role: Role
    device: str

    @property
    def items(self) -> int:
        """Whole items in the range (0 when the item length is 0).

        Example:
            >>> from kvcompat.inspection import transfer_descriptors
            >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
            >>> [d.items for d in transfer_descriptors(ReferenceDeepSeekV4SingleKVPool(64, 64))]
            [2]
        """
        return self.length // self.item_length if self.item_length else 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form.

        Example:
            >>> from kvcompat.inspection import transfer_descriptors
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> transfer_descriptors(ReferenceMHATokenToKVPool(16, 16))[0].to_dict()["role"]
            'key'
        """
        return {
            "ptr": self.ptr,
            "length": self.length,
            "item_length": self.item_length,
            "items": self.items,
            "group": self.group.value,
            "component": self.component,
            "path": self.path,
            "layer_id": self.layer_id,
            "role": self.role.value,
            "device": self.device,
        }


def transfer_descriptors(
    pool: Any, *, group: TransferGroup | str | None = None
) -> tuple[TransferDescriptor, ...]:
    """Every transferable buffer range of a pool, in SGLang's registration order.

    Built from :func:`~kvcompat.inspection.describe`, so no native getter runs.
    Within each group the order is the one SGLang's ``get_*_buf_infos()``
    uses, so :func:`as_buf_infos` of a group equals SGLang's triple where
    SGLang has one.

    Args:
        pool: a native pool, a kvcompat adapter, or a :class:`PoolManifest`.
        group: only this :class:`TransferGroup` (or its value, ``"kv"``...); None for all.

    Returns:
        The descriptors, grouped in :class:`TransferGroup` order.

    Raises:
        ValueError: ``group`` is not a :class:`TransferGroup` value.
        UnsupportedPoolError: ``pool`` is not a pool kvcompat knows.

    Example:
        >>> from kvcompat.inspection import transfer_descriptors
        >>> from kvcompat.testing import ReferenceMLATokenToKVPool
        >>> pool = ReferenceMLATokenToKVPool(size=16, page_size=16, layer_num=2)
        >>> [(d.path, d.item_length) for d in transfer_descriptors(pool, group="kv")]
        [('kv_buffer[0]', 18432), ('kv_buffer[1]', 18432)]
    """
    wanted = None
    if group is not None:
        try:
            wanted = TransferGroup(group)
        except ValueError:
            valid = ", ".join(repr(g.value) for g in TransferGroup)
            msg = (
                f"unknown transfer group {group!r}.\n"
                f"Hint: pass one of {valid} (or a kvcompat.inspection.TransferGroup), "
                "or None for all."
            )
            raise ValueError(msg) from None
    manifest = pool if isinstance(pool, PoolManifest) else describe(pool)
    ranked: list[tuple[int, int, int, TransferDescriptor]] = []
    for position, tensor in enumerate(manifest.iter_tensors()):
        for region in tensor.regions:
            if wanted is not None and region.group is not wanted:
                continue
            descriptor = TransferDescriptor(
                ptr=tensor.data_ptr + region.offset,
                length=region.length,
                item_length=region.item_length,
                group=region.group,
                component=tensor.component,
                path=tensor.path,
                layer_id=tensor.layer_id,
                role=tensor.role,
                device=tensor.device,
            )
            ranked.append((_RANK[region.group], region.order, position, descriptor))
    ranked.sort(key=lambda entry: entry[:3])
    return tuple(entry[3] for entry in ranked)


def as_buf_infos(
    descriptors: tuple[TransferDescriptor, ...] | list[TransferDescriptor],
) -> tuple[list[int], list[int], list[int]]:
    """``(data_ptrs, data_lens, item_lens)``: the triple SGLang's ``get_*_buf_infos()`` return.

    Example:
        >>> from kvcompat.inspection import as_buf_infos, transfer_descriptors
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool
        >>> native = ReferenceMHATokenToKVPool(16, 16, layer_num=2)
        >>> ours = as_buf_infos(transfer_descriptors(native, group="kv"))
        >>> ours == native.get_contiguous_buf_infos()
        True
    """
    return (
        [d.ptr for d in descriptors],
        [d.length for d in descriptors],
        [d.item_length for d in descriptors],
    )
