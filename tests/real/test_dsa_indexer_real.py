"""A DSA pool's index keys as its ``indexer`` component, on the real SGLang classes.

``kvcompat.adapt(DSATokenToKVPool(...)).components["indexer"]`` serves the pool's own
index-key store (``index_k_with_scale_buffer``: ``IndexKeyCache.buffer`` in recent
releases, a list on the pool before; ``NSATokenToKVPool`` on 0.5.12) in the DeepSeek-V4
fp8 indexer layout at ``index_page_size``. Byte-for-byte agreement with SGLang's own writer
(``set_index_k_scale_buffer``, a Triton kernel) is an oracle check run under the Triton
interpreter (``tests/layouts/_oracle/dsv4_indexer_fp8.py::dsa_indexer_component_store``);
here: the storage it serves, its waits, round trips and untouched bytes, refusals,
describe / memory / transfer descriptors / check_pool, and the composites that wrap a
DSA pool. Every release without a feature skips by capability (``_sglang.features``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _sglang import builders as b
from _sglang.features import accepts, has_class, pool_class, require, sglang_code
from hypothesis import given, settings
from hypothesis import strategies as st

import kvcompat
from kvcompat.adapters.sglang import DSAIndexKeyAdapter
from kvcompat.inspection import as_buf_infos, describe, memory_report, transfer_descriptors
from kvcompat.layouts import DSV4_INDEXER_FP8, dequantize, quantize
from kvcompat.testing import RecordingLayerCounter, check_pool

_HISPARSE = (("sglang.srt.mem_cache.hisparse_memory_pool", "HiSparseDSATokenToKVPool"),)


# -- pools ------------------------------------------------------------------------------------


def _dsa_class() -> Any:
    """``DSATokenToKVPool``, or 0.5.12's ``NSATokenToKVPool`` (ReleaseLacks without either)."""
    return pool_class("DSATokenToKVPool" if has_class("DSATokenToKVPool") else "NSATokenToKVPool")


def build_dsa(start_layer: int = 0, layer_num: int = 2, **extra: Any) -> Any:
    """A DSA pool of the installed release; ``extra`` constructor arguments by capability."""
    cls = _dsa_class()
    for name in extra:
        require(accepts(cls, name), f"{cls.__name__}({name}=...)")
    build = b.build_dsa_pool if cls.__name__ == "DSATokenToKVPool" else b.build_nsa_pool
    if not extra:
        return build(start_layer=start_layer, layer_num=layer_num)
    return cls(
        size=b.SIZE,
        page_size=extra.pop("page_size", b.DSA_PAGE),
        kv_lora_rank=b.KV_LORA_RANK,
        dtype=torch.bfloat16,
        qk_rope_head_dim=b.QK_ROPE,
        layer_num=layer_num,
        device=b.DEVICE,
        index_head_dim=b.DSA_INDEX_HEAD_DIM,
        enable_memory_saver=False,
        kv_cache_dim=b.DSA_KV_CACHE_DIM,
        start_layer=start_layer,
        end_layer=start_layer + layer_num - 1,
        **extra,
    )


def build_hisparse_dsa(start_layer: int = 1) -> Any:
    """``HiSparseDSATokenToKVPool``: latent rows by device slot, index keys by logical loc."""
    cls = sglang_code(*_HISPARSE)
    wanted = ("start_layer", "end_layer", "kv_cache_dim")
    require(all(accepts(cls, name) for name in wanted), "HiSparseDSATokenToKVPool(start_layer=...)")
    return cls(
        size=b.SIZE,
        page_size=b.DSA_PAGE,
        kv_lora_rank=b.KV_LORA_RANK,
        dtype=torch.bfloat16,
        qk_rope_head_dim=b.QK_ROPE,
        layer_num=2,
        device=b.DEVICE,
        index_head_dim=b.DSA_INDEX_HEAD_DIM,
        enable_memory_saver=False,
        kv_cache_dim=b.DSA_KV_CACHE_DIM,
        start_layer=start_layer,
        end_layer=start_layer + 1,
    )


_MLA_ARGS = {"kv_lora_rank": b.KV_LORA_RANK, "qk_rope_head_dim": b.QK_ROPE}


