"""GPU throughput of kvcompat's Triton kernels against copy bandwidth, the torch twins and SGLang.

In one process on one GPU, for n random distinct tokens of a page-64 pool of 2**21
tokens, each layout, read (gather-dequantize) and write (quantize-scatter), it times:

* ``copy``: ``dst.copy_(src)`` moving the same byte volume (half read, half written),
* ``kvcompat``: the Triton kernel (``impl="triton"``, ``validate=False``),
* ``torch``: the torch twin (``impl="torch"``, ``validate=False``); for MHA/MLA rows also
  plain torch indexing (``index_select`` / ``index_copy_``), the natural baseline,
* ``sglang``: SGLang's own Triton kernels where they load: the V4 reader
  ``dequantize_k_cache_paged_dsv4``, the DSA reader, and for V4 writes its Triton store
  ``triton_fused_store_flashmla`` (SGLang's ROCm path; on an NVIDIA GPU it runs with
  e4m3fn, a same-shaped fused store, though its scale bytes are the log2-based ones of
  the ROCm flavour): put a kernel-only tree of the SGLang wheel on ``PYTHONPATH``, which
  ``python tests/gpu_matrix.py build .device-a 0.5.23`` builds from the wheel (on a
  machine with network; carry ``.device-a`` to the GPU machine),

and prints GB/s (bytes read + written: each token's row and written scale bytes, the bf16
values and the 8-byte location, once) and the kernel's share of copy bandwidth.

Timing is GPU time: each implementation's calls are captured in a CUDA graph (K calls on
K distinct location sets and output/value buffers, K = 8 below 1M tokens and 2 at 1M, so
the pool rows are L2-cold), replayed after zeroing a 256 MiB buffer to flush L2, timed
with CUDA events, median of ``--reps`` replays taken round-robin across implementations.
The twin (many small kernels) is timed eagerly, one call per event pair. ``eager`` is
the kernel timed the same eager way: it adds the host cost of a Triton launch (about
50 us on the H200 host used, the same for SGLang's kernels), which dominates small calls.
``--sweep`` first tries launch settings per kernel family at the largest n; ``--diag``
prints host and GPU microseconds per small call::

    PYTHONPATH=.device-a/sgl-0.5.23:. python benchmarks/bench_kernels_gpu.py \\
        [--sizes 4096 65536 1048576] [--reps 15] [--sweep] [--diag] [--json results.json] \\
        [--sorted] [--layouts v4 v41_new ...]

``--sorted`` takes the same random distinct tokens in ascending pool order (what a paged
allocator hands out for a prefill): neighbouring tokens then share pages and scale
sectors.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch

from kvcompat.layouts import (
    DSA_FP8,
    DSV4_INDEXER_FP4,
    DSV4_INDEXER_FP4_RNE,
    DSV4_INDEXER_FP8,
    UNIFORM_FP8,
    V4,
    V41,
    V41_FP4,
    V41_FP4_NEW,
    V41_NEW,
    LayoutSpec,
    dequantize,
    mha_layout,
    mla_layout,
    quantize,
)

PAGE_SIZE = 64
POOL_TOKENS = 1 << 21
MHA = mha_layout(8, 128, torch.bfloat16)
MLA = mla_layout(512, 64, torch.bfloat16)
LAYOUTS: list[tuple[str, LayoutSpec]] = [
    ("v4", V4),
    ("v4 fnuz", V4),  # the bytes of SGLang's ROCm store (e4m3fnuz), written and read here
    ("v41", V41),
    ("v41_new", V41_NEW),
    ("v41_fp4", V41_FP4),
    ("v41_fp4_new", V41_FP4_NEW),
    ("uniform_fp8", UNIFORM_FP8),
    ("dsa_fp8", DSA_FP8),
    ("mha 8x128 bf16", MHA),
    ("mla 512+64 bf16", MLA),
    ("dsv4_indexer_fp8", DSV4_INDEXER_FP8),  # also DSA's index-key cache
    ("dsv4_indexer_fp4", DSV4_INDEXER_FP4),
    ("dsv4_indexer_fp4_rne", DSV4_INDEXER_FP4_RNE),
]
SWEEP = [(1, 2), (2, 2), (2, 4), (4, 2), (4, 4), (8, 4), (16, 8)]
SWEEP_CASES = [  # (family, layout, direction); a family's last case picks its setting
    ("read_fp8", DSV4_INDEXER_FP8, "read"),
    ("read_fp8", V41, "read"),
    ("read_fp8", UNIFORM_FP8, "read"),
    ("read_fp8", DSA_FP8, "read"),
    ("read_fp8", V4, "read"),
    ("read_fp4", DSV4_INDEXER_FP4, "read"),
    ("read_fp4", V41_FP4, "read"),
    ("gather_rows", MLA, "read"),
    ("gather_rows", MHA, "read"),
    ("write_fp8", DSV4_INDEXER_FP8, "write"),
    ("write_fp8", V41, "write"),
    ("write_fp8", V41_NEW, "write"),
    ("write_fp8", DSA_FP8, "write"),
    ("write_fp8", V4, "write"),
    ("write_fp4_pairs", V41_FP4, "write"),
    ("write_fp4_ue8m0", DSV4_INDEXER_FP4, "write"),
    ("write_plain", UNIFORM_FP8, "write"),
    ("scatter_rows", MHA, "write"),
]

_FLUSH: torch.Tensor | None = None
SORTED = False
"""``--sorted``: each location set in ascending pool order instead of random order."""


def flush_l2() -> None:
    global _FLUSH  # noqa: PLW0603 - one buffer for the whole run
    if _FLUSH is None:
        _FLUSH = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    _FLUSH.zero_()


def _event_ms(fn: Callable[[], object]) -> float:
    flush_l2()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def median_ms(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """Median ms per call of each function, measured round-robin (so drift hits all alike)."""
    for fn in fns.values():
        fn()
        fn()
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            times[name].append(_event_ms(fn))
    return {name: statistics.median(t) for name, t in times.items()}


def host_us(fn: Callable[[], object], calls: int = 200) -> float:
    """Host time per call, GPU not awaited (launch overhead of small calls)."""
    import time

    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def graph_us(fn: Callable[[], object], calls: int = 20) -> float:
    """GPU time per call with no host in the way: ``calls`` calls replayed from a graph."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def volume(spec: LayoutSpec, n: int, direction: str) -> int:
    """Bytes read + written by one call (rows, scale bytes, values, locations).

    Writes take bf16 values; reads return ``spec.output_dtype`` (fp32 for the fp8
    indexer keys, bf16 or the pool dtype elsewhere).
    """
    row = spec.data_bytes + spec.scale_bytes_written
    value_bytes = spec.output_dtype.itemsize if direction == "read" else 2
    return n * row + n * spec.dim * value_bytes + 8 * n  # rows, values, int64 locations


