"""The compat proxy over SGLang 0.5.23's own pools: native tensors or logical views, native
writers' bytes, KVWriteLoc routing, and a proxy every kvcompat entry point sees through."""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import Any

import pytest
import torch
from _sglang import builders as b
from _sglang.builders import radix_layer
from _sglang.cases import CONFORMANCE_CASES, PoolCase
from _sglang.env import prepare_sglang
from _sglang.features import kv_write_loc, require
from hypothesis import given, settings
from hypothesis import strategies as st

import kvcompat
from kvcompat.compat import CompatViewError, LogicalView
from kvcompat.inspection import describe, memory_report, transfer_descriptors

_CASES = [pytest.param(c, id=c.id) for c in CONFORMANCE_CASES]
_NO_VALUES = ("key_only", "index")


def _write_loc(**kwargs: Any) -> Any:
    return kv_write_loc()(**kwargs)  # skips on a release without KVWriteLoc (0.5.12)


def _model_value_dim(case: PoolCase, native: Any) -> int | None:
    """The value head dim the model has (what a v_head_dim probe must return)."""
    if case.family in _NO_VALUES:
        return None
    if case.family == "latent":
        return int(native.kv_lora_rank)
    if case.family in ("single", "dsv4_token"):
        return 512  # DeepSeek-V4: 448 nope + 64 rope, one latent for K and V
    if case.family == "split":
        return int(native.v_head_dim)
    return b.HEAD_DIM


def test_swa_pool_with_sglangs_own_kv_write_loc() -> None:
    ours, theirs = b.build_swa_pool(), b.build_swa_pool()
    k = torch.randn(2, 2, 8).to(torch.bfloat16)
    v = torch.randn(2, 2, 8).to(torch.bfloat16)
    loc = _write_loc(loc=torch.tensor([10, 50]), swa_loc=torch.tensor([3, 4]))
    for layer_id in (0, 1):  # a sliding-window layer, then a full-attention layer
        theirs.set_kv_buffer(radix_layer(layer_id), loc, k.clone(), v.clone())
        kvcompat.compat(ours).set_kv_buffer(radix_layer(layer_id), loc, k, v)
    _assert_same_swa_bytes(ours, theirs)


def test_swa_pool_refuses_a_plain_loc_its_native_tensors_cannot_mean() -> None:
    # SWAKVPool's getters are its native tensors, indexed by SWA slot, so a backend's later
    # k_buffer[loc] reads SWA slot loc: a plain full-pool loc written translated would be read
    # back from another slot. Refused on SWA layers (nothing written), fine on full layers.
    ours, theirs = b.build_swa_pool(), b.build_swa_pool()
    allocated = b.register_allocator_mapping(ours, seed=0)
    theirs.register_mapping(ours.full_to_swa_index_mapping)
    k = torch.randn(2, 2, 8).to(torch.bfloat16)
    v = torch.randn(2, 2, 8).to(torch.bfloat16)
    full = allocated[:2]
    swa = theirs.translate_loc_from_full_to_swa(full)
    assert not torch.equal(swa, full)
    pool = kvcompat.compat(ours)
    with pytest.raises(kvcompat.WriteError, match=r"indexed by SWA slot[\s\S]*KVWriteLoc"):
        pool.set_kv_buffer(radix_layer(0), full, k, v)
    _assert_same_swa_bytes(ours, theirs)  # nothing written
    pool.set_kv_buffer(radix_layer(1), full, k, v)  # a full-attention layer: loc is its slot
    theirs.full_kv_pool.set_kv_buffer(None, full, k, v, layer_id_override=0)
    _assert_same_swa_bytes(ours, theirs)
    with pytest.raises(kvcompat.WriteError, match=r"indexed by SWA slot[\s\S]*KVWriteLoc"):
        pool.set_kv_buffer(radix_layer(0), _write_loc(loc=full), k, v)  # 0.5.14 on
    _assert_same_swa_bytes(ours, theirs)  # nothing written
    for layer_id in (0, 1, 2):
        theirs.set_kv_buffer(radix_layer(layer_id), _write_loc(loc=full, swa_loc=swa), k, v)
        pool.set_kv_buffer(radix_layer(layer_id), _write_loc(loc=full, swa_loc=swa), k, v)
    _assert_same_swa_bytes(ours, theirs)
    assert torch.equal(pool.get_key_buffer(0)[swa], k)  # the slots SGLang's backends index