def build_hybrid_dsa(full_ids: tuple[int, ...] = (1, 3), start_layer: int = 0) -> Any:
    """``HybridLinearKVPool`` whose full-attention sub-pool is a DSA pool (``use_dsa``)."""
    cls = pool_class("HybridLinearKVPool")
    wanted = ("use_mla", "use_dsa", "index_head_dim", "kv_cache_dim")
    require(all(accepts(cls, name) for name in wanted), "HybridLinearKVPool(use_dsa=...)")
    return cls(
        size=b.SIZE,
        dtype=torch.bfloat16,
        page_size=b.DSA_PAGE,
        head_num=1,
        head_dim=b.DSA_KV_CACHE_DIM,
        full_attention_layer_ids=list(full_ids),
        device=b.DEVICE,
        mamba_pool=None,
        enable_memory_saver=False,
        use_mla=True,
        use_dsa=True,
        index_head_dim=b.DSA_INDEX_HEAD_DIM,
        kv_cache_dim=b.DSA_KV_CACHE_DIM,
        start_layer=start_layer,
        **_MLA_ARGS,
    )


def build_swa_dsa() -> Any:
    """``SWAKVPool`` with a DSA full pool and an MLA sliding pool, as SGLang's configurator
    builds hybrid MLA/SWA models (``_build_hybrid_mla_swa_kv_pool``)."""
    cls = pool_class("SWAKVPool")
    require(accepts(cls, "full_kv_pool_kwargs"), "SWAKVPool(full_kv_pool_kwargs=...)")
    common = {"page_size": b.DSA_PAGE, "device": b.DEVICE, "enable_memory_saver": False}
    return cls(
        size=b.SIZE,
        size_swa=b.SIZE,
        page_size=b.DSA_PAGE,
        dtype=torch.bfloat16,
        head_num=0,
        head_dim=0,
        swa_attention_layer_ids=[0, 2],
        full_attention_layer_ids=[1, 3],
        device=b.DEVICE,
        full_kv_pool_class=pool_class("DSATokenToKVPool"),
        swa_kv_pool_class=pool_class("MLATokenToKVPool"),
        full_kv_pool_kwargs={
            **common,
            **_MLA_ARGS,
            "index_head_dim": b.DSA_INDEX_HEAD_DIM,
            "kv_cache_dim": b.DSA_KV_CACHE_DIM,
        },
        swa_kv_pool_kwargs={**common, **_MLA_ARGS},
    )


def _snapshot(native: Any) -> list[torch.Tensor]:
    """Every index-key and latent byte of a DSA pool."""
    return [
        t.view(torch.uint8).clone() for t in (*native.index_k_with_scale_buffer, *native.kv_buffer)
    ]


def _same(before: list[torch.Tensor], native: Any) -> bool:
    return all(torch.equal(a, c) for a, c in zip(before, _snapshot(native), strict=True))


