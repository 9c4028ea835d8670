"""How fast can a kernel move the bytes of each missed target at all? (H200 ceilings.)

For the layouts whose kernels miss an issue target, this times, in one process next to
kvcompat's kernel and a device copy of the same volume, *pure data-movement* kernels that
touch exactly the bytes the real kernel touches, in the same pattern, with no arithmetic:

* V4 read: gather each token's 576-byte row plus 4 bytes of its scale row (a separate
  32-byte sector elsewhere in the page) into a dense 1024-byte row; and the same without
  the scale read, and with 512-byte rows (UNIFORM_FP8's shape).
* V4 write: load 1024 dense bytes per token, store the 576-byte row, then the 8-byte scale
  slot (a whole-word store, or a read-modify-write that keeps the pad byte), or no scale.
* V41 write: 512-byte rows plus the 16-byte scale slot, or no scale.
* V41_NEW write: 528-byte interleaved rows (which start or end mid-sector), with and
  without prefetching the edge sectors first.

For V4 it also times the streamed side (row loads and dense stores) with an L2
``evict_first`` priority, so that the scale lines might outlive it in L2; the scale access
with an L2 ``evict_last`` priority (the scale sectors, shared by neighbouring tokens, then
stay in L2 for the rest of the launch); the same followed by a second launch that hands
those lines back their normal priority (``applypriority.global.L2::evict_normal`` on each
token's scale line); and measures what each leaves behind: the time to re-read an
L2-resident 32 MiB working set right after the gather.

Same timing as ``bench_kernels_gpu.py`` (CUDA-graph replay of K calls after an L2 flush,
median of ``--reps``), same GB/s accounting (each token's row and written scale bytes, the
bf16 values, the 8-byte location)::

    python benchmarks/ceilings_gpu.py [--n 1048576] [--reps 15]
"""

from __future__ import annotations

# The kernels follow Triton's conventions (see kvcompat/kernels/_triton.py).
# ruff: noqa: N803
import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_kernels_gpu as bench

from kvcompat.kernels._plan import geometry
from kvcompat.kernels._triton import _prefetch_edges, _token_block
from kvcompat.layouts import V4, V41, V41_NEW, LayoutSpec, dequantize, quantize

PAGE = bench.PAGE_SIZE


