"""Packed transfers: the layout, the CPU twin, NIXL and Mooncake, all or nothing, the rule.

A packed plan gathers a request's pages of every layer into one stream, moves it, and
scatters it at the receiver only after a commit that matches the receiver's own plan.
Every test compares bytes against what the page lists alone say the destination must
hold (``expected_after``), never against the plan's own bookkeeping.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcompat.testing import (
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
    ReferenceMLATokenToKVPool,
    reference_swa_pool,
)
from kvcompat.transfer import (
    MooncakeEngine,
    NixlEngine,
    StagingSpec,
    TransferError,
    TransferPlanError,
    plan_transfer,
    pool_spec,
)
from kvcompat.transfer._layout import PackBatch, PackLayout, choose_method, chunk_pieces

from ._helpers import expected_after, move_packed_locally, random_pages, randomise, snapshot
from .test_engines import needs_mooncake, needs_nixl

os.environ.setdefault("UCX_NET_DEVICES", "lo")
os.environ.setdefault("UCX_MODULES", "^ib")  # see test_engines.py


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


REFERENCE_POOLS = {
    "mha_page16": lambda scale: ReferenceMHATokenToKVPool(
        128 * scale, 16, layer_num=3, head_num=2, head_dim=32
    ),
    "mha_page1": lambda scale: ReferenceMHATokenToKVPool(
        64 * scale, 1, layer_num=2, head_num=2, head_dim=32
    ),
    "mla": lambda scale: ReferenceMLATokenToKVPool(size=64 * scale, page_size=16, layer_num=3),
    "dsv4_single": lambda scale: ReferenceDeepSeekV4SingleKVPool(256 * scale, 64, layer_num=4),
    "swa_composite": lambda scale: reference_swa_pool(size=64 * scale, size_swa=48),
}


def _pair(name: str, seed: int) -> tuple[Any, Any]:
    a, b = REFERENCE_POOLS[name](1), REFERENCE_POOLS[name](2)
    randomise(a, seed)
    randomise(b, seed + 1)
    return a, b


def _assert_moved(a: Any, b: Any, pages: Any, dst_pages: Any, src: Any, before: Any) -> None:
    want = expected_after(a, b, pages, dst_pages, src, before)
    got = snapshot(b)
    assert got.keys() == want.keys()
    for label in want:  # the moved pages equal the source's, every other byte is unchanged
        assert torch.equal(got[label], want[label]), label


# -- the layout -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(REFERENCE_POOLS))
@pytest.mark.parametrize("chunk_bytes", [1, 5000, 1 << 30], ids=["page-chunks", "small", "one"])
def test_packed_round_trip_is_byte_exact_on_every_reference_pool(
    name: str, chunk_bytes: int
) -> None:
    a, b = _pair(name, 3)
    pages, dst_pages = random_pages(a, 5, dst_pool=b)
    src, before = snapshot(a), snapshot(b)
    plan = plan_transfer(a, pool_spec(b).to_json(), pages=pages, dst_pages=dst_pages)
    packed = plan_transfer(a, b, pages=pages, dst_pages=dst_pages, method="packed")
    assert packed.method == "packed"
    assert packed.nbytes == plan.nbytes
    assert packed.packing is not None
    assert packed.packing.nbytes == plan.nbytes
    stream = move_packed_locally(packed, chunk_bytes)
    _assert_moved(a, b, pages, dst_pages, src, before)
    # the stream is the pages in the pool's own bytes, batch by batch (nothing decoded)
    first = packed.packing.batches[0]
    buf = packed.pairs[first.pairs[0]][0]
    page = first.src_pages[0]
    size = first.item_length
    assert torch.equal(stream[:size], src[buf.label][page * size : (page + 1) * size])


def test_both_sides_compute_one_digest_and_other_pages_change_it() -> None:
    a, b = _pair("dsv4_single", 1)
    pages, dst_pages = {"kv": [3, 1, 2]}, {"kv": [7, 0, 5]}
    mine = plan_transfer(
        a, pool_spec(b).to_json(), pages=pages, dst_pages=dst_pages, method="packed"
    )
    theirs = plan_transfer(
        pool_spec(a).to_json(), b, pages=pages, dst_pages=dst_pages, method="packed"
    )
    other = plan_transfer(a, b, pages=pages, dst_pages={"kv": [7, 0, 6]}, method="packed")
    assert mine.packing is not None
    assert theirs.packing is not None
    assert other.packing is not None
    assert mine.packing.digest == theirs.packing.digest
    assert other.packing.digest != mine.packing.digest
    # one gather for the four layers: one item size, one list of pages
    assert [(b.pairs, b.src_pages) for b in mine.packing.batches] == [((0, 1, 2, 3), (3, 1, 2))]


@st.composite
def _layouts(draw: st.DrawFn) -> tuple[PackLayout, int]:
    batches, offset = [], 0
    for _ in range(draw(st.integers(1, 4))):
        pairs = tuple(range(draw(st.integers(1, 5))))
        pages = tuple(range(draw(st.integers(1, 6))))
        batch = PackBatch(pairs, pages, pages, draw(st.integers(1, 50)), offset)
        batches.append(batch)
        offset += batch.nbytes
    return PackLayout(tuple(batches), offset, "x"), draw(st.integers(1, 400))


@settings(max_examples=200)
@given(_layouts())
def test_chunks_cover_the_stream_once_in_order_within_their_size(case: Any) -> None:
    layout, chunk_bytes = case
    chunks = chunk_pieces(layout, chunk_bytes)
    at = 0
    for chunk in chunks:
        size = sum(p.nbytes for p in chunk)
        one_page = len(chunk) == 1 and len(chunk[0].rows) == 1 and len(chunk[0].layers) == 1
        assert size <= chunk_bytes or one_page  # a page larger than a chunk travels alone
        for piece in chunk:
            batch = layout.batches[piece.batch]
            assert piece.offset == at
            assert piece.nbytes == len(piece.layers) * len(piece.rows) * batch.item_length
            # a piece is contiguous in the stream: whole rows of its layers, or one layer
            assert len(piece.rows) == len(batch.src_pages) or len(piece.layers) == 1
            index = piece.layers.start * len(batch.src_pages) + piece.rows.start
            assert piece.offset == batch.offset + index * batch.item_length
            at += piece.nbytes
    assert at == layout.nbytes


@settings(max_examples=40)
@given(
    layers=st.integers(1, 4),
    data=st.data(),
    chunk_bytes=st.sampled_from([1, 4096, 40000, 1 << 24]),
)
def test_pack_then_unpack_moves_exactly_the_listed_pages(
    layers: int, data: st.DataObject, chunk_bytes: int
) -> None:
    a = ReferenceDeepSeekV4SingleKVPool(64 * 6, 64, layer_num=layers)
    b = ReferenceDeepSeekV4SingleKVPool(64 * 9, 64, layer_num=layers)
    randomise(a, 1)
    randomise(b, 2)
    count = data.draw(st.integers(1, 6))
    src_ids = data.draw(st.lists(st.integers(0, 5), min_size=count, max_size=count))
    dst_ids = data.draw(st.permutations(range(9)))[:count]
    src, before = snapshot(a), snapshot(b)
    plan = plan_transfer(a, b, pages={"kv": src_ids}, dst_pages={"kv": dst_ids}, method="packed")
    move_packed_locally(plan, chunk_bytes)
    _assert_moved(a, b, {"kv": src_ids}, {"kv": dst_ids}, src, before)


# -- the rule -------------------------------------------------------------------------------


def test_small_requests_take_the_per_page_path_by_the_rule() -> None:
    a, b = _pair("dsv4_single", 4)
    small = plan_transfer(a, b, pages={"kv": [0, 2]}, dst_pages={"kv": [5, 8]})
    assert len(small.descriptors) == 8
    assert small.method == "pages"
    assert small.packing is None
    # many tiny descriptors (one-token MHA pages, scattered) pack even on a CPU host
    c = ReferenceMHATokenToKVPool(1024, 1, layer_num=8, head_num=2, head_dim=32)
    d = ReferenceMHATokenToKVPool(1024, 1, layer_num=8, head_num=2, head_dim=32)
    scattered = list(range(1, 1000, 3))
    tiny = plan_transfer(c, d, pages={"kv": scattered}, dst_pages={"kv": scattered[::-1]})
    assert tiny.method == "packed"
    assert len(tiny.descriptors) > 5000
    # the override wins both ways
    assert plan_transfer(a, b, pages={"kv": [0]}, method="packed").method == "packed"
    forced = plan_transfer(c, d, pages={"kv": scattered}, method="pages")
    assert forced.method == "pages"
    assert forced.summary()["method"] == "pages"
    assert tiny.summary()["gathers"] == 1
    # on a GPU (VRAM cost model) a 1k-token, 61-layer DeepSeek-V4 request packs; 8 do not
    assert choose_method("auto", 61 * 16, 61 * 16 * 37440, "VRAM") == "packed"
    assert choose_method("auto", 8, 8 * 37440, "VRAM") == "pages"
    assert choose_method("auto", 61 * 16, 61 * 16 * 37440, "DRAM") == "pages"


@pytest.mark.parametrize(
    ("method", "match"), [("direct", "maps the peer's CUDA buffers"), ("fast", "must be one of")]
)
def test_unknown_or_unavailable_methods_are_refused(method: str, match: str) -> None:
    a, b = _pair("dsv4_single", 4)
    with pytest.raises(TransferPlanError, match=match):
        plan_transfer(a, b, pages={"kv": [0]}, method=method)


def test_staging_specs_refuse_what_is_not_one() -> None:
    spec = StagingSpec(4096, 100, "cuda:1")
    assert StagingSpec.from_json(spec.to_json()) == spec
    assert spec.memory == ("VRAM", 1)
    with pytest.raises(TransferPlanError, match="not a kvcompat staging spec"):
        StagingSpec.from_json('{"ptr": 1}')
    with pytest.raises(TransferPlanError, match="chunk_bytes must be a positive"):
        chunk_pieces(PackLayout((), 0, "x"), 0)


# -- engines ----------------------------------------------------------------------------------

PAGES = {"kv": [0, 1, 2, 5, 8, 3, 3]}
DST_PAGES = {"kv": [9, 10, 11, 3, 16, 0, 1]}


def _engine_pools() -> tuple[Any, Any]:
    a = ReferenceDeepSeekV4SingleKVPool(size=512, page_size=64, layer_num=3)
    b = ReferenceDeepSeekV4SingleKVPool(size=1152, page_size=64, layer_num=3)
    randomise(a, 21)
    randomise(b, 22)
    return a, b


def _plans(a: Any, b: Any, dst_pages: Any = None) -> tuple[Any, Any]:
    """The sender's plan (from the receiver's JSON spec) and the receiver's (from the sender's)."""
    theirs = DST_PAGES if dst_pages is None else dst_pages
    send = plan_transfer(
        a, pool_spec(b).to_json(), pages=PAGES, dst_pages=DST_PAGES, method="packed"
    )
    receive = plan_transfer(
        pool_spec(a).to_json(), b, pages=PAGES, dst_pages=theirs, method="packed"
    )
    return send, receive


@needs_nixl
def test_nixl_packed_transfer_is_byte_exact_and_reuses_its_staging() -> None:
    a, b = _engine_pools()
    src, before = snapshot(a), snapshot(b)
    send, receive = _plans(a, b)
    with NixlEngine("src", progress_thread=False) as ea, NixlEngine("dst") as eb:
        ea.register(a)
        eb.register(b)
        staging = eb.staging(send.nbytes)
        assert eb.staging(send.nbytes // 2) == staging  # pooled: the same registered area
        to_b = ea.connect(eb.metadata())
        eb.connect(ea.metadata())
        prepared = ea.prepare(send, to_b, staging=staging.to_json(), chunk_bytes=2 * 37440)
        assert len(prepared.packed.sizes) > 2  # double-buffered: more chunks than slots
        ea.transfer(prepared, timeout=20.0, notify=b"kv ready")
        before_receive = snapshot(b)
        assert all(torch.equal(before_receive[k], before[k]) for k in before)  # not yet
        first = eb.receive(receive, timeout=20.0)
        _assert_moved(a, b, PAGES, DST_PAGES, src, before)
        ea.transfer(prepared, timeout=20.0)  # waits for the acknowledgement of the first
        second = eb.receive(receive, timeout=20.0)
        assert first != second
        assert prepared.runs == 2
        notes: dict[str, list[bytes]] = {}
        for _ in range(200):  # bounded: commits are consumed, the user's note passes
            notes = eb.notifications()
            if notes:
                break
        assert notes == {"src": [b"kv ready"]}
    _assert_moved(a, b, PAGES, DST_PAGES, src, before)


@needs_nixl
def test_nixl_packed_failure_mid_way_writes_nothing_into_the_receiver_pool() -> None:
    a, b = _engine_pools()
    before = snapshot(b)
    send, receive = _plans(a, b)
    with NixlEngine("src", progress_thread=False) as ea, NixlEngine("dst") as eb:
        ea.register(a)
        eb.register(b)
        staging = eb.staging(send.nbytes)
        to_b = ea.connect(eb.metadata())
        eb.connect(ea.metadata())
        prepared = ea.prepare(send, to_b, staging=staging, chunk_bytes=37440)
        real = ea._agent.transfer
        posted: list[int] = []

        def fail_third(handle: Any) -> Any:  # the engine fails after two chunks moved
            posted.append(1)
            if len(posted) == 3:
                raise RuntimeError("injected: link down")
            return real(handle)

        ea._agent.transfer = fail_third
        with pytest.raises(TransferError, match="injected: link down") as info:
            ea.transfer(prepared, timeout=10.0)
        err = info.value
        assert err.arrived == {}
        assert err.not_arrived == receive.dst_pages()  # every page: none reached the pool
        assert "destination pool is unchanged" in str(err)
        staged = eb._staging.current("cpu")
        assert staged is not None
        assert bool(staged[: 2 * 37440].any())
        with pytest.raises(TransferError, match="no commit arrived"):
            eb.receive(receive, timeout=0.5)
    after = snapshot(b)
    assert all(torch.equal(after[k], before[k]) for k in before)


@needs_nixl
def test_nixl_receive_refuses_a_commit_for_another_layout_and_writes_nothing() -> None:
    a, b = _engine_pools()
    before = snapshot(b)
    send, wrong = _plans(a, b, dst_pages={"kv": [9, 10, 11, 3, 16, 0, 2]})
    with NixlEngine("src", progress_thread=False) as ea, NixlEngine("dst") as eb:
        ea.register(a)
        eb.register(b)
        staging = eb.staging(send.nbytes)
        to_b = ea.connect(eb.metadata())
        eb.connect(ea.metadata())
        ea.transfer(ea.prepare(send, to_b, staging=staging), timeout=10.0)
        with pytest.raises(TransferError, match="another layout"):
            eb.receive(wrong, timeout=10.0)
    after = snapshot(b)
    assert all(torch.equal(after[k], before[k]) for k in before)


@needs_nixl
def test_nixl_packed_preparation_refuses_bad_inputs_and_moves_nothing() -> None:
    a, b = _engine_pools()
    before = snapshot(b)
    send, receive = _plans(a, b)
    stranger = ReferenceDeepSeekV4SingleKVPool(size=512, page_size=64, layer_num=3)
    with NixlEngine("src", progress_thread=False) as ea, NixlEngine("dst") as eb:
        ea.register(a)
        eb.register(b)
        small = eb.staging(send.nbytes - 1)
        to_b = ea.connect(eb.metadata())
        eb.connect(ea.metadata())
        with pytest.raises(TransferPlanError, match=r"engine\.staging\(nbytes"):
            ea.prepare(send, to_b)
        with pytest.raises(TransferPlanError, match=f"moves {send.nbytes} B"):
            ea.prepare(send, to_b, staging=small)
        with pytest.raises(TransferPlanError, match="op='WRITE'"):
            eb.prepare(receive, "src", op="READ", staging=small)
        unregistered = plan_transfer(stranger, b, pages=PAGES, dst_pages=DST_PAGES, method="packed")
        with pytest.raises(TransferError, match="not memory this engine registered"):
            ea.prepare(unregistered, to_b, staging=StagingSpec(small.ptr, 1 << 30, "cpu"))
        by_page = plan_transfer(pool_spec(a).to_json(), b, pages=PAGES, dst_pages=DST_PAGES)
        with pytest.raises(TransferPlanError, match="takes a packed plan"):
            eb.receive(by_page, timeout=0.1)
    after = snapshot(b)
    assert all(torch.equal(after[k], before[k]) for k in before)


@needs_mooncake
def test_mooncake_packed_transfer_is_byte_exact_once_the_commit_is_handed_over() -> None:
    a, b = _engine_pools()
    src, before = snapshot(a), snapshot(b)
    send, receive = _plans(a, b)
    _, wrong = _plans(a, b, dst_pages={"kv": [9, 10, 11, 3, 16, 0, 2]})
    with MooncakeEngine("127.0.0.1") as ea, MooncakeEngine("127.0.0.1") as eb:
        ea.register(a)
        eb.register(b)
        staging = eb.staging(send.nbytes)
        prepared = ea.prepare(send, ea.connect(eb.metadata()), staging=staging, chunk_bytes=40000)
        ea.transfer(prepared, timeout=20.0)
        commit = prepared.packed.commit
        with pytest.raises(TransferError, match="another layout"):
            eb.receive(wrong, commit=commit)
        unchanged = snapshot(b)
        assert all(torch.equal(unchanged[k], before[k]) for k in before)
        eb.receive(receive, commit=commit)
    _assert_moved(a, b, PAGES, DST_PAGES, src, before)


def _on_cuda(pool: Any) -> dict[str, Any]:
    """The pool's spec as a CUDA pool's would read (plans need only specs)."""
    data = pool_spec(pool).to_dict()
    for buf in data["buffers"]:
        buf["device"] = "cuda:0"
    return data


@needs_nixl
def test_a_direct_plan_is_refused_by_the_engines_and_by_receive() -> None:
    a, b = _engine_pools()
    direct = plan_transfer(
        _on_cuda(a), _on_cuda(b), pages=PAGES, dst_pages=DST_PAGES, method="direct"
    )
    assert direct.method == "direct"
    assert direct.packing is not None  # pulled batch by batch of the packed layout
    auto = plan_transfer(_on_cuda(a), _on_cuda(b), pages=PAGES, dst_pages=DST_PAGES)
    assert auto.method != "direct"  # the rule never picks it
    with NixlEngine("dst") as engine:
        with pytest.raises(TransferPlanError, match="CudaIpcPeer"):
            engine.prepare(direct, "peer")
        with pytest.raises(TransferPlanError, match="takes a packed plan"):
            engine.receive(direct, timeout=0.1)


def test_direct_transfers_refuse_what_cannot_be_mapped() -> None:
    from kvcompat.transfer import CudaIpcPeer, export_cuda_ipc

    a, _ = _engine_pools()
    with pytest.raises(TransferPlanError, match="direct transfers move CUDA memory"):
        export_cuda_ipc(a)
    with pytest.raises(TransferPlanError, match="not a kvcompat CUDA IPC export"):
        CudaIpcPeer(b"\x80\x04K\x01.")  # a pickle of 1


@pytest.mark.parametrize("name", sorted(REFERENCE_POOLS))
def test_every_buffer_path_resolves_to_the_tensor_holding_its_bytes(name: str) -> None:
    from kvcompat.transfer._direct import _resolve

    pool = REFERENCE_POOLS[name](1)
    for buf in pool_spec(pool).buffers:
        tensor = _resolve(pool, buf.path)
        assert tensor is not None, buf.path
        base = tensor.untyped_storage().data_ptr()
        assert base <= buf.ptr, buf.path
        assert buf.ptr + buf.length <= base + tensor.untyped_storage().nbytes(), buf.path


def test_a_direct_pull_moves_exactly_the_listed_pages_through_the_mapped_storages() -> None:
    """The pull's own logic on the CPU: the 'mapped' storages are the sender pool's own."""
    import dataclasses

    from kvcompat.transfer import CudaIpcPeer

    a, b = _engine_pools()
    src, before = snapshot(a), snapshot(b)
    packed = plan_transfer(a, b, pages=PAGES, dst_pages=DST_PAGES, method="packed")
    direct = dataclasses.replace(packed, method="direct")
    peer = CudaIpcPeer.__new__(CudaIpcPeer)  # what __init__ builds from real IPC handles
    peer._mapped = []
    peer._packers = {}
    for buf in a.kv_buffer:
        storage = buf.untyped_storage()
        flat = torch.empty(0, dtype=torch.uint8).set_(storage)
        peer._mapped.append((storage.data_ptr(), flat))
    with pytest.raises(TransferPlanError, match="takes a method='direct' plan"):
        peer.pull(packed, b)
    peer.pull(direct, b)
    peer.pull(direct, b)  # the cached views, again
    _assert_moved(a, b, PAGES, DST_PAGES, src, before)
    stranger = ReferenceDeepSeekV4SingleKVPool(size=1152, page_size=64, layer_num=3)
    with pytest.raises(TransferError, match="not memory this engine registered"):
        peer.pull(direct, stranger)  # the plan's destination is not this pool
    with pytest.raises(TransferPlanError, match="live pool of this process"):
        peer.pull(direct, pool_spec(b).to_json())  # addresses alone could be anyone's
    after = snapshot(b)
    want = expected_after(a, b, PAGES, DST_PAGES, src, before)
    assert all(torch.equal(after[k], want[k]) for k in want)  # the refusals wrote nothing


def test_a_plan_that_moves_nothing_is_never_packed() -> None:
    a, b = _engine_pools()
    empty = plan_transfer(a, b, pages={"kv": []}, method="packed")
    assert empty.nbytes == 0
    assert empty.method == "pages"  # no staging area of zero bytes, no commit for nothing
    assert empty.packing is None


class _FailingSecondBatch:
    """A Mooncake engine whose second batch write fails (the rest is the real engine)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.calls = 0

    def batch_transfer_sync_write(self, *args: Any) -> int:
        self.calls += 1
        if self.calls == 2:
            return -1
        result: int = self._engine.batch_transfer_sync_write(*args)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


