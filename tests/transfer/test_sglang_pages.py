"""``request_pages`` against SGLang 0.5.23's own PD index functions, on its DeepSeek-V4 pool."""

from __future__ import annotations

import importlib

import pytest
import torch

from kvcompat.transfer import Request, plan_transfer, pool_spec, request_pages

pytestmark = [
    pytest.mark.sglang,
    pytest.mark.filterwarnings("ignore:Only CUDA:UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


@pytest.fixture(scope="module")
def dsv4() -> object:
    pytest.importorskip("sglang")
    from _sglang.builders import build_dsv4_token_pool

    return build_dsv4_token_pool()


@pytest.mark.parametrize(("slot", "seq_len"), [(0, 300), (2, 256), (3, 129), (1, 1), (6, 511)])
def test_request_pages_match_sglangs_prefill_sender(dsv4: object, slot: int, seq_len: int) -> None:
    common = importlib.import_module("sglang.srt.mem_cache.common")
    state = importlib.import_module("sglang.srt.mem_cache.deepseek_v4_compress_state")
    page = 256
    kv_locs = torch.arange(page, page + seq_len)  # starts on page 1
    window = max(0, seq_len - 128) // page * page  # page-aligned window start
    swa_locs = torch.arange(window, seq_len)
    ours = request_pages(dsv4, Request(kv_locs, swa_locs=swa_locs, req_pool_idx=slot))
    assert ours["kv"] == tuple(common.kv_to_page_indices(kv_locs, page).tolist())
    assert ours["state"] == tuple(common.kv_to_page_indices(swa_locs, page).tolist())
    native = dsv4.request_state_transfer_indices(slot, seq_len)  # type: ignore[attr-defined]
    assert ours["request_state"] == tuple(native.tolist())
    c128 = next(p for p in dsv4.compress_state_pools if p is not None and p.request_scoped)  # type: ignore[attr-defined]
    expected = state.request_scoped_state_transfer_indices(
        slot, seq_len, ratio=c128.ratio, online=c128.online, ring_size=c128.ring_size
    )
    assert ours["request_state"] == tuple(expected.tolist())
    plan_transfer(dsv4, dsv4, pages=ours)  # every id is in range for every component


def test_spec_of_the_composite_names_every_component(dsv4: object) -> None:
    spec = pool_spec(dsv4)
    by_group: dict[str, set[str]] = {}
    for buf in spec.buffers:
        by_group.setdefault(buf.group, set()).add(buf.component)
    assert by_group == {
        "kv": {"c4", "c4_indexer", "c128"},
        "state": {"swa", "c4_state", "c4_indexer_state"},
        "request_state": {"c128_state"},
    }
    assert spec.components["c128_state"].details["request_scoped"] is True
