"""Two-process transfer throughput vs an in-process copy of the same ranges, by descriptor size.

Usage:
    python benchmarks/bench_transfer.py                      # NIXL, CPU (DRAM), loopback
    python benchmarks/bench_transfer.py --engine mooncake
    python benchmarks/bench_transfer.py --device cuda        # NIXL VRAM -> VRAM, one GPU
    python benchmarks/bench_transfer.py --json out.json

For each page size (one descriptor per page when not coalesced) this process
holds the source MHA pool, a spawned process holds the destination, and about
``--mib`` MiB of pages move per transfer, in runs of 4 contiguous pages (so that
coalescing has something to merge). Every figure is the median of ``--iters``
timed operations after 3 warm-ups; the operations of one round (per-page and
coalesced, each way of moving) alternate, so that load drifts hit them alike.
Side by side, on the very same ranges:

* ``copy``: torch ``copy_`` of uint8 views of the same ranges into a second pool
  of this process, one thread, measured **before any engine exists** (the
  target's baseline) and again interleaved with the transfers (``copy*``: the
  same load as the transfers, progress threads included);
* ``one copy`` (GPU): one ``copy_`` of the same number of bytes, contiguous;
* ``cma`` (CPU): the kernel's ``process_vm_writev`` of the same ranges straight
  into the target process — what UCX's ``cma`` transport calls per descriptor,
  without NIXL or kvcompat (the floor of any cma transfer);
* ``nixl``: NIXL itself on the handles kvcompat prepared (post, then a busy poll
  of ``check_xfer_state``), without kvcompat's Python around it;
* ``kvcompat``: ``engine.transfer(prepared)``, what a user runs.

``--initiator-thread off,on`` measures the initiating NIXL agent without and with
its progress thread (the target always keeps its own: it is passive).

Targets (issue 16): CPU two-process transfer >= 70 % of the in-process copy;
GPU >= 80 % of a device-to-device copy of the same bytes (requests >= 4 MiB);
coalescing never loses. The machine may be shared: read the numbers as a
comparison made under the same load, not as a ceiling.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from kvcompat.testing import ReferenceMHATokenToKVPool
from kvcompat.transfer import plan_transfer, pool_spec

# Loopback only. UCX's InfiniBand modules are not needed there, and the libnl-route that
# NIXL 1.5.1 bundles for them crashes (SIGSEGV in rtnl_tc_unregister) when a process that
# loaded them exits. Set before NIXL loads; the spawned target inherits both.
os.environ.setdefault("UCX_NET_DEVICES", "lo")
os.environ.setdefault("UCX_MODULES", "^ib")

HEADS, HEAD_DIM = 8, 128  # 4 KiB per token across K and V (bf16)
RUN = 4  # contiguous pages per run
KEYS = ("per_page", "coalesced")


def make_pool(page: int, pages: int, device: str) -> ReferenceMHATokenToKVPool:
    return ReferenceMHATokenToKVPool(
        size=page * pages,
        page_size=page,
        layer_num=1,
        head_num=HEADS,
        head_dim=HEAD_DIM,
        device=device,
    )


def capacity(pages: int) -> int:
    return pages + 2 * pages // RUN + 4


def page_map(pages_needed: int) -> tuple[list[int], list[int]]:
    """Runs of RUN pages, a gap of one page between runs; the destination shifted by one."""
    src = []
    page = 1
    while len(src) < pages_needed:
        src.extend(range(page, page + RUN))
        page += RUN + 1
    src = src[:pages_needed]
    return src, [p + 1 for p in src]


def cpu_views(_pool: Any, plan: Any, side: int) -> list[torch.Tensor]:
    """uint8 tensors over each descriptor's range on one side (host memory of this process)."""
    out = []
    for d in plan.descriptors:
        addr = d.src if side == 0 else d.dst
        out.append(
            torch.frombuffer((ctypes.c_uint8 * d.length).from_address(addr), dtype=torch.uint8)
        )
    return out


