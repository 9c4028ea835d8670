"""Shared pieces of the adversarial tier: pool cases, fingerprints, fault injection.

A *fingerprint* hashes every byte of every tensor storage reachable from an object (the
native pool, its sub-pools, lists, dicts, namespaces; the adapter's cached views too) and
records each tensor's metadata, so "0 bytes changed" is checked across everything the pool
owns, not just the buffer a write aimed at.
"""

from __future__ import annotations

import collections
import enum
import hashlib
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

import kvcompat
from kvcompat import layouts
from kvcompat.layouts._registry import LAYOUTS as REGISTERED_LAYOUTS
from kvcompat.testing import (
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
    ReferenceMLATokenToKVPool,
    reference_swa_pool,
)

TRIED: collections.Counter[str] = collections.Counter()
"""How many bad inputs / faults / races each kind of test tried (printed by conftest)."""


def tried(kind: str, count: int = 1) -> None:
    TRIED[kind] += count


# ----------------------------------------------------------------------------- fingerprints

_LEAVES = (str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device, enum.Enum)
_SKIP = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def reachable_tensors(*roots: object) -> list[torch.Tensor]:
    """Every tensor reachable from ``roots`` through attributes, slots and containers."""
    found: list[torch.Tensor] = []
    seen: set[int] = set()
    stack: list[object] = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _LEAVES + _SKIP):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found.append(obj)
            continue
        if isinstance(obj, dict | types.MappingProxyType):
            stack.extend(obj.keys())
            stack.extend(obj.values())
            continue
        if isinstance(obj, list | tuple | set | frozenset | collections.deque):
            stack.extend(obj)
            continue
        module = type(obj).__module__ or ""
        if not module.startswith(("sglang", "kvcompat", "types", "adversarial", "functools")):
            continue  # locks, generators, foreign objects: no pool storage lives there
        stack.extend(getattr(obj, "__dict__", {}).values())
        for cls in type(obj).__mro__:
            names = getattr(cls, "__slots__", ())
            stack.extend(getattr(obj, name) for name in names if hasattr(obj, name))
    return found


def _storage_bytes(tensor: torch.Tensor) -> bytes:
    raw = torch.empty(0, dtype=torch.uint8, device=tensor.device)
    raw.set_(tensor.untyped_storage())
    return raw.cpu().numpy().tobytes()


@dataclass(frozen=True)
class Fingerprint:
    storages: dict[tuple[str, int, int], str]
    views: tuple[tuple[Any, ...], ...]

    def diff(self, other: Fingerprint) -> list[str]:
        changed = [
            f"storage {key}"
            for key in self.storages.keys() | other.storages.keys()
            if self.storages.get(key) != other.storages.get(key)
        ]
        if self.views != other.views:
            changed.append("tensor metadata (shapes, strides, dtypes, identities)")
        return changed


def fingerprint(*roots: object) -> Fingerprint:
    """Hashes of every reachable storage (whole storage, not just the view) + view metadata."""
    storages: dict[tuple[str, int, int], str] = {}
    views = []
    for tensor in reachable_tensors(*roots):
        if tensor.is_sparse or tensor.is_nested or tensor.device.type == "meta":
            views.append((id(tensor), "special", tuple(tensor.shape), str(tensor.dtype)))
            continue
        storage = tensor.untyped_storage()
        key = (str(tensor.device), storage.data_ptr(), storage.nbytes())
        if key not in storages:
            storages[key] = hashlib.blake2b(_storage_bytes(tensor), digest_size=16).hexdigest()
        views.append(
            (
                id(tensor),
                key,
                tensor.storage_offset(),
                tuple(tensor.shape),
                tensor.stride(),
                str(tensor.dtype),
            )
        )
    return Fingerprint(storages, tuple(sorted(views, key=repr)))


def assert_unchanged(before: Fingerprint, after: Fingerprint, what: str) -> None:
    changed = before.diff(after)
    assert not changed, f"{what}: {len(changed)} reachable storages changed: {changed[:4]}"


# ----------------------------------------------------------------------------- pool cases

sglang = pytest.mark.sglang


