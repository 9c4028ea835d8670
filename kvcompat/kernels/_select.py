"""Which implementation serves a read or a write, and why (no triton import).

:func:`decide` is the one place that turns ``impl`` (and ``KVCOMPAT_IMPL``) plus the
call's buffer, layout and value dtype into an :class:`ImplChoice`; :func:`dispatch` is
what :func:`kvcompat.layouts.dequantize` / :func:`~kvcompat.layouts.quantize` call: it
decides, logs the choice once per (operation, layout, implementation, reason) on the
``"kvcompat"`` logger, and says whether to launch the kernel. :func:`which_impl` is the
public question "which one would serve this call?".
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
from typing import TYPE_CHECKING, Any, Final, Literal, NamedTuple

import torch

from kvcompat import _log
from kvcompat._errors import ImplError, KernelUnavailableError

if TYPE_CHECKING:
    from kvcompat.layouts._spec import LayoutSpec

__all__ = ["ImplChoice", "decide", "dispatch", "load_launchers", "which_impl"]

ALIGN: Final = 16
"""The kernels need the buffer's address to be a multiple of this many bytes."""

_ROCM: Final = torch.version.hip is not None

REASONS: Final = {
    "not_cuda": "not a CUDA tensor (the kernels run on CUDA tensors)",
    "no_triton": "triton is not installed (pip install triton)",
    "unaligned": f"the buffer's address is not a multiple of {ALIGN} bytes",
    "kernel": "a CUDA tensor and a kernel serves the call",
    "rocm": "a ROCm build: the kernel takes its portable integer fp8/fp4 conversions",
    "torch_arg": "impl='torch' was passed",
    "triton_arg": "impl='triton' was passed",
    "torch_env": f"{_log.IMPL_ENV}=torch",
    "triton_env": f"{_log.IMPL_ENV}=triton",
}
"""The fixed reasons a choice gives (plus the kernels' own "no kernel serves" sentences)."""


class ImplChoice(NamedTuple):
    """Which implementation serves a call, and why.

    Attributes:
        impl: ``"triton"`` (a fused kernel) or ``"torch"`` (the pure-torch twin).
        reason: one short sentence: why this one.
        fallback: True when a CUDA call under ``impl="auto"`` did not get the full-speed
            kernel (the twin, or the ROCm portable path) -- the choices logged at INFO.

    Example:
        >>> import torch
        >>> from kvcompat.kernels import which_impl
        >>> from kvcompat.layouts import V4
        >>> which_impl(V4, torch.zeros(1, V4.page_bytes(64), dtype=torch.uint8))
        ImplChoice(impl='torch', reason='not a CUDA tensor (the kernels run on CUDA tensors)', fallback=False)
    """  # noqa: E501 - a doctest's output line

    impl: Literal["torch", "triton"]
    reason: str
    fallback: bool = False


_C: Final = {
    name: ImplChoice(
        "triton" if name in ("kernel", "rocm", "triton_arg", "triton_env") else "torch",
        reason,
        fallback=name in ("no_triton", "unaligned", "rocm"),
    )
    for name, reason in REASONS.items()
}
"""The fixed choices, built once (the hot path returns these, allocating nothing)."""


def load_launchers() -> Any:
    """``kvcompat.kernels._launch`` (imports triton); an ImportError naming pip without it.

    Example:
        >>> from kvcompat.kernels._select import load_launchers
        >>> from kvcompat.kernels import is_available
        >>> is_available() or load_launchers()  # doctest: +SKIP
        True
    """
    try:
        return importlib.import_module("kvcompat.kernels._launch")
    except ImportError as exc:
        if exc.name is None or exc.name.split(".")[0] != "triton":
            raise
        msg = (
            "kvcompat's GPU kernels need triton, which is not installed. "
            "Hint: pip install triton (or pip install 'kvcompat[triton]'), or use impl='torch'."
        )
        raise ImportError(msg, name="triton") from exc


