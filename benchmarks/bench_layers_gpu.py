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
from kvcompat import _ops
from kvcompat.layouts import DSV4_INDEXER_FP8, V4
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


def _row_bytes(pool: Any, layer: int, *, write: bool) -> int:
    """Pool bytes one token of one layer moves, plus its dense values (a read: keys only)."""
    spec = pool.layout(layer)
    parts = [spec.key] + ([spec.value] if write and spec.value is not None else [])
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
    volume = {op: layers * n * _row_bytes(pool, ids[0], write=op == "write")
              for op in ("read", "write")}  # fmt: skip
    copies = {op: _copy(nbytes, reps) for op, nbytes in volume.items()}
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
        nbytes, copy = volume[op], copies[op]
        for name, (fn, how) in timings.items():
            seconds = _wall(fn, iters) if how == "wall" else _graph(fn, reps)
            rows.append({
                "pool": kind, "layers": layers, "tokens": n, "op": op, "impl": name,
                "time": how, "us": seconds * 1e6, "GBps": nbytes / seconds / 1e9,
                "share_of_copy": copy / seconds,
            })  # fmt: skip
        rows.append({"pool": kind, "layers": layers, "tokens": n, "op": op, "impl": "copy",
                     "time": "graph", "us": copy * 1e6, "GBps": nbytes / copy / 1e9,
                     "share_of_copy": 1.0})  # fmt: skip
    return rows


