"""Per-call cost of kvcompat's getters vs the native getters, side by side in one process.

Usage:
    python benchmarks/bench_getters.py            # reference pools (pure torch)
    python benchmarks/bench_getters.py --sglang   # SGLang 0.5.23's own classes (if installed)

For each pool it times ``native.get_key_buffer(l)`` and ``adapter.get_key_buffer(l)``
(and the other getters) in interleaved rounds, and reports medians per call and the
overhead in ns. It also times the cached ``kvcompat.is_single_kv_pool``. Target
(issue 2): overhead <= 100 ns per get_key_buffer call, detector <= 0.3 us.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import kvcompat
from kvcompat.testing import (
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
    ReferenceMLATokenToKVPool,
)

NUMBER = 20_000
ROUNDS = 15


def per_call_ns(fn: Callable[[], object]) -> float:
    return timeit.timeit(fn, number=NUMBER) / NUMBER * 1e9


def side_by_side(a: Callable[[], object], b: Callable[[], object]) -> tuple[float, float]:
    """Median ns per call of a and b, measured in alternating rounds."""
    xs: list[float] = []
    ys: list[float] = []
    for _ in range(ROUNDS):
        xs.append(per_call_ns(a))
        ys.append(per_call_ns(b))
    return statistics.median(xs), statistics.median(ys)


def reference_pools() -> dict[str, Any]:
    return {
        "MHA": ReferenceMHATokenToKVPool(
            64, 16, torch.bfloat16, head_num=2, head_dim=8, layer_num=2
        ),
        "MHA fp8": ReferenceMHATokenToKVPool(
            64, 16, torch.float8_e4m3fn, head_num=2, head_dim=8, layer_num=2
        ),
        "MLA": ReferenceMLATokenToKVPool(
            64, 16, torch.bfloat16, kv_lora_rank=32, qk_rope_head_dim=16, layer_num=2
        ),
        "DSv4": ReferenceDeepSeekV4SingleKVPool(64, 64, layer_num=2),
    }


def sglang_pools() -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from _sglang.builders import build_dsv4_single_pool, build_mha_pool, build_mla_pool
    from _sglang.env import prepare_sglang

    prepare_sglang()
    return {
        "MHA": build_mha_pool(),
        "MHA fp8": build_mha_pool(dtype=torch.float8_e4m3fn),
        "MLA": build_mla_pool(),
        "DSv4": build_dsv4_single_pool(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sglang", action="store_true", help="use SGLang's own pool classes")
    args = parser.parse_args()
    pools = sglang_pools() if args.sglang else reference_pools()
    source = "SGLang 0.5.23" if args.sglang else "kvcompat reference pools"
    print(f"getter cost, {source}; torch {torch.__version__}; python {sys.version.split()[0]}")
    print(f"median of {ROUNDS} interleaved rounds x {NUMBER} calls; ns per call")
    print(f"{'pool':<8} {'getter':<17} {'native':>8} {'kvcompat':>9} {'overhead':>9}")
    worst = 0.0
    for name, native in pools.items():
        pool = kvcompat.adapt(native)
        layer = pool.layer_ids[-1]
        for getter in ("get_key_buffer", "get_value_buffer", "get_kv_buffer"):
            native_fn = getattr(native, getter)
            ours = getattr(pool, getter)
            call_native = functools.partial(native_fn, layer)
            call_ours = functools.partial(ours, layer)
            try:
                call_native()
            except NotImplementedError:
                native_ns = float("nan")
                ours_ns = statistics.median(per_call_ns(call_ours) for _ in range(ROUNDS))
            else:
                native_ns, ours_ns = side_by_side(call_native, call_ours)
            overhead = ours_ns - native_ns
            if getter == "get_key_buffer":
                worst = max(worst, overhead)
            shown = "raises" if native_ns != native_ns else f"{native_ns:8.0f}"
            extra = "" if native_ns != native_ns else f"{overhead:+9.0f}"
            print(f"{name:<8} {getter:<17} {shown:>8} {ours_ns:9.0f} {extra:>9}")
    native = pools["DSv4"]
    kvcompat.is_single_kv_pool(native)
    detect = statistics.median(
        per_call_ns(lambda: kvcompat.is_single_kv_pool(native)) for _ in range(ROUNDS)
    )
    print(f"cached is_single_kv_pool: {detect:.0f} ns per call")
    print(f"worst get_key_buffer overhead: {worst:+.0f} ns (target <= +100 ns)")
    return 0 if worst <= 100 and detect <= 300 else 1


if __name__ == "__main__":
    sys.exit(main())
