"""Gather the top-k tokens of a DeepSeek-V4 pool every layer, as a sparse-attention step does.

The same code runs anywhere: on a CUDA device (with triton installed) ``read`` takes the
fused Triton gather-dequantize kernel, and with a pre-allocated ``out`` and
``validate=False`` the whole multi-layer gather is captured in one CUDA graph and
replayed for new token indices; on a CPU it takes the pure-torch twin, which returns the
same bytes.

Run: python examples/sparse_gather.py
"""

from __future__ import annotations

import torch

import kvcompat
from kvcompat.kernels import is_available
from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool

POOL_TOKENS, LAYERS, TOP_K = 4096, 4, 512


def fill(pool: kvcompat.KVPoolProtocol, device: str) -> torch.Tensor:
    """Write random keys for every token of every layer; return them (bf16)."""
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(LAYERS, POOL_TOKENS, 1, 512, generator=g).to(torch.bfloat16).to(device)
    every = torch.arange(POOL_TOKENS, device=device)
    for layer in pool.layer_ids:
        pool.write(layer, every, keys[layer])  # quantizing write: DSv4's set_kv_buffer
    return keys


def main() -> None:
    device = "cuda" if torch.cuda.is_available() and is_available() else "cpu"
    native = ReferenceDeepSeekV4SingleKVPool(
        size=POOL_TOKENS, page_size=64, layer_num=LAYERS, device=device
    )
    pool = kvcompat.adapt(native)
    keys = fill(pool, device)

    # One buffer per layer, allocated once: the gather itself allocates nothing.
    top_k = torch.randperm(POOL_TOKENS, device=device)[:TOP_K]
    outs = [torch.empty(TOP_K, 1, 512, dtype=torch.bfloat16, device=device) for _ in range(LAYERS)]

    def gather() -> None:
        for layer in pool.layer_ids:
            pool.read(layer, top_k, out=outs[layer], wait=False, validate=False)

    gather()  # on a GPU this also compiles the kernel, outside any capture
    if device == "cuda":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            gather()
        top_k.copy_(torch.randperm(POOL_TOKENS, device=device)[:TOP_K])  # the next step's picks
        graph.replay()
        torch.cuda.synchronize()
        how = "Triton kernel, one CUDA graph replayed for new indices"
    else:
        how = "pure-torch twin (no CUDA device with triton here)"

    # Every gathered row is its token's key up to V4's fp8 rounding (2**-4 relative + a
    # tiny absolute term per 64-value tile); the twin checks the kernel byte for byte.
    worst = 0.0
    for layer in pool.layer_ids:
        want = keys[layer][top_k].float()
        got = outs[layer].float()
        assert torch.equal(outs[layer], pool.read(layer, top_k, impl="torch"))
        worst = max(worst, float(((got - want).abs() / (want.abs() + 1e-2)).max()))
    print(f"device {device}: gathered {TOP_K} of {POOL_TOKENS} tokens x {LAYERS} layers ({how})")
    print(f"equal to the torch twin byte for byte; worst relative error vs the keys {worst:.4f}")


if __name__ == "__main__":
    main()
