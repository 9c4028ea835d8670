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

__all__ = [
    "byte_rows",
    "gather_rows",
    "row_pitch",
    "rows_apart",
    "scatter_rows",
    "scatter_targets",
    "token_views",
]


def byte_rows(buf: torch.Tensor) -> torch.Tensor:
    """``buf`` as a 2-D uint8 view ``[buf.shape[0], row_bytes]`` (never a copy).

    ``buf`` is contiguous, or its rows are (:func:`rows_apart`): each ``buf[i]`` is
    contiguous and row ``i`` starts :func:`row_pitch` bytes after row ``i - 1`` - a page
    (or token row) of a strided view such as a vLLM layer's view of a shared storage.
    """
    raw = buf if buf.dtype == torch.uint8 else buf.view(torch.uint8)
    return raw.view(buf.shape[0], -1)


def row_pitch(buf: torch.Tensor) -> int:
    """Bytes from the start of one row of ``buf`` (a page, or a token row) to the next.

    The row's own size for a contiguous buffer; more for a strided view of a larger
    storage.

    Example:
        >>> import torch
        >>> pages = torch.zeros(4, 3, 100, dtype=torch.uint8)[:, 1]  # every third row
        >>> row_pitch(pages), row_pitch(pages.contiguous())
        (300, 100)
    """
    if buf.dim() == 0:
        return 0
    if buf.shape[0] > 1:
        return int(buf.stride(0)) * buf.element_size()
    return int(buf[0].numel()) * buf.element_size() if buf.shape[0] else 0


def rows_apart(buf: torch.Tensor) -> bool:
    """Whether each row of ``buf`` is contiguous and rows do not overlap (pitch >= row).

    What a strided pool buffer must satisfy for kvcompat to address its rows in place.
    """
    if buf.dim() < 1:
        return False
    expected = 1
    for size, stride in zip(reversed(buf.shape[1:]), reversed(buf.stride()[1:]), strict=True):
        if size != 1 and stride != expected:
            return False
        expected *= size
    if buf.shape[0] <= 1:
        return True
    return buf.stride(0) >= expected


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
    flat, pitch = _flat(buf)
    per_row = spec.tokens_per_row(page_size)
    _, scale_base, scale_stride = spec.row_addressing(per_row)
    if per_row == 1:  # token rows: one row per location, ``pitch`` bytes apart
        return flat, loc, loc, scale_base, pitch
    data_stride = spec.row_addressing(per_row)[0]
    page, slot = loc // per_row, loc % per_row
    data_index = page * (pitch // data_stride) + slot
    scale_index = page * (pitch // scale_stride) + slot if spec.scale_bytes else page
    return flat, data_index, scale_index, scale_base, scale_stride


def _flat(buf: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A 1-D uint8 view over every byte from ``buf``'s first row to its last, and the pitch."""
    rows = byte_rows(buf)
    pitch = row_pitch(rows)
    extent = (rows.shape[0] - 1) * pitch + rows.shape[1] if rows.shape[0] else 0
    return rows.as_strided((extent,), (1,), rows.storage_offset()), pitch


def _data_stride(spec: LayoutSpec, buf: torch.Tensor, page_size: int) -> int:
    per_row = spec.tokens_per_row(page_size)
    if per_row == 1:
        return row_pitch(buf)
    return spec.row_addressing(per_row)[0]


def gather_rows(
    spec: LayoutSpec, buf: torch.Tensor, loc: torch.Tensor, page_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy out the data and scale rows of tokens ``loc`` (int64, validated).

    Returns contiguous uint8 tensors ``[n, data_bytes]`` and ``[n, scale_bytes]``.
    """
    flat, data_index, scale_index, scale_base, scale_stride = _regions(spec, buf, loc, page_size)
    data_stride = _data_stride(spec, buf, page_size)
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
    data_stride = _data_stride(spec, buf, page_size)
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