def pool(spec: LayoutSpec) -> torch.Tensor:
    if spec.paged:
        rows = POOL_TOKENS // PAGE_SIZE
        return torch.randint(0, 256, (rows, spec.page_bytes(PAGE_SIZE)), dtype=torch.uint8,
                             device="cuda")  # fmt: skip
    if spec.scale_encoding is not None:  # DSA rows: bytes
        return torch.randint(0, 256, (POOL_TOKENS, 1, spec.data_bytes), dtype=torch.uint8,
                             device="cuda")  # fmt: skip
    shape = (POOL_TOKENS, spec.heads, spec.dim // spec.heads)
    return torch.randn(shape, device="cuda").to(spec.output_dtype)


def sglang_kernels() -> dict[str, Callable[..., object]]:
    """SGLang's own kernels that load here, by ``"<layout> <read|write>"`` (may be empty).

    Readers are called as ``f(buf, loc, out)``, writers as ``f(buf, loc, values)``.
    """
    found: dict[str, Callable[..., object]] = {}
    try:
        dq = importlib.import_module("sglang.kernels.ops.attention.dsv4.dequant_k_cache")
        found["v4 read"] = lambda buf, loc, out: dq.dequantize_k_cache_paged_dsv4(
            buf, loc, PAGE_SIZE, out=out.view(-1, 1, 512)
        )
    except Exception as exc:  # noqa: BLE001 - report and go on: it runs without SGLang
        print(f"# SGLang V4 reader not loaded: {type(exc).__name__}: {exc}")
    try:
        dsa = importlib.import_module("sglang.kernels.ops.attention.dsa.dequant_k_cache")
        found["dsa_fp8 read"] = lambda buf, loc, out: dsa.dequantize_k_cache_paged_dsa(
            buf.view(torch.float8_e4m3fn), loc
        )
    except Exception as exc:  # noqa: BLE001 - as above
        print(f"# SGLang DSA reader not loaded: {type(exc).__name__}: {exc}")
    try:
        store = importlib.import_module("sglang.kernels.ops.kvcache.triton_store_cache")
        found["v4 write"] = lambda buf, loc, values: store.triton_fused_store_flashmla(
            values, buf, loc, PAGE_SIZE
        )
    except Exception as exc:  # noqa: BLE001 - as above
        print(f"# SGLang V4 Triton store not loaded: {type(exc).__name__}: {exc}")
    return found


def cases(spec: LayoutSpec, buf: torch.Tensor, n: int, direction: str,
          engine: dict[str, Callable[..., object]], name: str,
          k: int = 1) -> dict[str, list[Callable[[], object]]]:  # fmt: skip
    """Per implementation, ``k`` calls on distinct locations and outputs / values."""
    plain = not spec.paged and spec.scale_encoding is None
    fnuz = name.endswith("fnuz")
    fns: dict[str, list[Callable[[], object]]] = {}

    def add(label: str, fn: Callable[[], object]) -> None:
        fns.setdefault(label, []).append(fn)

    for _ in range(k):
        loc = torch.randperm(POOL_TOKENS, device="cuda")[:n]
        if SORTED:
            loc = loc.sort().values  # the same tokens, in pool order
        if direction == "read":
            out = torch.empty(n, spec.dim, dtype=spec.output_dtype, device="cuda")
            add(
                "kvcompat",
                lambda loc=loc, out=out: dequantize(
                    spec, buf, loc, PAGE_SIZE, impl="triton", validate=False, out=out, fnuz=fnuz
                ),
            )
            add(
                "torch",
                lambda loc=loc: dequantize(
                    spec, buf, loc, PAGE_SIZE, impl="torch", validate=False, fnuz=fnuz
                ),
            )
            if plain:
                add(
                    "torch index",
                    lambda loc=loc, out=out: torch.index_select(
                        buf, 0, loc, out=out.view_as(buf[:n])
                    ),
                )
            if f"{name} read" in engine:
                add("sglang", lambda loc=loc, out=out, r=engine[f"{name} read"]: r(buf, loc, out))
            continue
        values = torch.randn(n, spec.dim, device="cuda").to(torch.bfloat16)
        if spec.unscaled_max is not None:
            values = values.clamp(-spec.unscaled_max, spec.unscaled_max)
        add(
            "kvcompat",
            lambda loc=loc, v=values: quantize(
                spec, v, buf, loc, PAGE_SIZE, impl="triton", validate=False, fnuz=fnuz
            ),
        )
        add(
            "torch",
            lambda loc=loc, v=values: quantize(
                spec, v, buf, loc, PAGE_SIZE, impl="torch", validate=False, fnuz=fnuz
            ),
        )
        if plain and spec.output_dtype == torch.bfloat16:
            shaped = values.view(n, *buf.shape[1:])
            add("torch index", lambda loc=loc, v=shaped: buf.index_copy_(0, loc, v))
        if f"{name} write" in engine:
            add("sglang", lambda loc=loc, v=values, w=engine[f"{name} write"]: w(buf, loc, v))
    return fns  # fmt: skip


def graph_ms(groups: dict[str, list[Callable[[], object]]], reps: int) -> dict[str, float]:
    """GPU ms per call of each group: its calls replayed from one CUDA graph after an L2
    flush, median of ``reps`` replays taken round-robin across the groups."""
    graphs = {}
    for label, calls in groups.items():
        for call in calls:
            call()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for call in calls:
                call()
        graphs[label] = (graph, len(calls))
    times: dict[str, list[float]] = {label: [] for label in graphs}
    for _ in range(reps):
        for label, (graph, count) in graphs.items():
            times[label].append(_event_ms(graph.replay) / count)
    return {label: statistics.median(t) for label, t in times.items()}


def copy_calls(nbytes: int, k: int) -> list[Callable[[], object]]:
    calls = []
    for _ in range(k):
        half = max(nbytes // 2, 16)
        src = torch.empty(half, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        calls.append(lambda src=src, dst=dst: dst.copy_(src))
    return calls


def sweep(reps: int, n: int) -> dict[str, tuple[int, int, bool]]:
    from kvcompat.kernels import _config

    best: dict[str, tuple[int, int, bool]] = {}
    print(f"\n## launch-settings sweep at n = {n:,} (GB/s; tokens per program x warps)")
    for family, spec, direction in SWEEP_CASES:
        buf = pool(spec)
        group = cases(spec, buf, n, direction, {}, "", k=2)["kvcompat"]
        results = []
        for step in range(len(SWEEP) + 1):
            if step < len(SWEEP):
                (block, warps), evict = SWEEP[step], False
            else:  # last: the best so far with the L2 hint
                _, block, warps, _ = max(results)
                evict = True
            _config.OVERRIDES[family] = _config.LaunchSettings(block, warps, evict)  # type: ignore[index]
            try:
                ms = graph_ms({"k": group}, reps)["k"]
                results.append((volume(spec, n, direction) / ms / 1e6, block, warps, evict))
            except Exception as exc:  # noqa: BLE001 - one failed setting must not end the sweep
                print(f"# {family} {block}x{warps} failed: {exc}")
        del _config.OVERRIDES[family]  # type: ignore[arg-type]
        del buf
        torch.cuda.empty_cache()
        if results:
            _, block, warps, evict = max(results)
            best[family] = (block, warps, evict)
            shown = "  ".join(f"{b}x{w}{'e' if e else ''}:{g:.0f}" for g, b, w, e in results)
            print(f"{family:13s} {spec.name:16s} {shown}  -> best {block}x{warps} evict={evict}")
    return best


def diagnose(engine: dict[str, Callable[..., object]]) -> None:
    """Host launch cost and pure GPU time of small calls (where host overhead dominates)."""
    print("\n## small calls: host us/call (GPU not awaited), GPU us/call (graph replay)")
    for name, spec, direction in [("v4", V4, "read"), ("v4", V4, "write"),
                                  ("dsa_fp8", DSA_FP8, "write"), ("mha", MHA, "read")]:  # fmt: skip
        buf = pool(spec)
        for n in (4096, 65536):
            fns = cases(spec, buf, n, direction, engine, name)
            for label, group in fns.items():
                fn = group[0]
                if label == "torch":
                    continue
                try:
                    print(f"{name:8s} {direction:5s} n={n:6d} {label:12s} host {host_us(fn):7.1f}"
                          f"  gpu {graph_us(fn):7.1f}")  # fmt: skip
                except Exception as exc:  # noqa: BLE001 - diagnostics only
                    print(f"{name} {direction} {label}: {type(exc).__name__}: {exc}")
        del buf
        torch.cuda.empty_cache()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 65536, 1048576])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--diag", action="store_true")
    parser.add_argument("--layouts", nargs="*", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--sorted", action="store_true",
        help="the same random tokens in pool order (as a paged allocator hands out a prefill)",
    )  # fmt: skip
    args = parser.parse_args()
    global SORTED  # noqa: PLW0603 - one switch for the whole run
    SORTED = args.sorted
    import triton

    from kvcompat.kernels import _config

    props = torch.cuda.get_device_properties(0)
    print(f"# {props.name}, torch {torch.__version__}, triton {triton.__version__}, "
          f"CUDA {torch.version.cuda}; pool {POOL_TOKENS:,} tokens, page {PAGE_SIZE}")  # fmt: skip
    chosen = sweep(args.reps, max(args.sizes)) if args.sweep else {}
    for family, (block, warps, evict) in chosen.items():
        _config.OVERRIDES[family] = _config.LaunchSettings(block, warps, evict)  # type: ignore[index]
    settings = {family: _config.launch_settings(family) for family in _config.DEFAULTS}
    shown = {f: (s.block_tokens, s.num_warps, s.evict_first) for f, s in settings.items()}
    print("# launch settings:", shown)
    engine = sglang_kernels()
    if args.diag:
        diagnose(engine)
    rows: list[dict[str, Any]] = []
    print("\n| layout | op | n | copy GB/s | kvcompat GB/s | % copy | eager GB/s | torch GB/s "
          "| other GB/s |\n|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    for name, spec in LAYOUTS:
        if args.layouts and name not in args.layouts:
            continue
        buf = pool(spec)
        for direction in ("read", "write"):
            for n in args.sizes:
                k = 2 if n >= 1 << 20 else 8
                try:
                    vol = volume(spec, n, direction)
                    groups = cases(spec, buf, n, direction, engine, name, k=k)
                    twin = groups.pop("torch")[:1]
                    eager = groups["kvcompat"][:1]
                    graph = graph_ms({"copy": copy_calls(vol, k), **groups}, args.reps)
                    eager_fns = {"eager": eager[0], "torch": twin[0]}
                    eager_fns.update({f"{label} eager": calls[0] for label, calls in groups.items()
                                      if label != "kvcompat"})  # fmt: skip
                    flat = median_ms(eager_fns, max(3, args.reps // 3))
                    gbs = {label: vol / ms / 1e6 for label, ms in {**graph, **flat}.items()}
                    copy_gbs = gbs.pop("copy")
                    del groups, twin, eager
                except Exception:  # noqa: BLE001 - print it and go on with the next case
                    traceback.print_exc()
                    continue
                other = ", ".join(f"{k} {v:.0f}" for k, v in gbs.items()
                                  if k not in ("kvcompat", "torch", "eager"))  # fmt: skip
                share = 100 * gbs["kvcompat"] / copy_gbs
                print(f"| {name} | {direction} | {n:,} | {copy_gbs:.0f} | {gbs['kvcompat']:.0f} | "
                      f"{share:.1f} | {gbs['eager']:.0f} | {gbs['torch']:.0f} | {other} |",
                      flush=True)  # fmt: skip
                rows.append({"layout": name, "op": direction, "n": n, "copy": copy_gbs, **gbs})
                torch.cuda.empty_cache()
        del buf
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fh:
            record = {"device": props.name, "torch": torch.__version__,
                      "triton": triton.__version__, "sweep": chosen, "rows": rows}  # fmt: skip
            json.dump(record, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