def gpu_views(pool: Any, plan: Any, side: int) -> list[torch.Tensor]:
    """Views into a CUDA pool's storage for the plan's descriptors (addresses -> offsets)."""
    flat = {}
    for tensor in (*pool.k_buffer, *pool.v_buffer):
        storage = tensor.untyped_storage()
        whole = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage)
        flat[int(storage.data_ptr())] = whole
    out = []
    for d in plan.descriptors:
        addr = d.src if side == 0 else d.dst
        base = max(p for p in flat if p <= addr)
        out.append(flat[base][addr - base : addr - base + d.length])
    return out


def copier(pairs: list[tuple[torch.Tensor, torch.Tensor]], device: str) -> Callable[[], None]:
    def run() -> None:
        for src, dst in pairs:
            dst.copy_(src)
        if device != "cpu":
            torch.cuda.synchronize()

    return run


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def cma_writer(pid: int, plan: Any) -> Callable[[], None] | None:
    """``process_vm_writev`` of the plan's ranges into process ``pid`` (Linux), or None."""
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "process_vm_writev"):
        return None
    call = libc.process_vm_writev
    call.restype = ctypes.c_ssize_t
    call.argtypes = [
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_ulong,
        ctypes.c_void_p,
        ctypes.c_ulong,
        ctypes.c_ulong,
    ]
    count = len(plan.descriptors)
    local = (_Iovec * count)(*[_Iovec(d.src, d.length) for d in plan.descriptors])
    remote = (_Iovec * count)(*[_Iovec(d.dst, d.length) for d in plan.descriptors])
    size = ctypes.sizeof(_Iovec)
    batches = []
    for start in range(0, count, 1024):  # IOV_MAX
        n = min(1024, count - start)
        want = sum(d.length for d in plan.descriptors[start : start + n])
        batches.append(
            (ctypes.byref(local, start * size), ctypes.byref(remote, start * size), n, want)
        )

    def run() -> None:
        for mine, theirs, n, want in batches:
            got = call(pid, mine, n, theirs, n, 0)
            if got != want:
                err = ctypes.get_errno()
                msg = f"process_vm_writev moved {got} of {want} bytes: {os.strerror(err)}"
                raise OSError(err, msg)

    return run


def nixl_raw(engine: Any, prepared: Any) -> Callable[[], None]:
    """NIXL on kvcompat's prepared handle: post, then busy-poll (bounded), nothing else."""
    agent, handle = engine._agent, prepared.handles[0]

    def run() -> None:
        state = agent.transfer(handle)
        deadline = time.monotonic() + 60.0
        while state == "PROC":
            if time.monotonic() > deadline:
                msg = "raw NIXL transfer did not complete within 60 s"
                raise TimeoutError(msg)
            state = agent.check_xfer_state(handle)
        if state != "DONE":
            msg = f"raw NIXL transfer ended in {state}"
            raise RuntimeError(msg)

    return run


def kvcompat_run(engine: Any, prepared: Any) -> Callable[[], None]:
    def run() -> None:
        engine.transfer(prepared, timeout=60.0)

    return run


def rounds(ops: dict[str, Callable[[], None]], iters: int, device: str) -> dict[str, list[float]]:
    """Seconds of each op, ``3 + iters`` rounds, ops alternating within a round.

    Keys ``"<op>"`` hold wall-clock seconds; on the CPU, keys ``"<op>@cpu"`` hold
    this thread's CPU seconds as well (every CPU op here copies in the calling
    thread: ``copy_``, the ``process_vm_writev`` syscall, and NIXL's UCX ``cma``
    put, which runs inside the post), which a loaded machine barely disturbs.
    """
    times: dict[str, list[float]] = {key: [] for key in ops}
    if device == "cpu":
        times.update({f"{key}@cpu": [] for key in ops})
    for index in range(3 + iters):
        for key, op in ops.items():
            if device != "cpu":
                torch.cuda.synchronize()
            start, on_cpu = time.perf_counter(), time.thread_time()
            op()
            elapsed, used = time.perf_counter() - start, time.thread_time() - on_cpu
            if index >= 3:
                times[key].append(elapsed)
                if device == "cpu":
                    times[f"{key}@cpu"].append(used)
    return times


