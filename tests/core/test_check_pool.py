"""kvcompat.testing.check_pool: passes on every reference pool, fails usefully on broken ones."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import kvcompat
from kvcompat.adapters import SplitAdapter
from kvcompat.testing import (
    PoolCheckError,
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
    ReferenceMLATokenToKVPool,
    check_pool,
    reference_swa_pool,
)

REFERENCE_POOLS = {
    "mha-bf16": lambda: ReferenceMHATokenToKVPool(size=16, page_size=16, layer_num=2),
    "mha-fp8": lambda: ReferenceMHATokenToKVPool(
        size=16, page_size=16, layer_num=2, dtype=torch.float8_e4m3fn
    ),
    "mha-staged": lambda: ReferenceMHATokenToKVPool(16, 16, layer_num=2, start_layer=3),
    "mla-bf16": lambda: ReferenceMLATokenToKVPool(size=16, page_size=16, layer_num=2),
    "dsv4-v4": lambda: ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64, layer_num=2),
    "swa": reference_swa_pool,
}


@pytest.mark.parametrize("name", sorted(REFERENCE_POOLS))
def test_passes_on_every_reference_pool(name: str) -> None:
    report = check_pool(REFERENCE_POOLS[name]())
    assert report.ok
    assert set(report.passed) == {
        "getters", "layer_ids", "round_trip", "describe", "descriptors", "memory_report",
    }  # fmt: skip


def test_leaves_the_pools_bytes_as_they_were() -> None:
    native = ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64, layer_num=2)
    for buf in native.kv_buffer:
        buf.random_(0, 256)
    before = [buf.clone() for buf in native.kv_buffer]
    check_pool(native)
    assert all(torch.equal(a, b) for a, b in zip(before, native.kv_buffer, strict=True))


# -- three deliberately broken adapters --------------------------------------------------------


class CopyingAdapter(SplitAdapter):
    """Returns a copy of the key: writes through it never reach the pool."""

    def get_key_buffer(self, layer_id: int, /, *, wait: bool = True) -> torch.Tensor:
        return super().get_key_buffer(layer_id, wait=wait).clone()


class LaxLayerIdsAdapter(SplitAdapter):
    """Indexes the native list with whatever it is given (-1 silently means the last layer)."""

    def get_key_buffer(self, layer_id: Any, /, *, wait: bool = True) -> torch.Tensor:
        native = self.native
        return native.k_buffer[int(layer_id) - native.start_layer]  # type: ignore[no-any-return]


class SpillingAdapter(SplitAdapter):
    """Writes the tokens, and also scribbles on the padding row 0 of the key buffer."""

    def write(
        self, layer_id: int, loc: torch.Tensor, key: torch.Tensor, *args: Any, **kw: Any
    ) -> None:
        super().write(layer_id, loc, key, *args, **kw)
        slot = self.storage_slots[layer_id]
        self.native.k_buffer[slot][0].add_(1)


def _broken(cls: type[SplitAdapter]) -> SplitAdapter:
    return cls(ReferenceMHATokenToKVPool(size=16, page_size=16, layer_num=2))


def test_a_copying_getter_is_reported() -> None:
    with pytest.raises(PoolCheckError) as info:
        check_pool(_broken(CopyingAdapter))
    report = info.value.report
    assert isinstance(info.value, AssertionError)
    assert {f.check for f in report.failures} >= {"getters"}
    assert "does not hold (a copy?)" in str(info.value)
    assert "ReferenceMHATokenToKVPool layer 0" in str(info.value)


def test_lax_layer_ids_are_reported() -> None:
    report = check_pool(_broken(LaxLayerIdsAdapter), raise_on_failure=False)
    assert not report.ok
    messages = [str(f) for f in report.failures if f.check == "layer_ids"]
    assert any("get_key_buffer(-1) returned a buffer" in m for m in messages), messages
    assert any("get_key_buffer(True) was accepted" in m for m in messages), messages


def test_stray_bytes_are_reported() -> None:
    report = check_pool(_broken(SpillingAdapter), raise_on_failure=False)
    assert [f.check for f in report.failures] == ["round_trip", "round_trip"]
    assert "outside the written tokens' rows" in report.failures[0].message
    assert "check_pool(ReferenceMHATokenToKVPool): FAILED" in str(report)


def test_an_unknown_object_is_refused() -> None:
    with pytest.raises(kvcompat.UnsupportedPoolError):
        check_pool(object())


class UndeclaredAdapter(SplitAdapter):
    """Declares no buffers: describe() can only show the pool's tensors as opaque."""

    buffers = ()


def test_undeclared_buffers_are_reported_by_the_describe_check() -> None:
    native = ReferenceMHATokenToKVPool(size=16, page_size=16, layer_num=1)
    qualname = "tests_kvcompat_check.UndeclaredPool"
    kvcompat.register_adapter(qualname, UndeclaredAdapter)
    try:
        report = check_pool(UndeclaredAdapter(native), raise_on_failure=False)
    finally:
        kvcompat.unregister_adapter(qualname)
    checks = {f.check for f in report.failures}
    assert "describe" in checks
    assert any("described only as opaque" in f.message for f in report.failures)
