"""The public kernel launchers, and the ``torch.library`` ops they become under ``torch.compile``.

:func:`gather_dequantize` and :func:`quantize_scatter` are what ``kvcompat.kernels``
exports. Outside compilation they call the launchers of :mod:`kvcompat.kernels._launch`
(which import triton); inside ``torch.compile`` (``torch.compiler.is_compiling()``) they
call the custom ops ``kvcompat::gather_dequantize[_into]`` / ``kvcompat::quantize_scatter``
instead, so Dynamo never traces a Triton launch. Each op's body is the eager launcher and
its fake implementation gives the output's shape and dtype. Registering the ops (importing
this module) imports neither triton nor Dynamo; :mod:`kvcompat._ops` imports it, so the
ops exist before any trace. A layout crosses the op boundary as
:func:`~kvcompat.layouts._lookup.op_key`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kvcompat.layouts._lookup import op_key, spec_for
from kvcompat.layouts._validate import resolve_layout

if TYPE_CHECKING:
    from kvcompat.layouts._spec import LayoutSpec

__all__ = ["OPS", "gather_dequantize", "quantize_scatter"]


def fresh(result: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
    """``result``, cloned if it shares storage with an input (ops may not return aliases)."""
    ptr = result.untyped_storage().data_ptr()
    if any(t.untyped_storage().data_ptr() == ptr for t in inputs):
        return result.clone()
    return result


def empty_read(dim: int, dtype: torch.dtype, buf: torch.Tensor, loc: torch.Tensor) -> torch.Tensor:
    """The fake result of a read: ``[len(loc), dim]`` of ``dtype`` on ``buf``'s device."""
    return buf.new_empty((loc.shape[0], dim), dtype=dtype)


@torch.library.custom_op("kvcompat::gather_dequantize", mutates_args=())
def _gather(
    layout: str,
    dim: int,
    dtype: torch.dtype,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    fnuz: bool,
) -> torch.Tensor:
    from kvcompat.kernels import _launch  # noqa: PLC0415 - imports triton

    spec = spec_for(layout, dim, dtype)
    return fresh(_launch.gather_dequantize(spec, buf, loc, page_size, fnuz=fnuz), buf, loc)


@_gather.register_fake
def _(
    layout: str,
    dim: int,
    dtype: torch.dtype,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    fnuz: bool,
) -> torch.Tensor:
    return empty_read(dim, dtype, buf, loc)


@torch.library.custom_op("kvcompat::gather_dequantize_into", mutates_args=("out",))
def _gather_into(
    layout: str,
    dim: int,
    dtype: torch.dtype,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    fnuz: bool,
    out: torch.Tensor,
) -> None:
    from kvcompat.kernels import _launch  # noqa: PLC0415 - imports triton

    _launch.gather_dequantize(spec_for(layout, dim, dtype), buf, loc, page_size, fnuz=fnuz, out=out)


@_gather_into.register_fake
def _(
    layout: str,
    dim: int,
    dtype: torch.dtype,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    fnuz: bool,
    out: torch.Tensor,
) -> None:
    return None


@torch.library.custom_op("kvcompat::quantize_scatter", mutates_args=("buf",))
def _scatter(
    layout: str,
    dim: int,
    dtype: torch.dtype,
    values: torch.Tensor,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    fnuz: bool,
) -> None:
    from kvcompat.kernels import _launch  # noqa: PLC0415 - imports triton

    _launch.quantize_scatter(spec_for(layout, dim, dtype), values, buf, loc, page_size, fnuz=fnuz)


@_scatter.register_fake
def _(
    layout: str,
    dim: int,
    dtype: torch.dtype,
    values: torch.Tensor,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    fnuz: bool,
) -> None:
    return None


OPS = (
    "kvcompat::gather_dequantize",
    "kvcompat::gather_dequantize_into",
    "kvcompat::quantize_scatter",
)
"""The launchers' op names."""


