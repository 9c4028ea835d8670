"""Assertion helpers for the kvcompat-vs-real-SGLang tests.

Every failure message starts with *where*: ``"[sglang <release>] <case id> layer <l>: <what was
called>"`` (build it with :func:`at`; the case id starts with the class name), then says what
differed (data_ptr, shape, strides, dtype, exception type or message) and, when a tensor is
another layer's storage, whose.
"""

from __future__ import annotations

import builtins
import importlib
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from _sglang.features import release

__all__ = [
    "ImportLog",
    "at",
    "check_raises",
    "check_storage",
    "describe",
    "ids_text",
    "record_imports",
    "tensor_diffs",
]

_ENGINE_PREFIXES = ("sglang", "triton")


def at(case_id: str, layer: int | None, what: str) -> str:
    """The location prefix of a failure message: ``"[sglang <release>] <case> layer <l>: <what>"``.

    The release is the installed ``sglang`` distribution's (the matrix runs this tier on
    several), so a failure names the release, the class (case ids start with it) and the layer.
    """
    where = f"[sglang {release()}] {case_id}"
    if layer is None:
        return f"{where}: {what}"
    return f"{where} layer {layer}: {what}"


def describe(value: Any) -> str:
    """A short, comparable description of a tensor (or anything else)."""
    if isinstance(value, torch.Tensor):
        return (
            f"tensor(shape={tuple(value.shape)}, strides={value.stride()}, dtype={value.dtype}, "
            f"data_ptr={value.data_ptr():#x})"
        )
    if isinstance(value, tuple):
        return "(" + ", ".join(describe(v) for v in value) + ")"
    return repr(value)


def tensor_diffs(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> list[str]:
    """What differs between ``got`` and the storage ``expected`` viewed as ``dtype``."""
    diffs = []
    if got.untyped_storage().data_ptr() != expected.untyped_storage().data_ptr():
        diffs.append("another allocation")
    if got.data_ptr() != expected.data_ptr():
        offset = got.data_ptr() - expected.data_ptr()
        diffs.append(
            f"data_ptr {got.data_ptr():#x} != {expected.data_ptr():#x} ({offset:+d} bytes)"
        )
    if tuple(got.shape) != tuple(expected.shape):
        diffs.append(f"shape {tuple(got.shape)} != {tuple(expected.shape)}")
    if got.stride() != expected.stride():
        diffs.append(f"strides {got.stride()} != {expected.stride()}")
    if got.dtype != dtype:
        diffs.append(f"dtype {got.dtype} != {dtype}")
    return diffs


def _whose(got: torch.Tensor, others: Mapping[str, torch.Tensor]) -> str:
    for label, tensor in others.items():
        if got.data_ptr() == tensor.data_ptr() and got.shape == tensor.shape:
            return f" -- it is {label}"
    return ""


def check_storage(
    got: Any,
    expected: torch.Tensor,
    *,
    dtype: torch.dtype,
    what: str,
    where: str,
    others: Mapping[str, torch.Tensor] | None = None,
) -> None:
    """Assert ``got`` views exactly the bytes of ``expected`` (a native buffer), as ``dtype``.

    Args:
        got: what kvcompat (or a native getter) returned.
        expected: the native storage the layer lives in.
        dtype: the dtype ``got`` must have (the pool's logical dtype, or the stored one).
        what: the location prefix (:func:`at`).
        where: the native expression ``expected`` came from (``pool.k_buffer[0]``).
        others: labelled storage of the pool's other layers, to name a wrong answer's owner.
    """
    assert isinstance(got, torch.Tensor), f"{what}: expected {where}, got {describe(got)}"
    diffs = tensor_diffs(got, expected, dtype)
    assert not diffs, (
        f"{what}: not the storage {where} ({describe(expected)}): "
        + "; ".join(diffs)
        + _whose(got, others or {})
    )


def check_raises(
    fn: Callable[[], Any],
    exc_type: type[BaseException],
    *,
    what: str,
    contains: Iterable[str] = (),
    exact_type: bool = False,
) -> BaseException:
    """Call ``fn`` and assert it raises ``exc_type`` whose message contains every ``contains``."""
    caught: BaseException | None = None
    try:
        result = fn()
    except BaseException as exc:  # the exception is the observation, checked below
        caught = exc
    if caught is None:
        msg = f"{what}: expected {exc_type.__name__}, but it returned {describe(result)}"
        raise AssertionError(msg)
    ok = type(caught) is exc_type if exact_type else isinstance(caught, exc_type)
    assert ok, f"{what}: expected {exc_type.__name__}, got {type(caught).__name__}: {caught}"
    message = str(caught)
    missing = [text for text in contains if text not in message]
    assert not missing, (
        f"{what}: the {type(caught).__name__} message does not mention {missing}: {message!r}"
    )
    return caught


def ids_text(ids: Iterable[int]) -> str:
    """How a valid-id set reads in kvcompat's messages: ``2..3`` for a run, ``[1, 3]`` else."""
    ordered = sorted(ids)
    if len(ordered) == 1:
        return str(ordered[0])
    if ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}..{ordered[-1]}"
    return "[" + ", ".join(map(str, ordered)) + "]"


@dataclass
class ImportLog:
    """Import activity seen inside :func:`record_imports`."""

    statements: list[str] = field(default_factory=list)
    new_modules: set[str] = field(default_factory=set)

    @property
    def new_engine_modules(self) -> set[str]:
        """Newly loaded ``sglang*`` / ``triton*`` modules."""
        return {m for m in self.new_modules if m.split(".", 1)[0] in _ENGINE_PREFIXES}


@contextmanager
def record_imports() -> Iterator[ImportLog]:
    """Record every ``import`` statement and ``importlib.import_module`` call, and new modules.

    ``builtins.__import__`` sees every ``import`` statement, even of a module that is already
    loaded, so an empty :attr:`ImportLog.statements` means the code imported nothing at all.
    """
    log = ImportLog()
    before = set(sys.modules)
    real_import = builtins.__import__
    real_import_module = importlib.import_module

    def spy_import(name: str, *args: Any, **kwargs: Any) -> Any:
        log.statements.append(name)
        return real_import(name, *args, **kwargs)

    def spy_import_module(name: str, package: str | None = None) -> Any:
        log.statements.append(name)
        return real_import_module(name, package)

    builtins.__import__ = spy_import
    importlib.import_module = spy_import_module
    try:
        yield log
    finally:
        builtins.__import__ = real_import
        importlib.import_module = real_import_module
        log.new_modules = set(sys.modules) - before
