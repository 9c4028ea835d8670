"""Adapter read/write over the reference pools: round trips, exact bytes, all-or-nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import kvcompat
from kvcompat.layouts import dequantize, quantize
from kvcompat.testing import (
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
    ReferenceMLATokenToKVPool,
    reference_swa_pool,
)

POOLS: dict[str, Callable[[], Any]] = {
    "mha-bf16": lambda: ReferenceMHATokenToKVPool(
        48, 16, torch.bfloat16, head_num=2, head_dim=8, layer_num=2, start_layer=3
    ),
    "mha-fp8": lambda: ReferenceMHATokenToKVPool(
        48, 16, torch.float8_e4m3fn, head_num=2, head_dim=8, layer_num=2, start_layer=3
    ),
    "mla-bf16": lambda: ReferenceMLATokenToKVPool(
        48, 16, torch.bfloat16, kv_lora_rank=32, qk_rope_head_dim=16, layer_num=2, start_layer=3
    ),
    "dsv4": lambda: ReferenceDeepSeekV4SingleKVPool(128, 64, layer_num=2, start_layer=3),
}


def snapshot(native: Any) -> list[torch.Tensor]:
    """Raw bytes of every per-layer buffer of a reference pool."""
    buffers: list[torch.Tensor] = []
    for attr in ("k_buffer", "v_buffer", "kv_buffer"):
        buffers.extend(buf.view(torch.uint8).clone() for buf in getattr(native, attr, None) or [])
    return buffers


def dense_shape(pool: kvcompat.KVPoolProtocol, layer: int, n: int) -> tuple[int, int, int]:
    spec = pool.layout(layer).key
    return (n, spec.heads, spec.dim // spec.heads)


def capacity(pool: kvcompat.KVPoolProtocol) -> int:
    buf = pool.get_key_buffer(pool.layer_ids[0], wait=False)
    if pool.kind is kvcompat.PoolKind.SINGLE_KV:
        return buf.shape[0] * pool.page_size
    return buf.shape[0]


@pytest.mark.parametrize("name", sorted(POOLS))
@given(data=st.data())
def test_write_then_read_matches_the_codec_and_touches_only_written_tokens(
    name: str, data: st.DataObject
) -> None:
    native = POOLS[name]()
    pool = kvcompat.adapt(native)
    layer = data.draw(st.sampled_from(pool.layer_ids))
    n = data.draw(st.integers(0, 12))
    locs = data.draw(
        st.lists(st.integers(0, capacity(pool) - 1), min_size=n, max_size=n, unique=True)
    )
    loc = torch.tensor(locs, dtype=data.draw(st.sampled_from([torch.int32, torch.int64])))
    seed = data.draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    key = torch.randn(dense_shape(pool, layer, n), generator=gen).to(torch.bfloat16)
    value = (
        torch.randn_like(
            key.float(),
        ).to(torch.bfloat16)
        if pool.kind.value == "split"
        else None
    )
    key_copy = key.clone()

    before = snapshot(native)
    # the expected bytes: the codec applied to a copy of the layer's buffer(s)
    spec = pool.layout(layer)
    expect_k = pool.get_key_buffer(layer).view(torch.uint8).clone()
    quantize(spec.key, key, expect_k.view(pool.get_key_buffer(layer).dtype), loc, pool.page_size)
    pool.write(layer, loc, key, value)
    assert torch.equal(key, key_copy), "write modified the caller's keys"

    after = snapshot(native)
    got_k = pool.get_key_buffer(layer).view(torch.uint8)
    assert torch.equal(got_k, expect_k), f"{name}: written bytes differ from the codec's"
    # every other buffer is untouched; within this one, only the written tokens changed
    changed = [
        i for i, (a, b) in enumerate(zip(before, after, strict=True)) if not torch.equal(a, b)
    ]
    allowed = 2 if value is not None else 1
    assert len(changed) <= allowed, f"{name}: {len(changed)} buffers changed"

    back = pool.read(layer, loc)
    assert back.shape == key.shape
    direct = dequantize(spec.key, pool.get_key_buffer(layer), loc, pool.page_size)
    assert torch.equal(back.reshape(n, spec.key.dim).view(torch.uint8), direct.view(torch.uint8))
    if n:
        bound = key.float().abs().amax() / 16 if name == "dsv4" else 0.0
        if name == "mha-fp8":
            bound = key.float().abs().amax() / 8
        assert (back.float() - key.float()).abs().max() <= bound + 1e-6
    pair = pool.read_kv(layer, loc)
    assert torch.equal(pair.key.view(torch.uint8), back.view(torch.uint8))
    if value is not None:
        assert not pair.shared
        assert torch.equal(pair.value.float(), value.to(pool.dtype).float())
    else:
        assert pair.shared


def test_untouched_bytes_of_a_v4_page() -> None:
    native = ReferenceDeepSeekV4SingleKVPool(128, 64)
    pool = kvcompat.adapt(native)
    native.kv_buffer[0].fill_(0xA5)
    pool.write(0, torch.tensor([0, 63, 64]), torch.randn(3, 1, 512))
    page = native.kv_buffer[0]
    scale_rows = page[:, 64 * 576 : 64 * 584].reshape(page.shape[0], 64, 8)
    assert (scale_rows[:, :, 7] == 0xA5).all(), "the V4 scale pad byte was written"
    assert (page[:, 64 * 584 :] == 0xA5).all(), "page padding was written"
    assert (page[0, 576 : 63 * 576] == 0xA5).all(), "tokens 1..62 were written"
    assert (page[1, 576:][: 63 * 576] == 0xA5).all(), "page 1's other tokens were written"
    assert (scale_rows[0, [0, 63], :7] != 0xA5).all(), "the written tokens' scales were not"


BAD_WRITES: list[
    tuple[str, Callable[[Any, torch.Tensor], tuple[Any, ...]], type[Exception], str]
] = [
    (
        "float loc",
        lambda p, k: (p.layer_ids[0], torch.tensor([1.0]), k[:1]),
        kvcompat.WriteError,
        "loc",
    ),
    (
        "bool loc",
        lambda p, k: (p.layer_ids[0], torch.tensor([True]), k[:1]),
        kvcompat.WriteError,
        "loc",
    ),
    (
        "2-D loc",
        lambda p, k: (p.layer_ids[0], torch.tensor([[1]]), k[:1]),
        kvcompat.WriteError,
        "loc",
    ),
    ("list loc", lambda p, k: (p.layer_ids[0], [1], k[:1]), kvcompat.WriteError, "loc"),
    (
        "negative loc",
        lambda p, k: (p.layer_ids[0], torch.tensor([-1]), k[:1]),
        kvcompat.WriteError,
        "-1",
    ),
    (
        "loc past the end",
        lambda p, k: (p.layer_ids[0], torch.tensor([10**6]), k[:1]),
        kvcompat.WriteError,
        "1000000",
    ),
    (
        "duplicate loc",
        lambda p, k: (p.layer_ids[0], torch.tensor([2, 2]), k[:2]),
        kvcompat.WriteError,
        "repeats",
    ),
    (
        "n mismatch",
        lambda p, k: (p.layer_ids[0], torch.tensor([1, 2]), k[:3]),
        kvcompat.WriteError,
        "must have shape",
    ),
    (
        "int values",
        lambda p, k: (p.layer_ids[0], torch.tensor([1]), k[:1].int()),
        kvcompat.WriteError,
        "floating dtype",
    ),
    (
        "wrong width",
        lambda p, k: (p.layer_ids[0], torch.tensor([1]), k[:1, ..., :-1]),
        kvcompat.WriteError,
        "must have shape",
    ),
    (
        "nan",
        lambda p, k: (
            p.layer_ids[0],
            torch.tensor([1, 2]),
            torch.where(torch.arange(k[:2].numel()).view(k[:2].shape) == 5, float("nan"), k[:2]),
        ),
        kvcompat.WriteError,
        "nan at token 0, column 5",
    ),
    (
        "inf",
        lambda p, k: (p.layer_ids[0], torch.tensor([1]), k[:1] * float("inf")),
        kvcompat.WriteError,
        "inf at token 0",
    ),
    (
        "layer below start",
        lambda p, k: (p.layer_ids[0] - 1, torch.tensor([1]), k[:1]),
        kvcompat.LayerOutOfRangeError,
        "valid layer ids",
    ),
    (
        "bool layer",
        lambda p, k: (True, torch.tensor([1]), k[:1]),
        kvcompat.LayerIdTypeError,
        "got bool True",
    ),
    (
        "not a tensor",
        lambda p, k: (p.layer_ids[0], torch.tensor([1]), [[0.0]]),
        kvcompat.WriteError,
        "torch.Tensor",
    ),
]


@pytest.mark.parametrize("name", sorted(POOLS))
@pytest.mark.parametrize(
    ("case", "make", "error", "match"), BAD_WRITES, ids=[c[0] for c in BAD_WRITES]
)
def test_bad_writes_raise_and_change_nothing(
    name: str, case: str, make: Callable[..., tuple[Any, ...]], error: type[Exception], match: str
) -> None:
    native = POOLS[name]()
    pool = kvcompat.adapt(native)
    key = torch.randn(dense_shape(pool, pool.layer_ids[0], 3)).to(torch.bfloat16)
    args = make(pool, key)
    value = None
    if pool.kind is kvcompat.PoolKind.SPLIT:
        value = torch.ones_like(args[2]) if isinstance(args[2], torch.Tensor) else args[2]
    inputs = [a.clone() for a in args if isinstance(a, torch.Tensor)]
    before = snapshot(native)
    with pytest.raises(error, match=match):
        pool.write(*args, value)
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(native), strict=True))
    assert all(
        torch.equal(a, b) or (a.isnan().any() and torch.equal(a.isnan(), b.isnan()))
        for a, b in zip(inputs, [x for x in args if isinstance(x, torch.Tensor)], strict=True)
    )


def test_split_write_is_all_or_nothing_across_key_and_value() -> None:
    native = POOLS["mha-bf16"]()
    pool = kvcompat.adapt(native)
    key = torch.ones(2, 2, 8, dtype=torch.bfloat16)
    value = key.clone()
    value[1, 0, 0] = float("nan")  # the key is fine; the value is not
    before = snapshot(native)
    with pytest.raises(kvcompat.WriteError, match="value"):
        pool.write(3, torch.tensor([1, 2]), key, value)
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(native), strict=True))
    with pytest.raises(kvcompat.WriteError, match="no value"):
        pool.write(3, torch.tensor([1, 2]), key)


@pytest.mark.parametrize("name", ["mla-bf16", "dsv4"])
def test_value_arguments_on_shared_pools(name: str) -> None:
    pool = kvcompat.adapt(POOLS[name]())
    layer = pool.layer_ids[0]
    key = torch.randn(dense_shape(pool, layer, 2)).to(torch.bfloat16)
    loc = torch.tensor([1, 2])
    pool.write(layer, loc, key, key)  # the key itself is accepted
    if name == "mla-bf16":
        pool.write(layer, loc, key, key[..., :32])  # the value prefix view too
    with pytest.raises(kvcompat.WriteError, match="would be dropped"):
        pool.write(layer, loc, key, key.clone())


def test_nan_policy_check_finite_false_stores_like_sglang() -> None:
    pool = kvcompat.adapt(POOLS["dsv4"]())
    key = torch.zeros(1, 1, 512)
    key[0, 0, 5] = float("nan")
    with pytest.raises(kvcompat.WriteError):
        pool.write(3, torch.tensor([7]), key)
    pool.write(3, torch.tensor([7]), key, check_finite=False)  # stored as SGLang's store does
    assert pool.read(3, torch.tensor([7])).shape == (1, 1, 512)


def test_composite_reads_and_writes_the_primary_component() -> None:
    native = reference_swa_pool()
    pool = kvcompat.adapt(native)
    k = torch.randn(2, 2, 8).to(torch.bfloat16)
    v = torch.randn(2, 2, 8).to(torch.bfloat16)
    loc = torch.tensor([5, 9])  # SWA layer 2: locations in the SWA sub-pool's token space
    pool.write(2, loc, k, v)
    assert torch.equal(native.swa_kv_pool.k_buffer[1][loc], k)
    assert torch.equal(native.swa_kv_pool.v_buffer[1][loc], v)
    pair = pool.read_kv(2, loc)
    assert pair.component == "swa"
    assert torch.equal(pair.value, v)
    assert pool.layout(2).key.name == "mha_2x8_bf16"


def test_read_validates_locations() -> None:
    pool = kvcompat.adapt(POOLS["dsv4"]())
    with pytest.raises(ValueError, match="loc"):
        pool.read(3, torch.tensor([1.5]))
    with pytest.raises(ValueError, match="10000"):
        pool.read(3, torch.tensor([10000]))