def test_swa_pool_takes_0513s_swa_loc_keyword_and_full_indices_plain_locs() -> None:
    ours, theirs = b.build_swa_pool(), b.build_swa_pool()
    k = torch.randn(2, 2, 8).to(torch.bfloat16)
    full, swa = torch.tensor([10, 40]), torch.tensor([3, 7])
    kvcompat.compat(ours).set_kv_buffer(radix_layer(0), full, k, k, swa_loc=swa)  # 0.5.13's form
    theirs.swa_kv_pool.set_kv_buffer(None, swa, k, k, layer_id_override=0)
    _assert_same_swa_bytes(ours, theirs)
    # SGLang's configurator's identity mode: SWA slots are full-pool slots.
    identity = torch.arange(64 + 16 + 1)
    identity[-1] = -1
    ours.register_mapping(identity)
    ours.swa_uses_full_indices = True
    pool = kvcompat.compat(ours)
    pool.set_kv_buffer(radix_layer(2), full[:1], k[:1], k[:1])
    assert torch.equal(pool.get_key_buffer(2)[full[:1]], k[:1])


def _assert_same_swa_bytes(ours: Any, theirs: Any) -> None:
    for side in ("full_kv_pool", "swa_kv_pool"):
        for attr in ("k_buffer", "v_buffer"):
            mine = getattr(getattr(ours, side), attr)
            native = getattr(getattr(theirs, side), attr)
            for a, c in zip(mine, native, strict=True):
                assert torch.equal(a, c), f"{side}.{attr}"


def test_dsv4_token_pool_plain_loc_goes_to_the_translated_swa_slots() -> None:
    ours, theirs = b.build_dsv4_token_pool(), b.build_dsv4_token_pool()
    full = b.register_allocator_mapping(ours, seed=1)[[0, 1, 2]]
    mapping = ours.full_to_swa_index_mapping
    keys = torch.randn(3, 1, 512).to(torch.bfloat16)
    for layer_id in (0, 1, 2):  # ratio 0, c4 and c128 layers: all keep their window in swa
        kvcompat.compat(ours).set_kv_buffer(radix_layer(layer_id), full, keys, keys)
        kvcompat.adapt(theirs).write(layer_id, mapping[full], keys)
    for a, c in zip(ours.swa_kv_pool.kv_buffer, theirs.swa_kv_pool.kv_buffer, strict=True):
        assert torch.equal(a.view(torch.uint8), c.view(torch.uint8))


@pytest.mark.parametrize(
    "build", [b.build_dsv4_single_pool, b.build_hisparse_c4_pool, b.build_dsv4_token_pool]
)
def test_dsv4_pools_run_an_unported_backend(build: Any) -> None:
    native = build()
    pool = kvcompat.compat(native)
    layer_id = pool.kvcompat.layer_ids[-1]
    k, v = pool.get_kv_buffer(layer_id)
    assert k is v
    assert isinstance(k, LogicalView)
    assert k.shape[1:] == (1, 512)
    assert pool.get_value_buffer(layer_id).shape[-1] == 512
    keys = torch.randn(2, 1, 512).to(torch.bfloat16)
    loc = torch.tensor([5, 6])
    if build is not b.build_dsv4_single_pool:  # a mapped pool: nothing works without its mapping
        before = [t.clone() for t in _storages(native)]
        with pytest.raises(kvcompat.WriteError, match=r"no .* mapping"):
            pool.set_kv_buffer(radix_layer(layer_id), loc, keys, None)
        with pytest.raises(IndexError, match=r"no .* mapping"):
            _ = k[loc]
        assert all(torch.equal(x, y) for x, y in zip(before, _storages(native), strict=True))
        loc = b.register_allocator_mapping(native, seed=layer_id)[:2]
        k, _ = pool.get_kv_buffer(layer_id)  # the views address the registered mapping's space
    pool.set_kv_buffer(radix_layer(layer_id), loc, keys, None)
    back = k[loc]
    assert torch.equal(back, pool.kvcompat.read(layer_id, _slots(native, loc)))
    assert (back.float() - keys.float()).abs().max() <= keys.float().abs().max() / 16
    with pytest.raises(CompatViewError, match=r"Tensor\.view\(\)"):
        k.view(k.shape[0], -1)  # what SGLang's fused-write helpers do with the buffer


