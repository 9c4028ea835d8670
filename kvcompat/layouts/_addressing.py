"""Gather and scatter per-token data and scale rows inside a pool buffer (pure torch).

Nothing here does arithmetic on values: a buffer is viewed as uint8, split into
``[rows, tokens_per_row, data_bytes]`` and ``[rows, tokens_per_row, scale_bytes]`` views
over the same storage, and token rows are read or written with one advanced-indexing
call each. Writes go through views, so they land in the caller's buffer in place and
touch no byte outside the written tokens' data rows and written scale bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from kvcompat.layouts._spec import LayoutSpec

__all__ = ["byte_rows", "gather_rows", "scatter_rows", "scatter_targets", "token_views"]


def byte_rows(buf: torch.Tensor) -> torch.Tensor:
    """The contiguous ``buf`` as a 2-D uint8 view ``[buf.shape[0], row_bytes]``."""
    raw = buf if buf.dtype == torch.uint8 else buf.view(torch.uint8)
    return raw.reshape(buf.shape[0], -1)


def token_views(
    spec: LayoutSpec, buf: torch.Tensor, page_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Views ``[rows, T, data_bytes]`` and ``[rows, T, scale_bytes]`` of ``buf``'s tokens.

    ``T`` is :meth:`LayoutSpec.tokens_per_row`. Both views alias ``buf``; page padding is
    outside them.
    """
    rows = byte_rows(buf)
    count, per_row = rows.shape[0], spec.tokens_per_row(page_size)
    data_bytes, scale_bytes = spec.data_bytes, spec.scale_bytes
    if spec.interleaved or not spec.paged:
        bpt = spec.bytes_per_token
        tokens = rows[:, : per_row * bpt].view(count, per_row, bpt)
        return tokens[..., :data_bytes], tokens[..., data_bytes:]
    split = per_row * data_bytes
    data = rows[:, :split].view(count, per_row, data_bytes)
    scale = rows[:, split : split + per_row * scale_bytes].view(count, per_row, scale_bytes)
    return data, scale


def _region_rows(flat: torch.Tensor, *, base: int, stride: int, width: int) -> torch.Tensor:
    """``[rows, width]`` view of ``flat`` whose row ``r`` starts at byte ``base + r * stride``."""
    count = max(0, (flat.numel() - base - width) // stride + 1)
    return flat.as_strided((count, width), (stride, 1), flat.storage_offset() + base)


def _regions(
    spec: LayoutSpec, buf: torch.Tensor, loc: torch.Tensor, page_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int]:
    """``(flat, data_index, scale_index, scale_base, scale_stride)`` for tokens ``loc``.

    A token's data row is row ``data_index`` of the ``data_stride``-strided view of the
    flattened buffer, and its scale row is row ``scale_index`` of the ``scale_stride``-strided
    view starting at ``scale_base``; both strides divide the page size in bytes
    (:class:`LayoutSpec` guarantees it), so the row index is ``page * (page_bytes /
    stride) + slot``. Reading and writing whole rows then is one ``index_select`` /
    ``index_copy_`` per region.
    """
    flat = byte_rows(buf).reshape(-1)
    per_row = spec.tokens_per_row(page_size)
    page_bytes = spec.page_bytes(per_row)
    data_stride, scale_base, scale_stride = spec.row_addressing(per_row)
    if per_row == 1:
        page, slot = loc, None
    else:
        page, slot = loc // per_row, loc % per_row
    data_index = page * (page_bytes // data_stride)
    scale_index = page * (page_bytes // scale_stride) if spec.scale_bytes else page
    if slot is not None:
        data_index = data_index + slot
        scale_index = scale_index + slot
    return flat, data_index, scale_index, scale_base, scale_stride


def gather_rows(
    spec: LayoutSpec, buf: torch.Tensor, loc: torch.Tensor, page_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy out the data and scale rows of tokens ``loc`` (int64, validated).

    Returns contiguous uint8 tensors ``[n, data_bytes]`` and ``[n, scale_bytes]``.
    """
    flat, data_index, scale_index, scale_base, scale_stride = _regions(spec, buf, loc, page_size)
    data_stride, _, _ = spec.row_addressing(spec.tokens_per_row(page_size))
    data_rows = _region_rows(flat, base=0, stride=data_stride, width=spec.data_bytes)
    data = data_rows.index_select(0, data_index)
    if not spec.scale_bytes:
        return data, data.new_empty((loc.numel(), 0))
    scale_rows = _region_rows(flat, base=scale_base, stride=scale_stride, width=spec.scale_bytes)
    return data, scale_rows.index_select(0, scale_index)


def scatter_targets(
    spec: LayoutSpec, buf: torch.Tensor, loc: torch.Tensor, page_size: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``[(rows_view, index)]`` that a write of tokens ``loc`` stores into, data first.

    Each ``rows_view`` is a ``[rows, width]`` uint8 view of ``buf`` and ``index`` (int64)
    picks the rows the write replaces: ``rows_view.index_copy_(0, index, bytes)`` stores
    them, ``rows_view.index_select(0, index)`` reads back what is there. The scale entry
    is absent when the layout writes no scale row bytes (its scales live in the data row,
    or it has none); it covers only the written scale bytes, never ``scale_pad``.
    ``loc`` must be int64 and in range (validated by the caller).
    """
    flat, data_index, scale_index, scale_base, scale_stride = _regions(spec, buf, loc, page_size)
    data_stride, _, _ = spec.row_addressing(spec.tokens_per_row(page_size))
    targets = [(_region_rows(flat, base=0, stride=data_stride, width=spec.data_bytes), data_index)]
    written = spec.scale_bytes_written
    if written:
        scale_rows = _region_rows(flat, base=scale_base, stride=scale_stride, width=written)
        targets.append((scale_rows, scale_index))
    return targets


def scatter_rows(
    spec: LayoutSpec,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    data: torch.Tensor,
    scale: torch.Tensor,
) -> None:
    """Write data rows ``[n, data_bytes]`` and scale bytes ``[n, scale_bytes_written]``.

    ``loc`` must be int64, in range and free of duplicates (validated by the caller). The
    scale row's trailing ``scale_pad`` bytes are left as they are.
    """
    targets = scatter_targets(spec, buf, loc, page_size)
    for (rows, index), source in zip(targets, (data, scale), strict=False):
        rows.index_copy_(0, index, source)
