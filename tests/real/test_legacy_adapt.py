"""kvcompat serves the pre-0.5.23 ``DeepSeekV4SingleKVPool`` (the test double in _sglang.legacy).

The old class had no ``kv_layout``, counted pages as ``(size + page + 1) // page`` and its
``get_key_buffer(l)`` returned the raw ``uint8`` ``kv_buffer[l]`` (no start_layer, no dtype
view). kvcompat must serve the same storage per layer, answer ``is_single_kv_pool``, never
raise ``NotImplementedError``, and differ from the old getter in exactly one documented way:
it returns the pool's logical dtype (``float8_e4m3fn``) view where the old getter returned
``uint8``.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from _sglang.legacy import build_legacy_dsv4_single_pool, legacy_dsv4_single_pool_class

import kvcompat

from ._checks import at, check_raises, check_storage

FP8 = torch.float8_e4m3fn
NATIVE_DTYPE, KVCOMPAT_DTYPE = torch.uint8, FP8  # the documented difference


@pytest.mark.parametrize("start", [0, 2])
@pytest.mark.parametrize("size", [64, 100])
def test_serves_the_legacy_storage_per_layer(start: int, size: int) -> None:
    native = build_legacy_dsv4_single_pool(start_layer=start, layer_num=2, size=size)
    label = f"LegacyDeepSeekV4SingleKVPool(start_layer={start}, size={size})"
    pool = kvcompat.adapt(native)
    assert pool.layer_ids == (start, start + 1), f"{label}: layer_ids {pool.layer_ids}"
    assert pool.kind is kvcompat.PoolKind.SINGLE_KV, f"{label}: kind {pool.kind}"
    others = {f"layer {start + i}'s pool.kv_buffer[{i}]": t for i, t in enumerate(native.kv_buffer)}
    for i, raw in enumerate(native.kv_buffer):
        layer = start + i
        assert raw.dtype == NATIVE_DTYPE, f"{label}: the double's storage is {raw.dtype}"
        for getter in ("get_key_buffer", "get_value_buffer"):
            check_storage(
                getattr(pool, getter)(layer),
                raw,
                dtype=KVCOMPAT_DTYPE,
                what=at(label, layer, getter),
                where=f"pool.kv_buffer[{i}]",
                others=others,
            )
        pair = pool.get_kv_buffer(layer)
        assert pair.shared, at(label, layer, "get_kv_buffer().shared")
        assert pair.key is pair.value, at(label, layer, "get_kv_buffer: value is not the key")
        check_storage(
            pair.key,
            raw,
            dtype=KVCOMPAT_DTYPE,
            what=at(label, layer, "get_kv_buffer"),
            where=f"pool.kv_buffer[{i}]",
        )


def test_differs_from_the_old_getter_only_in_the_documented_dtype() -> None:
    native = build_legacy_dsv4_single_pool(start_layer=0, layer_num=2)
    pool = kvcompat.adapt(native)
    for layer in (0, 1):
        old = native.get_key_buffer(layer)
        new = pool.get_key_buffer(layer)
        what = at("LegacyDeepSeekV4SingleKVPool-start0", layer, "kvcompat vs old get_key_buffer")
        assert (old.dtype, new.dtype) == (NATIVE_DTYPE, KVCOMPAT_DTYPE), (
            f"{what}: dtypes (old, kvcompat) {(old.dtype, new.dtype)}, documented "
            f"{(NATIVE_DTYPE, KVCOMPAT_DTYPE)}"
        )
        check_storage(new, old, dtype=KVCOMPAT_DTYPE, what=what, where="the old getter's result")
        assert torch.equal(new.view(torch.uint8), old), f"{what}: bytes differ"


def test_later_stage_the_old_getter_misses_kvcompat_does_not() -> None:
    native = build_legacy_dsv4_single_pool(start_layer=2, layer_num=2)
    pool = kvcompat.adapt(native)
    label = "LegacyDeepSeekV4SingleKVPool-start2"
    for i, layer in enumerate((2, 3)):
        check_raises(
            partial(native.get_key_buffer, layer),
            IndexError,
            what=at(label, layer, "old get_key_buffer (raw index)"),
        )
        got = pool.get_key_buffer(layer)
        check_storage(
            got,
            native.kv_buffer[i],
            dtype=KVCOMPAT_DTYPE,
            what=at(label, layer, "get_key_buffer"),
            where=f"pool.kv_buffer[{i}]",
        )
    for layer in (0, 1):  # what the old getter would have answered for: not this stage's ids
        check_raises(
            partial(pool.get_key_buffer, layer),
            kvcompat.LayerOutOfRangeError,
            what=at(label, layer, "get_key_buffer"),
            contains=("valid layer ids are 2..3",),
        )


def test_detected_as_single_kv_without_kv_layout() -> None:
    cls = legacy_dsv4_single_pool_class()
    native = build_legacy_dsv4_single_pool()
    assert not hasattr(native, "kv_layout")
    pool = kvcompat.adapt(native)
    for label, subject in (("instance", native), ("class", cls), ("adapter", pool)):
        assert kvcompat.is_single_kv_pool(subject), f"is_single_kv_pool({label})"
        assert kvcompat.pool_kind(subject) is kvcompat.PoolKind.SINGLE_KV, f"pool_kind({label})"
        assert not kvcompat.is_composite_pool(subject), f"is_composite_pool({label})"


def test_no_not_implemented_error_escapes() -> None:
    native = build_legacy_dsv4_single_pool(start_layer=2)
    pool = kvcompat.adapt(native)
    for layer in pool.layer_ids:
        for getter in ("get_key_buffer", "get_value_buffer", "get_kv_buffer"):
            with_native = getattr(native, getter)
            if getter != "get_key_buffer":  # the double inherits the 0.5.23 refusals
                check_raises(
                    partial(with_native, layer),
                    NotImplementedError,
                    what=at("Legacy-start2", layer, f"native {getter}"),
                )
            try:
                getattr(pool, getter)(layer)
            except NotImplementedError as exc:  # pragma: no cover - the failure path
                pytest.fail(f"{at('Legacy-start2', layer, getter)} raised {exc!r}")
