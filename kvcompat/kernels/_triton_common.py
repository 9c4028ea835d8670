"""Shared ``@triton.jit`` helpers: token addressing, fp8/bf16/e2m1 conversions, prefetch.

See :mod:`kvcompat.kernels._triton` for the conventions (``SOFT`` conversions).
"""

# Triton's conventions, not ours to change here: constexpr parameters are UPPER_CASE
# (N803), jit functions take untyped tensors and return blocks (ANN001/ANN202), `x != x` is
# the NaN test that works in every backend (PLR0124), constexpr branches must be statements
# (SIM108). mypy cannot see through @triton.jit, which is untyped.
# ruff: noqa: N803, ANN001, ANN202, PLR0124, SIM108
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl

# ----------------------------------------------------------------------------- helpers


@triton.jit
def _token_offsets(
    loc_ptr,
    tok,
    live,
    PAGE,
    PAGE_BYTES,
    DATA_STRIDE,
    SCALE_BASE,
    SCALE_STRIDE,
):
    """Byte offsets (int64) of the data row and the scale row of tokens ``loc[tok]``.

    The page geometry is passed at run time (Triton specialises integers divisible by 16,
    which is all the alignment the wide loads need), so one compiled kernel serves every
    page size of a layout.
    """
    loc = tl.load(loc_ptr + tok, mask=live, other=0).to(tl.int32)  # token ids fit in int32
    page = loc // PAGE
    slot = (loc - page * PAGE).to(tl.int64)
    base = page.to(tl.int64) * PAGE_BYTES
    return base + slot * DATA_STRIDE, base + SCALE_BASE + slot * SCALE_STRIDE


@triton.jit
def _token_block(
    loc_ptr,
    bases_ptr,
    n,
    PAGE,
    PAGE_BYTES,
    DATA_STRIDE,
    SCALE_BASE,
    SCALE_STRIDE,
    BLOCK_T: tl.constexpr,
    LAYERED: tl.constexpr,
    LOC_LAYERS: tl.constexpr = False,
    BASE_ALIGN: tl.constexpr = 1,
):
    """This program's ``BLOCK_T`` token indices, which of them exist, and their row offsets.

    Returns ``(tok, live, data_off, scale_off)`` (see :func:`_token_offsets`). With
    ``LAYERED`` the launch's second grid axis is the layer: the pool offsets are moved by
    that layer's entry of ``bases_ptr`` (int64 bytes from the launch's buffer pointer to the
    layer's buffer) and ``tok`` counts dense rows across layers (``layer * n + token``),
    so every kernel addresses one layer or many with the same body. With ``LOC_LAYERS``
    each layer reads its own ``n`` locations (``loc`` is ``[layers, n]``).

    ``BASE_ALIGN`` is a power of two that divides every entry of ``bases_ptr``, which the
    launch guarantees: the compiler cannot know it of a loaded offset, and without it
    keeps the loads and stores of a layered launch to single bytes where a one-layer
    launch moves 16 at a time.
    """
    tok = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    live = tok < n
    layer = tl.program_id(1).to(tl.int64)  # 0 on a one-layer launch
    if LOC_LAYERS:
        loc_ptr += layer * n
    data_off, scale_off = _token_offsets(
        loc_ptr, tok, live, PAGE, PAGE_BYTES, DATA_STRIDE, SCALE_BASE, SCALE_STRIDE
    )
    if LAYERED:
        base = tl.load(bases_ptr + layer)
        if BASE_ALIGN > 1:
            base = tl.multiple_of(base, BASE_ALIGN)
        data_off += base
        scale_off += base
        tok += layer * n
    return tok, live, data_off, scale_off


@triton.jit
def _pick(segment, a0, a1, a2, a3):
    """``(a0, a1, a2, a3)[segment]`` for a scalar ``segment`` in ``0..3``."""
    return tl.where(segment == 0, a0, tl.where(segment == 1, a1, tl.where(segment == 2, a2, a3)))


