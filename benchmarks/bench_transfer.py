"""Two-process transfer throughput vs an in-process copy of the same ranges, by descriptor size.

Usage:
    python benchmarks/bench_transfer.py                      # NIXL, CPU (DRAM), loopback
    python benchmarks/bench_transfer.py --engine mooncake
    python benchmarks/bench_transfer.py --device cuda        # NIXL VRAM -> VRAM, one GPU
    python benchmarks/bench_transfer.py --json out.json

For each page size (one descriptor per page when not coalesced) this process
holds the source MHA pool, a spawned process holds the destination, and about
``--mib`` MiB of pages move per transfer, in runs of 4 contiguous pages (so that
coalescing has something to merge). Reported: the median of ``--iters`` timed
transfers (after 3 warm-ups) of the prepared plan, coalesced and not, and the
median of the same number of in-process copies of the same ranges (torch
``copy_`` of uint8 views, one thread, measured *before* any engine exists:
NIXL's progress thread spins a core and would slow the baseline).

Targets (issue 16): CPU two-process NIXL >= 70 % of the in-process copy;
coalescing never loses. The machine may be shared: read the numbers as a
comparison made under the same load, not as a ceiling.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

import torch

from kvcompat.testing import ReferenceMHATokenToKVPool
from kvcompat.transfer import plan_transfer, pool_spec

HEADS, HEAD_DIM = 8, 128  # 4 KiB per token across K and V (bf16)
RUN = 4  # contiguous pages per run


def make_pool(page: int, pages: int, device: str) -> ReferenceMHATokenToKVPool:
    return ReferenceMHATokenToKVPool(
        size=page * pages,
        page_size=page,
        layer_num=1,
        head_num=HEADS,
        head_dim=HEAD_DIM,
        device=device,
    )


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
    import ctypes

    out = []
    for d in plan.descriptors:
        addr = d.src if side == 0 else d.dst
        out.append(
            torch.frombuffer((ctypes.c_uint8 * d.length).from_address(addr), dtype=torch.uint8)
        )
    return out


def time_copies(
    cases: dict[str, list[tuple[torch.Tensor, torch.Tensor]]], iters: int, device: str
) -> dict[str, float]:
    """Median seconds of copying every range of each case, cases alternating round by round."""

    def once(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for src, dst in pairs:
            dst.copy_(src)
        if device != "cpu":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    times: dict[str, list[float]] = {key: [] for key in cases}
    for index in range(3 + iters):
        for key, pairs in cases.items():
            elapsed = once(pairs)
            if index >= 3:
                times[key].append(elapsed)
    return {key: statistics.median(values) for key, values in times.items()}


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


# -- the destination process ----------------------------------------------------------------


def target(conn: Any, engine_kind: str, configs: list[tuple[int, int]], device: str) -> None:
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    torch.set_num_threads(1)
    from kvcompat.transfer import MooncakeEngine, NixlEngine

    pools = [make_pool(page, pages + 2 * pages // RUN + 4, device) for page, pages in configs]
    engine = NixlEngine("target") if engine_kind == "nixl" else MooncakeEngine("127.0.0.1")
    try:
        for pool in pools:
            engine.register(pool)
        conn.send({"specs": [pool_spec(p).to_json() for p in pools], "metadata": engine.metadata()})
        peer = conn.recv()
        engine.connect(peer)
        conn.recv()  # the initiator is done
    finally:
        engine.close()


# -- the initiator (this process) -----------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["nixl", "mooncake"], default="nixl")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--mib", type=float, default=8.0, help="MiB moved per transfer")
    parser.add_argument("--iters", type=int, default=12, help="timed transfers per case (>= 10)")
    parser.add_argument("--pages", default="1,4,16,64", help="tokens per page (descriptor sizes)")
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

    # 1. in-process copies of the same ranges, before any engine runs
    rows: list[dict[str, Any]] = []
    sources, locals_ = [], []
    for page, pages in configs:
        capacity = pages + 2 * pages // RUN + 4
        src_pool, local = make_pool(page, capacity, device), make_pool(page, capacity, device)
        for buf in (*src_pool.k_buffer, *src_pool.v_buffer):
            buf.view(torch.uint8).random_(0, 256)
        sources.append(src_pool)
        locals_.append(local)
        src_ids, dst_ids = page_map(pages)
        row: dict[str, Any] = {"page_tokens": page, "descriptor_bytes": page * per_token // 2}
        cases = {}
        for coalesce in (False, True):
            plan = plan_transfer(
                src_pool, local, pages={"kv": src_ids}, dst_pages={"kv": dst_ids}, coalesce=coalesce
            )
            view = cpu_views if device == "cpu" else gpu_views
            key = "coalesced" if coalesce else "per_page"
            cases[key] = list(zip(view(src_pool, plan, 0), view(local, plan, 1), strict=True))
            row[f"{key}_descriptors"] = len(plan.descriptors)
            row["bytes"] = plan.nbytes
        for key, seconds in time_copies(cases, args.iters, device).items():
            row[f"copy_{key}_s"] = seconds
        rows.append(row)

    # 2. the destination in another process; transfers of the same ranges
    from kvcompat.transfer import MooncakeEngine, NixlEngine

    context = mp.get_context("spawn")
    here, there = context.Pipe()
    process = context.Process(target=target, args=(there, args.engine, configs, device))
    process.start()
    engine: Any = None
    try:
        if not here.poll(120):
            msg = "the target process did not start within 120 s"
            raise TimeoutError(msg)
        hello = here.recv()
        engine = NixlEngine("initiator") if args.engine == "nixl" else MooncakeEngine("127.0.0.1")
        for pool in sources:
            engine.register(pool)
        peer = engine.connect(hello["metadata"])
        here.send(engine.metadata())
        for row, pool, spec, (_page, pages) in zip(
            rows, sources, hello["specs"], configs, strict=True
        ):
            src_ids, dst_ids = page_map(pages)
            prepared = {}
            for coalesce in (False, True):
                plan = plan_transfer(
                    pool, spec, pages={"kv": src_ids}, dst_pages={"kv": dst_ids}, coalesce=coalesce
                )
                prepared["coalesced" if coalesce else "per_page"] = engine.prepare(plan, peer)
            times: dict[str, list[float]] = {key: [] for key in prepared}
            for index in range(3 + args.iters):  # alternate, so that load drifts hit both alike
                for key, handle in prepared.items():
                    start = time.perf_counter()
                    engine.transfer(handle, timeout=60.0)
                    if index >= 3:
                        times[key].append(time.perf_counter() - start)
            for key, handle in prepared.items():
                engine.release(handle)
                row[f"xfer_{key}_s"] = statistics.median(times[key])
                row[f"xfer_{key}_all_ms"] = [round(t * 1e3, 3) for t in times[key]]
        here.send("done")
    finally:
        if engine is not None:
            engine.close()
        process.join(timeout=30)
        if process.is_alive():
            process.terminate()
            process.join(timeout=10)

    print(
        f"{args.engine} {args.device}: two processes, loopback, median of {args.iters} "
        f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
    )
    print(
        f"{'descriptor':>10} {'MiB':>5} {'descs':>11}  {'copy GB/s':>15}  "
        f"{'transfer GB/s':>15}  {'xfer/copy':>11}  coalescing  {'best xfer GB/s':>15}"
    )
    ok = True
    for row in rows:
        gbps = {k: row["bytes"] / row[k] / 1e9 for k in row if k.endswith("_s")}
        ratio_c = gbps["xfer_coalesced_s"] / gbps["copy_coalesced_s"]
        ratio_p = gbps["xfer_per_page_s"] / gbps["copy_per_page_s"]
        gain = row["xfer_per_page_s"] / row["xfer_coalesced_s"]
        row.update(ratio_coalesced=ratio_c, ratio_per_page=ratio_p, coalescing_gain=gain)
        ok &= ratio_c >= 0.7 and gain >= 1.0
        print(
            f"{row['descriptor_bytes']:>9}B {row['bytes'] / 2**20:5.1f} "
            f"{row['per_page_descriptors']:>5}/{row['coalesced_descriptors']:<5}  "
            f"{gbps['copy_per_page_s']:6.2f} /{gbps['copy_coalesced_s']:6.2f}  "
            f"{gbps['xfer_per_page_s']:6.2f} /{gbps['xfer_coalesced_s']:6.2f}  "
            f"{ratio_p:4.0%} /{ratio_c:4.0%}  x{gain:<9.2f}  "
            f"{row['bytes'] / min(row['xfer_per_page_all_ms']) / 1e6:6.2f} /"
            f"{row['bytes'] / min(row['xfer_coalesced_all_ms']) / 1e6:6.2f}"
        )
    print(
        "(pairs are per-page / coalesced; medians, and the best single transfer; "
        "targets: coalesced xfer/copy >= 70 %, coalescing >= x1)"
    )
    print("targets met" if ok else "targets NOT met on this run")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                {"engine": args.engine, "device": args.device, "rows": rows}, handle, indent=1
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
