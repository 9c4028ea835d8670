"""kvcompat's reads and writes as ``torch.library`` custom ops, for ``torch.compile``.

Inside ``torch.compile`` (``torch.compiler.is_compiling()``), the codec entry points
:func:`kvcompat.layouts.dequantize`, :func:`~kvcompat.layouts.quantize` and
:func:`~kvcompat.layouts.check_write`, and the kernel launchers
:func:`kvcompat.kernels.gather_dequantize` / :func:`~kvcompat.kernels.quantize_scatter`,
call the ops below instead of running their bodies, so Dynamo never traces the
validation's host reads or a Triton launch: ``fullgraph=True`` holds. Each op's body is
the eager function itself (the kernel on CUDA, the torch twin elsewhere, the same
:func:`~kvcompat.kernels.which_impl` choice); each has a fake implementation that gives
the output's shape and dtype. Writes declare the pool buffer in ``mutates_args``.

Outside compilation nothing goes through an op (the eager calls stay as fast as before;
``benchmarks/bench_ops_overhead.py`` measures the difference). ``import kvcompat`` does
not register them; importing the codec (:mod:`kvcompat.layouts`, which every read and
write uses) does, so that no traced call ever runs an import.

A layout crosses the op boundary as its name plus its width and output dtype (what the
schema accepts: ``str``, ``int``, ``ScalarType``); the op looks the
:class:`~kvcompat.layouts.LayoutSpec` up again (:func:`spec_for`): a named layout from
the registry, an MHA/MLA/DSA row layout rebuilt from its name, or one passed to
:func:`register_layout` (a layout of your own).

Example:
    >>> import torch
    >>> from kvcompat.layouts import V4, dequantize
    >>> buf = torch.zeros(1, V4.page_bytes(4), dtype=torch.uint8)
    >>> read = torch.compile(lambda b, i: dequantize(V4, b, i, 4), fullgraph=True)
    >>> read(buf, torch.tensor([1, 2])).shape  # doctest: +SKIP
    torch.Size([2, 512])
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

import torch

from kvcompat._errors import LayoutError

if TYPE_CHECKING:
    from kvcompat.layouts._spec import LayoutSpec

__all__ = [
    "OPS",
    "check_write",
    "dequantize",
    "gather_dequantize",
    "quantize",
    "quantize_scatter",
    "register_layout",
    "spec_for",
]

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
    from kvcompat.layouts import dsa_fp8_layout, mha_layout, mla_layout  # noqa: PLC0415
    from kvcompat.layouts._registry import LAYOUTS  # noqa: PLC0415 - avoids an import cycle

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


def _key(spec: LayoutSpec) -> tuple[str, int, torch.dtype]:
    return spec.name, spec.dim, spec.output_dtype


def _fresh(result: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
    """``result``, cloned if it shares storage with an input (ops may not return aliases)."""
    ptr = result.untyped_storage().data_ptr()
    if any(t.untyped_storage().data_ptr() == ptr for t in inputs):
        return result.clone()
    return result


def _empty_read(dim: int, dtype: torch.dtype, buf: torch.Tensor, loc: torch.Tensor) -> torch.Tensor:
    return buf.new_empty((loc.shape[0], dim), dtype=dtype)


# --------------------------------------------------------------- codec entry points


@torch.library.custom_op("kvcompat::dequantize", mutates_args=())
def _dequantize(
    layout: str,
    dim: int,
    dtype: torch.dtype,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    fnuz: bool,
    validate: bool,
    impl: str,
) -> torch.Tensor:
    from kvcompat.layouts._codec import dequantize as eager  # noqa: PLC0415 - import cycle

    dense = eager(
        spec_for(layout, dim, dtype),
        buf,
        loc,
        page_size,
        fnuz=fnuz,
        validate=validate,
        impl=impl,  # type: ignore[arg-type]
    )
    return _fresh(dense, buf, loc)


@_dequantize.register_fake
def _(
    layout: str,
    dim: int,
    dtype: torch.dtype,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    fnuz: bool,
    validate: bool,
    impl: str,
) -> torch.Tensor:
    return _empty_read(dim, dtype, buf, loc)


@torch.library.custom_op("kvcompat::dequantize_into", mutates_args=("out",))
def _dequantize_into(
    layout: str,
    dim: int,
    dtype: torch.dtype,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    fnuz: bool,
    validate: bool,
    impl: str,
    out: torch.Tensor,
) -> None:
    from kvcompat.layouts._codec import dequantize as eager  # noqa: PLC0415 - import cycle

    eager(
        spec_for(layout, dim, dtype), buf, loc, page_size, fnuz=fnuz, validate=validate, impl=impl,  # type: ignore[arg-type]
        out=out,
    )  # fmt: skip


@_dequantize_into.register_fake
def _(
    layout: str,
    dim: int,
    dtype: torch.dtype,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    fnuz: bool,
    validate: bool,
    impl: str,
    out: torch.Tensor,
) -> None:
    return None


@torch.library.custom_op("kvcompat::quantize", mutates_args=("buf",))
def _quantize(
    layout: str,
    dim: int,
    dtype: torch.dtype,
    values: torch.Tensor,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    fnuz: bool,
    check_finite: bool,
    validate: bool,
    impl: str,
) -> None:
    from kvcompat.layouts._codec import quantize as eager  # noqa: PLC0415 - import cycle

    eager(
        spec_for(layout, dim, dtype), values, buf, loc, page_size, fnuz=fnuz,
        check_finite=check_finite, validate=validate, impl=impl,  # type: ignore[arg-type]
    )  # fmt: skip


@_quantize.register_fake
def _(
    layout: str,
    dim: int,
    dtype: torch.dtype,
    values: torch.Tensor,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    fnuz: bool,
    check_finite: bool,
    validate: bool,
    impl: str,
) -> None:
    return None


@torch.library.custom_op("kvcompat::check_write", mutates_args=())
def _check_write(
    layout: str,
    dim: int,
    dtype: torch.dtype,
    buf: torch.Tensor,
    loc: torch.Tensor,
    values: torch.Tensor,
    page_size: int,
    check_finite: bool,
) -> torch.Tensor:
    from kvcompat.layouts._validate import check_write as eager  # noqa: PLC0415 - import cycle

    _, loc64 = eager(
        spec_for(layout, dim, dtype), buf, loc, values, page_size, check_finite=check_finite
    )
    return _fresh(loc64, buf, loc, values)


@_check_write.register_fake
def _(
    layout: str,
    dim: int,
    dtype: torch.dtype,
    buf: torch.Tensor,
    loc: torch.Tensor,
    values: torch.Tensor,
    page_size: int,
    check_finite: bool,
) -> torch.Tensor:
    return loc.new_empty(loc.shape, dtype=torch.int64)


# ------------------------------------------------------------------ kernel launchers


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
    from kvcompat.kernels import gather_dequantize as eager  # noqa: PLC0415 - imports triton

    return _fresh(eager(spec_for(layout, dim, dtype), buf, loc, page_size, fnuz=fnuz), buf, loc)


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
    return _empty_read(dim, dtype, buf, loc)


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
    from kvcompat.kernels import gather_dequantize as eager  # noqa: PLC0415 - imports triton

    eager(spec_for(layout, dim, dtype), buf, loc, page_size, fnuz=fnuz, out=out)


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
    from kvcompat.kernels import quantize_scatter as eager  # noqa: PLC0415 - imports triton

    eager(spec_for(layout, dim, dtype), values, buf, loc, page_size, fnuz=fnuz)


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
    "kvcompat::check_write",
    "kvcompat::dequantize",
    "kvcompat::dequantize_into",
    "kvcompat::gather_dequantize",
    "kvcompat::gather_dequantize_into",
    "kvcompat::quantize",
    "kvcompat::quantize_scatter",
)
"""The registered op names."""


# ------------------------------------------------- what the entry points call while compiling


def dequantize(
    spec: LayoutSpec,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    *,
    fnuz: bool,
    validate: bool,
    impl: str,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """:func:`kvcompat.layouts.dequantize` through ``kvcompat::dequantize[_into]``.

    Example:
        >>> import torch
        >>> from kvcompat._ops import dequantize
        >>> from kvcompat.layouts import V4
        >>> buf = torch.zeros(1, V4.page_bytes(4), dtype=torch.uint8)
        >>> dequantize(V4, buf, torch.tensor([0]), 4, fnuz=False, validate=True,
        ...            impl="auto", out=None).shape
        torch.Size([1, 512])
    """
    key = _key(spec)
    if out is None:
        result: torch.Tensor = torch.ops.kvcompat.dequantize(
            *key, buf, loc, page_size, fnuz, validate, impl
        )
        return result
    torch.ops.kvcompat.dequantize_into(*key, buf, loc, page_size, fnuz, validate, impl, out)
    return out


def quantize(
    spec: LayoutSpec,
    values: torch.Tensor,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    *,
    fnuz: bool,
    check_finite: bool,
    validate: bool,
    impl: str,
) -> None:
    """:func:`kvcompat.layouts.quantize` through ``kvcompat::quantize``.

    Example:
        >>> import torch
        >>> from kvcompat._ops import quantize
        >>> from kvcompat.layouts import V4
        >>> buf = torch.zeros(1, V4.page_bytes(4), dtype=torch.uint8)
        >>> quantize(V4, torch.ones(1, 512), buf, torch.tensor([0]), 4, fnuz=False,
        ...          check_finite=True, validate=True, impl="auto")
        >>> int(buf.count_nonzero()) > 0
        True
    """
    torch.ops.kvcompat.quantize(
        *_key(spec), values, buf, loc, page_size, fnuz, check_finite, validate, impl
    )


def check_write(
    spec: LayoutSpec,
    buf: torch.Tensor,
    loc: torch.Tensor,
    values: torch.Tensor,
    page_size: int,
    *,
    check_finite: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`kvcompat.layouts.check_write` through ``kvcompat::check_write``.

    The checks run inside the op, at run time; the returned int64 ``loc`` is the op's
    output, so every write that uses it is ordered after its check.

    Example:
        >>> import torch
        >>> from kvcompat._ops import check_write
        >>> from kvcompat.layouts import V4
        >>> buf = torch.zeros(1, V4.page_bytes(4), dtype=torch.uint8)
        >>> rows, loc = check_write(V4, buf, torch.tensor([0]), torch.ones(1, 1, 512), 4,
        ...                         check_finite=True)
        >>> rows.shape, loc.dtype
        (torch.Size([1, 512]), torch.int64)
    """
    loc64: torch.Tensor = torch.ops.kvcompat.check_write(
        *_key(spec), buf, loc, values, page_size, check_finite
    )
    return values.reshape(values.shape[0], spec.dim), loc64


def gather_dequantize(
    spec: LayoutSpec,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    *,
    fnuz: bool,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """:func:`kvcompat.kernels.gather_dequantize` through ``kvcompat::gather_dequantize``."""
    key = _key(spec)
    if out is None:
        result: torch.Tensor = torch.ops.kvcompat.gather_dequantize(*key, buf, loc, page_size, fnuz)
        return result
    torch.ops.kvcompat.gather_dequantize_into(*key, buf, loc, page_size, fnuz, out)
    return out


def quantize_scatter(
    spec: LayoutSpec,
    values: torch.Tensor,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    *,
    fnuz: bool,
) -> None:
    """:func:`kvcompat.kernels.quantize_scatter` through ``kvcompat::quantize_scatter``."""
    torch.ops.kvcompat.quantize_scatter(*_key(spec), values, buf, loc, page_size, fnuz)
