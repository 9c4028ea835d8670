"""Launch settings of every kvcompat kernel, in one place (imports neither triton nor torch).

Each kernel family takes a block of ``block_tokens`` tokens per program and runs it on
``num_warps`` warps; everything else about a launch (row widths, tile counts, page
geometry) is a compile-time constant derived from the layout. The defaults were picked
from a sweep on an NVIDIA H200 (``benchmarks/bench_kernels_gpu.py --sweep``; see
``docs/kernels.md``). :func:`launch_settings` is the only place a launcher reads them, so a
benchmark can try other values through :data:`OVERRIDES` without touching the kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "DEFAULTS",
    "MIN_PROGRAMS",
    "OVERRIDES",
    "KernelFamily",
    "LaunchSettings",
    "launch_settings",
]

KernelFamily = Literal[
    "gather_rows",  # plain rows read: a word copy
    "read_fp8",  # e4m3 values with ue8m0 / fp32 / no scales (V4, V41, DSA, UNIFORM_FP8, indexer)
    "read_fp4",  # e2m1 pairs with e4m3 (V41_FP4) or power-of-two (fp4 indexer) scales
    "write_plain",  # a dtype cast per element (MHA, MLA, UNIFORM_FP8)
    "scatter_rows",  # plain rows write in the pool's own dtype: a word copy
    "move_rows",  # pool rows to pool rows (a direct transfer's pages): a word copy
    "write_fp8",  # per-tile scale then e4m3 (V4, V41, DSA, fp8 indexer)
    "write_fp4",  # per-tile e4m3 scale then e2m1 (V41_FP4), fp32 values or the interpreter
    "write_fp4_pairs",  # the same from bf16 / fp16 pairs on a GPU (packed comparisons)
    "write_fp4_ue8m0",  # power-of-two scale per 32, e2m1 by thresholds (DSv4 fp4 indexer)
]


@dataclass(frozen=True, slots=True)
class LaunchSettings:
    """Tokens per program, warps per program and cache hints of one kernel launch.

    ``evict_first`` marks the streamed side of a kernel (the pool rows a read gathers,
    the values a write loads) ``evict_first`` in L2, so it does not push out lines still
    being written.

    Example:
        >>> from kvcompat.kernels._config import LaunchSettings
        >>> LaunchSettings(block_tokens=8, num_warps=4)
        LaunchSettings(block_tokens=8, num_warps=4, evict_first=False)
    """

    block_tokens: int
    num_warps: int
    evict_first: bool = False


DEFAULTS: dict[KernelFamily, LaunchSettings] = {
    "gather_rows": LaunchSettings(block_tokens=4, num_warps=4),
    "read_fp8": LaunchSettings(block_tokens=2, num_warps=2),
    "read_fp4": LaunchSettings(block_tokens=4, num_warps=2),
    "write_plain": LaunchSettings(block_tokens=2, num_warps=2),
    "scatter_rows": LaunchSettings(block_tokens=2, num_warps=2),
    "move_rows": LaunchSettings(block_tokens=1, num_warps=8),
    "write_fp8": LaunchSettings(block_tokens=2, num_warps=2),
    "write_fp4": LaunchSettings(block_tokens=8, num_warps=4),
    "write_fp4_pairs": LaunchSettings(block_tokens=4, num_warps=2),
    "write_fp4_ue8m0": LaunchSettings(block_tokens=8, num_warps=4),
}
"""Per-family defaults: the winners of a sweep at 1M tokens on an H200 (GPU time from CUDA
graph replay, ``benchmarks/bench_kernels_gpu.py --sweep``; see docs/kernels.md), taken over
every layout a family serves (``gather_rows``: the best for both MHA and MLA rows).
``evict_first`` helped no family there."""


OVERRIDES: dict[KernelFamily, LaunchSettings] = {}
"""Settings that replace :data:`DEFAULTS` for this process (benchmark sweeps only)."""

MIN_PROGRAMS = 1024
"""Small batches get fewer tokens per program, down to one, until the launch has at
least this many programs (about eight per SM on an H200): a few hundred programs of many
tokens each leave most of the GPU idle while each waits on its loads."""


def launch_settings(
    family: KernelFamily, tokens: int | None = None, declared: tuple[int, int] | None = None
) -> LaunchSettings:
    """The launch settings of ``family`` for a batch of ``tokens`` tokens.

    An override if one is set, else what the layout ``declared`` (``(tokens per
    program, warps)`` from its ``KernelSpec``), else the family's default; with ``tokens``
    given, the tokens per program are halved while the launch would have fewer than
    :data:`MIN_PROGRAMS` programs (a function of the batch shape only, so CUDA-graph
    capture is unaffected).

    Example:
        >>> from kvcompat.kernels._config import OVERRIDES, LaunchSettings, launch_settings
        >>> OVERRIDES["read_fp4"] = LaunchSettings(block_tokens=32, num_warps=8)
        >>> launch_settings("read_fp4").num_warps, launch_settings("read_fp4", 4096).block_tokens
        (8, 4)
        >>> del OVERRIDES["read_fp4"]
        >>> launch_settings("write_fp8", declared=(8, 4))  # DSV4_INDEXER_FP8's 132-byte rows
        LaunchSettings(block_tokens=8, num_warps=4, evict_first=False)
    """
    settings = OVERRIDES.get(family)
    if settings is None:
        settings = DEFAULTS[family] if declared is None else LaunchSettings(*declared)
    if tokens is None:
        return settings
    block = settings.block_tokens
    while block > 1 and -(-tokens // block) < MIN_PROGRAMS:
        block //= 2
    if block == settings.block_tokens:
        return settings
    return LaunchSettings(block, settings.num_warps, settings.evict_first)
