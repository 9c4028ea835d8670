"""Host cost of one small ``pool.read`` / ``pool.write`` against the torch op it replaces.

Usage:
    python benchmarks/bench_host_cost.py [--tokens 8] [--batches 7] [--calls 2000] [--json PATH]
        [--threads 1]

On reference MHA (``8 x 128`` heads, bf16) and MLA (``512 + 64``, bf16) pools of 4,096
tokens, in one process, it times per call (best of ``--batches`` batches of ``--calls``
calls each, the batches of all cases interleaved):

* ``read``  with ``validate=False`` and with the default validation, against
  ``key_buffer.index_select(0, loc)`` (what a read of plain rows is);
* ``write`` with ``validate=False`` and validated, against ``index_copy_`` of the key
  rows (and of the value rows, for MHA: the write stores both).

It prints microseconds per call, the ratio to the torch op, and issue 36's CPU targets:
``validate=False`` within ``2 x torch + 5 us``, validated within twice that. With
``--json PATH`` it also writes every figure, the machine and the versions as JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch

import kvcompat
from kvcompat.testing import ReferenceMHATokenToKVPool, ReferenceMLATokenToKVPool

LAYER = 0


def _per_call_us(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def _cases(tokens: int) -> dict[str, Callable[[], object]]:
    """Every timed call, by name: ``<pool> <op> <variant>``."""
    generator = torch.Generator().manual_seed(0)
    found: dict[str, Callable[[], object]] = {}
    mha = ReferenceMHATokenToKVPool(size=4096, page_size=16, head_num=8, head_dim=128)
    mla = ReferenceMLATokenToKVPool(size=4096, page_size=16)
    for name, native in (("mha", mha), ("mla", mla)):
        pool = kvcompat.adapt(native)
        loc = torch.randperm(4096, generator=generator)[:tokens]
        pair = pool.get_kv_buffer(LAYER)
        key_buf = pool.get_key_buffer(LAYER)
        keys = torch.randn(tokens, *key_buf.shape[1:], generator=generator).to(key_buf.dtype)
        values = None if pair.shared else torch.randn_like(keys.float()).to(keys.dtype)
        rows = key_buf
        value_buf = None if pair.shared else pool.get_value_buffer(LAYER)

        def native_write(
            rows: torch.Tensor = rows,
            value_buf: torch.Tensor | None = value_buf,
            loc: torch.Tensor = loc,
            keys: torch.Tensor = keys,
            values: torch.Tensor | None = values,
        ) -> None:
            rows.index_copy_(0, loc, keys)
            if value_buf is not None and values is not None:
                value_buf.index_copy_(0, loc, values)

        found[f"{name} read torch"] = lambda rows=rows, loc=loc: rows.index_select(0, loc)
        found[f"{name} read validate=False"] = lambda pool=pool, loc=loc: pool.read(
            LAYER, loc, validate=False
        )
        found[f"{name} read validated"] = lambda pool=pool, loc=loc: pool.read(LAYER, loc)
        found[f"{name} write torch"] = native_write
        found[f"{name} write validate=False"] = lambda p=pool, i=loc, k=keys, v=values: p.write(
            LAYER, i, k, v, validate=False
        )
        found[f"{name} write validated"] = lambda p=pool, i=loc, k=keys, v=values: p.write(
            LAYER, i, k, v
        )
    return found


def measure(tokens: int, batches: int, calls: int) -> dict[str, float]:
    """Best-of-``batches`` microseconds per call of every case, batches interleaved."""
    cases = _cases(tokens)
    best = dict.fromkeys(cases, float("inf"))
    for fn in cases.values():
        fn()  # warm up (first-call logging, caches)
    for _ in range(batches):
        for name, fn in cases.items():
            best[name] = min(best[name], _per_call_us(fn, calls))
    return best


def report(best: dict[str, float]) -> list[dict[str, object]]:
    """One row per (pool, op, variant): microseconds, ratio to torch, target, met."""
    rows: list[dict[str, object]] = []
    for pool in ("mha", "mla"):
        for op in ("read", "write"):
            torch_us = best[f"{pool} {op} torch"]
            fast_target = 2 * torch_us + 5
            for variant, target in (
                ("validate=False", fast_target),
                ("validated", 2 * fast_target),
            ):
                us = best[f"{pool} {op} {variant}"]
                rows.append({
                    "pool": pool, "op": op, "variant": variant, "us": round(us, 2),
                    "torch_us": round(torch_us, 2), "ratio": round(us / torch_us, 2),
                    "target_us": round(target, 2), "met": us <= target,
                })  # fmt: skip
    return rows


def multi_layer(tokens: int, batches: int, calls: int, layers: int = 61) -> list[dict[str, object]]:
    """A read and a write of every layer of a ``layers``-layer MHA pool: loop vs one call."""
    native = ReferenceMHATokenToKVPool(
        size=4096, page_size=16, head_num=8, head_dim=128, layer_num=layers
    )
    pool = kvcompat.adapt(native)
    g = torch.Generator().manual_seed(1)
    loc = torch.randperm(4096, generator=g)[:tokens]
    keys = torch.randn(layers, tokens, 8, 128, generator=g).to(torch.bfloat16)
    values = keys.clone()
    ids = pool.layer_ids
    step = pool.plan()

    def loop_read() -> None:
        for layer in ids:
            pool.read(layer, loc)

    def loop_write() -> None:
        for i, layer in enumerate(ids):
            pool.write(layer, loc, keys[i], values[i])

    cases = {
        "read loop": loop_read,
        "read plan": lambda: step.read(loc),
        "write loop": loop_write,
        "write plan": lambda: step.write(loc, keys, values),
    }
    best = dict.fromkeys(cases, float("inf"))
    for fn in cases.values():
        fn()
    for _ in range(batches):
        for name, fn in cases.items():
            best[name] = min(best[name], _per_call_us(fn, max(1, calls // layers)))
    return [
        {"pool": "mha", "layers": layers, "tokens": tokens, "case": name, "us": round(us, 1)}
        for name, us in best.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--batches", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (default 1: host cost, not op time)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    best = measure(args.tokens, args.batches, args.calls)
    rows = report(best)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}; {args.tokens} tokens, best of "
        f"{args.batches} batches of {args.calls} calls"
    )
    header = f"{'pool':<5}{'op':<6}{'variant':<16}{'µs':>8}{'torch µs':>10}{'ratio':>7}"
    header += f"{'target µs':>11}  met"
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row['pool']:<5}{row['op']:<6}{row['variant']:<16}{row['us']:>8.1f}"
            f"{row['torch_us']:>10.1f}{row['ratio']:>7.1f}{row['target_us']:>11.1f}  "
            f"{'yes' if row['met'] else 'NO'}"
        )
    multi = multi_layer(args.tokens, args.batches, args.calls)
    print(
        f"\nevery layer of a {multi[0]['layers']}-layer MHA pool, validated, {args.tokens} tokens:"
    )
    for row in multi:
        print(f"  {row['case']:<11}{row['us']:>10.1f} us")
    if args.json is not None:
        payload = {
            "multi_layer": multi,
            "benchmark": "bench_host_cost",
            "torch": torch.__version__,
            "python": platform.python_version(),
            "machine": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(),
            "tokens": args.tokens,
            "batches": args.batches,
            "calls": args.calls,
            "rows": rows,
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