# -- the destination process ----------------------------------------------------------------


def target(conn: Any, engine_kind: str, configs: list[tuple[int, int]], device: str) -> None:
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    torch.set_num_threads(1)
    from kvcompat.transfer import MooncakeEngine, NixlEngine

    pools = [make_pool(page, capacity(pages), device) for page, pages in configs]
    engine = NixlEngine("target") if engine_kind == "nixl" else MooncakeEngine("127.0.0.1")
    try:
        for pool in pools:
            engine.register(pool)
        conn.send(
            {
                "specs": [pool_spec(p).to_json() for p in pools],
                "metadata": engine.metadata(),
                "pid": os.getpid(),
            }
        )
        while True:  # one metadata per initiator, then "done"
            message = conn.recv()
            if message == "done":
                break
            engine.connect(message)
            conn.send("connected")
    finally:
        engine.close()


# -- the initiator (this process) -----------------------------------------------------------


def _median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["nixl", "mooncake"], default="nixl")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--mib", type=float, default=8.0, help="MiB moved per transfer")
    parser.add_argument("--iters", type=int, default=12, help="timed transfers per case (>= 10)")
    parser.add_argument("--pages", default="1,4,16,64", help="tokens per page (descriptor sizes)")
    parser.add_argument(
        "--initiator-thread",
        default="off,on",
        help="NIXL: the initiating agent's progress thread, one run per value (off,on)",
    )
    parser.add_argument(
        "--ucx-params",
        default="",
        help="NIXL: the initiator's UCX backend parameters, e.g. num_threads=4",
    )
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    torch.set_num_threads(1)
    device = "cuda:0" if args.device == "cuda" else "cpu"
    per_token = 2 * HEADS * HEAD_DIM * 2  # K and V, bf16
    configs = []
    for page in (int(p) for p in args.pages.split(",")):
        pages = max(RUN, int(args.mib * 2**20 / (page * per_token)))
        configs.append((page, pages))
    threads = [v.strip() == "on" for v in args.initiator_thread.split(",")]
    if args.engine != "nixl":
        threads = [True]
    view = cpu_views if device == "cpu" else gpu_views

    # 1. in-process copies of the same ranges, before any engine runs
    rows: list[dict[str, Any]] = []
    sources, copies = [], []
    for page, pages in configs:
        src_pool, local = (
            make_pool(page, capacity(pages), device),
            make_pool(page, capacity(pages), device),
        )
        for buf in (*src_pool.k_buffer, *src_pool.v_buffer):
            buf.view(torch.uint8).random_(0, 256)
        sources.append(src_pool)
        src_ids, dst_ids = page_map(pages)
        row: dict[str, Any] = {"page_tokens": page, "descriptor_bytes": page * per_token // 2}
        ops: dict[str, Callable[[], None]] = {}
        for coalesce, key in zip((False, True), KEYS, strict=True):
            plan = plan_transfer(
                src_pool,
                local,
                pages={"kv": src_ids},
                dst_pages={"kv": dst_ids},
                coalesce=coalesce,
                method="pages",  # this benchmark measures the engine on descriptors
            )
            pairs = list(zip(view(src_pool, plan, 0), view(local, plan, 1), strict=True))
            ops[f"copy_{key}"] = copier(pairs, device)
            row[f"{key}_descriptors"] = len(plan.descriptors)
            row["bytes"] = plan.nbytes
        if device != "cpu":
            flat = torch.empty(row["bytes"], dtype=torch.uint8, device=device).random_(0, 256)
            into = torch.empty_like(flat)
            ops["one_copy"] = copier([(flat, into)], device)
        copies.append((local, ops))
        for key, values in rounds(ops, args.iters, device).items():
            row[f"{key}_s"] = _median(values)
        rows.append(row)

    # 2. the destination in another process; transfers of the same ranges
    from kvcompat.transfer import MooncakeEngine, NixlEngine

    context = mp.get_context("spawn")
    here, there = context.Pipe()
    process = context.Process(target=target, args=(there, args.engine, configs, device))
    process.start()
    try:
        if not here.poll(120):
            msg = "the target process did not start within 120 s"
            raise TimeoutError(msg)
        hello = here.recv()
        for thread in threads:
            variant = "thread" if thread else "nothread"
            if args.engine == "nixl":
                params = dict(p.split("=", 1) for p in args.ucx_params.split(",") if p)
                engine: Any = NixlEngine(
                    f"initiator-{variant}",
                    progress_thread=thread,
                    backend_params={"UCX": params},
                )
            else:
                engine = MooncakeEngine("127.0.0.1")
            try:
                for pool in sources:
                    engine.register(pool)
                peer = engine.connect(hello["metadata"])
                here.send(engine.metadata())
                if not here.poll(60) or here.recv() != "connected":
                    msg = "the target did not load this initiator's metadata"
                    raise TimeoutError(msg)
                for row, pool, spec, (_page, pages), (_local, copy_ops) in zip(
                    rows, sources, hello["specs"], configs, copies, strict=True
                ):
                    src_ids, dst_ids = page_map(pages)
                    ops = {}
                    prepared = []
                    for coalesce, key in zip((False, True), KEYS, strict=True):
                        plan = plan_transfer(
                            pool,
                            spec,
                            pages={"kv": src_ids},
                            dst_pages={"kv": dst_ids},
                            coalesce=coalesce,
                            method="pages",
                        )
                        handle = engine.prepare(plan, peer)
                        prepared.append(handle)
                        ops[f"kvcompat_{key}"] = kvcompat_run(engine, handle)
                        if args.engine == "nixl":
                            ops[f"nixl_{key}"] = nixl_raw(engine, handle)
                        if device == "cpu":
                            cma = cma_writer(int(hello["pid"]), plan)
                            if cma is not None:
                                ops[f"cma_{key}"] = cma
                        ops[f"copy*_{key}"] = copy_ops[f"copy_{key}"]
                    if "one_copy" in copy_ops:
                        ops["one_copy*"] = copy_ops["one_copy"]
                    for key, values in rounds(ops, args.iters, device).items():
                        row[f"{variant}:{key}_s"] = _median(values)
                        row[f"{variant}:{key}_best_s"] = min(values)
                    for handle in prepared:
                        engine.release(handle)
            finally:
                engine.close()
        here.send("done")
    finally:
        process.join(timeout=30)
        if process.is_alive():
            process.terminate()
            process.join(timeout=10)

    return report(args, rows, threads, device)


def report(args: Any, rows: list[dict[str, Any]], threads: list[bool], device: str) -> int:
    print(
        f"{args.engine} {args.device}: two processes, loopback, median of {args.iters} "
        f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
        + (f", UCX {args.ucx_params}" if args.ucx_params else "")
        + "; GB/s per-page / "
        "coalesced; * = measured interleaved with the transfers"
    )
    ways = ["copy", "copy*"]
    if device == "cpu":
        ways.append("cma")
    if args.engine == "nixl":
        ways.append("nixl")
    ways.append("kvcompat")
    ok = True
    for thread in threads:
        variant = "thread" if thread else "nothread"
        if args.engine == "nixl":
            print(f"-- initiator progress thread {'on' if thread else 'off'}")
        head = f"{'descriptor':>10} {'MiB':>5} {'descs':>10}"
        for way in ways:
            head += f" {way:>13}"
        if device != "cpu":
            head += f" {'one copy':>8}"
        head += f" {'kvc/copy':>11}"
        if device == "cpu":
            head += f" {'cpu-time':>9}"
        else:
            head += f" {'kvc/one':>7}"
        head += f" {'kvc/nixl':>11} {'coalesce':>8} {'best kvc':>13}"
        print(head)
        for row in rows:

            def gbps(key: str, row: dict[str, Any] = row) -> float:
                seconds = row.get(key)
                return row["bytes"] / seconds / 1e9 if seconds else float("nan")

            def both(way: str, variant: str = variant) -> tuple[float, float]:
                prefix = "" if way == "copy" else f"{variant}:"
                return (gbps(f"{prefix}{way}_per_page_s"), gbps(f"{prefix}{way}_coalesced_s"))

            line = (
                f"{row['descriptor_bytes']:>9}B {row['bytes'] / 2**20:5.1f} "
                f"{row['per_page_descriptors']:>4}/{row['coalesced_descriptors']:<5}"
            )
            for way in ways:
                p, c = both(way)
                line += f" {p:6.2f}/{c:6.2f}"
            if device != "cpu":
                line += f" {gbps('one_copy_s'):8.1f}"
            kvc, copy, nixl = both("kvcompat"), both("copy"), both("nixl")
            ratio = (kvc[0] / copy[0], kvc[1] / copy[1])
            one = kvc[1] / gbps("one_copy_s") if device != "cpu" else float("nan")
            binding = (kvc[0] / nixl[0], kvc[1] / nixl[1])
            gain = kvc[1] / kvc[0]
            best = (
                gbps(f"{variant}:kvcompat_per_page_best_s"),
                gbps(f"{variant}:kvcompat_coalesced_best_s"),
            )
            line += f" {ratio[0]:4.0%}/{ratio[1]:<5.0%}"
            if device == "cpu":
                on_cpu = row["copy_coalesced@cpu_s"] / row[f"{variant}:kvcompat_coalesced@cpu_s"]
                cma_cpu = row["copy_coalesced@cpu_s"] / row.get(
                    f"{variant}:cma_coalesced@cpu_s", float("nan")
                )
                line += f" {on_cpu:4.0%}/{cma_cpu:<4.0%}"
                row[f"{variant}:ratio_coalesced_cpu_time"] = on_cpu
                row[f"{variant}:cma_ratio_coalesced_cpu_time"] = cma_cpu
            else:
                line += f" {one:7.0%}"
            line += (
                f" {binding[0]:4.0%}/{binding[1]:<5.0%} x{gain:<7.2f} {best[0]:6.2f}/{best[1]:6.2f}"
            )
            row.update(
                {
                    f"{variant}:ratio_coalesced": ratio[1],
                    f"{variant}:ratio_per_page": ratio[0],
                    f"{variant}:ratio_one_copy": one,
                    f"{variant}:binding_coalesced": binding[1],
                    f"{variant}:coalescing_gain": gain,
                }
            )
            ok &= ratio[1] >= (0.7 if device == "cpu" else 0.8) and gain >= 0.95
            print(line)
    print(
        "(kvc/copy: kvcompat vs the quiet copy of the same ranges (the targets)"
        + (
            "; cpu-time: coalesced copy's CPU time / kvcompat's, / raw cma's"
            if device == "cpu"
            else ""
        )
        + ("" if device == "cpu" else "; kvc/one: coalesced vs one contiguous copy of the bytes")
        + "; kvc/nixl: kvcompat's binding vs NIXL on the same handles)"
    )
    print(
        "targets met" if ok else "targets NOT met on this run",
        "(coalesced >= 70 % of the copy on CPU, >= 80 % on GPU; coalescing counts as a loss "
        "below x0.95: NIXL merges contiguous descriptors itself, so both are one request "
        "and differ by noise)",
    )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                {"engine": args.engine, "device": args.device, "rows": rows}, handle, indent=1
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
