"""read/write through kvcompat on SGLang 0.5.23's own pools: layouts, round trips, and
byte-for-byte agreement with every native writer that runs on CPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _sglang import builders as b
from _sglang.cases import CONFORMANCE_CASES, PoolCase
from _sglang.features import cpu_kernel, pool_class, require_k_only_writer

import kvcompat
from kvcompat.layouts import dequantize, quantize

EXPECTED_LAYOUT = {
    "split": "mha_2x8",
    "key_only": "mha_2x8",
    "latent": "mla_32+16",
    "hybrid_linear": "mha_2x8",
    "swa": "mha_2x8",
}

IO_CASES = [c for c in CONFORMANCE_CASES if c.family != "index"]


def expected_layout(case: PoolCase) -> str:
    if case.family in EXPECTED_LAYOUT:
        return EXPECTED_LAYOUT[case.family]
    if "Uniform" in case.cls_name or "uniform_fp8" in case.id:
        return "uniform_fp8"
    for name in ("v41_fp4_new", "v41_new", "v41_fp4", "v41"):
        if f"-{name}-" in case.id:
            return name
    return "v4"


def dense(
    pool: kvcompat.KVPoolProtocol, layer: int, n: int, seed: int, part: str = "key"
) -> torch.Tensor:
    spec = getattr(pool.layout(layer), part)
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, spec.heads, spec.dim // spec.heads, generator=gen).to(torch.bfloat16)


@pytest.mark.parametrize("case", IO_CASES, ids=[c.id for c in IO_CASES])
def test_layout_is_detected_and_round_trips(case: PoolCase) -> None:
    native = case.build()
    pool = kvcompat.adapt(native)
    for layer in pool.layer_ids:
        layout = pool.layout(layer)
        assert layout.key.name.startswith(expected_layout(case)), (
            f"{case.id} layer {layer}: layout {layout.key.name}, expected {expected_layout(case)}"
        )
        loc = torch.tensor([1, 7, pool.page_size, 2 * pool.page_size - 1])
        key = dense(pool, layer, len(loc), seed=layer)
        value = dense(pool, layer, len(loc), 100 + layer, "value") if layout.value else None
        storage = pool.get_key_buffer(layer, wait=False)
        expect = storage.view(torch.uint8).clone()
        quantize(layout.key, key, expect.view(storage.dtype), loc, pool.page_size)
        pool.write(layer, loc, key, value)
        assert torch.equal(storage.view(torch.uint8), expect), (
            f"{case.id} layer {layer}: stored bytes differ from the {layout.key.name} codec"
        )
        back = pool.read(layer, loc)
        want = dequantize(layout.key, storage, loc, pool.page_size)
        assert torch.equal(back.reshape(len(loc), -1).view(torch.uint8), want.view(torch.uint8))
        if value is not None:
            stored = pool.read_kv(layer, loc).value
            assert torch.equal(stored.float(), value.to(pool.dtype).float()), case.id


@pytest.mark.parametrize(("fp4", "name"), [(False, "dsv4_indexer_fp8"), (True, "dsv4_indexer_fp4")])
def test_indexer_pools_are_read_and_written_with_the_indexer_layouts(fp4: bool, name: str) -> None:
    native = b.build_dsv4_indexer_pool(use_fp4_indexer=fp4)
    pool = kvcompat.adapt(native)
    assert pool.layout(0).key.name == name
    loc = torch.tensor([1, 70])
    keys = torch.randn(2, 1, 128, dtype=torch.bfloat16)
    pool.write(0, loc, keys)
    back = pool.read(0, loc).float()
    assert ((back - keys.float()).abs() <= keys.float().abs().amax() / 4).all()


def test_uniform_fp8_pool_is_detected_by_geometry_not_by_its_v4_label() -> None:
    native = b.build_dsv4_uniform_fp8_pool()
    if hasattr(native, "kv_layout"):  # 0.5.21 on; 0.5.20's class has no layout attribute
        assert native.kv_layout.value == "v4"  # SGLang's attribute says V4 ...
    assert kvcompat.adapt(native).layout(0).key.name == "uniform_fp8"  # ... the bytes are not


def _bytes(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.view(torch.uint8).clone() for t in tensors]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
def test_mha_write_equals_native_set_kv_buffer(dtype: torch.dtype) -> None:
    ours, theirs = b.build_mha_pool(dtype=dtype), b.build_mha_pool(dtype=dtype)
    loc = torch.tensor([3, 17, 40])
    k = torch.randn(3, 2, 8).to(torch.bfloat16)
    v = torch.randn(3, 2, 8).to(torch.bfloat16)

    class Layer:
        layer_id = 1

    theirs.set_kv_buffer(Layer(), loc, k.clone(), v.clone())
    kvcompat.adapt(ours).write(1, loc, k, v)
    mine, native = _bytes(ours.k_buffer + ours.v_buffer), _bytes(theirs.k_buffer + theirs.v_buffer)
    assert all(torch.equal(a, c) for a, c in zip(mine, native, strict=True))


def test_k_only_write_equals_the_minimax_parents_writer() -> None:
    """On every release with the class (0.5.15 on; before 0.5.18 the only native writer):
    kvcompat's write to the K-only sub-pool equals ``MiniMaxSparseKVPool.set_index_k_buffer``
    of the same global layer, whose sub-pool id is the mapped local one."""
    ours, theirs = b.build_minimax_sparse_pool(), b.build_minimax_sparse_pool()
    loc = torch.tensor([0, 5, 63])
    k = torch.randn(3, 1, b.HEAD_DIM).to(torch.bfloat16)
    theirs.set_index_k_buffer(b.radix_layer(3), loc, k.clone())
    local = ours.index_k_layer_id_mapping[3]
    assert local == 1
    adapter = kvcompat.adapt(ours.index_k_pool)
    adapter.write(local, loc, k)
    assert all(
        torch.equal(a, c)
        for a, c in zip(
            _bytes(ours.index_k_pool.k_buffer), _bytes(theirs.index_k_pool.k_buffer), strict=True
        )
    )
    assert torch.equal(adapter.read(local, loc), k)


def test_k_only_write_equals_native_set_k_buffer() -> None:
    ours, theirs = b.build_k_only_pool(), b.build_k_only_pool()
    require_k_only_writer(theirs)
    loc = torch.tensor([0, 5, 63])
    k = torch.randn(3, 2, 8).to(torch.bfloat16)
    theirs.set_k_buffer(1, loc, k.clone())
    kvcompat.adapt(ours).write(1, loc, k)
    assert all(
        torch.equal(a, c)
        for a, c in zip(_bytes(ours.k_buffer), _bytes(theirs.k_buffer), strict=True)
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
def test_mla_write_equals_native_set_mla_kv_buffer(dtype: torch.dtype) -> None:
    ours, theirs = b.build_mla_pool(dtype=dtype), b.build_mla_pool(dtype=dtype)
    loc = torch.tensor([2, 9, 33])  # not the reserved slot 0, which SGLang's writer skips
    nope = torch.randn(3, 1, 32).to(torch.bfloat16)
    rope = torch.randn(3, 1, 16).to(torch.bfloat16)

    class Layer:
        layer_id = 0

    with cpu_kernel("MLATokenToKVPool.set_mla_kv_buffer"):
        theirs.set_mla_kv_buffer(Layer(), loc, nope.clone(), rope.clone())
    kvcompat.adapt(ours).write(0, loc, torch.cat([nope, rope], dim=-1))
    assert all(
        torch.equal(a, c)
        for a, c in zip(_bytes(ours.kv_buffer), _bytes(theirs.kv_buffer), strict=True)
    )


def test_uniform_fp8_write_equals_native_set_key_buffer_fused() -> None:
    ours, theirs = b.build_dsv4_uniform_fp8_pool(), b.build_dsv4_uniform_fp8_pool()
    loc = torch.tensor([1, 64, 127])
    k = (torch.randn(3, 512) * 40).to(torch.bfloat16)
    theirs.set_key_buffer_fused(1, loc, k.clone())
    kvcompat.adapt(ours).write(1, loc, k)
    assert all(
        torch.equal(a, c)
        for a, c in zip(_bytes(ours.kv_buffer), _bytes(theirs.kv_buffer), strict=True)
    )


def test_dsa_fp8_pool_reads_and_writes_the_656_byte_rows() -> None:
    native = pool_class("DSATokenToKVPool")(
        size=64, page_size=64, kv_lora_rank=512, dtype=torch.float8_e4m3fn, qk_rope_head_dim=64,
        layer_num=1, device="cpu", enable_memory_saver=False, index_head_dim=128,
        kv_cache_dim=656,
    )  # fmt: skip
    assert native.dsa_kv_cache_store_fp8
    pool = kvcompat.adapt(native)
    assert pool.layout(0).key.name == "dsa_fp8"
    loc = torch.tensor([3, 70])
    key = torch.randn(2, 1, 576).to(torch.bfloat16)
    pool.write(0, loc, key)
    back = pool.read(0, loc)
    assert back.shape == (2, 1, 576)
    assert (back[..., 512:] == key[..., 512:]).all(), "the bf16 rope part is stored exactly"
    err = (back[..., :512].float() - key[..., :512].float()).abs().max()
    assert err <= key[..., :512].float().abs().max() / 8
    _, v = pool.read_kv(0, loc)
    assert v.shape == (2, 1, 512)


def test_composite_writes_reach_the_routed_sub_pool() -> None:
    native = b.build_dsv4_token_pool()
    pool = kvcompat.adapt(native)
    loc = torch.tensor([5, 300])
    key = torch.randn(2, 1, 512).to(torch.bfloat16)
    before = [t.clone() for t in native.swa_kv_pool.kv_buffer]
    pool.write(1, loc, key)
    changed = [
        i for i, t in enumerate(native.swa_kv_pool.kv_buffer) if not torch.equal(t, before[i])
    ]
    assert changed == [1]
    c4 = pool.components["c4"]
    c4.write(1, torch.tensor([2]), key[:1])
    assert torch.equal(
        c4.read(1, torch.tensor([2])), pool.components["c4"].read(1, torch.tensor([2]))
    )


def test_legacy_pool_without_kv_layout_is_read_as_v4() -> None:
    from _sglang.legacy import build_legacy_dsv4_single_pool

    native: Any = build_legacy_dsv4_single_pool()
    pool = kvcompat.adapt(native)
    assert pool.layout(0).key.name == "v4"
    pool.write(0, torch.tensor([4]), torch.ones(1, 1, 512))
    assert pool.read(0, torch.tensor([4])).float().sum().item() == 512.0


def _layer_groups(pool: kvcompat.KVPoolProtocol) -> list[tuple[int, ...]]:
    """The pool's layers grouped by serving component and byte layout, each group reversed."""
    groups: dict[tuple[object, str], list[int]] = {}
    for layer in pool.layer_ids:
        key = (pool.component_for(layer), repr(pool.layout(layer)))
        groups.setdefault(key, []).append(layer)
    return [tuple(reversed(layers)) for layers in groups.values()]


