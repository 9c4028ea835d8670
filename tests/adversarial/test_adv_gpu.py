"""The all-or-nothing guarantees on a CUDA device (skipped without one).

On the GPU each part of a write is one fused Triton kernel; the guarantee there is that
everything -- locations, values, that a kernel serves *every* part -- is checked before the
first launch (docs/atomic-writes.md). These tests pin that, the alias copy and the range
check on device tensors, and that the kernel path and the torch twin store the same bytes
through the adapter.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import kvcompat
from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool, ReferenceMHATokenToKVPool

from ._harness import assert_unchanged, fingerprint, tried

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton"),
]

DEVICE = "cuda"


def _pools() -> list[kvcompat.KVPoolProtocol]:
    return [
        kvcompat.adapt(ReferenceMHATokenToKVPool(256, 16, torch.bfloat16, 2, 64, 2, DEVICE)),
        kvcompat.adapt(ReferenceDeepSeekV4SingleKVPool(256, 64, layer_num=2, device=DEVICE)),
    ]


def _values(pool: kvcompat.KVPoolProtocol, n: int, part: str = "key") -> torch.Tensor:
    spec = getattr(pool.layout(0), part)
    gen = torch.Generator(device=DEVICE).manual_seed(n)
    shape = (n, spec.heads, spec.dim // spec.heads)
    return torch.randn(shape, generator=gen, device=DEVICE).to(torch.bfloat16)


@pytest.mark.parametrize("index", [0, 1], ids=["mha", "dsv4"])
def test_kernel_and_twin_store_the_same_bytes_through_the_adapter(index: int) -> None:
    kernel_pool, twin_pool = _pools()[index], _pools()[index]
    loc = torch.randperm(200, device=DEVICE)[:37]
    key = _values(kernel_pool, 37)
    value = _values(kernel_pool, 37, "value") if kernel_pool.layout(0).value else None
    kernel_pool.write(0, loc, key, value, impl="triton")
    twin_pool.write(0, loc, key, value, impl="torch")
    assert torch.equal(
        kernel_pool.get_key_buffer(0).view(torch.uint8),
        twin_pool.get_key_buffer(0).view(torch.uint8),
    )


def test_a_part_no_kernel_serves_is_refused_before_any_launch() -> None:
    pool = _pools()[0]
    loc = torch.tensor([1, 2], device=DEVICE)
    key = _values(pool, 2)
    before = fingerprint(pool)
    with pytest.raises(kvcompat.KernelUnavailableError, match="bf16, fp16 or fp32"):
        pool.write(0, loc, key, key.double(), impl="triton")  # the value is fp64
    assert_unchanged(before, fingerprint(pool), "fp64 value with impl='triton'")
    tried("bad input")


@pytest.mark.parametrize("impl", ["auto", "triton", "torch"])
def test_aliased_values_and_overflow_on_device(impl: str) -> None:
    pool, twin = _pools()[0], _pools()[0]
    seed_loc = torch.arange(12, device=DEVICE)
    seed = _values(pool, 12)
    for target in (pool, twin):
        target.write(0, seed_loc, seed, seed)
    loc = torch.tensor([4, 5, 6, 0, 1], device=DEVICE)
    rows = pool.get_key_buffer(0)[2:7]
    twin.write(0, loc, rows.clone(), rows.clone(), impl=impl)
    pool.write(0, loc, rows, pool.get_key_buffer(0)[2:7], impl=impl)
    assert torch.equal(pool.get_key_buffer(0), twin.get_key_buffer(0))
    assert torch.equal(pool.get_value_buffer(0), twin.get_value_buffer(0))
    before = fingerprint(pool)
    big = seed[:5].float()
    big[0, 0, 0] = 3.4e38  # beyond bf16: would be stored as inf
    with pytest.raises(kvcompat.WriteError, match="cannot be stored"):
        pool.write(0, loc, big, big, impl=impl)
    assert_unchanged(before, fingerprint(pool), f"overflow, impl={impl}")
    tried("bad input")
