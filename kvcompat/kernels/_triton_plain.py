"""Plain rows: gather/scatter copies and the unscaled write (MHA, MLA, uniform fp8)."""

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
    _encode_e4m3_sat,
    _encode_e4m3fnuz,
    _encode_fp8_soft,
    _token_block,
    _word_ptr,
)

# ----------------------------------------------------------------- plain rows (copies)


@triton.jit
def _copy_rows_kernel(
    src_ptr,
    dst_ptr,
    loc_ptr,
    bases_ptr,
    n,
    PAGE,
    PAGE_BYTES,
    DATA_STRIDE,
    ROW_WORDS: tl.constexpr,
    WORD: tl.constexpr,
    GATHER: tl.constexpr,
    BLOCK_C: tl.constexpr,
    TAIL_C: tl.constexpr,
    EVICT: tl.constexpr,
    BLOCK_T: tl.constexpr,
    LAYERED: tl.constexpr,
    LOC_LAYERS: tl.constexpr = False,
    BASE_ALIGN: tl.constexpr = 1,
):
    """Copy ``ROW_WORDS`` words per token: pool row -> dense row (GATHER) or back.

    Full ``BLOCK_C``-word blocks first, then one ``TAIL_C``-word block (a power of two)
    for the rest, so no lane idles on a masked-off column except in that tail.
    ``BASE_ALIGN`` divides every per-layer offset in ``bases_ptr`` (see ``_token_block``).
    """
    src_ptr = _word_ptr(src_ptr, WORD)
    dst_ptr = _word_ptr(dst_ptr, WORD)
    tok, live, data_off, _ = _token_block(
        loc_ptr, bases_ptr, n, PAGE, PAGE_BYTES, DATA_STRIDE, 0, 0, BLOCK_T, LAYERED, LOC_LAYERS,
        BASE_ALIGN,
    )  # fmt: skip
    pool_row = data_off // WORD
    dense_row = tok * ROW_WORDS
    main_end: tl.constexpr = ROW_WORDS // BLOCK_C * BLOCK_C
    for c0 in tl.static_range(0, main_end, BLOCK_C):
        col = c0 + tl.arange(0, BLOCK_C)
        _copy_block(src_ptr, dst_ptr, pool_row, dense_row, col, live[:, None], GATHER, EVICT)
    if TAIL_C > 0:
        col = main_end + tl.arange(0, TAIL_C)
        mask = live[:, None] & (col[None, :] < ROW_WORDS)
        _copy_block(src_ptr, dst_ptr, pool_row, dense_row, col, mask, GATHER, EVICT)


@triton.jit
def _copy_block(src_ptr, dst_ptr, pool_row, dense_row, col, mask, GATHER: tl.constexpr,
                EVICT: tl.constexpr):  # fmt: skip
    if GATHER:
        src, dst = pool_row, dense_row
    else:
        src, dst = dense_row, pool_row
    words = tl.load(src_ptr + (src[:, None] + col[None, :]), mask=mask, eviction_policy=EVICT)
    tl.store(dst_ptr + (dst[:, None] + col[None, :]), words, mask=mask)