def _storages(native: Any) -> list[torch.Tensor]:
    swa = getattr(native, "swa_kv_pool", None)
    return list((native if swa is None else swa).kv_buffer)


def _slots(native: Any, loc: torch.Tensor) -> torch.Tensor:
    """Where a compat location's row lives: the pool's own translation, where it has one."""
    if getattr(native, "full_to_swa_index_mapping", None) is not None:
        return native.translate_loc_from_full_to_swa(loc)
    if getattr(native, "full_to_hisparse_device_index_mapping", None) is not None:
        return native.translate_loc_to_hisparse_device(loc).long()
    return loc


@pytest.mark.parametrize("case", _CASES)
def test_getters_are_native_tensors_or_logical_views(case: PoolCase) -> None:
    native = case.build()
    pool = kvcompat.compat(native)
    adapter = pool.kvcompat
    for layer_id in case.layer_ids:
        key = pool.get_key_buffer(layer_id)
        storage = adapter.get_key_buffer(layer_id)
        if not isinstance(key, LogicalView):
            assert case.family not in ("single", "dsv4_token", "index"), case.id
            assert key is storage, case.id
            if adapter.kind.has_values:
                assert pool.get_kv_buffer(layer_id) is adapter.get_kv_buffer(layer_id)
                assert pool.get_value_buffer(layer_id) is adapter.get_value_buffer(layer_id)
            continue
        assert key.storage_tensor is storage, case.id
        allocated = b.register_allocator_mapping(native, seed=layer_id)
        loc = torch.tensor([3, 4, 1]) if allocated is None else allocated[[3, 4, 1]]
        key = pool.get_key_buffer(layer_id)  # rebuilt for the mapping's location space
        values = torch.randn(3, *key.shape[1:]).to(torch.bfloat16)
        adapter.write(layer_id, _slots(native, loc), values)
        assert torch.equal(key[loc], adapter.read(layer_id, _slots(native, loc))), case.id


@pytest.mark.parametrize("case", _CASES)
def test_every_shape_probe_returns_the_models_dimensions(case: PoolCase) -> None:
    native = case.build()
    pool = kvcompat.compat(native)
    value_dim = _model_value_dim(case, native)
    for layer_id in case.layer_ids:
        key = pool.get_key_buffer(layer_id)
        if case.family in ("single", "dsv4_token"):
            assert key.shape[1:] == (1, 512), case.id
        if case.family == "index":
            assert key.shape[1:] == (1, native.index_head_dim), case.id
        if value_dim is None:
            with pytest.raises(kvcompat.NoValueBufferError):
                pool.get_value_buffer(layer_id)
            continue
        assert pool.get_value_buffer(layer_id).shape[-1] == value_dim, case.id
        k, v = pool.get_kv_buffer(layer_id)
        assert (k.shape, v.shape) == (key.shape, pool.get_value_buffer(layer_id).shape)
    # SGLang's own helper, calling get_kv_buffer(self.start_layer) on the proxy (0.5.12's
    # pools have no such helper):
    require(
        hasattr(type(native), "get_kv_buffer_shape"), f"{type(native).__name__}.get_kv_buffer_shape"
    )
    start = getattr(native, "start_layer", 0) or 0
    owner = next(cls for cls in type(native).__mro__ if "get_kv_buffer_shape" in vars(cls))
    if value_dim is None:
        with pytest.raises(kvcompat.NoValueBufferError):
            pool.get_kv_buffer_shape()
    elif owner.__name__ == "KVCache" and start not in case.layer_ids:
        # The base helper asks get_kv_buffer(self.start_layer). SWAKVPool hard-codes
        # start_layer = 0, so a stage serving layers 4..7 has no layer 0 (natively a
        # KeyError from layers_mapping); HybridLinearKVPool keeps the stage's start_layer
        # for its sparse full-attention ids and used the base helper in 0.5.15-0.5.16
        # (natively a ValueError; 0.5.13-0.5.14 have no helper), from 0.5.17 it
        # delegates to its full pool.
        with pytest.raises(kvcompat.LayerOutOfRangeError):
            pool.get_kv_buffer_shape()
    else:
        k_shape, v_shape = pool.get_kv_buffer_shape()
        assert v_shape[-1] == value_dim, case.id
        if case.family in ("single", "dsv4_token"):
            assert k_shape[1:] == (1, 512)


