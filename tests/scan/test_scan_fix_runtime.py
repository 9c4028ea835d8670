"""``--fix`` rewrites run: never failing where the original worked, on kvcompat's reference pools.

Each snippet of :data:`fix_cases.SNIPPETS` runs as written and as ``fix_source``
rewrites it, each on a fresh pool built alike; where the original works the rewrite
must return the same tensors and leave the same bytes. The pools include one
kvcompat refuses (an unknown class, as NPU and MiniMax pools are), where the rewrite
must keep working through the native path. SGLang's own pools:
``tests/real/test_scan_fix_real.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from fix_cases import SNIPPETS, check, compare, fixed_source, inputs, layer_of

import kvcompat
from kvcompat.testing import (
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
    ReferenceMLATokenToKVPool,
    reference_swa_pool,
)


class UnknownDevicePool:
    """A pool class kvcompat does not know (like the NPU and MiniMax pools it refuses)."""

    def __init__(self) -> None:
        self.start_layer = 0
        self.k_buffer = [torch.zeros(16, 2, 8) for _ in range(2)]
        self.v_buffer = [torch.zeros(16, 2, 8) for _ in range(2)]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v_buffer[layer_id - self.start_layer]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        i = layer_id - self.start_layer
        return self.k_buffer[i], self.v_buffer[i]

    def set_kv_buffer(self, layer: Any, loc: Any, cache_k: Any, cache_v: Any) -> None:
        i = layer.layer_id - self.start_layer
        loc = getattr(loc, "loc", loc)
        self.k_buffer[i][loc] = cache_k
        if cache_v is not None:
            self.v_buffer[i][loc] = cache_v


POOLS: dict[str, Callable[[], Any]] = {
    "ReferenceMHATokenToKVPool": lambda: ReferenceMHATokenToKVPool(
        size=32, page_size=16, head_num=2, head_dim=8, layer_num=2
    ),
    "ReferenceMLATokenToKVPool": lambda: ReferenceMLATokenToKVPool(
        size=32, page_size=16, kv_lora_rank=16, qk_rope_head_dim=8, layer_num=2
    ),
    "ReferenceDeepSeekV4SingleKVPool": lambda: ReferenceDeepSeekV4SingleKVPool(
        size=64, page_size=64, layer_num=2
    ),
    "ReferenceSWAKVPool": reference_swa_pool,
    "UnknownDevicePool": UnknownDevicePool,
}


class WriteLoc:
    """Stands in for SGLang's KVWriteLoc: a ``.loc`` tensor (the reference pools read it)."""

    def __init__(self, loc: torch.Tensor) -> None:
        self.loc = loc
        self.swa_loc = None


@pytest.mark.parametrize("pool_name", sorted(POOLS))
@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_rewrite_never_fails_where_the_original_worked(name: str, pool_name: str) -> None:
    check(compare(name, pool_name, POOLS[pool_name], inputs, WriteLoc))


def test_the_matrix_and_what_the_rewrite_gains() -> None:
    results = [
        compare(name, pool_name, build, inputs, WriteLoc)
        for name in SNIPPETS
        for pool_name, build in POOLS.items()
    ]
    assert sum(r.regression for r in results) == 0
    gained = {(r.name, r.pool) for r in results if r.now_works}
    # On the single-KV pool the native getters raise; the rewrite answers through kvcompat.
    assert ("get_value_buffer", "ReferenceDeepSeekV4SingleKVPool") in gained
    assert ("get_kv_buffer", "ReferenceDeepSeekV4SingleKVPool") in gained
    worked = sum(r.original.error is None for r in results)
    assert worked >= len(results) // 2


def test_kvcompat_refuses_the_unknown_pool() -> None:
    with pytest.raises(kvcompat.UnsupportedPoolError):
        kvcompat.adapt(UnknownDevicePool())


def test_adapt_inside_a_pool_class_is_never_written() -> None:
    # SGLang's own pools call their getters on self; a rewrite there would put
    # kvcompat.adapt(self) into the pool, which kvcompat may refuse (NPU, MiniMax).
    source = (
        "class NPUMHATokenToKVPool(MHATokenToKVPool):\n"
        "    def get_contiguous_buf_infos(self):\n"
        "        return [self.get_value_buffer(i).data_ptr() for i in range(2)]\n"
        "    def set_kv_buffer(self, layer, loc, cache_k, cache_v):\n"
        "        self.full.set_kv_buffer(layer, loc, cache_k, cache_v)\n"
    )
    fixed, remaining = kvcompat.scan.fix_source(source)
    assert fixed is source
    assert remaining == []


def test_compat_is_off_the_per_call_path() -> None:
    fixed = fixed_source(SNIPPETS["backend_method"])
    code = [line for line in fixed.splitlines() if not line.lstrip().startswith("#")]
    calls = [line for line in code if "kvcompat." in line and "(" in line]
    assert calls == ["    proxy = kvcompat.compat(pool)"]  # once per pool object, cached
    assert "kvcompat.adapt(" not in fixed  # the fallback is compat's, never the raw adapter


def test_the_helper_costs_no_compat_per_call() -> None:
    scope: dict[str, Any] = {}
    exec(compile(fixed_source(SNIPPETS["get_value_buffer"]), "<fixed>", "exec"), scope)
    pool = ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64, layer_num=2)
    layer = layer_of(0)
    scope["run"](pool, layer, None, None, None)  # the first call builds the proxy
    calls = []
    real = kvcompat.compat

    def counting(obj: Any) -> Any:
        calls.append(obj)
        return real(obj)

    scope["kvcompat"] = type("K", (), {"compat": staticmethod(counting)})
    for _ in range(10):
        scope["run"](pool, layer, None, None, None)
    assert calls == []  # cached per pool object: compat() never runs per call
    scope["run"](
        ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64, layer_num=2), layer, None, None, None
    )
    assert len(calls) == 1  # ...and a new pool gets its own (the counter can see a call)
    # (timings: benchmarks/scan_fix_cost.py; a wall-clock bound here would be flaky on CI)
