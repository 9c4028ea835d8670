"""DeepSeek-V4 ``V4`` layout: 584 B/token, fp8 nope with ue8m0 scales and a bf16 rope tail.

Per token: a 576-byte data row (448 e4m3 nope values, then 64 bf16 rope values) and an
8-byte scale row (7 ue8m0 exponents, one per 64 nope values, then one pad byte no writer
stores). Pages are block-split: ``P`` data rows, ``P`` scale rows, padding to a multiple
of 576 bytes.

Write (SGLang's CUDA ``fused_store_flashmla_cache``), per 64-value nope tile, in fp32:
``s = max(1e-4, amax) / 448`` (IEEE division); ``e = biased_exponent(s) + (mantissa(s)
!= 0)`` (the byte: the power-of-two ceiling from the bits); ``q = e4m3_rne(clip(x *
2**(127 - e), -448, 448))``; the rope is cast to bf16. With ``fnuz=True`` the ROCm
Triton store instead: ``s = max(amax, 1e-8) / 240``, ``c = ceil(log2(s))`` (fp32 log2),
byte ``c + 127``, ``q = e4m3fnuz_rne(clip(x * 2**-c, -240, 240))``.

Read (SGLang's ``dequantize_k_cache_paged_dsv4``): ``bf16(fp32(e4m3) * 2**(byte - 127))``
and the rope bytes copied. Byte 255 is +inf; byte 0 multiplies by 0, because the GPU's
``exp2(-127)`` flushes the denormal (measured on an H200; SGLang's torch reference does the
same; the CPU interpreter does not). No writer produces byte 0 (the smallest is 105).

Error bound (finite inputs): every nope value satisfies ``|x' - x| <= 2**-4 * |x| +
2**-10 * s`` where ``s = 2**(byte - 127)`` is its tile's stored scale and ``s <
max(amax, 1e-4) / 224``. e4m3 keeps 4 significant bits (half an ulp is ``2**-4`` of the
value) down to ``2**-6``, below which its step is ``2**-9`` (half a step is ``2**-10``);
``|x / s| <= 448`` so nothing saturates, and ``q * s`` is exact in bf16. For fnuz the same
holds with ``2**-4`` and ``2**-10 * s``, ``|x / s| <= 240``, ``s < max(amax, 1e-8) /
120``. Rope: exact for bf16 inputs, ``2**-8`` relative (bf16 rounding) otherwise.

Non-finite inputs (``check_finite=False``), CUDA flavour, byte-identical to SGLang's CUDA
store on an H200: ``fmaxf`` drops NaN from the tile maximum; a ``+-inf`` makes the byte
255 and the reciprocal ``-inf``; the clip maps NaN to +448; the rope keeps its NaN/inf
(NaNs rounded from fp16/fp32 inputs become ``0x7FFF``, as ``cvt.rn.bf16`` gives). The fnuz
flavour follows the Triton kernel's arithmetic (NaN propagates into the tile maximum, a
clamped NaN becomes +240 as Triton's ``clamp`` does on NVIDIA GPUs, the scale byte of a
non-finite tile is 255); it has not been run on a ROCm GPU.
"""

from __future__ import annotations

import torch

from kvcompat.layouts._numerics import (
    E4M3FN_MAX,
    E4M3FNUZ_MAX,
    amax_ignoring_nan,
    biased_exponent_ceil,
    ceil_log2_rocm,
    clamp_nan_high,
    decode_e4m3,
    encode_e4m3_saturating,
    inverse_pow2,
    pow2_from_biased,
    to_bf16,
)
from kvcompat.layouts._spec import Encoding, KernelSpec, LayoutSpec, Segment, SegmentRole

__all__ = ["V4"]

SGLANG_KV_LAYOUT = True
"""This module's layouts are values of SGLang's DeepSeek-V4 ``KVLayout`` enum."""

NOPE_DIM = 448
ROPE_DIM = 64
TILE = 64
TILES = NOPE_DIM // TILE  # 7
CUDA_FLOOR = 1e-4
ROCM_FLOOR = 1e-8


