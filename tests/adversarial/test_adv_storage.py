"""Storage that changes under the adapter, values that alias it, and threads writing at once.

* **Stale storage**: ``pool.k_buffer[i] = new_tensor``, a replaced ``v_buffer`` list, a
  replaced element of ``kv_buffer``: getters, reads and writes follow the pool's current
  tensors; the detached ones are never touched again.
* **Gone storage**: after SGLang's own ``_clear_buffers()``, on a half-built pool, or with a
  non-tensor in a buffer list: :class:`kvcompat.PoolStateError` (an ``AttributeError`` and a
  ``ValueError``), never a raw ``AttributeError``/``TypeError``. A pool without an
  attribute the adapter reads (``dtype`` deleted, a DeepSeek-V4 token pool caught
  mid-construction) names every missing attribute; a buffer list that shrank after
  ``adapt`` says so and says to adapt again.
* **Impostors**: a class that copies ``__module__``/``__qualname__`` of a real SGLang pool
  is not recognised as it.
* **Aliasing**: ``write(l, dst, pool.get_key_buffer(l)[a:b])`` (a "move tokens" call, with
  overlapping ranges too) stores what a write of a copy would.
* **Races**: 8 threads writing disjoint tokens of one layer store what sequential writes do.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import types
from typing import Any

import pytest
import torch

import kvcompat
from kvcompat.testing import ReferenceMHATokenToKVPool

from ._harness import (
    ALL_CASES,
    Case,
    _builders,
    fingerprint,
    sglang,
    tried,
    valid_write,
)

CASE_PARAMS = [c.param for c in ALL_CASES]


def _leaves(pool: kvcompat.KVPoolProtocol) -> list[Any]:
    """(leaf adapter, layer) of every leaf that has a codec."""
    parts = list(pool.components.values())
    if pool.kind is not kvcompat.PoolKind.COMPOSITE:
        parts.insert(0, pool)  # a leaf, with its own parts if any (a DSA pool's indexer)
    found = []
    for part in parts:
        layer = part.layer_ids[0]
        try:
            part.layout(layer)
        except kvcompat.LayoutError:
            continue
        found.append((part, layer))
    return found


def _list_owner(native: Any, attr: str) -> tuple[Any, str]:
    """Where the list ``native.<attr>`` can be replaced: the pool, or, when ``attr`` is a
    read-only property over another object's list (DSA's ``index_k_with_scale_buffer``
    over ``index_key_cache.buffer``), that object."""
    if isinstance(inspect.getattr_static(type(native), attr, None), property):
        return native.index_key_cache, "buffer"
    return native, attr


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_replaced_elements_and_lists_are_followed(case: Case) -> None:
    pool = kvcompat.adapt(case.build())
    for part, layer in _leaves(pool):
        native = part.native
        slot = part.storage_slots[layer]
        attrs = [part.source_attr] + ([part.value_attr] if part.value_attr else [])
        for attr in attrs:
            for how in ("element", "list"):
                listing = getattr(native, attr)
                old = listing[slot]
                new = torch.zeros_like(old)
                if how == "element":
                    listing[slot] = new
                else:
                    replaced = [new if i == slot else t for i, t in enumerate(listing)]
                    owner, name = _list_owner(native, attr)
                    setattr(owner, name, replaced)
                key = part.get_key_buffer(layer, wait=False)
                value = part.get_value_buffer(layer, wait=False) if part.kind.has_values else None
                pair = part.get_kv_buffer(layer, wait=False) if part.kind.has_values else None
                current = key if attr == part.source_attr else value
                assert current is not None
                assert current.untyped_storage().data_ptr() == new.untyped_storage().data_ptr()
                if pair is not None and value is not None:
                    # (fp8 pools: a rebuilt table holds new dtype views of the same storage)
                    assert pair.key.data_ptr() == key.data_ptr()
                    assert pair.value.data_ptr() == value.data_ptr()
                # (Only the view: SGLang's K and V halves can share one allocation.)
                old_bytes = old.view(torch.uint8).clone()
                write = valid_write(part, layer, seed=slot)
                write()
                assert torch.equal(old.view(torch.uint8), old_bytes), f"{case.id}: {attr}[{slot}]"
                assert bool(new.view(torch.uint8).any()), "the write went to the current tensor"
                back = part.read(layer, write.loc)
                assert back.shape[0] == write.loc.numel()
                tried("stale storage")


def _clear(native: Any, part: Any) -> None:
    clear = getattr(native, "_clear_buffers", None)
    if clear is not None:
        clear()
    # Pools whose _clear_buffers is the base class's no-op (DeepSeekV4IndexerPool) or that
    # have none: release the lists the adapter reads, as _clear_buffers does elsewhere.
    for attr in ("k_buffer", "v_buffer", "kv_buffer", part.source_attr, part.value_attr):
        if attr is not None and attr in vars(native):
            delattr(native, attr)


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_cleared_buffers_raise_pool_state_error(case: Case) -> None:
    for index in range(len(_leaves(kvcompat.adapt(case.build())))):
        # Each part on a pool of its own: clearing one part's pool releases its parts' too.
        part, layer = _leaves(kvcompat.adapt(case.build()))[index]
        write = valid_write(part, layer)
        _clear(part.native, part)
        calls: dict[str, tuple[Any, tuple[Any, ...]]] = {
            "get_key_buffer": (part.get_key_buffer, (layer,)),
            "read": (part.read, (layer, write.loc)),
            "write": (part.write, (layer, write.loc, write.key, write.value)),
            "layout": (part.layout, (layer,)),
        }
        if part.kind.has_values:
            calls["get_value_buffer"] = (part.get_value_buffer, (layer,))
            calls["get_kv_buffer"] = (part.get_kv_buffer, (layer,))
        for name, (call, args) in calls.items():
            with pytest.raises(kvcompat.PoolStateError, match="released or not allocated") as info:
                call(*args)
            assert isinstance(info.value, AttributeError), name
            assert isinstance(info.value, ValueError), name
            tried("bad input")


def test_non_tensor_entries_raise_pool_state_error() -> None:
    from kvcompat.testing import ReferenceMHATokenToKVPool

    native = ReferenceMHATokenToKVPool(16, 16, layer_num=2)
    pool = kvcompat.adapt(native)
    for bad in (None, "tensor", 3):
        native.k_buffer[1] = bad
        with pytest.raises(kvcompat.PoolStateError, match=r"k_buffer\[1\]"):
            pool.get_key_buffer(1)
        tried("bad input")
    native.k_buffer = 7
    with pytest.raises(kvcompat.PoolStateError, match="not a list"):
        pool.get_key_buffer(0)
    native.k_buffer = [native.v_buffer[0]]  # shorter than the layers it served
    with pytest.raises(kvcompat.PoolStateError, match="outside"):
        pool.get_key_buffer(1)
    tried("bad input", 2)


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_half_built_pools_raise_pool_state_error(case: Case) -> None:
    native = case.build()
    cls = type(native)
    blank = cls.__new__(cls)  # __init__ never ran: no attributes at all
    with pytest.raises(kvcompat.KVCompatError) as info:
        kvcompat.adapt(blank)
    if not kvcompat.is_composite_pool(native):
        assert isinstance(info.value, kvcompat.PoolStateError)
        assert isinstance(info.value, AttributeError)
    # Half of the attributes: every other one missing.
    partial = cls.__new__(cls)
    for index, (name, value) in enumerate(sorted(vars(native).items())):
        if index % 2:
            setattr(partial, name, value)
    try:
        pool = kvcompat.adapt(partial)
    except kvcompat.KVCompatError:
        pool = None  # refused with a kvcompat error: fine
    if pool is not None:
        with contextlib.suppress(kvcompat.KVCompatError):
            for layer in pool.layer_ids:
                pool.get_key_buffer(layer, wait=False)
    tried("bad input", 2)


def _required(part: Any) -> list[str]:
    """What the leaf adapter reads from its pool: buffer lists and plain attributes."""
    lists = [part.source_attr] + ([part.value_attr] if part.value_attr else [])
    return [*lists, *part.native_attrs]


def _part_native(native: Any, component: str | None) -> Any:
    return native if component is None else kvcompat.adapt(native).components[component].native


def _leaf_names(pool: kvcompat.KVPoolProtocol) -> list[str | None]:
    names: list[str | None] = list(pool.components) or [None]
    parts = {name: pool if name is None else pool.components[name] for name in names}
    return [name for name in names if isinstance(parts[name], kvcompat.adapters.LeafAdapter)]


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_missing_attributes_are_each_named(case: Case) -> None:
    """A pool without one attribute the adapter reads: PoolStateError naming *that* one."""
    pool = kvcompat.adapt(case.build())
    for component in _leaf_names(pool):
        part = pool if component is None else pool.components[component]
        for attr in _required(part):
            native = case.build()
            target = _part_native(native, component)
            if attr not in vars(target):
                continue  # a class attribute: nothing an instance can lose
            delattr(target, attr)
            before = fingerprint(native)
            with pytest.raises(kvcompat.PoolStateError) as info:
                dict(kvcompat.adapt(native).components)  # a DSA pool builds its part on use
            text = str(info.value)
            assert f"no attribute {attr!r}," in text, (case.id, component, text)
            assert "Hint: adapt the pool after its constructor has returned" in text
            assert isinstance(info.value, AttributeError)
            assert not before.diff(fingerprint(native)), case.id
            tried("bad input")


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda: _builders().build_mha_pool(), id="sglang-mha", marks=sglang),
        pytest.param(
            lambda: ReferenceMHATokenToKVPool(48, 16, torch.bfloat16, 2, 8, 2), id="ref-mha"
        ),
    ],
)
def test_an_mha_pool_without_dtype_names_dtype(build: Any) -> None:
    """The issue's case: the message names what is missing, and all of it."""
    native = build()
    del native.dtype
    with pytest.raises(kvcompat.PoolStateError, match=r"has no attribute 'dtype', which") as info:
        kvcompat.adapt(native)
    assert "v_buffer" not in str(info.value)
    del native.v_buffer  # caught earlier still: both are named, the lists first
    with pytest.raises(kvcompat.PoolStateError, match=r"no attributes 'v_buffer', 'dtype',"):
        kvcompat.describe(native)
    # Lost after adaptation: the layout, the dtype and a read name it too, never a bare error.
    native = build()
    pool = kvcompat.adapt(native)
    del native.dtype
    calls = (lambda: pool.layout(0), lambda: pool.dtype, lambda: pool.read(0, torch.tensor([1])))
    for call in calls:
        with pytest.raises(kvcompat.PoolStateError, match=r"no attribute 'dtype'"):
            call()
    tried("bad input", 5)


