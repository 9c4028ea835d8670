"""Name -> layout lookup; accepts SGLang's ``KVLayout`` enum without importing sglang."""

from __future__ import annotations

import enum
import importlib
import inspect
import pkgutil
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING

from kvcompat._errors import LayoutError
from kvcompat.layouts._spec import LayoutSpec

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["KV_LAYOUT_NAMES", "LAYOUTS", "get_layout"]


def _layout_modules() -> list[ModuleType]:
    """Every public module of :mod:`kvcompat.layouts` (one per byte layout), by name."""
    package = importlib.import_module("kvcompat.layouts")
    names = sorted(info.name for info in pkgutil.iter_modules(package.__path__))
    return [
        importlib.import_module(f"kvcompat.layouts.{name}")
        for name in names
        if not name.startswith("_")
    ]


def _discover() -> tuple[dict[str, LayoutSpec], tuple[str, ...]]:
    """The named specs each layout module exports (``__all__``), and SGLang's enum values.

    A module whose ``SGLANG_KV_LAYOUT`` is true holds values of SGLang's DeepSeek-V4
    ``KVLayout`` enum (what a ``DeepSeekV4SingleKVPool``'s ``kv_layout`` selects).
    """
    found: dict[str, LayoutSpec] = {}
    kv_layouts: list[str] = []
    for module in _layout_modules():
        for export in getattr(module, "__all__", ()):
            spec = getattr(module, export)
            if not isinstance(spec, LayoutSpec):
                continue  # a factory of parametrised layouts (mha_layout, ...)
            if spec.name in found:
                msg = f"two layout modules name a layout {spec.name!r} ({module.__name__})"
                raise LayoutError(msg)
            found[spec.name] = spec
            if getattr(module, "SGLANG_KV_LAYOUT", False):
                kv_layouts.append(spec.name)
    return found, tuple(kv_layouts)


_FOUND, _KV_LAYOUTS = _discover()

LAYOUTS: Mapping[str, LayoutSpec] = MappingProxyType(_FOUND)
"""The named layouts, by name: every :class:`LayoutSpec` a module of
:mod:`kvcompat.layouts` exports (SGLang's ``KVLayout`` values, ``"dsa_fp8"`` and the
DeepSeek-V4 indexer-key layouts). A new layout module is registered by existing.

Example:
    >>> from kvcompat.layouts._registry import LAYOUTS
    >>> LAYOUTS["v41_new"].bytes_per_token
    528
"""

KV_LAYOUT_NAMES: tuple[str, ...] = _KV_LAYOUTS
"""The names that are values of SGLang's DeepSeek-V4 ``KVLayout`` enum (the layouts a
``DeepSeekV4SingleKVPool`` selects with ``kv_layout``); ``kvcompat.testing.KVLayout``
is checked against it.

Example:
    >>> from kvcompat.layouts._registry import KV_LAYOUT_NAMES
    >>> sorted(KV_LAYOUT_NAMES)[:3]
    ['uniform_fp8', 'v4', 'v41']
"""


def _layout_name(layout: object) -> str | None:
    if isinstance(layout, enum.Enum):
        value = layout.value
    elif isinstance(layout, str):
        value = layout
    else:
        # A duck-typed enum stand-in: read a plain attribute, never run a property.
        value = inspect.getattr_static(layout, "value", None)
    return value.lower() if isinstance(value, str) else None


def get_layout(layout: object) -> LayoutSpec:
    """The :class:`LayoutSpec` named by ``layout``.

    Accepts a spec (returned as is), a name (case-insensitive: ``"v4"``, ``"v41"``,
    ``"v41_fp4"``, ``"uniform_fp8"``, ``"v41_new"``, ``"v41_fp4_new"``, ``"dsa_fp8"``), or
    an enum member or other object whose ``value`` is such a name, e.g. SGLang's
    ``KVLayout.V41`` (recognised without importing sglang). Parametrised row layouts come
    from :func:`mha_layout`, :func:`mla_layout` and :func:`dsa_fp8_layout`.

    Raises:
        LayoutError: the name is unknown; the message lists the valid names.

    Example:
        >>> import enum
        >>> from kvcompat.layouts import V41_FP4, get_layout
        >>> class KVLayout(str, enum.Enum):  # stands in for SGLang's enum
        ...     V41_FP4 = "v41_fp4"
        >>> get_layout(KVLayout.V41_FP4) is V41_FP4, get_layout("V4").bytes_per_token
        (True, 584)
    """
    if isinstance(layout, LayoutSpec):
        return layout
    name = _layout_name(layout)
    spec = LAYOUTS.get(name) if name is not None else None
    if spec is None:
        valid = ", ".join(repr(n) for n in sorted(LAYOUTS))
        msg = (
            f"unknown KV layout {layout!r} ({type(layout).__name__}); valid names are "
            f"{valid}. Hint: MHA, MLA and non-default DSA rows are built with mha_layout(), "
            "mla_layout() and dsa_fp8_layout()."
        )
        raise LayoutError(msg)
    return spec
