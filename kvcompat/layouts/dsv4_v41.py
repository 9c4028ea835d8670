"""DeepSeek-V4.1 ``V41`` and ``V41_NEW`` layouts: 528 B/token, 512 e4m3 + 16 ue8m0 scales.

Per token: a 512-byte data row (all 512 values as e4m3, the 64 rope dims included) and a
16-byte scale row (one ue8m0 exponent per 32 values). ``V41`` pages are block-split and
padded to a multiple of 512 bytes; ``V41_NEW`` pages interleave each token's data and
scales (FlashMLA's 2026.09.30 kernels) with no padding. Both hold the same token bytes.

Write (SGLang's CUDA ``v41::store_row_fp8``), per 32-value tile: from the fp32 bits of
``amax``, ``e = max(biased_exp(amax) - 8 + (mantissa(amax) > 0x600000), 114)``, which is
``127 + ceil(log2(max(amax / 448, 1e-4)))`` exactly (448 = 1.75 * 2**8); ``q =
e4m3_rne(x * 2**(127 - e))`` with no clamp (``|x / s| <= 448`` by construction).

Read (SGLang's V4.1 dequantizer): ``bf16(fp32(e4m3) * ue8m0(byte))`` with byte 0 the
denormal ``2**-127`` and byte 255 NaN; the product is exact in bf16.

Error bound (finite inputs): ``|x' - x| <= 2**-4 * |x| + 2**-10 * s`` for every value,
``s = 2**(byte - 127)`` its tile's stored scale, ``s < max(amax, 1e-4 * 448) / 224``.

Non-finite inputs (``check_finite=False``): as SGLang's CUDA kernel does them (it says it
does not handle NaN/inf; the bytes below were measured on an H200 and match): ``fmaxf``
drops NaN from the tile maximum, the exponent comes from the maximum's bits (an inf tile
gets 247, an all-NaN tile 248, from the canonical NaN ``0x7FFFFFFF``), and the payload is
``cvt.rn.satfinite``: +-inf and overflow become +-448, NaN becomes 0x7F. SGLang's
pure-torch reference instead poisons a whole tile with a NaN scale; it is not the store.
"""

from __future__ import annotations

import torch

from kvcompat.layouts._numerics import (
    amax_ignoring_nan,
    decode_e4m3,
    encode_e4m3_satfinite,
    inverse_pow2,
    to_bf16,
    ue8m0_to_float,
)
from kvcompat.layouts._spec import Encoding, KernelSpec, LayoutSpec, Segment, SegmentRole

__all__ = ["V41", "V41_NEW"]

SGLANG_KV_LAYOUT = True
"""This module's layouts are values of SGLang's DeepSeek-V4 ``KVLayout`` enum."""

DIM = 512
TILE = 32
TILES = DIM // TILE  # 16
MIN_EXPONENT = 114  # 2**-13, the 1e-4 floor's power-of-two ceiling
_MANTISSA_OF_1_75 = 0x600000


def _exponents(amax: torch.Tensor) -> torch.Tensor:
    """Biased power-of-two exponent of ``max(amax / 448, 1e-4)``'s ceiling, from the bits."""
    bits = amax.contiguous().view(torch.int32)
    above = ((bits & 0x7FFFFF) > _MANTISSA_OF_1_75).to(torch.int32)
    return ((bits >> 23) - 8 + above).clamp_min(MIN_EXPONENT)


class _V41Codec:
    """Row codec of the V41 / V41_NEW layouts (see the module docstring)."""

    def encode(
        self, spec: LayoutSpec, values: torch.Tensor, /, *, fnuz: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = values.shape[0]
        x = values.to(torch.float32).reshape(n, TILES, TILE)
        exponent = _exponents(amax_ignoring_nan(x, dim=-1))
        scaled = x * inverse_pow2(exponent).unsqueeze(-1)
        codes = encode_e4m3_satfinite(scaled).reshape(n, DIM)
        return codes, exponent.to(torch.uint8)

    def decode(
        self, spec: LayoutSpec, data: torch.Tensor, scale: torch.Tensor, /, *, fnuz: bool
    ) -> torch.Tensor:
        n = data.shape[0]
        values = decode_e4m3(data).reshape(n, TILES, TILE)
        product = values * ue8m0_to_float(scale).unsqueeze(-1)
        return to_bf16(product.reshape(n, DIM))


_CODEC = _V41Codec()
_SEGMENTS = (
    Segment("values", SegmentRole.DATA, "data", 0, DIM, Encoding.E4M3FN, DIM),
    Segment("scale", SegmentRole.SCALE, "scale", 0, TILES, Encoding.UE8M0, TILES),
)
_BOUND = (
    "|x' - x| <= 2**-4 * |x| + 2**-10 * s, s = 2**(byte - 127) the tile scale "
    "(s < max(amax, 0.0448) / 224)"
)


def _spec(name: str, *, interleaved: bool) -> LayoutSpec:
    return LayoutSpec(
        name=name,
        data_bytes=DIM,
        scale_bytes=TILES,
        scale_pad=0,
        tile_size=TILE,
        page_align=DIM + TILES if interleaved else DIM,
        interleaved=interleaved,
        paged=True,
        dim=DIM,
        heads=1,
        value_dim=None,
        rope_dim=64,
        data_encoding=Encoding.E4M3FN,
        scale_encoding=Encoding.UE8M0,
        rope_encoding=None,
        output_dtype=torch.bfloat16,
        unscaled_max=None,
        supports_fnuz=False,
        segments=_SEGMENTS,
        error_bound=_BOUND,
        codec=_CODEC,
        kernel=KernelSpec("fp8", scales="ue8m0"),
    )


V41 = _spec("v41", interleaved=False)
"""DeepSeek-V4.1 ``V41``: 512 e4m3 + 16 ue8m0 (one per 32), block-split, align 512.

Example:
    >>> import torch
    >>> from kvcompat.layouts import V41, dequantize, quantize
    >>> buf = torch.zeros(1, V41.page_bytes(2), dtype=torch.uint8)
    >>> quantize(V41, torch.full((1, 512), 0.5), buf, torch.tensor([1]), 2)
    >>> dequantize(V41, buf, torch.tensor([1]), 2)[0, :2]
    tensor([0.5000, 0.5000], dtype=torch.bfloat16)
"""

V41_NEW = _spec("v41_new", interleaved=True)
"""DeepSeek-V4.1 ``V41_NEW``: V41's token bytes, interleaved per token, align 528.

Example:
    >>> from kvcompat.layouts import V41_NEW
    >>> V41_NEW.page_bytes(64), V41_NEW.scale_offset(1, 64)
    (33792, 1040)
"""