def _keys(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    scale = torch.exp2(torch.randint(-6, 6, (n, 1, 1), generator=gen).float())
    return (torch.randn(n, 1, 128, generator=gen) * scale).to(torch.bfloat16)


# -- the component ----------------------------------------------------------------------------


@pytest.mark.parametrize("start_layer", [0, 2])
def test_the_indexer_component_serves_the_pools_own_index_store(start_layer: int) -> None:
    native = build_dsa(start_layer)
    pool = kvcompat.adapt(native)
    assert kvcompat.pool_kind(native) is kvcompat.PoolKind.LATENT  # the pool stays latent
    assert pool.kind is kvcompat.PoolKind.LATENT
    assert list(pool.components) == ["indexer"]
    part = pool.components["indexer"]
    assert isinstance(part, DSAIndexKeyAdapter)
    assert part.kind is kvcompat.PoolKind.KEY_ONLY
    assert part.layer_ids == pool.layer_ids == (start_layer, start_layer + 1)
    page = int(getattr(native, "index_page_size", native.page_size))
    assert part.page_size == page
    for slot, layer in enumerate(part.layer_ids):
        assert part.component_for(layer) == "indexer"
        assert pool.component_for(layer) is None  # the latent rows are the pool's own
        key = part.get_key_buffer(layer, wait=False)
        assert key is native.index_k_with_scale_buffer[slot]
        theirs = native.get_index_k_with_scale_buffer(layer)  # SGLang's reader (a view)
        assert (key.data_ptr(), key.shape, key.stride()) == (
            theirs.data_ptr(),
            theirs.shape,
            theirs.stride(),
        )
        assert part.layout(layer).key is DSV4_INDEXER_FP8
        with pytest.raises(kvcompat.NoValueBufferError):
            part.get_value_buffer(layer)
    with pytest.raises(kvcompat.LayerOutOfRangeError):
        part.get_key_buffer(start_layer + 2)
    assert pool.components["indexer"] is part  # built once


def test_hisparse_index_keys_are_addressed_by_logical_loc() -> None:
    """HiSparse keeps latent rows by device slot but index keys by logical location, over
    ``size * host_to_device_ratio`` tokens: the component's capacity is the index cache's."""
    native = build_hisparse_dsa(start_layer=1)
    require(hasattr(native, "index_buf_size"), "HiSparseDSATokenToKVPool.index_buf_size")
    part = kvcompat.adapt(native).components["indexer"]
    assert part.layer_ids == (1, 2)
    assert part.size == native.index_buf_size == 2 * native.size
    loc = torch.tensor([native.size + 5, 3])  # beyond the latent's size: the index cache's own
    keys = _keys(2, seed=1)
    part.write(2, loc, keys)
    expected = torch.zeros_like(native.index_k_with_scale_buffer[1])
    quantize(DSV4_INDEXER_FP8, keys.reshape(2, 128), expected, loc, part.page_size)
    assert torch.equal(native.index_k_with_scale_buffer[1], expected)
    assert check_pool(native).ok


@pytest.mark.parametrize("start_layer", [0, 3])
def test_the_indexer_waits_like_sglangs_index_getter(start_layer: int) -> None:
    native = build_dsa(start_layer)
    counter = RecordingLayerCounter()
    native.register_layer_transfer_counter(counter)
    part = kvcompat.adapt(native).components["indexer"]
    for layer in part.layer_ids:
        counter.waits.clear()
        native.get_index_k_with_scale_buffer(layer)
        want = list(counter.waits)
        counter.waits.clear()
        part.get_key_buffer(layer)
        assert counter.waits == want == [layer - start_layer]
        counter.waits.clear()
        part.get_key_buffer(layer, wait=False)
        assert counter.waits == []


# -- read / write -----------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    start_layer=st.sampled_from([0, 2]),
    which=st.integers(0, 1),
    picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=12, unique=True),
    seed=st.integers(0, 2**16),
)
def test_write_then_read_round_trips_and_touches_only_the_written_rows(
    start_layer: int, which: int, picks: list[int], seed: int
) -> None:
    """Any distinct locations in any order, over every page, on either layer: the stored
    bytes are the codec's (placement, scales) and no other byte of the pool moves."""
    native = build_dsa(start_layer)
    for index, buf in enumerate(native.index_k_with_scale_buffer):
        gen = torch.Generator().manual_seed(seed + index)
        buf.copy_(torch.randint(0, 256, buf.shape, generator=gen, dtype=torch.uint8))
    part = kvcompat.adapt(native).components["indexer"]
    layer = start_layer + which
    target = native.index_k_with_scale_buffer[which]
    capacity = target.shape[0] * part.page_size
    loc = torch.tensor(list(dict.fromkeys(p % capacity for p in picks)))
    keys = _keys(loc.numel(), seed)
    before = _snapshot(native)
    expected = target.clone()
    quantize(DSV4_INDEXER_FP8, keys.reshape(-1, 128), expected, loc, part.page_size)
    part.write(layer, loc, keys)
    after = _snapshot(native)
    for index, (old, new) in enumerate(zip(before, after, strict=True)):
        if index == which:
            assert torch.equal(new, expected), "written bytes are not the codec's, or others moved"
        else:
            assert torch.equal(new, old), f"buffer {index} changed"
    back = part.read(layer, loc)
    assert back.shape == (loc.numel(), 1, 128)
    assert torch.equal(
        back.reshape(-1, 128), dequantize(DSV4_INDEXER_FP8, expected, loc, part.page_size)
    )
    bound = keys.float().abs() * 2**-4 + keys.float().abs().amax(dim=-1, keepdim=True) / 448 * 2**-8
    assert ((back.float() - keys.float()).abs() <= bound + 1e-30).all()


