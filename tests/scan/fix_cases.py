"""Run a snippet and its ``kvcompat scan --fix`` rewrite on the same pools; compare outcomes.

The promise checked: a rewrite never fails where the original worked, and where the
original works the rewrite returns the same tensors and leaves the same bytes. Used
with kvcompat's reference pools (``tests/scan/test_scan_fix_runtime.py``) and with
SGLang 0.5.23's own pools (``tests/real/test_scan_fix_real.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import torch

from kvcompat.compat import LogicalView
from kvcompat.scan import fix_source

# Each snippet defines run(pool, layer, loc, k, v); ``make_write_loc`` is given to it.
SNIPPETS: dict[str, str] = {
    "get_value_buffer": (
        "def run(pool, layer, loc, k, v):\n    return pool.get_value_buffer(layer.layer_id)\n"
    ),
    "v_head_dim_probe": (
        "def run(pool, layer, loc, k, v):\n"
        "    return pool.get_value_buffer(layer.layer_id).shape[-1]\n"
    ),
    "get_kv_buffer": (
        "def run(pool, layer, loc, k, v):\n"
        "    k_cache, v_cache = pool.get_kv_buffer(layer.layer_id)\n"
        "    return k_cache, v_cache\n"
    ),
    "set_kv_buffer": (
        "def run(pool, layer, loc, k, v):\n    pool.set_kv_buffer(layer, loc, k, v)\n"
    ),
    # A KVWriteLoc held in a variable: the rewrite cannot see what it is.
    "set_kv_buffer_write_loc_variable": (
        "def run(pool, layer, loc, k, v):\n"
        "    write_loc = make_write_loc(loc)\n"
        "    pool.set_kv_buffer(layer, write_loc, k, v)\n"
    ),
    # MLA-style: a value the native MLA pool drops (kvcompat's write would refuse it).
    "set_kv_buffer_latent_with_value": (
        "def run(pool, layer, loc, k, v):\n    pool.set_kv_buffer(layer, loc, k, k)\n"
    ),
    "set_kv_buffer_value_none": (
        "def run(pool, layer, loc, k, v):\n    pool.set_kv_buffer(layer, loc, k, None)\n"
    ),
    # A backend that keeps the pool on self and calls it per layer.
    "backend_method": (
        "class Backend:\n"
        "    def __init__(self, pool):\n"
        "        self.token_to_kv_pool = pool\n"
        "    def forward(self, layer, loc, k, v):\n"
        "        self.token_to_kv_pool.set_kv_buffer(layer, loc, k, v)\n"
        "        return self.token_to_kv_pool.get_kv_buffer(layer.layer_id)\n"
        "def run(pool, layer, loc, k, v):\n"
        "    backend = Backend(pool)\n"
        "    return [backend.forward(layer, loc, k, v) for _ in range(3)]\n"
    ),
}


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What running one snippet did: its result or its exception, and the pool's bytes."""

    result: Any
    error: BaseException | None
    state: tuple[bytes, ...]


@dataclasses.dataclass(frozen=True)
class Compared:
    name: str
    pool: str
    original: Outcome
    fixed: Outcome

    @property
    def regression(self) -> bool:
        """The rewrite raised where the original did not."""
        return self.original.error is None and self.fixed.error is not None

    @property
    def now_works(self) -> bool:
        return self.original.error is not None and self.fixed.error is None


def tensors(obj: Any, depth: int = 2) -> Iterator[torch.Tensor]:
    """Every tensor a pool holds (attributes, lists of them, sub-pools), in a fixed order."""
    seen: set[int] = set()

    def walk(value: Any, level: int) -> Iterator[torch.Tensor]:
        if isinstance(value, torch.Tensor):
            if id(value) not in seen:
                seen.add(id(value))
                yield value
        elif isinstance(value, (list, tuple)):
            for item in value:
                yield from walk(item, level)
        elif isinstance(value, dict):
            for key in sorted(value, key=repr):
                yield from walk(value[key], level)
        elif level > 0 and hasattr(value, "__dict__") and not isinstance(value, type):
            for key in sorted(vars(value)):
                yield from walk(vars(value)[key], level - 1)

    yield from walk(obj, depth)


def state(pool: Any) -> tuple[bytes, ...]:
    return tuple(
        t.detach().contiguous().view(torch.uint8).numpy().tobytes()
        for t in tensors(pool)
        if t.numel() and t.device.type == "cpu" and not t.is_sparse
    )


