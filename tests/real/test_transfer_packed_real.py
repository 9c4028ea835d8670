"""Packed transfers on SGLang's own pools: gather, stream, scatter — byte for byte.

Every pool kind the real tier builds is moved packed in this process (the CPU twin of
the multi-layer gather and scatter, chunked small so that pieces split layers and pages)
between two pools of the same class, page ids out of order, a source page repeated. The
destination must equal what the page lists alone say, and no other byte may change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from _sglang import builders
from transfer._helpers import expected_after, move_packed_locally, random_pages, randomise, snapshot

from kvcompat.transfer import Request, plan_transfer, pool_spec, request_pages

pytestmark = [
    pytest.mark.sglang,
    pytest.mark.filterwarnings("ignore:Only CUDA:UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

BUILDERS: dict[str, Callable[[], Any]] = {
    "MHATokenToKVPool": builders.build_mha_pool,
    "MHATokenToKOnlyPool": builders.build_k_only_pool,
    "MLATokenToKVPool": builders.build_mla_pool,
    "DSATokenToKVPool": builders.build_dsa_pool,
    "DeepSeekV4SingleKVPool": builders.build_dsv4_single_pool,
    "DeepSeekV4UniformFP8KVPool": builders.build_dsv4_uniform_fp8_pool,
    "DeepSeekV4IndexerPool": builders.build_dsv4_indexer_pool,
    "SWAKVPool": builders.build_swa_pool,
    "HybridLinearKVPool": builders.build_hybrid_linear_pool,
    "DeepSeekV4TokenToKVPool": builders.build_dsv4_token_pool,
}


def _check(a: Any, b: Any, pages: Any, dst_pages: Any, chunk_bytes: int) -> Any:
    src, before = snapshot(a), snapshot(b)
    plan = plan_transfer(
        a, pool_spec(b).to_json(), pages=pages, dst_pages=dst_pages, method="packed"
    )
    move_packed_locally(plan, chunk_bytes)
    want = expected_after(a, b, pages, dst_pages, src, before)
    got = snapshot(b)
    for label in want:
        assert torch.equal(got[label], want[label]), label
    return plan


@pytest.mark.parametrize("name", sorted(BUILDERS))
@pytest.mark.parametrize("chunk_bytes", [3000, 1 << 30], ids=["split", "whole"])
def test_packed_round_trip_is_byte_exact_on_sglangs_pools(name: str, chunk_bytes: int) -> None:
    try:
        a, b = BUILDERS[name](), BUILDERS[name]()
    except builders.ReleaseLacks as exc:
        pytest.skip(str(exc))
    randomise(a, 31)
    randomise(b, 32)
    pages, dst_pages = random_pages(a, 7, dst_pool=b)
    plan = _check(a, b, pages, dst_pages, chunk_bytes)
    assert plan.packing is not None
    assert {plan.pairs[i][0].group for batch in plan.packing.batches for i in batch.pairs} == set(
        pages
    )


def test_a_deepseek_v4_request_moves_packed_with_every_component() -> None:
    a, b = builders.build_dsv4_token_pool(), builders.build_dsv4_token_pool()
    randomise(a, 41)
    randomise(b, 42)
    pages = request_pages(a, Request(range(256, 556), swa_locs=range(256, 300), req_pool_idx=0))
    dst_pages = request_pages(b, Request(range(512, 812), swa_locs=range(44), req_pool_idx=2))
    plan = _check(a, b, dict(pages), dict(dst_pages), 5000)
    components = {pair[0].component for pair in plan.pairs}
    assert {"c4", "c4_indexer", "c128", "swa"} <= components
    assert plan.packing is not None
    assert len(plan.packing.batches) >= 4  # one gather per item size and page list


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_every_buffer_path_resolves_to_the_tensor_holding_its_bytes(name: str) -> None:
    """What export_cuda_ipc exports: the storage of the tensor at each buffer's path."""
    from kvcompat.transfer._direct import _resolve

    try:
        pool = BUILDERS[name]()
    except builders.ReleaseLacks as exc:
        pytest.skip(str(exc))
    for buf in pool_spec(pool).buffers:
        tensor = _resolve(pool, buf.path)
        assert tensor is not None, buf.path
        storage = tensor.untyped_storage()
        assert storage.data_ptr() <= buf.ptr, buf.path
        assert buf.ptr + buf.length <= storage.data_ptr() + storage.nbytes(), buf.path
