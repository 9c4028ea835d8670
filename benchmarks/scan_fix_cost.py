"""What a ``kvcompat scan --fix`` rewrite costs per call, next to ``kvcompat.adapt()`` itself.

Usage:
    python benchmarks/scan_fix_cost.py

Times, on kvcompat's reference pools (32 layers), the native ``get_value_buffer``,
one ``kvcompat.adapt(pool)``, and the rewritten call ``--fix`` emits
(``_kvcompat_get_value_buffer(pool, i)``: the native call first, kvcompat through
one cached adapter per pool object where the native call raises). Medians of 7
rounds, in microseconds per call.
"""

from __future__ import annotations

import statistics
import timeit
from collections.abc import Callable
from typing import Any

import kvcompat
from kvcompat.scan import fix_source
from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool, ReferenceMHATokenToKVPool

SNIPPET = "def run(pool, layer_id):\n    return pool.get_value_buffer(layer_id)\n"


def per_call_us(func: Callable[[], object], number: int) -> float:
    return statistics.median(timeit.repeat(func, number=number, repeat=7)) / number * 1e6


def main() -> None:
    fixed, _ = fix_source(SNIPPET)
    scope: dict[str, Any] = {}
    exec(compile(fixed, "<fixed>", "exec"), scope)
    run = scope["run"]
    pools = {
        "MHA": ReferenceMHATokenToKVPool(size=4096, page_size=16, layer_num=32),
        "DSv4 single-KV": ReferenceDeepSeekV4SingleKVPool(size=4096, page_size=64, layer_num=32),
    }
    print("| Pool | native get_value_buffer | kvcompat.adapt(pool) | --fix rewrite |")
    print("|---|---|---|---|")
    for name, pool in pools.items():
        try:
            native = f"{per_call_us(lambda p=pool: p.get_value_buffer(3), 20000):.2f} µs"
        except NotImplementedError:
            native = "raises NotImplementedError"
        adapt = per_call_us(lambda p=pool: kvcompat.adapt(p), 200)
        rewrite = per_call_us(lambda p=pool: run(p, 3), 20000)
        print(f"| {name} | {native} | {adapt:.1f} µs | {rewrite:.2f} µs |")


if __name__ == "__main__":
    main()
