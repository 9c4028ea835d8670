"""One CUDA-graph case per operation ``kvcompat._capture`` declares capturable.

A case builds its static inputs on the device, returns the step to capture (called with
exactly the declared keyword arguments), a way to put new inputs in place, and the
check that the replay produced the bytes an eager run on the same inputs produces.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from _pools import as_bytes, make_pool

from kvcompat.kernels import gather_dequantize, quantize_scatter
from kvcompat.layouts import V4, dequantize, quantize


@dataclass
class Case:
    """What one capture test needs."""

    step: Callable[[], Any]
    refill: Callable[[int], None]
    check: Callable[[Any], None]


def _randperm(cap: int, n: int, seed: int, device: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(cap, generator=gen)[:n].to(device)


def _rand(n: int, dim: int, seed: int, device: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + 1000)
    return torch.randn(n, dim, generator=gen).to(torch.bfloat16).to(device)


def _getter(name: str, kw: Mapping[str, object], device: str) -> Case:
    pool = make_pool("mha", device)
    dst: dict[str, torch.Tensor] = {}

    def step() -> None:
        got = getattr(pool, name)(0, **kw)
        parts = tuple(got) if name == "get_kv_buffer" else (got,)
        if not dst:
            dst.update({str(i): torch.empty_like(p) for i, p in enumerate(parts)})
        for i, p in enumerate(parts):
            dst[str(i)].copy_(p)

    def refill(seed: int) -> None:
        x, v = _rand(8, 16, seed, device), _rand(8, 16, seed + 1, device)
        pool.write(0, _randperm(64, 8, seed, device), x, v)

    def check(_: Any) -> None:
        got = getattr(pool, name)(0, wait=False)
        parts = tuple(got) if name == "get_kv_buffer" else (got,)
        for i, p in enumerate(parts):
            assert torch.equal(as_bytes(dst[str(i)]), as_bytes(p))

    return Case(step, refill, check)


def _pool_read(kw: Mapping[str, object], device: str, *, with_out: bool) -> Case:
    pool = make_pool("v4", device)
    loc = _randperm(128, 32, 0, device)
    out = torch.empty(32, 1, 512, dtype=torch.bfloat16, device=device)

    def step() -> torch.Tensor:
        if with_out:
            return pool.read(0, loc, out=out, **kw)
        return pool.read(0, loc, **kw)

    def refill(seed: int) -> None:
        loc.copy_(_randperm(128, 32, seed, device))

    def check(result: torch.Tensor) -> None:
        want = pool.read(0, loc, impl="torch")
        assert torch.equal(as_bytes(result), as_bytes(want))

    return Case(step, refill, check)


def _read_kv(kw: Mapping[str, object], device: str) -> Case:
    pool = make_pool("mha", device)
    loc = _randperm(64, 16, 0, device)

    def step() -> Any:
        return pool.read_kv(0, loc, **kw)

    def refill(seed: int) -> None:
        loc.copy_(_randperm(64, 16, seed, device))

    def check(result: Any) -> None:
        want = pool.read_kv(0, loc, impl="torch")
        for got, exp in zip(result, want, strict=True):
            assert torch.equal(as_bytes(got), as_bytes(exp))

    return Case(step, refill, check)


def _pool_write(kw: Mapping[str, object], device: str) -> Case:
    pool = make_pool("mha", device)
    loc = _randperm(64, 16, 0, device)
    x, v = _rand(16, 16, 0, device), _rand(16, 16, 1, device)
    before: dict[str, torch.Tensor] = {}

    def step() -> None:
        pool.write(0, loc, x, v, **kw)

    def refill(seed: int) -> None:
        loc.copy_(_randperm(64, 16, seed, device))
        x.copy_(_rand(16, 16, seed, device))
        v.copy_(_rand(16, 16, seed + 1, device))
        before["k"] = pool.get_key_buffer(0).clone()
        before["v"] = pool.get_value_buffer(0).clone()

    def check(_: Any) -> None:
        spec = pool.layout(0)
        for what, values, buf in (("k", x, pool.get_key_buffer(0)),
                                  ("v", v, pool.get_value_buffer(0))):  # fmt: skip
            want = before[what]
            lay = spec.key if what == "k" else spec.value
            quantize(lay, values, want, loc, pool.page_size, impl="torch")
            assert torch.equal(as_bytes(buf), as_bytes(want))

    return Case(step, refill, check)


def _raw_read(kw: Mapping[str, object], device: str, *, launcher: bool) -> Case:
    buf = make_pool("v4", device).get_key_buffer(0)
    loc = _randperm(128, 32, 0, device)
    out = torch.empty(32, 512, dtype=torch.bfloat16, device=device)

    def step() -> torch.Tensor:
        if launcher:
            return gather_dequantize(V4, buf, loc, 64, out=out, **kw)
        return dequantize(V4, buf, loc, 64, out=out, **kw)

    def refill(seed: int) -> None:
        loc.copy_(_randperm(128, 32, seed, device))

    def check(result: torch.Tensor) -> None:
        want = dequantize(V4, buf, loc, 64, impl="torch")
        assert torch.equal(as_bytes(result), as_bytes(want))

    return Case(step, refill, check)


def _raw_write(kw: Mapping[str, object], device: str, *, launcher: bool) -> Case:
    buf = make_pool("v4", device).get_key_buffer(0)
    loc = _randperm(128, 32, 0, device)
    x = _rand(32, 512, 0, device)
    before: dict[str, torch.Tensor] = {}

    def step() -> None:
        if launcher:
            quantize_scatter(V4, x, buf, loc, 64, **kw)
        else:
            quantize(V4, x, buf, loc, 64, **kw)

    def refill(seed: int) -> None:
        loc.copy_(_randperm(128, 32, seed, device))
        x.copy_(_rand(32, 512, seed, device))
        before["buf"] = buf.clone()

    def check(_: Any) -> None:
        want = before["buf"]
        quantize(V4, x, want, loc, 64, impl="torch")
        assert torch.equal(as_bytes(buf), as_bytes(want))

    return Case(step, refill, check)


CASES: dict[str, Callable[[Mapping[str, object], str], Case]] = {
    "KVPool.get_key_buffer": lambda kw, d: _getter("get_key_buffer", kw, d),
    "KVPool.get_value_buffer": lambda kw, d: _getter("get_value_buffer", kw, d),
    "KVPool.get_kv_buffer": lambda kw, d: _getter("get_kv_buffer", kw, d),
    "KVPool.read": lambda kw, d: _pool_read(kw, d, with_out=True),
    "KVPool.read_kv": _read_kv,
    "KVPool.write": _pool_write,
    "kvcompat.layouts.dequantize": lambda kw, d: _raw_read(kw, d, launcher=False),
    "kvcompat.layouts.quantize": lambda kw, d: _raw_write(kw, d, launcher=False),
    "kvcompat.kernels.gather_dequantize": lambda kw, d: _raw_read(kw, d, launcher=True),
    "kvcompat.kernels.quantize_scatter": lambda kw, d: _raw_write(kw, d, launcher=True),
}
"""Declared-capturable operation -> its case (tests/ops checks the keys match)."""

EXTRA_CASES: dict[str, Callable[[Mapping[str, object], str], Case]] = {
    "KVPool.read without out=": lambda kw, d: _pool_read(kw, d, with_out=False),
}
