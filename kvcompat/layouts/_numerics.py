"""Bit-level number formats shared by the layout codecs (pure torch, any device).

Everything here is elementwise and exact where the formats are exact: power-of-two scales
are built from IEEE bits, never from ``exp2``/``log2``, so results do not depend on a
platform's transcendental functions. The one exception is :func:`ceil_log2_rocm`, which
mirrors a kernel that does use ``log2``.
"""

from __future__ import annotations

import torch

__all__ = [
    "E2M1_MAX",
    "E4M3FNUZ_MAX",
    "E4M3FN_MAX",
    "amax_ignoring_nan",
    "biased_exponent_ceil",
    "ceil_log2_rocm",
    "clamp_nan_high",
    "decode_e2m1",
    "decode_e4m3",
    "encode_e2m1",
    "encode_e4m3_satfinite",
    "encode_e4m3_saturating",
    "inverse_pow2",
    "pack_nibbles",
    "pow2_from_biased",
    "to_bf16",
    "ue8m0_to_float",
    "unpack_nibbles",
]

E4M3FN_MAX = 448.0
"""Largest finite e4m3fn value."""
E4M3FNUZ_MAX = 240.0
"""Largest finite e4m3fnuz value."""
E2M1_MAX = 6.0
"""Largest e2m1 magnitude."""

_MANTISSA_MASK = 0x7FFFFF
_E4M3_NAN = 0x7F
_DENORMAL_2_POW_M127 = 0x00400000  # the fp32 bits of 2**-127


def _as_int_bits(x: torch.Tensor) -> torch.Tensor:
    """The IEEE bits of an fp32 tensor as int32 (a view when ``x`` is contiguous)."""
    return x.contiguous().view(torch.int32)


def biased_exponent_ceil(x: torch.Tensor) -> torch.Tensor:
    """``biased_exponent(x) + (mantissa(x) != 0)`` for fp32 ``x >= 0``, as int32.

    This is the byte of the smallest power of two >= ``x`` (for normal ``x``), computed
    from the bits as SGLang's CUDA ``cast_to_ue8m0`` does: ``inf`` gives 255, a NaN 255 or
    256 depending on its payload, and a subnormal ``x`` gives 1.
    """
    bits = _as_int_bits(x)
    exponent = (bits >> 23) & 0xFF
    return exponent + ((bits & _MANTISSA_MASK) != 0).to(torch.int32)


def pow2_from_biased(exponent: torch.Tensor) -> torch.Tensor:
    """``2**(exponent - 127)`` as fp32 for int32 ``exponent`` in 1..255, exactly (from bits).

    255 gives ``+inf`` (``exp2(128)``). 0 gives 0.0: ``2**-127`` is an fp32 denormal and
    the GPU's ``exp2`` flushes it (measured with SGLang's V4 reader on an H200; SGLang's
    torch reference flushes it too). This is V4's scale read.
    """
    return torch.where(exponent == 0, 0.0, (exponent.to(torch.int32) << 23).view(torch.float32))


def _denormal_2_pow_m127(device: torch.device) -> torch.Tensor:
    return torch.tensor(_DENORMAL_2_POW_M127, dtype=torch.int32, device=device).view(torch.float32)


def ue8m0_to_float(byte: torch.Tensor) -> torch.Tensor:
    """Decode ue8m0 bytes to fp32: 0 is the denormal ``2**-127``, 255 NaN, else ``2**(b-127)``.

    This is ``float8_e8m0fnu``; SGLang's V4.1 reader builds it from the bits the same way.
    """
    normal = (byte.to(torch.int32) << 23).view(torch.float32)
    value = torch.where(byte == 0, _denormal_2_pow_m127(byte.device), normal)
    return torch.where(byte == 255, float("nan"), value)


def inverse_pow2(exponent: torch.Tensor) -> torch.Tensor:
    """``2**(127 - exponent)`` as fp32 from the bits ``(254 - exponent) << 23`` (int32).

    Mirrors SGLang's CUDA ``inv_scale_ue8m0`` exactly, including its edge cases: an
    exponent of 254 gives +0.0 and 255 gives -inf (the bit pattern wraps).
    """
    return ((254 - exponent.to(torch.int32)) << 23).view(torch.float32)


def _fp8_dtype(fnuz: bool) -> torch.dtype:
    return torch.float8_e4m3fnuz if fnuz else torch.float8_e4m3fn


def decode_e4m3(codes: torch.Tensor, *, fnuz: bool = False) -> torch.Tensor:
    """Decode uint8 e4m3 codes (fn, or fnuz with ``fnuz=True``) to fp32, exactly."""
    return codes.view(_fp8_dtype(fnuz)).to(torch.float32)


def encode_e4m3_saturating(x: torch.Tensor, *, fnuz: bool = False) -> torch.Tensor:
    """Round fp32 to e4m3 (nearest, ties to even) after clamping to +-max; uint8 codes.

    Clamps ``x`` **in place** (callers pass a temporary they own). The clamp makes the
    result independent of whether the installed torch's fp8 cast saturates (2.13 does for
    e4m3fn, older releases give NaN). NaN stays NaN: code 0x7F (or 0xFF for a NaN with
    the sign bit) for e4m3fn, 0x80 for e4m3fnuz.
    """
    limit = E4M3FNUZ_MAX if fnuz else E4M3FN_MAX
    return x.clamp_(-limit, limit).to(_fp8_dtype(fnuz)).view(torch.uint8)


