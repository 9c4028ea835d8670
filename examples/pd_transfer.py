"""Prefill -> decode across two processes: move two requests' KV pages with NIXL (or Mooncake).

Process A (prefill) fills its pools with kvcompat writes; process B (decode)
sends A its pools' specs as JSON, its engine metadata and its staging area; A
plans the two requests' pages (``request_pages`` on each side: A's slots and
B's slots differ) and transfers them. The planner picks the method by request
shape (``method="auto"``): a plan of many small descriptors is *packed* — A
gathers every page into one stream, the engine moves it into B's staging area,
and B's ``engine.receive(plan)`` checks A's commit and scatters — the others go
page run by page run. B rebuilds each plan from A's JSON spec and checks that
its bytes equal A's for exactly those pages, that every other byte of its
buffers is unchanged, and that ``read`` through kvcompat gives A's values.

Pools (all from ``kvcompat.testing``, pure torch): an MHA pool of one-token pages
(SGLang's default) whose requests sit at scattered slots, as its allocator leaves them —
thousands of 256-byte ranges, which the planner packs even on a CPU host — a DeepSeek-V4
packed single-KV pool (V4 layout, 37,440-byte pages), and a sliding-window
composite whose full pages travel as ``kv`` and whose window pages travel as
``state``. ``tests/transfer`` runs the same two processes on SGLang's own
``DeepSeekV4TokenToKVPool`` (SWA ring, c4/c128 pools, indexer, compress states).

Run: ``python examples/pd_transfer.py [nixl|mooncake] [auto|pages|packed]`` (loopback
only; the second argument overrides the planner's choice).
"""

from __future__ import annotations

import ctypes
import importlib
import multiprocessing as mp
import os
import random
import sys
import time
from typing import Any

BUILDER = "pd_transfer:reference_pools"
"""``module:function`` building ``{name: (pool, [Request, Request])}`` for a role."""


# -- the pools and the two requests (either side) ------------------------------------------


def reference_pools(role: str) -> dict[str, Any]:
    """Three pools per side; decode's are bigger and its requests sit in other slots."""
    from kvcompat.testing import (
        ReferenceDeepSeekV4SingleKVPool,
        ReferenceMHATokenToKVPool,
        reference_swa_pool,
    )
    from kvcompat.transfer import Request

    prefill = role == "prefill"
    scale = 1 if prefill else 2
    mha = ReferenceMHATokenToKVPool(512 * scale, 1, layer_num=8, head_num=2, head_dim=64)
    slots = random.Random(role).sample(range(1, 512 * scale), 256)  # one-token pages, scattered
    v4 = ReferenceDeepSeekV4SingleKVPool(512 * scale, 64, layer_num=2)
    swa = reference_swa_pool(size=64 * scale, size_swa=48)
    if prefill:  # request 1: 40 tokens, request 2: 20 tokens
        mha_reqs = [Request(slots[:160]), Request(slots[160:])]
        v4_reqs = [Request(range(64, 168)), Request(range(320, 340))]
        swa_reqs = [
            Request(range(32), swa_locs=range(16, 32)),
            Request(range(32, 48), swa_locs=range(16)),
        ]
    else:
        mha_reqs = [Request(slots[:160]), Request(slots[160:])]
        v4_reqs = [Request(range(640, 744)), Request(range(20))]
        swa_reqs = [
            Request(range(64, 96), swa_locs=range(32, 48)),
            Request(range(16, 32), swa_locs=range(16, 32)),
        ]
    return {"mha": (mha, mha_reqs), "dsv4_single": (v4, v4_reqs), "swa": (swa, swa_reqs)}


# -- helpers --------------------------------------------------------------------------------


def host_bytes(ptr: int, length: int) -> Any:
    """A writable uint8 tensor over host memory (CPU pools only)."""
    import torch

    return torch.frombuffer((ctypes.c_uint8 * length).from_address(ptr), dtype=torch.uint8)