@needs_mooncake
def test_mooncake_packed_failure_mid_way_commits_nothing_and_writes_nothing() -> None:
    a, b = _engine_pools()
    send, receive = _plans(a, b)
    with MooncakeEngine("127.0.0.1") as ea, MooncakeEngine("127.0.0.1") as eb:
        ea.register(a)
        eb.register(b)
        staging = eb.staging(send.nbytes)
        prepared = ea.prepare(send, ea.connect(eb.metadata()), staging=staging, chunk_bytes=40000)
        ea.transfer(prepared, timeout=20.0)  # a first run arrives and is received
        eb.receive(receive, commit=prepared.packed.commit)
        randomise(a, 99)  # new bytes for the second run, which fails after one chunk
        before = snapshot(b)
        real = ea._engine
        ea._engine = _FailingSecondBatch(real)
        try:
            with pytest.raises(TransferError, match="the engine refused chunk 1") as info:
                ea.transfer(prepared, timeout=20.0)
        finally:
            ea._engine = real
        assert info.value.arrived == {}
        assert info.value.not_arrived == receive.dst_pages()
        assert prepared.packed.commit == b""  # not even the first run's: nothing to scatter
    after = snapshot(b)
    assert all(torch.equal(after[k], before[k]) for k in before)


def test_auto_pulls_direct_only_when_told_the_peer_shares_the_node() -> None:
    one_k = (61 * 16, 61 * 16 * 37440)
    assert choose_method("auto", *one_k, "VRAM", same_node=True) == "direct"
    assert choose_method("auto", 8, 8 * 37440, "VRAM", same_node=True) == "direct"
    assert choose_method("auto", *one_k, "VRAM") == "packed"  # the peer may be anywhere
    # CPU memory has no direct path: the rule decides as without same_node
    assert choose_method("auto", *one_k, "DRAM", same_node=True) == "pages"
    assert choose_method("auto", 4096, 4096 * 256, "DRAM", same_node=True) == "packed"
    assert choose_method("auto", 0, 0, "VRAM", same_node=True) == "pages"  # nothing to move
    assert choose_method("pages", *one_k, "VRAM", same_node=True) == "pages"  # an override
    a, b = _pair("dsv4_single", 4)
    assert plan_transfer(a, b, pages={"kv": [0]}, same_node=True).method == "pages"
    for bad in (1, "yes", None):
        with pytest.raises(TransferPlanError, match="same_node must be True or False"):
            plan_transfer(a, b, pages={"kv": [0]}, same_node=bad)  # type: ignore[arg-type]
