"""KV-cache byte layouts: immutable specs and their pure-torch codecs ("torch twins").

One module per byte layout holds its :class:`LayoutSpec` and row codec; every spec a
layout module exports is a package attribute by discovery (``kvcompat.layouts.V4``, and
``get_layout("v4")``): DeepSeek-V4's
packed page layouts (``V4``, ``V41``, ``V41_FP4``, ``UNIFORM_FP8``, ``V41_NEW``,
``V41_FP4_NEW``) and indexer keys (``DSV4_INDEXER_FP8/FP4``), SGLang's token-major
MHA and MLA rows (:func:`mha_layout`, :func:`mla_layout`) and DSA's 656-byte fp8 rows
(``DSA_FP8``, :func:`dsa_fp8_layout`).
:func:`dequantize` and :func:`quantize` read and write tokens of a pool buffer on any
device, byte for byte as SGLang 0.5.23's readers and stores do on an NVIDIA GPU (checked
against its CUDA and Triton kernels on an H200; see ``docs/layouts/oracles.md``);
:func:`check_read` and :func:`check_write` run their validation alone. Importing this
package never imports sglang or triton.

Example:
    >>> import torch
    >>> from kvcompat.layouts import V41, dequantize, get_layout, quantize
    >>> spec = get_layout("v41")
    >>> buf = torch.zeros(4, spec.page_bytes(64), dtype=torch.uint8)
    >>> loc = torch.tensor([3, 64, 200])
    >>> values = torch.randn(3, 512, dtype=torch.bfloat16)
    >>> quantize(spec, values, buf, loc, 64)
    >>> out = dequantize(spec, buf, loc, 64)
    >>> out.shape, out.dtype, bool(((out - values).abs() <= values.abs() / 8 + 1e-3).all())
    (torch.Size([3, 512]), torch.bfloat16, True)
"""

from __future__ import annotations

import typing as _typing

from kvcompat.layouts._registry import EXPORTS as _EXPORTS
from kvcompat.layouts._registry import get_layout
from kvcompat.layouts._spec import Encoding, LayoutSpec, Segment, SegmentRole
from kvcompat.layouts._validate import check_read
from kvcompat.layouts.dsa_fp8 import dsa_fp8_layout
from kvcompat.layouts.mha import mha_layout
from kvcompat.layouts.mla import mla_layout

if _typing.TYPE_CHECKING:
    from kvcompat._ops import check_write, dequantize, quantize

__all__ = [
    "Encoding",
    "LayoutSpec",
    "Segment",
    "SegmentRole",
    "check_read",
    "check_write",
    "dequantize",
    "dsa_fp8_layout",
    "get_layout",
    "mha_layout",
    "mla_layout",
    "quantize",
]
# The named layouts are discovered (every LayoutSpec a layout module exports): a new
# layout module adds its names without an edit here. The factories above are imported
# by name (a test checks that every layout module's factory is).
__all__ += sorted(_EXPORTS)  # noqa: PLE0605 -- names from the registry; pinned by a test


_DISPATCHED = frozenset({"check_write", "dequantize", "quantize"})
"""The entry points that pick the torch twin or a Triton kernel: they live in the dispatch
module above this package (:mod:`kvcompat._ops`, where a read or write goes) and are
re-exported here on first use, so that no module of this package imports upward."""


def __getattr__(name: str) -> LayoutSpec:
    """A named layout, from the registry (``kvcompat.layouts.V4``); typed for mypy.

    Raises:
        AttributeError: no layout module exports ``name``.
    """
    if name in _DISPATCHED:
        from kvcompat import _ops  # noqa: PLC0415 - the one lazy re-export (see _DISPATCHED)

        entry = getattr(_ops, name)
        globals()[name] = entry  # later lookups are plain attribute reads
        return _typing.cast("LayoutSpec", entry)  # mypy sees the real types (TYPE_CHECKING above)
    spec = _EXPORTS.get(name)
    if spec is None:
        msg = f"module 'kvcompat.layouts' has no attribute {name!r}"
        raise AttributeError(msg)
    return spec


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, *_DISPATCHED})
