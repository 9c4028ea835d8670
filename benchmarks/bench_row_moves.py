"""Pool-to-pool page moves: one pass (``move_rows_layers``) against gather then scatter.

What a direct transfer runs, side by side in one process on one device: the pages of one
request, every layer, copied from a source pool's buffers into a destination pool's
(pages at random places on both sides, as an allocator leaves them), by

* ``one copy``: one ``copy_`` of the request's bytes, contiguous (the bar),
* ``move``: a :class:`kvcompat._ops.RowMoves` run, each byte read and written once
  (buffers checked when it is made, rows on the first run only, as a direct pull does),
* ``gather + scatter``: :func:`gather_rows_layers` into a staging batch, then
  :func:`scatter_rows_layers` from it (what the direct pull did before, and what a packed
  transfer's two ends do without the move between them).

Usage::

    python benchmarks/bench_row_moves.py [--device cpu|cuda] [--layers 61] [--pages 32 128]
        [--page-bytes 37440] [--iters 5]

Prints the median seconds per call and GB/s of request bytes, and each way's share of the
copy; on a CPU the figures are this machine's memory bandwidth, one thread unless
``--threads``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from kvcompat._ops import RowMoves, gather_rows_layers, scatter_rows_layers


def _time(fn: Callable[[], object], iters: int, device: str) -> float:
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench(device: str, layers: int, pages: int, page_bytes: int, iters: int) -> None:
    g = torch.Generator(device=device).manual_seed(pages)  # random bytes made where they live
    total = 4 * pages  # each pool holds four times the request's pages
    src = [torch.randint(0, 256, (total, page_bytes), generator=g, dtype=torch.uint8,
                         device=device) for _ in range(layers)]  # fmt: skip
    dst = [torch.zeros(total, page_bytes, dtype=torch.uint8, device=device)
           for _ in range(layers)]  # fmt: skip
    take = torch.randperm(total, generator=g, device=device)[:pages]
    put = torch.randperm(total, generator=g, device=device)[:pages]
    nbytes = layers * pages * page_bytes
    flat_src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    flat_dst = torch.empty_like(flat_src)
    staging = torch.empty(layers, pages, page_bytes, dtype=torch.uint8, device=device)
    moves = RowMoves(src, dst)  # the buffers checked once, as a direct pull keeps them
    moves.run(take, put)  # the rows validated once, as a pull's first call
    ways: dict[str, Callable[[], object]] = {
        "one copy": lambda: flat_dst.copy_(flat_src),
        "move": lambda: moves.run(take, put, validate=False),
        "gather + scatter": lambda: scatter_rows_layers(
            dst, put, gather_rows_layers(src, take, out=staging), validate=False
        ),
    }
    seconds = {name: _time(fn, iters, device) for name, fn in ways.items()}
    for index, layer in enumerate(src):
        assert torch.equal(dst[index][put], layer[take]), "the pages did not arrive"
    copy = seconds["one copy"]
    print(f"{device} {layers} layers x {pages} pages of {page_bytes} B ({nbytes / 2**20:.1f} MiB):")
    for name, value in seconds.items():
        print(f"  {name:18} {value * 1e3:9.3f} ms {nbytes / value / 1e9:8.2f} GB/s "
              f"{100 * copy / value:6.1f} % of the copy")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=61)
    parser.add_argument("--pages", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--page-bytes", type=int, default=37440)  # a DeepSeek-V4 page
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for pages in args.pages:
        bench(args.device, args.layers, pages, args.page_bytes, args.iters)


if __name__ == "__main__":
    main()
