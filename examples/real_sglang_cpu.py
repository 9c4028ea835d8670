"""SGLang's own KV pools on a CPU: build them, adapt them, write and read keys by token.

Needs SGLang installed as docs/real-sglang.md says (no GPU). Without sglang it says so and
exits 0.

Run: python examples/real_sglang_cpu.py
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import sys
import tempfile
import warnings
from typing import Any

import torch

import kvcompat
from kvcompat.testing import sglang_cpu

MEMORY_POOL = "sglang.srt.mem_cache.memory_pool"
DSV4_POOL = "sglang.srt.mem_cache.deepseek_v4_memory_pool"


def build_pools() -> dict[str, Any]:
    """MHA, DeepSeek-V4 single, HiSparse and the DeepSeek-V4 composite, on device="cpu"."""
    mha = importlib.import_module(MEMORY_POOL)
    dsv4 = importlib.import_module(DSV4_POOL)
    cpu = {"device": "cpu", "enable_memory_saver": False}
    v4 = {"size": 64, "page_size": 64, "dtype": torch.float8_e4m3fn}
    v4 |= {"qk_nope_head_dim": 448, "qk_rope_head_dim": 64, "layer_num": 2, **cpu}
    pools = {
        "MHATokenToKVPool": mha.MHATokenToKVPool(
            size=64,
            page_size=16,
            dtype=torch.bfloat16,
            head_num=2,
            head_dim=8,
            layer_num=2,
            **cpu,
        ),
        "DeepSeekV4SingleKVPool": dsv4.DeepSeekV4SingleKVPool(**v4),
        "HiSparseC4DevicePool": dsv4.HiSparseC4DevicePool(**v4),
    }
    # The composite reads SGLang's published runtime config, which an offline process has
    # not published: install a CPU one the way SGLang's own tests do, and undo it after.
    from sglang.srt.runtime_context import get_context, get_parallel

    handle = get_context().override_server_args(device="cpu")
    handle.install()
    get_parallel().override_permanently(attn_dcp_rank=0)
    try:
        pools["DeepSeekV4TokenToKVPool"] = dsv4.DeepSeekV4TokenToKVPool(
            max_num_reqs=4,
            swa_size=256,
            c4_size=64,
            c128_size=4,
            c4_state_pool_size=4,
            c128_state_pool_size=4,
            page_size=256,
            swa_page_size=256,
            dtype=torch.float8_e4m3fn,
            c4_state_dtype=torch.float32,
            c128_state_dtype=torch.float32,
            qk_nope_head_dim=448,
            qk_rope_head_dim=64,
            indexer_head_dim=128,
            layer_num=3,
            compression_ratios=[0, 4, 128],
            **cpu,
        )
    finally:
        handle.restore()
        get_parallel().clear_stamp()
    return pools


def round_trip(name: str, pool: kvcompat.KVPoolProtocol) -> None:
    """Write three out-of-order token rows of the last layer and read them back."""
    if pool.kind is kvcompat.PoolKind.COMPOSITE:
        parts = ", ".join(f"{part}: {p.kind.value}" for part, p in pool.components.items())
        print(f"{name:<24} composite, layers {list(pool.layer_ids)}; {parts}")
        round_trip("  .components['swa']", pool.components["swa"])
        return
    layer = pool.layer_ids[-1]
    spec = pool.layout(layer).key
    loc = torch.tensor([9, 2, 5])  # out of order, across pages
    keys = torch.randn(len(loc), spec.dim).to(spec.output_dtype)  # [n, values per token]
    if pool.kind is kvcompat.PoolKind.SPLIT:
        pool.write(layer, loc, keys, -keys)  # split pools take values too
    else:
        pool.write(layer, loc, keys)  # DeepSeek-V4: what native set_kv_buffer cannot do
    error = (pool.read(layer, loc).reshape(keys.shape).float() - keys.float()).abs().max().item()
    key = pool.get_key_buffer(layer, wait=False)
    print(
        f"{name:<24} {pool.kind.value:<9} layout {spec.name:<14} K {tuple(key.shape)} "
        f"{key.dtype}; write+read max error {error:.3g}"
    )


def main() -> int:
    if importlib.util.find_spec("sglang") is None:
        print(
            "skipped: sglang is not installed here. Install it as docs/real-sglang.md says "
            "(pip install --no-deps -r requirements/sglang-cpu.txt), then run this again."
        )
        return 0
    print(sglang_cpu())  # a torchvision import shim, only where no working one imports
    cache = tempfile.mkdtemp(prefix="sglang-cache-")  # SGLang would write ~/.cache/sglang
    os.environ["SGLANG_CACHE_DIR"] = os.environ["SGLANG_JIT_CACHE_DIR"] = cache
    try:
        with warnings.catch_warnings():  # AWQ/GGUF "only CUDA ..." notes on import
            warnings.simplefilter("ignore")
            pools = build_pools()
        torch.manual_seed(0)
        for name, native in pools.items():
            round_trip(name, kvcompat.adapt(native))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
