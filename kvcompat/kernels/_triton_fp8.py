"""e4m3 tiles with one scale per tile: read and write (V4, V41, V41_NEW, DSA fp8, indexer)."""

# Triton's conventions, not ours to change here: constexpr parameters are UPPER_CASE
# (N803), jit functions take untyped tensors and return blocks (ANN001/ANN202), `x != x` is
# the NaN test that works in every backend (PLR0124), constexpr branches must be statements
# (SIM108). mypy cannot see through @triton.jit, which is untyped.
# ruff: noqa: N803, ANN001, ANN202, PLR0124, SIM108
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl

from kvcompat.kernels._triton_common import (
    _bf16_bits,
    _decode_e4m3,
    _div_rn,
    _encode_e4m3_sat,
    _encode_e4m3fnuz,
    _peak,
    _prefetch_edges,
    _tile_block,
    _word_ptr,
)

# -------------------------------------------------------------- e4m3 tiles: read


@triton.jit
def _read_fp8_kernel(
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
    NQ: tl.constexpr,
    TILE: tl.constexpr,
    NT: tl.constexpr,
    NT_P2: tl.constexpr,
    SCALE_KIND: tl.constexpr,
    SCALE_IN_ROW: tl.constexpr,
    NROPE: tl.constexpr,
    ROPE_OFF: tl.constexpr,
    OUT_DIM: tl.constexpr,
    OUT_F32: tl.constexpr,
    FNUZ: tl.constexpr,
    SOFT: tl.constexpr,
    EVICT: tl.constexpr,
    BLOCK_T: tl.constexpr,
    LAYERED: tl.constexpr,
    LOC_LAYERS: tl.constexpr = False,
    SEGMENTS: tl.constexpr = False,
    n0=0,
    n1=0,
    n2=0,
    n3=0,
    loc0=0,
    loc1=0,
    loc2=0,
    loc3=0,
    row0=0,
    row1=0,
    row2=0,
    row3=0,
):
    """Dequantize ``NQ`` e4m3 values in ``NT`` tiles of ``TILE`` (+ a bf16 rope) to bf16.

    ``SCALE_KIND``: 0 no scale, 1 V4's ue8m0 (byte 0 reads 0), 2 V4.1's ue8m0 (byte 0 is
    ``2**-127``, 255 NaN), 3 fp32 scales at byte ``SCALE_IN_ROW`` of the data row (DSA),
    4 fp32 scales in the scale row (DSv4 indexer).
    ``out_ptr`` is the bf16 output ``[n, OUT_DIM]``, stored as bits; with ``OUT_F32`` the
    fp32 output (the products themselves, every NaN as ``0x7FFFFFFF``).
    """
    if OUT_F32:
        out_ptr = out_ptr.to(tl.pointer_type(tl.int32))
    else:
        out_ptr = out_ptr.to(tl.pointer_type(tl.int16))
    buf_u8 = _word_ptr(buf_ptr, 1)
    tok, live, data_off, scale_off = _tile_block(
        loc_ptr, bases_ptr, n, PAGE, PAGE_BYTES, DATA_STRIDE, SCALE_BASE, SCALE_STRIDE,
        BLOCK_T, LAYERED, LOC_LAYERS, SEGMENTS,
        n0, n1, n2, n3, loc0, loc1, loc2, loc3, row0, row1, row2, row3,
    )  # fmt: skip
    tile = tl.arange(0, NT_P2)
    col = tl.arange(0, TILE)
    mask2 = live[:, None] & (tile[None, :] < NT)
    mask3 = mask2[:, :, None]
    within = tile[None, :, None] * TILE + col[None, None, :]
    if NROPE > 0:  # issued first: a load after the stores below would wait for them
        r = tl.arange(0, NROPE)
        rrow = (data_off + ROPE_OFF) // 2
        rope = tl.load(
            _word_ptr(buf_ptr, 2) + (rrow[:, None] + r[None, :]),
            mask=live[:, None],
            other=0,
            eviction_policy=EVICT,
        )
    codes = tl.load(
        buf_u8 + (data_off[:, None, None] + within), mask=mask3, other=0, eviction_policy=EVICT
    )
    values = _decode_e4m3(codes, FNUZ, SOFT)
    if SCALE_KIND == 1 or SCALE_KIND == 2:  # noqa: PLR1714 - constexpr test
        sbyte = tl.load(
            buf_u8 + (scale_off[:, None] + tile[None, :]),
            mask=mask2,
            other=0,
            eviction_policy=EVICT,
        )
        sbyte = sbyte.to(tl.int32)
        sbits = sbyte << 23
        if SCALE_KIND == 2:
            sbits = tl.where(sbyte == 0, 0x00400000, tl.where(sbyte == 255, 0x7FC00000, sbits))
        values = values * sbits.to(tl.float32, bitcast=True)[:, :, None]
    elif SCALE_KIND == 3:
        srow = (data_off + SCALE_IN_ROW) // 4
        sbits = tl.load(
            _word_ptr(buf_ptr, 4) + (srow[:, None] + tile[None, :]),
            mask=mask2,
            other=0,
            eviction_policy=EVICT,
        )
        values = values * sbits.to(tl.float32, bitcast=True)[:, :, None]
    elif SCALE_KIND == 4:
        sbits = tl.load(
            _word_ptr(buf_ptr, 4) + (scale_off[:, None] // 4 + tile[None, :]),
            mask=mask2,
            other=0,
            eviction_policy=EVICT,
        )
        values = values * sbits.to(tl.float32, bitcast=True)[:, :, None]
    dense = tok[:, None, None] * OUT_DIM + within
    if OUT_F32:
        obits = tl.where(values != values, 0x7FFFFFFF, values.to(tl.int32, bitcast=True))
        tl.store(out_ptr + dense, obits, mask=mask3)
    else:
        tl.store(out_ptr + dense, _bf16_bits(values, SOFT), mask=mask3)
    if NROPE > 0:
        tl.store(out_ptr + (tok[:, None] * OUT_DIM + NQ + r[None, :]), rope, mask=live[:, None])


# -------------------------------------------------------------- e4m3 tiles: write


@triton.jit
def _ue8m0_scale(x, peak, V4: tl.constexpr):
    """Scale bytes and scaled values of e4m3 tiles ``x`` with a power-of-two (ue8m0) scale.

    ``V4``: SGLang's CUDA V4 store, ``ceil2(max(amax, 1e-4) / 448)``, NaN values -> +448.
    Otherwise V4.1: the same ceiling of ``amax / 448`` from amax's bits, byte at least
    114, NaN values left for the conversion (0x7F). ``peak`` is :func:`_peak` of ``x``.
    Returns ``(byte, y)``.
    """
    if V4:
        # ceil2(max(amax, 1e-4) / 448) from the bits: 448 = 1.75 * 2**8 and 0x600000 is
        # the mantissa of 1.75, so the quotient's power-of-two ceiling is exact here.
        peak = tl.where(peak < 0, 0.0001, tl.maximum(peak, 0.0001))
        pbits = peak.to(tl.int32, bitcast=True)
        exponent = (pbits >> 23) - 8 + ((pbits & 0x7FFFFF) > 0x600000).to(tl.int32)
        exponent = tl.where(peak == float("inf"), 255, exponent)
    else:
        pbits = tl.where(peak < 0, 0x7FFFFFFF, peak.to(tl.int32, bitcast=True))
        exponent = (pbits >> 23) - 8 + ((pbits & 0x7FFFFF) > 0x600000).to(tl.int32)
        exponent = tl.maximum(exponent, 114)
    inverse = ((254 - exponent) << 23).to(tl.float32, bitcast=True)
    y = x * inverse[:, :, None]
    if V4:
        y = tl.where(y != y, 448.0, y)
    return exponent, y


@triton.jit
def _dsa_scale(x, peak):
    """DSA's fp32 tile scales ``amax * fl(1/448)`` and the scaled values (NaN -> +448).

    ``peak`` is :func:`_peak` of ``x``. Returns ``(scale, y)``.
    """
    # An all-NaN tile: the canonical NaN 0x7FFFFFFF, as CUDA's fmaxf reduction gives.
    nan_bits = tl.full(peak.shape, 0x7FFFFFFF, tl.int32).to(tl.float32, bitcast=True)
    peak = tl.where(peak < 0, nan_bits, peak)
    scale = peak * (1.0 / 448.0)  # Triton's `amax / 448`: a multiply by fl(1/448)
    inverse = tl.math.div_rn(tl.full(peak.shape, 1.0, tl.float32), scale)
    y = x * inverse[:, :, None]
    return scale, tl.where(y != y, 448.0, y)


@triton.jit
def _indexer_scale(x, peak):
    """The DSv4 indexer's fp32 tile scales ``max(amax, 1e-4) / 448`` and the clipped values.

    As SGLang's CUDA ``fused_store_indexer_cache``: IEEE ``s = fmaxf(1e-4, amax) / 448``
    and ``inv = 1 / s``, then ``fmaxf(fminf(x * inv, 448), -448)`` (NaN -> +448; an inf
    amax makes ``inv`` 0 and the inf itself NaN, so +448). ``peak`` is :func:`_peak` of
    ``x`` (an all-NaN tile's -1 or NaN gives the floor). Returns ``(scale, y)``.
    """
    peak = tl.where(peak < 0, 0.0001, tl.maximum(peak, 0.0001))
    scale = tl.math.div_rn(peak, tl.full(peak.shape, 448.0, tl.float32))
    inverse = tl.math.div_rn(tl.full(peak.shape, 1.0, tl.float32), scale)
    y = x * inverse[:, :, None]
    y = tl.where(y != y, 448.0, tl.minimum(tl.maximum(y, -448.0), 448.0))
    return scale, y


@triton.jit
def _ceil_log2(s):
    """``ceil(log2(s))`` (int32) for normal ``s > 0``, as an fp32 ``log2`` gives it.

    ``s = 2**k * (1 + m * 2**-23)``: ``k`` when ``m = 0``; otherwise ``log2(s) = k + d``
    with ``d`` about ``m * 2**-23 / ln 2``, and an fp32 ``log2`` (correctly rounded, or
    within far less than the margins here) rounds that back onto ``k`` exactly when
    ``fl(k + d) == k``, i.e. for a few small ``m`` once ``|k| >= 4``. The decision never
    sits within 1 % of a rounding boundary, so estimating ``d`` to 2**-16 relative is
    exact. Equal to ``torch.ceil(torch.log2(s))`` for every fp32 ``s`` in
    ``[2**-40, 2**121)``, on the CPU and on an H200 (checked exhaustively).
    """
    bits = s.to(tl.int32, bitcast=True)
    k = (bits >> 23) - 127
    m = bits & 0x7FFFFF
    kf = k.to(tl.float32)
    rounds_up = tl.fma(m.to(tl.float32), 1.7198265086280863e-07, kf) != kf  # 2**-23 / ln 2
    return k + ((m != 0) & rounds_up).to(tl.int32)


@triton.jit
def _max_nan(a, b):
    """``max`` that returns NaN if either operand is NaN (``max.NaN.f32``)."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _v4_rocm_scale(x, SOFT: tl.constexpr):
    """Scale bytes and scaled values of V4 tiles ``x`` as SGLang's ROCm (fnuz) store makes them.

    ``c = ceil(log2(max(amax, 1e-8) / 240))`` with an IEEE division and an fp32 ``log2``
    (so a quotient just above a power of two can round down onto it, as in the twin; see
    :func:`_ceil_log2`), byte ``c + 127`` and values ``x * 2**-c``, which the twin clips to
    +-240. A NaN in the tile makes the maximum NaN (torch's ``amax`` propagates it), and a
    non-finite ``c`` gives byte 255 and a multiplier of 0 (inf) or NaN; NaN values become
    +240 (``min`` returns the non-NaN operand). Returns ``(byte, y)`` with ``y`` finite and
    ``|y| < 240 * (1 + 2**-17)``, which :func:`_encode_e4m3fnuz` rounds as the clipped
    value.
    """
    amax = _max_nan(tl.reduce(tl.abs(x), 2, _max_nan), 1e-8)
    s = _div_rn(amax, 240.0, 1.0 / 240.0, SOFT)
    finite = s < float("inf")  # amax is at least 1e-8, so s is normal or inf or NaN
    c = tl.where(finite, _ceil_log2(s), 0)
    inverse = ((127 - c) << 23).to(tl.float32, bitcast=True)  # 2**-c, exactly
    inverse = tl.where(finite, inverse, tl.where(s != s, float("nan"), 0.0))
    # |x * 2**-c| < 240 * (1 + 2**-17): s is rounded, and the log2 may round s down onto a
    # power of two (m < 2**6, see _ceil_log2). The encoders round such values to +-240, as
    # the twin's clamp does, so min() only has to map NaN to +240.
    y = tl.minimum(x * inverse[:, :, None], 240.0)
    return tl.where(finite, c + 127, 255), y


@triton.jit
def _write_fp8_kernel(  # noqa: PLR0912 - one constexpr branch per store mode
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
    NQ: tl.constexpr,
    TILE: tl.constexpr,
    NT: tl.constexpr,
    NT_P2: tl.constexpr,
    MODE: tl.constexpr,
    SCALE_IN_ROW: tl.constexpr,
    NROPE: tl.constexpr,
    ROPE_OFF: tl.constexpr,
    IN_DIM: tl.constexpr,
    IN_BF16: tl.constexpr,
    SPAN: tl.constexpr,
    SOFT: tl.constexpr,
    EVICT: tl.constexpr,
    BLOCK_T: tl.constexpr,
    LAYERED: tl.constexpr,
    LOC_LAYERS: tl.constexpr = False,
    SEGMENTS: tl.constexpr = False,
    n0=0,
    n1=0,
    n2=0,
    n3=0,
    loc0=0,
    loc1=0,
    loc2=0,
    loc3=0,
    row0=0,
    row1=0,
    row2=0,
    row3=0,
):
    """Quantize ``[n, IN_DIM]`` rows per ``TILE``-value tile to e4m3 and scatter them.

    ``MODE``: 0 V4 (CUDA store: ue8m0 ceil of ``max(amax, 1e-4) / 448``, NaN -> +448),
    1 V4.1 (ue8m0 from amax's bits, floor 114, NaN -> 0x7F), 2 DSA (fp32 scale
    ``amax * fl(1/448)`` stored in the row, NaN -> +448), 3 V4 as SGLang's ROCm store
    writes it (e4m3fnuz; see :func:`_v4_rocm_scale`), 4 the DSv4 indexer (fp32 scale
    ``max(amax, 1e-4) / 448`` in the scale row; see :func:`_indexer_scale`). The rope
    tail (``NROPE`` values from column ``NQ``) is stored as bf16 at byte ``ROPE_OFF`` of
    the data row.
    ``SPAN`` > 0: each token writes ``SPAN`` contiguous bytes from its data offset that
    need not start or end on a 32-byte sector; those edge sectors are prefetched first.
    """
    buf_u8 = _word_ptr(buf_ptr, 1)
    tok, live, data_off, scale_off = _tile_block(
        loc_ptr, bases_ptr, n, PAGE, PAGE_BYTES, DATA_STRIDE, SCALE_BASE, SCALE_STRIDE,
        BLOCK_T, LAYERED, LOC_LAYERS, SEGMENTS,
        n0, n1, n2, n3, loc0, loc1, loc2, loc3, row0, row1, row2, row3,
    )  # fmt: skip
    if SPAN > 0 and not SOFT:
        _prefetch_edges(buf_u8, data_off, live, SPAN)
    if NROPE > 0:  # issued first: a load after the stores below would wait for them
        r = tl.arange(0, NROPE)
        rv = tl.load(
            values_ptr + (tok[:, None] * IN_DIM + NQ + r[None, :]),
            mask=live[:, None],
            eviction_policy=EVICT,
        )
    tile = tl.arange(0, NT_P2)
    col = tl.arange(0, TILE)
    mask2 = live[:, None] & (tile[None, :] < NT)
    mask3 = mask2[:, :, None]
    within = tile[None, :, None] * TILE + col[None, None, :]
    x = tl.load(
        values_ptr + (tok[:, None, None] * IN_DIM + within),
        mask=mask3,
        other=0.0,
        eviction_policy=EVICT,
    )
    x = x.to(tl.float32)
    if MODE == 3:
        exponent, y = _v4_rocm_scale(x, SOFT)
        codes = _encode_e4m3fnuz(y, SOFT)
    else:
        peak = _peak(x, SOFT)
        if MODE == 2:
            scale, y = _dsa_scale(x, peak)
        elif MODE == 4:
            scale, y = _indexer_scale(x, peak)
        else:
            exponent, y = _ue8m0_scale(x, peak, MODE == 0)
        codes = _encode_e4m3_sat(y, SOFT)  # V4.1: NaN -> 0x7F; V4 and DSA have no NaN left
    tl.store(buf_u8 + (data_off[:, None, None] + within), codes, mask=mask3)
    if MODE == 2:
        srow = (data_off + SCALE_IN_ROW) // 4
        sbits = scale.to(tl.int32, bitcast=True)
        tl.store(_word_ptr(buf_ptr, 4) + (srow[:, None] + tile[None, :]), sbits, mask=mask2)
    elif MODE == 4:
        sbits = scale.to(tl.int32, bitcast=True)
        srow = scale_off // 4
        tl.store(_word_ptr(buf_ptr, 4) + (srow[:, None] + tile[None, :]), sbits, mask=mask2)
    else:
        sbyte = exponent.to(tl.uint8)
        tl.store(buf_u8 + (scale_off[:, None] + tile[None, :]), sbyte, mask=mask2)
    if NROPE > 0:
        if IN_BF16:
            rbits = rv.to(tl.int16, bitcast=True)
        else:
            rbits = _bf16_bits(rv.to(tl.float32), SOFT)
        rrow = (data_off + ROPE_OFF) // 2
        tl.store(_word_ptr(buf_ptr, 2) + (rrow[:, None] + r[None, :]), rbits, mask=live[:, None])
