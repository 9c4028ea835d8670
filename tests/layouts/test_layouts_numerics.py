"""Exhaustive byte-level checks of every scale byte, data code and rounding rule.

Expected values come from independent bit-level decoders (``_layout_cases``), never from
kvcompat's own helpers; buffers are built byte by byte and read through the public
:func:`dequantize`, so addressing is exercised too.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
import torch
from _layout_cases import (
    E2M1_MAGNITUDES,
    ceil_log2,
    e2m1_reference_code,
    e2m1_value,
    e4m3_value,
    f32,
)

from kvcompat.layouts import (
    UNIFORM_FP8,
    V4,
    V41,
    V41_FP4,
    V41_FP4_NEW,
    V41_NEW,
    LayoutSpec,
    dequantize,
    quantize,
)
from kvcompat.layouts._addressing import scatter_rows
from kvcompat.layouts._numerics import encode_e2m1

ALL_BYTES = list(range(256))


def bf16_of(value: float) -> torch.Tensor:
    return torch.tensor([value], dtype=torch.float32).to(torch.bfloat16)


def assert_bits_equal(actual: torch.Tensor, expected: list[float]) -> None:
    """bf16 results equal bit for bit, NaN matching NaN."""
    want = torch.tensor(expected, dtype=torch.float32).to(torch.bfloat16)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(actual), nan)
    assert torch.equal(actual[~nan].view(torch.int16), want[~nan].view(torch.int16))


def write_rows(
    spec: LayoutSpec, data: torch.Tensor, scale: torch.Tensor, page_size: int = 4
) -> tuple[torch.Tensor, torch.Tensor]:
    n = data.shape[0]
    buf = torch.zeros(-(-n // page_size), spec.page_bytes(page_size), dtype=torch.uint8)
    loc = torch.arange(n)
    scatter_rows(spec, buf, loc, page_size, data, scale)
    return buf, loc


# ----------------------------------------------------------------------- scale bytes


@pytest.mark.parametrize("spec", [V41, V41_NEW], ids=lambda s: s.name)
def test_every_ue8m0_byte(spec: LayoutSpec) -> None:
    """V41 scale byte b reads as 2**(b - 127); 0 is the denormal 2**-127, 255 is NaN."""
    tokens = 256 // 16
    data = torch.full((tokens, 512), 0x38, dtype=torch.uint8)  # e4m3 1.0
    scale = torch.tensor(ALL_BYTES, dtype=torch.uint8).reshape(tokens, 16)
    buf, loc = write_rows(spec, data, scale)
    out = dequantize(spec, buf, loc, 4)[:, ::32].reshape(-1)  # one value per tile
    expected = [math.nan if b == 255 else math.ldexp(1.0, b - 127) for b in ALL_BYTES]
    assert_bits_equal(out, expected)
    assert out[0].item() == 2.0**-127  # the denormal, not zero


def test_every_v4_scale_byte() -> None:
    """V4 scale byte b multiplies by exp2(b - 127): 255 is +inf, and 0 gives 0 (the GPU
    reader's exp2 flushes the denormal 2**-127; measured on an H200)."""
    tokens = -(-256 // 7)
    data = torch.zeros(tokens, 576, dtype=torch.uint8)
    data[:, :448] = 0x38  # e4m3 1.0
    scale = (torch.arange(tokens * 7) % 256).to(torch.uint8).reshape(tokens, 7)
    buf, loc = write_rows(V4, data, scale)
    out = dequantize(V4, buf, loc, 4)[:, :448:64].reshape(-1)
    expected = [
        math.inf if b == 255 else 0.0 if b == 0 else math.ldexp(1.0, b - 127)
        for b in scale.reshape(-1).tolist()
    ]
    assert_bits_equal(out, expected)


def test_every_e4m3_scale_byte_of_fp4() -> None:
    """V41_FP4 scale byte b is an e4m3 value: code 2 (1.0) reads as exactly that value."""
    tokens = 256 // 32
    data = torch.full((tokens, 256), 0x22, dtype=torch.uint8)  # codes 2, 2: 1.0, 1.0
    scale = torch.tensor(ALL_BYTES, dtype=torch.uint8).reshape(tokens, 32)
    for spec in (V41_FP4, V41_FP4_NEW):
        buf, loc = write_rows(spec, data, scale)
        out = dequantize(spec, buf, loc, 4)[:, ::16].reshape(-1)
        assert_bits_equal(out, [e4m3_value(b) for b in ALL_BYTES])


# ------------------------------------------------------------------------ data codes


@pytest.mark.parametrize("spec", [V41, V41_NEW, UNIFORM_FP8], ids=lambda s: s.name)
def test_every_e4m3_data_code(spec: LayoutSpec) -> None:
    data = torch.tensor(ALL_BYTES * 2, dtype=torch.uint8).reshape(1, 512)
    scale = torch.full((1, spec.scale_bytes), 127, dtype=torch.uint8)  # 2**0
    buf, loc = write_rows(spec, data, scale)
    out = dequantize(spec, buf, loc, 4).reshape(-1)
    assert_bits_equal(out, [e4m3_value(b) for b in ALL_BYTES * 2])


@pytest.mark.parametrize("fnuz", [False, True])
def test_every_v4_nope_code(fnuz: bool) -> None:
    data = torch.zeros(1, 576, dtype=torch.uint8)
    data[0, :256] = torch.tensor(ALL_BYTES, dtype=torch.uint8)
    data[0, 256:448] = torch.tensor(ALL_BYTES[:192], dtype=torch.uint8)
    data[0, 448:] = torch.tensor([0x34, 0x12] * 64, dtype=torch.uint8)  # bf16 0x1234
    scale = torch.full((1, 7), 127, dtype=torch.uint8)
    buf, loc = write_rows(V4, data, scale)
    out = dequantize(V4, buf, loc, 4, fnuz=fnuz).reshape(-1)
    codes = ALL_BYTES + ALL_BYTES[:192]
    assert_bits_equal(out[:448], [e4m3_value(b, fnuz=fnuz) for b in codes])
    assert bool((out[448:].view(torch.int16) == 0x1234).all())  # rope bytes copied


@pytest.mark.parametrize("spec", [V41_FP4, V41_FP4_NEW], ids=lambda s: s.name)
def test_every_e2m1_code(spec: LayoutSpec) -> None:
    """All 16 codes in both nibbles; the low nibble is the even element; -0.0 keeps its sign."""
    pairs = [(lo, hi) for lo in range(16) for hi in range(16)]  # 256 bytes
    data = torch.tensor([lo | hi << 4 for lo, hi in pairs], dtype=torch.uint8).reshape(1, 256)
    scale = torch.full((1, 32), 0x38, dtype=torch.uint8)  # e4m3 1.0
    buf, loc = write_rows(spec, data, scale)
    out = dequantize(spec, buf, loc, 4).reshape(-1)
    expected = [e2m1_value(c) for pair in pairs for c in pair]
    assert_bits_equal(out, expected)
    assert torch.signbit(out[1]).item() is False  # code 0
    negative_zero = out[[i for i, v in enumerate(expected) if v == 0 and math.copysign(1, v) < 0]]
    assert bool(torch.signbit(negative_zero.float()).all())


# --------------------------------------------------------------------------- rounding


def test_e2m1_rounding_matches_brute_force() -> None:
    grid = sorted({s * m for m in E2M1_MAGNITUDES for s in (1.0, -1.0)})
    mids = [(a + b) / 2 for a, b in itertools.pairwise(grid)]
    nudged = [v + d for v in grid + mids for d in (-1e-6, 0.0, 1e-6)]
    extra = [0.0, -0.0, 1e-30, -1e-30, 5.999, 6.0001, 7.0, 1e9, -1e9, math.inf, -math.inf]
    sweep = [i / 64 for i in range(-512, 513)]
    ys = nudged + extra + sweep + [math.nan, -math.nan]
    got = encode_e2m1(torch.tensor(ys, dtype=torch.float32)).tolist()
    assert got == [e2m1_reference_code(f32(y)) for y in ys]


def test_torch_e4m3_cast_rounds_ties_to_even() -> None:
    """kvcompat relies on torch's fp32 -> e4m3 cast being round-to-nearest-even."""
    for dtype, fnuz in ((torch.float8_e4m3fn, False), (torch.float8_e4m3fnuz, True)):
        finite = [c for c in range(0x7F) if not math.isnan(e4m3_value(c, fnuz=fnuz))]
        values = [e4m3_value(c, fnuz=fnuz) for c in finite]
        mids = [(a + b) / 2 for a, b in itertools.pairwise(values)]
        got = torch.tensor(mids, dtype=torch.float32).to(dtype).view(torch.uint8).tolist()
        want = [finite[i] if finite[i] % 2 == 0 else finite[i + 1] for i in range(len(mids))]
        assert got == want


def _v4_scale_bytes(amaxes: list[float]) -> list[int]:
    values = torch.zeros(len(amaxes), 512)
    values[:, 0] = torch.tensor(amaxes)
    buf = torch.zeros(-(-len(amaxes) // 4), V4.page_bytes(4), dtype=torch.uint8)
    loc = torch.arange(len(amaxes))
    quantize(V4, values, buf, loc, 4)
    return [int(buf[t // 4, 4 * 576 + (t % 4) * 8]) for t in range(len(amaxes))]


def _boundary_amaxes(factor: float) -> list[float]:
    """amax values at and one fp32 ulp around factor * 2**k, plus the floors."""
    values = []
    for k in range(-30, 30):
        base = f32(factor * 2.0**k)
        below = float(torch.nextafter(torch.tensor(base), torch.tensor(0.0)))
        above = float(torch.nextafter(torch.tensor(base), torch.tensor(math.inf)))
        values += [below, base, above]
    values += [0.0, 1e-30, 1e-4, f32(1e-4 * 448), 1.0, 3.0, 1e30, 3e38]
    return values


def test_v4_scale_byte_is_the_power_of_two_ceiling() -> None:
    """byte = 127 + ceil(log2(fl(max(1e-4, amax) / 448))), the quotient an fp32 division."""
    amaxes = _boundary_amaxes(448.0)
    got = _v4_scale_bytes(amaxes)
    floor = Fraction(f32(1e-4))
    for amax, byte in zip(amaxes, got, strict=True):
        quotient = Fraction(f32(float(max(floor, Fraction(amax)) / 448)))
        assert byte == 127 + ceil_log2(quotient), amax


def test_v41_scale_byte_is_the_exact_power_of_two_ceiling() -> None:
    """byte = 127 + ceil(log2(max(amax / 448, 1e-4))) exactly (the CUDA bit formula)."""
    amaxes = _boundary_amaxes(448.0) + _boundary_amaxes(1.75)
    values = torch.zeros(len(amaxes), 512)
    values[:, 0] = torch.tensor(amaxes)
    buf = torch.zeros(-(-len(amaxes) // 4), V41.page_bytes(4), dtype=torch.uint8)
    quantize(V41, values, buf, torch.arange(len(amaxes)), 4)
    floor = Fraction(f32(1e-4))
    for t, amax in enumerate(amaxes):
        byte = int(buf[t // 4, 4 * 512 + (t % 4) * 16])
        assert byte == 127 + ceil_log2(max(Fraction(amax) / 448, floor)), amax


def test_v41_fp4_scale_is_rounded_amax_over_six() -> None:
    amaxes = [0.0, 1e-9, 2.0**-9 * 6, 0.01, 1.0, 3.0, 6.0, 100.0, 2688.0, 5000.0, 1e30]
    values = torch.zeros(len(amaxes), 512)
    values[:, 0] = torch.tensor(amaxes)
    buf = torch.zeros(len(amaxes), V41_FP4.page_bytes(1), dtype=torch.uint8)
    quantize(V41_FP4, values, buf, torch.arange(len(amaxes)), 1, check_finite=False)
    for t, amax in enumerate(amaxes):
        quotient = min(max(f32(amax / 6.0), 2.0**-9), 448.0)
        expected = torch.tensor(quotient).to(torch.float8_e4m3fn).view(torch.uint8).item()
        assert int(buf[t, 256]) == expected, amax


def test_fp4_codes_divide_by_the_rounded_scale() -> None:
    """A value exactly on an e2m1 tie after dividing by the *rounded* scale rounds to even."""
    values = torch.zeros(1, 512)
    values[0, :16] = torch.tensor([6.5] + [0.25 * 6.5 / 6.0 * k for k in range(15)])
    buf = torch.zeros(1, V41_FP4.page_bytes(1), dtype=torch.uint8)
    quantize(V41_FP4, values, buf, torch.tensor([0]), 1)
    scale = torch.tensor([int(buf[0, 256])], dtype=torch.uint8).view(torch.float8_e4m3fn).item()
    codes = [(int(buf[0, i // 2]) >> (4 * (i % 2))) & 0xF for i in range(16)]
    expected = [e2m1_reference_code(f32(f32(v) / scale)) for v in values[0, :16].tolist()]
    assert codes == expected


# ------------------------------------------------------------- non-finite, CUDA flavour


def test_v4_non_finite_follows_the_cuda_store() -> None:
    """check_finite=False: fmaxf drops NaN, inf makes byte 255 and the reciprocal -inf."""
    values = torch.zeros(1, 512)
    values[0, 0:64] = 1.0
    values[0, 3] = math.nan  # tile 0: amax ignores the NaN, the NaN stores as +448
    values[0, 64:128] = 2.0
    values[0, 64] = math.inf  # tile 1: byte 255, x * -inf clipped
    values[0, 65] = -3.0
    values[0, 66] = 0.0
    values[0, 128:192] = math.nan  # tile 2: only NaN -> floor scale, all +448
    buf = torch.zeros(1, V4.page_bytes(1), dtype=torch.uint8)
    quantize(V4, values, buf, torch.tensor([0]), 1, check_finite=False)
    row, scale = buf[0, :576], buf[0, 576:584]
    assert scale[:3].tolist() == [119, 255, 105]  # 1/448 -> 2**-8; inf; 1e-4/448 -> 2**-22
    assert int(scale[7]) == 0  # pad byte untouched
    assert int(row[3]) == 0x7E  # NaN -> +448
    assert int(row[0]) == 0x78  # 1.0 * 2**8 = 256
    assert row[64:68].tolist() == [0xFE, 0x7E, 0x7E, 0xFE]  # inf*-inf, -3*-inf, 0*-inf, 2*-inf
    assert bool((row[128:192] == 0x7E).all())


def test_uniform_fp8_stores_what_torch_cast_gives() -> None:
    values = torch.tensor([[500.0, -470.0, 449.0, math.nan] + [1.0] * 508])
    buf = torch.zeros(1, UNIFORM_FP8.page_bytes(1), dtype=torch.uint8)
    quantize(UNIFORM_FP8, values, buf, torch.tensor([0]), 1, check_finite=False)
    assert torch.equal(buf[0], values[0].to(torch.float8_e4m3fn).view(torch.uint8))


# Bytes measured from SGLang's CUDA stores (store.cuh, compiled unmodified) on an H200.


def test_v41_non_finite_matches_the_cuda_store() -> None:
    values = torch.zeros(1, 512)
    values[0, :32] = torch.linspace(-1.0, 1.0, 32)
    values[0, 3] = math.nan  # NaN dropped from the maximum, stored as the NaN code 0x7F
    values[0, 32:64] = math.nan  # all-NaN tile: exponent from the canonical NaN bits
    values[0, 64:96] = 0.5
    values[0, 64], values[0, 65] = math.inf, -math.inf  # inf tile: exponent 247
    buf = torch.zeros(1, V41.page_bytes(1), dtype=torch.uint8)
    quantize(V41, values, buf, torch.tensor([0]), 1, check_finite=False)
    data, scale = buf[0, :512], buf[0, 512:528]
    assert scale[:3].tolist() == [119, 248, 247]
    assert int(data[3]) == 0x7F
    assert int(data[0]) == 0xF8  # -1.0 * 2**8 = -256
    assert bool((data[32:64] == 0x7F).all())
    assert data[64:67].tolist() == [0x7E, 0xFE, 0x00]  # +-inf saturate, 0.5 * 2**-120 -> 0


def test_v41_fp4_non_finite_matches_the_cuda_store() -> None:
    nan = math.nan
    values = torch.zeros(1, 512)
    values[0, :16] = torch.tensor(
        [6.0, nan, -nan, 0.25, 0.75, 1.25, -1.75, 5.0, -0.0, 2.5, 3.5, 1e-9, -1e-9, 4.0, 3.0, 0.5]
    )
    values[0, 16:32] = torch.tensor([math.inf, -math.inf, 1.0] + [0.0] * 13)
    values[0, 32:48] = -nan
    buf = torch.zeros(1, V41_FP4.page_bytes(1), dtype=torch.uint8)
    quantize(V41_FP4, values, buf, torch.tensor([0]), 1, check_finite=False)
    data, scale = buf[0, :256], buf[0, 256:288]
    assert data[:8].tolist() == [0x77, 0x07, 0x22, 0x6C, 0x48, 0x06, 0x68, 0x15]
    assert scale[:3].tolist() == [0x38, 0x7E, 0x01]  # 1.0, 448, 2**-9
    assert int(data[8]) == 0xF7  # +inf -> +6, -inf -> -6
    assert bool((data[16:24] == 0x77).all())  # NaN of either sign -> +6