@triton.jit
def _segment_block(
    loc_ptr,
    table_ptr,
    DATA_STRIDE,
    SCALE_STRIDE,
    BLOCK_T: tl.constexpr,
    n0,
    n1,
    n2,
    n3,
    loc0,
    loc1,
    loc2,
    loc3,
    row0,
    row1,
    row2,
    row3,
):
    """:func:`_token_block` for a launch over several token spaces (a composite's parts).

    The launch's second grid axis is the layer; layer ``l``'s row of ``table_ptr`` (six
    int64: byte offset of its buffer from the launch's pointer, page size, page pitch,
    scale-row offset, segment, place within the segment) gives its own page geometry and
    its segment ``s``, whose ``n_s`` locations start ``loc_s`` elements after ``loc_ptr``
    and whose dense rows start at row ``row_s`` (layer by layer, ``n_s`` rows each). Up
    to four segments; the per-call numbers are scalars, so a captured launch needs no
    table of its own. The table's offsets and pitches are multiples of 16 bytes (no table
    is made where they are not), which the loads are told.
    """
    layer = tl.program_id(1).to(tl.int64)
    entry = table_ptr + layer * 6
    base = tl.multiple_of(tl.load(entry), 16)
    page = tl.load(entry + 1)
    pitch = tl.multiple_of(tl.load(entry + 2), 16)
    scale_base = tl.multiple_of(tl.load(entry + 3), 16)
    segment = tl.load(entry + 4)
    place = tl.load(entry + 5)
    n = _pick(segment, n0, n1, n2, n3).to(tl.int64)
    tok = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    live = tok < n
    first = _pick(segment, loc0, loc1, loc2, loc3).to(tl.int64)
    data_off, scale_off = _token_offsets(
        loc_ptr + first, tok, live, page, pitch, DATA_STRIDE, scale_base, SCALE_STRIDE
    )
    rows = _pick(segment, row0, row1, row2, row3).to(tl.int64) + place * n
    return tok + rows, live, data_off + base, scale_off + base


@triton.jit
def _tile_block(
    loc_ptr,
    bases_ptr,
    n,
    PAGE,
    PAGE_BYTES,
    DATA_STRIDE,
    SCALE_BASE,
    SCALE_STRIDE,
    BLOCK_T: tl.constexpr,
    LAYERED: tl.constexpr,
    LOC_LAYERS: tl.constexpr,
    SEGMENTS: tl.constexpr,
    n0,
    n1,
    n2,
    n3,
    loc0,
    loc1,
    loc2,
    loc3,
    row0,
    row1,
    row2,
    row3,
):
    """:func:`_segment_block` with ``SEGMENTS`` (several token spaces), else :func:`_token_block`.

    What the e4m3-tile kernels call: one token space, one layer or many, or several
    spaces whose layers each carry their own page geometry in ``bases_ptr``.
    """
    if SEGMENTS:
        tok, live, data_off, scale_off = _segment_block(
            loc_ptr, bases_ptr, DATA_STRIDE, SCALE_STRIDE, BLOCK_T,
            n0, n1, n2, n3, loc0, loc1, loc2, loc3, row0, row1, row2, row3,
        )  # fmt: skip
    else:
        tok, live, data_off, scale_off = _token_block(
            loc_ptr, bases_ptr, n, PAGE, PAGE_BYTES, DATA_STRIDE, SCALE_BASE, SCALE_STRIDE,
            BLOCK_T, LAYERED, LOC_LAYERS, 16,
        )  # fmt: skip
    return tok, live, data_off, scale_off


@triton.jit
def _fp4_block(live):
    """V41_FP4's ``[32 tiles x 8]`` grid of code-pair bytes: ``(tile, mask3, within)``."""
    tile = tl.arange(0, 32)
    pair = tl.arange(0, 8)
    return tile, live[:, None, None], tile[None, :, None] * 8 + pair[None, None, :]


@triton.jit
def _word_ptr(ptr, WORD: tl.constexpr):
    """``ptr`` reinterpreted as a pointer to ``WORD``-byte integers."""
    if WORD == 8:
        typed = ptr.to(tl.pointer_type(tl.int64))
    elif WORD == 4:
        typed = ptr.to(tl.pointer_type(tl.int32))
    elif WORD == 2:
        typed = ptr.to(tl.pointer_type(tl.int16))
    else:
        typed = ptr.to(tl.pointer_type(tl.uint8))
    return typed


@triton.jit
def _bf16_bits(x, SOFT: tl.constexpr):
    """fp32 -> bf16 bits (int16), round to nearest even, every NaN as ``0x7FFF``."""
    if SOFT:
        b = x.to(tl.int32, bitcast=True)
        r = (b + (0x7FFF + ((b >> 16) & 1))) >> 16
    else:
        r = x.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32)
    r = tl.where(x != x, 0x7FFF, r)
    return r.to(tl.int16)