@pytest.mark.parametrize("case", _CASES)
def test_the_proxy_is_transparent_to_isinstance_detectors_and_inspection(case: PoolCase) -> None:
    native = case.build()
    pool = kvcompat.compat(native)
    assert isinstance(pool, type(native))
    assert kvcompat.pool_kind(pool) is kvcompat.pool_kind(native)
    for detector in (
        kvcompat.is_single_kv_pool, kvcompat.is_split_kv_pool, kvcompat.is_latent_pool,
        kvcompat.is_key_only_pool, kvcompat.is_composite_pool, kvcompat.is_supported_pool,
    ):  # fmt: skip
        assert detector(pool) == detector(native), detector.__name__
    assert kvcompat.adapt(pool) is pool.kvcompat
    assert describe(pool).to_dict() == describe(native).to_dict()
    assert memory_report(pool) == memory_report(native)
    assert transfer_descriptors(pool) == transfer_descriptors(native)


def _module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def test_kv_canary_registry_accepts_the_proxy() -> None:
    prepare_sglang()
    require(_module_exists("sglang.srt.kv_canary.pool_patcher"), "sglang.srt.kv_canary")
    from sglang.srt.kv_canary.pool_patcher import api

    for build in (b.build_mha_pool, b.build_swa_pool, b.build_dsv4_token_pool):
        native = build()
        proxy = kvcompat.compat(native)
        attacher = api._POOL_ATTACHERS.get(type(proxy))
        assert attacher is api._POOL_ATTACHERS[type(native)], build.__name__


def test_sglangs_fused_write_helper_through_the_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    prepare_sglang()
    import sglang.srt.models.utils as model_utils

    # 0.5.12's helper reads the pool from the ForwardBatch, not from a pool getter.
    require(
        hasattr(model_utils, "get_token_to_kv_pool"), "sglang.srt.models.utils.get_token_to_kv_pool"
    )
    layer = radix_layer(0)
    layer.k_scale = layer.v_scale = None
    batch = type("Batch", (), {"out_cache_loc": torch.tensor([1, 2])})()
    value = torch.zeros(2, 16)
    native = b.build_mha_pool()
    monkeypatch.setattr(model_utils, "get_token_to_kv_pool", lambda: native)
    expected = model_utils.create_fused_set_kv_buffer_arg(value, layer, batch)
    monkeypatch.setattr(model_utils, "get_token_to_kv_pool", lambda: kvcompat.compat(native))
    got = model_utils.create_fused_set_kv_buffer_arg(value, layer, batch)
    assert got.k_buffer.data_ptr() == expected.k_buffer.data_ptr()
    assert got.v_buffer.data_ptr() == expected.v_buffer.data_ptr()
    v4 = kvcompat.compat(b.build_dsv4_single_pool())
    monkeypatch.setattr(model_utils, "get_token_to_kv_pool", lambda: v4)
    with pytest.raises(
        CompatViewError, match=r"Tensor\.view\(\)"
    ):  # was: token-row args over pages
        model_utils.create_fused_set_kv_buffer_arg(value, layer, batch)


@functools.cache
def _mapped_pool(kind: str) -> Any:
    return b.build_dsv4_token_pool() if kind == "dsv4_token" else b.build_hisparse_c4_pool()


