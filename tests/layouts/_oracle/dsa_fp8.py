"""Oracle of DSA's 656-byte fp8 rows: SGLang's DSA quantizer, pool store and reader."""

from __future__ import annotations

import torch
from _sglang import places
from _sglang.features import sglang_code

from _oracle._common import (
    Result,
    check,
    fail_or_pass,
    interp_round,
    tile_values,
)
from kvcompat.layouts import (
    DSA_FP8,
    dequantize,
    quantize,
)


def _dsa_scaled(values: torch.Tensor, scale: torch.Tensor, *, nan_to: float) -> torch.Tensor:
    """``clamp(x * (1 / s))`` in fp32 for stored scales ``s``; a NaN becomes ``nan_to``."""
    n = values.shape[0]
    nope = values[:, :512].float().reshape(n, 4, 128)
    scaled = nope * (torch.ones_like(scale) / scale).unsqueeze(-1)
    return torch.where(torch.isnan(scaled), nan_to, scaled.clamp(-448, 448)).reshape(n, 512)


def _dsa_scales(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(IEEE ``amax / 448`` as the interpreter divides, ``amax * fl(1/448)`` as a GPU does)."""
    amax = values[:, :512].float().reshape(-1, 4, 128).abs().amax(-1)
    return amax / torch.full_like(amax, 448.0), amax * torch.full_like(amax, 1.0 / 448.0)


@check(
    DSA_FP8,
    code="`quantize_k_cache_separate` (DSA quantizer)",
    compared="SGLang's bytes against the interpreter's arithmetic, kvcompat's against the GPU's "
    "(below)",
)
def dsa_quantize_triton() -> Result:
    """The interpreter divides exactly (IEEE) and clamps NaN to -448; on an NVIDIA GPU the
    kernel multiplies by fl(1/448) and clamps NaN to +448, which kvcompat follows (checked
    byte for byte on an H200). So: SGLang's bytes against the interpreter's arithmetic,
    kvcompat's against the GPU's, both on the same inputs."""
    quantize_k_cache_separate = sglang_code(*places.DSA_QUANTIZER)

    n = 24
    values = tile_values(n, 576, 128, seed=31, dtype=torch.bfloat16)
    nope_part, rope_part = quantize_k_cache_separate(values[:, :512], values[:, 512:])
    theirs = torch.cat((nope_part.squeeze(1), rope_part.squeeze(1)), dim=1)
    ours, _ = DSA_FP8.codec.encode(DSA_FP8, values, fnuz=False)
    ieee, gpu = _dsa_scales(values)
    problems = []
    if not torch.equal(
        theirs[:, 512:528].contiguous().view(torch.float32).view(torch.int32),
        ieee.view(torch.int32),
    ):
        problems.append("SGLang's scales are not the IEEE quotient")
    if not torch.equal(
        ours[:, 512:528].contiguous().view(torch.float32).view(torch.int32), gpu.view(torch.int32)
    ):
        problems.append("kvcompat's scales are not amax * fl(1/448)")
    if not torch.equal(ours[:, 528:], theirs[:, 528:]):
        problems.append("rope bytes differ")
    if not torch.equal(theirs[:, :512], interp_round(_dsa_scaled(values, ieee, nan_to=-448.0))):
        problems.append("SGLang's codes are not the interpreter's rounding of x / s")
    expected = _dsa_scaled(values, gpu, nan_to=448.0).to(torch.float8_e4m3fn).view(torch.uint8)
    if not torch.equal(ours[:, :512], expected):
        problems.append("kvcompat's codes are not RNE of x * (1 / s)")
    if not bool((theirs[0, :128] == 0xFE).all()) or not bool((ours[0, :128] == 0x7E).all()):
        problems.append("zero tile: expected -448 under the interpreter, +448 in kvcompat")
    differ = int((ieee != gpu).sum())
    return fail_or_pass(
        problems,
        f"same arithmetic; {differ} of {ieee.numel()} scales differ "
        "in the last bit between IEEE and the GPU's reciprocal",
    )


@check(
    DSA_FP8,
    code="`DSATokenToKVPool.set_mla_kv_buffer`",
    compared="placement, rope, untouched rows, arithmetic",
)
def dsa_pool_store() -> Result:
    from _sglang.builders import radix_layer
    from _sglang.features import cpu_kernel, pool_class

    pool = pool_class("DSATokenToKVPool")(
        size=128,
        page_size=64,
        kv_lora_rank=512,
        dtype=torch.float8_e4m3fn,
        qk_rope_head_dim=64,
        layer_num=1,
        device="cpu",
        index_head_dim=128,
        enable_memory_saver=False,
        kv_cache_dim=656,
    )
    if not pool.dsa_kv_cache_store_fp8:
        return "fail", "the pool did not select fp8 DSA storage"
    buf = pool.kv_buffer[0]
    start = torch.randint(0, 256, buf.shape, generator=torch.Generator().manual_seed(4))
    buf.view(torch.uint8).copy_(start.to(torch.uint8))
    ours = buf.clone()
    n = 12
    values = tile_values(n, 576, 128, seed=41, dtype=torch.bfloat16)
    # Slot 0 is skipped by SGLang's MLA scatter (reserved for CUDA-graph padding).
    loc = 1 + torch.randperm(buf.shape[0] - 1, generator=torch.Generator().manual_seed(5))[:n]

    with cpu_kernel("DSATokenToKVPool.set_mla_kv_buffer"):
        pool.set_mla_kv_buffer(radix_layer(0), loc, values[:, None, :512], values[:, None, 512:])
    quantize(DSA_FP8, values, ours, loc, 64)
    ours_rows = ours.view(torch.uint8).reshape(buf.shape[0], 656)
    theirs_rows = buf.view(torch.uint8).reshape(buf.shape[0], 656)
    ieee, _ = _dsa_scales(values)
    problems = []
    if not torch.equal(ours_rows[loc, 528:], theirs_rows[loc, 528:]):
        problems.append("rope bytes differ")
    if not torch.equal(theirs_rows[loc, 512:528].contiguous().view(torch.float32), ieee):
        problems.append("the pool's scales are not the (interpreter's) IEEE quotient")
    untouched = torch.ones(buf.shape[0], dtype=torch.bool)
    untouched[loc] = False
    if not torch.equal(ours_rows[untouched], theirs_rows[untouched]):
        problems.append("bytes of unwritten rows differ")
    expected = interp_round(_dsa_scaled(values, ieee, nan_to=-448.0))
    if not torch.equal(theirs_rows[loc, :512], expected):
        problems.append("the pool's codes are not the interpreter's rounding of x / s")
    return fail_or_pass(
        problems,
        "rows written through DSATokenToKVPool.set_mla_kv_buffer: "
        "placement, rope and arithmetic identical",
    )


@check(
    DSA_FP8,
    code="`dequantize_k_cache_paged_dsa`",
    compared="the fp32 products (the interpreter truncates to bf16) and rope",
)
def dsa_dequant_triton() -> Result:
    dequantize_k_cache_paged_dsa = sglang_code(*places.DSA_READER)

    rows = 40
    g = torch.Generator().manual_seed(6)
    values = tile_values(rows, 576, 128, seed=51, dtype=torch.bfloat16)
    buf = torch.zeros(rows, 1, 656, dtype=torch.uint8)
    quantize(DSA_FP8, values, buf, torch.arange(rows), 1)
    loc = torch.randint(0, rows, (64,), generator=g)
    ours = dequantize(DSA_FP8, buf, loc, 1)
    theirs = dequantize_k_cache_paged_dsa(buf.view(torch.float8_e4m3fn), loc).reshape(-1, 576)
    # The interpreter truncates fp32 -> bf16; compare against truncation of the fp32
    # product, and kvcompat's output against round-to-nearest-even of the same product.
    row = buf.reshape(rows, 656)[loc]
    codes = row[:, :512].contiguous().view(torch.float8_e4m3fn).float().reshape(-1, 4, 128)
    scale = row[:, 512:528].contiguous().view(torch.float32)
    product = (codes * scale.unsqueeze(-1)).reshape(-1, 512)
    truncated = (product.view(torch.int32) >> 16).to(torch.int16)
    problems = []
    normal = product.abs() >= 2.0**-126
    if not torch.equal(theirs[:, :512].view(torch.int16)[normal], truncated[normal]):
        problems.append("SGLang's nope is not the truncated fp32 product")
    if not torch.equal(
        ours[:, :512].view(torch.int16), product.to(torch.bfloat16).view(torch.int16)
    ):
        problems.append("kvcompat's nope is not the RNE fp32 product")
    if not torch.equal(ours[:, 512:].view(torch.int16), theirs[:, 512:].view(torch.int16)):
        problems.append("rope differs")
    return fail_or_pass(problems, "same fp32 products and rope (interpreter truncates to bf16)")
