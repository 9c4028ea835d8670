"""The compat proxy: the native method names, working on every pool kind."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from _sglang.builders import radix_layer

import kvcompat
from kvcompat.testing import (
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
    ReferenceMLATokenToKVPool,
    reference_swa_pool,
)


def test_single_kv_calls_that_raise_natively_work_through_the_proxy() -> None:
    native = ReferenceDeepSeekV4SingleKVPool(128, 64, layer_num=2)
    pool = kvcompat.compat(native)
    for call in (native.get_value_buffer, native.get_kv_buffer):
        with pytest.raises(NotImplementedError):
            call(1)
    k, v = pool.get_kv_buffer(1)
    assert k is v is pool.get_value_buffer(1) is pool.get_key_buffer(1)
    assert k.data_ptr() == native.kv_buffer[1].data_ptr()
    keys = torch.randn(3, 1, 512).to(torch.bfloat16)
    before = keys.clone()
    pool.set_kv_buffer(radix_layer(1), torch.tensor([4, 5, 6]), keys, keys)
    assert torch.equal(keys, before)
    back = pool.kvcompat.read(1, torch.tensor([4, 5, 6]))
    assert (back.float() - keys.float()).abs().max() <= keys.float().abs().max() / 16


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_mha_set_kv_buffer_matches_the_native_writer(dtype: torch.dtype) -> None:
    ours = ReferenceMHATokenToKVPool(32, 16, dtype, head_num=2, head_dim=8, layer_num=2)
    theirs = ReferenceMHATokenToKVPool(32, 16, dtype, head_num=2, head_dim=8, layer_num=2)
    loc = torch.tensor([1, 9, 40])
    k = torch.randn(3, 2, 8)
    v = torch.randn(3, 2, 8)
    k_in, v_in = k.clone(), v.clone()
    kvcompat.compat(ours).set_kv_buffer(radix_layer(1), loc, k, v, k_scale=2.0, v_scale=4.0)
    assert torch.equal(k, k_in)  # the proxy never divides the caller's tensors in place
    assert torch.equal(v, v_in)
    theirs.set_kv_buffer(radix_layer(1), loc, k.clone(), v.clone(), k_scale=2.0, v_scale=4.0)
    for mine, native in zip(
        ours.k_buffer + ours.v_buffer, theirs.k_buffer + theirs.v_buffer, strict=True
    ):
        assert torch.equal(mine.view(torch.uint8), native.view(torch.uint8))


def test_mla_set_kv_buffer_ignores_cache_v_like_sglang() -> None:
    ours = ReferenceMLATokenToKVPool(32, 16, kv_lora_rank=32, qk_rope_head_dim=16)
    theirs = ReferenceMLATokenToKVPool(32, 16, kv_lora_rank=32, qk_rope_head_dim=16)
    loc = torch.tensor([2, 3])
    k = torch.randn(2, 1, 48).to(torch.bfloat16)
    junk = torch.randn(2, 1, 32).to(torch.bfloat16)
    kvcompat.compat(ours).set_kv_buffer(radix_layer(0), loc, k, junk)
    theirs.set_kv_buffer(radix_layer(0), loc, k, junk)
    assert torch.equal(ours.kv_buffer[0], theirs.kv_buffer[0])


def test_composite_uses_swa_loc_for_sliding_window_layers() -> None:
    native = reference_swa_pool()
    pool = kvcompat.compat(native)
    k = torch.ones(1, 2, 8, dtype=torch.bfloat16)
    write_loc = SimpleNamespace(loc=torch.tensor([40]), swa_loc=torch.tensor([3]), full_loc=None)
    pool.set_kv_buffer(radix_layer(2), write_loc, k, 2 * k)  # layer 2 is a SWA layer
    assert torch.equal(native.swa_kv_pool.k_buffer[1][3], k[0])
    assert torch.equal(native.swa_kv_pool.v_buffer[1][3], 2 * k[0])
    pool.set_kv_buffer(radix_layer(1), write_loc, k, 3 * k)  # a full layer: loc
    assert torch.equal(native.full_kv_pool.v_buffer[0][40], 3 * k[0])
    no_swa = SimpleNamespace(loc=torch.tensor([5]), swa_loc=None)
    with pytest.raises(kvcompat.WriteError, match="swa_loc"):
        pool.set_kv_buffer(radix_layer(0), no_swa, k, k)


def test_everything_else_passes_through() -> None:
    native = ReferenceMHATokenToKVPool(32, 16, head_num=2, head_dim=8)
    pool = kvcompat.compat(native)
    assert pool.size == 32
    assert pool.k_buffer is native.k_buffer
    assert pool.get_v_head_dim() == 8
    pool.custom_flag = 7
    assert native.custom_flag == 7
    assert kvcompat.compat(pool) is pool
    assert "CompatPool over ReferenceMHATokenToKVPool" in repr(pool)
    with pytest.raises(AttributeError):
        _ = pool.no_such_attribute


def test_bad_inputs() -> None:
    with pytest.raises(kvcompat.UnsupportedPoolError):
        kvcompat.compat(object())
    pool = kvcompat.compat(ReferenceDeepSeekV4SingleKVPool(64, 64))
    with pytest.raises(kvcompat.WriteError, match="layer_id"):
        pool.set_kv_buffer(object(), torch.tensor([1]), torch.zeros(1, 512), None)
    with pytest.raises(kvcompat.LayerOutOfRangeError):
        pool.get_kv_buffer(3)
