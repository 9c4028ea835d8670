"""DeepSeek-V4.1 ``V41_FP4`` and ``V41_FP4_NEW``: 288 B/token, 512 e2m1 + 32 e4m3 scales.

Per token: a 256-byte data row (512 e2m1 codes, two per byte, the even element in the
low nibble) and a 32-byte scale row (one e4m3 scale per 16 values). ``V41_FP4`` pages are
block-split and padded to a multiple of 256 bytes; ``V41_FP4_NEW`` interleaves each
token's data and scales with no padding.

Write (SGLang's CUDA ``v41::store_row_fp4``), per 16-value tile, in fp32: ``s =
e4m3_rne(clamp(amax / 6, 2**-9, 448))`` (IEEE division; the stored byte is the e4m3
code), then each code is ``e2m1_rne(x / fp32(s))``: an IEEE division by the rounded
scale, ties to even, saturating at +-6, the sign kept on values that round to zero
(code 0x8).

Read: ``bf16(e2m1(code) * fp32(e4m3 scale))`` (exact), with the sign applied to zero.

Error bound (finite inputs): for every value, with ``s`` its tile's stored scale,
``|x' - x| <= max(0.25 * max(|x|, s), |x| - 6 * s)``. e2m1 has one mantissa bit (half a
step is at most a quarter of the value from 1 up, and 0.25 below 1); the second term is
saturation, which happens only when rounding the scale to e4m3 lowered it (at most
``2**-4`` relative for normal e4m3 scales, more for the subnormal ones below
``2**-6``) or when ``amax > 2688`` (``6 * 448``, the largest storable magnitude).

Non-finite inputs (``check_finite=False``): as SGLang's CUDA kernel does them (measured on
an H200): ``fmaxf`` drops NaN from the tile maximum (an all-NaN tile gets the 2**-9
scale, byte 0x01); an inf makes the scale 448; the codes are ``cvt.rn.satfinite``: +-inf
become +-6 and NaN of either sign becomes +6 (code 0x7). SGLang's pure-torch reference
instead poisons a tile holding a NaN (NaN scale, zero codes); it is not the store.
"""

from __future__ import annotations

import torch

from kvcompat.layouts._numerics import (
    E2M1_MAX,
    E4M3FN_MAX,
    amax_ignoring_nan,
    decode_e2m1,
    decode_e4m3,
    encode_e2m1,
    pack_nibbles,
    to_bf16,
    unpack_nibbles,
)
from kvcompat.layouts._spec import Encoding, KernelSpec, LayoutSpec, Segment, SegmentRole

__all__ = ["V41_FP4", "V41_FP4_NEW"]

SGLANG_KV_LAYOUT = True
"""This module's layouts are values of SGLang's DeepSeek-V4 ``KVLayout`` enum."""

DIM = 512
TILE = 16
TILES = DIM // TILE  # 32
MIN_SCALE = 2.0**-9  # the smallest e4m3 subnormal


class _V41Fp4Codec:
    """Row codec of the V41_FP4 / V41_FP4_NEW layouts (see the module docstring)."""

    def encode(
        self, spec: LayoutSpec, values: torch.Tensor, /, *, fnuz: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = values.shape[0]
        x = values.to(torch.float32).reshape(n, TILES, TILE)
        amax = amax_ignoring_nan(x, dim=-1)
        quotient = amax / torch.full_like(amax, E2M1_MAX)
        # fminf(fmaxf(q, 2**-9), 448): fmaxf turns a NaN quotient into 2**-9.
        quotient = torch.fmax(quotient, torch.full_like(quotient, MIN_SCALE))
        quotient = torch.fmin(quotient, torch.full_like(quotient, E4M3FN_MAX))
        scale_codes = quotient.to(torch.float8_e4m3fn).view(torch.uint8)
        codes = encode_e2m1(x / decode_e4m3(scale_codes).unsqueeze(-1)).reshape(n, DIM)
        return pack_nibbles(codes), scale_codes

    def decode(
        self, spec: LayoutSpec, data: torch.Tensor, scale: torch.Tensor, /, *, fnuz: bool
    ) -> torch.Tensor:
        n = data.shape[0]
        values = decode_e2m1(unpack_nibbles(data)).reshape(n, TILES, TILE)
        product = values * decode_e4m3(scale).unsqueeze(-1)
        return to_bf16(product.reshape(n, DIM))


_CODEC = _V41Fp4Codec()
_SEGMENTS = (
    Segment("values", SegmentRole.DATA, "data", 0, DIM // 2, Encoding.E2M1X2, DIM),
    Segment("scale", SegmentRole.SCALE, "scale", 0, TILES, Encoding.E4M3FN, TILES),
)
_BOUND = (
    "|x' - x| <= max(0.25 * max(|x|, s), |x| - 6 * s), s = fp32(e4m3 scale byte) the "
    "tile scale; magnitudes above 2688 saturate"
)


def _spec(name: str, *, interleaved: bool) -> LayoutSpec:
    return LayoutSpec(
        name=name,
        data_bytes=DIM // 2,
        scale_bytes=TILES,
        scale_pad=0,
        tile_size=TILE,
        page_align=DIM // 2 + TILES if interleaved else DIM // 2,
        interleaved=interleaved,
        paged=True,
        dim=DIM,
        heads=1,
        value_dim=None,
        rope_dim=64,
        data_encoding=Encoding.E2M1X2,
        scale_encoding=Encoding.E4M3FN,
        rope_encoding=None,
        output_dtype=torch.bfloat16,
        unscaled_max=None,
        supports_fnuz=False,
        segments=_SEGMENTS,
        error_bound=_BOUND,
        codec=_CODEC,
        kernel=KernelSpec("fp4", scales="e4m3"),
    )


V41_FP4 = _spec("v41_fp4", interleaved=False)
"""DeepSeek-V4.1 ``V41_FP4``: 512 e2m1 + 32 e4m3 (one per 16), block-split, align 256.

Example:
    >>> import torch
    >>> from kvcompat.layouts import V41_FP4, dequantize, quantize
    >>> buf = torch.zeros(1, V41_FP4.page_bytes(2), dtype=torch.uint8)
    >>> quantize(V41_FP4, torch.full((1, 512), -3.0), buf, torch.tensor([0]), 2)
    >>> hex(int(buf[0, 0])), hex(int(buf[0, 2 * 256]))  # codes 0xF (-6), scale 0.5
    ('0xff', '0x30')
    >>> dequantize(V41_FP4, buf, torch.tensor([0]), 2)[0, :2]
    tensor([-3., -3.], dtype=torch.bfloat16)
"""

V41_FP4_NEW = _spec("v41_fp4_new", interleaved=True)
"""DeepSeek-V4.1 ``V41_FP4_NEW``: V41_FP4's token bytes, interleaved, align 288.

Example:
    >>> from kvcompat.layouts import V41_FP4_NEW
    >>> V41_FP4_NEW.page_bytes(2), V41_FP4_NEW.row_addressing(2)
    (576, (288, 256, 288))
"""