def summary(value: Any) -> Any:
    """What a result is, frozen: for a tensor its address, shape, dtype, stride and bytes.

    A ``kvcompat.compat`` logical view (what the rewrite's fallback returns on packed
    pools) is frozen as its logical shape and dtype and its storage, read explicitly: any
    other tensor operation on it raises ``CompatViewError`` by design.
    """
    if isinstance(value, LogicalView):
        storage = value.storage_tensor
        data = storage.detach().contiguous().view(torch.uint8).numpy().tobytes()
        return ("view", storage.data_ptr(), tuple(value.shape), value.dtype, data)
    if isinstance(value, torch.Tensor):
        data = value.detach().contiguous().view(torch.uint8).numpy().tobytes()
        return ("tensor", value.data_ptr(), tuple(value.shape), value.dtype, value.stride(), data)
    if isinstance(value, (list, tuple)):
        return tuple(summary(item) for item in value)
    return value


def _run(
    source: str, pool: Any, layer: Any, loc: Any, key: Any, value: Any, namespace: dict[str, Any]
) -> Outcome:
    scope = dict(namespace)
    exec(compile(source, "<snippet>", "exec"), scope)
    try:
        result = scope["run"](pool, layer, loc, key, value)
    except Exception as exc:
        return Outcome(None, exc, state(pool))
    return Outcome(summary(result), None, state(pool))


def fixed_source(source: str) -> str:
    fixed, remaining = fix_source(source)
    assert fixed != source, source  # every snippet is rewritten
    assert remaining == [], remaining
    return fixed


def compare(
    name: str,
    pool_name: str,
    build: Callable[[], Any],
    inputs: Callable[[Any], tuple[Any, Any, Any, Any]],
    make_write_loc: Callable[[torch.Tensor], Any],
) -> Compared:
    """Run snippet ``name``, restore the pool's bytes, and run its rewrite on the same pool.

    One pool for both runs: native pools allocate with ``torch.empty``, so two pools
    built alike need not hold the same bytes; and one pool makes tensor addresses
    comparable (the rewrite must hand back the very storage the original did).
    """
    source = SNIPPETS[name]
    namespace = {"make_write_loc": make_write_loc}
    pool = build()
    layer, loc, key, value = inputs(pool)
    held = list(tensors(pool))
    saved = [t.clone() for t in held]
    original = _run(source, pool, layer, loc, key.clone(), value.clone(), namespace)
    with torch.no_grad():
        for tensor, copy in zip(held, saved, strict=True):
            tensor.copy_(copy)
    fixed = _run(fixed_source(source), pool, layer, loc, key.clone(), value.clone(), namespace)
    return Compared(name, pool_name, original, fixed)


def same_result(a: Any, b: Any) -> bool:
    """Summaries equal: the same storage, shape, dtype, stride and bytes."""
    return bool(a == b)


def layer_of(layer_id: int) -> SimpleNamespace:
    return SimpleNamespace(layer_id=layer_id)


def inputs(pool: Any) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A layer, two token slots, and keys/values shaped like the pool's rows."""
    layer = layer_of(int(getattr(pool, "start_layer", 0) or 0))
    loc = torch.tensor([1, 3])
    try:
        key_buffer = pool.get_key_buffer(layer.layer_id)
    except AttributeError:
        key_buffer = pool.k_buffer[0]
    except NotImplementedError:  # the DeepSeek-V4 composite: no getter answers
        key_buffer = torch.empty(0, 0, dtype=torch.uint8)
    if key_buffer.dtype in (torch.uint8, torch.float8_e4m3fn) and key_buffer.dim() == 2:
        key = torch.randn(2, 1, 512, generator=torch.Generator().manual_seed(0))  # DSv4: dense
        return layer, loc, key.to(torch.bfloat16), key.to(torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    key = torch.randn(2, *key_buffer.shape[1:], generator=gen).to(key_buffer.dtype)
    try:
        value_buffer = pool.get_value_buffer(layer.layer_id)
    except NotImplementedError:
        return layer, loc, key, key
    value = torch.randn(2, *value_buffer.shape[1:], generator=gen).to(value_buffer.dtype)
    return layer, loc, key, value


def check(compared: Compared) -> None:
    """The rewrite did not raise where the original worked, and did the same thing."""
    assert not compared.regression, (
        f"{compared.name} on {compared.pool}: the rewrite raised "
        f"{compared.fixed.error!r} where the original worked"
    )
    if compared.original.error is None:
        assert same_result(compared.original.result, compared.fixed.result), compared
        assert compared.original.state == compared.fixed.state, compared