@triton.jit
def _decode_e4m3(codes, FNUZ: tl.constexpr, SOFT: tl.constexpr):
    """uint8 e4m3 codes (fn, or fnuz) -> fp32, exactly; NaN codes give NaN.

    Without the hardware conversion (fnuz always, fn on the ``SOFT`` path): the code's
    exponent and mantissa bits placed at fp32's give the value times ``2**-120`` (fn,
    bias 7 against 127) or ``2**-119`` (fnuz, bias 8); subnormal codes land on fp32
    subnormals, which ``mul.f32`` keeps. So one multiply decodes every code but NaN.
    """
    if FNUZ or SOFT:
        c = codes.to(tl.int32)
        bits = ((c & 0x7F) << 20) | ((c & 0x80) << 24)
        if FNUZ:
            value = bits.to(tl.float32, bitcast=True) * (2.0**119)
            nan = c == 0x80
        else:
            value = bits.to(tl.float32, bitcast=True) * (2.0**120)
            nan = (c & 0x7F) == 0x7F
        value = tl.where(nan, float("nan"), value)
    else:
        value = codes.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    return value


@triton.jit
def _encode_fp8_soft(y, MAN: tl.constexpr, BIAS: tl.constexpr, FNUZ: tl.constexpr):
    """Round finite fp32 ``|y| <= max`` to an fp8 code (int32), nearest even, from the bits."""
    shift: tl.constexpr = 23 - MAN
    a = tl.abs(y)
    ab = a.to(tl.int32, bitcast=True)
    normal = ((ab + (((1 << (shift - 1)) - 1) + ((ab >> shift) & 1))) >> shift) - (
        (127 - BIAS) << MAN
    )
    # Below the smallest normal the grid is uniform: round a / step to an integer (the
    # magic-number add rounds to nearest even; the product is exact).
    sub = ((a * (2.0 ** (BIAS - 1 + MAN)) + 8388608.0) - 8388608.0).to(tl.int32)
    code = tl.where(a < 2.0 ** (1 - BIAS), sub, normal)
    sign = (y.to(tl.int32, bitcast=True) >> 24) & 0x80
    if FNUZ:  # no negative zero: a negative value that rounds to 0 is +0
        sign = tl.where(code == 0, 0, sign)
    return code | sign


@triton.jit
def _encode_e4m3(y, SOFT: tl.constexpr):
    """Finite fp32 ``|y| <= 448`` -> e4m3fn code (uint8), round to nearest even."""
    if SOFT:
        code = _encode_fp8_soft(y, 3, 7, False).to(tl.uint8)
    else:
        code = y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    return code


@triton.jit
def _encode_e4m3fnuz(y, SOFT: tl.constexpr):
    """Finite fp32 ``|y| < 248`` -> e4m3fnuz code (uint8), round to nearest even.

    Values above 240, the largest fnuz value, round to it (248 would be the midpoint to
    the next binade). The hardware path encodes ``2 * y`` as e4m3fn (the fnuz grid is the
    fn grid halved): above fn's largest value 448 only fnuz's 240 (code 0x7F) is left,
    for ``|2y| > 464`` (464 itself ties to the even 448), and fn's -0 (0x80, fnuz's NaN)
    becomes +0.
    """
    if SOFT:
        code = _encode_fp8_soft(y, 3, 8, True)
    else:
        c = (y * 2.0).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
        c += (tl.abs(y) > 232.0).to(tl.uint8)  # +-448 (0x7E / 0xFE) -> +-240 (0x7F / 0xFF)
        code = tl.where(c == 0x80, 0, c).to(tl.uint8)
    return code.to(tl.uint8)


@triton.jit
def _encode_e4m3_sat(y, SOFT: tl.constexpr):
    """fp32 -> e4m3fn code (uint8) as ``cvt.rn.satfinite`` converts.

    +-inf and overflow become +-448 and NaN 0x7F (the hardware conversion does all of it).
    """
    if SOFT:
        nan = y != y
        clamped = tl.minimum(tl.maximum(tl.where(nan, 0.0, y), -448.0), 448.0)
        code = tl.where(nan, 0x7F, _encode_fp8_soft(clamped, 3, 7, False)).to(tl.uint8)
    else:
        code = y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    return code


