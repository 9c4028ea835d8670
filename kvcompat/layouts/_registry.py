"""Name -> layout lookup; accepts SGLang's ``KVLayout`` enum without importing sglang."""

from __future__ import annotations

import enum
import inspect
from types import MappingProxyType
from typing import TYPE_CHECKING

from kvcompat._errors import LayoutError
from kvcompat.layouts._spec import LayoutSpec
from kvcompat.layouts.dsa_fp8 import DSA_FP8
from kvcompat.layouts.dsv4_indexer_fp4 import DSV4_INDEXER_FP4, DSV4_INDEXER_FP4_RNE
from kvcompat.layouts.dsv4_indexer_fp8 import DSV4_INDEXER_FP8
from kvcompat.layouts.dsv4_uniform_fp8 import UNIFORM_FP8
from kvcompat.layouts.dsv4_v4 import V4
from kvcompat.layouts.dsv4_v41 import V41, V41_NEW
from kvcompat.layouts.dsv4_v41_fp4 import V41_FP4, V41_FP4_NEW

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["LAYOUTS", "get_layout"]

LAYOUTS: Mapping[str, LayoutSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            V4,
            V41,
            V41_FP4,
            UNIFORM_FP8,
            V41_NEW,
            V41_FP4_NEW,
            DSA_FP8,
            DSV4_INDEXER_FP4,
            DSV4_INDEXER_FP4_RNE,
            DSV4_INDEXER_FP8,
        )
    }
)
"""The named layouts, by name (SGLang's ``KVLayout`` values, ``"dsa_fp8"`` and the
DeepSeek-V4 indexer-key layouts)."""


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