@settings(max_examples=30, deadline=None)
@given(
    kind=st.sampled_from(["dsv4_token", "hisparse"]),
    seed=st.integers(0, 2**16),
    pick=st.integers(0, 2**16),
    n=st.integers(1, 6),
    via=st.sampled_from(["set_kv_buffer", "view[loc] = x"]),
)
def test_a_compat_write_then_a_compat_gather_returns_what_was_written(
    kind: str, seed: int, pick: int, n: int, via: str
) -> None:
    # Any allocator-shaped mapping, any allocated locations, any layer (on the composite:
    # ratio 0, c4 and c128 layers): the gather at loc returns the row written at loc, and
    # no other byte of the pool changes.
    native = _mapped_pool(kind)
    allocated = b.register_allocator_mapping(native, seed=seed)
    pool = kvcompat.compat(native)
    layer_id = pool.kvcompat.layer_ids[pick % len(pool.kvcompat.layer_ids)]
    gen = torch.Generator().manual_seed(pick)
    loc = allocated[torch.randperm(allocated.numel(), generator=gen)[:n]]
    keys = torch.randn(loc.numel(), 1, 512, generator=gen).to(torch.bfloat16)
    before = [t.clone() for t in _storages(native)]
    if via == "set_kv_buffer":
        pool.set_kv_buffer(radix_layer(layer_id), loc, keys, None)
    else:
        pool.get_key_buffer(layer_id)[loc] = keys
    back = pool.get_key_buffer(layer_id)[loc]
    assert (back.float() - keys.float()).abs().max() <= keys.float().abs().max() / 16
    slots = _slots(native, loc)
    assert torch.equal(back, pool.kvcompat.read(layer_id, slots))
    changed = _changed_rows(before, _storages(native), layer_id - pool.kvcompat.layer_ids[0])
    assert changed <= {int(s) // native.page_size for s in slots}  # only the written pages


def _changed_rows(before: list[torch.Tensor], after: list[torch.Tensor], index: int) -> set[int]:
    """Pages that differ, asserting every other layer's storage is untouched."""
    for i, (x, y) in enumerate(zip(before, after, strict=True)):
        if i != index:
            assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), i
    x, y = before[index].view(torch.uint8), after[index].view(torch.uint8)
    return {int(p) for p in (x != y).reshape(x.shape[0], -1).any(1).nonzero().flatten()}


def test_hisparse_mha_pool_refuses_a_plain_loc_its_native_tensors_cannot_mean() -> None:
    # HiSparseMHAMainPool's getters are its native tensors, indexed by device slot, while its
    # native set_kv_buffer takes logical locations: through compat a plain loc would be
    # written to one slot and read back from another, so it is refused (nothing written).
    try:
        module = importlib.import_module("sglang.srt.mem_cache.hisparse_memory_pool")
    except ModuleNotFoundError:
        module = None
    cls = getattr(module, "HiSparseMHAMainPool", None)
    require(cls, "HiSparseMHAMainPool")
    native = cls(
        size=b.SIZE, page_size=b.MHA_PAGE, dtype=torch.bfloat16, head_num=b.HEAD_NUM,
        head_dim=b.HEAD_DIM, layer_num=2, device="cpu", enable_memory_saver=False,
    )  # fmt: skip
    mapping, logical = b.allocator_mapping(2 * (b.SIZE + b.MHA_PAGE), b.SIZE + b.MHA_PAGE, seed=3)
    native.register_mapping(mapping)
    pool = kvcompat.compat(native)
    k = torch.randn(2, b.HEAD_NUM, b.HEAD_DIM).to(torch.bfloat16)
    before = [t.clone() for t in native.k_buffer + native.v_buffer]
    with pytest.raises(kvcompat.WriteError, match="indexed by device slot"):
        pool.set_kv_buffer(radix_layer(1), logical[:2], k, k)
    after = native.k_buffer + native.v_buffer
    assert all(torch.equal(x, y) for x, y in zip(before, after, strict=True))
    slots = native.translate_loc_to_hisparse_device(logical[:2])
    pool.kvcompat.write(1, slots, k, 2 * k)  # the hint's form
    assert torch.equal(pool.get_key_buffer(1)[slots], k)
    assert torch.equal(pool.get_value_buffer(1)[slots], 2 * k)
