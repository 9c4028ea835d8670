"""The torch twins of every layout's reads and writes: decode, encode, scatter, all or nothing.

:func:`dequantize_torch` reads tokens through the layout's
:mod:`~kvcompat.layouts._addressing` and decodes them with its codec; a write is
:func:`encode_part` per buffer (every part and CPU chunk encoded before the first byte
of the pool moves) and one :func:`commit` of all the parts' scatters. Nothing here
validates or picks an implementation: :mod:`kvcompat._ops` validates once and calls
these (or a Triton kernel, which writes the same bytes). Writes are all or nothing (see
``docs/atomic-writes.md``): the bytes every scatter but the last one will overwrite are
saved, and restored if anything raises before the write completes; each scatter is one
``index_copy_``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kvcompat.layouts._addressing import gather_rows, scatter_targets
from kvcompat.layouts._plain import PLAIN_CODEC

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from kvcompat.layouts._spec import LayoutSpec

__all__ = [
    "CPU_CHUNK_TOKENS",
    "PLAIN_CODEC",
    "Store",
    "commit",
    "dequantize_torch",
    "encode_part",
]

CPU_CHUNK_TOKENS = 4096
"""On CPU, tokens are encoded and decoded this many at a time, so that the fp32
temporaries of a chunk stay cache-sized (2-3x faster than one pass at 65536 tokens on the
benchmark machine). Other devices take the whole batch at once."""


def _chunks(count: int, device: torch.device) -> Iterator[slice]:
    step = CPU_CHUNK_TOKENS if device.type == "cpu" else max(count, 1)
    for start in range(0, count, step):
        yield slice(start, min(count, start + step))


def dequantize_torch(
    spec: LayoutSpec, buf: torch.Tensor, loc64: torch.Tensor, page_size: int, *, fnuz: bool
) -> torch.Tensor:
    """Decode tokens ``loc64`` (int64, validated) of ``buf``: the torch twin of a read.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import V4
        >>> buf = torch.zeros(1, V4.page_bytes(4), dtype=torch.uint8)
        >>> dequantize_torch(V4, buf, torch.tensor([1]), 4, fnuz=False).shape
        torch.Size([1, 512])
    """
    parts = []
    for part in _chunks(loc64.numel(), buf.device):
        data, scale = gather_rows(spec, buf, loc64[part], page_size)
        parts.append(spec.codec.decode(spec, data, scale, fnuz=fnuz))
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return torch.empty((0, spec.dim), dtype=spec.output_dtype, device=buf.device)
    return torch.cat(parts)


Store = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""One scatter of a write: ``(rows_view, index, source)``, applied as
``rows_view.index_copy_(0, index, source)``."""


def _encode_rows(
    spec: LayoutSpec, rows: torch.Tensor, *, fnuz: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode all ``rows`` (chunk by chunk on the CPU) before anything is stored."""
    n = rows.shape[0]
    steps = [slice(0, n)] if spec.codec is PLAIN_CODEC else list(_chunks(n, rows.device))
    if len(steps) <= 1:
        return spec.codec.encode(spec, rows, fnuz=fnuz)
    data = torch.empty((n, spec.data_bytes), dtype=torch.uint8, device=rows.device)
    scale = torch.empty((n, spec.scale_bytes_written), dtype=torch.uint8, device=rows.device)
    for step in steps:
        data[step], scale[step] = spec.codec.encode(spec, rows[step], fnuz=fnuz)
    return data, scale


def encode_part(
    spec: LayoutSpec,
    rows: torch.Tensor,
    buf: torch.Tensor,
    loc64: torch.Tensor,
    page_size: int,
    *,
    fnuz: bool,
) -> list[Store]:
    """Encode one buffer's part of a write into its scatters; nothing is stored yet.

    ``rows`` are the validated ``[n, dim]`` values and ``loc64`` the int64 locations
    (:func:`check_write`'s results).

    Example:
        >>> import torch
        >>> from kvcompat.layouts import V4
        >>> buf = torch.zeros(1, V4.page_bytes(64), dtype=torch.uint8)
        >>> stores = encode_part(V4, torch.ones(2, 512), buf, torch.tensor([0, 1]), 64, fnuz=False)
        >>> [tuple(source.shape) for _, _, source in stores], int(buf.count_nonzero())
        ([(2, 576), (2, 7)], 0)
    """
    if rows.shape[0] == 0:
        return []
    data, scale = _encode_rows(spec, rows, fnuz=fnuz)
    targets = scatter_targets(spec, buf, loc64, page_size)
    return [
        (view, index, source) for (view, index), source in zip(targets, (data, scale), strict=False)
    ]


def commit(stores: Sequence[Store]) -> None:
    """Apply every scatter of a write, all or nothing.

    The scatters run smallest first. Before the first one, the bytes that every scatter
    but the last (the largest) will overwrite are read back; if anything raises before
    the last scatter has returned, they are put back, so the buffers hold exactly what
    they held before. The last scatter needs no copy: a single ``index_copy_`` either
    stores all its rows or raises before storing any.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import V4
        >>> buf = torch.zeros(1, V4.page_bytes(64), dtype=torch.uint8)
        >>> commit(encode_part(V4, torch.ones(1, 512), buf, torch.tensor([3]), 64, fnuz=False))
        >>> int(buf[0, 3 * 576])  # token 3's first e4m3 code (1.0 at scale 2**-8)
        120
    """
    if not stores:
        return
    ordered = sorted(stores, key=lambda store: store[2].numel())
    saved = [view.index_select(0, index) for view, index, _ in ordered[:-1]]
    started = 0
    try:
        for view, index, source in ordered:
            started += 1
            view.index_copy_(0, index, source)
    except BaseException:
        for (view, index, _), old in zip(ordered[:started], saved, strict=False):
            view.index_copy_(0, index, old)
        raise
