"""Detectors: pools, classes and adapters; subclasses; no getters called; thread safety."""

from __future__ import annotations

import sys
import threading
import types
from typing import Any

import pytest

import kvcompat
from kvcompat import _registry
from kvcompat.testing import (
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
    ReferenceMLATokenToKVPool,
    ReferenceSWAKVPool,
    reference_swa_pool,
)

DETECTORS = {
    "single_kv": kvcompat.is_single_kv_pool,
    "split": kvcompat.is_split_kv_pool,
    "latent": kvcompat.is_latent_pool,
    "key_only": kvcompat.is_key_only_pool,
    "composite": kvcompat.is_composite_pool,
}


def instances() -> dict[str, Any]:
    return {
        "split": ReferenceMHATokenToKVPool(size=16, page_size=16, layer_num=1),
        "latent": ReferenceMLATokenToKVPool(size=16, page_size=16, layer_num=1),
        "single_kv": ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64),
        "composite": reference_swa_pool(),
    }


@pytest.mark.parametrize("form", ["instance", "class", "adapter"])
def test_every_form_gets_the_same_answer(form: str) -> None:
    for kind, native in instances().items():
        obj = {"instance": native, "class": type(native), "adapter": kvcompat.adapt(native)}[form]
        assert kvcompat.pool_kind(obj) is kvcompat.PoolKind(kind)
        assert kvcompat.is_supported_pool(obj)
        for name, detector in DETECTORS.items():
            assert detector(obj) is (name == kind), (form, kind, name)


def test_subclasses_are_recognised() -> None:
    class HiSparseLike(ReferenceDeepSeekV4SingleKVPool):
        pass

    class Deeper(HiSparseLike):
        pass

    assert kvcompat.is_single_kv_pool(Deeper)
    pool = kvcompat.adapt(Deeper(size=64, page_size=64, layer_num=2))
    assert pool.kind is kvcompat.PoolKind.SINGLE_KV


def test_unknown_objects() -> None:
    for obj in (None, 3, "pool", object(), object, [ReferenceMHATokenToKVPool]):
        assert kvcompat.pool_kind(obj) is None
        assert not any(detector(obj) for detector in DETECTORS.values())
        assert not kvcompat.is_supported_pool(obj)


class Tripwire:
    """Every dynamic attribute access or getter call fails the test."""

    def __getattr__(self, name: str) -> Any:
        pytest.fail(f"detector touched attribute {name!r}")

    @property
    def kind(self) -> Any:
        pytest.fail("detector evaluated a property")

    def get_key_buffer(self, layer_id: int) -> Any:
        pytest.fail("detector called a getter")

    get_value_buffer = get_kv_buffer = get_key_buffer


def test_detectors_never_touch_dynamic_attributes_or_getters() -> None:
    obj = Tripwire()
    assert kvcompat.pool_kind(obj) is None
    assert not kvcompat.is_single_kv_pool(obj)
    assert kvcompat.pool_kind(Tripwire) is None


def test_getters_of_recognised_pools_are_not_called() -> None:
    calls: list[str] = []

    class Instrumented(ReferenceDeepSeekV4SingleKVPool):
        def get_key_buffer(self, layer_id: int) -> Any:
            calls.append("key")
            return super().get_key_buffer(layer_id)

        def get_value_buffer(self, layer_id: int) -> Any:
            calls.append("value")
            return super().get_value_buffer(layer_id)

    native = Instrumented(size=64, page_size=64)
    assert kvcompat.is_single_kv_pool(native)
    pool = kvcompat.adapt(native)
    pool.get_kv_buffer(0)
    assert calls == []


def test_names_are_confirmed_in_sys_modules() -> None:
    # A class that only claims to be SGLang's (its module was never imported) is unknown.
    fake = types.new_class("DeepSeekV4SingleKVPool")
    fake.__module__ = "not_imported_anywhere.deepseek_v4_memory_pool"
    assert "not_imported_anywhere.deepseek_v4_memory_pool" not in sys.modules
    assert kvcompat.pool_kind(fake) is None


def test_names_match_through_a_module_that_is_loaded() -> None:
    name = "fakeengine_for_kvcompat.pools"
    module = types.ModuleType(name)
    cls = types.new_class("PackedPool")
    cls.__module__ = name
    module.PackedPool = cls  # type: ignore[attr-defined]
    kvcompat.register_adapter(
        f"{name}.PackedPool",
        "sglang.srt.mem_cache.deepseek_v4_memory_pool.DeepSeekV4SingleKVPool",
    )
    try:
        assert kvcompat.pool_kind(cls) is None  # module not imported: cannot be that class
        sys.modules[name] = module
        _registry._cache.clear()
        assert kvcompat.is_single_kv_pool(cls)
        sub = types.new_class("HiSparseLike", (cls,))
        assert kvcompat.is_single_kv_pool(sub)
    finally:
        sys.modules.pop(name, None)
        kvcompat.unregister_adapter(f"{name}.PackedPool")


def test_sglang_class_names_match_in_moved_modules() -> None:
    # A release that moves DeepSeekV4SingleKVPool to another sglang module keeps working.
    name = "sglang.srt.mem_cache.moved_somewhere_else"
    cls = types.new_class("DeepSeekV4SingleKVPool")
    cls.__module__ = name
    assert kvcompat.pool_kind(cls) is None  # that module was never imported: not a real class
    module = types.ModuleType(name)
    module.DeepSeekV4SingleKVPool = cls  # type: ignore[attr-defined]
    sys.modules[name] = module
    try:
        _registry._cache.clear()
        assert kvcompat.is_single_kv_pool(cls)
    finally:
        del sys.modules[name]
        _registry._cache.clear()
    other = types.new_class("DeepSeekV4SingleKVPool")
    other.__module__ = "notsglang.srt.mem_cache.moved_somewhere_else"
    assert kvcompat.pool_kind(other) is None


def test_detection_is_cached_per_type_and_thread_safe() -> None:
    classes = [types.new_class(f"Sub{i}", (ReferenceMLATokenToKVPool,)) for i in range(64)]
    results: list[bool] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            results.extend(kvcompat.is_latent_pool(cls) for cls in classes)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert results == [True] * (64 * 8)
    assert all(cls in _registry._cache for cls in classes)


def test_composite_is_not_single_kv_but_its_parts_can_be() -> None:
    assert not kvcompat.is_single_kv_pool(ReferenceSWAKVPool)
    pool = kvcompat.adapt(reference_swa_pool())
    assert all(kvcompat.is_split_kv_pool(part) for part in pool.components.values())
