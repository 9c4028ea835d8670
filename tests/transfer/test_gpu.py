"""VRAM -> VRAM between two processes on one GPU through NIXL, checked byte by byte.

Needs a CUDA device and NIXL built for its CUDA (``nixl-cu13`` for CUDA 13). Process A
(prefill) fills a DeepSeek-V4 packed pool and an MHA pool on ``cuda:0`` with kvcompat
writes; process B (decode) registers its own pools there, sends their specs as JSON and
its agent metadata; A moves two requests' pages (UCX picks ``cuda_ipc`` on one host);
B checks that its bytes equal A's for exactly those pages, that every other byte of its
buffers is unchanged, and that kvcompat reads equal A's.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import time
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.gpu

_PAGES = {  # name -> (prefill requests' kv_locs, decode requests' kv_locs)
    "dsv4_single": ([range(64, 168), range(320, 340)], [range(640, 744), range(20)]),
    "mha": ([range(16, 56), range(128, 148)], [range(160, 200), range(48, 68)]),
}


def _pools(role: str) -> dict[str, Any]:
    from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool, ReferenceMHATokenToKVPool

    scale = 1 if role == "prefill" else 2
    return {
        "dsv4_single": ReferenceDeepSeekV4SingleKVPool(
            512 * scale, 64, layer_num=2, device="cuda:0"
        ),
        "mha": ReferenceMHATokenToKVPool(
            256 * scale, 16, layer_num=2, head_num=2, head_dim=64, device="cuda:0"
        ),
    }


def _tensor(pool: Any, path: str) -> torch.Tensor:
    """The buffer tensor at a manifest path such as ``k_buffer[1]`` (reference pools)."""
    match = re.fullmatch(r"(\w+)\[(\d+)\]", path)
    assert match, path
    return getattr(pool, match.group(1))[int(match.group(2))].view(torch.uint8).reshape(-1)


def _fill(pool: Any, seed: int) -> None:
    import kvcompat

    generator = torch.Generator(device="cuda").manual_seed(seed)
    adapter = kvcompat.adapt(pool)
    loc = torch.arange(adapter.size, device="cuda")
    for layer in adapter.layer_ids:
        probe = adapter.read(layer, loc[:1])
        shape = (len(loc), *probe.shape[1:])
        key = torch.randn(shape, generator=generator, device="cuda").to(probe.dtype)
        value = key.flip(0) if adapter.kind is kvcompat.PoolKind.SPLIT else None
        adapter.write(layer, loc, key, value)


def _reads(pool: Any, plan: Any, side: int) -> dict[str, torch.Tensor]:
    import kvcompat

    adapter = kvcompat.adapt(pool)
    out = {}
    for index, pair in enumerate(plan.pairs):
        buf = pair[side]
        if buf.role == "value":
            continue
        per_token = buf.row_bytes if buf.row_unit == "token" else buf.row_bytes // adapter.page_size
        tokens = buf.item_length // per_token
        moved = sorted(
            (r.src_page + k, r.dst_page + k)
            for d in plan.descriptors
            for r in d.runs
            if r.buffer == index
            for k in range(r.count)
        )
        loc = torch.tensor(
            [p[side] * tokens + t for p in moved for t in range(tokens)], device="cuda"
        )
        kv = adapter.read_kv(buf.layer_id, loc)
        out[buf.label] = torch.cat(
            [kv.key.reshape(-1).view(torch.uint8), kv.value.reshape(-1).view(torch.uint8)]
        ).cpu()
    return out


def _prefill(conn: Any, progress_thread: bool, method: str) -> None:
    from kvcompat.transfer import (
        NixlEngine,
        Request,
        merge_pages,
        plan_transfer,
        pool_spec,
        request_pages,
    )

    torch.set_num_threads(1)
    pools = _pools("prefill")
    for seed, pool in enumerate(pools.values()):
        _fill(pool, seed)
    torch.cuda.synchronize()
    engine = NixlEngine("prefill", progress_thread=progress_thread)  # the initiator
    try:
        for pool in pools.values():
            engine.register(pool)
        hello = conn.recv()
        peer = engine.connect(hello["metadata"])
        all_pages = {
            name: merge_pages(request_pages(pool, *(Request(r) for r in _PAGES[name][0])))
            for name, pool in pools.items()
        }
        conn.send(
            {
                "metadata": engine.metadata(),
                "specs": {n: pool_spec(p).to_json() for n, p in pools.items()},
                "pages": all_pages,
            }
        )
        conn.recv()
        report = {}
        for name, pool in pools.items():
            pages = all_pages[name]
            plan = plan_transfer(
                pool,
                hello["specs"][name],
                pages=pages,
                dst_pages=hello["pages"][name],
                method=method,
            )
            assert plan.src_mem == plan.dst_mem == "VRAM"
            assert plan.method == method
            prepared = engine.prepare(
                plan, peer, staging=hello["staging"] if method == "packed" else None
            )
            start = time.perf_counter()
            engine.transfer(prepared, timeout=60.0)
            seconds = time.perf_counter() - start
            report[name] = {
                "spec": pool_spec(pool).to_json(),
                "pages": pages,
                "bytes": {b.label: _tensor(pool, b.path).cpu() for b, _ in plan.pairs},
                "reads": _reads(pool, plan, 0),
                "seconds": seconds,
                "nbytes": plan.nbytes,
            }
        conn.send(report)
        conn.recv()
    finally:
        engine.close()


def _decode(conn: Any, out: Any, method: str) -> None:
    from kvcompat.transfer import (
        NixlEngine,
        Request,
        merge_pages,
        plan_transfer,
        pool_spec,
        request_pages,
    )

    torch.set_num_threads(1)
    pools = _pools("decode")
    for seed, pool in enumerate(pools.values()):
        _fill(pool, 100 + seed)
    torch.cuda.synchronize()
    before = {
        n: {b.label: _tensor(p, b.path).cpu() for b in pool_spec(p).buffers}
        for n, p in pools.items()
    }
    engine = NixlEngine("decode")
    try:
        for pool in pools.values():
            engine.register(pool)
        pages = {
            n: merge_pages(request_pages(p, *(Request(r) for r in _PAGES[n][1])))
            for n, p in pools.items()
        }
        need = max(plan_transfer(p, p, pages=pages[n]).nbytes for n, p in pools.items())
        staging = engine.staging(need, device="cuda:0")  # before the metadata goes out
        conn.send(
            {
                "specs": {n: pool_spec(p).to_json() for n, p in pools.items()},
                "pages": pages,
                "metadata": engine.metadata(),
                "staging": staging.to_json(),
            }
        )
        peer = conn.recv()
        engine.connect(peer["metadata"])
        conn.send("connected")
        if method == "packed":  # nothing lands in the pools before each commit is checked
            for name, pool in pools.items():
                plan = plan_transfer(
                    peer["specs"][name],
                    pool,
                    pages=peer["pages"][name],
                    dst_pages=pages[name],
                    method="packed",
                )
                engine.receive(plan, timeout=60.0)
        report = conn.recv()
        verdict = {}
        for name, pool in pools.items():
            got = report[name]
            # the plan again, from A's JSON spec: reads pair A's tokens with ours in one order
            plan = plan_transfer(got["spec"], pool, pages=got["pages"], dst_pages=pages[name])
            exact = untouched = True
            for buf in pool_spec(pool).buffers:
                now = _tensor(pool, buf.path).cpu()
                expected = before[name][buf.label].clone()
                src = got["bytes"][buf.label]
                size = buf.item_length
                for s, d in zip(got["pages"]["kv"], pages[name]["kv"], strict=True):
                    expected[d * size : (d + 1) * size] = src[s * size : (s + 1) * size]
                    exact &= torch.equal(
                        now[d * size : (d + 1) * size], src[s * size : (s + 1) * size]
                    )
                untouched &= torch.equal(now, expected)
            mine = _reads(pool, plan, 1)
            verdict[name] = {
                "exact": exact,
                "untouched": untouched,
                "reads": sorted(mine) == sorted(got["reads"])
                and all(torch.equal(mine[k], got["reads"][k]) for k in mine),
                "gbps": got["nbytes"] / got["seconds"] / 1e9,
            }
        conn.send("done")
        out.send(verdict)
    finally:
        engine.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    ("initiator_thread", "method"),
    [(False, "pages"), (True, "pages"), (False, "packed")],
    ids=["no-thread", "thread", "packed"],
)
def test_vram_to_vram_between_two_processes_on_one_gpu(initiator_thread: bool, method: str) -> None:
    from kvcompat.transfer import import_nixl

    try:
        import_nixl()
    except ImportError as exc:
        pytest.skip(str(exc))
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    os.environ.setdefault("UCX_MODULES", "^ib")  # see test_engines.py
    context = mp.get_context("spawn")
    a_end, b_end = context.Pipe()
    verdict_end, out_end = context.Pipe()
    a = context.Process(target=_prefill, args=(a_end, initiator_thread, method), name="prefill")
    b = context.Process(target=_decode, args=(b_end, out_end, method), name="decode")
    try:
        a.start()
        b.start()
        deadline = time.monotonic() + 300
        while not verdict_end.poll(0.5):
            failed = [p for p in (a, b) if p.exitcode not in (None, 0)]
            assert not failed, [f"{p.name} exited {p.exitcode}" for p in failed]
            assert time.monotonic() < deadline, "timed out"
        verdict = verdict_end.recv()
    finally:
        for process in (a, b):
            process.join(timeout=30)
            if process.is_alive():
                process.terminate()
                process.join(timeout=10)
    print(verdict)
    for name, facts in verdict.items():
        assert facts["exact"], name
        assert facts["untouched"], name
        assert facts["reads"], name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("chunk_bytes", [37440, 1 << 30], ids=["page-chunks", "one"])
def test_packed_gather_and_scatter_on_the_device_are_byte_exact(chunk_bytes: int) -> None:
    """The multi-layer kernels move a packed plan between two CUDA pools exactly."""
    from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
    from kvcompat.transfer import plan_transfer

    from ._helpers import move_packed_locally

    a = ReferenceDeepSeekV4SingleKVPool(512, 64, layer_num=5, device="cuda:0")
    b = ReferenceDeepSeekV4SingleKVPool(1024, 64, layer_num=5, device="cuda:0")
    generator = torch.Generator(device="cuda").manual_seed(5)
    for pool in (a, b):
        for buf in pool.kv_buffer:
            raw = buf.view(torch.uint8)
            noise = torch.randint(0, 256, raw.shape, device="cuda", generator=generator)
            raw.copy_(noise.to(torch.uint8))
    src = [t.view(torch.uint8).clone() for t in a.kv_buffer]
    want = [t.view(torch.uint8).clone() for t in b.kv_buffer]
    pages, dst_pages = [3, 0, 7, 7, 1], [15, 2, 9, 4, 11]
    plan = plan_transfer(a, b, pages={"kv": pages}, dst_pages={"kv": dst_pages}, method="packed")
    move_packed_locally(plan, chunk_bytes)
    torch.cuda.synchronize()
    for layer, (mine, theirs) in enumerate(zip(src, want, strict=True)):
        theirs[dst_pages] = mine[pages]
        assert torch.equal(b.kv_buffer[layer].view(torch.uint8), theirs), layer


_DIRECT_PAGES, _DIRECT_DST = [3, 0, 7, 7, 1, 12], [15, 2, 9, 4, 11, 0]


def _direct_pool(pages: int) -> Any:
    from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool

    return ReferenceDeepSeekV4SingleKVPool(pages * 64, 64, layer_num=4, device="cuda:0")


def _random_fill(pool: Any, seed: int) -> None:
    generator = torch.Generator(device="cuda").manual_seed(seed)
    for buf in pool.kv_buffer:
        raw = buf.view(torch.uint8)
        noise = torch.randint(0, 256, raw.shape, device="cuda", generator=generator)
        raw.copy_(noise.to(torch.uint8))


def _direct_sender(conn: Any) -> None:
    from kvcompat.transfer import export_cuda_ipc, pool_spec

    pool = _direct_pool(16)
    _random_fill(pool, 1)
    torch.cuda.synchronize()
    conn.send(
        {
            "spec": pool_spec(pool).to_json(),
            "export": export_cuda_ipc(pool),
            "bytes": [t.view(torch.uint8).cpu() for t in pool.kv_buffer],
        }
    )
    conn.recv()  # the receiver pulled: our memory may go


def _direct_receiver(conn: Any, out: Any) -> None:
    from kvcompat.transfer import CudaIpcPeer, plan_transfer

    pool = _direct_pool(32)
    _random_fill(pool, 2)
    torch.cuda.synchronize()
    want = [t.view(torch.uint8).cpu() for t in pool.kv_buffer]
    message = conn.recv()
    plan = plan_transfer(
        message["spec"],
        pool,
        pages={"kv": _DIRECT_PAGES},
        dst_pages={"kv": _DIRECT_DST},
        method="direct",
    )
    peer = CudaIpcPeer(message["export"])
    peer.pull(plan, pool)
    peer.pull(plan, pool)  # again, through the cached views
    exact = True
    for layer, (src, expected) in enumerate(zip(message["bytes"], want, strict=True)):
        expected[_DIRECT_DST] = src[_DIRECT_PAGES]
        exact &= torch.equal(pool.kv_buffer[layer].view(torch.uint8).cpu(), expected)
    peer.close()
    out.send({"exact": exact})
    conn.send("done")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_direct_pull_through_cuda_ipc_between_two_processes_is_byte_exact() -> None:
    context = mp.get_context("spawn")
    a_end, b_end = context.Pipe()
    verdict_end, out_end = context.Pipe()
    a = context.Process(target=_direct_sender, args=(a_end,), name="sender")
    b = context.Process(target=_direct_receiver, args=(b_end, out_end), name="receiver")
    try:
        a.start()
        b.start()
        deadline = time.monotonic() + 300
        while not verdict_end.poll(0.5):
            failed = [p for p in (a, b) if p.exitcode not in (None, 0)]
            assert not failed, [f"{p.name} exited {p.exitcode}" for p in failed]
            assert time.monotonic() < deadline, "timed out"
        verdict = verdict_end.recv()
    finally:
        for process in (a, b):
            process.join(timeout=30)
            if process.is_alive():
                process.terminate()
                process.join(timeout=10)
    assert verdict["exact"]
