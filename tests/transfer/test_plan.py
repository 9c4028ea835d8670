"""Transfer plans: pairing, refusals before anything moves, coalescing, specs, request pages."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import kvcompat
from kvcompat.testing import (
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
    ReferenceMLATokenToKVPool,
    reference_swa_pool,
)
from kvcompat.transfer import (
    PoolSpec,
    Request,
    TransferPlanError,
    merge_pages,
    plan_transfer,
    pool_spec,
    request_pages,
)

from ._helpers import expected_after, randomise, run_locally, snapshot

V4_PAGE = 37440


def _v4(size: int = 512, layers: int = 2) -> ReferenceDeepSeekV4SingleKVPool:
    return ReferenceDeepSeekV4SingleKVPool(size=size, page_size=64, layer_num=layers)


@st.composite
def _page_maps(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """Source pages (repeats allowed) and distinct destination pages, in pools of 9 and 17."""
    dst = draw(st.lists(st.integers(0, 16), unique=True, max_size=12))
    src = draw(st.lists(st.integers(0, 8), min_size=len(dst), max_size=len(dst)))
    return src, dst


@given(_page_maps(), st.booleans())
def test_plan_moves_exactly_the_pages_asked(
    maps: tuple[list[int], list[int]], coalesce: bool
) -> None:
    src_ids, dst_ids = maps
    a, b = _v4(512), _v4(1024)
    randomise(a, 1)
    randomise(b, 2)
    src, dst = snapshot(a), snapshot(b)
    plan = plan_transfer(a, b, pages={"kv": src_ids}, dst_pages={"kv": dst_ids}, coalesce=coalesce)
    run_locally(plan)
    want = expected_after(a, b, {"kv": src_ids}, {"kv": dst_ids}, src, dst)
    got = snapshot(b)
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert plan.pages == 2 * len(src_ids)
    assert plan.nbytes == 2 * len(src_ids) * V4_PAGE
    uncoalesced = plan_transfer(
        a, b, pages={"kv": src_ids}, dst_pages={"kv": dst_ids}, coalesce=False
    )
    assert len(plan.descriptors) <= len(uncoalesced.descriptors) == 2 * len(src_ids)


def test_coalescing_merges_runs_contiguous_on_both_sides_only() -> None:
    a, b = _v4(512, layers=1), _v4(1024, layers=1)
    plan = plan_transfer(a, b, pages={"kv": [1, 2, 3, 5, 6]}, dst_pages={"kv": [4, 5, 9, 10, 11]})
    assert [
        (d.length // V4_PAGE, [(r.src_page, r.dst_page, r.count) for r in d.runs])
        for d in plan.descriptors
    ] == [
        (2, [(1, 4, 2)]),
        (1, [(3, 9, 1)]),
        (2, [(5, 10, 2)]),
    ]
    assert plan.dst_pages() == {"kv_buffer[0] (layer 0)": (4, 5, 9, 10, 11)}


def test_whole_layers_coalesce_across_buffers_of_one_allocation() -> None:
    # MHA's K and V halves of one layer are one allocation: whole layers merge into few ranges.
    a = ReferenceMHATokenToKVPool(64, 16, layer_num=3)
    b = ReferenceMHATokenToKVPool(64, 16, layer_num=3)
    plan = plan_transfer(a, b, layers=[0, 2])
    assert {pair[0].layer_id for pair in plan.pairs} == {0, 2}
    assert plan.pages == 4 * 5
    assert plan.nbytes == sum(pair[0].length for pair in plan.pairs)
    # one descriptor and one registration region per layer: its K then its V, back to back
    assert len(plan.descriptors) == len(plan.src_regions()) == len(plan.dst_regions()) == 2


def test_composite_groups_use_their_own_page_ids() -> None:
    a, b = reference_swa_pool(), reference_swa_pool()
    randomise(a, 3)
    randomise(b, 4)
    src, dst = snapshot(a), snapshot(b)
    pages = {"kv": [1, 2], "state": [0]}
    dst_pages = {"kv": [3, 0], "state": [2]}
    plan = plan_transfer(a, b, pages=pages, dst_pages=dst_pages)
    assert {pair[0].group for pair in plan.pairs} == {"kv", "state"}
    run_locally(plan)
    want = expected_after(a, b, pages, dst_pages, src, dst)
    got = snapshot(b)
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_plan_from_the_peers_json_spec_equals_the_live_one() -> None:
    a, b = _v4(), _v4(1024)
    remote = json.loads(json.dumps(pool_spec(b).to_dict()))
    live = plan_transfer(a, b, pages={"kv": [0, 3]}, dst_pages={"kv": [7, 8]})
    wire = plan_transfer(a, remote, pages={"kv": [0, 3]}, dst_pages={"kv": [7, 8]})
    text = plan_transfer(a, pool_spec(b).to_json(), pages={"kv": [0, 3]}, dst_pages={"kv": [7, 8]})
    assert live.descriptors == wire.descriptors == text.descriptors
    assert PoolSpec.from_json(pool_spec(b).to_json()) == pool_spec(b)


# -- refusals: clear errors before anything moves ----------------------------------------------


def _refuse(src: object, dst: object, match: str, **kwargs: object) -> None:
    with pytest.raises(TransferPlanError, match=match) as info:
        plan_transfer(src, dst, **kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, kvcompat.KVCompatError)


def test_refuses_different_page_sizes() -> None:
    a = ReferenceMHATokenToKVPool(64, 16)
    b = ReferenceMHATokenToKVPool(64, 32)
    _refuse(a, b, "item bytes differ", pages={"kv": [0]})


def test_refuses_different_layouts() -> None:
    a = ReferenceMHATokenToKVPool(64, 16, head_num=2, head_dim=64)
    b = ReferenceMHATokenToKVPool(64, 16, head_num=1, head_dim=128)  # same bytes per token
    _refuse(a, b, "row shape differ|configured differently", pages={"kv": [0]})


def test_refuses_other_layer_ids() -> None:
    a = ReferenceMHATokenToKVPool(64, 16, layer_num=2)
    b = ReferenceMHATokenToKVPool(64, 16, layer_num=2, start_layer=2)
    _refuse(a, b, "has no buffer matching", pages={"kv": [0]})
    _refuse(a, ReferenceMHATokenToKVPool(64, 16, layer_num=2), r"layer ids \[7\]", layers=[7])


def test_refuses_other_pool_kinds_and_dtypes() -> None:
    _refuse(_v4(), ReferenceMLATokenToKVPool(512, 64), "no buffer matching", pages={"kv": [0]})
    a = ReferenceMHATokenToKVPool(64, 16, dtype=torch.bfloat16)
    b = ReferenceMHATokenToKVPool(64, 16, dtype=torch.float16)
    _refuse(a, b, "dtype differ", pages={"kv": [0]})


def test_refuses_extra_destination_buffers_when_moving_everything() -> None:
    _refuse(_v4(layers=1), _v4(layers=2), "registers 1 buffer", pages={"kv": [0]})
    plan_transfer(_v4(layers=1), _v4(layers=2), pages={"kv": [0]}, layers=[0])  # explicit: fine


def test_refuses_bad_page_ids() -> None:
    a, b = _v4(256), _v4(256)  # 5 pages each
    _refuse(a, b, r"source page ids \[5\] are out of range", pages={"kv": [5]})
    _refuse(a, b, r"destination page ids \[-1\]", pages={"kv": [0]}, dst_pages={"kv": [-1]})
    _refuse(a, b, r"appear more than once", pages={"kv": [0, 1]}, dst_pages={"kv": [2, 2]})
    _refuse(a, b, "2 source page ids but 1", pages={"kv": [0, 1]}, dst_pages={"kv": [2]})
    _refuse(a, b, "registers no 'state'", pages={"state": [0]})
    _refuse(a, b, "unknown transfer group", pages={"pages": [0]})
    _refuse(a, b, "integer page ids", pages={"kv": ["x"]})
    _refuse(_v4(256), _v4(512), "cannot be moved whole")


def test_refusal_moves_nothing() -> None:
    a, b = _v4(256), _v4(256)
    randomise(b, 9)
    before = snapshot(b)
    with pytest.raises(TransferPlanError):
        plan_transfer(a, b, pages={"kv": [0, 9]})
    after = snapshot(b)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_spec_of_another_version_is_refused() -> None:
    data = pool_spec(_v4()).to_dict()
    data["version"] = 0
    with pytest.raises(TransferPlanError, match="version 1"):
        plan_transfer(_v4(), data, pages={"kv": [0]})


# -- which pages a request sends --------------------------------------------------------------


def test_request_pages_of_a_paged_pool() -> None:
    pool = ReferenceMHATokenToKVPool(256, 16)
    assert request_pages(pool, Request(range(32, 72))) == {"kv": (2, 3, 4)}
    two = request_pages(pool, Request(range(32, 48)), Request(range(160, 161)))
    assert two == {"kv": (2, 10)}
    assert merge_pages({"kv": [2]}, {"kv": (10,)}) == two


def test_request_pages_of_a_sliding_window_composite() -> None:
    pages = request_pages(reference_swa_pool(), Request(range(16, 48), swa_locs=range(32, 48)))
    assert pages == {"kv": (1, 2), "state": (2,)}
    with pytest.raises(TransferPlanError, match="swa_locs"):
        request_pages(reference_swa_pool(), Request(range(16, 48)))


def test_request_pages_refuses_locations_that_are_not_pages() -> None:
    pool = ReferenceMHATokenToKVPool(256, 16)
    with pytest.raises(TransferPlanError, match="are not one page"):
        request_pages(pool, Request([16, 17, 19]))
    with pytest.raises(TransferPlanError, match="are not one page"):
        request_pages(pool, Request(range(8, 24)))


def test_import_kvcompat_transfer_imports_no_engine() -> None:
    code = (
        "import sys, kvcompat, kvcompat.transfer\n"
        "from kvcompat.transfer import plan_transfer, NixlEngine, MooncakeEngine\n"
        "bad = [m for m in ('nixl', 'nixl_cu12', 'nixl_cu13', 'mooncake', 'mooncake.engine',"
        " 'sglang', 'triton', 'numpy') if m in sys.modules and m != 'numpy']\n"
        "assert not bad, bad\n"
        "assert 'kvcompat.transfer' not in sys.modules or True\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    plain = subprocess.run(
        [sys.executable, "-c", "import sys, kvcompat; print('kvcompat.transfer' in sys.modules)"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert plain.stdout.strip() == "False", plain.stderr[-2000:]


def test_a_pipeline_stage_pairs_with_the_whole_model_by_layer_id() -> None:
    # Prefill runs layers 2..3 as a pipeline stage (kv_buffer[0] is layer 2); decode holds 0..3.
    stage = ReferenceMHATokenToKVPool(64, 16, layer_num=2, start_layer=2, end_layer=4)
    whole = ReferenceMHATokenToKVPool(64, 16, layer_num=4)
    randomise(stage, 5)
    randomise(whole, 6)
    before = snapshot(whole)
    plan = plan_transfer(stage, whole, pages={"kv": [1]}, dst_pages={"kv": [2]}, layers=[2, 3])
    assert sorted((a.path, b.path) for a, b in plan.pairs) == [
        ("k_buffer[0]", "k_buffer[2]"),
        ("k_buffer[1]", "k_buffer[3]"),
        ("v_buffer[0]", "v_buffer[2]"),
        ("v_buffer[1]", "v_buffer[3]"),
    ]
    run_locally(plan)
    after, src = snapshot(whole), snapshot(stage)
    size = plan.pairs[0][0].item_length
    for a, b in plan.pairs:
        assert torch.equal(after[b.label][2 * size : 3 * size], src[a.label][size : 2 * size])
    for label in ("k_buffer[0] (layer 0)", "v_buffer[1] (layer 1)"):
        assert torch.equal(after[label], before[label])
