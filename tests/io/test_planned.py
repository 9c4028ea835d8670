"""Plain-row reads and writes through the buffer plans (issue 36): same bytes, same errors.

An adapter keeps one :class:`kvcompat._ops.BufferPlan` per layer and buffer of plain rows
(MHA, MLA) on the layer's ``LayerLayout``; these tests check that reads and writes through
it give exactly what the general path gives, that a plan never outlives the memory it was
made for, and how little Python a small call runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

import kvcompat
from kvcompat import _ops
from kvcompat.layouts import dequantize, quantize
from kvcompat.testing import ReferenceMHATokenToKVPool, ReferenceMLATokenToKVPool

POOLS: dict[str, Callable[[], Any]] = {
    "mha-bf16": lambda: ReferenceMHATokenToKVPool(
        64, 16, torch.bfloat16, head_num=2, head_dim=8, layer_num=2, start_layer=3
    ),
    "mha-fp8": lambda: ReferenceMHATokenToKVPool(
        64, 16, torch.float8_e4m3fn, head_num=2, head_dim=8, layer_num=2, start_layer=3
    ),
    "mla-bf16": lambda: ReferenceMLATokenToKVPool(
        64, 16, torch.bfloat16, kv_lora_rank=32, qk_rope_head_dim=16, layer_num=2, start_layer=3
    ),
}
LAYER = 4  # start_layer 3: the second layer


def _values(pool: kvcompat.KVPoolProtocol, n: int, seed: int) -> torch.Tensor:
    spec = pool.layout(LAYER).key
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, spec.heads, spec.dim // spec.heads, generator=gen).to(torch.bfloat16)


@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize("name", sorted(POOLS))
def test_planned_calls_match_the_general_path_byte_for_byte(name: str, validate: bool) -> None:
    native = POOLS[name]()
    pool = kvcompat.adapt(native)
    lay = pool.layout(LAYER)
    loc = torch.tensor([70, 3, 41, 18], dtype=torch.int32)  # out of order, int32
    keys = _values(pool, 4, seed=1)
    values = _values(pool, 4, seed=2) if lay.value is not None else None
    pool.write(LAYER, loc, keys, values, validate=validate)
    key_buf = pool.get_key_buffer(LAYER, wait=False)
    assert lay._plan_for("key", lay.key, key_buf, pool.page_size) is not None  # the plan served
    expected = key_buf.clone()
    quantize(lay.key, keys, expected, loc, pool.page_size)  # the general twin's bytes
    assert torch.equal(key_buf.view(torch.uint8), expected.view(torch.uint8))
    got = pool.read(LAYER, loc, validate=validate)
    want = dequantize(lay.key, key_buf, loc, pool.page_size)
    assert torch.equal(got.reshape(4, -1).view(torch.uint8), want.view(torch.uint8))
    out = torch.empty_like(got)
    assert pool.read(LAYER, loc, out=out, validate=validate) is out
    assert torch.equal(out, got)
    if values is not None:
        k, v = pool.read_kv(LAYER, loc, validate=validate)
        assert torch.equal(k, got)
        value_buf = pool.get_value_buffer(LAYER, wait=False)
        want_v = dequantize(lay.value, value_buf, loc, pool.page_size)  # type: ignore[arg-type]
        assert torch.equal(v.reshape(4, -1).view(torch.uint8), want_v.view(torch.uint8))


@pytest.mark.parametrize("name", sorted(POOLS))
def test_a_plan_never_outlives_its_memory(name: str) -> None:
    native = POOLS[name]()
    pool = kvcompat.adapt(native)
    loc = torch.tensor([5, 9])
    keys = _values(pool, 2, seed=3)
    values = _values(pool, 2, seed=4) if pool.layout(LAYER).value is not None else None
    pool.write(LAYER, loc, keys, values)
    first = pool.read(LAYER, loc)
    # The same tensor object moved onto other memory: the plan's views would read the old.
    key_buf = pool.get_key_buffer(LAYER, wait=False)
    moved = torch.zeros_like(key_buf)
    key_buf.set_(moved.untyped_storage(), 0, key_buf.shape, key_buf.stride())
    assert torch.count_nonzero(pool.read(LAYER, loc).float()) == 0
    pool.write(LAYER, loc, keys, values)
    assert torch.equal(pool.read(LAYER, loc), first)
    assert torch.equal(moved.view(torch.uint8), key_buf.view(torch.uint8))  # stored there
    # A replaced buffer (a new tensor in the native list) gets a new plan.
    attr = "kv_buffer" if hasattr(native, "kv_buffer") else "k_buffer"
    getattr(native, attr)[1] = torch.zeros_like(getattr(native, attr)[1])
    assert torch.count_nonzero(pool.read(LAYER, loc).float()) == 0


def test_errors_through_the_plan_are_the_general_paths() -> None:
    pool = kvcompat.adapt(POOLS["mha-bf16"]())
    keys, values = _values(pool, 2, seed=5), _values(pool, 2, seed=6)
    pool.write(LAYER, torch.tensor([1, 2]), keys, values)  # plans made
    with pytest.raises(kvcompat.WriteError, match=r"writing the key: loc repeats 1 location"):
        pool.write(LAYER, torch.tensor([7, 7]), keys, values)
    bad_shape = r"writing the value: values for layout .* must have shape"
    with pytest.raises(kvcompat.WriteError, match=bad_shape):
        pool.write(LAYER, torch.tensor([7, 8]), keys, values[:1])
    with pytest.raises(kvcompat.LayoutError, match=r"outside \[0, 80\)"):
        pool.read(LAYER, torch.tensor([80]))
    with pytest.raises(kvcompat.ImplError, match="impl must be"):
        pool.read(LAYER, torch.tensor([1]), impl="cuda")  # type: ignore[arg-type]
    assert torch.count_nonzero(pool.read(LAYER, torch.tensor([7, 8])).float()) == 0


@contextmanager
def _counting() -> Iterator[list[int]]:
    count = [0]

    def profile(_frame: Any, event: str, _arg: Any) -> None:
        if event in ("call", "c_call"):
            count[0] += 1

    sys.setprofile(profile)
    try:
        yield count
    finally:
        sys.setprofile(None)


@pytest.mark.parametrize(
    ("call", "most"),
    [("read", 40), ("read validated", 55), ("write", 125), ("write validated", 165)],
)
def test_a_small_call_runs_little_python(call: str, most: int) -> None:
    """Python and C calls per 8-token MHA read/write (issue 36 measured ~250 for a write)."""
    pool = kvcompat.adapt(POOLS["mha-bf16"]())
    loc = torch.arange(8) * 7
    keys, values = _values(pool, 8, seed=7), _values(pool, 8, seed=8)
    validate = call.endswith("validated")

    def run() -> object:
        if call.startswith("read"):
            return pool.read(LAYER, loc, validate=validate)
        return pool.write(LAYER, loc, keys, values, validate=validate)

    run()  # plans made, choices logged
    with _counting() as count:
        run()
    assert count[0] <= most, count[0]
    assert isinstance(pool.layout(LAYER)._plans.get("key"), _ops.BufferPlan)
