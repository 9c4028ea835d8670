"""Oracle of the MHA row layouts: ``MHATokenToKVPool``'s own writes and getters."""

from __future__ import annotations

import torch

from _oracle._common import (
    Result,
    check,
    fail_or_pass,
)
from kvcompat.layouts import (
    dequantize,
    mha_layout,
    quantize,
)


@check(
    code="`MHATokenToKVPool.set_kv_buffer`, `get_key_buffer`",
    compared="bf16, fp16, fp32, e4m3fn, e5m2 pools",
)
def mha_pool_store() -> Result:
    from _sglang.builders import build_mha_pool, radix_layer

    problems = []
    for dtype in (
        torch.bfloat16,
        torch.float16,
        torch.float32,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
    ):
        pool = build_mha_pool(dtype=dtype, layer_num=1, size=64, page_size=16)  # 2 x 8 heads
        spec = mha_layout(2, 8, dtype)
        k_ours = pool.k_buffer[0].clone()
        g = torch.Generator().manual_seed(9)
        loc = torch.randperm(80, generator=g)[:20]
        k = torch.randn(20, 2, 8, generator=g) * 3
        v = torch.randn(20, 2, 8, generator=g)

        pool.set_kv_buffer(radix_layer(0), loc, k, v)
        quantize(spec, k, k_ours, loc, 16)
        if not torch.equal(k_ours.view(torch.uint8), pool.k_buffer[0].view(torch.uint8)):
            problems.append(f"{dtype}: k bytes differ")
        read = dequantize(spec, pool.k_buffer[0], loc, 16)
        native = pool.get_key_buffer(0)[loc].reshape(20, 16)
        if not torch.equal(read.view(torch.uint8), native.contiguous().view(torch.uint8)):
            problems.append(f"{dtype}: read differs from get_key_buffer")
    return fail_or_pass(problems, "set_kv_buffer K rows identical for bf16/fp16/fp32/e4m3/e5m2")