@pytest.mark.parametrize("case", IO_CASES, ids=[c.id for c in IO_CASES])
def test_multi_layer_calls_equal_one_call_per_layer(case: PoolCase) -> None:
    ours, theirs = kvcompat.adapt(case.build()), kvcompat.adapt(case.build())
    page = ours.page_size
    loc = torch.tensor([2 * page - 1, 1, page, 7])  # pages out of order
    for group in _layer_groups(ours):
        layout = ours.layout(group[0])
        keys = torch.stack([dense(ours, layer, len(loc), seed=layer) for layer in group])
        values = None
        if layout.value is not None:
            values = torch.stack([dense(ours, layer, len(loc), 50 + layer, "value")
                                  for layer in group])  # fmt: skip
        ours.write_layers(group, loc, keys, values)
        for i, layer in enumerate(group):
            theirs.write(layer, loc, keys[i], None if values is None else values[i])
        for layer in group:
            mine = ours.get_key_buffer(layer, wait=False).view(torch.uint8)
            assert torch.equal(mine, theirs.get_key_buffer(layer, wait=False).view(torch.uint8))
            if layout.value is not None:
                mine = ours.get_value_buffer(layer, wait=False).view(torch.uint8)
                want = theirs.get_value_buffer(layer, wait=False).view(torch.uint8)
                assert torch.equal(mine, want), (case.id, layer)
        together = ours.read_layers(group, loc)
        one_by_one = torch.stack([ours.read(layer, loc) for layer in group])
        assert torch.equal(together.view(torch.uint8), one_by_one.view(torch.uint8)), case.id
