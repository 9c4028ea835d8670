"""Shared cases and independent helpers for the kvcompat.layouts tests.

The helpers here are written from the layout definitions, not from kvcompat's code: byte
offsets come from the spec's documented formulas evaluated token by token, and number
decoders are plain Python on integer bits.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

from kvcompat.layouts import (
    DSA_FP8,
    UNIFORM_FP8,
    V4,
    V41,
    V41_FP4,
    V41_FP4_NEW,
    V41_NEW,
    LayoutSpec,
    dsa_fp8_layout,
    mha_layout,
    mla_layout,
)
from kvcompat.layouts._registry import LAYOUTS

DSV4_LAYOUTS: tuple[LayoutSpec, ...] = (V4, V41, V41_FP4, UNIFORM_FP8, V41_NEW, V41_FP4_NEW)
# The registry drives the parametrizations: a layout added to LAYOUTS is tested here
# (geometry, round trips, validation, numerics) without touching this file.
NAMED_LAYOUTS: tuple[LayoutSpec, ...] = tuple(LAYOUTS.values())
ROW_LAYOUTS: tuple[LayoutSpec, ...] = (
    dsa_fp8_layout(256, 0),
    mha_layout(2, 8, torch.bfloat16),
    mha_layout(4, 16, torch.float8_e4m3fn),
    mha_layout(1, 24, torch.float16),
    mla_layout(32, 16, torch.bfloat16),
    mla_layout(64, 0, torch.float8_e5m2),
    mla_layout(16, 8, torch.float32),
)
ALL_LAYOUTS = NAMED_LAYOUTS + ROW_LAYOUTS
assert set(DSV4_LAYOUTS) <= set(NAMED_LAYOUTS)
assert DSA_FP8 in NAMED_LAYOUTS


def layout_id(spec: LayoutSpec) -> str:
    return spec.name


def buffer_for(spec: LayoutSpec, page_size: int, rows: int, seed: int) -> torch.Tensor:
    """A buffer of random bytes, shaped as SGLang allocates it for ``spec``."""
    g = torch.Generator().manual_seed(seed)
    per_row = page_size if spec.paged else 1
    raw = torch.randint(0, 256, (rows, spec.page_bytes(per_row)), generator=g).to(torch.uint8)
    if spec.paged:
        return raw
    if spec.heads > 1:  # MHA: [rows, heads, head_dim] in the pool dtype
        head_bytes = spec.data_bytes // spec.heads
        return raw.view(rows, spec.heads, head_bytes).view(spec.output_dtype)
    return raw.view(rows, 1, spec.data_bytes)  # MLA / DSA: [rows, 1, row_bytes]


def capacity(spec: LayoutSpec, buf: torch.Tensor, page_size: int) -> int:
    return buf.shape[0] * (page_size if spec.paged else 1)


def flat_bytes(buf: torch.Tensor) -> torch.Tensor:
    return buf.contiguous().view(torch.uint8).reshape(-1)


def writable_mask(
    spec: LayoutSpec, buf: torch.Tensor, loc: list[int], page_size: int
) -> torch.Tensor:
    """Bytes a write of tokens ``loc`` may change, from the documented offsets."""
    mask = torch.zeros(flat_bytes(buf).numel(), dtype=torch.bool)
    written_scale = spec.scale_bytes - spec.scale_pad
    for token in loc:
        data = spec.data_offset(token, page_size)
        mask[data : data + spec.data_bytes] = True
        scale = spec.scale_offset(token, page_size)
        mask[scale : scale + written_scale] = True
    return mask


def tile_values(
    n: int,
    spec: LayoutSpec,
    *,
    seed: int,
    dtype: torch.dtype,
    low: int = -20,
    high: int = 10,
) -> torch.Tensor:
    """``[n, dim]`` values whose tiles have magnitudes ``2**low .. 2**high``."""
    g = torch.Generator().manual_seed(seed)
    tile = min(spec.tile_size, spec.dim)
    tiles = -(-spec.dim // tile)
    mags = torch.exp2(torch.randint(low, high + 1, (n, tiles, 1), generator=g).float())
    values = (torch.randn(n, tiles, tile, generator=g) * mags).reshape(n, tiles * tile)[
        :, : spec.dim
    ]
    return values.contiguous().to(dtype)


# ---------------------------------------------------------------- independent decoders


def e4m3_value(code: int, *, fnuz: bool = False) -> float:
    """Decode an e4m3 byte from its bits (fn: bias 7, NaN 0x7F/0xFF; fnuz: bias 8, NaN 0x80)."""
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = (code >> 3) & 0xF, code & 0x7
    if fnuz:
        if code == 0x80:
            return math.nan
        bias = 8
    else:
        if code & 0x7F == 0x7F:
            return math.nan
        bias = 7
    if exponent == 0:
        return sign * math.ldexp(mantissa, 1 - bias - 3)
    return sign * math.ldexp(8 + mantissa, exponent - bias - 3)


E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e2m1_value(code: int) -> float:
    magnitude = E2M1_MAGNITUDES[code & 7]
    return -magnitude if code & 8 else magnitude  # -0.0 for code 8


def e2m1_reference_code(y: float) -> int:
    """Nearest e2m1 code by brute force: ties to the even code, saturate, keep the sign.

    NaN (either sign) is +6, code 7: what NVIDIA's cvt.rn.satfinite.e2m1x2 gives (H200).
    """
    if math.isnan(y):
        return 7
    sign = 8 if math.copysign(1.0, y) < 0 else 0
    target = min(abs(y), 6.0)
    best = min(range(8), key=lambda c: (abs(E2M1_MAGNITUDES[c] - target), c & 1))
    return sign | best


def ceil_log2(value: Fraction) -> int:
    """Exact ``ceil(log2(value))`` for a positive rational."""
    exponent = value.numerator.bit_length() - value.denominator.bit_length()
    while Fraction(2) ** exponent < value:
        exponent += 1
    while Fraction(2) ** (exponent - 1) >= value:
        exponent -= 1
    return exponent


def f32(value: float) -> float:
    """Round a Python float to the nearest fp32."""
    return float(torch.tensor(value, dtype=torch.float32))
