"""Which public operations can run inside CUDA-graph capture, and under which arguments.

:data:`CAPTURE` is the single declaration: one :class:`Capturability` per public
operation. The docs table (``docs/compile-and-graphs.md``) is generated from it, and the
GPU test ``tests/ops/test_ops_gpu.py`` captures every operation declared capturable in a
``torch.cuda.CUDAGraph`` with exactly the declared arguments, replays it on new inputs
and compares bytes.

What breaks capture is a host synchronisation: the validation of ``validate=True``
reads ``loc``'s range back to the host (``aminmax(...).tolist()``) and, for writes, the
duplicate and ``check_finite`` checks (``.amax()`` to a Python float). ``check_finite``
alone is not the whole story: with ``validate=True`` the location check syncs even with
``check_finite=False``, so a captured write needs ``validate=False``. The Triton
launchers check only what the host knows (shapes, dtypes, addresses) and never sync.

Example:
    >>> from kvcompat._capture import CAPTURE, capturability
    >>> dict(capturability("KVPool.write").kwargs)
    {'validate': False}
    >>> sorted({c.capturable for c in CAPTURE})
    [False, True]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["CAPTURE", "Capturability", "capturability", "markdown_table"]

_NO_KWARGS: Mapping[str, object] = MappingProxyType({})


@dataclass(frozen=True)
class Capturability:
    """One operation's CUDA-graph capturability.

    Attributes:
        operation: the public name (``KVPool.read`` is the method of every adapter
            :func:`kvcompat.adapt` returns).
        capturable: whether a call with ``kwargs`` (and CUDA tensors) can be captured.
        kwargs: the keyword arguments a captured call must pass.
        when: the conditions in words (tensors, implementation, outputs).
        why: what breaks capture otherwise, or why the operation has nothing to capture.

    Example:
        >>> from kvcompat._capture import capturability
        >>> capturability("kvcompat.layouts.check_write").capturable
        False
    """

    operation: str
    capturable: bool
    kwargs: Mapping[str, object] = field(default_factory=lambda: _NO_KWARGS)
    when: str = ""
    why: str = ""


_VALIDATE_OFF = MappingProxyType({"validate": False})
_GETTER_KW = MappingProxyType({"wait": False})
_KERNEL = "CUDA tensors, the Triton kernel serving the call (`which_impl(...).impl == 'triton'`)"
_READ_SYNC = "`validate=True` reads `loc`'s range back to the host (a sync)"
_WRITE_SYNC = (
    "`validate=True` syncs on `loc`'s range and duplicates, and `check_finite=True` on "
    "the values' peak; `check_finite=False` alone is not enough"
)
_HOST = "host-only: no device work to capture (safe to call while capturing; nothing replays)"
_GETTER = (
    "no device work; returns the very storage tensor. `wait=True` runs the native "
    "layer-transfer wait (a host wait on SGLang's counter) outside the graph"
)

CAPTURE: tuple[Capturability, ...] = (
    Capturability("KVPool.get_key_buffer", True, _GETTER_KW, "any pool", _GETTER),
    Capturability("KVPool.get_value_buffer", True, _GETTER_KW, "pools with values", _GETTER),
    Capturability("KVPool.get_kv_buffer", True, _GETTER_KW, "pools with values", _GETTER),
    Capturability(
        "KVPool.read", True, _VALIDATE_OFF,
        f"{_KERNEL}; `out=` optional (without it the output lives in the graph's pool)",
        _READ_SYNC,
    ),
    Capturability("KVPool.read_kv", True, _VALIDATE_OFF, _KERNEL, _READ_SYNC),
    Capturability(
        "KVPool.write", True, _VALIDATE_OFF,
        f"{_KERNEL}; values already on the device; distinct `loc` (unchecked)",
        _WRITE_SYNC,
    ),
    Capturability(
        "kvcompat.layouts.dequantize", True, _VALIDATE_OFF, f"{_KERNEL}; `out=` optional",
        _READ_SYNC,
    ),
    Capturability(
        "kvcompat.layouts.quantize", True, _VALIDATE_OFF,
        f"{_KERNEL}; distinct `loc` (unchecked)", _WRITE_SYNC,
    ),
    Capturability(
        "kvcompat.kernels.gather_dequantize", True, _NO_KWARGS,
        "CUDA tensors (locations are trusted: check them before capture)",
        "never syncs: checks only shapes, dtypes and addresses",
    ),
    Capturability(
        "kvcompat.kernels.quantize_scatter", True, _NO_KWARGS,
        "CUDA tensors (locations and values are trusted)",
        "never syncs: checks only shapes, dtypes and addresses",
    ),
    Capturability(
        "kvcompat.layouts.check_read", False, _NO_KWARGS, "", _READ_SYNC,
    ),
    Capturability(
        "kvcompat.layouts.check_write", False, _NO_KWARGS, "", _WRITE_SYNC,
    ),
    Capturability(
        "CompatPool.get_key_buffer", False, _NO_KWARGS, "",
        "always waits (`wait=True`) like the native getter; the adapter's getter with "
        "`wait=False` is capturable",
    ),
    Capturability(
        "CompatPool.set_kv_buffer", False, _NO_KWARGS, "",
        "writes with `validate=True` (SGLang's signature has no way to turn it off); "
        "use the adapter's `write(..., validate=False)` in captured code",
    ),
    Capturability("kvcompat.adapt", False, _NO_KWARGS, "", _HOST),
    Capturability("kvcompat.describe", False, _NO_KWARGS, "", _HOST),
    Capturability("kvcompat.memory_report", False, _NO_KWARGS, "", _HOST),
    Capturability("kvcompat.transfer_descriptors", False, _NO_KWARGS, "", _HOST),
    Capturability("kvcompat.kernels.which_impl", False, _NO_KWARGS, "", _HOST),
)  # fmt: skip
"""Every public operation's declaration (the docs table and the GPU test read this)."""


def capturability(operation: str) -> Capturability:
    """The declaration of ``operation``.

    Raises:
        KeyError: no declaration of that name.

    Example:
        >>> from kvcompat._capture import capturability
        >>> dict(capturability("KVPool.read").kwargs)
        {'validate': False}
    """
    for entry in CAPTURE:
        if entry.operation == operation:
            return entry
    msg = f"no capturability is declared for {operation!r}"
    raise KeyError(msg)


def markdown_table() -> str:
    """The declarations as the Markdown table of ``docs/compile-and-graphs.md``.

    Example:
        >>> from kvcompat._capture import markdown_table
        >>> markdown_table().splitlines()[0]
        '| Operation | CUDA-graph capturable | With | When | Otherwise / why |'
    """
    lines = [
        "| Operation | CUDA-graph capturable | With | When | Otherwise / why |",
        "|---|---|---|---|---|",
    ]
    for entry in CAPTURE:
        kwargs = ", ".join(f"`{k}={v!r}`" for k, v in entry.kwargs.items())
        cells = [
            f"`{entry.operation}`",
            "yes" if entry.capturable else "no",
            kwargs or ("(any)" if entry.capturable else ""),
            entry.when,
            entry.why,
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"