def _encode_nope_cuda(nope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[n, 7, 64]`` fp32 -> (e4m3 codes ``[n, 7, 64]``, exponent bytes ``[n, 7]`` int32)."""
    amax = amax_ignoring_nan(nope, dim=-1)
    amax = torch.fmax(amax, torch.full_like(amax, CUDA_FLOOR))  # fmaxf: a NaN gives the floor
    # Divide by a tensor: a Python-scalar divisor becomes a reciprocal multiply on CUDA.
    scale_raw = amax / torch.full_like(amax, E4M3FN_MAX)
    exponent = biased_exponent_ceil(scale_raw)
    scaled = nope * inverse_pow2(exponent).unsqueeze(-1)
    # CUDA clips with fminf/fmaxf, which return the non-NaN operand: NaN becomes +448.
    inf = float("inf")
    scaled.nan_to_num_(nan=E4M3FN_MAX, posinf=inf, neginf=-inf)
    return encode_e4m3_saturating(scaled), exponent


def _encode_nope_rocm(nope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The e4m3fnuz flavour of SGLang's HIP Triton store (``triton_store_cache.py``)."""
    amax = nope.abs().amax(dim=-1).clamp_min(ROCM_FLOOR)
    scale = amax / torch.full_like(amax, E4M3FNUZ_MAX)
    ceil_log2 = ceil_log2_rocm(scale)
    finite = torch.isfinite(ceil_log2)
    exponent = torch.where(finite, ceil_log2, 0.0).to(torch.int32)
    inverse = ((127 - exponent) << 23).view(torch.float32)  # exp2(-ceil_log2), exactly
    # Non-finite scales (check_finite=False only): exp2(-inf) = 0, exp2(-nan) = nan.
    inverse = torch.where(finite, inverse, torch.where(torch.isnan(ceil_log2), ceil_log2, 0.0))
    scaled = clamp_nan_high(nope * inverse.unsqueeze(-1), E4M3FNUZ_MAX)
    codes = encode_e4m3_saturating(scaled, fnuz=True)
    return codes, torch.where(finite, exponent + 127, 255)


class _V4Codec:
    """Row codec of the V4 layout (see the module docstring for the math)."""

    def encode(
        self, spec: LayoutSpec, values: torch.Tensor, /, *, fnuz: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = values.shape[0]
        nope = values[:, :NOPE_DIM].to(torch.float32).reshape(n, TILES, TILE)
        codes, exponent = _encode_nope_rocm(nope) if fnuz else _encode_nope_cuda(nope)
        tail = values[:, NOPE_DIM:]
        # bf16 input is copied bit for bit; other dtypes are rounded (NaN as 0x7FFF, as cvt does).
        rope_bf16 = tail if tail.dtype == torch.bfloat16 else to_bf16(tail.to(torch.float32))
        rope = rope_bf16.contiguous().view(torch.uint8)
        data = torch.cat((codes.reshape(n, NOPE_DIM), rope), dim=1)
        return data, exponent.to(torch.uint8)

    def decode(
        self, spec: LayoutSpec, data: torch.Tensor, scale: torch.Tensor, /, *, fnuz: bool
    ) -> torch.Tensor:
        n = data.shape[0]
        values = decode_e4m3(data[:, :NOPE_DIM], fnuz=fnuz).reshape(n, TILES, TILE)
        multiplier = pow2_from_biased(scale[:, :TILES].to(torch.int32))
        nope = to_bf16((values * multiplier.unsqueeze(-1)).reshape(n, NOPE_DIM))
        rope = data[:, NOPE_DIM:].contiguous().view(torch.bfloat16)
        return torch.cat((nope, rope), dim=1)


V4 = LayoutSpec(
    name="v4",
    data_bytes=576,
    scale_bytes=8,
    scale_pad=1,
    tile_size=TILE,
    page_align=576,
    interleaved=False,
    paged=True,
    dim=NOPE_DIM + ROPE_DIM,
    heads=1,
    value_dim=None,
    rope_dim=ROPE_DIM,
    data_encoding=Encoding.E4M3FN,
    scale_encoding=Encoding.UE8M0,
    rope_encoding=Encoding.BF16,
    output_dtype=torch.bfloat16,
    unscaled_max=None,
    supports_fnuz=True,
    segments=(
        Segment("nope", SegmentRole.DATA, "data", 0, NOPE_DIM, Encoding.E4M3FN, NOPE_DIM),
        Segment("rope", SegmentRole.ROPE, "data", NOPE_DIM, 2 * ROPE_DIM, Encoding.BF16, ROPE_DIM),
        Segment("scale", SegmentRole.SCALE, "scale", 0, TILES, Encoding.UE8M0, TILES),
        Segment("pad", SegmentRole.PAD, "scale", TILES, 1, None, 0),
    ),
    error_bound=(
        "nope: |x' - x| <= 2**-4 * |x| + 2**-10 * s, s = 2**(byte - 127) the tile scale "
        "(s < max(amax, 1e-4) / 224); rope: exact for bf16 input, else bf16 rounding"
    ),
    codec=_V4Codec(),
    kernel=KernelSpec("fp8", scales="ue8m0_v4"),
)
"""DeepSeek-V4 ``V4``: 448 e4m3 + 64 bf16, 7 ue8m0 scales + 1 pad; tile 64, align 576.

Example:
    >>> import torch
    >>> from kvcompat.layouts import V4, dequantize, quantize
    >>> buf = torch.zeros(2, V4.page_bytes(64), dtype=torch.uint8)
    >>> x = torch.linspace(-3, 3, 512).reshape(1, 512).to(torch.bfloat16)
    >>> quantize(V4, x, buf, torch.tensor([70]), 64)
    >>> y = dequantize(V4, buf, torch.tensor([70]), 64)
    >>> bool((y[:, 448:] == x[:, 448:]).all()), int(buf[1, 64 * 576 + 6 * 8])
    (True, 121)
"""