def encode_e4m3_satfinite(x: torch.Tensor) -> torch.Tensor:
    """``cvt.rn.satfinite.e4m3x2.f32``: nearest-even, +-inf and overflow to +-448, NaN to 0x7F.

    Clamps ``x`` in place (callers pass a temporary they own).
    """
    codes = encode_e4m3_saturating(x)
    return codes.masked_fill_(torch.isnan(x), _E4M3_NAN)


def clamp_nan_high(x: torch.Tensor, limit: float) -> torch.Tensor:
    """Clamp ``x`` in place to ``[-limit, limit]`` as ``tl.clamp`` does on NVIDIA GPUs.

    Triton's ``clamp`` without NaN propagation maps a NaN to the upper bound there
    (measured with SGLang's DSA quantizer on an H200; the CPU interpreter gives the lower
    bound instead). Callers pass a temporary they own.
    """
    return x.nan_to_num_(nan=limit, posinf=limit, neginf=-limit).clamp_(-limit, limit)


def ceil_log2_rocm(x: torch.Tensor) -> torch.Tensor:
    """``ceil(log2(x))`` in fp32 arithmetic, as SGLang's HIP Triton V4 store computes it.

    Unlike :func:`biased_exponent_ceil` this goes through ``log2``: for ``x`` within an
    fp32 rounding step above a power of two the log rounds down onto the integer and the
    ceiling stays there. Returned as fp32.
    """
    return torch.ceil(torch.log2(x))


# e2m1: code bits 0-2 index the magnitudes below, bit 3 is the sign (kept on zero).
_E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Decode 4-bit e2m1 codes (uint8, 0..15) to fp32; code 8 decodes to -0.0."""
    table = torch.tensor(
        _E2M1_MAGNITUDES + tuple(-m for m in _E2M1_MAGNITUDES),
        dtype=torch.float32,
        device=codes.device,
    )
    return table[codes.to(torch.int64)]


def encode_e2m1(y: torch.Tensor) -> torch.Tensor:
    """Round fp32 to e2m1 codes (uint8 0..15) as ``cvt.rn.satfinite.e2m1x2.f32`` does.

    Nearest, ties to even, saturating at +-6; the sign bit is kept for every value whose
    sign bit is set, including -0.0 and small negatives that round to zero (code 0x8).
    NaN of either sign encodes as +6 (code 0x7), as the NVIDIA conversion does (measured
    on an H200).
    """
    nan = torch.isnan(y)
    magnitude = torch.nan_to_num(y.abs(), nan=E2M1_MAX, posinf=E2M1_MAX).clamp_max(E2M1_MAX)
    # Below 1 the grid is the multiples of 0.5: round(2a) is the code (0, 1, or 2 for 1.0),
    # and torch.round rounds half to even, which is e2m1's tie rule there.
    small = torch.round(magnitude * 2.0).to(torch.int32)
    # From 1 up, e2m1 is a float with one mantissa bit: round the fp32 bits to nearest even
    # at bit 22, then code = (biased exponent << 1 | mantissa bit) - (126 << 1).
    bits = magnitude.view(torch.int32)
    bits = (bits + (0x1FFFFF + ((bits >> 22) & 1))) >> 22
    code = torch.where(magnitude < 1.0, small, bits - 252).to(torch.uint8)
    sign = (torch.signbit(y) & ~nan).to(torch.uint8) << 3
    return code | sign


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Pack ``[..., 2k]`` 4-bit codes into ``[..., k]`` bytes, the even element low."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_nibbles`: ``[..., k]`` bytes -> ``[..., 2k]`` codes."""
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack((low, high), dim=-1).flatten(-2)


_BF16_CANONICAL_NAN = 0x7FFF


def to_bf16(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 to bf16 (nearest, ties to even) with every NaN as ``0x7FFF``.

    ``0x7FFF`` is the NaN NVIDIA's ``cvt.rn.bf16.f32`` produces, so reads match SGLang's
    GPU readers bit for bit. torch's own conversion keeps NaN payload bits on some code
    paths (vectorised CPU kernels) and not on others, so a plain ``.to(torch.bfloat16)``
    would make NaN bits depend on tensor size and platform.
    """
    out = x.to(torch.bfloat16)
    out.view(torch.int16).masked_fill_(torch.isnan(out), _BF16_CANONICAL_NAN)
    return out


def amax_ignoring_nan(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``max |x|`` over ``dim`` with NaN dropped, as CUDA's ``fmaxf`` reductions do.

    A slice of only NaN gives NaN (``fmaxf(NaN, NaN)``), as the canonical ``0x7FFFFFFF``.
    """
    magnitude = x.abs()
    nan = torch.isnan(magnitude)
    peak = magnitude.masked_fill_(nan, -1.0).amax(dim=dim)
    all_nan = peak < 0
    canonical = torch.tensor(0x7FFFFFFF, dtype=torch.int32, device=x.device).view(torch.float32)
    return torch.where(all_nan, canonical, peak)
