"""One launch of each kernel that had missed an H200 target, for Nsight Compute.

Run under ncu on the GPU machine, e.g.:

    ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section LaunchStats --section Occupancy --section ComputeWorkloadAnalysis \
        --kernel-name regex:^_ --launch-skip 5 --launch-count 5 \
        python benchmarks/profile_kernels_gpu.py

Only kvcompat's kernels match ``^_``. Five of them run before the second round (the two
stores that fill the read cases' pools, then the first round's V4 read, V4 write and
V41_NEW write), so the profiled launches are, in order: the V41_FP4 write (the bf16
pairs kernel), the UNIFORM_FP8 read (a full-row reference near the copy limit), the V4
read, the V4 write and the V41_NEW write. A plain copy_ of the V4 read's byte volume
follows, unprofiled.

``--fnuz`` profiles the V4 read and write of the ROCm (e4m3fnuz) flavour instead: use
``--launch-skip 3 --launch-count 2`` (one store fills the read's pool, then one round).
"""

from __future__ import annotations

import sys

import torch

from kvcompat.kernels import gather_dequantize, quantize_scatter
from kvcompat.layouts import UNIFORM_FP8, V4, V41_FP4, V41_NEW

N = 1 << 20
PAGE = 64


def case(
    spec: object, write: bool, gen: torch.Generator, *, fnuz: bool = False
) -> tuple[object, ...]:
    pages = (2 * N) // PAGE + 1
    buf = torch.zeros(pages, spec.page_bytes(PAGE), dtype=torch.uint8, device="cuda")  # type: ignore[attr-defined]
    loc = torch.randperm(pages * PAGE, generator=gen, device="cpu")[:N].cuda()
    values = torch.randn(N, 512, generator=gen).to(torch.bfloat16).cuda()
    if write:
        return (quantize_scatter, spec, values, buf, loc, PAGE, fnuz)
    quantize_scatter(spec, values, buf, loc, PAGE, fnuz=fnuz)
    out = torch.empty(N, 512, dtype=torch.bfloat16, device="cuda")
    return (gather_dequantize, spec, buf, loc, PAGE, out, fnuz)


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    if "--fnuz" in sys.argv[1:]:
        cases = [case(V4, False, gen, fnuz=True), case(V4, True, gen, fnuz=True)]
    else:
        cases = [
            case(V4, False, gen),
            case(V4, True, gen),
            case(V41_NEW, True, gen),
            case(V41_FP4, True, gen),
            case(UNIFORM_FP8, False, gen),
        ]
    for _round in range(2):
        for fn, *args, fnuz in cases:
            if fn is gather_dequantize:
                *head, out = args
                fn(*head, out=out, fnuz=fnuz)  # type: ignore[operator]
            else:
                fn(*args, fnuz=fnuz)  # type: ignore[operator]
        torch.cuda.synchronize()
    src = torch.empty(N * (576 + 8 + 1024), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    print("profiled launches done")


if __name__ == "__main__":
    main()
