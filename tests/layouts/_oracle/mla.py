"""Oracle of the MLA row layouts: ``MLATokenToKVPool``'s own writes and getters."""

from __future__ import annotations

import torch

from _oracle._common import (
    Result,
    check,
    fail_or_pass,
)
from kvcompat.layouts import (
    dequantize,
    mla_layout,
    quantize,
)


@check(
    code="`MLATokenToKVPool.set_mla_kv_buffer`, `get_key_buffer`", compared="bf16 and e4m3fn pools"
)
def mla_pool_store() -> Result:
    from _sglang.builders import build_mla_pool, radix_layer
    from _sglang.features import cpu_kernel

    problems = []
    for dtype in (torch.bfloat16, torch.float8_e4m3fn):
        pool = build_mla_pool(dtype=dtype, layer_num=1)  # 64 tokens, page 16, rank 32 + rope 16
        spec = mla_layout(32, 16, dtype)
        ours = pool.kv_buffer[0].clone()
        g = torch.Generator().manual_seed(10)
        loc = 1 + torch.randperm(79, generator=g)[:20]  # slot 0 is skipped by SGLang
        rows = torch.randn(20, 1, 48, generator=g).to(torch.bfloat16)

        with cpu_kernel("MLATokenToKVPool.set_mla_kv_buffer"):
            pool.set_mla_kv_buffer(radix_layer(0), loc, rows[..., :32], rows[..., 32:])
        quantize(spec, rows, ours, loc, 16)
        if not torch.equal(ours.view(torch.uint8), pool.kv_buffer[0].view(torch.uint8)):
            problems.append(f"{dtype}: set_mla_kv_buffer bytes differ")
        read = dequantize(spec, pool.kv_buffer[0], loc, 16)
        native = pool.get_key_buffer(0)[loc].reshape(20, 48)
        if not torch.equal(read.view(torch.uint8), native.contiguous().view(torch.uint8)):
            problems.append(f"{dtype}: read differs from get_key_buffer")
    return fail_or_pass(problems, "set_mla_kv_buffer rows identical for bf16 and e4m3")
