"""Launch a compiled Triton kernel without the JIT dispatcher's per-call work.

``kernel[grid](*args, **constants)`` binds every argument, specialises each one, hashes the
lot and looks the compiled kernel up before it calls the kernel's launcher: tens of
microseconds of host time a launch, more than a small read takes on the GPU. :func:`launch`
remembers, per kernel and device, the compiled kernel for each *signature* of the arguments
and calls its launcher itself, as the dispatcher's last step does. The signature is at least
as fine as the key Triton compiles by: every tensor's dtype and address modulo 16, every
integer's value modulo 16, whether it is 1 and whether it fits 32 or 64 bits, and every
constant by name. A signature seen for the first time goes through the dispatcher, which
compiles (or finds) the kernel, launches it and hands it back.

What a warm launch skips besides the binding: the dispatcher's check that the module
globals a kernel read when compiled still hold their values (kvcompat's kernels read
constants only) and its pre-run hooks (none is installed by kvcompat; any installed one
sends launches back to the dispatcher).

The dispatcher serves every launch instead under the interpreter, while a launch hook (a
profiler such as Proton) or a pre-run hook is installed, for argument types the signature
does not cover, and on Triton releases whose launcher this was not checked against.
"""

from __future__ import annotations

from typing import Any

import torch
import triton

from kvcompat.kernels import _triton as jit

__all__ = ["ENABLED", "launch"]

_CHECKED = ((3, 6), (3, 9))
"""The oldest and newest Triton releases whose dispatcher and launcher this was read against."""


def _release(version: object) -> tuple[int, int]:
    parts = str(version).split(".")  # not a str where the docs build mocks triton
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


_knobs: Any = getattr(triton, "knobs", None)

ENABLED: bool = (
    _knobs is not None
    and _CHECKED[0] <= _release(triton.__version__) <= _CHECKED[1]
    and isinstance(jit._read_fp8_kernel, triton.runtime.JITFunction)  # not interpreted
)
"""Whether :func:`launch` may bypass the dispatcher in this process (tests switch it off)."""

_MAX_ENTRIES = 4096
_entries: dict[tuple[object, ...], tuple[Any, Any, Any, tuple[object, ...], dict[str, int]]] = {}
_streams: list[Any] = []
"""The driver's current-stream getter, once a launch has made the driver active."""


class _UnsupportedArgError(Exception):
    """An argument the signature does not cover: the dispatcher takes this launch."""


def _signature(arg: object) -> object:
    if isinstance(arg, torch.Tensor):
        return (arg.dtype, arg.data_ptr() & 15)
    if type(arg) is int:
        return (arg == 1, arg & 15, -(1 << 31) <= arg < (1 << 31), arg < (1 << 63))
    if arg is None or type(arg) is bool:
        return arg
    raise _UnsupportedArgError


def _hooked(kernel: Any) -> bool:
    """Whether a hook wants to see launches (an empty hook chain does not)."""
    runtime = _knobs.runtime
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", hook):
            return True
    return bool(getattr(kernel, "pre_run_hooks", None))


def launch(
    kernel: Any,
    grid: tuple[int, int],
    *args: object,
    runtime: Any = None,  # a dict[str, int]; Any, as callers also pass **dict[str, object]
    **constants: object,
) -> None:
    """``kernel[grid](*args, **runtime, **constants)``, at the launcher's own cost once warm.

    ``args`` are the kernel's leading parameters, passed by position; ``runtime`` the
    values of later non-constexpr parameters, by name (they may change from call to call
    without a new signature); ``constants`` its ``tl.constexpr`` parameters and launch
    options (``num_warps``), by name. The current CUDA device must be the tensors' (the
    launchers in :mod:`kvcompat.kernels._launch` make it so).
    """
    named = constants if runtime is None else {**runtime, **constants}
    if not ENABLED or _hooked(kernel):
        kernel[grid](*args, **named)
        return
    device = torch.cuda.current_device()
    try:
        key: tuple[object, ...] = (
            kernel, device, tuple(map(_signature, args)), tuple(constants.items()),
        )  # fmt: skip
        if runtime is not None:
            key += (tuple((k, _signature(v)) for k, v in runtime.items()),)
    except (_UnsupportedArgError, TypeError):  # an unhashable constant: the dispatcher's
        kernel[grid](*args, **named)
        return
    entry = _entries.get(key)
    if entry is None:
        _first(key, kernel, grid, args, named, runtime)
        return
    run, function, metadata, tail, places = entry
    if runtime is not None:
        filled = list(tail)
        for name, value in runtime.items():
            filled[places[name]] = value
        tail = tuple(filled)
    stream = _streams[0](device)
    run(grid[0], grid[1], 1, stream, function, metadata, None, None, None, *args, *tail)


def _keyable(kernel: Any, positional: int, runtime: Any) -> bool:
    """Whether the signature covers a launch of ``kernel``.

    It does unless a ``tl.constexpr`` parameter is among the ``positional`` arguments or
    the ``runtime`` names: those are keyed by their signature only, and a constant's exact
    value picks the compiled kernel.
    """
    names = set(runtime or ())
    return not any(
        p.is_constexpr for i, p in enumerate(kernel.params) if i < positional or p.name in names
    )


def _first(
    key: tuple[object, ...],
    kernel: Any,
    grid: tuple[int, int],
    args: tuple[object, ...],
    named: dict[str, object],
    runtime: Any,
) -> None:
    """Launch through the dispatcher and remember the compiled kernel it used.

    Only where the signature covers the launch (:func:`_keyable`); else every such launch
    stays with the dispatcher.
    """
    compiled = kernel.run(*args, grid=grid, warmup=False, **named)
    if not _keyable(kernel, len(args), runtime):
        return
    if hasattr(compiled, "result"):  # compiled asynchronously
        compiled = compiled.result()
    params = kernel.params[len(args) :]
    tail = tuple(named.get(p.name, p.default) for p in params)
    places = {p.name: index for index, p in enumerate(params)}
    if not _streams:
        _streams.append(triton.runtime.driver.active.get_current_stream)
    if len(_entries) >= _MAX_ENTRIES:
        _entries.clear()
    _entries[key] = (compiled.run, compiled.function, compiled.packed_metadata, tail, places)
