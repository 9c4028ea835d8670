"""Test helpers: prove inspection runs no native code, and count storage independently.

``instrument(monkeypatch, pool)`` walks the native object graph of a pool (pools,
sub-pools, state pools, windows, the dataclasses they hold), and for every class met
there (SGLang's, the reference pools', the test doubles') replaces every method,
static/class method and property defined on the class with a recorder that logs the
call and then runs the original. It also registers a ``RecordingLayerCounter`` on
every object that has a ``layer_transfer_counter`` attribute. After inspecting the
pool, both must be empty.

``storage_total(pool)`` is the test's own answer to "how many bytes does this pool
hold": every tensor reachable from the pool's objects, de-duplicated by storage.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import re
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from kvcompat.testing import RecordingLayerCounter

_NATIVE_PREFIXES = ("sglang", "kvcompat.testing", "tests", "inspection", "test_")


def _is_native(obj: Any) -> bool:
    module = type(obj).__module__ or ""
    return module.startswith(_NATIVE_PREFIXES) and not isinstance(obj, (type, enum.Enum))


def native_objects(root: Any) -> list[Any]:
    """Every engine/test object reachable from ``root`` through attributes and containers."""
    found: list[Any] = []
    seen: set[int] = set()

    def visit(obj: Any, depth: int) -> None:
        if depth > 12 or id(obj) in seen or isinstance(obj, (torch.Tensor, str, bytes)):
            return
        seen.add(id(obj))
        if isinstance(obj, (list, tuple)):
            for item in obj:
                visit(item, depth + 1)
        elif isinstance(obj, dict):
            for item in obj.values():
                visit(item, depth + 1)
        elif _is_native(obj) or dataclasses.is_dataclass(obj):
            if _is_native(obj):
                found.append(obj)
            for item in getattr(obj, "__dict__", {}).values():
                visit(item, depth + 1)

    visit(root, 0)
    return found


def reachable_tensors(root: Any) -> Iterator[torch.Tensor]:
    """Every tensor held by ``root``'s native objects (attributes, containers, dataclasses)."""
    seen: set[int] = set()

    def visit(obj: Any, depth: int) -> Iterator[torch.Tensor]:
        if depth > 12 or id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            yield obj
        elif isinstance(obj, (list, tuple)):
            for item in obj:
                yield from visit(item, depth + 1)
        elif isinstance(obj, dict):
            for item in obj.values():
                yield from visit(item, depth + 1)
        elif _is_native(obj) or dataclasses.is_dataclass(obj):
            for item in getattr(obj, "__dict__", {}).values():
                yield from visit(item, depth + 1)

    yield from visit(root, 0)


def storage_total(root: Any) -> int:
    """Sum of the distinct storages' sizes of every tensor the pool holds."""
    storages: dict[tuple[str, int], int] = {}
    for tensor in reachable_tensors(root):
        storage = tensor.untyped_storage()
        storages[(str(tensor.device), storage.data_ptr())] = storage.nbytes()
    return sum(storages.values())


@dataclass
class Guard:
    """What the instrumented pool recorded."""

    calls: list[str] = field(default_factory=list)
    counters: list[RecordingLayerCounter] = field(default_factory=list)
    patched: int = 0

    @property
    def waits(self) -> list[int]:
        return [wait for counter in self.counters for wait in counter.waits]

    def assert_untouched(self) -> None:
        assert self.patched > 0, "nothing was instrumented"
        assert not self.calls, f"native code ran during inspection: {self.calls}"
        assert not self.waits, f"layer-transfer waits happened: {self.waits}"


def _recorder(guard: Guard, label: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def record(*args: Any, **kwargs: Any) -> Any:
        guard.calls.append(label)
        return function(*args, **kwargs)

    return record


def _patch_class(monkeypatch: pytest.MonkeyPatch, guard: Guard, cls: type) -> None:
    for name, value in list(vars(cls).items()):
        if name.startswith("__") and name.endswith("__"):
            continue
        label = f"{cls.__qualname__}.{name}"
        replacement: Any
        if isinstance(value, property):
            getter = value.fget
            if getter is None:
                continue
            replacement = property(_recorder(guard, label, getter), value.fset, value.fdel)
        elif isinstance(value, staticmethod):
            replacement = staticmethod(_recorder(guard, label, value.__func__))
        elif isinstance(value, classmethod):
            replacement = classmethod(_recorder(guard, label, value.__func__))
        elif isinstance(value, (types.FunctionType, functools.cached_property)):
            if isinstance(value, functools.cached_property):
                replacement = property(_recorder(guard, label, value.func))
            else:
                replacement = _recorder(guard, label, value)
        else:
            continue
        monkeypatch.setattr(cls, name, replacement)
        guard.patched += 1


def instrument(monkeypatch: pytest.MonkeyPatch, root: Any) -> Guard:
    """Record every method/property call and every layer-transfer wait on ``root``'s graph."""
    guard = Guard()
    classes: dict[type, None] = {}
    for obj in native_objects(root):
        if "layer_transfer_counter" in getattr(obj, "__dict__", {}):
            counter = RecordingLayerCounter()
            monkeypatch.setattr(obj, "layer_transfer_counter", counter)
            guard.counters.append(counter)
        for cls in type(obj).__mro__:
            if cls is object or not (cls.__module__ or "").startswith(_NATIVE_PREFIXES):
                continue
            if issubclass(cls, enum.Enum) or isinstance(cls, type(enum.Enum)):
                continue
            classes[cls] = None
    for cls in classes:
        _patch_class(monkeypatch, guard, cls)
    return guard


_PATH_TOKEN = re.compile(r"\.?([A-Za-z_]\w*)|\[(-?\d+)\]|\['([^']*)'\]|\[\.\.\., :(\d+)\]")


def resolve_path(root: Any, path: str) -> Any:
    """Evaluate a manifest path (``kv_pools[4].kv_buffer[0][..., :512]``) on ``root``."""
    obj = root
    position = 0
    while position < len(path):
        match = _PATH_TOKEN.match(path, position)
        assert match is not None, f"cannot parse {path!r} at {position}"
        name, index, key, width = match.groups()
        if name is not None:
            obj = vars(obj)[name] if name in getattr(obj, "__dict__", {}) else getattr(obj, name)
        elif index is not None:
            obj = obj[int(index)]
        elif key is not None:
            obj = obj[key]
        else:
            obj = obj[..., : int(width)]
        position = match.end()
    return obj
