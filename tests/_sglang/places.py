"""Where each SGLang release keeps the layout code the oracles and the GPU tiers run.

One tuple of ``(module, name)`` per piece of code, newest release first, for
:func:`_sglang.features.sglang_code`. The CPU oracles (``sglang_oracles.py``) and the GPU
tiers (``tests/layouts/test_layouts_gpu.py``, ``tests/kernels/test_kernels_gpu.py``) resolve
the same places, so both compare each release with its own code, and
``tests/layouts/test_kernel_overlay.py`` resolves every one of them in the GPU tiers'
kernel-only tree. SGLang moved this code three times: 0.5.12 keeps it under
``sglang.srt`` (DSA's as ``nsa``), 0.5.13-0.5.15 under ``sglang.srt`` too (``dsa``, with a
V4 reader of its own, the MLA scatter in ``mem_cache.triton_ops``), 0.5.16-0.5.20 under
``sglang.kernels.ops.attention``, and 0.5.21 on under ``sglang.kernels.ops.kvcache``,
``sglang.kernels.ops.quantization`` and ``sglang.test.kernels`` (some renamed). Importing
this module imports nothing of SGLang.
"""

from __future__ import annotations

Places = tuple[tuple[str, str], ...]

_V4_QUANTIZER = "quant_to_nope_fp8_rope_bf16_pack_triton"
_V4_DEQUANT = "sglang.kernels.ops.attention.dsv4.dequant_k_cache"
_V4_DEQUANT_SRT = "sglang.srt.layers.attention.dsv4.dequant_k_cache"  # 0.5.13-0.5.15
_DSA_SRT = "sglang.srt.layers.attention.dsa"  # 0.5.13-0.5.15

V4_READER: Places = (  # 0.5.21 on, 0.5.16-0.5.20, 0.5.13-0.5.15 (0.5.12 has none of its own)
    (_V4_DEQUANT, "dequantize_k_cache_paged_dsv4"),
    (_V4_DEQUANT, "dequantize_k_cache_paged"),
    (_V4_DEQUANT_SRT, "dequantize_k_cache_paged"),
)
V4_READER_KERNEL: Places = (  # 0.5.16 on, 0.5.13-0.5.15
    (_V4_DEQUANT, "_dequantize_k_cache_paged_kernel"),
    (_V4_DEQUANT_SRT, "_dequantize_k_cache_paged_kernel"),
)
V4_REFERENCE_READER: Places = (  # 0.5.21 on, 0.5.16-0.5.20, 0.5.13-0.5.15
    ("sglang.test.kernels.deepseek_v4.k_cache_reference", "dequantize_k_cache_paged_ref"),
    (_V4_DEQUANT, "dequantize_k_cache_paged_ref"),
    (_V4_DEQUANT_SRT, "dequantize_k_cache_paged_ref"),
)
V4_QUANTIZER: Places = (  # 0.5.21 on (a test reference), 0.5.16-0.5.20, 0.5.12-0.5.15
    ("sglang.test.kernels.deepseek_v4.k_cache_reference", _V4_QUANTIZER),
    ("sglang.kernels.ops.attention.dsv4.quant_k_cache", _V4_QUANTIZER),
    ("sglang.srt.layers.attention.dsv4.quant_k_cache", _V4_QUANTIZER),
)
_V4_PACK_MODULES = (  # 0.5.21 on, 0.5.16-0.5.20, 0.5.12-0.5.15
    "sglang.kernels.ops.kvcache.dsv4_main_kv_store",
    "sglang.kernels.ops.attention.dsv4.index_buf_accessor",
    "sglang.srt.layers.attention.dsv4.index_buf_accessor",
)
V4_PACK_STORE: Places = tuple((module, "_set_k_and_s_triton") for module in _V4_PACK_MODULES)
V4_PACK_CLASS: Places = tuple((module, "NopeFp8RopeBf16Pack") for module in _V4_PACK_MODULES)
V4_HIP_STORE_KERNEL: Places = (  # 0.5.17 on
    ("sglang.kernels.ops.kvcache.triton_store_cache", "_triton_fused_store_flashmla_kernel"),
)
V41_READER: Places = (  # 0.5.21 on (V4.1 is not in earlier releases)
    (_V4_DEQUANT, "dequantize_k_cache_paged_v41"),
)
KV_LAYOUT: Places = (  # 0.5.21 on: the layouts its V4.1 reader takes (0.5.23: the _NEW ones)
    ("sglang.kernels.ops.attention.dsv4.kv_layout", "KVLayout"),
)
V41_FP8_READER_KERNEL: Places = (  # 0.5.21 on; called directly (the wrapper refuses SM90)
    (_V4_DEQUANT, "_dequantize_k_cache_paged_v41_fp8_kernel"),
)
V41_FP4_READER_KERNEL: Places = ((_V4_DEQUANT, "_dequantize_k_cache_paged_v41_fp4_kernel"),)
V41_REFERENCE: Places = (("sglang.test.kernels.deepseek_v4", "dsv41_kv_quant_reference"),)
DSA_QUANTIZER: Places = (  # 0.5.21 on, 0.5.16-0.5.20, 0.5.13-0.5.15, 0.5.12 (NSA)
    ("sglang.kernels.ops.quantization.dsa_quant_k_cache", "quantize_k_cache_separate"),
    ("sglang.kernels.ops.attention.dsa.quant_k_cache", "quantize_k_cache_separate"),
    (f"{_DSA_SRT}.quant_k_cache", "quantize_k_cache_separate"),
    ("sglang.srt.layers.attention.nsa.quant_k_cache", "quantize_k_cache_separate"),
)
DSA_READER: Places = (  # 0.5.21 on, 0.5.16-0.5.20, 0.5.13-0.5.15, 0.5.12 (NSA)
    ("sglang.kernels.ops.attention.dsa.dequant_k_cache", "dequantize_k_cache_paged_dsa"),
    ("sglang.kernels.ops.attention.dsa.dequant_k_cache", "dequantize_k_cache_paged"),
    (f"{_DSA_SRT}.dequant_k_cache", "dequantize_k_cache_paged"),
    ("sglang.srt.layers.attention.nsa.dequant_k_cache", "dequantize_k_cache_paged"),
)
MLA_SCATTER: Places = (  # 0.5.16 on, 0.5.13-0.5.15, 0.5.12: the MLA and DSA GPU row scatter
    ("sglang.kernels.ops.kvcache.mla_buffer", "set_mla_kv_buffer_triton"),
    ("sglang.srt.mem_cache.triton_ops.mla_buffer", "set_mla_kv_buffer_triton"),
    ("sglang.srt.mem_cache.utils", "set_mla_kv_buffer_triton"),
)
FP4_INDEXER_STORE: Places = (  # 0.5.23 on, 0.5.16-0.5.22
    ("sglang.kernels.ops.kvcache.dsv4_fp4_index_k_cache", "store_fp4_index_k_cache"),
    ("sglang.kernels.ops.attention.dsv4.fp4_indexer", "store_fp4_index_k_cache"),
)


def every() -> dict[str, Places]:
    """Every place list above, by name (what the kernel-tree check resolves)."""
    return {
        name: value
        for name, value in globals().items()
        if name.isupper() and not name.startswith("_")
    }
