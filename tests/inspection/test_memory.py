"""memory_report(): each allocation counted once, bytes attributed so that everything adds up."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvcompat.inspection import Role, describe, memory_report
from kvcompat.testing import (
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
    ReferenceMLATokenToKVPool,
    reference_swa_pool,
)

from ._guards import storage_total


def _check_invariants(native: Any) -> None:
    report = memory_report(native)
    assert report.total_bytes == storage_total(native) > 0
    assert sum(report.tensor_bytes.values()) == report.total_bytes
    assert sum(report.by_role.values()) == report.total_bytes
    assert sum(report.by_layer.values()) + report.unlayered_bytes == report.total_bytes
    assert sum(report.by_device.values()) == report.total_bytes
    assert sum(block.nbytes for block in report.storages) == report.total_bytes
    assert report.components[0].total_bytes == report.total_bytes
    assert len({(b.device, b.ptr) for b in report.storages}) == len(report.storages)


@pytest.mark.parametrize(
    "native",
    [
        ReferenceMHATokenToKVPool(32, 16, head_num=2, head_dim=8, layer_num=3),
        ReferenceMHATokenToKVPool(30, 16, head_num=2, head_dim=8, layer_num=2),  # padded halves
        ReferenceMHATokenToKVPool(32, 16, head_dim=8, v_head_dim=4, layer_num=2),  # separate K, V
        ReferenceMLATokenToKVPool(32, 16, kv_lora_rank=32, qk_rope_head_dim=16, layer_num=2),
        ReferenceDeepSeekV4SingleKVPool(64, 64, layer_num=2),
        reference_swa_pool(),
    ],
    ids=["mha", "mha-padded", "mha-separate", "mla", "dsv4", "swa"],
)
def test_totals_equal_the_distinct_storages(native: Any) -> None:
    _check_invariants(native)


def test_mha_fused_halves_count_once_and_split_evenly() -> None:
    native = ReferenceMHATokenToKVPool(30, 16, head_num=2, head_dim=8, layer_num=2)
    report = memory_report(native)
    # rows = 46 per half, padded to 48 rows: one [2, 48, 2, 8] bf16 allocation per layer.
    per_layer = 2 * 48 * 2 * 8 * 2
    assert report.total_bytes == 2 * per_layer
    assert len(report.storages) == 2
    assert report.storages[0].owners == ("k_buffer[0]", "v_buffer[0]")
    assert (
        report.tensor_bytes["k_buffer[0]"] == report.tensor_bytes["v_buffer[0]"] == per_layer // 2
    )
    assert dict(report.by_role) == {"key": per_layer, "value": per_layer}
    assert dict(report.by_layer) == {0: per_layer, 1: per_layer}
    # Naively summing tensor sizes would both double count nothing and miss the padding:
    assert sum(e.nbytes for e in describe(native).tensors) < report.total_bytes


def test_mla_value_view_owns_nothing() -> None:
    native = ReferenceMLATokenToKVPool(32, 16, kv_lora_rank=32, qk_rope_head_dim=16, layer_num=1)
    report = memory_report(native)
    assert report.tensor_bytes["kv_buffer[0][..., :32]"] == 0
    assert report.tensor_bytes["kv_buffer[0]"] == report.total_bytes == native.kv_buffer[0].nbytes
    assert report.storages[0].views == ("kv_buffer[0][..., :32]",)
    assert dict(report.by_role) == {"latent": report.total_bytes}


class SharedStoragePool(ReferenceMHATokenToKVPool):
    """Unequal owners on one storage, plus an unrelated opaque table."""

    def __init__(self) -> None:
        super().__init__(16, 16, head_num=1, head_dim=4, v_head_dim=2, layer_num=1)
        raw = torch.zeros(100, dtype=torch.uint8)
        self.k_buffer = [raw[:60]]
        self.v_buffer = [raw[60:90]]  # 10 trailing bytes viewed by nobody
        self.table = torch.zeros(3, dtype=torch.int64)


def test_shared_storage_is_split_in_proportion_to_the_bytes_viewed() -> None:
    report = memory_report(SharedStoragePool())
    assert report.total_bytes == 100 + 24
    assert report.tensor_bytes["k_buffer[0]"] == 100 * 60 // 90 + 1  # its share + the remainder
    assert report.tensor_bytes["v_buffer[0]"] == 100 * 30 // 90
    assert report.tensor_bytes["k_buffer[0]"] + report.tensor_bytes["v_buffer[0]"] == 100
    assert report.tensor_bytes["table"] == 24
    assert report.unlayered_bytes == 24
    assert report.by_role["opaque"] == 24


def test_components_add_up() -> None:
    report = memory_report(reference_swa_pool())
    root, full, swa = report.components
    assert (root.name, root.depth, root.bytes) == ("ReferenceSWAKVPool", 0, 0)
    assert (full.depth, swa.depth) == (1, 1)
    assert root.total_bytes == full.total_bytes + swa.total_bytes == report.total_bytes
    assert (full.tensors, full.storages) == (4, 2)
    assert report.component("swa") is swa
    with pytest.raises(KeyError, match="no component named 'c4'"):
        report.component("c4")


def test_a_manifest_can_be_passed_instead_of_the_pool() -> None:
    native = ReferenceDeepSeekV4SingleKVPool(64, 64, layer_num=2)
    assert memory_report(describe(native)) == memory_report(native)


def test_table_and_dict() -> None:
    report = memory_report(reference_swa_pool())
    text = str(report)
    assert text == report.table()
    lines = text.splitlines()
    assert lines[0] == "Memory of ReferenceSWAKVPool: 16.0 KiB in 4 allocations (8 tensors)"
    assert lines[1].split() == [
        "component",
        "role",
        "class",
        "tensors",
        "allocations",
        "bytes",
        "share",
    ]
    assert lines[3].split()[-2:] == ["KiB", "100.0%"]
    assert lines[-2] == "  by role: key 8.0 KiB, value 8.0 KiB"
    assert lines[-1] == "  by device: cpu 16.0 KiB"
    data = json.loads(json.dumps(report.to_dict()))
    assert data["total_bytes"] == report.total_bytes
    assert data["by_layer"] == {str(k): v for k, v in report.by_layer.items()}
    assert [c["name"] for c in data["components"]] == ["ReferenceSWAKVPool", "full", "swa"]
    assert data["components"][0]["role"] == Role.COMPOSITE.value


@given(
    size=st.integers(1, 80),
    page=st.sampled_from([1, 4, 16]),
    layers=st.integers(1, 4),
    start=st.integers(0, 3),
    head_dim=st.sampled_from([4, 8]),
    v_head_dim=st.sampled_from([None, 4]),
)
def test_mha_invariants_hold_for_any_geometry(
    size: int, page: int, layers: int, start: int, head_dim: int, v_head_dim: int | None
) -> None:
    native = ReferenceMHATokenToKVPool(
        size,
        page,
        head_num=2,
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        layer_num=layers,
        start_layer=start,
    )
    _check_invariants(native)
    report = memory_report(native)
    assert sorted(report.by_layer) == list(range(start, start + layers))
    assert len(set(report.by_layer.values())) == 1  # every layer holds the same bytes


@given(size=st.integers(1, 200), page=st.sampled_from([64, 128]), layers=st.integers(1, 3))
def test_dsv4_invariants_hold_for_any_geometry(size: int, page: int, layers: int) -> None:
    native = ReferenceDeepSeekV4SingleKVPool(size, page, layer_num=layers)
    _check_invariants(native)
    assert memory_report(native).by_role["packed_kv"] == sum(b.nbytes for b in native.kv_buffer)