@dataclass(frozen=True)
class Case:
    """A pool to attack: how to build it and which (component, layer) pairs to write."""

    id: str
    build: Callable[[], Any]
    real: bool = False
    targets: Callable[[kvcompat.KVPoolProtocol], list[tuple[kvcompat.KVPoolProtocol, int]]] = field(
        default=lambda pool: [(pool, pool.layer_ids[0])]
    )

    @property
    def param(self) -> Any:
        return pytest.param(self, id=self.id, marks=(sglang,) if self.real else ())


def _every_component(pool: kvcompat.KVPoolProtocol) -> list[tuple[kvcompat.KVPoolProtocol, int]]:
    found = []
    for part in pool.components.values():
        for layer in part.layer_ids[:1]:
            try:
                part.layout(layer)
            except kvcompat.LayoutError:
                continue  # a part kvcompat has no codec for
            found.append((part, layer))
    return found


def _leaf_and_parts(pool: kvcompat.KVPoolProtocol) -> list[tuple[kvcompat.KVPoolProtocol, int]]:
    """A leaf pool with parts of its own (a DSA pool's indexer): the leaf, then each part."""
    return [(pool, pool.layer_ids[0]), *_every_component(pool)]


def _builders() -> Any:
    from _sglang import builders

    return builders


REFERENCE_CASES = [
    Case(
        "ref-mha-bf16",
        lambda: ReferenceMHATokenToKVPool(48, 16, torch.bfloat16, 2, 8, 2, start_layer=3),
    ),
    Case(
        "ref-mha-fp8",
        lambda: ReferenceMHATokenToKVPool(48, 16, torch.float8_e4m3fn, 2, 8, 2),
    ),
    Case(
        "ref-mla-bf16",
        lambda: ReferenceMLATokenToKVPool(
            48, 16, torch.bfloat16, kv_lora_rank=32, qk_rope_head_dim=16, layer_num=2
        ),
    ),
    Case("ref-dsv4-v4", lambda: ReferenceDeepSeekV4SingleKVPool(128, 64, layer_num=2)),
    Case("ref-swa", reference_swa_pool, targets=_every_component),
]

REAL_CASES = [
    Case("sglang-mha-bf16", lambda: _builders().build_mha_pool(), real=True),
    Case(
        "sglang-mha-fp8",
        lambda: _builders().build_mha_pool(dtype=torch.float8_e4m3fn),
        real=True,
    ),
    Case("sglang-k-only", lambda: _builders().build_k_only_pool(), real=True),
    Case("sglang-mla", lambda: _builders().build_mla_pool(start_layer=1), real=True),
    Case(
        "sglang-dsa-bf16",
        lambda: _builders().build_dsa_pool(start_layer=1),
        real=True,
        targets=_leaf_and_parts,
    ),
    # V4 is the default layout, and the only one before 0.5.21 (no kv_layout parameter).
    Case("sglang-dsv4-v4", lambda: _builders().build_dsv4_single_pool(), real=True),
    *(
        Case(
            f"sglang-dsv4-{layout}",
            lambda layout=layout: _builders().build_dsv4_single_pool(kv_layout=layout),  # type: ignore[misc]
            real=True,
        )
        for layout in ("v41", "v41_fp4", "v41_new", "v41_fp4_new")
    ),
    Case("sglang-dsv4-uniform-fp8", lambda: _builders().build_dsv4_uniform_fp8_pool(), real=True),
    Case("sglang-hisparse-c4", lambda: _builders().build_hisparse_c4_pool(), real=True),
    Case("sglang-swa", lambda: _builders().build_swa_pool(), real=True, targets=_every_component),
    Case(
        "sglang-hybrid-linear",
        lambda: _builders().build_hybrid_linear_pool(),
        real=True,
        targets=_every_component,
    ),
    Case(
        "sglang-dsv4-token-pool",
        lambda: _builders().build_dsv4_token_pool(),
        real=True,
        targets=_every_component,
    ),
]

ALL_CASES = REFERENCE_CASES + REAL_CASES


def capacity(pool: kvcompat.KVPoolProtocol, layer: int) -> int:
    buf = pool.get_key_buffer(layer, wait=False)
    spec = pool.layout(layer).key
    return buf.shape[0] * spec.tokens_per_row(pool.page_size)


