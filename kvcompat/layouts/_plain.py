"""The codec of token-major rows stored as plain elements (MHA and MLA pools).

A row is ``dim`` elements of the pool's dtype: bf16/fp16/fp32 as themselves, fp8 as
uint8 bytes of a logical fp8 dtype (SGLang's ``store_dtype = uint8``). Writing is
``values.to(dtype)`` (SGLang's ``set_kv_buffer``: round to nearest even, and for fp8 the
installed torch's overflow behaviour); reading returns the elements in that dtype.
"""

from __future__ import annotations

import functools

import torch

from kvcompat._errors import LayoutError
from kvcompat.layouts._spec import Encoding, LayoutSpec, Segment

__all__ = ["PLAIN_CODEC", "plain_encoding"]

_ENCODINGS = {
    torch.bfloat16: Encoding.BF16,
    torch.float16: Encoding.FP16,
    torch.float32: Encoding.FP32,
    torch.float8_e4m3fn: Encoding.E4M3FN,
    torch.float8_e4m3fnuz: Encoding.E4M3FNUZ,
    torch.float8_e5m2: Encoding.E5M2,
}


def plain_encoding(dtype: object, *, layout: str) -> Encoding:
    """The element encoding of ``dtype``, or :class:`~kvcompat.LayoutError`."""
    encoding = _ENCODINGS.get(dtype) if isinstance(dtype, torch.dtype) else None
    if encoding is None:
        valid = ", ".join(str(d) for d in _ENCODINGS)
        msg = (
            f"{layout} rows cannot store dtype {dtype!r}; valid dtypes are {valid}. "
            "Hint: pass the pool's logical dtype (pool.dtype), not its store_dtype."
        )
        raise LayoutError(msg)
    return encoding


@functools.cache
def _dtype_of(encoding: Encoding) -> torch.dtype:
    return next(dtype for dtype, enc in _ENCODINGS.items() if enc is encoding)


class _PlainCodec:
    """Identity rows: a dtype cast on write, a reinterpretation on read."""

    def encode(
        self, spec: LayoutSpec, values: torch.Tensor, /, *, fnuz: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = values.shape[0]
        stored = values.to(spec.output_dtype).contiguous()
        data = stored.view(torch.uint8).reshape(n, spec.data_bytes)
        return data, data.new_empty((n, 0))

    def decode(
        self, spec: LayoutSpec, data: torch.Tensor, scale: torch.Tensor, /, *, fnuz: bool
    ) -> torch.Tensor:
        return data.contiguous().view(_dtype_of(spec.data_encoding))


PLAIN_CODEC = _PlainCodec()
"""The shared codec instance of every plain-row layout."""


def row_size(layout: str, name: str, value: object, *, minimum: int) -> int:
    """``value`` if it is an int (not a bool) ``>= minimum``, else a LayoutError naming it.

    Example:
        >>> from kvcompat.layouts._plain import row_size
        >>> row_size("MHA", "head_dim", 128, minimum=1)
        128
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive int" if minimum >= 1 else "an int"
        msg = f"{layout} needs {kind} {name} >= {minimum}; received {value!r}."
        raise LayoutError(msg)
    return value


def plain_row_spec(
    *,
    name: str,
    dtype: torch.dtype,
    encoding: Encoding,
    heads: int,
    value_dim: int,
    rope_dim: int,
    segments: tuple[Segment, ...],
) -> LayoutSpec:
    """The spec of a token-major row of plain ``dtype`` values (MHA K/V rows, MLA latents).

    One row per token, no scales, stored exactly as the pool's dtype; ``dim`` is the sum
    of the segments' values.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import mha_layout
        >>> mha_layout(2, 8, torch.float16).data_bytes
        32
    """
    dim = sum(segment.elements for segment in segments)
    row_bytes = dim * encoding.bits // 8
    return LayoutSpec(
        name=name,
        data_bytes=row_bytes,
        scale_bytes=0,
        scale_pad=0,
        tile_size=dim,
        page_align=row_bytes,
        interleaved=True,
        paged=False,
        dim=dim,
        heads=heads,
        value_dim=value_dim,
        rope_dim=rope_dim,
        data_encoding=encoding,
        scale_encoding=None,
        rope_encoding=encoding if rope_dim else None,
        output_dtype=dtype,
        unscaled_max=float(torch.finfo(dtype).max),
        supports_fnuz=False,
        segments=segments,
        error_bound=f"exact for {dtype} input, else one round-to-nearest-even into {dtype}",
        codec=PLAIN_CODEC,
    )