@triton.jit
def _move_rows_kernel(
    src_ptr,
    dst_ptr,
    src_rows_ptr,
    dst_rows_ptr,
    src_bases_ptr,
    dst_bases_ptr,
    n,
    SRC_PITCH,
    DST_PITCH,
    ROW_WORDS: tl.constexpr,
    WORD: tl.constexpr,
    BLOCK_C: tl.constexpr,
    TAIL_C: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    """Copy row ``src_rows[i]`` of layer ``l``'s source to row ``dst_rows[i]`` of its destination.

    Pool to pool in one pass (a direct transfer): the second grid axis is the layer, whose
    source and destination sit ``src_bases[l]`` / ``dst_bases[l]`` bytes from the launch's
    pointers; rows are ``SRC_PITCH`` / ``DST_PITCH`` bytes apart.
    """
    src_ptr = _word_ptr(src_ptr, WORD)
    dst_ptr = _word_ptr(dst_ptr, WORD)
    tok = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    live = tok < n
    layer = tl.program_id(1).to(tl.int64)
    src_row = tl.load(src_rows_ptr + tok, mask=live, other=0).to(tl.int64)
    dst_row = tl.load(dst_rows_ptr + tok, mask=live, other=0).to(tl.int64)
    src_at = (tl.load(src_bases_ptr + layer) + src_row * SRC_PITCH) // WORD
    dst_at = (tl.load(dst_bases_ptr + layer) + dst_row * DST_PITCH) // WORD
    main_end: tl.constexpr = ROW_WORDS // BLOCK_C * BLOCK_C
    for c0 in tl.static_range(0, main_end, BLOCK_C):
        col = c0 + tl.arange(0, BLOCK_C)
        words = tl.load(src_ptr + (src_at[:, None] + col[None, :]), mask=live[:, None])
        tl.store(dst_ptr + (dst_at[:, None] + col[None, :]), words, mask=live[:, None])
    if TAIL_C > 0:
        col = main_end + tl.arange(0, TAIL_C)
        mask = live[:, None] & (col[None, :] < ROW_WORDS)
        words = tl.load(src_ptr + (src_at[:, None] + col[None, :]), mask=mask)
        tl.store(dst_ptr + (dst_at[:, None] + col[None, :]), words, mask=mask)


# ------------------------------------------------------------------ plain rows: write


@triton.jit
def _write_plain_kernel(
    values_ptr,
    buf_ptr,
    loc_ptr,
    bases_ptr,
    n,
    PAGE,
    PAGE_BYTES,
    DATA_STRIDE,
    DIM: tl.constexpr,
    ESIZE: tl.constexpr,
    OUT_KIND: tl.constexpr,
    IN_BF16: tl.constexpr,
    BLOCK_C: tl.constexpr,
    SOFT: tl.constexpr,
    EVICT: tl.constexpr,
    BLOCK_T: tl.constexpr,
    LAYERED: tl.constexpr,
    LOC_LAYERS: tl.constexpr = False,
):
    """Cast ``[n, DIM]`` values to the stored dtype and scatter the rows.

    ``OUT_KIND``: 0 bf16, 1 fp16, 2 fp32, 3 e4m3fn, 4 e5m2, 5 e4m3fnuz, stored as
    ``ESIZE``-byte integers.
    """
    dst_ptr = _word_ptr(buf_ptr, ESIZE)
    tok, live, data_off, _ = _token_block(
        loc_ptr, bases_ptr, n, PAGE, PAGE_BYTES, DATA_STRIDE, 0, 0, BLOCK_T, LAYERED, LOC_LAYERS,
        16,  # every layered launch's bases come from 16-byte aligned buffers
    )  # fmt: skip
    pool_row = data_off // ESIZE
    for c0 in tl.static_range(0, DIM, BLOCK_C):
        col = c0 + tl.arange(0, BLOCK_C)
        mask = live[:, None] & (col[None, :] < DIM)
        x = tl.load(
            values_ptr + (tok[:, None] * DIM + col[None, :]),
            mask=mask,
            other=0.0,
            eviction_policy=EVICT,
        )
        if OUT_KIND == 0:
            if IN_BF16:
                stored = x.to(tl.int16, bitcast=True)
            else:
                stored = _bf16_bits(x.to(tl.float32), SOFT)
        elif OUT_KIND == 1:
            stored = x.to(tl.float32).to(tl.float16).to(tl.int16, bitcast=True)
        elif OUT_KIND == 2:
            stored = x.to(tl.float32).to(tl.int32, bitcast=True)
        else:
            xf = x.to(tl.float32)
            nan = xf != xf
            if OUT_KIND == 3:
                stored = _encode_e4m3_sat(xf, SOFT)
            elif OUT_KIND == 4:
                y = tl.minimum(tl.maximum(tl.where(nan, 0.0, xf), -57344.0), 57344.0)
                if SOFT:
                    code = _encode_fp8_soft(y, 2, 15, False)
                else:
                    code = y.to(tl.float8e5).to(tl.uint8, bitcast=True).to(tl.int32)
                stored = tl.where(nan, 0x7F, code).to(tl.uint8)
            else:
                y = tl.minimum(tl.maximum(tl.where(nan, 0.0, xf), -240.0), 240.0)
                stored = tl.where(nan, 0x80, _encode_e4m3fnuz(y, SOFT)).to(tl.uint8)
        tl.store(dst_ptr + (pool_row[:, None] + col[None, :]), stored, mask=mask)
