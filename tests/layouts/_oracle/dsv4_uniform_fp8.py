"""Oracle of the uniform-fp8 layout: ``DeepSeekV4UniformFP8KVPool``'s own write."""

from __future__ import annotations

import torch

from _oracle._common import (
    Result,
    check,
    fail_or_pass,
    nan_aware_equal,
    pages_for,
    tile_values,
)
from kvcompat.layouts import (
    UNIFORM_FP8,
    dequantize,
    quantize,
)


@check(
    UNIFORM_FP8,
    code="`DeepSeekV4UniformFP8KVPool.set_key_buffer_fused`",
    compared="pool buffer after bf16 and fp32 writes, values above 448 and NaN included",
)
def uniform_fp8_pool_store() -> Result:
    from _sglang.features import pool_class

    page_size, n = 4, 10
    pool = pool_class("DeepSeekV4UniformFP8KVPool")(
        size=32,
        page_size=page_size,
        dtype=torch.float8_e4m3fn,
        qk_nope_head_dim=448,
        qk_rope_head_dim=64,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    problems = []
    for dtype in (torch.bfloat16, torch.float32):
        values = tile_values(n, 512, 64, seed=21, dtype=dtype)
        values[5, :4] = torch.tensor([500.0, -470.0, float("nan"), float("inf")]).to(dtype)
        start = pages_for(UNIFORM_FP8, page_size, pool.kv_buffer[0].shape[0], seed=8)
        pool.kv_buffer[0].view(torch.uint8).copy_(start)
        ours = start.clone().view(torch.float8_e4m3fn)
        loc = torch.randperm(start.shape[0] * page_size, generator=torch.Generator().manual_seed(1))
        loc = loc[:n]
        pool.set_key_buffer_fused(0, loc, values)
        quantize(UNIFORM_FP8, values, ours, loc, page_size, check_finite=False)
        if not torch.equal(ours.view(torch.uint8), pool.kv_buffer[0].view(torch.uint8)):
            problems.append(f"{dtype}: bytes differ")
        read = dequantize(UNIFORM_FP8, pool.kv_buffer[0], loc, page_size)
        native = pool.get_key_buffer(0).view(-1, 512)[loc].to(torch.float32)
        if not nan_aware_equal(read, native.to(torch.bfloat16)).all():
            problems.append(f"{dtype}: read differs from the pool's fp8 rows")
    return fail_or_pass(problems, "set_key_buffer_fused bytes identical (bf16, fp32; >448, NaN)")