def fill(pool: Any, seed: int) -> None:
    """Random bytes in every registered buffer, then kvcompat writes on every component."""
    import torch

    import kvcompat
    from kvcompat.transfer import pool_spec

    generator = torch.Generator().manual_seed(seed)
    for buf in pool_spec(pool).buffers:  # states kvcompat has no writer for stay random
        view = host_bytes(buf.ptr, buf.length)
        view.copy_(torch.randint(0, 256, (buf.length,), dtype=torch.uint8, generator=generator))
    adapter = kvcompat.adapt(pool)
    parts = adapter.components if adapter.kind is kvcompat.PoolKind.COMPOSITE else {"": adapter}
    for part in parts.values():
        loc = torch.arange(part.size)
        for layer in part.layer_ids:
            try:
                probe = part.read(layer, loc[:1])
            except kvcompat.LayoutError:
                continue  # no kvcompat codec (DeepSeek-V4 indexer keys): its random bytes move
            key = torch.randn((len(loc), *probe.shape[1:]), generator=generator).to(probe.dtype)
            value = None
            if part.kind is kvcompat.PoolKind.SPLIT:
                pair = part.read_kv(layer, loc[:1])
                shape = (len(loc), *pair.value.shape[1:])
                value = torch.randn(shape, generator=generator).to(pair.value.dtype)
            part.write(layer, loc, key, value)


def reads(pool: Any, plan: Any, side: int) -> dict[str, Any]:
    """kvcompat ``read`` of every moved token, per buffer label, on one side of the plan."""
    import torch

    import kvcompat

    adapter = kvcompat.adapt(pool)
    parts = adapter.components if adapter.kind is kvcompat.PoolKind.COMPOSITE else None
    out: dict[str, Any] = {}
    for index, pair in enumerate(plan.pairs):
        buf = pair[side]
        part = adapter if parts is None else parts.get(buf.component)
        if part is None or buf.layer_id not in part.layer_ids or buf.role == "value":
            continue  # a state with no kvcompat reader, or V (read with K below)
        try:
            part.layout(buf.layer_id)
        except kvcompat.LayoutError:
            continue  # no codec for these bytes (indexer keys): the byte check covers them
        per_token = buf.row_bytes if buf.row_unit == "token" else buf.row_bytes // part.page_size
        tokens = buf.item_length // per_token
        moved = sorted(  # (source page, destination page), in source order on both sides
            (run.src_page + k, run.dst_page + k)
            for d in plan.descriptors
            for run in d.runs
            if run.buffer == index
            for k in range(run.count)
        )
        loc = torch.tensor([p[side] * tokens + t for p in moved for t in range(tokens)])
        if part.kind is kvcompat.PoolKind.SPLIT:
            kv = part.read_kv(buf.layer_id, loc)
            out[buf.label] = (kv.key, kv.value)
        else:
            out[buf.label] = (part.read(buf.layer_id, loc),)
    return out


def _same_bits(x: Any, y: Any) -> bool:
    """Bit-identical (NaN bit patterns included: unwritten pages hold random bytes)."""
    import torch

    flat = (x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))
    return x.shape == y.shape and x.dtype == y.dtype and torch.equal(*flat)


def make_engine(kind: str, name: str, *, initiator: bool = False) -> Any:
    from kvcompat.transfer import MooncakeEngine, NixlEngine

    if kind != "nixl":
        return MooncakeEngine("127.0.0.1")
    # the side that calls transfer() progresses its own worker while it waits; the passive
    # side keeps NIXL's progress thread, which answers the initiator's connection
    return NixlEngine(name, progress_thread=not initiator)


def load(builder: str, role: str) -> dict[str, Any]:
    module, _, function = builder.partition(":")
    result: dict[str, Any] = getattr(importlib.import_module(module), function)(role)
    return result


# -- the two processes ----------------------------------------------------------------------