@pytest.mark.parametrize(
    ("loc", "keys", "why"),
    [
        (torch.tensor([1, 200000]), _keys(2, 0), "out of range"),
        (torch.tensor([5, 5]), _keys(2, 0), "duplicate"),
        (
            torch.tensor([1, 2]),
            _keys(2, 0).masked_fill(torch.arange(128) == 7, float("nan")),
            "nan",
        ),
        (torch.tensor([1, 2]), _keys(3, 0), "shape"),
        (torch.tensor([1.0, 2.0]), _keys(2, 0), "dtype"),
    ],
    ids=["range", "duplicate", "nan", "shape", "loc-dtype"],
)
def test_a_refused_write_changes_nothing(loc: torch.Tensor, keys: torch.Tensor, why: str) -> None:
    native = build_dsa(2)
    part = kvcompat.adapt(native).components["indexer"]
    before = _snapshot(native)
    with pytest.raises(kvcompat.WriteError) as info:
        part.write(3, loc, keys)
    assert "indexer" in str(info.value), why  # the message names the component
    assert _same(before, native), f"a refused write ({why}) changed bytes"


def test_a_latent_write_leaves_the_index_keys_alone_and_back() -> None:
    native = build_dsa(1)
    pool = kvcompat.adapt(native)
    index_before = [t.clone() for t in native.index_k_with_scale_buffer]
    latent = torch.randn(2, 1, b.DSA_KV_CACHE_DIM).to(torch.bfloat16)
    pool.write(2, torch.tensor([9, 4]), latent)
    assert all(
        torch.equal(a, c)
        for a, c in zip(index_before, native.index_k_with_scale_buffer, strict=True)
    )
    latent_before = [t.clone() for t in native.kv_buffer]
    pool.components["indexer"].write(2, torch.tensor([9, 4]), _keys(2, 3))
    assert all(torch.equal(a, c) for a, c in zip(latent_before, native.kv_buffer, strict=True))


# -- layers without index keys, and pools kvcompat has no codec for -----------------------------


def test_skip_topk_layers_are_not_served_and_still_transferred_like_sglang() -> None:
    native = build_dsa(2, skip_topk_layers=[False, True])
    pool = kvcompat.adapt(native)
    part = pool.components["indexer"]
    assert pool.layer_ids == (2, 3)
    assert part.layer_ids == (2,)  # layer 3 keeps a 0-row placeholder
    with pytest.raises(kvcompat.LayerOutOfRangeError):
        part.get_key_buffer(3)
    ours = as_buf_infos(transfer_descriptors(native, group="state"))
    assert tuple(list(x) for x in ours) == tuple(list(x) for x in native.get_state_buf_infos())
    assert check_pool(native).ok


def test_every_layer_skipping_topk_leaves_no_indexer_component() -> None:
    native = build_dsa(0, skip_topk_layers=[True, True])
    assert dict(kvcompat.adapt(native).components) == {}


def test_pooled_index_keys_are_refused_with_a_reason_and_nothing_moves() -> None:
    """``index_kpool=2`` folds two tokens into each index key: a token location does not
    address one key, so read and write refuse; the raw bytes stay reachable."""
    try:  # 0.5.23: 64-token index pages, so page_size = 64 * index_kpool
        native = build_dsa(0, page_size=2 * b.DSA_PAGE, index_kpool=2)
    except AssertionError:  # 0.5.20-0.5.21 assert page_size == 64 whatever index_kpool is
        native = build_dsa(0, page_size=b.DSA_PAGE, index_kpool=2)
    part = kvcompat.adapt(native).components["indexer"]
    assert part.get_key_buffer(0, wait=False) is native.index_k_with_scale_buffer[0]
    before = _snapshot(native)
    with pytest.raises(kvcompat.LayoutError, match="index_kpool=2"):
        part.write(0, torch.tensor([1]), _keys(1, 0))
    with pytest.raises(kvcompat.LayoutError, match="Hint"):
        part.read(0, torch.tensor([1]))
    assert _same(before, native)
    assert describe(native).children[0].layout is None


