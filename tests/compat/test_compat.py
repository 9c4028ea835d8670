"""The compat proxy on kvcompat's reference pools: native tensors where they are token rows,
logical views over packed storage, a transparent proxy type (the real tier repeats all of this
on SGLang's own classes, in tests/real/test_compat_real.py and test_backends_real.py)."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _sglang.builders import radix_layer
from hypothesis import given
from hypothesis import strategies as st
from torch.nn import functional

import kvcompat
from kvcompat.compat import CompatPool, CompatViewError, LogicalView
from kvcompat.inspection import describe, memory_report, transfer_descriptors
from kvcompat.testing import (
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
    ReferenceMLATokenToKVPool,
    ReferenceSWAKVPool,
    reference_swa_pool,
)


def _v4(layer_num: int = 2) -> ReferenceDeepSeekV4SingleKVPool:
    return ReferenceDeepSeekV4SingleKVPool(128, 64, layer_num=layer_num)


def _rows(n: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 512, generator=gen).to(torch.bfloat16)


def test_single_kv_getters_return_logical_views_over_the_native_storage() -> None:
    native = _v4()
    pool = kvcompat.compat(native)
    for call in (native.get_value_buffer, native.get_kv_buffer):
        with pytest.raises(NotImplementedError):
            call(1)
    k, v = pool.get_kv_buffer(1)
    assert k is v is pool.get_value_buffer(1) is pool.get_key_buffer(1)
    assert isinstance(k, LogicalView)
    assert isinstance(k, torch.Tensor)
    assert k.shape == (native.kv_buffer[1].shape[0] * 64, 1, 512)  # tokens, not page bytes
    assert k.dtype == torch.bfloat16  # the V4 layout's output dtype
    assert pool.get_value_buffer(1).shape[-1] == 512  # SGLang #30340's v_head_dim probe
    assert k.storage_tensor is pool.kvcompat.get_key_buffer(1)
    assert k.storage_tensor.data_ptr() == native.kv_buffer[1].data_ptr()
    assert pool.get_kv_buffer(1).shared


def test_set_kv_buffer_then_gather_returns_kvcompats_read() -> None:
    pool = kvcompat.compat(_v4())
    keys = _rows(3)
    before = keys.clone()
    loc = torch.tensor([4, 5, 70])
    pool.set_kv_buffer(radix_layer(1), loc, keys, keys)
    assert torch.equal(keys, before)  # the caller's tensors are never touched
    dense = pool.kvcompat.read(1, loc)
    view = pool.get_key_buffer(1)
    assert torch.equal(view[loc], dense)
    assert (dense.float() - keys.float()).abs().max() <= keys.float().abs().max() / 16


def test_every_gather_form_equals_the_key_first_read() -> None:
    pool = kvcompat.compat(_v4())
    adapter = pool.kvcompat
    every = torch.arange(192)
    adapter.write(0, every, _rows(192, seed=1))
    view = pool.get_key_buffer(0)
    loc = torch.tensor([7, 3, 3, 150])
    dense = adapter.read(0, loc)
    assert torch.equal(view[loc], dense)
    assert torch.equal(view[loc.to(torch.int32)], dense)  # SGLang's req_to_token is int32
    assert torch.equal(view[loc.tolist()], dense)
    assert torch.equal(view.index_select(0, loc), dense)
    assert torch.equal(torch.index_select(view, 0, loc), dense)
    assert torch.equal(view[loc.view(2, 2)], dense.view(2, 2, 1, 512))
    assert torch.equal(view[loc, 0], dense[:, 0])
    assert torch.equal(view[loc, :, :448], dense[..., :448])
    assert torch.equal(view[10:14], adapter.read(0, torch.arange(10, 14)))
    assert torch.equal(view[::64], adapter.read(0, torch.tensor([0, 64, 128])))
    assert torch.equal(view[9], adapter.read(0, torch.tensor([9]))[0])
    assert torch.equal(view[-1], adapter.read(0, torch.tensor([191]))[0])
    mask = torch.zeros(192, dtype=torch.bool)
    mask[[2, 9]] = True
    assert torch.equal(view[mask], adapter.read(0, torch.tensor([2, 9])))
    assert view[torch.tensor([], dtype=torch.long)].shape == (0, 1, 512)
    assert torch.equal(view[:], adapter.read(0, every))


def test_index_assignment_quantizes_like_write_and_failed_writes_change_nothing() -> None:
    ours, theirs = _v4(), _v4()
    view = kvcompat.compat(ours).get_key_buffer(1)
    keys = _rows(4, seed=2)
    loc = torch.tensor([1, 64, 65, 127])
    view[loc] = keys
    kvcompat.adapt(theirs).write(1, loc, keys)
    assert torch.equal(ours.kv_buffer[1].view(torch.uint8), theirs.kv_buffer[1].view(torch.uint8))
    view[3:5] = keys[:2]
    assert torch.equal(view[3:5], view[torch.tensor([1, 64])])
    before = ours.kv_buffer[1].view(torch.uint8).clone()
    bad = keys.clone()
    bad[2, 0, 5] = float("nan")
    with pytest.raises(kvcompat.WriteError):
        view[torch.tensor([8, 9, 10, 11])] = bad
    with pytest.raises(kvcompat.WriteError):
        view[torch.tensor([8, 8])] = keys[:2]  # duplicate locations
    assert torch.equal(ours.kv_buffer[1].view(torch.uint8), before)


@given(
    locs=st.lists(st.integers(0, 191), min_size=1, max_size=12, unique=True),
    seed=st.integers(0, 2**16),
    layer=st.sampled_from([0, 1]),
)
def test_view_round_trip_is_the_adapters_round_trip(locs: list[int], seed: int, layer: int) -> None:
    ours, theirs = _v4(), _v4()
    loc = torch.tensor(locs)
    keys = _rows(len(locs), seed=seed)
    view = kvcompat.compat(ours).get_key_buffer(layer)
    view[loc] = keys
    kvcompat.adapt(theirs).write(layer, loc, keys)
    for a, b in zip(ours.kv_buffer, theirs.kv_buffer, strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    assert torch.equal(view[loc], kvcompat.adapt(theirs).read(layer, loc))


_REFUSED: list[tuple[str, Callable[[Any], Any]]] = [
    ("Tensor.data_ptr()", lambda v: v.data_ptr()),
    ("Tensor.view()", lambda v: v.view(v.shape[0], -1)),
    ("Tensor.stride()", lambda v: v.stride()),
    ("Tensor.contiguous()", lambda v: v.contiguous()),
    ("Tensor.untyped_storage()", lambda v: v.untyped_storage()),
    ("Tensor.float()", lambda v: v.float()),
    ("Tensor.to()", lambda v: v.to(torch.bfloat16)),
    ("Tensor.add()", lambda v: v + 1),
    ("torch.add", lambda v: torch.add(v, 1)),
    ("aten.add", lambda v: torch.ops.aten.add(v, 1)),
    ("scaled_dot_product_attention", lambda v: functional.scaled_dot_product_attention(v, v, v)),
    ("Tensor.movedim()", lambda v: v.movedim(0, 1)),
    ("index the token rows first", lambda v: v[..., :3]),
    ("partial-row write", lambda v: v.__setitem__((torch.tensor([1]), 0), torch.ones(1, 512))),
    ("index_select(", lambda v: v.index_select(2, torch.tensor([1]))),
]


@pytest.mark.parametrize(("name", "use"), _REFUSED, ids=[n for n, _ in _REFUSED])
def test_any_other_use_raises_a_clear_error(name: str, use: Callable[[Any], Any]) -> None:
    view = kvcompat.compat(_v4()).get_key_buffer(0)
    with pytest.raises(CompatViewError) as info:
        use(view)
    message = str(info.value)
    assert name in message
    assert "'v4' layout (584 bytes per token)" in message
    assert "pool.kvcompat.read_kv(0, loc)" in message
    assert "view.storage_tensor" in message


def test_metadata_answers_logically_and_repr_names_the_layout() -> None:
    view = kvcompat.compat(_v4()).get_key_buffer(1)
    assert (view.dim(), view.ndim, len(view), view.size(-1), view.numel()) == (
        3,
        3,
        192,
        512,
        192 * 512,
    )
    assert view.device == torch.device("cpu")
    assert "layout='v4'" in repr(view)
    assert f"{view}" == repr(view)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_mha_getters_are_the_native_tensors_and_the_writer_matches(dtype: torch.dtype) -> None:
    ours = ReferenceMHATokenToKVPool(32, 16, dtype, head_num=2, head_dim=8, layer_num=2)
    theirs = ReferenceMHATokenToKVPool(32, 16, dtype, head_num=2, head_dim=8, layer_num=2)
    pool = kvcompat.compat(ours)
    for layer in (0, 1):
        assert pool.get_key_buffer(layer) is pool.kvcompat.get_key_buffer(layer)
        assert pool.get_value_buffer(layer) is pool.kvcompat.get_value_buffer(layer)
        assert pool.get_kv_buffer(layer) is pool.kvcompat.get_kv_buffer(layer)
        assert not isinstance(pool.get_key_buffer(layer), LogicalView)
    loc = torch.tensor([1, 9, 40])
    k = torch.randn(3, 2, 8)
    v = torch.randn(3, 2, 8)
    k_in, v_in = k.clone(), v.clone()
    pool.set_kv_buffer(radix_layer(1), loc, k, v, k_scale=2.0, v_scale=4.0)
    assert torch.equal(k, k_in)  # the proxy never divides the caller's tensors in place
    assert torch.equal(v, v_in)
    theirs.set_kv_buffer(radix_layer(1), loc, k.clone(), v.clone(), k_scale=2.0, v_scale=4.0)
    for mine, native in zip(
        ours.k_buffer + ours.v_buffer, theirs.k_buffer + theirs.v_buffer, strict=True
    ):
        assert torch.equal(mine.view(torch.uint8), native.view(torch.uint8))


def test_plain_mla_rows_stay_native_and_set_kv_buffer_ignores_cache_v() -> None:
    ours = ReferenceMLATokenToKVPool(32, 16, kv_lora_rank=32, qk_rope_head_dim=16)
    theirs = ReferenceMLATokenToKVPool(32, 16, kv_lora_rank=32, qk_rope_head_dim=16)
    pool = kvcompat.compat(ours)
    assert pool.get_key_buffer(0) is pool.kvcompat.get_key_buffer(0)
    assert pool.get_value_buffer(0).shape[-1] == 32
    loc = torch.tensor([2, 3])
    k = torch.randn(2, 1, 48).to(torch.bfloat16)
    junk = torch.randn(2, 1, 32).to(torch.bfloat16)
    pool.set_kv_buffer(radix_layer(0), loc, k, junk)
    theirs.set_kv_buffer(radix_layer(0), loc, k, junk)
    assert torch.equal(ours.kv_buffer[0], theirs.kv_buffer[0])


def test_the_proxy_is_the_native_class_and_kvcompat_sees_through_it() -> None:
    native = _v4()
    pool = kvcompat.compat(native)
    assert isinstance(pool, ReferenceDeepSeekV4SingleKVPool)
    assert isinstance(pool, CompatPool)
    assert type(pool) is type(kvcompat.compat(_v4()))  # one proxy type per native class
    assert kvcompat.is_single_kv_pool(pool)
    assert kvcompat.pool_kind(pool) is kvcompat.PoolKind.SINGLE_KV
    assert kvcompat.adapt(pool) is pool.kvcompat
    assert kvcompat.compat(pool) is pool
    assert CompatPool(native).kvcompat.native is native
    assert describe(pool).to_dict() == describe(native).to_dict()
    assert memory_report(pool) == memory_report(native)
    assert transfer_descriptors(pool) == transfer_descriptors(native)
    assert "CompatPool over ReferenceDeepSeekV4SingleKVPool" in repr(pool)


def test_state_is_shared_with_the_native_pool_which_is_never_modified() -> None:
    native = ReferenceMHATokenToKVPool(32, 16, head_num=2, head_dim=8)
    names = set(vars(native))
    pool = kvcompat.compat(native)
    assert set(vars(native)) == names  # creating the proxy adds nothing to the pool
    assert type(native) is ReferenceMHATokenToKVPool
    assert pool.size == 32
    assert pool.k_buffer is native.k_buffer
    assert pool.get_v_head_dim() == 8  # a native method, run on the proxy
    pool.custom_flag = 7
    assert native.custom_flag == 7
    with pytest.raises(AttributeError):
        _ = pool.no_such_attribute


def test_composite_routes_kv_write_loc_and_refuses_a_plain_loc_on_swa_layers() -> None:
    native = reference_swa_pool()
    assert isinstance(kvcompat.compat(native), ReferenceSWAKVPool)
    pool = kvcompat.compat(native)
    k = torch.ones(1, 2, 8, dtype=torch.bfloat16)
    write_loc = SimpleNamespace(loc=torch.tensor([40]), swa_loc=torch.tensor([3]), full_loc=None)
    pool.set_kv_buffer(radix_layer(2), write_loc, k, 2 * k)  # layer 2 is a SWA layer
    assert torch.equal(native.swa_kv_pool.k_buffer[1][3], k[0])
    assert torch.equal(native.swa_kv_pool.v_buffer[1][3], 2 * k[0])
    pool.set_kv_buffer(radix_layer(1), write_loc, k, 3 * k)  # a full layer: loc
    assert torch.equal(native.full_kv_pool.v_buffer[0][40], 3 * k[0])
    before = [t.clone() for t in native.swa_kv_pool.k_buffer + native.swa_kv_pool.v_buffer]
    for loc in (SimpleNamespace(loc=torch.tensor([5]), swa_loc=None), torch.tensor([5])):
        with pytest.raises(kvcompat.WriteError, match="swa_loc"):
            pool.set_kv_buffer(radix_layer(0), loc, k, k)
    after = native.swa_kv_pool.k_buffer + native.swa_kv_pool.v_buffer
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_bad_inputs() -> None:
    with pytest.raises(kvcompat.UnsupportedPoolError):
        kvcompat.compat(object())
    pool = kvcompat.compat(ReferenceDeepSeekV4SingleKVPool(64, 64))
    with pytest.raises(kvcompat.WriteError, match="layer_id"):
        pool.set_kv_buffer(object(), torch.tensor([1]), torch.zeros(1, 512), None)
    with pytest.raises(kvcompat.LayerOutOfRangeError):
        pool.get_kv_buffer(3)
    view = pool.get_key_buffer(0)
    with pytest.raises(IndexError, match="out of range"):
        _ = view[500]
    with pytest.raises(kvcompat.LayoutError, match="outside"):
        _ = view[torch.tensor([500])]
    with pytest.raises(CompatViewError, match="float32 index"):
        _ = view[torch.tensor([1.0])]


def test_a_leaf_pool_writes_kv_write_loc_loc_and_ignores_full_loc() -> None:
    # full_loc is a composite's full-attention sub-pool location (SGLang's leaves ignore it).
    native = ReferenceMHATokenToKVPool(64, 16)
    pool = kvcompat.compat(native)
    k = torch.ones(1, *native.k_buffer[0].shape[1:], dtype=native.k_buffer[0].dtype)
    write_loc = SimpleNamespace(loc=torch.tensor([7]), swa_loc=None, full_loc=torch.tensor([9]))
    pool.set_kv_buffer(radix_layer(0), write_loc, k, 2 * k)
    assert torch.equal(native.k_buffer[0][7], k[0])
    assert not native.k_buffer[0][9].any()