def test_unset_slots_count_as_missing_and_getattr_served_ones_as_present() -> None:
    from kvcompat.adapters._base import require_attrs

    class Slotted:
        __slots__ = ("dtype", "page_size")

    class Dynamic:
        def __getattr__(self, name: str) -> Any:
            if name == "dtype":
                return torch.bfloat16
            raise AttributeError(name)

    slotted = Slotted()
    slotted.page_size = 16
    with pytest.raises(kvcompat.PoolStateError, match=r"Slotted has no attribute 'dtype', which"):
        require_attrs(slotted, ("dtype", "page_size"), reader="X")
    with pytest.raises(kvcompat.PoolStateError, match=r"no attribute 'page_size', which"):
        require_attrs(Dynamic(), ("dtype", "page_size"), reader="X")
    tried("bad input", 2)


@pytest.mark.sglang
def test_a_dsv4_token_pool_caught_mid_construction_names_the_missing_attribute() -> None:
    native = _builders().build_dsv4_token_pool()
    cls = type(native)
    blank = cls.__new__(cls)
    with pytest.raises(kvcompat.PoolStateError, match=r"no attributes 'swa_kv_pool', ") as info:
        kvcompat.adapt(blank)
    assert "unified_kv" not in str(info.value)  # not mistaken for a mode it is not in
    for attr in ("swa_kv_pool", "_stage_start", "_stage_end", "layer_mapping"):
        partial = cls.__new__(cls)
        vars(partial).update({k: v for k, v in vars(native).items() if k != attr})
        with pytest.raises(kvcompat.PoolStateError, match=rf"has no attribute {attr!r}, which"):
            kvcompat.adapt(partial)
        tried("bad input")
    # None (unified_kv / request-window mode) is still a mode kvcompat does not support.
    native.swa_kv_pool = None
    with pytest.raises(kvcompat.UnsupportedPoolError, match="unified_kv"):
        kvcompat.adapt(native)
    tried("bad input", 2)