@triton.jit
def _gather_kernel(out_ptr, buf_ptr, loc_ptr, n, PAGE, PAGE_BYTES, DATA_STRIDE, SCALE_BASE,
                   SCALE_STRIDE, ROW_WORDS: tl.constexpr, OUT_WORDS: tl.constexpr,
                   SCALE: tl.constexpr, BLOCK_T: tl.constexpr,
                   SCALE_EVICT: tl.constexpr = "", STREAM_EVICT: tl.constexpr = ""):  # fmt: skip
    """``ROW_WORDS`` int32 of each row (plus one scale word) into a dense ``OUT_WORDS`` row.

    ``STREAM_EVICT`` is the L2 policy of the row loads and the output stores."""
    src = buf_ptr.to(tl.pointer_type(tl.int32))
    dst = out_ptr.to(tl.pointer_type(tl.int32))
    tok, live, data_off, scale_off = _token_block(loc_ptr, n, PAGE, PAGE_BYTES, DATA_STRIDE,
                                                  SCALE_BASE, SCALE_STRIDE, BLOCK_T)  # fmt: skip
    col = tl.arange(0, OUT_WORDS)
    in_row = col[None, :] < ROW_WORDS
    words = tl.load(src + ((data_off // 4)[:, None] + col[None, :]), mask=live[:, None] & in_row,
                    other=0, eviction_policy=STREAM_EVICT)  # fmt: skip
    if SCALE:
        scale = tl.load(src + scale_off // 4, mask=live, other=0, eviction_policy=SCALE_EVICT)
        words = tl.where(in_row, words, scale[:, None])
    tl.store(dst + (tok[:, None] * OUT_WORDS + col[None, :]), words, mask=live[:, None],
             eviction_policy=STREAM_EVICT)  # fmt: skip


@triton.jit
def _scatter_kernel(values_ptr, buf_ptr, loc_ptr, n, PAGE, PAGE_BYTES, DATA_STRIDE, SCALE_BASE,
                    SCALE_STRIDE, ROW_WORDS: tl.constexpr, IN_WORDS: tl.constexpr,
                    SCALE: tl.constexpr, SPAN: tl.constexpr, BLOCK_T: tl.constexpr,
                    SCALE_EVICT: tl.constexpr = "", STREAM_EVICT: tl.constexpr = ""):  # fmt: skip
    """``IN_WORDS`` dense int32 in, ``ROW_WORDS`` out at the row, then the scale slot:
    ``SCALE`` 1 an 8-byte store, 2 an 8-byte read-modify-write keeping byte 7, 3 16 bytes.
    ``SPAN`` > 0 prefetches the row's edge sectors first (as the V41_NEW writer does).
    ``STREAM_EVICT`` is the L2 policy of the value loads and the row stores."""
    src = values_ptr.to(tl.pointer_type(tl.int32))
    buf8 = buf_ptr.to(tl.pointer_type(tl.uint8))
    buf32 = buf_ptr.to(tl.pointer_type(tl.int32))
    buf64 = buf_ptr.to(tl.pointer_type(tl.int64))
    tok, live, data_off, scale_off = _token_block(loc_ptr, n, PAGE, PAGE_BYTES, DATA_STRIDE,
                                                  SCALE_BASE, SCALE_STRIDE, BLOCK_T)  # fmt: skip
    if SPAN > 0:
        _prefetch_edges(buf8, data_off, live, SPAN)
    if SCALE == 2:
        old = tl.load(buf64 + scale_off // 8, mask=live, other=0)
    col = tl.arange(0, IN_WORDS)
    words = tl.load(src + (tok[:, None] * IN_WORDS + col[None, :]), mask=live[:, None], other=0,
                    eviction_policy=STREAM_EVICT)  # fmt: skip
    in_row = live[:, None] & (col[None, :] < ROW_WORDS)
    tl.store(buf32 + ((data_off // 4)[:, None] + col[None, :]), words ^ 0x5A5A, mask=in_row,
             eviction_policy=STREAM_EVICT)  # fmt: skip
    if SCALE == 1:
        tl.store(buf64 + scale_off // 8, tok, mask=live, eviction_policy=SCALE_EVICT)
    elif SCALE == 2:
        tl.store(buf64 + scale_off // 8, (tok & 0xFFFFFFFFFFFF) | ((old >> 56) << 56), mask=live)
    elif SCALE == 3:
        s = tl.arange(0, 4)
        tl.store(buf32 + ((scale_off // 4)[:, None] + s[None, :]),
                 tok.to(tl.int32)[:, None] + s[None, :], mask=live[:, None])  # fmt: skip


@triton.jit
def _reset_priority_kernel(buf_ptr, loc_ptr, n, PAGE, PAGE_BYTES, DATA_STRIDE, SCALE_BASE,
                           SCALE_STRIDE, BLOCK_T: tl.constexpr):  # fmt: skip
    """Give each token's 128-byte scale line back the normal L2 eviction priority."""
    buf8 = buf_ptr.to(tl.pointer_type(tl.uint8))
    _, live, _, scale_off = _token_block(loc_ptr, n, PAGE, PAGE_BYTES, DATA_STRIDE, SCALE_BASE,
                                         SCALE_STRIDE, BLOCK_T)  # fmt: skip
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.u32 p, $2, 0; "
        "@p applypriority.global.L2::evict_normal [$1], 128; mov.u32 $0, 0; }",
        "=r,l,r",
        [buf8 + (scale_off & ~127), live.to(tl.int32)],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


def _reset_priority(buf: torch.Tensor, loc: torch.Tensor, n: int,
                    geo: list[int]) -> Callable[[], object]:  # fmt: skip
    grid = (triton.cdiv(n, 256),)
    return lambda: _reset_priority_kernel[grid](buf, loc, n, *geo, BLOCK_T=256, num_warps=4)


def _then(*fns: Callable[[], object]) -> Callable[[], object]:
    return lambda: [fn() for fn in fns]


def _geometry(spec: LayoutSpec) -> list[int]:
    g = geometry(spec, PAGE)
    return [g["PAGE"], g["PAGE_BYTES"], g["DATA_STRIDE"], g["SCALE_BASE"], g["SCALE_STRIDE"]]


def _launch(kernel: object, *args: object, **constants: object) -> Callable[[], object]:
    n = int(args[3])  # type: ignore[call-overload]
    grid = (triton.cdiv(n, 8),)
    return lambda: kernel[grid](*args, BLOCK_T=8, num_warps=4, **constants)  # type: ignore[index]


def _row(spec: LayoutSpec, n: int, k: int, reps: int,
         make: Callable[[torch.Tensor, int], dict[str, Callable[[], object]]]) -> None:  # fmt: skip
    vol = bench.volume(spec, n, "read")
    groups: dict[str, list[Callable[[], object]]] = {"copy": bench.copy_calls(vol, k)}
    for i in range(k):
        loc = torch.randperm(bench.POOL_TOKENS, device="cuda")[:n]
        for label, fn in make(loc, i).items():
            groups.setdefault(label, []).append(fn)
    ms = bench.graph_ms(groups, reps)
    copy = vol / ms.pop("copy") / 1e6
    cells = " | ".join(f"{label} {vol / t / 1e6:.0f} ({100 * vol / t / 1e6 / copy:.1f} %)"
                       for label, t in ms.items())  # fmt: skip
    print(f"| {spec.name} | {copy:.0f} | {cells} |", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1 << 20)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    n, k, reps = args.n, 2, args.reps
    props = torch.cuda.get_device_properties(0)
    print(f"# {props.name}, torch {torch.__version__}, triton {triton.__version__}; n = {n:,}")
    print("\n## reads: GB/s (% of copy)\n| layout | copy | kernels |\n|---|---|---|")
    buf = bench.pool(V4)
    outs = [torch.empty(n, 512, dtype=torch.bfloat16, device="cuda") for _ in range(k)]
    geo = _geometry(V4)

    def v4_read(
        loc: torch.Tensor, i: int, buf: torch.Tensor = buf, outs: list[torch.Tensor] = outs
    ) -> dict[str, Callable[[], object]]:
        out = outs[i]
        hinted = _launch(_gather_kernel, out, buf, loc, n, *geo, ROW_WORDS=144, OUT_WORDS=256,
                         SCALE=True, SCALE_EVICT="evict_last")  # fmt: skip
        streamed = _launch(_gather_kernel, out, buf, loc, n, *geo, ROW_WORDS=144, OUT_WORDS=256,
                           SCALE=True, STREAM_EVICT="evict_first")  # fmt: skip
        return {
            "kvcompat": lambda: dequantize(
                V4, buf, loc, PAGE, impl="triton", validate=False, out=out
            ),
            "row 576 + scale": _launch(
                _gather_kernel, out, buf, loc, n, *geo, ROW_WORDS=144, OUT_WORDS=256, SCALE=True
            ),
            "row 576": _launch(
                _gather_kernel, out, buf, loc, n, *geo, ROW_WORDS=144, OUT_WORDS=256, SCALE=False
            ),
            "row 512": _launch(
                _gather_kernel, out, buf, loc, n, *geo, ROW_WORDS=128, OUT_WORDS=256, SCALE=False
            ),
            "row 576 + scale, rows and output evict_first": streamed,
            "row 576 + scale, scale evict_last": hinted,
            "the same + priority reset": _then(hinted, _reset_priority(buf, loc, n, geo)),
        }

    _row(V4, n, k, reps, v4_read)
    del buf, outs
    torch.cuda.empty_cache()
    print("\n## writes: GB/s (% of copy)\n| layout | copy | kernels |\n|---|---|---|")
    values = [torch.randn(n, 512, device="cuda").to(torch.bfloat16) for _ in range(k)]
    for spec, row_words, scales in ((V4, 144, (0, 1, 2)), (V41, 128, (0, 3)), (V41_NEW, 132, (0,))):
        buf = bench.pool(spec)
        geo = _geometry(spec)

        def write(loc: torch.Tensor, i: int, spec: LayoutSpec = spec, buf: torch.Tensor = buf,
                  geo: list[int] = geo, row_words: int = row_words,
                  scales: tuple[int, ...] = scales) -> dict[str, Callable[[], object]]:  # fmt: skip
            v = values[i]
            fns: dict[str, Callable[[], object]] = {
                "kvcompat": lambda: quantize(
                    spec, v, buf, loc, PAGE, impl="triton", validate=False
                ),
            }
            names = {0: "row", 1: "row + 8 B scale", 2: "row + 8 B scale RMW",
                     3: "row + 16 B scale"}  # fmt: skip
            for scale in scales:
                for span in (0, 528) if spec is V41_NEW else (0,):
                    label = names[scale] + (" + edge prefetch" if span else "")
                    fns[label] = _launch(_scatter_kernel, v, buf, loc, n, *geo,
                                         ROW_WORDS=row_words, IN_WORDS=256, SCALE=scale,
                                         SPAN=span)  # fmt: skip
            if spec is V4:
                hinted = _launch(
                    _scatter_kernel, v, buf, loc, n, *geo, ROW_WORDS=row_words, IN_WORDS=256,
                    SCALE=1, SPAN=0, SCALE_EVICT="evict_last",
                )  # fmt: skip
                fns["row + 8 B scale, values and rows evict_first"] = _launch(
                    _scatter_kernel, v, buf, loc, n, *geo, ROW_WORDS=row_words, IN_WORDS=256,
                    SCALE=1, SPAN=0, STREAM_EVICT="evict_first",
                )  # fmt: skip
                fns["row + 8 B scale, scale evict_last"] = hinted
                fns["the same + priority reset"] = _then(hinted, _reset_priority(buf, loc, n, geo))
            return fns

        _row(spec, n, k, reps, write)
        del buf
        torch.cuda.empty_cache()
    _l2_after(n)
    return 0


def _l2_after(n: int, mib: int = 32, reps: int = 21) -> None:
    """What an L2 ``evict_last`` hint on the scale traffic leaves behind for the next kernel:
    the time to re-read an L2-resident ``mib`` MiB working set right after a V4 gather."""
    import statistics

    buf = bench.pool(V4)
    out = torch.empty(n, 512, dtype=torch.bfloat16, device="cuda")
    loc = torch.randperm(bench.POOL_TOKENS, device="cuda")[:n]
    geo = _geometry(V4)
    work = torch.ones(mib << 18, device="cuda")
    print(f"\n## re-reading a {mib} MiB L2-resident working set after a V4 gather (us)")
    reset = _reset_priority(buf, loc, n, geo)
    for label, evict, after in (
        ("scale loads normal", "", None),
        ("scale loads evict_last", "evict_last", None),
        ("scale loads evict_last, then the priority reset", "evict_last", reset),
    ):
        gather = _launch(_gather_kernel, out, buf, loc, n, *geo, ROW_WORDS=144, OUT_WORDS=256,
                         SCALE=True, SCALE_EVICT=evict)  # fmt: skip
        times = []
        for _ in range(reps):
            bench.flush_l2()
            gather()
            if after is not None:
                after()
            work.sum()  # brings the working set into L2
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            work.sum()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        print(f"{label}: {statistics.median(times):.1f}")


if __name__ == "__main__":
    sys.exit(main())
