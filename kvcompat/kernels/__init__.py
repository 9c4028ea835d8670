"""Triton kernels: gather-dequantize and quantize-scatter for every kvcompat layout.

:func:`gather_dequantize` reads tokens of a pool buffer into dense ``[n, dim]`` values and
:func:`quantize_scatter` writes dense values as tokens, byte for byte as the torch twins
:func:`kvcompat.layouts.dequantize` / :func:`kvcompat.layouts.quantize` do, at close to
copy bandwidth on a GPU. Most callers never import this package: those two functions
pick the kernels by themselves (``impl="auto"``: Triton for CUDA tensors when triton is
installed, the torch twin otherwise).

Importing ``kvcompat.kernels`` does not import triton; the first use of a launcher does,
and raises an ImportError naming ``pip install triton`` when it is missing.
:func:`which_impl` says which implementation a read or write would take, and why,
without running it or importing triton (see ``docs/compile-and-graphs.md``).

Example:
    >>> import kvcompat.kernels as kernels
    >>> kernels.is_available() in (True, False)
    True
    >>> sorted(kernels.__all__)
    ['ImplChoice', 'gather_dequantize', 'is_available', 'quantize_scatter', 'which_impl']
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvcompat.kernels._library import gather_dequantize, quantize_scatter
    from kvcompat.kernels._select import ImplChoice, which_impl

__all__ = ["ImplChoice", "gather_dequantize", "is_available", "quantize_scatter", "which_impl"]

_LAZY = frozenset({"gather_dequantize", "quantize_scatter"})
_SELECT = frozenset({"ImplChoice", "which_impl"})


def is_available() -> bool:
    """Whether triton is installed (checked without importing it).

    Example:
        >>> from kvcompat.kernels import is_available
        >>> isinstance(is_available(), bool)
        True
    """
    return importlib.util.find_spec("triton") is not None


def _selector() -> Any:
    return importlib.import_module("kvcompat.kernels._select")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        _selector().load_launchers()  # the ImportError naming pip when triton is missing
        return getattr(importlib.import_module("kvcompat.kernels._library"), name)
    if name in _SELECT:
        return getattr(_selector(), name)
    msg = f"module 'kvcompat.kernels' has no attribute {name!r}"
    raise AttributeError(msg)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