@pytest.mark.parametrize("case", CASE_PARAMS)
@pytest.mark.parametrize("how", ["replaced", "in place"])
def test_a_buffer_list_that_shrank_after_adapt_says_to_adapt_again(case: Case, how: str) -> None:
    pool = kvcompat.adapt(case.build())
    for part, _ in _leaves(pool):
        native = part.native
        slots = part.storage_slots
        top = max(slots.values())
        lost = sorted(layer for layer, slot in slots.items() if slot == top)
        listing = getattr(native, part.source_attr)
        declared = getattr(type(native), part.source_attr, None)
        if how == "replaced" and isinstance(declared, property) and declared.fset is None:
            continue  # a read-only view (DSA's index keys): only shrinking it in place applies
        if how == "replaced":
            setattr(native, part.source_attr, list(listing[:top]))
        else:
            del listing[top:]
        before = fingerprint(native)
        for layer in lost:
            calls = (
                (part.get_key_buffer, (layer,), {"wait": False}),
                (part.read, (layer, torch.tensor([0])), {}),
                (part.layout, (layer,), {}),
            )
            for call, args, kwargs in calls:
                with pytest.raises(kvcompat.PoolStateError) as info:
                    call(*args, **kwargs)
                text = str(info.value)
                assert f"layers {lost} map to slots [{top}], outside the {top} buffer" in text
                assert f".{part.source_attr}: the native pool's buffer list changed" in text
                assert "after kvcompat.adapt" in text
                assert "Hint: adapt the pool again after it is rebuilt or resized" in text
                tried("stale storage")
        assert not before.diff(fingerprint(native)), case.id
        # Adapting again serves what is left (a composite's part: the composite again).
        if top and not pool.components:
            again = kvcompat.adapt(native)
            assert max(again.storage_slots.values()) == top - 1


