"""adapt() on unknown objects, and the register_adapter extension point."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

import kvcompat
from kvcompat.adapters import CompositeAdapter

MHA = "sglang.srt.mem_cache.memory_pool.MHATokenToKVPool"
KONLY = "sglang.srt.mem_cache.memory_pool.MHATokenToKOnlyPool"


class VendorKOnlyPool:
    """A third-party key-only pool with SGLang's K-only attribute names."""

    def __init__(self, layer_num: int = 2, start_layer: int = 0) -> None:
        self.size, self.page_size, self.dtype, self.device = 16, 16, torch.bfloat16, "cpu"
        self.start_layer = start_layer
        self.layer_transfer_counter = None
        self.k_buffer = [torch.zeros(32, 1, 4, dtype=torch.bfloat16) for _ in range(layer_num)]


QUALNAME = f"{__name__}.VendorKOnlyPool"


@pytest.fixture
def registered() -> Iterator[None]:
    kvcompat.register_adapter(QUALNAME, KONLY)
    yield
    assert kvcompat.unregister_adapter(QUALNAME)


def test_unknown_object_raises_type_error_with_how_to_teach() -> None:
    with pytest.raises(kvcompat.UnsupportedPoolError) as info:
        kvcompat.adapt(VendorKOnlyPool())
    assert isinstance(info.value, TypeError)
    message = str(info.value)
    assert QUALNAME in message
    assert "kvcompat.register_adapter(" in message


def test_adapt_rejects_classes_with_a_hint() -> None:
    with pytest.raises(kvcompat.UnsupportedPoolError, match="takes a pool instance"):
        kvcompat.adapt(VendorKOnlyPool)


def test_register_by_name_reusing_a_builtin_family(registered: None) -> None:
    native = VendorKOnlyPool(start_layer=2)
    assert kvcompat.is_key_only_pool(native)
    pool = kvcompat.adapt(native)
    assert pool.layer_ids == (2, 3)
    assert pool.get_key_buffer(3) is native.k_buffer[1]
    with pytest.raises(kvcompat.NoValueBufferError) as info:
        pool.get_value_buffer(2)
    assert isinstance(info.value, NotImplementedError)
    assert "VendorKOnlyPool" in str(info.value)
    assert "get_key_buffer" in str(info.value)
    with pytest.raises(kvcompat.NoValueBufferError):
        pool.get_kv_buffer(2)
    # an unserved id on a key-only pool is still a range error, not "no values"
    with pytest.raises(kvcompat.LayerOutOfRangeError):
        pool.get_value_buffer(9)


def test_register_with_a_factory_and_kind() -> None:
    built: list[Any] = []

    def factory(native: Any) -> kvcompat.KVPoolProtocol:
        built.append(native)
        part = kvcompat.adapt(native.inner)
        return CompositeAdapter(native, components={"inner": part}, route={0: "inner"})

    class Wrapper:
        def __init__(self) -> None:
            self.inner = kvcompat.testing.ReferenceMHATokenToKVPool(size=16, page_size=16)

    name = f"{__name__}.Wrapper"
    Wrapper.__qualname__ = "Wrapper"
    globals()["Wrapper"] = Wrapper
    kvcompat.register_adapter(name, factory, kind="composite")
    try:
        native = Wrapper()
        assert kvcompat.is_composite_pool(native)
        assert built == []  # detection never builds an adapter
        pool = kvcompat.adapt(native)
        assert built == [native]
        assert pool.component_for(0) == "inner"
    finally:
        kvcompat.unregister_adapter(name)
        del globals()["Wrapper"]


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        (("NoDots", MHA), {}, ValueError, "package.module.ClassName"),
        ((QUALNAME, "no.such.Family"), {}, ValueError, "cannot reuse"),
        ((QUALNAME, lambda p: p), {}, ValueError, "needs kind"),
        ((QUALNAME, lambda p: p), {"kind": "sideways"}, ValueError, "kind must be a PoolKind"),
        ((QUALNAME, 42), {}, TypeError, "factory must be"),
        ((QUALNAME, KONLY), {"kind": "split"}, ValueError, "contradicts"),
        ((MHA, KONLY), {}, ValueError, "already registered"),
    ],
)
def test_bad_registrations_are_rejected_and_change_nothing(
    args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    before = dict(kvcompat._registry._families)
    with pytest.raises(error, match=match):
        kvcompat.register_adapter(*args, **kwargs)
    assert kvcompat._registry._families == before


def test_unsupported_but_recognised_classes_say_why() -> None:
    import sys
    import types

    from kvcompat._families import Family, _install

    name = "fakeengine_for_kvcompat.noop"
    qualname = f"{name}.NoOpPool"
    module = types.ModuleType(name)
    cls = types.new_class("NoOpPool")
    cls.__module__ = name
    module.NoOpPool = cls  # type: ignore[attr-defined]
    sys.modules[name] = module
    _install(Family(qualname, None, reason="it holds placeholder buffers only."))
    try:
        assert kvcompat.pool_kind(cls) is None
        with pytest.raises(kvcompat.UnsupportedPoolError, match="placeholder buffers") as info:
            kvcompat.adapt(cls())
        assert qualname in str(info.value)
    finally:
        del sys.modules[name]
        kvcompat.unregister_adapter(qualname)
