"""NIXL and Mooncake bindings on the CPU: loopback, one thread, bounded waits, real failures.

Each engine test builds two engines in this process (two NIXL agents / two Mooncake
engines, talking over loopback), moves DeepSeek-V4 pages and checks every byte; the
two-process prefill -> decode example runs in ``test_pd_example.py``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
from kvcompat.transfer import (
    MooncakeEngine,
    NixlEngine,
    TransferError,
    import_mooncake,
    import_nixl,
    plan_transfer,
    pool_spec,
)

from ._helpers import expected_after, randomise, snapshot

os.environ.setdefault("UCX_NET_DEVICES", "lo")
# loopback needs no InfiniBand modules, and NIXL 1.5.1's bundled libnl-route (loaded by
# them) crashes with SIGSEGV at the exit of the process that loaded it
os.environ.setdefault("UCX_MODULES", "^ib")


def _have(importer: Any) -> bool:
    try:
        importer()
    except ImportError:
        return False
    return True


needs_nixl = pytest.mark.skipif(not _have(import_nixl), reason="nixl-cu12 is not installed")
needs_mooncake = pytest.mark.skipif(
    not _have(import_mooncake), reason="mooncake-transfer-engine (or libibverbs1) is not installed"
)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    # NIXL's progress thread spins a core; keep torch off the other one.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _pools() -> tuple[ReferenceDeepSeekV4SingleKVPool, ReferenceDeepSeekV4SingleKVPool]:
    a = ReferenceDeepSeekV4SingleKVPool(size=512, page_size=64, layer_num=2)
    b = ReferenceDeepSeekV4SingleKVPool(size=1024, page_size=64, layer_num=2)
    randomise(a, 11)
    randomise(b, 12)
    return a, b


PAGES = {"kv": [0, 1, 2, 5, 8]}
DST_PAGES = {"kv": [9, 10, 11, 3, 16]}


def _check(a: Any, b: Any, before: dict[str, torch.Tensor], src: dict[str, torch.Tensor]) -> None:
    want = expected_after(a, b, PAGES, DST_PAGES, src, before)
    got = snapshot(b)
    assert all(torch.equal(got[k], want[k]) for k in want)


@needs_nixl
@pytest.mark.parametrize("initiator_thread", [True, False], ids=["thread", "no-thread"])
@pytest.mark.parametrize("op", ["WRITE", "READ"])
def test_nixl_moves_pages_and_reuses_the_prepared_lists(op: str, initiator_thread: bool) -> None:
    a, b = _pools()
    src, before = snapshot(a), snapshot(b)
    plan = plan_transfer(a, pool_spec(b).to_json(), pages=PAGES, dst_pages=DST_PAGES)
    # the initiator may run without NIXL's progress thread; the passive peer keeps its own
    threads = (initiator_thread, True) if op == "WRITE" else (True, initiator_thread)
    with (
        NixlEngine("src", progress_thread=threads[0]) as ea,
        NixlEngine("dst", progress_thread=threads[1]) as eb,
    ):
        assert ea.register(a)
        assert eb.register(b)
        assert ea.register(a) == []  # idempotent
        to_b = ea.connect(eb.metadata())
        to_a = eb.connect(ea.metadata())
        if op == "WRITE":
            prepared = ea.prepare(plan, to_b, chunks=2)
            ea.transfer(prepared, timeout=20.0, notify=b"kv ready")
            ea.transfer(prepared, timeout=20.0)  # the same lists and handles, again
            notes: dict[str, list[bytes]] = {}
            for _ in range(2000):  # bounded: the notification travels with the data
                notes = eb.notifications()
                if notes:
                    break
            assert notes == {"src": [b"kv ready"]}
            quiet_until = time.monotonic() + 0.5  # bounded: the run without notify sends
            while time.monotonic() < quiet_until:  # none (NIXL would repeat a handle's
                assert not eb.notifications()  # old notification on every post of it)
                time.sleep(0.005)
        else:
            prepared = eb.prepare(plan, to_a, op="READ")
            eb.transfer(prepared, timeout=20.0)
        assert prepared.runs == (2 if op == "WRITE" else 1)
        assert len(prepared.handles) == (2 if op == "WRITE" else 1)
    assert prepared.released
    _check(a, b, before, src)


@needs_nixl
def test_nixl_backend_params_must_name_a_created_backend() -> None:
    with pytest.raises(ValueError, match=r"backend_params names backends \['UCXX'\]"):
        NixlEngine("typo", backend_params={"UCXX": {"num_threads": "2"}})


@needs_nixl
def test_nixl_failure_names_the_pages_that_did_not_arrive() -> None:
    a, b = _pools()
    before = snapshot(b)
    plan = plan_transfer(a, b, pages=PAGES, dst_pages=DST_PAGES)
    unregistered = ReferenceDeepSeekV4SingleKVPool(size=1024, page_size=64, layer_num=2)
    with NixlEngine("src") as ea, NixlEngine("dst") as eb:
        ea.register(a)
        eb.register(b)
        peer = ea.connect(eb.metadata())
        eb.connect(ea.metadata())
        with pytest.raises(TransferError, match="register"):  # refused at prepare: nothing moved
            ea.prepare(plan_transfer(a, unregistered, pages=PAGES, dst_pages=DST_PAGES), peer)
        prepared = ea.prepare(plan, peer, chunks=2)
        ea._agent.remove_remote_agent(peer)  # the peer goes away after preparation
        with pytest.raises(TransferError, match="Not arrived") as info:
            ea.transfer(prepared, timeout=5.0)
    err = info.value
    assert isinstance(err, RuntimeError)
    assert err.arrived == {}
    assert err.not_arrived == {label: tuple(sorted(DST_PAGES["kv"])) for label in before}
    after = snapshot(b)
    assert all(torch.equal(after[k], before[k]) for k in before)


@needs_mooncake
def test_mooncake_moves_pages() -> None:
    a, b = _pools()
    src, before = snapshot(a), snapshot(b)
    plan = plan_transfer(a, pool_spec(b).to_dict(), pages=PAGES, dst_pages=DST_PAGES)
    with MooncakeEngine("127.0.0.1") as ea, MooncakeEngine("127.0.0.1") as eb:
        ea.register(a)
        eb.register(b)
        assert eb.session_id.startswith("127.0.0.1:")
        prepared = ea.prepare(plan, ea.connect(eb.metadata()), chunks=3)
        ea.transfer(prepared, timeout=20.0)
        ea.transfer(prepared, timeout=20.0)
    _check(a, b, before, src)


@needs_mooncake
def test_mooncake_partial_failure_reports_what_arrived() -> None:
    a, b = _pools()
    src, before = snapshot(a), snapshot(b)
    plan = plan_transfer(a, b, pages=PAGES, dst_pages=DST_PAGES)
    spec = pool_spec(b)
    layer0 = dataclasses.replace(spec, buffers=spec.buffers[:1])  # the peer registers layer 0 only
    with MooncakeEngine("127.0.0.1") as ea, MooncakeEngine("127.0.0.1") as eb:
        ea.register(a)
        eb.register(layer0)
        # one batch per layer: coalesced runs never cross the two layers' allocations
        by_layer = sorted({id(plan.pairs[r.buffer][1]) for d in plan.descriptors for r in d.runs})
        assert len(by_layer) == 2
        prepared = ea.prepare(plan, ea.connect(eb.metadata()), chunks=len(plan.descriptors))
        with pytest.raises(TransferError, match="Mooncake transfer") as info:
            ea.transfer(prepared, timeout=20.0)
    err = info.value
    after = snapshot(b)
    want = expected_after(a, b, PAGES, DST_PAGES, src, before)
    size = spec.buffers[0].item_length
    for label, pages in err.arrived.items():
        for page in pages:
            span = slice(page * size, (page + 1) * size)
            assert torch.equal(after[label][span], want[label][span])
    lost = err.not_arrived.get(spec.buffers[1].label, ())
    assert lost  # layer 1 was never registered by the peer
    for page in lost:
        span = slice(page * size, (page + 1) * size)
        assert torch.equal(after[spec.buffers[1].label][span], before[spec.buffers[1].label][span])
    arrived = sum(len(p) for p in err.arrived.values())
    assert arrived + sum(len(p) for p in err.not_arrived.values()) == plan.pages


def test_engines_refuse_bad_arguments() -> None:
    a, b = _pools()
    plan = plan_transfer(a, b, pages=PAGES, dst_pages=DST_PAGES)
    from kvcompat.transfer import TransferPlanError
    from kvcompat.transfer._engine import check_op, chunk_ranges

    with pytest.raises(TransferPlanError, match="WRITE"):
        check_op("PUSH")
    with pytest.raises(TransferPlanError, match="positive"):
        chunk_ranges(len(plan.descriptors), 0)
