"""e2m1 pairs with one scale byte per tile: read and write.

V4.1's pages (``V41_FP4``, ``V41_FP4_NEW``: e4m3 scales per 16 values) and the DSv4 fp4
indexer keys (``DSV4_INDEXER_FP4[_RNE]``: power-of-two scales per 32 values).
"""

# Triton's conventions, not ours to change here: constexpr parameters are UPPER_CASE
# (N803), jit functions take untyped tensors and return blocks (ANN001/ANN202), `x != x` is
# the NaN test that works in every backend (PLR0124), constexpr branches must be statements
# (SIM108). mypy cannot see through @triton.jit, which is untyped.
# ruff: noqa: N803, ANN001, ANN202, PLR0124
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl

from kvcompat.kernels._triton_common import (
    _decode_e4m3,
    _div_rn,
    _encode_e2m1,
    _encode_e4m3,
    _fp4_block,
    _peak,
    _token_block,
    _word_ptr,
)

# -------------------------------------------------------------- e2m1 pairs (V41_FP4)


@triton.jit
def _read_fp4_kernel(
    out_ptr,
    buf_ptr,
    loc_ptr,
    bases_ptr,
    n,
    PAGE,
    PAGE_BYTES,
    DATA_STRIDE,
    SCALE_BASE,
    SCALE_STRIDE,
    NT: tl.constexpr,
    TB: tl.constexpr,
    SCALE_KIND: tl.constexpr,
    SOFT: tl.constexpr,
    EVICT: tl.constexpr,
    BLOCK_T: tl.constexpr,
    LAYERED: tl.constexpr,
    LOC_LAYERS: tl.constexpr = False,
):
    """Dequantize ``NT`` tiles of ``2 * TB`` e2m1 values (one scale byte each) to bf16.

    ``SCALE_KIND``: 0 e4m3 scale bytes (V4.1: 32 tiles of 16), 1 ``2**(b - 127)``, byte 0
    the fp32 denormal ``2**-127`` and 255 inf (the indexer: 4 tiles of 32). ``out_ptr`` is
    the bf16 output ``[n, 2 * NT * TB]``, stored as one int32 word per data byte.
    """
    out_ptr = out_ptr.to(tl.pointer_type(tl.int32))
    buf_u8 = _word_ptr(buf_ptr, 1)
    tok, live, data_off, scale_off = _token_block(
        loc_ptr,
        bases_ptr,
        n,
        PAGE,
        PAGE_BYTES,
        DATA_STRIDE,
        SCALE_BASE,
        SCALE_STRIDE,
        BLOCK_T,
        LAYERED,
        LOC_LAYERS,
        16,  # every layered launch's bases come from 16-byte aligned buffers
    )
    tile = tl.arange(0, NT)
    mask3 = live[:, None, None]
    within = tile[None, :, None] * TB + tl.arange(0, TB)[None, None, :]
    packed = tl.load(
        buf_u8 + (data_off[:, None, None] + within), mask=mask3, other=0, eviction_policy=EVICT
    )
    sc = tl.load(
        buf_u8 + (scale_off[:, None] + tile[None, :]),
        mask=live[:, None],
        other=0,
        eviction_policy=EVICT,
    )
    if SCALE_KIND == 1:
        sbyte = sc.to(tl.int32)
        sbits = tl.where(sbyte == 0, 0x00400000, sbyte << 23)  # 255 << 23 is +inf
        scale = sbits.to(tl.float32, bitcast=True)[:, :, None]
    else:
        scale = _decode_e4m3(sc, False, SOFT)[:, :, None]
    packed = packed.to(tl.int32)
    if SOFT or SCALE_KIND == 1:
        # Power-of-two scales keep the product's 1-2 significant bits (down to 2**-128,
        # a bf16 subnormal), so truncating its fp32 bits is exact too.
        words = tl.zeros((BLOCK_T, NT, TB), tl.int32)
        for half in tl.static_range(2):
            code = (packed >> (4 * half)) & 0xF
            m = code & 7
            # fp32 bits of the magnitude: (m << 22) + 0x3F000000 is 1.0, 1.5, 2, 3, 4, 6
            # for m = 2..7; m = 1 is 0.5 and m = 0 is 0.
            bits = tl.where(m >= 2, (m << 22) + 0x3F000000, m * 0x3F000000)
            bits = bits | ((code >> 3) << 31)
            value = bits.to(tl.float32, bitcast=True) * scale
            # The product has at most 6 significant bits and no subnormals: bf16 exactly.
            vbits = (value.to(tl.int32, bitcast=True) >> 16) & 0xFFFF
            vbits = tl.where(value != value, 0x7FFF, vbits)
            words = words | (vbits << (16 * half))
    else:
        # Fewer integer operations: a code's bits shifted into an fp32 (m << 22, the sign
        # to bit 31) are e2m1's value times 2**-126 (codes 0 and 1 land on fp32 subnormals,
        # which the GPU multiplies exactly), so two exact multiplies by 2**64 and
        # scale * 2**62 give the product; cvt.rn.bf16 is then exact, NaN as 0x7FFF.
        scaled = scale * 4.611686018427388e18  # 2**62
        lo = (((packed & 7) << 22) | ((packed & 8) << 28)).to(tl.float32, bitcast=True)
        hi = (((packed & 0x70) << 18) | ((packed & 0x80) << 24)).to(tl.float32, bitcast=True)
        lo = (lo * 1.8446744073709552e19) * scaled  # 2**64
        hi = (hi * 1.8446744073709552e19) * scaled
        lo16 = lo.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        hi16 = hi.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32)
        words = lo16 | (hi16 << 16)
    tl.store(out_ptr + (tok[:, None, None] * (NT * TB) + within), words, mask=mask3)


