"""``request_pages`` against SGLang's own PD index functions, on its DeepSeek-V4 pools.

Runs under every release of the matrix (``tests/release_matrix.py``): each comparison uses
the function the installed release's PD path calls, found by what the release has, and a
release without one skips that part by capability.
"""

from __future__ import annotations

import importlib
import types
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _sglang.builders import build_dsv4_token_pool, build_dsv4_unified_pool
from _sglang.features import accepts, pool_class, require
from hypothesis import given, settings
from hypothesis import strategies as st
from transfer._helpers import host_bytes, randomise, run_locally

from kvcompat.transfer import Request, TransferPlanError, plan_transfer, pool_spec, request_pages

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
    page = 256
    kv_pages = min(b.length // b.item_length for b in pool_spec(dsv4).buffers if b.group == "kv")
    first = page if kv_pages >= 3 else 0  # start on page 1 where every kv component has room
    kv_locs = torch.arange(first, first + seq_len)  # (0.5.12-0.5.20 size c4 at 2 pages here)
    window = max(0, seq_len - 128) // page * page  # page-aligned window start
    swa_locs = torch.arange(window, seq_len)
    ours = request_pages(dsv4, Request(kv_locs, swa_locs=swa_locs, req_pool_idx=slot))
    assert ours["kv"] == tuple(common.kv_to_page_indices(kv_locs, page).tolist())
    assert ours["state"] == tuple(common.kv_to_page_indices(swa_locs, page).tolist())
    plan_transfer(dsv4, dsv4, pages=ours)  # every id is in range for every component
    if "request_state" not in {b.group for b in pool_spec(dsv4).buffers}:
        assert "request_state" not in ours  # 0.5.12-0.5.14: c128 state moves as a layer state
        return
    assert ours["request_state"] == _native_request_state(dsv4, slot, seq_len)


def _native_request_state(pool: Any, slot: int, seq_len: int) -> tuple[int, ...]:
    """The request-state rows SGLang's own PD path sends for this request."""
    if hasattr(pool, "request_state_transfer_indices"):  # 0.5.23: the pool says, and so does
        native = pool.request_state_transfer_indices(slot, seq_len)  # its state module
        state = importlib.import_module("sglang.srt.mem_cache.deepseek_v4_compress_state")
        c128 = next(p for p in pool.compress_state_pools if p is not None and p.request_scoped)
        expected = state.request_scoped_state_transfer_indices(
            slot, seq_len, ratio=c128.ratio, online=c128.online, ring_size=c128.ring_size
        )
        assert native.tolist() == expected.tolist()
        return tuple(native.tolist())
    utils = importlib.import_module("sglang.srt.disaggregation.utils")
    require(hasattr(utils, "get_dsv4_c128_state_indices"), "a DSv4 c128-state PD transfer")
    # 0.5.15-0.5.20: the decode side's c128 payload (ring size from the pool, as it asks).
    # Whether the c128 state is online: the pool's state says from 0.5.16; 0.5.15's PD path
    # asks a process-wide switch instead, as here.
    c128 = next(p for p in pool.compress_state_pools if p is not None and p.ratio == 128)
    online = c128.online if hasattr(c128, "online") else utils.is_dsv4_c128_online_enabled()
    ring_size = 1 if online else pool.get_ring_size(128)
    native = utils.get_dsv4_c128_state_indices(slot, seq_len, online=online, ring_size=ring_size)
    return tuple(native.tolist())


def test_spec_of_the_composite_names_every_component(dsv4: object) -> None:
    spec = pool_spec(dsv4)
    by_group: dict[str, set[str]] = {}
    for buf in spec.buffers:
        by_group.setdefault(buf.group, set()).add(buf.component)
    expected = {
        "kv": {"c4", "c4_indexer", "c128"},
        "state": {"swa", "c4_state", "c4_indexer_state"},
        "request_state": {"c128_state"},
    }
    if not hasattr(dsv4, "get_request_state_buf_infos") and not hasattr(
        dsv4, "get_c128_state_buf_infos"
    ):  # 0.5.12-0.5.14: the c128 compress state is not sent per request; it is a layer state
        expected["state"].add("c128_state")
        del expected["request_state"]
    assert by_group == expected
    if "request_scoped" in spec.components["c128_state"].details:  # 0.5.23's own flag
        assert spec.components["c128_state"].details["request_scoped"] is True


# -- unified_kv: the sliding window in per-request ring rows --------------------------------


def _sglang_closure(module: str, name: str, **free: object) -> Any:
    """SGLang's own nested ``name`` from ``sglang/srt/disaggregation/<module>.py``, bound to
    ``free`` (its closure variables). Compiled from the installed source, not imported: the
    module's imports need CUDA-side packages; the nested function itself needs only numpy."""
    import builtins

    import numpy as np
    import sglang

    path = Path(sglang.__file__).parent / "srt" / "disaggregation" / f"{module}.py"

    def find(code: types.CodeType) -> list[types.CodeType]:
        found = []
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                found += [const] if const.co_name == name else find(const)
        return found

    (code,) = find(compile(path.read_text(), str(path), "exec"))
    cells = tuple(types.CellType(free[var]) for var in code.co_freevars)
    scope = {"np": np, "__builtins__": builtins}
    return types.FunctionType(code, scope, name, None, cells)


def _native_ring_rows(pool: object, slot: int, seq_len: int) -> dict[str, tuple[int, ...]]:
    """The ring rows SGLang's prefill sender and decode receiver compute for one request."""
    kv = SimpleNamespace(req_pool_idx=slot)
    prefill = _sglang_closure(
        "prefill",
        "_swa_ring_payload",
        self=SimpleNamespace(token_to_kv_pool_allocator=SimpleNamespace(get_kvcache=lambda: pool)),
        req=SimpleNamespace(kv=kv),
        seq_len=seq_len,
    )
    decode = _sglang_closure(
        "decode",
        "_swa_ring_payload",
        self=SimpleNamespace(token_to_kv_pool=pool),
        decode_req=SimpleNamespace(req=SimpleNamespace(kv=kv)),
        seq_len=seq_len,
    )
    return {"prefill": tuple(prefill().tolist()), "decode": tuple(decode().tolist())}


def _regions(pool: Any) -> dict[tuple[str, str], torch.Tensor]:
    """A copy of every registered region, by (group, buffer): a unified_kv layer buffer
    registers two (its ring rows and its compressed rows)."""
    return {
        (b.group, b.label): host_bytes(b.ptr, b.length).clone() for b in pool_spec(pool).buffers
    }


@pytest.fixture(scope="module")
def unified() -> Any:
    pytest.importorskip("sglang")
    return build_dsv4_unified_pool()


@pytest.mark.parametrize(("slot", "seq_len"), [(0, 300), (2, 128), (3, 129), (1, 1), (4, 511)])
def test_ring_rows_match_sglangs_prefill_and_decode(unified: Any, slot: int, seq_len: int) -> None:
    spec = pool_spec(unified)
    assert spec.components["unified"].details["swa_window"] == unified.unified_swa_window  # type: ignore[attr-defined]
    kv_locs = torch.arange(256, 256 + seq_len)
    window = max(0, seq_len - 128) // 256 * 256
    ours = request_pages(
        unified, Request(kv_locs, swa_locs=torch.arange(window, seq_len), req_pool_idx=slot)
    )
    native = _native_ring_rows(unified, slot, seq_len)
    assert ours["swa_ring"] == native["prefill"] == native["decode"]
    assert len(ours["swa_ring"]) == min(seq_len, 128)
    plan_transfer(unified, unified, pages=ours)  # every row is in range


@given(
    window=st.integers(1, 300),
    extra=st.integers(0, 7),  # speculative draft tokens widen the ring past the window
    slot=st.integers(0, 6),
    seq_len=st.integers(1, 2000),
)
@settings(max_examples=60, deadline=None)
def test_ring_rows_with_a_ring_wider_than_the_window(
    unified: Any, window: int, extra: int, slot: int, seq_len: int
) -> None:
    ring = window + extra
    spec = pool_spec(unified)
    part = spec.components["unified"]
    details = {**part.details, "swa_window": window, "swa_ring_size": ring}
    wider = replace(spec, components={**spec.components, "unified": replace(part, details=details)})
    ours = request_pages(
        wider, Request(range(256, 256 + seq_len), swa_locs=range(0), req_pool_idx=slot)
    )
    fake = SimpleNamespace(unified_swa_window=window, unified_swa_ring_size=ring)
    assert ours["swa_ring"] == _native_ring_rows(fake, slot, seq_len)["prefill"]


def test_ring_rows_move_row_for_row_between_slots(unified: Any) -> None:
    """Prefill slot 1 -> decode slot 3: exactly the window's rows move, each to its twin."""
    other = build_dsv4_unified_pool()
    randomise(unified, seed=3)
    randomise(other, seed=4)
    before_src, before_dst = _regions(unified), _regions(other)
    seq_len = 200
    kv_locs = torch.arange(256, 256 + seq_len)
    src_rows = request_pages(unified, Request(kv_locs, swa_locs=range(200), req_pool_idx=1))
    dst_rows = request_pages(other, Request(kv_locs, swa_locs=range(200), req_pool_idx=3))
    plan = plan_transfer(
        unified,
        other,
        pages={"swa_ring": src_rows["swa_ring"]},
        dst_pages={"swa_ring": dst_rows["swa_ring"]},
    )
    run_locally(plan)
    after = _regions(other)
    assert {group for group, _ in after} == {"kv", "state", "request_state", "swa_ring"}
    for key, region in after.items():
        expected = before_dst[key].clone()
        if key[0] == "swa_ring":
            row = region.numel() // unified.unified_swa_pages
            for s, d in zip(src_rows["swa_ring"], dst_rows["swa_ring"], strict=True):
                expected[d * row : (d + 1) * row] = before_src[key][s * row : (s + 1) * row]
        assert torch.equal(region, expected), key
    assert len(plan.descriptors) < len(src_rows["swa_ring"])  # rows coalesce within the ring


def test_ring_rows_need_the_window_a_manifest_does_not_carry(unified: Any) -> None:
    from kvcompat.inspection import describe

    request = Request(range(256, 456), swa_locs=range(200), req_pool_idx=0)
    with pytest.raises(TransferPlanError, match="does not say the window and ring size"):
        request_pages(describe(unified), request)
    with pytest.raises(TransferPlanError, match="need the request slot"):
        request_pages(unified, Request(range(256, 456), swa_locs=range(200)))


def test_request_pages_refuse_a_hisparse_c4_part_instead_of_naming_other_pages() -> None:
    # With HiSparse on, the composite's c4 pool stores pages by device slot: pages derived
    # from kv_locs would move other tokens' c4 keys. SGLang's PD path moves the HiSparse host
    # pool for those layers; kvcompat refuses rather than plan the wrong pages.
    require(accepts(pool_class("DeepSeekV4TokenToKVPool"), "enable_hisparse"), "enable_hisparse")
    pool = build_dsv4_token_pool(enable_hisparse=True)
    request = Request(kv_locs=range(256, 512), swa_locs=range(256, 512), req_pool_idx=0)
    with pytest.raises(TransferPlanError, match=r"\['c4'\] store their pages by HiSparse"):
        request_pages(pool, request)
    plain = build_dsv4_token_pool()  # the same request on the pool without HiSparse
    assert request_pages(plain, request)["kv"] == (1,)
