"""DeepSeek-V4 fp8 indexer keys: 132 B/token, 128 e4m3 values + one fp32 scale.

The buffer of ``DeepSeekV4IndexerPool`` without ``use_fp4_indexer`` is ``[pages, P * 132]``
uint8: each page holds ``P`` 128-byte data rows (e4m3 codes), then ``P`` 4-byte scale rows
(a little-endian fp32 per token). DSA's ``IndexKeyCache`` pages have the same bytes.

Write (SGLang's CUDA ``fused_store_indexer_cache``, ``store.cuh``), per token, in fp32:
``s = fmaxf(1e-4, amax) / 448`` (IEEE), ``inv = 1 / s`` (IEEE), each code
``e4m3_rn(fmaxf(fminf(x * inv, 448), -448))``, and ``s`` stored as is (a plain fp32, not
a power of two).

Read: ``fp32(e4m3) * s`` as fp32 (what the indexer's scoring kernels compute).

Error bound (finite inputs): ``|x' - x| <= 2**-4 * |x| + 2**-9 * s`` (e4m3's three
mantissa bits, its subnormal step ``2**-9`` in units of ``s``, and the fp32 roundings of
``1 / s``, ``x * inv`` and the read).

Non-finite inputs (``check_finite=False``), as the CUDA code is written: NaN is dropped
from the maximum (``fmaxf``), a NaN value clips to +448 (``fminf(NaN, 448)`` is 448); an
inf makes ``s`` inf, ``inv`` 0, the finite values 0 and the inf itself (``inf * 0``) +448.
"""

from __future__ import annotations

import torch

from kvcompat.layouts._numerics import E4M3FN_MAX, amax_ignoring_nan, decode_e4m3
from kvcompat.layouts._pages import LayoutPage
from kvcompat.layouts._spec import Encoding, KernelSpec, LayoutSpec, Segment, SegmentRole

__all__ = ["DSV4_INDEXER_FP8"]

DIM = 128
FLOOR = 1.0e-4
_CANONICAL_NAN = 0x7FFFFFFF


class _IndexerFp8Codec:
    """Row codec of the fp8 indexer layout (see the module docstring)."""

    def encode(
        self, spec: LayoutSpec, values: torch.Tensor, /, *, fnuz: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = values.to(torch.float32).reshape(values.shape[0], DIM)
        amax = amax_ignoring_nan(x, dim=-1)
        scale = torch.fmax(amax, torch.full_like(amax, FLOOR)) / torch.full_like(amax, E4M3FN_MAX)
        inverse = torch.ones_like(scale) / scale
        y = x * inverse.unsqueeze(-1)
        clipped = torch.fmax(
            torch.fmin(y, torch.full_like(y, E4M3FN_MAX)), torch.full_like(y, -E4M3FN_MAX)
        )
        codes = clipped.to(torch.float8_e4m3fn).view(torch.uint8)
        return codes, scale.contiguous().view(torch.uint8).reshape(-1, 4)

    def decode(
        self, spec: LayoutSpec, data: torch.Tensor, scale: torch.Tensor, /, *, fnuz: bool
    ) -> torch.Tensor:
        s = scale.contiguous().view(torch.float32).reshape(-1, 1)
        out = decode_e4m3(data) * s
        # Every NaN as 0x7FFFFFFF, the NaN an NVIDIA GPU's fp32 multiply gives (the CPU's
        # keeps operand payloads), so reads do not depend on the device.
        out.view(torch.int32).masked_fill_(torch.isnan(out), _CANONICAL_NAN)
        return out


def _max_error(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``2**-4 * |x| + 2**-9 * s`` per value, ``s`` the token's stored scale."""
    s = scale.contiguous().view(torch.float32).reshape(-1, 1)
    return (2.0**-4 * x.abs() + 2.0**-9 * s) * (1 + 1e-6)


_SEGMENTS = (
    Segment("values", SegmentRole.DATA, "data", 0, DIM, Encoding.E4M3FN, DIM),
    Segment("scale", SegmentRole.SCALE, "scale", 0, 4, Encoding.FP32, 1),
)

DSV4_INDEXER_FP8 = LayoutSpec(
    name="dsv4_indexer_fp8",
    data_bytes=DIM,
    scale_bytes=4,
    scale_pad=0,
    tile_size=DIM,
    # SGLang's page is exactly P * 132 bytes; 128 keeps that for every P that is a
    # multiple of 32 (the pools use 64).
    page_align=DIM,
    interleaved=False,
    paged=True,
    dim=DIM,
    heads=1,
    value_dim=None,
    rope_dim=0,
    data_encoding=Encoding.E4M3FN,
    scale_encoding=Encoding.FP32,
    rope_encoding=None,
    output_dtype=torch.float32,
    unscaled_max=None,
    supports_fnuz=False,
    segments=_SEGMENTS,
    error_bound="|x' - x| <= 2**-4 * |x| + 2**-9 * s, s = max(1e-4, amax) / 448 (stored fp32)",
    codec=_IndexerFp8Codec(),
    max_error=_max_error,
    # 132-byte rows: the fp8 family's defaults (2 tokens x 2 warps, picked on 584-byte V4
    # rows) leave the H200 at 51 % / 31 % of copy; these won its sweep (75 % / 64 %).
    kernel=KernelSpec("fp8", scales="fp32", read_launch=(4, 2), write_launch=(8, 4)),
)
"""DeepSeek-V4 fp8 indexer keys: 128 e4m3 + one fp32 scale per token, block-split.

Example:
    >>> import torch
    >>> from kvcompat.layouts import DSV4_INDEXER_FP8, dequantize, quantize
    >>> buf = torch.zeros(1, 64 * 132, dtype=torch.uint8)
    >>> quantize(DSV4_INDEXER_FP8, torch.full((1, 128), 448.0), buf, torch.tensor([2]), 64)
    >>> hex(int(buf[0, 2 * 128])), buf[0, 64 * 128 + 8 : 64 * 128 + 12].view(torch.float32)
    ('0x7e', tensor([1.]))
    >>> dequantize(DSV4_INDEXER_FP8, buf, torch.tensor([2]), 64)[0, :2]
    tensor([448., 448.])
"""

# SGLang's indexer pages hold a multiple of 32 tokens: the picture shows the smallest.
PAGES = (LayoutPage("dsv4_indexer_fp8", DSV4_INDEXER_FP8, 32, note="fp8 indexer keys"),)