def prefill(conn: Any, builder: str, engine_kind: str, timeout: float, method: str) -> None:
    """Process A: fill, exchange specs and metadata with B, plan, transfer, report."""
    import torch

    from kvcompat.transfer import merge_pages, plan_transfer, pool_spec, request_pages

    torch.set_num_threads(1)
    cases = load(builder, "prefill")
    for seed, (pool, _) in enumerate(cases.values()):
        fill(pool, seed)
    engine = make_engine(engine_kind, "prefill", initiator=True)
    try:
        for pool, _ in cases.values():
            engine.register(pool)
        message = conn.recv()  # B's specs, page ids, metadata and staging area
        peer = engine.connect(message["metadata"])
        pages = {n: merge_pages(request_pages(p, *r)) for n, (p, r) in cases.items()}
        conn.send(
            {
                "specs": {n: pool_spec(p).to_json() for n, (p, _) in cases.items()},
                "pages": pages,
                "metadata": engine.metadata(),
            }
        )
        conn.recv()  # B has loaded our metadata
        report = {}
        for name, (pool, _) in cases.items():
            plan = plan_transfer(
                pool,
                message["specs"][name],
                pages=pages[name],
                dst_pages=message["pages"][name],
                method=method,
            )
            packed = plan.method == "packed"
            prepared = engine.prepare(
                plan, peer, chunks=2, staging=message["staging"] if packed else None
            )
            engine.transfer(prepared, timeout=timeout)  # NIXL: the commit goes as a notification
            if packed and engine_kind != "nixl":  # Mooncake has none: hand it over ourselves
                conn.send({"commit": prepared.packed.commit})
                conn.recv()  # B scattered: its staging area may be written again
            engine.release(prepared)
            report[name] = {
                "summary": plan.summary(),
                "reads": reads(pool, plan, 0),
                "bytes": {b.label: host_bytes(b.ptr, b.length).clone() for b, _ in plan.pairs},
            }
        conn.send(report)
        conn.recv()  # B is done: our memory may go
    finally:
        engine.close()


def decode(
    conn: Any, out: Any, builder: str, engine_kind: str, timeout: float, method: str
) -> None:
    """Process B: register, send specs and page ids, receive, check every byte, tell ``out``."""
    import torch

    from kvcompat.transfer import merge_pages, plan_transfer, pool_spec, request_pages

    torch.set_num_threads(1)
    cases = load(builder, "decode")
    for seed, (pool, _) in enumerate(cases.values()):
        fill(pool, 100 + seed)
    before = {
        n: {b.label: host_bytes(b.ptr, b.length).clone() for b in pool_spec(p).buffers}
        for n, (p, _) in cases.items()
    }
    engine = make_engine(engine_kind, "decode")
    try:
        for pool, _ in cases.values():
            engine.register(pool)
        pages = {n: merge_pages(request_pages(p, *r)) for n, (p, r) in cases.items()}
        # one staging area for packed requests, registered before the metadata goes out and
        # sized for the largest request (a plan of the pool onto itself has its bytes)
        need = max(plan_transfer(p, p, pages=pages[n]).nbytes for n, (p, _) in cases.items())
        staging = engine.staging(need)
        conn.send(
            {
                "specs": {n: pool_spec(p).to_json() for n, (p, _) in cases.items()},
                "pages": pages,
                "metadata": engine.metadata(),
                "staging": staging.to_json(),
            }
        )
        peer_message = conn.recv()
        engine.connect(peer_message["metadata"])
        conn.send("connected")
        plans = receive_all(conn, engine, cases, peer_message, pages, method, timeout)
        report = conn.recv()
        result = {}
        for name, (pool, _) in cases.items():
            got, plan = report[name], plans[name]
            moved = moved_equal = untouched = 0
            for src_buf, dst_buf in plan.pairs:
                src = got["bytes"][src_buf.label]
                dst = host_bytes(dst_buf.ptr, dst_buf.length)
                mask = torch.zeros(dst_buf.length, dtype=torch.bool)
                size = dst_buf.item_length
                for d in plan.descriptors:
                    for run in d.runs:
                        if plan.pairs[run.buffer][1] != dst_buf:
                            continue
                        s0, d0, n = run.src_page * size, run.dst_page * size, run.count * size
                        moved += n
                        moved_equal += int(torch.equal(src[s0 : s0 + n], dst[d0 : d0 + n])) * n
                        mask[d0 : d0 + n] = True
                untouched += int(torch.equal(dst[~mask], before[name][dst_buf.label][~mask]))
            mine, theirs = reads(pool, plan, 1), got["reads"]
            reads_equal = sorted(mine) == sorted(theirs) and all(
                all(_same_bits(x, y) for x, y in zip(mine[k], theirs[k], strict=True)) for k in mine
            )
            others = [b for b in pool_spec(pool).buffers if b not in {p[1] for p in plan.pairs}]
            untouched += sum(
                int(torch.equal(host_bytes(b.ptr, b.length), before[name][b.label])) for b in others
            )
            result[name] = {
                "summary": got["summary"],
                "bytes_equal": moved == moved_equal,
                "untouched_buffers": f"{untouched}/{len(pool_spec(pool).buffers)}",
                "others_unchanged": untouched == len(pool_spec(pool).buffers),
                "reads_equal": reads_equal,
                "reads": len(mine),
            }
        conn.send("done")
        out.send(result)
    finally:
        engine.close()


