"""Inspection of SGLang's own pool classes, under every release of the matrix.

For every class that constructs on CPU (and the DeepSeek-V4 composite in each of its
storage modes): no native getter, property or wait runs; every allocation is counted
once; every path resolves; layer ids agree with the adapters; and the transfer
descriptors equal SGLang's own ``get_*_buf_infos()`` where SGLang has them. A case whose
class, constructor parameter or mode the installed release lacks is a capability skip
(``_sglang.features``), counted per release by ``tests/release_matrix.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from _sglang import builders as b
from _sglang.env import prepare_sglang
from _sglang.features import ReleaseLacks, require
from inspection._guards import instrument, resolve_path, storage_total

import kvcompat
from kvcompat.adapters import LeafAdapter
from kvcompat.inspection import (
    Role,
    TransferGroup,
    as_buf_infos,
    describe,
    memory_report,
    transfer_descriptors,
)

# -- builders ---------------------------------------------------------------------------------


def _hybrid_with_mamba() -> Any:
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape

    mp = prepare_sglang().memory_pool
    shape = Mamba2StateShape.create(
        tp_world_size=1,
        intermediate_size=16,
        n_groups=1,
        num_heads=2,
        head_dim=8,
        state_size=4,
        conv_kernel=4,
    )
    mamba = mp.MambaPool(
        size=4,
        spec_state_size=4,
        cache_params=Mamba2CacheParams(shape=shape, layers=[0, 2]),
        mamba_layer_ids=[0, 2],
        device="cpu",
    )
    return b.build_hybrid_linear_pool(mamba_pool=mamba)


def _dsv4_low_ratios() -> Any:
    """V4.1 with ratio-1/2 kv-source layers: shared compressed buffers, fp4 indexers."""
    return b.build_dsv4_token_pool(
        compression_ratios=(0, 1, 1, 2, 4, 128),
        kv_layout="v41",
        kv_source_layers=[1, 3],
        full_size=256,
    )


def _dsv4_request_window() -> Any:
    """DSv4.1 encoder replay: the SWA lives in a per-request window, not a paged pool."""
    lacks = "DeepSeek-V4 request-window SWA (enable_encoder_swa_bounded_replay)"
    try:
        from sglang.srt.runtime_context import get_exec
    except ImportError as exc:  # no runtime_context (0.5.12-0.5.13), or none with get_exec
        raise ReleaseLacks(lacks) from exc

    features = get_exec().features
    require(hasattr(features, "enable_encoder_swa_bounded_replay"), lacks)
    with features.override(enable_encoder_swa_bounded_replay=True):
        return b.build_dsv4_token_pool()


_KV = ("kv", "get_contiguous_buf_infos")
_STATE = ("state", "get_state_buf_infos")
_REQUEST = ("request_state", "get_request_state_buf_infos")  # 0.5.15-0.5.19: see _FORMERLY
_RING = ("swa_ring", "get_unified_swa_ring_buf_infos")

# case id -> (builder, SGLang's buf-info methods the descriptors must equal)
CASES: dict[str, tuple[Callable[[], Any], tuple[tuple[str, str], ...]]] = {
    "MHATokenToKVPool": (b.build_mha_pool, (_KV,)),
    "MHATokenToKVPool-stage": (lambda: b.build_mha_pool(start_layer=3, size=40), (_KV,)),
    "MHATokenToKOnlyPool": (b.build_k_only_pool, ()),
    "MLATokenToKVPool": (b.build_mla_pool, (_KV,)),
    "MLATokenToKVPool-fp8": (lambda: b.build_mla_pool(dtype=torch.float8_e4m3fn), (_KV,)),
    "DSATokenToKVPool": (b.build_dsa_pool, (_KV, _STATE)),
    "HybridLinearKVPool": (b.build_hybrid_linear_pool, (_KV,)),
    "HybridLinearKVPool-mamba": (_hybrid_with_mamba, (_KV, _STATE)),
    "SWAKVPool": (b.build_swa_pool, (_KV, _STATE)),
    "DeepSeekV4SingleKVPool": (b.build_dsv4_single_pool, ()),
    "DeepSeekV4SingleKVPool-v41": (lambda: b.build_dsv4_single_pool(kv_layout="v41"), ()),
    "DeepSeekV4SingleKVPool-v41_fp4": (lambda: b.build_dsv4_single_pool(kv_layout="v41_fp4"), ()),
    "DeepSeekV4UniformFP8KVPool": (b.build_dsv4_uniform_fp8_pool, ()),
    "HiSparseC4DevicePool": (b.build_hisparse_c4_pool, ()),
    "DeepSeekV4IndexerPool": (b.build_dsv4_indexer_pool, ()),
    "DeepSeekV4IndexerPool-fp4": (lambda: b.build_dsv4_indexer_pool(use_fp4_indexer=True), ()),
    "DeepSeekV4TokenToKVPool": (b.build_dsv4_token_pool, (_KV, _STATE, _REQUEST)),
    "DeepSeekV4TokenToKVPool-stage": (
        lambda: b.build_dsv4_token_pool(compression_ratios=(0, 4, 128, 4, 0), start_layer=2),
        (_KV, _STATE, _REQUEST),
    ),
    "DeepSeekV4TokenToKVPool-v41-low-ratios": (_dsv4_low_ratios, (_KV, _STATE, _REQUEST)),
    "DeepSeekV4TokenToKVPool-request-window": (_dsv4_request_window, (_KV, _STATE, _REQUEST)),
    "DeepSeekV4TokenToKVPool-unified": (b.build_dsv4_unified_pool, (_KV, _STATE, _REQUEST, _RING)),
}

# SGLang's earlier name of a buf-info method, tried where a release lacks the current one:
# 0.5.15-0.5.19 register the c128 compress states through get_c128_state_buf_infos().
_FORMERLY = {"get_request_state_buf_infos": "get_c128_state_buf_infos"}

COMPARISONS = [
    pytest.param(case, group, method, id=f"{case}-{group}")
    for case, (_, methods) in CASES.items()
    for group, method in methods
]


# The storage modes kvcompat cannot adapt yet (no paged SWA pool): described all the same.
UNADAPTABLE = ("DeepSeekV4TokenToKVPool-request-window", "DeepSeekV4TokenToKVPool-unified")


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=sorted(set(CASES) - set(UNADAPTABLE)))
def adaptable_case(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _build(case: str) -> Any:
    return CASES[case][0]()


# -- the guarantees, for every class ----------------------------------------------------------


def test_inspection_runs_no_native_getter_and_no_wait(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    native = _build(case)
    guard = instrument(monkeypatch, native)
    manifest = describe(native)
    memory_report(native)
    transfer_descriptors(native)
    guard.assert_untouched()
    assert guard.counters, "every pool object got a recording counter"
    assert list(manifest.iter_tensors())


def test_memory_counts_every_allocation_once(case: str) -> None:
    native = _build(case)
    report = memory_report(native)
    assert report.total_bytes == storage_total(native) > 0
    assert sum(report.tensor_bytes.values()) == report.total_bytes
    assert sum(report.by_layer.values()) + report.unlayered_bytes == report.total_bytes
    assert report.components[0].total_bytes == report.total_bytes


def test_every_path_resolves_to_its_tensor(case: str) -> None:
    native = _build(case)
    for entry in describe(native).iter_tensors():
        tensor = resolve_path(native, entry.path)
        assert tensor.data_ptr() == entry.data_ptr, entry.path
        assert tuple(tensor.shape) == entry.shape, entry.path
        assert tensor.untyped_storage().data_ptr() == entry.storage_ptr, entry.path


def test_layer_ids_agree_with_the_adapter(adaptable_case: str) -> None:
    native = _build(adaptable_case)
    adapter = kvcompat.adapt(native)
    manifest = describe(native)
    assert manifest.layer_ids == adapter.layer_ids
    assert manifest.kind is adapter.kind
    # A leaf may carry parts of its own (a DSA pool's indexer): the leaf and each part.
    parts = dict(adapter.components)
    if adapter.kind is not kvcompat.PoolKind.COMPOSITE:
        parts[manifest.name] = adapter
    nodes = {node.name: node for node in manifest.walk()}
    for name, part in parts.items():
        node = nodes[name]
        assert node.layer_ids == part.layer_ids, name
        assert isinstance(part, LeafAdapter)
        # The source list, or the storage it is a property over (IndexKeyCache.buffer).
        key_role = type(part).buffers[0].role
        attrs = {part.source_attr, *(b.attr for b in type(part).buffers if b.role == key_role)}
        primary = [e for e in node.tensors if any(e.path.endswith(f"{a}[0]") for a in attrs)]
        assert primary or not part.layer_ids, name
        for layer, slot in part.storage_slots.items():
            paths = {f"{node.path}.{a}[{slot}]".lstrip(".") for a in attrs}
            entry = next(e for e in node.tensors if e.path in paths)
            assert layer in entry.layer_ids, (name, layer, entry.layer_ids)
            key = part.get_key_buffer(layer, wait=False)
            assert key.data_ptr() == entry.data_ptr, (name, layer)


@pytest.mark.parametrize(("case_id", "group", "method"), COMPARISONS)
def test_descriptors_equal_sglang_buf_infos(case_id: str, group: str, method: str) -> None:
    native = _build(case_id)
    if not hasattr(native, method) and hasattr(native, _FORMERLY.get(method, "")):
        method = _FORMERLY[method]
    require(hasattr(native, method), f"{type(native).__name__}.{method}")
    theirs = tuple(list(column) for column in getattr(native, method)())
    ours = as_buf_infos(transfer_descriptors(native, group=group))
    window = getattr(native, "request_window", None)
    if group == "state" and window is not None and native.swa_kv_pool is None:
        pointers = {buf.data_ptr() for buf in window.state.kv_buffer}
        if not pointers & set(theirs[0]):
            # 0.5.21-0.5.22 register no SWA state for PD under encoder replay; from 0.5.23
            # SGLang registers the request window's, which kvcompat describes on every release.
            keep = [i for i, pointer in enumerate(ours[0]) if pointer not in pointers]
            assert len(keep) == len(ours[0]) - len(pointers), case_id
            ours = tuple([column[i] for i in keep] for column in ours)
    assert ours == theirs, f"{case_id}: {group} differs from {method}()"
    assert ours[0], f"{case_id}: SGLang registers something for {group}"


# -- DeepSeek-V4 --------------------------------------------------------------------------------


def test_dsv4_memory_is_reported_where_sglang_reports_zero() -> None:
    native = b.build_dsv4_token_pool()
    assert vars(native)["mem_usage"] == 0  # SGLang #37852: its own accounting sees nothing
    report = memory_report(native)
    assert report.total_bytes == storage_total(native) > 0
    names = [entry.name for entry in report.components]
    assert names == [
        "DeepSeekV4TokenToKVPool",
        "swa",
        "c4",
        "c4_indexer",
        "c128",
        "c4_state",
        "c128_state",
        "c4_indexer_state",
    ]
    assert report.component("swa").bytes == sum(buf.nbytes for buf in native.swa_kv_pool.kv_buffer)
    assert report.component("c128_state").bytes == (
        native.compress_state_pools[2].kv_score_buffer.kv_score.nbytes
    )
    assert set(report.by_role) == {"packed_kv", "index_keys", "compress_state"}


def test_dsv4_manifest_covers_every_part() -> None:
    native = b.build_dsv4_token_pool()
    manifest = describe(native)
    assert manifest.layout == "v4,c4:v4,c128:v4"
    if hasattr(native, "pd_kv_layout"):  # from 0.5.21
        assert manifest.layout == native.pd_kv_layout()
    parts = {node.name: node for node in manifest.children}
    assert parts["swa"].path == "swa_kv_pool"
    # The compressed pools are kept in dicts from 0.5.20, in named attributes before.
    keyed = isinstance(getattr(native, "kv_pools", None), dict)
    assert parts["c4"].path == ("kv_pools[4]" if keyed else "c4_kv_pool")
    assert parts["c4_indexer"].path == ("index_pools[4]" if keyed else "c4_indexer_kv_pool")
    assert parts["c4_indexer"].layout == "dsv4_indexer_fp8"
    assert parts["c4"].details["compress_ratio"] == 4
    assert parts["c128_state"].role is Role.COMPRESS_STATE
    # c128 states ship apart from the page states where SGLang registers them apart
    # (0.5.15 on); 0.5.12-0.5.14 keep them in get_state_buf_infos().
    apart = any(hasattr(native, m) for m in ("get_request_state_buf_infos", *_FORMERLY.values()))
    groups = {r.group for e in parts["c128_state"].tensors for r in e.regions}
    assert groups == {TransferGroup.REQUEST_STATE if apart else TransferGroup.STATE}
    assert parts["c128_state"].details.get("request_scoped", apart) is apart  # 0.5.21 on
    assert [e.path for e in parts["c4_state"].tensors] == [
        "compress_state_pools[1].kv_score_buffer.kv_score"
    ]
    assert [e.path for e in parts["c4_indexer_state"].tensors] == [
        "indexer_compress_state_pools[1].kv_score_buffer.kv_score"
    ]
    for node in manifest.children:
        for entry in node.tensors:
            assert entry.regions, f"{entry.path} is transferable"


def test_dsv4_low_ratio_layers_share_their_source_buffer() -> None:
    native = _dsv4_low_ratios()
    manifest = describe(native)
    if callable(getattr(native, "pd_kv_layout", None)):  # 0.5.23 on
        assert manifest.layout == native.pd_kv_layout()
    c1 = manifest.find("c1")
    (entry,) = c1.tensors
    assert entry.layer_ids == (1, 2)  # layer 2 reads the buffer layer 1 writes
    assert entry.layer_id == 1
    assert c1.layout == "v41_fp4"
    assert manifest.find("c1_indexer").layout == "dsv4_indexer_fp4_rne"  # index_k_rne
    adapter = kvcompat.adapt(native)
    assert dict(adapter.components["c1"].storage_slots) == {1: 0, 2: 0}
    request = transfer_descriptors(native, group="request_state")
    assert [(d.component, d.layer_id) for d in request] == [("c2_state", 3), ("c128_state", 5)]


@pytest.mark.parametrize("case_id", UNADAPTABLE)
def test_modes_kvcompat_cannot_adapt_are_still_described(case_id: str) -> None:
    native = _build(case_id)
    assert native.swa_kv_pool is None
    with pytest.raises(kvcompat.UnsupportedPoolError):
        kvcompat.adapt(native)
    manifest = describe(native)
    names = [node.name for node in manifest.walk()]
    assert "swa" not in names
    if native.request_window is not None:
        window = manifest.find("request_window")
        assert window.role is Role.REQUEST_WINDOW
        assert [child.name for child in window.children] == ["window", "window_workspace"]
        assert manifest.find("window").layer_ids == manifest.layer_ids
        assert manifest.find("window_workspace").role is Role.WORKSPACE
        assert "request_window.tags" in {e.path for e in window.tensors}
    else:
        unified = manifest.find("unified")
        assert unified.layout == "dsv4-unified-bf16"
        assert [e.layer_ids for e in unified.tensors] == [(0,), (1,), (2,)]
        assert {r.group.value for e in unified.tensors for r in e.regions} == {"swa_ring", "kv"}
    assert memory_report(native).total_bytes == storage_total(native)


def test_the_guard_is_armed_on_real_pools(monkeypatch: pytest.MonkeyPatch) -> None:
    native = b.build_dsv4_token_pool()
    guard = instrument(monkeypatch, native)
    native.get_extra_key_buffer(1)  # waits, then calls the c4 pool's getter
    _ = native.compress_state_pools[1].kv_score_buffer.kv  # a computing property
    assert "DeepSeekV4TokenToKVPool.get_extra_key_buffer" in guard.calls
    assert "DeepSeekV4TokenToKVPool.wait_layer_transfer" in guard.calls
    assert "DeepSeekV4SingleKVPool.get_key_buffer" in guard.calls
    assert "KVAndScore.kv" in guard.calls
    assert guard.waits == [1]
