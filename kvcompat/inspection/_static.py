"""Reading a foreign object's state without running any of its code.

Everything inspection knows about a native pool comes through these helpers.
They read the instance ``__dict__`` (``vars()``) and, failing that, plain class
attributes found by :func:`inspect.getattr_static`; a property, a method, a
``__getattr__`` hook or any other descriptor is never run — SGLang's getters
wait on layer-transfer events, allocate dequantized copies or start
collectives (``shared/reference/sglang-pools.md`` §1.5).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import types
from collections.abc import Iterator
from typing import Any

import torch

__all__ = [
    "MISSING",
    "enum_value",
    "find_attr_path",
    "join_path",
    "static_attr",
    "static_path",
    "tensors_in",
    "vars_of",
]

MISSING: Any = object()
"""Sentinel: the attribute does not exist as plain data."""

_MAX_CONTAINER = 4096
"""Containers longer than this are not searched for tensors (no pool keeps such lists)."""

_MAX_DEPTH = 3
"""How deep :func:`tensors_in` descends into nested containers and dataclasses."""


def vars_of(obj: Any) -> dict[str, Any]:
    """The instance ``__dict__`` of ``obj`` (empty for objects without one).

    Example:
        >>> from types import SimpleNamespace
        >>> vars_of(SimpleNamespace(a=1)), vars_of(3)
        ({'a': 1}, {})
    """
    try:
        found = vars(obj)
    except TypeError:
        return {}
    return found if isinstance(found, dict) else {}


def static_attr(obj: Any, name: str, default: Any = MISSING) -> Any:
    """``obj.name`` when it is plain data; ``default`` when it is absent or computed.

    Looks in the instance ``__dict__`` first, then for a plain class attribute
    (an ``int``, a dtype, an enum member...). Properties, methods and other
    descriptors count as absent: their code is never run. ``__slots__``
    members are read through their slot descriptor, which runs no user code.

    Example:
        >>> class Pool:
        ...     page_size = 16
        ...     @property
        ...     def waits(self):
        ...         raise RuntimeError("a getter ran")
        >>> pool = Pool()
        >>> pool.size = 64
        >>> static_attr(pool, "size"), static_attr(pool, "page_size")
        (64, 16)
        >>> static_attr(pool, "waits", None) is None  # the property never ran
        True
    """
    found = vars_of(obj)
    if name in found:
        return found[name]
    try:
        value = inspect.getattr_static(obj, name)
    except AttributeError:
        return default
    if isinstance(value, types.MemberDescriptorType):
        try:
            return value.__get__(obj, type(obj))
        except AttributeError:
            return default
    if hasattr(type(value), "__get__") and not isinstance(value, type):
        return default  # a property, a function, a cached_property...: never run it
    return value


def static_path(obj: Any, path: str, default: Any = MISSING) -> Any:
    """Follow a dotted attribute path with :func:`static_attr` (``"index_key_cache.buffer"``).

    Example:
        >>> from types import SimpleNamespace
        >>> pool = SimpleNamespace(cache=SimpleNamespace(buffer=[1, 2]))
        >>> static_path(pool, "cache.buffer"), static_path(pool, "cache.nothing", None)
        ([1, 2], None)
    """
    value = obj
    for part in path.split("."):
        value = static_attr(value, part, MISSING)
        if value is MISSING:
            return default
    return value


def enum_value(value: Any) -> Any:
    """The raw value of an enum member (read from the member, not through ``.value``).

    Example:
        >>> import enum
        >>> class Layout(enum.Enum):
        ...     V4 = "v4"
        >>> enum_value(Layout.V4), enum_value("v41")
        ('v4', 'v41')
    """
    if isinstance(value, enum.Enum):
        return vars_of(value).get("_value_", value.name)
    return value


def join_path(prefix: str, name: str) -> str:
    """Join an attribute path and a name (``"" + "k_buffer"`` → ``"k_buffer"``).

    Example:
        >>> join_path("", "k_buffer"), join_path("kv_pools[4]", "kv_buffer")
        ('k_buffer', 'kv_pools[4].kv_buffer')
    """
    return f"{prefix}.{name}" if prefix else name


def _key(key: Any) -> str:
    return f"[{key}]" if isinstance(key, int) else f"[{key!r}]"


def tensors_in(value: Any, path: str, *, _depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor held by ``value``: itself, or inside lists, tuples, dicts and dataclasses.

    Other objects (sub-pools, adapters, allocators) are not entered: they are
    either described on their own or not part of this object's storage.

    Example:
        >>> import torch
        >>> held = {"a": [torch.zeros(1), None], "b": 3}
        >>> [path for path, _ in tensors_in(held, "x")]
        ["x['a'][0]"]
    """
    if isinstance(value, torch.Tensor):
        yield path, value
        return
    if _depth >= _MAX_DEPTH:
        return
    if isinstance(value, (list, tuple)):
        if len(value) > _MAX_CONTAINER:
            return
        fields = getattr(type(value), "_fields", None)  # a NamedTuple: name its fields
        for index, item in enumerate(value):
            sub = f"{path}.{fields[index]}" if fields else f"{path}[{index}]"
            yield from tensors_in(item, sub, _depth=_depth + 1)
    elif isinstance(value, dict):
        if len(value) > _MAX_CONTAINER:
            return
        for key, item in value.items():
            yield from tensors_in(item, f"{path}{_key(key)}", _depth=_depth + 1)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for name, item in vars_of(value).items():
            yield from tensors_in(item, join_path(path, name), _depth=_depth + 1)


def find_attr_path(owner: Any, target: Any) -> str | None:
    """The attribute path under which ``owner`` holds ``target`` (by identity), if any.

    Searches ``vars(owner)`` and the values of dicts and lists stored there.

    Example:
        >>> from types import SimpleNamespace
        >>> sub = object()
        >>> find_attr_path(SimpleNamespace(pools={4: sub}), sub)
        'pools[4]'
    """
    for name, value in vars_of(owner).items():
        if value is target:
            return name
        if isinstance(value, dict):
            for key, item in value.items():
                if item is target:
                    return f"{name}{_key(key)}"
        elif isinstance(value, (list, tuple)) and len(value) <= _MAX_CONTAINER:
            for index, item in enumerate(value):
                if item is target:
                    return f"{name}[{index}]"
    return None
