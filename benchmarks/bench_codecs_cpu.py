"""Throughput of the pure-torch layout codecs on this machine's CPU.

For each layout and token count, times :func:`kvcompat.layouts.dequantize` (read),
:func:`kvcompat.layouts.quantize` with its default checks (write) and with
``validate=False`` (write, unchecked: what an adapter that already ran ``check_write``
pays), on random locations in a buffer with one spare page, and prints million tokens
per second (best of a few runs). Takes 10-30 seconds::

    .venv/bin/python benchmarks/bench_codecs_cpu.py [--tokens 4096 65536] [--threads N]
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable

import torch

from kvcompat.layouts import (
    DSA_FP8,
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
CASES: list[tuple[str, LayoutSpec, bool]] = [
    ("v4", V4, False),
    ("v4 (fnuz)", V4, True),
    ("v41", V41, False),
    ("v41_new", V41_NEW, False),
    ("v41_fp4", V41_FP4, False),
    ("v41_fp4_new", V41_FP4_NEW, False),
    ("uniform_fp8", UNIFORM_FP8, False),
    ("dsa_fp8", DSA_FP8, False),
    ("mha 8x128 bf16", mha_layout(8, 128, torch.bfloat16), False),
    ("mla 512+64 bf16", mla_layout(512, 64, torch.bfloat16), False),
]


def best_seconds(fn: Callable[[], object], n: int) -> float:
    """Best of a few timed runs (one warm-up run first for small batches)."""
    if n < 16384:
        fn()
    runs = 5 if n < 16384 else 2
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def bench(spec: LayoutSpec, fnuz: bool, n: int) -> tuple[float, float, float]:
    generator = torch.Generator().manual_seed(0)
    per_row = PAGE_SIZE if spec.paged else 1
    rows = n // per_row + 1
    buf = torch.zeros(rows, spec.page_bytes(per_row), dtype=torch.uint8)
    loc = torch.randperm(rows * per_row, generator=generator)[:n]
    values = torch.randn(n, spec.dim, generator=generator).to(torch.bfloat16)
    if spec.unscaled_max is not None:
        values = values.clamp(-spec.unscaled_max, spec.unscaled_max)
    read = best_seconds(lambda: dequantize(spec, buf, loc, PAGE_SIZE, fnuz=fnuz), n)
    write = best_seconds(lambda: quantize(spec, values, buf, loc, PAGE_SIZE, fnuz=fnuz), n)
    unchecked = best_seconds(
        lambda: quantize(spec, values, buf, loc, PAGE_SIZE, fnuz=fnuz, validate=False), n
    )
    return n / read / 1e6, n / write / 1e6, n / unchecked / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 65536])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}; bf16 inputs, page size {PAGE_SIZE}"
    )
    header = f"{'layout':<17}{'tokens':>8}  {'read Mtok/s':>12}{'write':>9}{'unchecked':>11}"
    print(header)
    print("-" * len(header))
    started = time.perf_counter()
    for name, spec, fnuz in CASES:
        for n in args.tokens:
            read, write, unchecked = bench(spec, fnuz, n)
            print(f"{name:<17}{n:>8}  {read:>12.3f}{write:>9.3f}{unchecked:>11.3f}")
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