def dense(
    pool: kvcompat.KVPoolProtocol, layer: int, n: int, *, seed: int, part: str = "key"
) -> torch.Tensor:
    spec = getattr(pool.layout(layer), part)
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, spec.heads, spec.dim // spec.heads, generator=gen).to(torch.bfloat16)


@dataclass
class Write:
    """One valid write: arguments for ``part.write(layer, loc, key, value)``."""

    part: kvcompat.KVPoolProtocol
    layer: int
    loc: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor | None

    def __call__(self, **kwargs: Any) -> None:
        self.part.write(self.layer, self.loc, self.key, self.value, **kwargs)


def valid_write(part: kvcompat.KVPoolProtocol, layer: int, *, n: int = 5, seed: int = 0) -> Write:
    cap = capacity(part, layer)
    gen = torch.Generator().manual_seed(seed)
    loc = torch.randperm(cap, generator=gen)[:n]
    key = dense(part, layer, n, seed=seed)
    value = dense(part, layer, n, seed=seed + 1, part="value") if part.layout(layer).value else None
    return Write(part, layer, loc, key, value)


# ----------------------------------------------------------------------------- faults


class InjectedFaultError(RuntimeError):
    """Raised by a patched torch op or codec at the chosen call (an out-of-memory stand-in)."""


class InjectedInterruptError(BaseException):
    """A fault that is not an ``Exception`` (as KeyboardInterrupt is not)."""


@dataclass
class Counter:
    calls: int = 0
    fail_at: int = 0  # 0: never
    partial: bool = False
    error: type[BaseException] = InjectedFaultError


LAYOUTS = {
    **REGISTERED_LAYOUTS,  # every registered byte layout: a new one joins the tier by itself
    "mha_2x8_bf16": layouts.mha_layout(2, 8, torch.bfloat16),
    "mha_2x8_e4m3fn": layouts.mha_layout(2, 8, torch.float8_e4m3fn),
    "mla_32+16_fp16": layouts.mla_layout(32, 16, torch.float16),
}
"""Every layout family, for the layout-level tier (``quantize`` on a bare buffer)."""


def _codec_classes() -> list[type]:
    return sorted({type(spec.codec) for spec in LAYOUTS.values()}, key=lambda c: c.__qualname__)


STAGES = ("encode", "save", "scatter")
"""encode: a codec's ``encode`` (once per part and CPU chunk); save: ``index_select``
(reading back the bytes a scatter will overwrite); scatter: ``index_copy_``."""


@contextmanager
def inject(monkeypatch: pytest.MonkeyPatch, stage: str, counter: Counter) -> Iterator[None]:
    """Count calls of one stage's op, raising ``counter.error`` at call ``counter.fail_at``.

    With ``partial``, a failing ``index_copy_`` first stores the first half of its rows.
    """
    with monkeypatch.context() as patch:
        if stage == "encode":
            for cls in _codec_classes():
                original = cls.encode

                def encode(self: Any, *args: Any, _original: Any = original, **kw: Any) -> Any:
                    counter.calls += 1
                    if counter.calls == counter.fail_at:
                        raise counter.error("injected: encode")
                    return _original(self, *args, **kw)

                patch.setattr(cls, "encode", encode)
        elif stage == "save":
            original_select = torch.Tensor.index_select

            def index_select(self: torch.Tensor, *args: Any, **kw: Any) -> Any:
                counter.calls += 1
                if counter.calls == counter.fail_at:
                    raise counter.error("injected: index_select")
                return original_select(self, *args, **kw)

            patch.setattr(torch.Tensor, "index_select", index_select)
        elif stage == "scatter":
            original_copy = torch.Tensor.index_copy_

            def index_copy_(self: torch.Tensor, dim: int, index: Any, source: Any) -> Any:
                counter.calls += 1
                if counter.calls == counter.fail_at:
                    if counter.partial and index.numel() > 1:
                        half = index.numel() // 2
                        original_copy(self, dim, index[:half], source[:half])
                    raise counter.error("injected: index_copy_")
                return original_copy(self, dim, index, source)

            patch.setattr(torch.Tensor, "index_copy_", index_copy_)
        else:
            msg = f"unknown stage {stage!r}"
            raise ValueError(msg)
        yield