@triton.jit
def _load_pairs(words_ptr, offsets, mask, IN_KIND: tl.constexpr, EVICT: tl.constexpr):
    """Load (even, odd) value pairs as one word each and split them into two fp32 tensors.

    ``IN_KIND``: 0 bf16 (int32 words), 1 fp16 (int32 words), 2 fp32 (int64 words).
    """
    w = tl.load(words_ptr + offsets, mask=mask, other=0, eviction_policy=EVICT)
    if IN_KIND == 0:
        lo = (w << 16).to(tl.float32, bitcast=True)
        hi = (w & -65536).to(tl.float32, bitcast=True)
    elif IN_KIND == 1:
        lo = (w & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        hi = (w >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    else:
        lo = w.to(tl.int32).to(tl.float32, bitcast=True)
        hi = (w >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    return lo, hi


@triton.jit
def _write_fp4_kernel(
    values_ptr,
    buf_ptr,
    loc_ptr,
    bases_ptr,
    n,
    PAGE,
    PAGE_BYTES,
    DATA_STRIDE,
    SCALE_BASE,
    SCALE_STRIDE,
    IN_KIND: tl.constexpr,
    EVICT: tl.constexpr,
    SOFT: tl.constexpr,
    BLOCK_T: tl.constexpr,
    LAYERED: tl.constexpr,
    LOC_LAYERS: tl.constexpr = False,
):
    """Quantize ``[n, 512]`` rows to e2m1 codes with one e4m3 scale per 16 values.

    The values are loaded as 256 words per token, each an (even, odd) pair.
    """
    words_ptr = _word_ptr(values_ptr, 8 if IN_KIND == 2 else 4)
    buf_u8 = _word_ptr(buf_ptr, 1)
    tok, live, data_off, scale_off = _token_block(
        loc_ptr,
        bases_ptr,
        n,
        PAGE,
        PAGE_BYTES,
        DATA_STRIDE,
        SCALE_BASE,
        SCALE_STRIDE,
        BLOCK_T,
        LAYERED,
        LOC_LAYERS,
        16,  # every layered launch's bases come from 16-byte aligned buffers
    )
    tile, mask3, within = _fp4_block(live)
    lo, hi = _load_pairs(words_ptr, tok[:, None, None] * 256 + within, mask3, IN_KIND, EVICT)
    peak = tl.maximum(_peak(lo, SOFT), _peak(hi, SOFT))
    six = tl.full((BLOCK_T, 32), 6.0, tl.float32)
    quotient = tl.math.div_rn(peak, six)
    # fminf(fmaxf(amax / 6, 2**-9), 448); fmaxf turns an all-NaN tile's NaN into 2**-9.
    quotient = tl.where(peak < 0, 0.001953125, tl.maximum(quotient, 0.001953125))
    quotient = tl.minimum(quotient, 448.0)
    sc = _encode_e4m3(quotient, SOFT)
    scale = _decode_e4m3(sc, False, SOFT)
    inverse = tl.math.div_rn(tl.full((BLOCK_T, 32), 1.0, tl.float32), scale)
    scale = tl.broadcast_to(scale[:, :, None], (BLOCK_T, 32, 8))
    inverse = tl.broadcast_to(inverse[:, :, None], (BLOCK_T, 32, 8))
    code_lo = _encode_e2m1(_div_rn(lo, scale, inverse, SOFT), lo, SOFT)
    code_hi = _encode_e2m1(_div_rn(hi, scale, inverse, SOFT), hi, SOFT)
    packed = (code_lo | (code_hi << 4)).to(tl.uint8)
    tl.store(buf_u8 + (data_off[:, None, None] + within), packed, mask=mask3)
    tl.store(buf_u8 + (scale_off[:, None] + tile[None, :]), sc, mask=live[:, None])


# e2m1 quantization of bf16 / fp16 pairs without a division (hardware path).
#
# The twin rounds ``q = fl(x / s)`` to the nearest e2m1 magnitude (0, .5, 1, 1.5, 2, 3, 4, 6;
# ties to the even code). For bf16 or fp16 ``x`` and an e4m3 scale ``s`` in [2**-9, 448],
# the midpoints ``m`` between those magnitudes (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5) times
# ``s`` have at most 7 significant bits, so ``m * s`` is exact in bf16 and fp16 alike, and an
# ``x`` that differs from ``m * s`` differs by at least 2**-12 of it: far more than fp32's
# rounding of the quotient. So ``q`` is past (or on) ``m`` exactly when ``|x|`` is past (or
# on) ``m * s``, and the code is the number of thresholds ``m * s`` that ``|x|`` passes: ">"
# where the tie goes down to the even code, ">=" where it goes up. Each comparison runs on
# two values at once (``set.*.bf16x2``), its 1.0 / 0.0 added in packed arithmetic onto
# 128.0 (bf16; 1024.0 for fp16, whose units are 1 there), whose low bits then hold the code.
# NaN passes every unordered comparison (code 7 = +6) and loses its sign first. The shifts
# are written as ``mul.hi`` so that they run on the FMA pipe, beside the comparisons on the
# integer pipe (which bound this kernel); ``abs`` becomes an operand modifier.


def _asm_sign_base(kind: str, base: str) -> str:
    neg_inf = "0xFF80FF80" if kind == "bf16x2" else "0xFC00FC00"
    return (
        "{ .reg .b32 t, c, b; mov.b32 c, " + neg_inf + "; mov.b32 b, " + base + "; "
        # max.NaN(x, -inf) is x, or the positive canonical NaN: NaN drops its sign
        "max.NaN." + kind + " t, $1, c; mul.hi.u32 t, t, 0x100000; "
        "lop3.b32 $0, t, 0x00080008, b, 0xEA; }"  # (sign bits >> 12) | base
    )


def _asm_thresholds(kind: str, mids: tuple[int, ...]) -> str:
    body = "".join(
        f"mov.b32 m, 0x{c:04X}{c:04X}; fma.rn.{kind} ${i}, $7, m, z; " for i, c in enumerate(mids)
    )
    return "{ .reg .b32 z, m; mov.b32 z, 0x80008000; " + body + "}"


def _asm_count(kind: str, one: str) -> str:
    tests = ("gtu", "geu", "gtu", "geu", "gtu", "geu", "gtu")
    body = "".join(
        f"set.{op}.{kind}.{kind} c, a, ${i + 3}; fma.rn.{kind} acc, c, one, acc; "
        for i, op in enumerate(tests)
    )
    return (
        "{ .reg .b32 a, c, acc, one, t; mov.b32 one, "
        + one
        + "; mov.b32 acc, $2; abs."
        + kind
        + " a, $1; "
        + body
        # low code from bits 0-3, high code from bits 16-19, as one byte
        + "mul.hi.u32 t, acc, 0x100000; lop3.b32 $0, acc, t, 0x0F, 0xE4; }"
    )


_SIGN_BASE_BF16 = tl.constexpr(_asm_sign_base("bf16x2", "0x43004300"))
_SIGN_BASE_F16 = tl.constexpr(_asm_sign_base("f16x2", "0x64006400"))
_THRESHOLDS_BF16 = tl.constexpr(
    _asm_thresholds("bf16x2", (0x3E80, 0x3F40, 0x3FA0, 0x3FE0, 0x4020, 0x4060, 0x40A0))
)
_THRESHOLDS_F16 = tl.constexpr(
    _asm_thresholds("f16x2", (0x3400, 0x3A00, 0x3D00, 0x3F00, 0x4100, 0x4300, 0x4500))
)
_COUNT_BF16 = tl.constexpr(_asm_count("bf16x2", "0x3F803F80"))
_COUNT_F16 = tl.constexpr(_asm_count("f16x2", "0x3C003C00"))
_MAX_BF16 = tl.constexpr(
    "{ .reg .b32 a, b; abs.bf16x2 a, $1; abs.bf16x2 b, $2; max.bf16x2 $0, a, b; }"
)
_MAX_F16 = tl.constexpr("{ .reg .b32 a, b; abs.f16x2 a, $1; abs.f16x2 b, $2; max.f16x2 $0, a, b; }")


@triton.jit
def _max_bf16x2(x, y):
    """Per-half ``max(|x|, |y|)`` of bf16 pairs; a NaN half loses to a number (as ``fmaxf``)."""
    return tl.inline_asm_elementwise(_MAX_BF16, "=r,r,r", [x, y], dtype=tl.int32,
                                     is_pure=True, pack=1)  # fmt: skip


@triton.jit
def _max_f16x2(x, y):
    """Per-half ``max(|x|, |y|)`` of fp16 pairs; a NaN half loses to a number (as ``fmaxf``)."""
    return tl.inline_asm_elementwise(_MAX_F16, "=r,r,r", [x, y], dtype=tl.int32,
                                     is_pure=True, pack=1)  # fmt: skip


@triton.jit
def _write_fp4_pairs_kernel(
    values_ptr,
    buf_ptr,
    loc_ptr,
    bases_ptr,
    n,
    PAGE,
    PAGE_BYTES,
    DATA_STRIDE,
    SCALE_BASE,
    SCALE_STRIDE,
    IN_KIND: tl.constexpr,
    EVICT: tl.constexpr,
    SOFT: tl.constexpr,
    BLOCK_T: tl.constexpr,
    LAYERED: tl.constexpr,
    LOC_LAYERS: tl.constexpr = False,
):
    """V41_FP4 quantize-scatter of bf16 (``IN_KIND`` 0) or fp16 (1) values, GPU only.

    The same bytes as :func:`_write_fp4_kernel` with about half the integer-pipe work
    (on an H200 it moves 82 % of copy bandwidth against 49 %): the values stay packed in
    pairs, the tile maximum is a packed ``max`` of magnitudes, ``amax / 6`` is
    Markstein's corrected product (exact for every bf16 / fp16 amax up to 6 * 448, checked
    exhaustively), and each code is counted from threshold comparisons (see above).
    ``SOFT`` is unused (the interpreter takes :func:`_write_fp4_kernel`).
    """
    f16: tl.constexpr = IN_KIND == 1
    words_ptr = _word_ptr(values_ptr, 4)
    buf_u8 = _word_ptr(buf_ptr, 1)
    tok, live, data_off, scale_off = _token_block(
        loc_ptr,
        bases_ptr,
        n,
        PAGE,
        PAGE_BYTES,
        DATA_STRIDE,
        SCALE_BASE,
        SCALE_STRIDE,
        BLOCK_T,
        LAYERED,
        LOC_LAYERS,
        16,  # every layered launch's bases come from 16-byte aligned buffers
    )
    tile, mask3, within = _fp4_block(live)
    w = tl.load(
        words_ptr + (tok[:, None, None] * 256 + within), mask=mask3, other=0,
        eviction_policy=EVICT,
    )  # fmt: skip
    if f16:
        base = tl.inline_asm_elementwise(_SIGN_BASE_F16, "=r,r", [w], dtype=tl.int32,
                                         is_pure=True, pack=1)  # fmt: skip
        pk = tl.reduce(w, 2, _max_f16x2)
        pk = _max_f16x2(pk, pk >> 16)
        peak = (pk & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    else:
        base = tl.inline_asm_elementwise(_SIGN_BASE_BF16, "=r,r", [w], dtype=tl.int32,
                                         is_pure=True, pack=1)  # fmt: skip
        pk = tl.reduce(w, 2, _max_bf16x2)
        pk = _max_bf16x2(pk, pk >> 16)
        peak = (pk << 16).to(tl.float32, bitcast=True)
    # An all-NaN tile's NaN peak goes to 0 (then the 2**-9 floor, as fmaxf does); peaks
    # beyond 6 * 448 give the 448 ceiling either way.
    peak = tl.minimum(tl.maximum(peak, 0.0), 2688.0)
    r6 = 0.16666667163372040  # fl(1/6)
    q0 = peak * r6
    quotient = tl.fma(tl.fma(-q0, 6.0, peak), r6, q0)
    quotient = tl.maximum(quotient, 0.001953125)
    sc = _encode_e4m3(quotient, False)
    scale = _decode_e4m3(sc, False, False)
    if f16:
        sbits = scale.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        t1, t2, t3, t4, t5, t6, t7 = tl.inline_asm_elementwise(
            _THRESHOLDS_F16, "=r,=r,=r,=r,=r,=r,=r,r", [sbits | (sbits << 16)],
            dtype=(tl.int32,) * 7, is_pure=True, pack=1,
        )  # fmt: skip
    else:
        sbits = scale.to(tl.int32, bitcast=True) >> 16
        t1, t2, t3, t4, t5, t6, t7 = tl.inline_asm_elementwise(
            _THRESHOLDS_BF16, "=r,=r,=r,=r,=r,=r,=r,r", [sbits | (sbits << 16)],
            dtype=(tl.int32,) * 7, is_pure=True, pack=1,
        )  # fmt: skip
    shape: tl.constexpr = (BLOCK_T, 32, 8)
    args = [
        w, base,
        tl.broadcast_to(t1[:, :, None], shape), tl.broadcast_to(t2[:, :, None], shape),
        tl.broadcast_to(t3[:, :, None], shape), tl.broadcast_to(t4[:, :, None], shape),
        tl.broadcast_to(t5[:, :, None], shape), tl.broadcast_to(t6[:, :, None], shape),
        tl.broadcast_to(t7[:, :, None], shape),
    ]  # fmt: skip
    if f16:
        packed = tl.inline_asm_elementwise(_COUNT_F16, "=r,r,r,r,r,r,r,r,r,r", args,
                                           dtype=tl.int32, is_pure=True, pack=1)  # fmt: skip
    else:
        packed = tl.inline_asm_elementwise(_COUNT_BF16, "=r,r,r,r,r,r,r,r,r,r", args,
                                           dtype=tl.int32, is_pure=True, pack=1)  # fmt: skip
    tl.store(buf_u8 + (data_off[:, None, None] + within), packed.to(tl.uint8), mask=mask3)
    tl.store(buf_u8 + (scale_off[:, None] + tile[None, :]), sc, mask=live[:, None])


# --------------------------------------- e2m1 pairs, power-of-two scales (fp4 indexer)


@triton.jit
def _e2m1_by_thresholds(y, RNE: tl.constexpr):
    """e2m1 codes (int32) of fp32 ``y`` counted against the midpoints, as SGLang's indexer.

    ``min(|y|, 6)`` (NaN -> 6) is counted against 0.25, 0.75, 1.25, 1.75, 2.5, 3.5 and 5:
    strictly above each (``RNE`` false), or at or above each with a value on a midpoint
    sent back to the even code (``RNE``); the sign bit is set only on a non-zero code of
    a negative ``y``.
    """
    mag = tl.where(y != y, 6.0, tl.minimum(tl.abs(y), 6.0))
    if RNE:
        index = (
            (mag >= 0.25).to(tl.int32) + (mag >= 0.75).to(tl.int32)
            + (mag >= 1.25).to(tl.int32) + (mag >= 1.75).to(tl.int32)
            + (mag >= 2.5).to(tl.int32) + (mag >= 3.5).to(tl.int32)
            + (mag >= 5.0).to(tl.int32)
        )  # fmt: skip
        tie = (
            (mag == 0.25) | (mag == 0.75) | (mag == 1.25) | (mag == 1.75)
            | (mag == 2.5) | (mag == 3.5) | (mag == 5.0)
        )  # fmt: skip
        index = tl.where(tie & ((index & 1) == 1), index - 1, index)
    else:
        index = (
            (mag > 0.25).to(tl.int32) + (mag > 0.75).to(tl.int32)
            + (mag > 1.25).to(tl.int32) + (mag > 1.75).to(tl.int32)
            + (mag > 2.5).to(tl.int32) + (mag > 3.5).to(tl.int32)
            + (mag > 5.0).to(tl.int32)
        )  # fmt: skip
    return index | tl.where((y < 0) & (index != 0), 8, 0)


@triton.jit
def _write_fp4_ue8m0_kernel(
    values_ptr,
    buf_ptr,
    loc_ptr,
    bases_ptr,
    n,
    PAGE,
    PAGE_BYTES,
    DATA_STRIDE,
    SCALE_BASE,
    SCALE_STRIDE,
    NT: tl.constexpr,
    TB: tl.constexpr,
    IN_KIND: tl.constexpr,
    RNE: tl.constexpr,
    EVICT: tl.constexpr,
    SOFT: tl.constexpr,
    BLOCK_T: tl.constexpr,
    LAYERED: tl.constexpr,
    LOC_LAYERS: tl.constexpr = False,
):
    """Quantize ``[n, 2 * NT * TB]`` rows to e2m1 with one power-of-two scale per tile.

    SGLang's indexer quantizer, per tile of ``2 * TB`` values in fp32: ``e = clamp(ceil of
    the biased exponent of fmaxf(amax / 6, 1e-4), 1, 254)`` (IEEE ``amax / 6``, NaN
    dropped from the maximum), scale byte ``e``, and codes of ``x * 2**(127 - e)`` (exactly
    ``x / 2**(e - 127)``: the multiplier is a power of two, the denormal ``2**-127`` for
    ``e = 254``) by :func:`_e2m1_by_thresholds`. The values are loaded as (even, odd)
    pairs, one word each. ``SOFT`` only selects :func:`_peak`'s NaN convention.
    """
    words_ptr = _word_ptr(values_ptr, 8 if IN_KIND == 2 else 4)
    buf_u8 = _word_ptr(buf_ptr, 1)
    tok, live, data_off, scale_off = _token_block(
        loc_ptr,
        bases_ptr,
        n,
        PAGE,
        PAGE_BYTES,
        DATA_STRIDE,
        SCALE_BASE,
        SCALE_STRIDE,
        BLOCK_T,
        LAYERED,
        LOC_LAYERS,
        16,  # every layered launch's bases come from 16-byte aligned buffers
    )
    tile = tl.arange(0, NT)
    mask3 = live[:, None, None]
    within = tile[None, :, None] * TB + tl.arange(0, TB)[None, None, :]
    lo, hi = _load_pairs(words_ptr, tok[:, None, None] * (NT * TB) + within, mask3, IN_KIND, EVICT)
    peak = tl.maximum(_peak(lo, SOFT), _peak(hi, SOFT))
    quotient = tl.math.div_rn(peak, tl.full((BLOCK_T, NT), 6.0, tl.float32))
    # fmaxf(amax / 6, 1e-4): an all-NaN tile (peak -1, or NaN on the GPU) gets the floor.
    quotient = tl.where(peak < 0, 0.0001, tl.maximum(quotient, 0.0001))
    qbits = quotient.to(tl.int32, bitcast=True)
    exponent = (qbits >> 23) + ((qbits & 0x7FFFFF) != 0).to(tl.int32)
    exponent = tl.minimum(tl.maximum(exponent, 1), 254)
    inverse = tl.where(exponent == 254, 0x00400000, (254 - exponent) << 23)
    inverse = inverse.to(tl.float32, bitcast=True)[:, :, None]
    code_lo = _e2m1_by_thresholds(lo * inverse, RNE)
    code_hi = _e2m1_by_thresholds(hi * inverse, RNE)
    packed = (code_lo | (code_hi << 4)).to(tl.uint8)
    tl.store(buf_u8 + (data_off[:, None, None] + within), packed, mask=mask3)
    sbyte = exponent.to(tl.uint8)
    tl.store(buf_u8 + (scale_off[:, None] + tile[None, :]), sbyte, mask=live[:, None])
