"""The function-level seam an adapter calls: :func:`dequantize` and :func:`quantize`.

Both are the pure-torch path ("torch twin"): validate, gather or encode, scatter. A
kernel path can later take the same arguments and reuse :mod:`._addressing` and the
spec's row codec for everything it does not fuse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kvcompat._errors import LayoutError
from kvcompat.layouts._addressing import gather_rows, scatter_rows
from kvcompat.layouts._registry import get_layout
from kvcompat.layouts._validate import check_read, check_write

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvcompat.layouts._spec import LayoutSpec

__all__ = ["dequantize", "quantize"]

CPU_CHUNK_TOKENS = 4096
"""On CPU, tokens are encoded and decoded this many at a time, so that the fp32
temporaries of a chunk stay cache-sized (2-3x faster than one pass at 65536 tokens on the
benchmark machine). Other devices take the whole batch at once."""


def _chunks(count: int, device: torch.device) -> Iterator[slice]:
    step = CPU_CHUNK_TOKENS if device.type == "cpu" else max(count, 1)
    for start in range(0, count, step):
        yield slice(start, min(count, start + step))


def _resolve(layout: object, *, fnuz: bool) -> LayoutSpec:
    spec = get_layout(layout)
    if fnuz and not spec.supports_fnuz:
        msg = (
            f"fnuz=True selects the ROCm e4m3fnuz bytes of the V4 layout; layout "
            f"{spec.name!r} has no fnuz variant. Hint: drop fnuz=True."
        )
        raise LayoutError(msg)
    return spec


def dequantize(
    layout: LayoutSpec | str | object,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    *,
    fnuz: bool = False,
    validate: bool = True,
) -> torch.Tensor:
    """Read tokens ``loc`` from a pool buffer and decode them to ``[n, dim]`` values.

    Args:
        layout: a :class:`LayoutSpec` or anything :func:`get_layout` accepts.
        buf: the pool's per-layer buffer: ``[num_pages, page_bytes]`` for the DeepSeek-V4
            layouts (uint8 or fp8-typed), ``[rows, ...]`` for token-major rows. Contiguous.
        loc: 1-D integer tensor of token locations on ``buf``'s device (may repeat).
        page_size: the pool's page size in tokens (ignored for addressing by token-major
            layouts, but still checked to be a positive int).
        fnuz: read V4 bytes written by SGLang's ROCm e4m3fnuz store.
        validate: check ``buf`` and ``loc`` first (set False only after
            :func:`check_read` on the same arguments).

    Returns:
        A new ``[n, layout.dim]`` tensor of ``layout.output_dtype`` on ``buf``'s device:
        bf16 for the DeepSeek-V4 and DSA layouts (bit-identical to SGLang's dequantizers),
        the pool dtype for MHA and MLA rows.

    Raises:
        LayoutError: bad buffer, page size or locations; ``fnuz`` on a layout without it.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import V41_NEW, dequantize
        >>> buf = torch.zeros(1, V41_NEW.page_bytes(4), dtype=torch.uint8)
        >>> buf[0, 528 + 512] = 127  # token 1, first scale byte: 2**0
        >>> buf[0, 528] = 0x38  # token 1, element 0: e4m3 1.0
        >>> dequantize(V41_NEW, buf, torch.tensor([1, 1]), 4)[:, 0]
        tensor([1., 1.], dtype=torch.bfloat16)
    """
    spec = _resolve(layout, fnuz=fnuz)
    loc64 = check_read(spec, buf, loc, page_size) if validate else loc.long()
    parts = []
    for part in _chunks(loc64.numel(), buf.device):
        data, scale = gather_rows(spec, buf, loc64[part], page_size)
        parts.append(spec.codec.decode(spec, data, scale, fnuz=fnuz))
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return torch.empty((0, spec.dim), dtype=spec.output_dtype, device=buf.device)
    return torch.cat(parts)


def quantize(
    layout: LayoutSpec | str | object,
    values: torch.Tensor,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    *,
    fnuz: bool = False,
    check_finite: bool = True,
    validate: bool = True,
) -> None:
    """Encode ``values`` and write them, in place, as tokens ``loc`` of a pool buffer.

    Exactly the written tokens' data rows and the scale bytes SGLang's writers store
    change; every other byte (other tokens, V4's scale pad byte, page padding) keeps its
    value. ``values`` and ``loc`` are never modified. All checks run before any byte moves.

    Args:
        layout: a :class:`LayoutSpec` or anything :func:`get_layout` accepts.
        values: ``[n, dim]`` (or ``[n, 1, dim]``; ``[n, heads, head_dim]`` for MHA rows)
            floating tensor on ``buf``'s device.
        buf: the pool's per-layer buffer (see :func:`dequantize`), written in place.
        loc: 1-D integer tensor of ``n`` distinct token locations on ``buf``'s device.
        page_size: the pool's page size in tokens.
        fnuz: write V4 bytes as SGLang's ROCm e4m3fnuz Triton store does (never the
            default: those bytes differ from the CUDA store's).
        check_finite: reject NaN/Inf values (and out-of-range values for unscaled
            layouts) with :class:`~kvcompat.WriteError`; with False they are encoded as
            SGLang's store would (documented per layout).
        validate: run :func:`check_write` first (set False only when the caller already
            did, passing its normalised ``values`` and ``loc``).

    Raises:
        LayoutError: bad buffer or page size; ``fnuz`` on a layout without it.
        WriteError: bad locations (dtype, shape, device, range, duplicates) or values
            (dtype, shape, device, non-finite).

    Example:
        >>> import torch
        >>> from kvcompat.layouts import V4, quantize
        >>> buf = torch.zeros(1, V4.page_bytes(2), dtype=torch.uint8)
        >>> quantize(V4, torch.ones(1, 512), buf, torch.tensor([1]), 2)
        >>> buf[0, 2 * 576 + 8 : 2 * 576 + 16].tolist()  # token 1's scale row; byte 7 untouched
        [119, 119, 119, 119, 119, 119, 119, 0]
    """
    spec = _resolve(layout, fnuz=fnuz)
    if validate:
        rows, loc64 = check_write(spec, buf, loc, values, page_size, check_finite=check_finite)
    else:
        rows, loc64 = values.reshape(values.shape[0], spec.dim), loc.long()
    for part in _chunks(loc64.numel(), buf.device):
        data, scale = spec.codec.encode(spec, rows[part], fnuz=fnuz)
        scatter_rows(spec, buf, loc64[part], page_size, data, scale)
