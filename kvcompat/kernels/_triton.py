"""The private ``@triton.jit`` bodies of kvcompat's gather-dequantize / quantize-scatter.

Every kernel takes a block of ``BLOCK_T`` tokens per program. It loads their locations,
turns each into byte offsets of the token's data row and scale row with the layout's page
geometry (all compile-time constants), and moves whole rows with wide, contiguous loads
and stores; the value arithmetic is the layout's torch twin (``kvcompat.layouts``), done
in fp32 exactly as the twin does it. Importing this module imports triton. The bodies
live in one module per kernel family (``_triton_plain``, ``_triton_fp8``,
``_triton_fp4``; helpers in ``_triton_common``); this module gathers them under one
name for the launchers.

Conversions come in two flavours, selected by the ``SOFT`` constexpr: the hardware one
(``cvt`` instructions; what a GPU launch uses) and a pure-integer one that rounds exactly
as the hardware does (what the CPU interpreter uses, because ``TRITON_INTERPRET=1`` rounds
fp32 -> fp8 half away from zero and fp32 -> bf16 by truncation). The GPU tests run both on
an H200 and compare them with the twins byte for byte.
"""

from __future__ import annotations

from kvcompat.kernels._triton_common import (
    _bf16_bits,
    _decode_e4m3,
    _div_rn,
    _encode_e2m1,
    _encode_e4m3,
    _encode_e4m3_sat,
    _encode_e4m3fnuz,
    _encode_fp8_soft,
    _fp4_block,
    _peak,
    _pick,
    _prefetch_edges,
    _prefetch_l2,
    _segment_block,
    _tile_block,
    _token_block,
    _token_offsets,
    _word_ptr,
)
from kvcompat.kernels._triton_fp4 import (
    _asm_count,
    _asm_sign_base,
    _asm_thresholds,
    _e2m1_by_thresholds,
    _load_pairs,
    _max_bf16x2,
    _max_f16x2,
    _read_fp4_kernel,
    _write_fp4_kernel,
    _write_fp4_pairs_kernel,
    _write_fp4_ue8m0_kernel,
)
from kvcompat.kernels._triton_fp8 import (
    _ceil_log2,
    _dsa_scale,
    _indexer_scale,
    _max_nan,
    _read_fp8_kernel,
    _ue8m0_scale,
    _v4_rocm_scale,
    _write_fp8_kernel,
)
from kvcompat.kernels._triton_plain import (
    _copy_block,
    _copy_rows_kernel,
    _move_rows_kernel,
    _write_plain_kernel,
)

__all__ = [
    "_asm_count",
    "_asm_sign_base",
    "_asm_thresholds",
    "_bf16_bits",
    "_ceil_log2",
    "_copy_block",
    "_copy_rows_kernel",
    "_decode_e4m3",
    "_div_rn",
    "_dsa_scale",
    "_e2m1_by_thresholds",
    "_encode_e2m1",
    "_encode_e4m3",
    "_encode_e4m3_sat",
    "_encode_e4m3fnuz",
    "_encode_fp8_soft",
    "_fp4_block",
    "_indexer_scale",
    "_load_pairs",
    "_max_bf16x2",
    "_max_f16x2",
    "_max_nan",
    "_move_rows_kernel",
    "_peak",
    "_pick",
    "_prefetch_edges",
    "_prefetch_l2",
    "_read_fp4_kernel",
    "_read_fp8_kernel",
    "_segment_block",
    "_tile_block",
    "_token_block",
    "_token_offsets",
    "_ue8m0_scale",
    "_v4_rocm_scale",
    "_word_ptr",
    "_write_fp4_kernel",
    "_write_fp4_pairs_kernel",
    "_write_fp4_ue8m0_kernel",
    "_write_fp8_kernel",
    "_write_plain_kernel",
]