def test_index_keys_stored_in_another_dtype_are_refused() -> None:
    """Some builds keep bf16 index keys (``index_cache_is_bf16``): not the packed bytes."""
    native = build_dsa(0)
    part = kvcompat.adapt(native).components["indexer"]
    stored = native.index_k_with_scale_buffer
    stored[1] = torch.zeros_like(stored[1]).view(torch.bfloat16)  # same bytes, other dtype
    before = _snapshot(native)
    with pytest.raises(kvcompat.LayoutError, match="bfloat16"):
        part.write(1, torch.tensor([3]), _keys(1, 0))
    assert _same(before, native)
    part.write(0, torch.tensor([3]), _keys(1, 0))  # the other layer is still served


# -- inspection -------------------------------------------------------------------------------


def test_describe_memory_and_transfers_show_the_indexer_as_a_child() -> None:
    native = build_dsa(2)
    manifest = describe(native)
    assert [child.name for child in manifest.children] == ["indexer"]
    child = manifest.children[0]
    assert child.kind is kvcompat.PoolKind.KEY_ONLY
    assert child.layout == DSV4_INDEXER_FP8.name
    assert child.layer_ids == (2, 3)
    index_ptrs = {t.data_ptr() for t in native.index_k_with_scale_buffer}
    assert {t.data_ptr for t in child.tensors} == index_ptrs
    assert not index_ptrs & {t.data_ptr for t in manifest.tensors}  # not twice
    assert all(t.role.value == "index_keys" for t in child.tensors)
    report = memory_report(native)
    entry = next(c for c in report.components if c.name == "indexer")
    assert entry.bytes == sum(t.nbytes for t in native.index_k_with_scale_buffer)
    assert report.total_bytes == sum(c.bytes for c in report.components)
    for group, method in (("kv", "get_contiguous_buf_infos"), ("state", "get_state_buf_infos")):
        ours = tuple(list(x) for x in as_buf_infos(transfer_descriptors(native, group=group)))
        assert ours == tuple(list(x) for x in getattr(native, method)()), group
    adapter = kvcompat.adapt(native)
    assert describe(adapter.components["indexer"]).layout == DSV4_INDEXER_FP8.name


def test_check_pool_checks_the_latent_rows_and_the_indexer() -> None:
    report = check_pool(build_dsa(2))
    assert report.ok, str(report)
    from kvcompat.testing._check import _leaves

    assert [label for label, _ in _leaves(kvcompat.adapt(build_dsa(2)), "")] == [
        _dsa_class().__name__,
        "indexer",
    ]


# -- composites that wrap a DSA pool ------------------------------------------------------------


def test_hybrid_linear_carries_the_dsa_indexer_with_global_ids_and_its_wait() -> None:
    native = build_hybrid_dsa(full_ids=(1, 3), start_layer=1)
    counter = RecordingLayerCounter()
    native.register_layer_transfer_counter(counter)
    pool = kvcompat.adapt(native)
    assert list(pool.components) == ["full"]
    part = pool.components["full"].components["indexer"]
    assert part.layer_ids == (1, 3)
    for dense, layer in enumerate((1, 3)):
        counter.waits.clear()
        theirs = native.get_index_k_with_scale_buffer(layer)  # SGLang: global id, one wait
        want = list(counter.waits)
        counter.waits.clear()
        key = part.get_key_buffer(layer)
        assert counter.waits == want, f"layer {layer}: kvcompat waited {counter.waits}"
        assert key is native.full_kv_pool.index_k_with_scale_buffer[dense]
        assert key.data_ptr() == theirs.data_ptr()
    part.write(3, torch.tensor([2, 0]), _keys(2, 4), impl="torch")
    assert not native.full_kv_pool.index_k_with_scale_buffer[0].any()  # layer 1 untouched
    assert native.full_kv_pool.index_k_with_scale_buffer[1].any()
    assert check_pool(native).ok
    child = describe(native).children[0].children[0]
    assert (child.name, child.layer_ids) == ("indexer", (1, 3))


def test_swa_pool_with_a_dsa_full_pool_serves_its_indexer_on_full_layers() -> None:
    native = build_swa_dsa()
    pool = kvcompat.adapt(native)
    assert dict(pool.components["swa"].components) == {}  # the sliding pool is MLA
    part = pool.components["full"].components["indexer"]
    assert part.layer_ids == (1, 3)
    for layer in (1, 3):
        theirs = native.get_index_k_with_scale_buffer(layer)
        assert part.get_key_buffer(layer, wait=False).data_ptr() == theirs.data_ptr()
    assert check_pool(native).ok