def receive_all(
    conn: Any,
    engine: Any,
    cases: dict[str, Any],
    peer: dict[str, Any],
    pages: dict[str, Any],
    method: str,
    timeout: float,
) -> dict[str, Any]:
    """B's plans, rebuilt from A's JSON specs; packed ones received (checked, scattered)."""
    from kvcompat.transfer import plan_transfer

    plans = {}
    for name, (pool, _) in cases.items():
        # the remote side needs no live object: A's spec and page ids make the same plan
        plan = plan_transfer(
            peer["specs"][name],
            pool,
            pages=peer["pages"][name],
            dst_pages=pages[name],
            method=method,
        )
        if plan.method == "packed":  # nothing lands in the pool before this scatters it
            if engine.engine == "NIXL":
                engine.receive(plan, timeout=timeout)  # NIXL: the commit is a notification
            else:
                engine.receive(plan, commit=conn.recv()["commit"])
                conn.send("received")
        plans[name] = plan
    return plans


def run(
    builder: str = BUILDER, engine: str = "nixl", timeout: float = 60.0, method: str = "auto"
) -> dict[str, Any]:
    """Start A and B (spawned), wait for B's verdict, stop both by their handles."""
    os.environ.setdefault("UCX_NET_DEVICES", "lo")  # loopback only (inherited by both)
    # no InfiniBand modules on loopback: NIXL 1.5.1's bundled libnl-route crashes (SIGSEGV)
    # at the exit of a process that loaded them (docs/transfer.md, "Traps")
    os.environ.setdefault("UCX_MODULES", "^ib")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    context = mp.get_context("spawn")
    a_end, b_end = context.Pipe()
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    result_end, verdict_end = context.Pipe()
    a = context.Process(
        target=prefill, args=(a_end, builder, engine, timeout, method), name="prefill"
    )
    b = context.Process(
        target=decode, args=(b_end, verdict_end, builder, engine, timeout, method), name="decode"
    )
    try:
        a.start()
        b.start()
        deadline = time.monotonic() + timeout + 60
        while not result_end.poll(0.5):  # bounded: a dead peer or the deadline ends the wait
            failed = [p for p in (a, b) if p.exitcode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                what = ", ".join(f"{p.name} exited {p.exitcode}" for p in failed) or "timed out"
                msg = f"the prefill -> decode run did not finish: {what}"
                raise RuntimeError(msg)
        result: dict[str, Any] = result_end.recv()
        return result
    finally:
        for process in (a, b):
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()


def main() -> int:
    engine = sys.argv[1] if len(sys.argv) > 1 else "nixl"
    method = sys.argv[2] if len(sys.argv) > 2 else "auto"
    try:
        if engine == "nixl":
            from kvcompat.transfer import import_nixl

            import_nixl()
        else:
            from kvcompat.transfer import import_mooncake

            import_mooncake()
    except ImportError as exc:
        print(f"skipped: {exc}")
        return 0
    result = run(engine=engine, method=method)
    print(f"prefill -> decode over {engine} (two processes, loopback), method={method}:")
    ok = True
    for name, facts in result.items():
        summary = facts["summary"]
        good = facts["bytes_equal"] and facts["others_unchanged"] and facts["reads_equal"]
        ok &= good
        print(
            f"  {name:12s} {summary['pages']:4d} pages in {summary['descriptors']:4d} descriptors "
            f"{summary['bytes']:>8d} B  {summary['method']:6s}  "
            f"bytes equal {facts['bytes_equal']}  "
            f"other bytes unchanged {facts['others_unchanged']}  "
            f"reads equal {facts['reads_equal']} ({facts['reads']} buffers)"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
