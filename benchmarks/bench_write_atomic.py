"""What the all-or-nothing guarantee costs a CPU write, measured side by side.

For each layout and token count, times :func:`kvcompat.layouts.quantize` twice in this
one process, alternating, on the same buffer, values and random locations:

* ``atomic`` — the write as shipped: values that alias the buffer are copied, every
  part and chunk is encoded before the first scatter, and the bytes every scatter but
  the last will overwrite are saved for the rollback (``docs/atomic-writes.md``);
* ``unguarded`` — the same encode and the same scatters with the alias check and the
  save-and-restore taken out (what the write did before it was made atomic).

It prints microseconds per write (median of the alternated runs) and the ratio
atomic / unguarded. Both write the same bytes (checked once per case). Takes about a
minute::

    .venv/bin/python benchmarks/bench_write_atomic.py [--tokens 64 4096 65536] [--threads N]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch

from kvcompat import _ops
from kvcompat.layouts import (
    DSA_FP8,
    V4,
    V41,
    V41_FP4,
    LayoutSpec,
    _codec,
    mha_layout,
    mla_layout,
    quantize,
)

PAGE_SIZE = 64
CASES: list[tuple[str, LayoutSpec]] = [
    ("v4", V4),
    ("v41", V41),
    ("v41_fp4", V41_FP4),
    ("dsa_fp8", DSA_FP8),
    ("mha 8x128 bf16", mha_layout(8, 128, torch.bfloat16)),
    ("mla 512+64 bf16", mla_layout(512, 64, torch.bfloat16)),
]


def _scatter_only(stores: Sequence[_codec.Store]) -> None:
    for view, index, source in stores:
        view.index_copy_(0, index, source)


@contextmanager
def unguarded() -> Iterator[None]:
    """Run writes without the alias copy and without the save-and-restore."""
    names = vars(_ops)  # the dispatch module calls both
    saved = names["commit"], names["unaliased"]
    names["commit"] = _scatter_only
    names["unaliased"] = lambda values, buffers: values
    try:
        yield
    finally:
        names["commit"], names["unaliased"] = saved


def _per_call(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def bench(spec: LayoutSpec, n: int, rounds: int) -> tuple[float, float]:
    """Median seconds per write, (atomic, unguarded), alternating rounds."""
    generator = torch.Generator().manual_seed(0)
    per_row = PAGE_SIZE if spec.paged else 1
    rows = n // per_row + 1
    buf = torch.zeros(rows, spec.page_bytes(per_row), dtype=torch.uint8)
    loc = torch.randperm(rows * per_row, generator=generator)[:n]
    values = torch.randn(n, spec.dim, generator=generator).to(torch.bfloat16)
    if spec.unscaled_max is not None:
        values = values.clamp(-spec.unscaled_max, spec.unscaled_max)

    def write() -> None:
        quantize(spec, values, buf, loc, PAGE_SIZE, validate=False)

    write()
    expected = buf.clone()
    buf.zero_()
    with unguarded():
        write()
    if not torch.equal(buf, expected):
        msg = f"{spec.name}: the two writes stored different bytes"
        raise SystemExit(msg)
    calls = max(1, 20000 // n)
    atomic, bare = [], []
    for _ in range(rounds):
        atomic.append(_per_call(write, calls))
        with unguarded():
            bare.append(_per_call(write, calls))
    return statistics.median(atomic), statistics.median(bare)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 4096, 65536])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}; bf16 inputs, page size {PAGE_SIZE}, "
        f"validate=False, median of {args.rounds} alternated rounds"
    )
    header = f"{'layout':<17}{'tokens':>8}  {'atomic µs':>11}{'unguarded µs':>14}{'ratio':>8}"
    print(header)
    print("-" * len(header))
    started = time.perf_counter()
    for name, spec in CASES:
        for n in args.tokens:
            atomic, bare = bench(spec, n, args.rounds)
            timings = f"{atomic * 1e6:>11.1f}{bare * 1e6:>14.1f}{atomic / bare:>8.3f}"
            print(f"{name:<17}{n:>8}  {timings}")
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
