"""Every layer of a step in one call: multi-layer reads and writes against a per-layer loop.

In one process on one GPU, for a pool of ``--layers`` layers (61, DeepSeek-V4's count)
and n random distinct tokens, it times, side by side:

* ``copy``: ``dst.copy_(src)`` of the same byte volume (half read, half written) - the
  device's copy bandwidth, the ceiling every figure is a share of,
* ``loop``: one ``pool.read(l, loc, out=out[l])`` (or ``write``) per layer, eager, the
  way callers move every layer today,
* ``multi``: ``pool.read_layers(None, loc, out=out)`` (``write_layers``), eager: one
  Triton launch for every layer,
* ``multi validated``: the same with ``validate=True`` (one host sync for all layers),
* ``multi graph``: the multi-layer call captured in a CUDA graph (GPU time).

Eager figures are wall time per call (host cost included: ``torch.cuda.synchronize``
after ``--iters`` calls); ``graph`` figures are GPU time from CUDA events around graph
replays. Bytes counted: each token's pool row (and written scale bytes) plus its dense
values, per layer - the same accounting as ``bench_kernels_gpu.py``. Writes JSON (GPU,
driver, torch, triton, every figure) with ``--json``::

    python benchmarks/bench_layers_gpu.py [--layers 61] [--sizes 2048 65536]
        [--json docs/_data/layers-gpu.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

import torch

import kvcompat
from kvcompat.testing import (
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
)


def _pool(kind: str, layers: int, tokens: int) -> Any:
    if kind == "v4":
        native = ReferenceDeepSeekV4SingleKVPool(
            size=tokens, page_size=64, layer_num=layers, device="cuda"
        )
    else:
        native = ReferenceMHATokenToKVPool(
            tokens, 64, torch.bfloat16, head_num=8, head_dim=128, layer_num=layers, device="cuda"
        )
    return kvcompat.adapt(native)


def _wall(fn: Callable[[], object], iters: int) -> float:
    """Seconds per call, wall time, after a warm-up."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    best = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        best.append((time.perf_counter() - start) / iters)
    return statistics.median(best)


def _graph(fn: Callable[[], object], reps: int) -> float:
    """Seconds per call of ``fn`` captured in a CUDA graph (GPU time, median replay)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    times = []
    for _ in range(reps):
        flush.zero_()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(begin.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _copy(nbytes: int, reps: int) -> float:
    half = nbytes // 2
    src = torch.empty(half, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return _graph(lambda: dst.copy_(src), reps)


def _row_bytes(pool: Any, layer: int) -> int:
    """Pool bytes a read of one token of one layer touches, plus its dense values."""
    spec = pool.layout(layer)
    parts = [spec.key] + ([spec.value] if spec.value is not None else [])
    return sum(p.data_bytes + p.scale_bytes + p.dim * p.output_dtype.itemsize for p in parts)


def bench(kind: str, layers: int, n: int, iters: int, reps: int) -> list[dict[str, Any]]:
    pool = _pool(kind, layers, max(2 * n, 1 << 16))
    ids = pool.layer_ids
    g = torch.Generator().manual_seed(0)
    loc = torch.randperm(pool.size, generator=g)[:n].to("cuda")
    spec = pool.layout(ids[0]).key
    heads = spec.heads
    out = torch.empty(layers, n, heads, spec.dim // heads, dtype=spec.output_dtype, device="cuda")
    vout = torch.empty_like(out) if pool.layout(ids[0]).value is not None else None
    keys = torch.randn(layers, n, heads, spec.dim // heads, device="cuda").to(torch.bfloat16)
    values = keys.clone() if vout is not None else None
    nbytes = layers * n * _row_bytes(pool, ids[0])
    copy = _copy(nbytes, reps)
    rows: list[dict[str, Any]] = []

    def loop_read() -> None:
        for i, layer in enumerate(ids):
            pool.read(layer, loc, out=out[i], wait=False, validate=False, impl="triton")

    def loop_write() -> None:
        for i, layer in enumerate(ids):
            value = None if values is None else values[i]
            pool.write(layer, loc, keys[i], value, validate=False, check_finite=False,
                       impl="triton")  # fmt: skip

    step = pool.plan()

    def multi_read() -> None:
        step.read(loc, out=out, wait=False, validate=False, impl="triton")

    def multi_read_checked() -> None:
        step.read(loc, out=out, wait=False, validate=True, impl="triton")

    def multi_write() -> None:
        step.write(loc, keys, values, validate=False, check_finite=False, impl="triton")

    def multi_write_checked() -> None:
        step.write(loc, keys, values, validate=True, check_finite=True, impl="triton")

    # Byte-equality first: the figures are only worth printing for the same bytes.
    loop_read()
    expect = out.clone()
    out.zero_()
    multi_read()
    assert torch.equal(expect.view(torch.uint8), out.view(torch.uint8)), "multi != loop"

    for op, timings in (
        ("read", {"loop": (loop_read, "wall"), "multi": (multi_read, "wall"),
                  "multi validated": (multi_read_checked, "wall"),
                  "multi graph": (multi_read, "graph"), "loop graph": (loop_read, "graph")}),
        ("write", {"loop": (loop_write, "wall"), "multi": (multi_write, "wall"),
                   "multi validated": (multi_write_checked, "wall"),
                   "multi graph": (multi_write, "graph")}),
    ):  # fmt: skip
        for name, (fn, how) in timings.items():
            seconds = _wall(fn, iters) if how == "wall" else _graph(fn, reps)
            rows.append({
                "pool": kind, "layers": layers, "tokens": n, "op": op, "impl": name,
                "time": how, "us": seconds * 1e6, "GBps": nbytes / seconds / 1e9,
                "share_of_copy": copy / seconds,
            })  # fmt: skip
    rows.append({"pool": kind, "layers": layers, "tokens": n, "op": "copy", "impl": "copy",
                 "time": "graph", "us": copy * 1e6, "GBps": nbytes / copy / 1e9,
                 "share_of_copy": 1.0})  # fmt: skip
    return rows


def _machine() -> dict[str, Any]:
    import triton

    try:
        driver = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, check=False, timeout=20,
        ).stdout.strip()  # fmt: skip
    except OSError:
        driver = "unknown"
    return {
        "gpu": torch.cuda.get_device_name(),
        "driver": driver,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=61)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2048, 65536])
    parser.add_argument("--pools", nargs="+", default=["v4", "mha"])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    machine = _machine()
    print(f"# {machine}")
    rows: list[dict[str, Any]] = []
    for kind in args.pools:
        for n in args.sizes:
            found = bench(kind, args.layers, n, args.iters, args.reps)
            rows.extend(found)
            for row in found:
                print(
                    f"{row['pool']:4} {row['layers']:3}x{row['tokens']:<7} {row['op']:5} "
                    f"{row['impl']:16} {row['time']:5} {row['us']:10.1f} us "
                    f"{row['GBps']:8.1f} GB/s {100 * row['share_of_copy']:6.1f} % of copy"
                )
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"machine": machine, "command": "python benchmarks/bench_layers_gpu.py",
                       "rows": rows}, handle, indent=1)  # fmt: skip
            handle.write("\n")


if __name__ == "__main__":
    main()