@triton.jit
def _encode_e2m1(y, sign_of, SOFT: tl.constexpr):
    """fp32 -> e2m1 code (int32 0..15) as ``cvt.rn.satfinite.e2m1x2.f32`` rounds.

    Nearest, ties to even, saturating at 6; NaN becomes +6. The sign bit comes from
    ``sign_of`` (the dividend: ``y = sign_of / s`` with ``s > 0`` has its sign, -0.0
    included), kept on every value, zero included, but not on NaN.

    The ``SOFT`` path rounds the fp32 bits; the hardware path (fewer integer operations,
    which run at half rate on Hopper) rounds ``|y|`` on the grid of its binade: steps of
    0.5 below 2, 1 below 4, 2 up to 6, each with one magic-number add (round to nearest
    even), and ``min.f32`` maps NaN to 6 by itself.
    """
    if SOFT:
        nan = y != y
        mag = tl.where(nan, 6.0, tl.minimum(tl.abs(y), 6.0))
        small = ((mag * 2.0 + 8388608.0) - 8388608.0).to(tl.int32)
        mbits = mag.to(tl.int32, bitcast=True)
        big = ((mbits + (0x1FFFFF + ((mbits >> 22) & 1))) >> 22) - 252
        code = tl.where(mag < 1.0, small, big)
    else:
        mag = tl.minimum(tl.abs(y), 6.0)
        low = mag < 2.0
        mid = mag < 4.0
        step = tl.where(low, 2.0, tl.where(mid, 1.0, 0.5))
        base = tl.where(low, 0, tl.where(mid, 2, 4))
        code = ((mag * step + 12582912.0).to(tl.int32, bitcast=True) & 7) + base
    negative = (sign_of.to(tl.int32, bitcast=True) < 0) & (y == y)
    return code | tl.where(negative, 8, 0)


@triton.jit
def _div_rn(x, s, r, SOFT: tl.constexpr):
    """IEEE ``x / s`` (round to nearest even) for ``s`` in [2**-9, 448], ``r = fl(1 / s)``.

    For ``s = 240`` (the ROCm V4 store, which divides ``amax >= 1e-8``) it equals IEEE
    division for every positive fp32 ``x`` from ``1.9e-37`` up, checked exhaustively on
    an H200; below that, where the quotient is subnormal, 279,620 values differ.

    The hardware path does Markstein's correction instead of a full division: with ``r``
    correctly rounded and ``q0 = fl(x * r)`` within an ulp of ``x / s``, the residual
    ``x - q0 * s`` is exact in one fma and ``fl(q0 + residual * r)`` is the correctly
    rounded quotient; non-finite ``q0`` (inf/NaN input, overflow) is already the answer.
    """
    if SOFT:
        q = tl.math.div_rn(x, s)
    else:
        q0 = x * r
        q1 = tl.fma(tl.fma(-q0, s, x), r, q0)
        q = tl.where(tl.abs(q0) < float("inf"), q1, q0)
    return q


@triton.jit
def _peak(x, SOFT: tl.constexpr):
    """Max |x| over the last axis with NaN dropped, as CUDA's ``fmaxf`` reductions do.

    Where every value is NaN: -1.0 on the ``SOFT`` path, the canonical NaN ``0x7FFFFFFF``
    on the hardware path (``tl.max`` is ``max.f32``, which drops NaN operands).
    """
    if SOFT:
        peak = tl.max(tl.where(x != x, -1.0, tl.abs(x)), axis=2)
    else:
        peak = tl.max(tl.abs(x), axis=2)
    return peak


@triton.jit
def _prefetch_l2(ptr, pred):
    """Bring the 32-byte sector holding ``ptr`` into L2 where ``pred`` (hardware path only).

    A write that covers only part of a sector leaves L2 to merge it with the sector's other
    bytes from DRAM later; with ECC memory that is a read-modify-write in the DRAM
    controller. Fetching such edge sectors first (their other bytes belong to neighbouring
    tokens, which this program never writes) turns that into an ordinary early read: on an
    H200 it took the V4.1 interleaved (528-byte row) write from 72 % to 81 % of copy
    bandwidth. The result is a dummy (the asm must not be removed as dead code).
    """
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.u32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
        "=r,l,r",
        [ptr, pred.to(tl.int32)],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _prefetch_edges(buf_u8, data_off, live, SPAN: tl.constexpr):
    """Prefetch the edge sectors of each token's ``SPAN``-byte span that it only partly covers.

    See :func:`_prefetch_l2`.
    """
    _prefetch_l2(buf_u8 + data_off, live & ((data_off & 31) != 0))
    _prefetch_l2(buf_u8 + (data_off + SPAN - 1), live & (((data_off + SPAN) & 31) != 0))
