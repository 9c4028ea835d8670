"""The pre-0.5.23 ``DeepSeekV4SingleKVPool`` test double behaves as survey §4.2 says."""

from __future__ import annotations

import inspect

import pytest
import torch
from _sglang.builders import build_dsv4_single_pool
from _sglang.env import SGLangSession
from _sglang.features import dsv4_pages, release
from _sglang.legacy import (
    LEGACY_BYTES_PER_TOKEN,
    LEGACY_QUANTIZE_BLOCK_SIZE,
    build_legacy_dsv4_single_pool,
    legacy_dsv4_single_pool_class,
    legacy_num_pages,
)


def test_is_a_subclass_of_the_real_class(sglang_session: SGLangSession) -> None:
    real = sglang_session.deepseek_v4_memory_pool.DeepSeekV4SingleKVPool
    cls = legacy_dsv4_single_pool_class()
    assert legacy_dsv4_single_pool_class() is cls, "defined once"
    assert issubclass(cls, real)
    assert "DeepSeekV4SingleKVPool" in [k.__name__ for k in cls.__mro__]
    assert isinstance(build_legacy_dsv4_single_pool(), real)


def test_has_no_kv_layout() -> None:
    native = build_legacy_dsv4_single_pool()
    assert not hasattr(native, "kv_layout")
    assert getattr(native, "kv_layout", None) is None
    with pytest.raises(AttributeError, match="has no attribute 'kv_layout'"):
        _ = native.kv_layout
    assert "kv_layout" not in vars(native)
    # Documented limit: a static probe finds the shadowing property, never a KVLayout.
    assert isinstance(inspect.getattr_static(native, "kv_layout"), property)
    # The pre-KVLayout constructor had no global_page_size either.
    assert not hasattr(native, "global_page_size")


def test_old_constants() -> None:
    native = build_legacy_dsv4_single_pool()
    assert native.quantize_block_size == LEGACY_QUANTIZE_BLOCK_SIZE == 64
    assert native.kv_cache_total_dim == LEGACY_BYTES_PER_TOKEN == 584
    assert native.bytes_per_page_padded == 37440
    assert [tuple(t.shape) for t in native.kv_buffer] == [(2, 37440)] * 2
    assert {t.dtype for t in native.kv_buffer} == {torch.uint8}


@pytest.mark.parametrize(("size", "old", "new"), [(64, 2, 2), (100, 2, 3), (127, 3, 3), (63, 2, 2)])
def test_page_count_formula_differs_from_0_5_23(size: int, old: int, new: int) -> None:
    assert legacy_num_pages(size, 64) == old
    legacy = build_legacy_dsv4_single_pool(size=size)
    current = build_dsv4_single_pool(size=size)
    assert legacy.kv_buffer[0].shape[0] == old, f"legacy pages for size {size}"
    # 0.5.21 on: the new formula; 0.5.12-0.5.20 still allocate the double's page count.
    want = new if dsv4_pages(size, 64) == new and dsv4_pages(100, 64) == 3 else old
    assert current.kv_buffer[0].shape[0] == want, f"[sglang {release()}] pages for size {size}"


def test_get_key_buffer_is_raw_uint8_without_start_layer() -> None:
    native = build_legacy_dsv4_single_pool(start_layer=2, layer_num=2)
    # Served layers 2 and 3 live in kv_buffer[0] and [1]; the getter indexes raw ids.
    assert native.get_key_buffer(0) is native.kv_buffer[0]
    assert native.get_key_buffer(1) is native.kv_buffer[1]
    assert native.get_key_buffer(0).dtype == torch.uint8, "no float8 view"
    with pytest.raises(IndexError, match="list index out of range"):
        native.get_key_buffer(2)
    current = build_dsv4_single_pool(start_layer=2, layer_num=2)
    if current.get_key_buffer(0).dtype == torch.uint8:
        # 0.5.12: the real class *is* what the double models (raw index, no view).
        assert current.get_key_buffer(1) is current.kv_buffer[1]
        with pytest.raises(IndexError, match="list index out of range"):
            current.get_key_buffer(2)
        return
    # From 0.5.13 the real class on the same configuration subtracts start_layer and views.
    assert current.get_key_buffer(2).dtype == torch.float8_e4m3fn
    assert current.get_key_buffer(2).data_ptr() == current.kv_buffer[0].data_ptr()


def test_inherits_the_refusals() -> None:
    native = build_legacy_dsv4_single_pool()
    with pytest.raises(NotImplementedError, match=r"^Use get_key_buffer instead\.$"):
        native.get_value_buffer(0)
    with pytest.raises(NotImplementedError, match=r"^Use get_key_buffer instead\.$"):
        native.get_kv_buffer(0)
    with pytest.raises(NotImplementedError) as info:
        native.set_kv_buffer(None, torch.tensor([1]), None, None)
    assert info.value.args == ()
    with pytest.raises(NotImplementedError, match="does not model writers"):
        native.set_key_buffer_fused(0, torch.tensor([1]), torch.zeros(1, 512))
    with pytest.raises(NotImplementedError, match="does not model writers"):
        native.set_key_buffer(0, torch.tensor([1]), None)


def test_rejects_non_v4_dims_and_non_fp8_dtypes() -> None:
    cls = legacy_dsv4_single_pool_class()
    with pytest.raises(ValueError, match="584 B/token, got 520"):
        cls(64, 64, torch.float8_e4m3fn, 448, 32, 2, "cpu", False)
    with pytest.raises(ValueError, match="store dtype must be uint8"):
        build_legacy_dsv4_single_pool(dtype=torch.bfloat16)