@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def _unsupported(
    spec: LayoutSpec, *, write: bool, fnuz: bool, values_dtype: torch.dtype | None
) -> str | None:
    from kvcompat.kernels._plan import unsupported  # noqa: PLC0415 - avoids an import cycle

    return unsupported(spec, write=write, fnuz=fnuz, values_dtype=values_dtype)


def _forced_gap(buf: object) -> str | None:
    """Why a forced kernel cannot run on ``buf`` at all (None when it can, or not a tensor).

    Imports the launchers (an ImportError naming pip when triton is missing).
    """
    if not isinstance(buf, torch.Tensor):
        return None  # validation explains what buf must be
    _launch = load_launchers()  # triton only when forced
    if buf.device.type != "cuda" and not (buf.device.type == "cpu" and _launch.INTERPRETED):
        return (
            "the Triton kernels need CUDA tensors, or CPU tensors under the Triton "
            f"interpreter (TRITON_INTERPRET=1 set before triton is imported); the buffer "
            f"is on {buf.device}"
        )
    if buf.data_ptr() % ALIGN:
        return f"the buffer does not start at a multiple of {ALIGN} bytes"
    return None


def decide(  # noqa: PLR0911 - one return per documented reason reads best
    impl: object,
    spec: LayoutSpec,
    buf: object,
    *,
    write: bool,
    fnuz: bool,
    values_dtype: torch.dtype | None = None,
) -> ImplChoice:
    """The implementation that serves this read (``write=False``) or write.

    ``impl="auto"`` means ``KVCOMPAT_IMPL`` when that is set, else: the kernel for a
    16-byte-aligned CUDA buffer when triton is installed and a kernel serves the layout
    and value dtype, the twin otherwise. An explicit ``"torch"``/``"triton"`` wins.

    Raises:
        ImplError: ``impl`` is not auto, torch or triton (a ``ValueError``; a bad
            ``KVCOMPAT_IMPL`` is a ``ValueError`` too).
        KernelUnavailableError: triton is forced where no kernel serves the buffer's
            device or alignment, the layout, value dtype or fnuz flag (a
            ``NotImplementedError``; the message says which, and what forced it).
    """
    env = False
    if type(impl) is not str:  # a tensor or other object compared with == would not be a bool
        msg = f"impl must be 'auto', 'torch' or 'triton'; received {impl!r}."
        raise ImplError(msg)
    if impl == "auto":
        forced = _log.env_impl()
        if forced != "auto":
            impl, env = forced, True
        elif not isinstance(buf, torch.Tensor) or buf.device.type != "cuda":
            return _C["not_cuda"]  # the common CPU case, first
    if impl == "torch":
        return _C["torch_env" if env else "torch_arg"]
    if impl == "triton":
        why = _unsupported(spec, write=write, fnuz=fnuz, values_dtype=values_dtype)
        why = why or _forced_gap(buf)
        if why is not None:
            source = f"{_log.IMPL_ENV}=triton" if env else "impl='triton'"
            op = "write" if write else "read"
            msg = (
                f"{source} forces the Triton kernel, but none serves this {op} of layout "
                f"{spec.name!r}: {why}. Hint: use impl='auto' (falls back to the torch twin) "
                "or impl='torch'."
            )
            raise KernelUnavailableError(msg)
        return _C["triton_env" if env else "triton_arg"]
    if impl != "auto":
        msg = (
            f"impl must be 'auto', 'torch' or 'triton'; received {impl!r}. "
            "Hint: leave it out ('auto' picks the Triton kernel on CUDA when one serves "
            "the call, the torch twin otherwise)."
        )
        raise ImplError(msg)
    if not isinstance(buf, torch.Tensor) or buf.device.type != "cuda":
        return _C["not_cuda"]
    if not _triton_installed():
        return _C["no_triton"]
    if buf.data_ptr() % ALIGN:
        return _C["unaligned"]
    why = _unsupported(spec, write=write, fnuz=fnuz, values_dtype=values_dtype)
    if why is not None:
        return ImplChoice("torch", why, fallback=True)
    return _C["rocm"] if _ROCM else _C["kernel"]


