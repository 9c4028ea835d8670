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
from kvcompat.layouts._spec import Encoding, LayoutSpec

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
