"""A layout by ``(name, width, output dtype)``: how a layout crosses a custom op's schema.

``torch.library`` ops accept ``str``, ``int`` and ``ScalarType`` arguments, not a
:class:`~kvcompat.layouts.LayoutSpec`; :func:`op_key` turns a spec into such a triple and
:func:`spec_for` turns it back: a named layout from the registry, an MHA/MLA/DSA row
layout rebuilt from its name, or one passed to :func:`register_layout` (a layout of your
own). The ops themselves live with their callers: the codec entry points in
:mod:`kvcompat._ops`, the launchers' in :mod:`kvcompat.kernels._library`.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

from kvcompat._errors import LayoutError
from kvcompat.layouts._registry import LAYOUTS
from kvcompat.layouts.dsa_fp8 import dsa_fp8_layout
from kvcompat.layouts.mha import mha_layout
from kvcompat.layouts.mla import mla_layout

if TYPE_CHECKING:
    import torch

    from kvcompat.layouts._spec import LayoutSpec

__all__ = ["op_key", "register_layout", "spec_for"]

_SPECS: dict[str, LayoutSpec] = {}
_ROWS = re.compile(r"(mha)_(\d+)x(\d+)_\w+|(mla)_(\d+)\+(\d+)_\w+|(dsa_fp8)_(\d+)\+(\d+)")


def register_layout(spec: LayoutSpec, /) -> None:
    """Make a layout of your own usable inside ``torch.compile`` (looked up by name).

    Raises:
        LayoutError: another layout already has that name.

    Example:
        >>> from kvcompat._ops import register_layout, spec_for
        >>> from kvcompat.layouts import V41
        >>> register_layout(V41)  # already known; registering it again is harmless
        >>> spec_for("v41", V41.dim, V41.output_dtype) is V41
        True
    """
    seen = _SPECS.setdefault(spec.name, spec)
    if seen != spec:
        msg = (
            f"another layout is already registered as {spec.name!r}. "
            "Hint: give your LayoutSpec a name of its own."
        )
        raise LayoutError(msg)
    _lookup.cache_clear()


def _build(name: str, dtype: torch.dtype) -> LayoutSpec | None:
    named = _SPECS.get(name) or LAYOUTS.get(name)
    if named is not None:
        return named
    match = _ROWS.fullmatch(name)
    if match is None:
        return None
    mha, heads, width, mla, rank, rope, dsa, dsa_rank, dsa_rope = match.groups()
    if mha:
        return mha_layout(int(heads), int(width), dtype)
    if mla:
        return mla_layout(int(rank), int(rope), dtype)
    return dsa_fp8_layout(int(dsa_rank), int(dsa_rope)) if dsa else None


@functools.cache
def _lookup(name: str, dim: int, dtype: torch.dtype) -> LayoutSpec | None:
    try:
        spec = _build(name, dtype)
    except LayoutError:
        return None
    if spec is None or spec.name != name or spec.dim != dim or spec.output_dtype != dtype:
        return None
    return spec


def spec_for(name: str, dim: int, dtype: torch.dtype) -> LayoutSpec:
    """The layout an op's ``(name, dim, dtype)`` arguments stand for.

    Raises:
        LayoutError: no layout of that name, width and output dtype is known.

    Example:
        >>> import torch
        >>> from kvcompat._ops import spec_for
        >>> spec_for("mla_512+64_bf16", 576, torch.bfloat16).value_dim
        512
    """
    spec = _lookup(name, dim, dtype)
    if spec is None:
        msg = (
            f"kvcompat's custom ops know no layout {name!r} of width {dim} decoding to "
            f"{dtype}. Hint: call kvcompat._ops.register_layout(spec) for a LayoutSpec of "
            "your own before compiling."
        )
        raise LayoutError(msg)
    return spec


def op_key(spec: LayoutSpec) -> tuple[str, int, torch.dtype]:
    """``(name, dim, output dtype)``: what a custom op receives for ``spec``.

    Example:
        >>> from kvcompat.layouts import V4
        >>> op_key(V4)[:2]
        ('v4', 512)
    """
    return spec.name, spec.dim, spec.output_dtype