_WHO: Final = {"torch": "the torch twin", "triton": "the Triton kernel"}


def dispatch(
    impl: object,
    spec: LayoutSpec,
    buf: object,
    *,
    write: bool,
    fnuz: bool,
    values_dtype: torch.dtype | None = None,
    memo: dict[Any, tuple[bool, Any]] | None = None,
) -> bool:
    """Decide (:func:`decide`), log the choice once, and say whether to launch the kernel.

    CUDA fallbacks log at INFO, every other first choice at DEBUG; a choice already
    logged costs one set lookup. A caller that dispatches on one buffer again and again
    (a :class:`~kvcompat._ops.BufferPlan`) passes a ``memo`` of its own: the choice for
    the same ``impl``, direction and value dtype is then looked up, not decided again
    (everything else :func:`decide` reads is fixed for the buffer, and the environment
    is read once until ``_log.reset()``, which also forgets the memo's entries).

    Example:
        >>> import torch
        >>> from kvcompat.kernels._select import dispatch
        >>> from kvcompat.layouts import V4
        >>> buf = torch.zeros(1, V4.page_bytes(64), dtype=torch.uint8)
        >>> dispatch("auto", V4, buf, write=False, fnuz=False)
        False
    """
    asked = (impl, write, fnuz, values_dtype) if memo is not None and type(impl) is str else None
    if asked is not None:
        found = memo.get(asked)  # type: ignore[union-attr]
        if found is not None and found[1] in _log.SEEN:  # logged since the last reset
            return found[0]
    choice = decide(impl, spec, buf, write=write, fnuz=fnuz, values_dtype=values_dtype)
    key = ("write" if write else "read", spec.name, choice.impl, choice.reason)
    if key not in _log.SEEN:  # the hot path stops here after the first call
        _log.setup_from_env()
        _log.log_once(
            logging.INFO if choice.fallback else logging.DEBUG,
            key,
            "%s of layout %r served by %s: %s",
            key[0],
            spec.name,
            _WHO[choice.impl],
            choice.reason,
        )
    if asked is not None:
        memo[asked] = (choice.impl == "triton", key)  # type: ignore[index]
    return choice.impl == "triton"


def which_impl(
    layout: LayoutSpec | str | object,
    buf: torch.Tensor,
    *,
    write: bool = False,
    values_dtype: torch.dtype | None = None,
    fnuz: bool = False,
    impl: str = "auto",
) -> ImplChoice:
    """Which implementation a read (or write) of ``buf`` would use, without running it.

    The answer :func:`~kvcompat.layouts.dequantize` (or, with ``write=True``,
    :func:`~kvcompat.layouts.quantize`) and so ``pool.read``/``pool.write`` act on.

    Args:
        layout: a :class:`~kvcompat.layouts.LayoutSpec` or a layout name.
        buf: the pool buffer the call would read or write.
        write: ask about a write (``values_dtype`` then matters: the kernels take bf16,
            fp16 and fp32 values).
        values_dtype: the dtype of the values a write would store.
        fnuz: the ROCm e4m3fnuz V4 bytes.
        impl: the ``impl=`` argument the call would get.

    Raises:
        ValueError: a bad ``impl`` or ``KVCOMPAT_IMPL``.
        NotImplementedError: triton is forced where no kernel serves.

    Example:
        >>> import torch
        >>> from kvcompat.kernels import which_impl
        >>> from kvcompat.layouts import V41
        >>> buf = torch.zeros(1, V41.page_bytes(64), dtype=torch.uint8)
        >>> which_impl(V41, buf, impl="torch").reason
        "impl='torch' was passed"
    """
    from kvcompat.layouts._registry import get_layout  # noqa: PLC0415 - avoids an import cycle

    spec = get_layout(layout)
    return decide(impl, spec, buf, write=write, fnuz=fnuz, values_dtype=values_dtype)
