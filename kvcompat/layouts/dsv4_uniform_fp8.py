"""DeepSeek-V4 ``UNIFORM_FP8`` layout (TRT-LLM backend): 512 e4m3 per token, no scales.

Per token: 448 nope values then 64 rope values, all e4m3fn, with no scale bytes and no
page padding (``page_bytes(P) = 512 * P``); the attention backend supplies a fixed unit
scale. SGLang types the buffer ``float8_e4m3fn`` rather than uint8.

Write (SGLang's ``DeepSeekV4UniformFP8KVPool.set_key_buffer_fused``): ``values.to(
torch.float8_e4m3fn)`` straight from the input dtype, with no clamp. The codec makes the
same call, so its bytes equal SGLang's under the same torch: round to nearest even, and
for magnitudes beyond 448 whatever that torch's cast does (torch 2.13 saturates to +-448;
older releases give NaN). With ``check_finite=True`` such values, and NaN/inf, are
rejected before anything is written.

Read: ``bf16(fp32(e4m3))``, exact.

Error bound (``|x| <= 448``): ``|x' - x| <= max(2**-4 * |x|, 2**-10)``.
"""

from __future__ import annotations

import torch

from kvcompat.layouts._numerics import E4M3FN_MAX, decode_e4m3, to_bf16
from kvcompat.layouts._spec import Encoding, KernelSpec, LayoutSpec, Segment, SegmentRole

__all__ = ["UNIFORM_FP8"]

SGLANG_KV_LAYOUT = True
"""This module's layouts are values of SGLang's DeepSeek-V4 ``KVLayout`` enum."""

DIM = 512
NOPE_DIM = 448
ROPE_DIM = 64


class _UniformFp8Codec:
    """Row codec of the UNIFORM_FP8 layout: a plain e4m3fn cast each way."""

    def encode(
        self, spec: LayoutSpec, values: torch.Tensor, /, *, fnuz: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        codes = values.to(torch.float8_e4m3fn).contiguous().view(torch.uint8)
        return codes, codes.new_empty((values.shape[0], 0))

    def decode(
        self, spec: LayoutSpec, data: torch.Tensor, scale: torch.Tensor, /, *, fnuz: bool
    ) -> torch.Tensor:
        return to_bf16(decode_e4m3(data))


UNIFORM_FP8 = LayoutSpec(
    name="uniform_fp8",
    data_bytes=DIM,
    scale_bytes=0,
    scale_pad=0,
    tile_size=DIM,
    page_align=DIM,
    interleaved=False,
    paged=True,
    dim=DIM,
    heads=1,
    value_dim=None,
    rope_dim=ROPE_DIM,
    data_encoding=Encoding.E4M3FN,
    scale_encoding=None,
    rope_encoding=Encoding.E4M3FN,
    output_dtype=torch.bfloat16,
    unscaled_max=E4M3FN_MAX,
    supports_fnuz=False,
    segments=(
        Segment("nope", SegmentRole.DATA, "data", 0, NOPE_DIM, Encoding.E4M3FN, NOPE_DIM),
        Segment("rope", SegmentRole.ROPE, "data", NOPE_DIM, ROPE_DIM, Encoding.E4M3FN, ROPE_DIM),
    ),
    error_bound="|x' - x| <= max(2**-4 * |x|, 2**-10) for |x| <= 448",
    codec=_UniformFp8Codec(),
    kernel=KernelSpec("fp8", scales="none", tile=64),
)
"""DeepSeek-V4 ``UNIFORM_FP8``: 448 + 64 e4m3fn values per token, no scales, align 512.

Example:
    >>> import torch
    >>> from kvcompat.layouts import UNIFORM_FP8, dequantize, quantize
    >>> buf = torch.zeros(2, UNIFORM_FP8.page_bytes(4), dtype=torch.float8_e4m3fn)
    >>> quantize(UNIFORM_FP8, torch.full((1, 512), 1.1), buf, torch.tensor([5]), 4)
    >>> dequantize(UNIFORM_FP8, buf, torch.tensor([5]), 4)[0, 0]
    tensor(1.1250, dtype=torch.bfloat16)
"""