def gather_dequantize(
    spec: LayoutSpec | str | object,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    *,
    out: torch.Tensor | None = None,
    fnuz: bool = False,
) -> torch.Tensor:
    """Read tokens ``loc`` of a pool buffer into dense ``[n, dim]`` values (Triton).

    Byte for byte what :func:`kvcompat.layouts.dequantize` (the torch twin) returns. The
    locations are trusted: call :func:`kvcompat.layouts.check_read` first, or go through
    ``dequantize(..., impl="triton")``, which does.

    Args:
        spec: a :class:`~kvcompat.layouts.LayoutSpec` or anything
            :func:`~kvcompat.layouts.get_layout` accepts.
        buf: the pool's per-layer buffer (contiguous, 16-byte aligned) on a CUDA device,
            or on the CPU under ``TRITON_INTERPRET=1``.
        loc: 1-D int32 or int64 token locations on ``buf``'s device (may repeat).
        page_size: the pool's page size in tokens.
        out: optional ``[n, spec.dim]`` contiguous tensor of ``spec.output_dtype`` to
            write into (required for CUDA-graph capture, where nothing may allocate).
        fnuz: read V4 bytes written by SGLang's ROCm e4m3fnuz store.

    Returns:
        ``out`` (or a new tensor) holding the decoded values.

    Raises:
        LayoutError: a buffer, page size, ``loc`` or ``out`` that does not fit.
        NotImplementedError: no kernel serves this layout or buffer alignment.
        RuntimeError: a CPU buffer without the Triton interpreter.

    Example:
        >>> import torch
        >>> from kvcompat.kernels import gather_dequantize
        >>> from kvcompat.layouts import V4
        >>> if torch.cuda.is_available():  # doctest: +SKIP
        ...     buf = torch.zeros(2, V4.page_bytes(64), dtype=torch.uint8, device="cuda")
        ...     gather_dequantize(V4, buf, torch.tensor([3, 70], device="cuda"), 64).shape
        torch.Size([2, 512])
    """
    spec = resolve_layout(spec, fnuz=fnuz)
    if torch.compiler.is_compiling():  # one custom op: Dynamo never traces the launch
        key = op_key(spec)
        if out is None:
            result: torch.Tensor = torch.ops.kvcompat.gather_dequantize(
                *key, buf, loc, page_size, fnuz
            )
            return result
        torch.ops.kvcompat.gather_dequantize_into(*key, buf, loc, page_size, fnuz, out)
        return out
    from kvcompat.kernels import _launch  # noqa: PLC0415 - imports triton

    return _launch.gather_dequantize(spec, buf, loc, page_size, out=out, fnuz=fnuz)


def quantize_scatter(
    spec: LayoutSpec | str | object,
    values: torch.Tensor,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    *,
    fnuz: bool = False,
) -> None:
    """Encode ``values`` and write them, in place, as tokens ``loc`` of a pool buffer (Triton).

    Byte for byte what :func:`kvcompat.layouts.quantize` (the torch twin) writes, and no
    other byte of ``buf`` changes. ``loc`` is trusted to be in range and free of
    duplicates, and ``values`` to be finite where that matters: call
    :func:`kvcompat.layouts.check_write` first, or go through ``quantize(...,
    impl="triton")``, which does.

    Args:
        spec: a :class:`~kvcompat.layouts.LayoutSpec` or anything
            :func:`~kvcompat.layouts.get_layout` accepts.
        values: ``[n, dim]`` (or ``[n, 1, dim]``, ``[n, heads, head_dim]``) bf16, fp16 or
            fp32 values on ``buf``'s device.
        buf: the pool's per-layer buffer (contiguous, 16-byte aligned), written in place.
        loc: 1-D int32 or int64 distinct token locations on ``buf``'s device.
        page_size: the pool's page size in tokens.
        fnuz: write V4 bytes as SGLang's ROCm e4m3fnuz store does.

    Raises:
        LayoutError: a buffer or page size that does not fit.
        WriteError: ``loc`` or ``values`` of the wrong kind, shape or device.
        NotImplementedError: no kernel serves this layout, value dtype or alignment.
        RuntimeError: a CPU buffer without the Triton interpreter.

    Example:
        >>> import torch
        >>> from kvcompat.kernels import quantize_scatter
        >>> from kvcompat.layouts import V41
        >>> if torch.cuda.is_available():  # doctest: +SKIP
        ...     buf = torch.zeros(1, V41.page_bytes(64), dtype=torch.uint8, device="cuda")
        ...     values = torch.ones(2, 512, device="cuda")
        ...     quantize_scatter(V41, values, buf, torch.tensor([0, 5], device="cuda"), 64)
        ...     int(buf[0, 64 * 512 + 5 * 16])
        119
    """
    spec = resolve_layout(spec, fnuz=fnuz)
    if torch.compiler.is_compiling():  # one custom op: Dynamo never traces the launch
        torch.ops.kvcompat.quantize_scatter(*op_key(spec), values, buf, loc, page_size, fnuz)
        return
    from kvcompat.kernels import _launch  # noqa: PLC0415 - imports triton

    _launch.quantize_scatter(spec, values, buf, loc, page_size, fnuz=fnuz)
