"""The layout registry: every public module of :mod:`kvcompat.layouts`, discovered.

Name -> layout lookup (accepting SGLang's ``KVLayout`` enum without importing sglang),
the package's exported layout names, and the documentation pages the modules declare.
A new layout module is registered by existing: nothing here lists layouts by hand.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import pkgutil
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING

from kvcompat._errors import LayoutError
from kvcompat.layouts._pages import LayoutPage
from kvcompat.layouts._spec import LayoutSpec

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "EXPORTS",
    "KV_LAYOUT_NAMES",
    "LAYOUTS",
    "LAYOUT_FACTORIES",
    "LAYOUT_PAGES",
    "get_layout",
]


def _layout_modules() -> list[ModuleType]:
    """Every public module of :mod:`kvcompat.layouts` (one per byte layout), by name."""
    here = str(Path(__file__).parent)  # the package itself, without importing it again
    names = sorted(info.name for info in pkgutil.iter_modules([here]))
    return [
        importlib.import_module(f"kvcompat.layouts.{name}")
        for name in names
        if not name.startswith("_")
    ]


class _Found:
    """What the discovery collects from the layout modules."""

    def __init__(self) -> None:
        self.specs: dict[str, LayoutSpec] = {}
        self.exports: dict[str, LayoutSpec] = {}
        self.factories: dict[str, object] = {}
        self.kv_layouts: list[str] = []
        self.pages: list[LayoutPage] = []


def _discover() -> _Found:
    """What every layout module exports and declares.

    The named specs a module exports (``__all__``), its factories of parametrised
    layouts, SGLang's enum values and the declared docs pages. A module whose
    ``SGLANG_KV_LAYOUT`` is true holds values of SGLang's DeepSeek-V4 ``KVLayout`` enum
    (what a ``DeepSeekV4SingleKVPool``'s ``kv_layout`` selects). A module's ``PAGES`` (a
    tuple of :class:`~kvcompat.layouts._pages.LayoutPage`) are its docs pages; without
    it each named spec gets the default page.
    """
    found = _Found()
    for module in _layout_modules():
        named: list[LayoutSpec] = []
        for export in getattr(module, "__all__", ()):
            spec = getattr(module, export)
            if not isinstance(spec, LayoutSpec):
                found.factories[export] = spec  # a factory of parametrised layouts (mha_layout)
                continue
            if spec.name in found.specs or export in found.exports:
                msg = (
                    f"two layout modules name a layout {spec.name!r} or export {export!r} "
                    f"({module.__name__})"
                )
                raise LayoutError(msg)
            found.specs[spec.name] = spec
            found.exports[export] = spec
            named.append(spec)
            if getattr(module, "SGLANG_KV_LAYOUT", False):
                found.kv_layouts.append(spec.name)
        pages = getattr(module, "PAGES", None)
        if pages is None:
            pages = tuple(LayoutPage(spec.name, spec) for spec in named)
        found.pages.extend(pages)
    return found


_FOUND = _discover()

LAYOUTS: Mapping[str, LayoutSpec] = MappingProxyType(_FOUND.specs)
"""The named layouts, by name: every :class:`LayoutSpec` a module of
:mod:`kvcompat.layouts` exports (SGLang's ``KVLayout`` values, ``"dsa_fp8"`` and the
DeepSeek-V4 indexer-key layouts). A new layout module is registered by existing.

Example:
    >>> from kvcompat.layouts._registry import LAYOUTS
    >>> LAYOUTS["v41_new"].bytes_per_token
    528
"""

EXPORTS: Mapping[str, LayoutSpec] = MappingProxyType(_FOUND.exports)
"""The named layouts by the Python name their module exports (``"V4"``,
``"DSV4_INDEXER_FP8"``...): :mod:`kvcompat.layouts` serves each of them as a package
attribute.

Example:
    >>> from kvcompat.layouts._registry import EXPORTS
    >>> EXPORTS["V41_FP4"].name
    'v41_fp4'
"""

LAYOUT_FACTORIES: Mapping[str, object] = MappingProxyType(_FOUND.factories)
"""The other public names of the layout modules: factories of parametrised layouts
(``mha_layout``, ``mla_layout``, ``dsa_fp8_layout``), which the package imports by name.

Example:
    >>> from kvcompat.layouts._registry import LAYOUT_FACTORIES
    >>> sorted(LAYOUT_FACTORIES)
    ['dsa_fp8_layout', 'mha_layout', 'mla_layout']
"""

LAYOUT_PAGES: tuple[LayoutPage, ...] = tuple(_FOUND.pages)
"""The documentation pages the layout modules declare (``docs/layouts/<stem>.md``):
the page pictures and the docs' layouts table are generated from them.

Example:
    >>> from kvcompat.layouts._registry import LAYOUT_PAGES
    >>> [(p.stem, p.picture_page_size) for p in LAYOUT_PAGES][:3]
    [('dsa_fp8', 4), ('dsv4_indexer_fp4', 16), ('dsv4_indexer_fp8', 32)]
"""

KV_LAYOUT_NAMES: tuple[str, ...] = tuple(_FOUND.kv_layouts)
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
