"""Per-call cost of a read/write through kvcompat's custom ops vs the direct eager call.

Usage:
    python benchmarks/bench_ops_overhead.py            # reference-pool shapes, CPU
    python benchmarks/bench_ops_overhead.py --tokens 1 --tokens 64

For each layout it times, in interleaved rounds, ``dequantize(spec, buf, loc, P)`` (what
an eager ``pool.read`` runs) against ``torch.ops.kvcompat.dequantize(...)`` (what a
compiled graph runs), and ``quantize`` against ``torch.ops.kvcompat.quantize``, and
prints medians in microseconds and the ratio op / direct. Eager calls never go through
the op (kvcompat dispatches to it only while ``torch.compiler.is_compiling()``); this
measures what that choice saves. The "direct" column is also the CPU read/write
micro-benchmark for the logging/impl-selection change: compare it between branches.
"""

from __future__ import annotations

import argparse
import statistics
import timeit
from collections.abc import Callable

import torch

import kvcompat._ops  # noqa: F401 - registers torch.ops.kvcompat.*
from kvcompat.layouts import V4, LayoutSpec, dequantize, mha_layout, mla_layout, quantize

ROUNDS = 9


def per_call_us(fn: Callable[[], object], number: int) -> float:
    return timeit.timeit(fn, number=number) / number * 1e6


def side_by_side(
    a: Callable[[], object], b: Callable[[], object], number: int
) -> tuple[float, float]:
    """Median microseconds per call of a and b, measured in alternating rounds."""
    a(), b()
    xs, ys = [], []
    for _ in range(ROUNDS):
        xs.append(per_call_us(a, number))
        ys.append(per_call_us(b, number))
    return statistics.median(xs), statistics.median(ys)


def cases() -> list[tuple[str, LayoutSpec, torch.Tensor, int]]:
    return [
        ("mha_8x128_bf16", mha_layout(8, 128, torch.bfloat16),
         torch.zeros(4096, 8, 128, dtype=torch.bfloat16), 16),
        ("mla_512+64_bf16", mla_layout(512, 64, torch.bfloat16),
         torch.zeros(4096, 1, 576, dtype=torch.bfloat16), 16),
        ("v4", V4, torch.zeros(64, V4.page_bytes(64), dtype=torch.uint8), 64),
    ]  # fmt: skip


def calls(
    spec: LayoutSpec, buf: torch.Tensor, loc: torch.Tensor, page: int, values: torch.Tensor
) -> list[tuple[str, Callable[[], object], Callable[[], object]]]:
    """(operation, direct eager call, the same call through the custom op)."""
    ops = torch.ops.kvcompat
    key = (spec.name, spec.dim, spec.output_dtype)
    return [
        ("read", lambda: dequantize(spec, buf, loc, page),
         lambda: ops.dequantize(*key, buf, loc, page, False, True, "auto")),
        ("write", lambda: quantize(spec, values, buf, loc, page),
         lambda: ops.quantize(*key, values, buf, loc, page, False, True, True, "auto")),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, action="append", help="tokens per call")
    parser.add_argument("--number", type=int, default=200, help="calls per round")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'layout':18} {'n':>5} {'op':6} {'direct us':>10} {'op us':>10} {'ratio':>6}")
    for name, spec, buf, page in cases():
        for n in args.tokens or [4, 256]:
            loc = torch.randperm(buf.shape[0] * spec.tokens_per_row(page))[:n]
            values = torch.randn(n, spec.dim).to(torch.bfloat16)
            for what, direct, through_op in calls(spec, buf, loc, page, values):
                d, o = side_by_side(direct, through_op, args.number)
                print(f"{name:18} {n:5} {what:6} {d:10.1f} {o:10.1f} {o / d:6.2f}")


if __name__ == "__main__":
    main()