def bench_strided(layers: int, n: int, reps: int) -> list[dict[str, Any]]:
    """V4 pages of every layer in one block-outer storage (strided views) vs contiguous ones.

    The strided buffers are what a layer's view of a storage shared block by block looks
    like (vLLM's block-outer layouts): page ``p`` of layer ``l`` at ``(p * layers + l) *
    page_bytes``. Both sides move the same tokens with one multi-layer launch (GPU time).
    """
    from kvcompat._ops import plan_layers, read_layers, write_layers
    from kvcompat.layouts import V4

    page, pages = 64, max(2 * n // 64, 1024)
    width = V4.page_bytes(page)
    storage = torch.randint(0, 120, (pages, layers, width), dtype=torch.uint8, device="cuda")
    strided = [storage[:, layer] for layer in range(layers)]
    contiguous = [view.contiguous() for view in strided]
    g = torch.Generator().manual_seed(3)
    loc = torch.randperm(pages * page, generator=g)[:n].to("cuda")
    out = torch.empty(layers, n, 512, dtype=torch.bfloat16, device="cuda")
    values = torch.randn(layers, n, 512, device="cuda").to(torch.bfloat16)
    rows: list[dict[str, Any]] = []
    for name, bufs in (("contiguous", contiguous), ("strided", strided)):
        plan = plan_layers(V4, bufs, page)
        seconds_read = _graph(
            lambda p=plan: read_layers(p, loc, out=out, validate=False, impl="triton"), reps
        )
        seconds_write = _graph(
            lambda p=plan: write_layers(p, loc, values, validate=False, check_finite=False,
                                        impl="triton"), reps,
        )  # fmt: skip
        for op, seconds in (("read", seconds_read), ("write", seconds_write)):
            rows.append({"pool": "v4", "layers": layers, "tokens": n, "op": op,
                         "impl": f"multi graph, {name}", "time": "graph", "us": seconds * 1e6,
                         "GBps": layers * n * (584 + 1024) / seconds / 1e9,
                         "share_of_copy": float("nan")})  # fmt: skip
    by = {(r["op"], r["impl"].split(", ")[1]): r["us"] for r in rows}
    for row in rows:
        if row["impl"].endswith("strided"):
            row["strided_vs_contiguous"] = by[(row["op"], "contiguous")] / row["us"]
    return rows


def _single_calls(pool: Any, layer: int, loc: torch.Tensor) -> dict[str, Callable[[], object]]:
    """The one-layer calls of ``bench_single`` on ``pool``'s ``layer`` (and torch's own)."""
    spec = pool.layout(layer).key
    n = int(loc.numel())
    out = torch.empty(n, spec.heads, spec.dim // spec.heads, dtype=spec.output_dtype,
                      device="cuda")  # fmt: skip
    calls: dict[str, Callable[[], object]] = {
        "read": lambda: pool.read(layer, loc, out=out, wait=False),
        "read, validate=False": lambda: pool.read(layer, loc, out=out, wait=False,
                                                  validate=False),
    }  # fmt: skip
    if pool.layout(layer).value is None:
        return calls
    k_buf, v_buf = pool.get_key_buffer(layer), pool.get_value_buffer(layer)
    keys = torch.randn_like(out)
    calls["torch k_buffer[loc]"] = lambda: torch.index_select(k_buf, 0, loc, out=out)
    calls["write, validate=False"] = lambda: pool.write(
        layer, loc, keys, keys, validate=False, check_finite=False
    )
    calls["write"] = lambda: pool.write(layer, loc, keys, keys)
    calls["torch index_copy_ (k and v)"] = lambda: (
        k_buf.index_copy_(0, loc, keys),
        v_buf.index_copy_(0, loc, keys),
    )
    return calls


def bench_single(iters: int) -> list[dict[str, Any]]:
    """One-layer eager calls (wall time, host cost included) against torch's own indexing.

    V4 read of 4,096 tokens (validated and ``validate=False``), and MHA read / write of
    4,096 tokens against ``k_buffer[loc]`` (``index_select``) and ``index_copy_`` of the
    same rows; the per-call host cost is the time of an 8-token call.
    """
    rows: list[dict[str, Any]] = []
    g = torch.Generator().manual_seed(1)
    for kind in ("v4", "mha"):
        pool = _pool(kind, 2, 1 << 16)
        layer = pool.layer_ids[0]
        per_token = _row_bytes(pool, layer, write=False)
        for n in (8, 4096):
            loc = torch.randperm(pool.size, generator=g)[:n].to("cuda")
            for name, fn in _single_calls(pool, layer, loc).items():
                seconds = _wall(fn, iters)
                moved = n * per_token * (2 if "write" in name or "k and v" in name else 1)
                rows.append({"pool": kind, "layers": 1, "tokens": n, "op": name.split(",")[0],
                             "impl": name, "time": "wall", "us": seconds * 1e6,
                             "GBps": moved / seconds / 1e9})  # fmt: skip
    return rows


def bench_sweep(layers: int, n: int, reps: int) -> list[dict[str, Any]]:
    """Launch settings of the V4 read and write kernels, one layer per launch and all layers.

    For each (tokens per program, warps), the multi-layer call and the
    per-layer loop, both captured in a CUDA graph (GPU time), as shares of a copy of the
    same bytes: whether the layered launch wants other settings than a one-layer one.
    """
    from kvcompat.kernels._config import OVERRIDES, LaunchSettings

    pool = _pool("v4", layers, max(2 * n, 1 << 16))
    ids = pool.layer_ids
    g = torch.Generator().manual_seed(0)
    loc = torch.randperm(pool.size, generator=g)[:n].to("cuda")
    out = torch.empty(layers, n, 1, 512, dtype=torch.bfloat16, device="cuda")
    keys = torch.randn(layers, n, 1, 512, device="cuda").to(torch.bfloat16)
    step = pool.plan()

    def loop_read() -> None:
        for i, layer in enumerate(ids):
            pool.read(layer, loc, out=out[i], wait=False, validate=False, impl="triton")

    def loop_write() -> None:
        for i, layer in enumerate(ids):
            pool.write(layer, loc, keys[i], validate=False, check_finite=False, impl="triton")

    calls: dict[tuple[str, str], Callable[[], object]] = {
        ("read", "multi"): lambda: step.read(loc, out=out, wait=False, validate=False,
                                             impl="triton"),
        ("read", "loop"): loop_read,
        ("write", "multi"): lambda: step.write(loc, keys, validate=False, check_finite=False,
                                               impl="triton"),
        ("write", "loop"): loop_write,
    }  # fmt: skip
    rows: list[dict[str, Any]] = []
    for op, family in (("read", "read_fp8"), ("write", "write_fp8")):
        copy = _copy(layers * n * _row_bytes(pool, ids[0], write=op == "write"), reps)
        for block in (1, 2, 4, 8):
            for warps in (1, 2, 4):
                for evict in (False,):
                    OVERRIDES[family] = LaunchSettings(block, warps, evict)  # type: ignore[index]
                    for how in ("multi", "loop"):
                        seconds = _graph(calls[(op, how)], reps)
                        rows.append({"pool": "v4", "layers": layers, "tokens": n, "op": op,
                                     "impl": how, "block_tokens": block, "num_warps": warps,
                                     "evict_first": evict, "us": seconds * 1e6,
                                     "share_of_copy": copy / seconds})  # fmt: skip
                    OVERRIDES.clear()
    return rows


def bench_components(layers: int, n: int, iters: int, reps: int) -> list[dict[str, Any]]:
    """A DeepSeek-V4 pool's four components over all their layers: one call vs one per part.

    The shapes of SGLang's ``DeepSeekV4TokenToKVPool`` without SGLang (the device has
    none): V4 sliding-window pages of 256 tokens on every layer, c4 pages of 64 states
    and c128 pages of 2 on alternating layers, fp8 indexer pages of 64 on the c4 layers.
    A step of ``n`` tokens reads ``n`` sliding-window tokens, ``n / 4`` c4 states and
    indexer keys and ``n / 128`` c128 states (at least one each). ``parts`` is one
    multi-layer read per component (four launches), ``components`` the components plan's
    call (one launch for the three V4 parts, one for the indexer).
    """

    c4_layers, c128_layers = (layers + 1) // 2, layers // 2
    shape = {  # name: (spec, layers, page size, locations read)
        "swa": (V4, layers, 256, n), "c4": (V4, c4_layers, 64, max(n // 4, 1)),
        "c128": (V4, c128_layers, 2, max(n // 128, 1)),
        "c4_indexer": (DSV4_INDEXER_FP8, c4_layers, 64, max(n // 4, 1)),
    }  # fmt: skip
    g = torch.Generator().manual_seed(3)
    bufs, locs = {}, {}
    for name, (spec, count, page, k) in shape.items():
        pages = -(-2 * k // page) + 1
        bufs[name] = [
            torch.randint(0, 256, (pages, spec.page_bytes(page)), generator=g, dtype=torch.uint8)
            .to("cuda") for _ in range(count)
        ]  # fmt: skip
        locs[name] = torch.randperm(pages * page, generator=g)[:k].to("cuda")
    v4 = _ops.plan_spaces(V4, [(bufs[p], shape[p][2]) for p in ("swa", "c4", "c128")])
    indexer = _ops.plan_layers(DSV4_INDEXER_FP8, bufs["c4_indexer"], 64)
    parts = {p: _ops.plan_layers(V4, bufs[p], shape[p][2]) for p in ("swa", "c4", "c128")}
    parts["c4_indexer"] = indexer
    v4_locs = [locs[p] for p in ("swa", "c4", "c128")]

    def one_call() -> None:
        _ops.read_spaces(v4, v4_locs, validate=False, impl="triton")
        _ops.read_layers(indexer, locs["c4_indexer"], validate=False, impl="triton")

    def per_part() -> None:
        for name, plan in parts.items():
            _ops.read_layers(plan, locs[name], validate=False, impl="triton")

    together = _ops.read_spaces(v4, v4_locs, impl="triton")
    for space, name in enumerate(("swa", "c4", "c128")):
        alone = _ops.read_layers(parts[name], locs[name], impl="triton")
        assert torch.equal(together[space].view(torch.uint8), alone.view(torch.uint8)), name
    nbytes = sum(
        count * k * (spec.data_bytes + spec.scale_bytes + spec.dim * spec.output_dtype.itemsize)
        for spec, count, _, k in shape.values()
    )
    copy = _copy(nbytes, reps)
    rows = []
    for name, fn, how in (("components", one_call, "wall"), ("parts", per_part, "wall"),
                          ("components", one_call, "graph"), ("copy", None, "graph")):  # fmt: skip
        seconds = copy if fn is None else _wall(fn, iters) if how == "wall" else _graph(fn, reps)
        rows.append({
            "pool": "dsv4 composite", "layers": layers, "tokens": n, "op": "read",
            "impl": name, "time": how, "us": seconds * 1e6, "GBps": nbytes / seconds / 1e9,
            "share_of_copy": copy / seconds,
        })  # fmt: skip
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
    parser.add_argument(
        "--strided-only", action="store_true", help="only the strided vs contiguous rows"
    )
    parser.add_argument(
        "--single", action="store_true", help="also the one-layer eager calls vs torch indexing"
    )
    parser.add_argument(
        "--sweep", action="store_true", help="only the V4 launch-settings sweep (no JSON rows)"
    )
    parser.add_argument(
        "--components",
        action="store_true",
        help="only a DeepSeek-V4 composite's four components: one call vs one per component",
    )
    args = parser.parse_args()
    machine = _machine()
    print(f"# {machine}")
    rows: list[dict[str, Any]] = []
    if args.single:
        for row in bench_single(args.iters):
            rows.append(row)
            print(f"{row['pool']:4} 1x{row['tokens']:<6} {row['impl']:28} {row['us']:9.1f} us "
                  f"{row['GBps']:8.1f} GB/s")  # fmt: skip
    if args.components:
        for n in args.sizes:
            for row in bench_components(args.layers, n, args.iters, args.reps):
                rows.append(row)
                print(
                    f"dsv4 composite {args.layers}x{n:<6} read {row['impl']:10} "
                    f"{row['time']:5} {row['us']:9.1f} us "
                    f"{100 * row['share_of_copy']:5.1f} % of copy"
                )
        _write_json(args.json, machine, rows)
        return
    if args.sweep:
        for n in args.sizes:
            for row in bench_sweep(args.layers, n, args.reps):
                print(
                    f"v4 {args.layers}x{n:<6} {row['op']:5} {row['impl']:5} "
                    f"block {row['block_tokens']} warps {row['num_warps']} "
                    f"evict {int(row['evict_first'])} {row['us']:9.1f} us "
                    f"{100 * row['share_of_copy']:5.1f} % of copy"
                )
        return
    for n in args.sizes:
        for row in bench_strided(args.layers, n, args.reps):
            rows.append(row)
            extra = row.get("strided_vs_contiguous")
            print(
                f"v4 {args.layers:3}x{n:<7} {row['op']:5} {row['impl']:28} {row['us']:10.1f} us"
                + ("" if extra is None else f"  strided/contiguous speed {100 * extra:5.1f} %")
            )
    for kind in [] if args.strided_only else args.pools:
        for n in args.sizes:
            try:
                found = bench(kind, args.layers, n, args.iters, args.reps)
            except torch.OutOfMemoryError:  # 61 x 65,536 MHA tokens need an H200's memory
                total = torch.cuda.get_device_properties(0).total_memory
                print(f"{kind:4} {args.layers:3}x{n:<7} skipped: does not fit this GPU's "
                      f"{total / 2**30:.0f} GiB")  # fmt: skip
                torch.cuda.empty_cache()
                continue
            rows.extend(found)
            for row in found:
                print(
                    f"{row['pool']:4} {row['layers']:3}x{row['tokens']:<7} {row['op']:5} "
                    f"{row['impl']:16} {row['time']:5} {row['us']:10.1f} us "
                    f"{row['GBps']:8.1f} GB/s {100 * row['share_of_copy']:6.1f} % of copy"
                )
            torch.cuda.empty_cache()
    _write_json(args.json, machine, rows)


def _write_json(path: str | None, machine: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    if path:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({"machine": machine, "command": "python benchmarks/bench_layers_gpu.py",
                       "rows": rows}, handle, indent=1)  # fmt: skip
            handle.write("\n")


if __name__ == "__main__":
    main()