@pytest.mark.sglang
def test_impostor_classes_are_not_recognised() -> None:
    from _sglang.env import prepare_sglang

    session = prepare_sglang()
    real = session.memory_pool.MHATokenToKVPool
    impostor = types.new_class("MHATokenToKVPool")
    impostor.__module__ = real.__module__
    impostor.__qualname__ = real.__qualname__
    assert kvcompat.pool_kind(impostor) is None
    assert kvcompat.pool_kind(real) is kvcompat.PoolKind.SPLIT
    with pytest.raises(kvcompat.UnsupportedPoolError):
        kvcompat.adapt(impostor())
    # Its subclasses are not recognised either; a real subclass is.
    assert kvcompat.pool_kind(types.new_class("Sub", (impostor,))) is None
    assert kvcompat.pool_kind(types.new_class("Sub", (real,))) is kvcompat.PoolKind.SPLIT
    tried("bad input", 3)


def _aliasing_writes(part: Any, layer: int) -> list[tuple[str, Any, Any]]:
    """(label, key, value) built from views of the part's own storage."""
    spec = part.layout(layer)
    key_buffer = part.get_key_buffer(layer, wait=False)
    out = []
    if not spec.key.paged:  # token-major rows: a slice of rows is a [n, heads, dim] view
        heads = spec.key.heads
        rows = key_buffer.view(key_buffer.shape[0], heads, -1)[2:7]
        value = None
        if spec.value is not None:
            value_buffer = part.get_value_buffer(layer, wait=False)
            value = value_buffer.view(value_buffer.shape[0], spec.value.heads, -1)[3:8]
        out.append(("own rows", rows, value))
        if spec.value is not None:  # the value is a view of the *key* buffer, and vice versa
            cross = part.get_key_buffer(layer, wait=False)
            out.append(
                ("value from key rows", part.get_value_buffer(layer, wait=False)[1:6], cross[2:7])
            )
    else:
        raw = key_buffer.view(torch.uint8).reshape(-1)
        n_bytes = 5 * spec.key.dim * 2
        out.append(
            (
                "page bytes as bf16",
                raw[:n_bytes].view(torch.bfloat16).view(5, 1, spec.key.dim),
                None,
            )
        )
    return out


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_values_aliasing_the_destination_are_copied_first(case: Case) -> None:
    pool = kvcompat.adapt(case.build())
    twin = kvcompat.adapt(case.build())
    for (part, layer), (twin_part, _) in zip(_leaves(pool), _leaves(twin), strict=True):
        # Fill the storage with finite, varied values so the aliased rows mean something.
        seed = valid_write(part, layer, n=min(12, part.get_key_buffer(layer, wait=False).shape[0]))
        for target in (part, twin_part):
            target.write(layer, seed.loc, seed.key, seed.value)
        # Out of order, over the aliased rows; within the 6 token slots of the smallest part
        # (a c128 pool of SGLang 0.5.12-0.5.20).
        loc = torch.tensor([4, 5, 0, 1, 2])
        for label, key, aliased_value in _aliasing_writes(part, layer):
            value = None if part.kind is kvcompat.PoolKind.KEY_ONLY else aliased_value
            spec = part.layout(layer)
            if spec.value is None and value is not None:
                continue
            copies = (key.clone(), None if value is None else value.clone())
            # check_finite=False: packed bytes read as bf16 may be anything; aliasing is the point.
            twin_part.write(layer, loc, *copies, check_finite=False)
            part.write(layer, loc, key, value, check_finite=False)
            mine = fingerprint(
                part.get_kv_buffer(layer) if part.kind.has_values else part.get_key_buffer(layer)
            )
            theirs = fingerprint(
                twin_part.get_kv_buffer(layer)
                if twin_part.kind.has_values
                else twin_part.get_key_buffer(layer)
            )
            assert sorted(mine.storages.values()) == sorted(theirs.storages.values()), (
                f"{case.id}: {label}"
            )
            tried("aliasing")


