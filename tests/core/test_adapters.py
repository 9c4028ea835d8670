"""Adapters over the reference pools: the very native storage, for every layer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import kvcompat
from kvcompat.testing import (
    RecordingLayerCounter,
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
    ReferenceMLATokenToKVPool,
    reference_swa_pool,
)


def same_storage(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.data_ptr() == want.data_ptr(), "data_ptr differs"
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    assert got.stride() == want.stride(), f"strides {got.stride()} != {want.stride()}"
    assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"


def mha(start: int, dtype: torch.dtype = torch.bfloat16, **kw: Any) -> ReferenceMHATokenToKVPool:
    return ReferenceMHATokenToKVPool(
        size=32,
        page_size=16,
        dtype=dtype,
        head_num=2,
        head_dim=8,
        layer_num=3,
        start_layer=start,
        **kw,
    )


def mla(start: int, dtype: torch.dtype = torch.bfloat16) -> ReferenceMLATokenToKVPool:
    return ReferenceMLATokenToKVPool(
        size=32,
        page_size=16,
        dtype=dtype,
        kv_lora_rank=32,
        qk_rope_head_dim=16,
        layer_num=3,
        start_layer=start,
    )


def dsv4(start: int) -> ReferenceDeepSeekV4SingleKVPool:
    return ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64, layer_num=3, start_layer=start)


# (builder, expected key storage, expected value storage) per layer slot
CASES: dict[
    str, tuple[Callable[[int], Any], Callable[[Any, int], Any], Callable[[Any, int], Any]]
] = {
    "mha-bf16": (
        mha,
        lambda p, i: p.k_buffer[i],
        lambda p, i: p.v_buffer[i],
    ),
    "mha-fp8": (
        lambda s: mha(s, torch.float8_e4m3fn),
        lambda p, i: p.k_buffer[i].view(torch.float8_e4m3fn),
        lambda p, i: p.v_buffer[i].view(torch.float8_e4m3fn),
    ),
    "mha-v-dim": (
        lambda s: mha(s, v_head_dim=4),
        lambda p, i: p.k_buffer[i],
        lambda p, i: p.v_buffer[i],
    ),
    "mla-bf16": (
        mla,
        lambda p, i: p.kv_buffer[i],
        lambda p, i: p.kv_buffer[i][..., :32],
    ),
    "mla-fp8": (
        lambda s: mla(s, torch.float8_e4m3fn),
        lambda p, i: p.kv_buffer[i].view(torch.float8_e4m3fn),
        lambda p, i: p.kv_buffer[i][..., :32].view(torch.float8_e4m3fn),
    ),
    "dsv4": (
        dsv4,
        lambda p, i: p.kv_buffer[i].view(torch.float8_e4m3fn),
        lambda p, i: p.kv_buffer[i].view(torch.float8_e4m3fn),
    ),
}


@pytest.mark.parametrize("start", [0, 5])
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_layer_returns_the_native_storage(case: str, start: int) -> None:
    build, want_key, want_value = CASES[case]
    native = build(start)
    pool = kvcompat.adapt(native)
    assert isinstance(pool, kvcompat.KVPoolProtocol)
    assert pool.layer_ids == (start, start + 1, start + 2)
    assert pool.native is native
    for slot, layer in enumerate(pool.layer_ids):
        key = pool.get_key_buffer(layer)
        value = pool.get_value_buffer(layer)
        same_storage(key, want_key(native, slot))
        same_storage(value, want_value(native, slot))
        k, v = pool.get_kv_buffer(layer)
        assert k is key
        assert v is value
        # SGLang's own getter agrees (all of these take the layer_id - start_layer branch)
        same_storage(key, native.get_key_buffer(layer))


@pytest.mark.parametrize(
    ("case", "kind", "shared"),
    [("mha-bf16", "split", False), ("mla-bf16", "latent", True), ("dsv4", "single_kv", True)],
)
def test_kind_and_shared_flag(case: str, kind: str, shared: bool) -> None:
    pool = kvcompat.adapt(CASES[case][0](0))
    assert pool.kind is kvcompat.PoolKind(kind)
    pair = pool.get_kv_buffer(1)
    assert pair.shared is shared
    assert pair.component is None
    assert (pair.key is pair.value) is (kind == "single_kv")


def test_single_kv_never_leaks_not_implemented() -> None:
    native = dsv4(0)
    with pytest.raises(NotImplementedError, match="Use get_key_buffer instead"):
        native.get_kv_buffer(0)
    pool = kvcompat.adapt(native)
    for layer in pool.layer_ids:
        k, v = pool.get_kv_buffer(layer)
        assert k is v is pool.get_value_buffer(layer) is pool.get_key_buffer(layer)


def test_metadata_mirrors_the_native_pool() -> None:
    native = ReferenceMHATokenToKVPool(
        size=48, page_size=16, dtype=torch.float8_e5m2, head_num=1, head_dim=8, layer_num=1
    )
    pool = kvcompat.adapt(native)
    assert (pool.size, pool.page_size, pool.dtype, pool.device) == (
        48,
        16,
        torch.float8_e5m2,
        torch.device("cpu"),
    )
    assert pool.name == "ReferenceMHATokenToKVPool"
    assert dict(pool.components) == {}
    assert pool.component_for(0) is None


def test_getters_allocate_nothing_and_return_identical_objects() -> None:
    pool = kvcompat.adapt(mha(0, torch.float8_e4m3fn))
    first = [pool.get_key_buffer(layer) for layer in pool.layer_ids]
    second = [pool.get_key_buffer(layer) for layer in pool.layer_ids]
    assert all(a is b for a, b in zip(first, second, strict=True))
    assert pool.get_kv_buffer(0) is pool.get_kv_buffer(0)


def test_adapt_is_idempotent_and_never_mutates_the_pool() -> None:
    for build, _, _ in CASES.values():
        native = build(2)
        before = dict(vars(native))
        lists = {name: list(value) for name, value in before.items() if isinstance(value, list)}
        pool = kvcompat.adapt(native)
        for layer in pool.layer_ids:
            pool.get_kv_buffer(layer)
        assert kvcompat.adapt(pool) is pool
        after = vars(native)
        assert after.keys() == before.keys()
        assert all(after[name] is value for name, value in before.items())
        assert all(
            all(a is b for a, b in zip(after[name], items, strict=True))
            for name, items in lists.items()
        )


def test_replaced_buffer_lists_are_followed() -> None:
    native = mha(0)
    pool = kvcompat.adapt(native)
    old = pool.get_key_buffer(0)
    native.k_buffer = [torch.ones_like(b) for b in native.k_buffer]
    native.v_buffer = [torch.ones_like(b) for b in native.v_buffer]
    new = pool.get_key_buffer(0)
    assert new is not old
    same_storage(new, native.k_buffer[0])
    same_storage(pool.get_value_buffer(0), native.v_buffer[0])


class TestWaits:
    """kvcompat's getter performs the native getter's layer-transfer wait."""

    @pytest.mark.parametrize("case", ["mha-bf16", "mla-bf16"])
    def test_same_waits_as_native(self, case: str) -> None:
        native = CASES[case][0](3)
        pool = kvcompat.adapt(native)
        counter = RecordingLayerCounter()
        native.register_layer_transfer_counter(counter)
        for layer in pool.layer_ids:
            native.get_key_buffer(layer)
        native_waits = list(counter.waits)
        counter.waits.clear()
        for layer in pool.layer_ids:
            pool.get_key_buffer(layer)
        assert counter.waits == native_waits == [0, 1, 2]

    def test_wait_false_never_waits(self) -> None:
        native = mha(0)
        counter = RecordingLayerCounter()
        native.register_layer_transfer_counter(counter)
        pool = kvcompat.adapt(native)
        pool.get_key_buffer(1, wait=False)
        pool.get_value_buffer(1, wait=False)
        pool.get_kv_buffer(1, wait=False)
        assert counter.waits == []
        pool.get_kv_buffer(1)
        assert counter.waits == [1]

    def test_single_kv_pool_never_waits_like_native(self) -> None:
        native = dsv4(0)
        counter = RecordingLayerCounter()
        native.register_layer_transfer_counter(counter)
        kvcompat.adapt(native).get_kv_buffer(0)
        assert counter.waits == []

    def test_composite_waits_once_with_the_global_id(self) -> None:
        native = reference_swa_pool()
        counter = RecordingLayerCounter()
        native.register_layer_transfer_counter(counter)
        pool = kvcompat.adapt(native)
        for layer in pool.layer_ids:
            native.get_key_buffer(layer)
        native_waits = list(counter.waits)
        counter.waits.clear()
        for layer in pool.layer_ids:
            pool.get_key_buffer(layer)
        assert counter.waits == native_waits == [0, 1, 2, 3]


class TestComposite:
    def test_routes_each_layer_to_its_component(self) -> None:
        native = reference_swa_pool()
        pool = kvcompat.adapt(native)
        assert pool.kind is kvcompat.PoolKind.COMPOSITE
        assert set(pool.components) == {"full", "swa"}
        for layer, (dense, is_swa) in native.layers_mapping.items():
            sub = native.swa_kv_pool if is_swa else native.full_kv_pool
            part = "swa" if is_swa else "full"
            assert pool.component_for(layer) == part
            pair = pool.get_kv_buffer(layer)
            assert pair.component == part
            same_storage(pair.key, sub.k_buffer[dense])
            same_storage(pair.value, sub.v_buffer[dense])
            same_storage(pair.key, native.get_key_buffer(layer))

    def test_components_are_conformant_pools_with_absolute_ids(self) -> None:
        pool = kvcompat.adapt(reference_swa_pool())
        for name, part in pool.components.items():
            assert isinstance(part, kvcompat.KVPoolProtocol)
            assert part.name == name
            for layer in part.layer_ids:
                assert part.component_for(layer) == name
                assert part.get_key_buffer(layer) is pool.get_key_buffer(layer)
        with pytest.raises(kvcompat.LayerOutOfRangeError, match=r"valid layer ids are \[0, 2\]"):
            pool.components["swa"].get_key_buffer(1)

    def test_leaked_start_layer_is_refused(self) -> None:
        # SGLang trap: start_layer in **kwargs reaches both sub-pools, whose native
        # getters then subtract it from the dense ids the wrapper passes.
        native = reference_swa_pool(start_layer=1)
        assert native.get_key_buffer(0).data_ptr() != native.swa_kv_pool.k_buffer[0].data_ptr()
        with pytest.raises(kvcompat.UnsupportedPoolError, match="start_layer"):
            kvcompat.adapt(native)
