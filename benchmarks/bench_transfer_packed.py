"""One request's pages, two processes: per-page descriptors vs packed vs one contiguous copy.

Usage:
    python benchmarks/bench_transfer_packed.py --scale 16              # CPU, NIXL over loopback
    python benchmarks/bench_transfer_packed.py --device cuda           # one GPU, two processes
    python benchmarks/bench_transfer_packed.py --json docs/_data/transfer-packed-cpu.json

For each pool and request length this process holds the prefill pool and a spawned process
the decode pool, both with ``--layers`` layers; the request's pages sit at random pages on
both sides (as an allocator leaves them), so per-page descriptors rarely merge. Side by
side, alternating within each round so that load drifts hit every way alike:

* ``one copy``: one ``copy_`` of the request's bytes, contiguous, in this process — the
  bar the issue sets (a transfer cannot beat moving the bytes once);
* ``gather``: kvcompat's multi-layer gather of the request into a contiguous buffer, in
  this process (what packing adds on the sender);
* ``scatter``: kvcompat's all-or-nothing multi-layer scatter of that buffer back onto the
  same pages, in this process (what packing adds on the receiver);
* ``cma`` (CPU): the kernel's ``process_vm_writev`` of the packed bytes as one range into
  the decode process — the cross-process ceiling of a CPU machine (UCX's ``cma``
  transport pins and copies every 4 KiB page; nothing that crosses processes here can
  beat it);
* ``pages``: ``engine.transfer`` of the per-page plan (a NIXL descriptor per run of pages);
* ``packed``: ``engine.transfer`` of the packed plan until the decode side acknowledged
  its ``receive``: gather, chunked moves, commit, check, scatter — end to end;
* ``direct`` (GPU): ``CudaIpcPeer.pull`` in the decode process through this process's
  ``export_cuda_ipc`` (timed there, after the other ways' rounds);
* ``auto``: which of the two ``plan_transfer(method="auto")`` picks for the request.

Pools: DeepSeek-V4 single (``ReferenceDeepSeekV4SingleKVPool``, V4 layout, 64-token pages
of 37,440 B), the DeepSeek-V4 composite (SGLang's own ``DeepSeekV4TokenToKVPool``: SWA, c4,
c4 indexer, c128, their compress states; ratios ``[0, 0, 4, 128, ...]``, 256-token pages;
needs SGLang) and MHA (``ReferenceMHATokenToKVPool``, 4 KV heads x 128 bf16, 16-token
pages). Requests of 1k, 8k and 64k tokens; ``--scale N`` divides them by N (a CPU run:
the table says so).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing as mp
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("UCX_NET_DEVICES", "lo")
os.environ.setdefault("UCX_MODULES", "^ib")  # see docs/transfer.md, "Traps"

ROOT = Path(__file__).resolve().parents[1]
POOLS = ("dsv4_single", "dsv4_composite", "mha")
TOKENS = (1024, 8192, 65536)
RATIOS = (0, 0, *([4, 128] * 30))  # DeepSeek-V4's compress ratios, first layers dense


# -- pools and requests (either process) ----------------------------------------------------


def build(kind: str, tokens: int, layers: int, device: str) -> tuple[Any, int]:
    """A pool with room for two requests of ``tokens``, and its page size."""
    from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool, ReferenceMHATokenToKVPool

    if kind == "dsv4_single":
        page = 64
        size = 2 * -(-tokens // page) * page + 2 * page
        return ReferenceDeepSeekV4SingleKVPool(size, page, layer_num=layers, device=device), page
    if kind == "mha":
        page = 16
        size = (-(-tokens // page) * 5 // 4 + 4) * page
        pool = ReferenceMHATokenToKVPool(
            size, page, layer_num=layers, head_num=4, head_dim=128, device=device
        )
        return pool, page
    if kind == "dsv4_composite":
        sys.path.insert(0, str(ROOT / "tests"))
        from _sglang.env import prepare_sglang
        from _sglang.features import pool_class

        prepare_sglang()
        page, room = 256, 2 * max(-(-tokens // 256) * 256, 256)
        pool = pool_class("DeepSeekV4TokenToKVPool")(
            max_num_reqs=4,
            swa_size=4 * page,
            c4_size=room // 4,
            c128_size=room // 128,
            c4_state_pool_size=8,
            c128_state_pool_size=8,
            page_size=page,
            swa_page_size=page,
            dtype=torch.float8_e4m3fn,
            c4_state_dtype=torch.float32,
            c128_state_dtype=torch.float32,
            qk_nope_head_dim=448,
            qk_rope_head_dim=64,
            indexer_head_dim=128,
            layer_num=layers,
            device=device,
            enable_memory_saver=False,
            compression_ratios=list(RATIOS[:layers]),
        )
        return pool, page
    msg = f"unknown pool {kind!r}; choose from {POOLS}"
    raise SystemExit(msg)


def request(pool: Any, page: int, tokens: int, seed: int, slot: int) -> dict[str, tuple[int, ...]]:
    """The request's page ids per group, at random pages (as an allocator leaves them)."""
    from kvcompat.transfer import Request, pool_spec, request_pages

    spec = pool_spec(pool)
    kv_pages = min(b.items for b in spec.buffers if b.group == "kv")
    need = -(-tokens // page)
    chosen = random.Random(seed).sample(range(1, kv_pages), need)
    locs = [p * page + t for p in chosen for t in range(page)][:tokens]
    swa = None
    if "state" in spec.groups():
        swa_pages = min(b.items for b in spec.buffers if b.group == "state")
        start = random.Random(seed + 1).randrange(1, swa_pages)
        swa = range(start * page, start * page + min(page, tokens))
    return request_pages(pool, Request(locs, swa_locs=swa, req_pool_idx=slot))


def fill(pool: Any, seed: int) -> None:
    from kvcompat.transfer import pool_spec
    from kvcompat.transfer._packed import device_bytes

    generator = torch.Generator(device="cpu").manual_seed(seed)
    noise = torch.randint(0, 256, (1 << 20,), dtype=torch.uint8, generator=generator)
    for buf in pool_spec(pool).buffers:
        view = device_bytes(buf.ptr, buf.length, buf.device)
        for start in range(0, buf.length, noise.numel()):
            part = view[start : start + noise.numel()]
            part.copy_(noise[: part.numel()].roll(start % 4099).to(part.device))


# -- the decode process ---------------------------------------------------------------------


def decode(conn: Any, cases: list[tuple[str, int]], layers: int, device: str) -> None:
    torch.set_num_threads(1)
    from kvcompat.transfer import NixlEngine, plan_transfer, pool_spec

    pools = [build(kind, tokens, layers, device) for kind, tokens in cases]
    engine = NixlEngine("decode")
    try:
        for pool, _ in pools:
            engine.register(pool)
        pages = [request(p, page, t, 7, 2) for (p, page), (_, t) in zip(pools, cases, strict=True)]
        need = max(
            plan_transfer(p, p, pages=g).nbytes for (p, _), g in zip(pools, pages, strict=True)
        )
        staging = engine.staging(need, device=device)
        conn.send(
            {
                "specs": [pool_spec(p).to_json() for p, _ in pools],
                "pages": pages,
                "metadata": engine.metadata(),
                "staging": staging.to_json(),
                "pid": os.getpid(),
            }
        )
        engine.connect(conn.recv())
        conn.send("connected")
        while True:  # per case: ("case", index, source spec, source pages, runs) or "done"
            message = conn.recv()
            if message == "done":
                break
            if message[0] == "direct":  # CUDA: pull through the prefill's IPC export, timed
                conn.send(pull_direct(message, pools, pages))
                continue
            _, index, spec, src_pages, runs = message
            plan = plan_transfer(
                spec, pools[index][0], pages=src_pages, dst_pages=pages[index], method="packed"
            )
            for _ in range(runs):
                engine.receive(plan, timeout=300.0)
            conn.send("received")
    finally:
        engine.close()


def pull_direct(message: Any, pools: list[Any], pages: list[Any]) -> list[float]:
    """Seconds of each ``CudaIpcPeer.pull`` of one request (after 2 warm-ups)."""
    from kvcompat.transfer import CudaIpcPeer, plan_transfer

    _, index, spec, src_pages, exported, runs = message
    pool = pools[index][0]
    plan = plan_transfer(spec, pool, pages=src_pages, dst_pages=pages[index], method="direct")
    peer = CudaIpcPeer(exported)
    times = []
    for run in range(2 + runs):
        torch.cuda.synchronize()
        start = time.perf_counter()
        peer.pull(plan, pool)  # returns with the pages in place (it synchronizes)
        if run >= 2:
            times.append(time.perf_counter() - start)
    peer.close()
    return times


# -- this process ---------------------------------------------------------------------------


def cma_writer(pid: int, src: torch.Tensor, remote: int) -> Callable[[], None] | None:
    libc = ctypes.CDLL(None, use_errno=True)
    call = getattr(libc, "process_vm_writev", None)
    if call is None:
        return None

    class Iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    call.restype = ctypes.c_ssize_t
    mine, theirs = Iovec(src.data_ptr(), src.numel()), Iovec(remote, src.numel())

    def run() -> None:
        if call(pid, ctypes.byref(mine), 1, ctypes.byref(theirs), 1, 0) != src.numel():
            raise OSError(ctypes.get_errno(), "process_vm_writev failed")

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--pools", default=",".join(POOLS))
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    parser.add_argument("--scale", type=int, default=1, help="divide the request lengths by N")
    parser.add_argument("--layers", type=int, default=61)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--chunk-mib", type=float, default=16.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = "cuda:0" if args.device == "cuda" else "cpu"
    kinds = [k for k in args.pools.split(",") if k]
    if "dsv4_composite" in kinds:
        try:
            import sglang  # noqa: F401
        except ImportError:
            print("dsv4_composite skipped: SGLang is not installed")
            kinds.remove("dsv4_composite")
    cases = [(k, int(t) // args.scale) for k in kinds for t in args.tokens.split(",")]

    from kvcompat.transfer import NixlEngine

    context = mp.get_context("spawn")
    here, there = context.Pipe()
    process = context.Process(target=decode, args=(there, cases, args.layers, device))
    process.start()
    rows: list[dict[str, Any]] = []
    try:
        pools = [build(kind, tokens, args.layers, device) for kind, tokens in cases]
        for seed, (pool, _) in enumerate(pools):
            fill(pool, seed)
        if not here.poll(600):
            msg = "the decode process did not start within 600 s"
            raise TimeoutError(msg)
        hello = here.recv()
        engine = NixlEngine("prefill", progress_thread=False)
        try:
            for pool, _ in pools:
                engine.register(pool)
            peer = engine.connect(hello["metadata"])
            here.send(engine.metadata())
            if not here.poll(120) or here.recv() != "connected":
                msg = "the decode process did not load our metadata"
                raise TimeoutError(msg)
            print(HEADER.format(device=args.device, scale=args.scale, layers=args.layers))
            for index, ((pool, page), (kind, tokens)) in enumerate(zip(pools, cases, strict=True)):
                rows.append(
                    measure(args, engine, peer, hello, here, index, pool, page, kind, tokens)
                )
                print_row(rows[-1])
        finally:
            engine.close()
        here.send("done")
    finally:
        process.join(timeout=60)
        if process.is_alive():
            process.terminate()
            process.join(timeout=10)
    return report(args, rows)


def measure(
    args: Any,
    engine: Any,
    peer: str,
    hello: dict[str, Any],
    conn: Any,
    index: int,
    pool: Any,
    page: int,
    kind: str,
    tokens: int,
) -> dict[str, Any]:
    from kvcompat.transfer import plan_transfer, pool_spec
    from kvcompat.transfer._layout import chunk_pieces
    from kvcompat.transfer._packed import Packer, run_of

    device = "cuda:0" if args.device == "cuda" else "cpu"
    pages = request(pool, page, tokens, 3, 1)
    spec, dst_pages = hello["specs"][index], hello["pages"][index]
    by_page = plan_transfer(pool, spec, pages=pages, dst_pages=dst_pages, method="pages")
    packed = plan_transfer(pool, spec, pages=pages, dst_pages=dst_pages, method="packed")
    auto = plan_transfer(pool, spec, pages=pages, dst_pages=dst_pages).method
    chunk = int(args.chunk_mib * 2**20)
    start = time.perf_counter()
    prepared_pages = engine.prepare(by_page, peer)
    prep_pages = time.perf_counter() - start
    start = time.perf_counter()
    prepared_packed = engine.prepare(packed, peer, staging=hello["staging"], chunk_bytes=chunk)
    prep_packed = time.perf_counter() - start
    nbytes = packed.nbytes
    flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
    into = torch.empty_like(flat)
    regions = [(p, n) for p, n, _ in packed.src_regions()]
    packer = Packer(packed, 0, regions, "bench")
    onto_itself = plan_transfer(pool, pool, pages=pages, method="packed")  # same bytes back
    unpacker = Packer(onto_itself, 1, regions, "bench")
    pieces = [p for c in chunk_pieces(packed.packing, max(nbytes, 1)) for p in c]

    def sync() -> None:
        if device != "cpu":
            torch.cuda.synchronize()

    def one_copy() -> None:
        into.copy_(flat)
        sync()

    def gather() -> None:
        for piece in pieces:
            packer.gather(piece, flat[piece.offset : piece.offset + piece.nbytes])
        sync()

    def scatter() -> None:
        unpacker.scatter_all(flat)
        sync()

    def pages_op() -> None:
        engine.transfer(prepared_pages, timeout=300.0)

    def packed_op() -> None:
        engine.transfer(prepared_packed, timeout=300.0)
        run = run_of(prepared_packed.packed.commit)
        deadline = time.monotonic() + 300.0
        while run not in engine._acks:  # bounded: the decode side acknowledges its scatter
            engine._drain()
            time.sleep(0.0002)  # as transfer() waits for it: leave the cores to the receiver
            if time.monotonic() > deadline:
                msg = "no acknowledgement from the decode side"
                raise TimeoutError(msg)

    ops: dict[str, Callable[[], None]] = {"one_copy": one_copy, "gather": gather}
    ops["scatter"] = scatter  # after gather in each round: it writes the gathered bytes back
    if device == "cpu":
        cma = cma_writer(int(hello["pid"]), flat, json.loads(hello["staging"])["ptr"])
        if cma is not None:
            ops["cma"] = cma
    ops["pages"] = pages_op
    ops["packed"] = packed_op
    warm = 2
    conn.send(("case", index, pool_spec(pool).to_json(), pages, warm + args.iters))
    times: dict[str, list[float]] = {k: [] for k in ops}
    for round_ in range(warm + args.iters):
        for key, op in ops.items():
            sync()
            begin = time.perf_counter()
            op()
            if round_ >= warm:
                times[key].append(time.perf_counter() - begin)
    if not conn.poll(300) or conn.recv() != "received":
        msg = "the decode side did not finish receiving"
        raise TimeoutError(msg)
    if device != "cpu":  # the decode process pulls through our CUDA IPC export
        from kvcompat.transfer import export_cuda_ipc

        exported = export_cuda_ipc(pool)
        conn.send(("direct", index, pool_spec(pool).to_json(), pages, exported, args.iters))
        if not conn.poll(600):
            msg = "the decode side did not finish pulling"
            raise TimeoutError(msg)
        times["direct"] = conn.recv()
    engine.release(prepared_pages)
    engine.release(prepared_packed)
    row: dict[str, Any] = {
        "pool": kind,
        "tokens": tokens,
        "layers": args.layers,
        "bytes": nbytes,
        "descriptors": len(by_page.descriptors),
        "buffers": len(by_page.pairs),
        "gathers": len(packed.packing.batches),
        "chunks": len(prepared_packed.packed.sizes),
        "auto": auto,
        "prepare_pages_s": prep_pages,
        "prepare_packed_s": prep_packed,
    }
    for key, values in times.items():
        row[f"{key}_s"] = statistics.median(values)
        row[f"{key}_best_s"] = min(values)
    return row


HEADER = (
    "{device}, two processes (NIXL), {layers} layers, request lengths / {scale}; GB/s of the "
    "request's bytes\n"
    f"{'pool':15s} {'tokens':>6s} {'MiB':>9s} {'descs':>7s} {'gat':>3s} | "
    f"{'1 copy':>7s} {'gather':>7s} {'scatter':>7s} {'cma':>7s} {'pages':>7s} {'packed':>7s} "
    f"{'direct':>7s} | "
    f"{'pg/cp':>6s} {'pk/cp':>6s} {'pk/pg':>7s}  auto"
)


def print_row(row: dict[str, Any]) -> None:
    def gbps(key: str) -> str:
        seconds = row.get(f"{key}_s")
        return f"{row['bytes'] / seconds / 1e9:7.2f}" if seconds else "      -"

    copy = row["one_copy_s"]
    print(
        f"{row['pool']:15s} {row['tokens']:>6d} {row['bytes'] / 2**20:9.1f} "
        f"{row['descriptors']:>7d} {row['gathers']:>3d} | "
        f"{gbps('one_copy')} {gbps('gather')} {gbps('scatter')} {gbps('cma')} "
        f"{gbps('pages')} {gbps('packed')} {gbps('direct')} | {copy / row['pages_s']:6.1%} "
        f"{copy / row['packed_s']:6.1%} {row['pages_s'] / row['packed_s']:6.2f}x  "
        f"{row['auto']}",
        flush=True,
    )


def report(args: Any, rows: list[dict[str, Any]]) -> int:
    machine = {
        "device": args.device,
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load_average": os.getloadavg()[0],
        "date": time.strftime("%Y-%m-%d"),
    }
    try:
        from importlib.metadata import version

        machine["nixl"] = next(
            (version(n) for n in ("nixl-cu12", "nixl-cu13", "nixl") if _has(n)), None
        )
    except Exception:  # noqa: BLE001 - informative only
        machine["nixl"] = None
    command = "python benchmarks/bench_transfer_packed.py " + " ".join(sys.argv[1:])
    print(f"(machine: {machine}; GB/s of the request's bytes, median of {args.iters})")
    if args.json:
        out = {"command": command, "machine": machine, "scale": args.scale, "rows": rows}
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


def _has(name: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(name)
    except PackageNotFoundError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