def _hammer(write: Any, barrier: threading.Barrier, errors: list[BaseException]) -> None:
    try:
        barrier.wait()
        for _ in range(5):
            write()
    except BaseException as exc:  # reported by the test
        errors.append(exc)


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_threads_writing_disjoint_tokens_store_what_sequential_writes_do(case: Case) -> None:
    pool = kvcompat.adapt(case.build())
    twin = kvcompat.adapt(case.build())
    for (part, layer), (twin_part, _) in zip(_leaves(pool), _leaves(twin), strict=True):
        cap = part.get_key_buffer(layer, wait=False).shape[0] * part.layout(
            layer
        ).key.tokens_per_row(part.page_size)
        threads_n = min(8, cap)  # a c128 part of SGLang 0.5.12-0.5.20 has 6 token slots
        per = max(1, min(4, cap // threads_n))
        order = torch.randperm(cap, generator=torch.Generator().manual_seed(1))
        writes = []
        for t in range(threads_n):
            w = valid_write(part, layer, n=per, seed=100 + t)
            w.loc = order[t * per : (t + 1) * per]
            writes.append(w)
        errors: list[BaseException] = []
        barrier = threading.Barrier(threads_n)
        threads = [threading.Thread(target=_hammer, args=(w, barrier, errors)) for w in writes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        for w in writes:
            twin_part.write(layer, w.loc, w.key, w.value)
        got = part.get_key_buffer(layer).view(torch.uint8)
        want = twin_part.get_key_buffer(layer).view(torch.uint8)
        assert torch.equal(got, want), f"{case.id}: concurrent writes differ from sequential ones"
        if part.layout(layer).value is not None:
            assert torch.equal(
                part.get_value_buffer(layer).view(torch.uint8),
                twin_part.get_value_buffer(layer).view(torch.uint8),
            )
        tried("race", threads_n)
