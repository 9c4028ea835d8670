"""Where a read or a write goes: kvcompat's one dispatch module.

The data path runs one way::

    adapter (pool.read / pool.write: kvcompat.adapters._io)
      -> kvcompat._ops (this module): validate once, pick the implementation
           -> kvcompat.kernels (Triton launchers)  |  kvcompat.layouts._codec (torch twins)
                -> layout specs (kvcompat.layouts.<layout>) and addressing (layouts._addressing)

A read: :func:`dequantize` resolves the layout, asks
:func:`kvcompat.kernels._select.dispatch` whether a Triton kernel serves the call
(``impl``, ``KVCOMPAT_IMPL``, the buffer's device and alignment, the layout; the choice
is logged once), validates ``buf`` and ``loc`` once (:func:`~kvcompat.layouts.check_read`),
then either launches the kernel (:mod:`kvcompat.kernels._launch`) or runs the torch twin
(:func:`~kvcompat.layouts._codec.dequantize_torch`: gather the token rows through the
layout's addressing, decode them with its codec). A write: :func:`quantize` (one buffer)
or :func:`quantize_parts` (every buffer of one pool write, key and value) validates every
part first (:func:`check_write`), then launches one kernel per part, or encodes every part
and stores them with one all-or-nothing :func:`~kvcompat.layouts._codec.commit`.
``kvcompat.layouts.dequantize`` / ``quantize`` / ``check_write`` are these functions
(the layouts package re-exports them lazily; nothing below this module imports it).

Inside ``torch.compile`` (``torch.compiler.is_compiling()``) each entry point calls one
``torch.library`` custom op defined here (``kvcompat::dequantize[_into]``,
``kvcompat::quantize``, ``kvcompat::check_write``; the launchers' ops are in
:mod:`kvcompat.kernels._library`), so Dynamo never traces the validation's host reads or
a Triton launch and ``fullgraph=True`` holds. Each op's body is the eager function
itself; each has a fake implementation that gives the output's shape and dtype; writes
declare the pool buffer in ``mutates_args``. Outside compilation nothing goes through an
op (``benchmarks/bench_ops_overhead.py`` measures the difference). ``import kvcompat``
does not register them; importing the codec entry points does, so that no traced call
ever runs an import. A layout crosses the op boundary as its name plus its width and
output dtype (:func:`spec_for`; :func:`register_layout` for a layout of your own).

Example:
    >>> import torch
    >>> from kvcompat.layouts import V4, dequantize
    >>> buf = torch.zeros(1, V4.page_bytes(4), dtype=torch.uint8)
    >>> read = torch.compile(lambda b, i: dequantize(V4, b, i, 4), fullgraph=True)
    >>> read(buf, torch.tensor([1, 2])).shape  # doctest: +SKIP
    torch.Size([2, 512])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from kvcompat._errors import ImplError, LayoutError
from kvcompat._protocol import Impl
from kvcompat.kernels._library import OPS as _KERNEL_OPS
from kvcompat.kernels._library import empty_read, fresh
from kvcompat.kernels._select import dispatch, load_launchers
from kvcompat.layouts._addressing import byte_rows
from kvcompat.layouts._codec import PLAIN_CODEC, commit, dequantize_torch, encode_part
from kvcompat.layouts._lookup import op_key, register_layout, spec_for
from kvcompat.layouts._validate import (
    check_buffer,
    check_loc,
    check_page_size,
    check_read,
    resolve_layout,
    span,
    unaliased,
)
from kvcompat.layouts._validate import check_write as validate_write

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kvcompat.layouts._codec import Store
    from kvcompat.layouts._spec import LayoutSpec

__all__ = [
    "OPS",
    "BufferPlan",
    "Impl",
    "check_impl",
    "check_write",
    "dequantize",
    "plan_buffer",
    "quantize",
    "quantize_parts",
    "quantize_planned",
    "read_planned",
    "register_layout",
    "spec_for",
]

_LAUNCH: list[Any] = []


def _launch() -> Any:
    """``kvcompat.kernels._launch`` (imports triton on first use; ImportError names pip)."""
    if not _LAUNCH:
        _LAUNCH.append(load_launchers())
    return _LAUNCH[0]


def check_impl(impl: object) -> None:
    """Raise :class:`~kvcompat.ImplError` unless ``impl`` is "auto", "torch" or "triton".

    Example:
        >>> check_impl("torch")
    """
    if type(impl) is not str or impl not in ("auto", "torch", "triton"):
        msg = (
            f"impl must be 'auto', 'torch' or 'triton'; received {impl!r}. "
            "Hint: leave it out ('auto' picks the Triton kernel on CUDA when one serves "
            "the call, the torch twin otherwise)."
        )
        raise ImplError(msg)


def _check_out(spec: LayoutSpec, out: torch.Tensor, n: int, device: torch.device) -> None:
    if (
        not isinstance(out, torch.Tensor)
        or tuple(out.shape) != (n, spec.dim)
        or out.dtype != spec.output_dtype
        or out.device != device
        or not out.is_contiguous()
    ):
        got = (
            f"shape {list(out.shape)}, dtype {out.dtype}, device {out.device}, "
            f"contiguous={out.is_contiguous()}"
            if isinstance(out, torch.Tensor)
            else type(out).__name__
        )
        msg = (
            f"out must be a contiguous [{n}, {spec.dim}] {spec.output_dtype} tensor on "
            f"{device} for layout {spec.name!r}; received {got}."
        )
        raise LayoutError(msg)


def dequantize(
    layout: LayoutSpec | str | object,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    *,
    fnuz: bool = False,
    validate: bool = True,
    impl: Impl = "auto",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Read tokens ``loc`` from a pool buffer and decode them to ``[n, dim]`` values.

    Args:
        layout: a :class:`LayoutSpec` or anything :func:`get_layout` accepts.
        buf: the pool's per-layer buffer: ``[num_pages, page_bytes]`` for the DeepSeek-V4
            layouts (uint8 or fp8-typed), ``[rows, ...]`` for token-major rows. Contiguous.
        loc: 1-D integer tensor of token locations on ``buf``'s device (may repeat).
        page_size: the pool's page size in tokens (ignored for addressing by token-major
            layouts, but still checked to be a positive int).
        fnuz: read V4 bytes written by SGLang's ROCm e4m3fnuz store.
        validate: check ``buf`` and ``loc`` first (set False only after
            :func:`check_read` on the same arguments). The check reads ``loc``'s range
            back to the host, so a read inside CUDA-graph capture needs ``False``.
        impl: ``"auto"`` (Triton kernel for CUDA tensors when triton is installed and a
            kernel serves the layout, else the torch twin), ``"torch"`` or ``"triton"``
            (CPU tensors only under ``TRITON_INTERPRET=1``). Both give the same bytes.
        out: optional contiguous ``[n, layout.dim]`` tensor of ``layout.output_dtype`` to
            write the result into (with ``impl="triton"`` and ``validate=False`` the read
            then allocates nothing and can be captured in a CUDA graph).

    Returns:
        ``out``, or a new ``[n, layout.dim]`` tensor of ``layout.output_dtype`` on
        ``buf``'s device: bf16 for the DeepSeek-V4 and DSA layouts (bit-identical to
        SGLang's dequantizers), the pool dtype for MHA and MLA rows.

    Raises:
        LayoutError: bad buffer, page size, locations or ``out``; ``fnuz`` on a layout
            without it.
        KernelUnavailableError: ``impl="triton"`` where no kernel serves the call (a
            ``NotImplementedError``), checked before anything is read or written.
        ImplError: ``impl`` is not ``"auto"``, ``"torch"`` or ``"triton"`` (a ``ValueError``).
        ImportError: ``impl="triton"`` without triton installed.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import V41_NEW, dequantize
        >>> buf = torch.zeros(1, V41_NEW.page_bytes(4), dtype=torch.uint8)
        >>> buf[0, 528 + 512] = 127  # token 1, first scale byte: 2**0
        >>> buf[0, 528] = 0x38  # token 1, element 0: e4m3 1.0
        >>> dequantize(V41_NEW, buf, torch.tensor([1, 1]), 4)[:, 0]
        tensor([1., 1.], dtype=torch.bfloat16)
    """
    spec = resolve_layout(layout, fnuz=fnuz)
    if torch.compiler.is_compiling():  # one custom op: no graph break
        return _dequantize_op(spec, buf, loc, page_size, fnuz, validate, impl, out)
    kernel = dispatch(impl, spec, buf, write=False, fnuz=fnuz)
    if validate:
        loc = check_read(spec, buf, loc, page_size)
    if out is not None:
        _check_out(spec, out, int(loc.shape[0]), buf.device)
    if kernel:
        dense: torch.Tensor = _launch().gather_dequantize(
            spec, buf, loc, page_size, out=out, fnuz=fnuz
        )
        return dense
    result = dequantize_torch(spec, buf, loc.long(), page_size, fnuz=fnuz)
    if out is None:
        return result
    return out.copy_(result)


def _dequantize_op(
    spec: LayoutSpec,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    fnuz: bool,
    validate: bool,
    impl: str,
    out: torch.Tensor | None,
) -> torch.Tensor:
    key = op_key(spec)
    if out is None:
        result: torch.Tensor = torch.ops.kvcompat.dequantize(
            *key, buf, loc, page_size, fnuz, validate, impl
        )
        return result
    torch.ops.kvcompat.dequantize_into(*key, buf, loc, page_size, fnuz, validate, impl, out)
    return out


def quantize(
    layout: LayoutSpec | str | object,
    values: torch.Tensor,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    *,
    fnuz: bool = False,
    check_finite: bool = True,
    validate: bool = True,
    impl: Impl = "auto",
) -> None:
    """Encode ``values`` and write them, in place, as tokens ``loc`` of a pool buffer.

    Exactly the written tokens' data rows and the scale bytes SGLang's writers store
    change; every other byte (other tokens, V4's scale pad byte, page padding) keeps its
    value. ``values`` and ``loc`` are never modified. All checks run before any byte moves,
    and the write is all or nothing even when something raises while it stores (every CPU
    chunk is encoded first; see :func:`commit`). Values that share memory with ``buf`` are
    copied first.

    Args:
        layout: a :class:`LayoutSpec` or anything :func:`get_layout` accepts.
        values: ``[n, dim]`` (or ``[n, 1, dim]``; ``[n, heads, head_dim]`` for MHA rows)
            floating tensor on ``buf``'s device.
        buf: the pool's per-layer buffer (see :func:`dequantize`), written in place.
        loc: 1-D integer tensor of ``n`` distinct token locations on ``buf``'s device.
        page_size: the pool's page size in tokens.
        fnuz: write V4 bytes as SGLang's ROCm e4m3fnuz Triton store does (never the
            default: those bytes differ from the CUDA store's).
        check_finite: reject NaN/Inf values, and values beyond what their segment can
            represent (a bf16 rope tail, fp4 tiles, unscaled e4m3, the fp32 compute range:
            the table in ``docs/atomic-writes.md``), with
            :class:`~kvcompat.WriteError`; one host sync. With False nothing is checked
            (no sync) and they are encoded as SGLang's store would (documented per layout).
        validate: run :func:`check_write` first (set False only when the caller already
            did, passing its normalised ``values`` and ``loc``). The check reads values
            back to the host, so a write inside CUDA-graph capture needs ``False``.
        impl: ``"auto"`` (Triton kernel for CUDA tensors when triton is installed and a
            kernel serves the call: bf16/fp16/fp32 values; else the torch twin),
            ``"torch"`` or ``"triton"``. Both write the same bytes.

    Raises:
        LayoutError: bad buffer or page size; ``fnuz`` on a layout without it.
        WriteError: bad locations (dtype, shape, device, range, duplicates) or values
            (dtype, shape, device, non-finite).
        KernelUnavailableError: ``impl="triton"`` where no kernel serves the call (a
            ``NotImplementedError``), checked before anything is read or written.
        ImplError: ``impl`` is not ``"auto"``, ``"torch"`` or ``"triton"`` (a ``ValueError``).
        ImportError: ``impl="triton"`` without triton installed.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import V4, quantize
        >>> buf = torch.zeros(1, V4.page_bytes(2), dtype=torch.uint8)
        >>> quantize(V4, torch.ones(1, 512), buf, torch.tensor([1]), 2)
        >>> buf[0, 2 * 576 + 8 : 2 * 576 + 16].tolist()  # token 1's scale row; byte 7 untouched
        [119, 119, 119, 119, 119, 119, 119, 0]
    """
    spec = resolve_layout(layout, fnuz=fnuz)
    if torch.compiler.is_compiling():  # one custom op: no graph break
        torch.ops.kvcompat.quantize(
            *op_key(spec), values, buf, loc, page_size, fnuz, check_finite, validate, impl
        )
        return
    dtype = values.dtype if isinstance(values, torch.Tensor) else None
    kernel = dispatch(impl, spec, buf, write=True, fnuz=fnuz, values_dtype=dtype)
    if validate:
        rows, loc = validate_write(spec, buf, loc, values, page_size, check_finite=check_finite)
    else:
        rows = values.reshape(values.shape[0], spec.dim)
        rows = rows.detach() if rows.requires_grad else rows
    rows = unaliased(rows, (buf,))
    if kernel:
        _launch().quantize_scatter(spec, rows, buf, loc, page_size, fnuz=fnuz)
        return
    commit(encode_part(spec, rows, buf, loc.long(), page_size, fnuz=fnuz))


def quantize_parts(
    parts: Sequence[tuple[LayoutSpec, torch.Tensor, torch.Tensor, torch.Tensor]],
    page_size: int,
    *,
    fnuz: bool = False,
    impl: Impl = "auto",
) -> None:
    """Store several validated parts of one write (key and value buffers), all or nothing.

    Each part is ``(spec, rows, buf, loc64)`` as :func:`check_write` returned them. The
    kernel choice is made for every part before anything is stored (``"auto"`` takes the
    kernels only when one serves every part); on the torch path all parts are encoded
    first and stored by one :func:`commit`.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import mha_layout
        >>> spec = mha_layout(1, 4, torch.float32)
        >>> k, v = torch.zeros(8, 1, 4), torch.zeros(8, 1, 4)
        >>> loc = torch.tensor([2])
        >>> parts = [(spec, torch.ones(1, 4), k, loc), (spec, torch.full((1, 4), 2.0), v, loc)]
        >>> quantize_parts(parts, 16)
        >>> k[2, 0, 0].item(), v[2, 0, 0].item()
        (1.0, 2.0)
    """
    if torch.compiler.is_compiling():
        # Under torch.compile every part was validated before this call; each part is then
        # stored by one custom op. The save-and-restore rollback across parts and the
        # alias copy are eager-mode guarantees (docs/atomic-writes.md).
        for spec, rows, buf, loc in parts:
            torch.ops.kvcompat.quantize(
                *op_key(spec), rows, buf, loc, page_size, fnuz, False, False, impl
            )
        return
    buffers = tuple(buf for _, _, buf, _ in parts)
    parts = [(spec, unaliased(rows, buffers), buf, loc) for spec, rows, buf, loc in parts]
    kernels = [
        dispatch(impl, spec, buf, write=True, fnuz=fnuz, values_dtype=rows.dtype)
        for spec, rows, buf, _ in parts
    ]
    if all(kernels) and parts:
        launch = _launch().quantize_scatter
        for spec, rows, buf, loc in parts:
            launch(spec, rows, buf, loc, page_size, fnuz=fnuz)
        return
    stores: list[Store] = []
    for spec, rows, buf, loc in parts:
        stores.extend(encode_part(spec, rows, buf, loc.long(), page_size, fnuz=fnuz))
    commit(stores)


def check_write(
    spec: LayoutSpec,
    buf: torch.Tensor,
    loc: torch.Tensor,
    values: torch.Tensor,
    page_size: int,
    *,
    check_finite: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a write of ``values`` at ``loc`` before any byte moves.

    The layouts' own write check (``kvcompat/layouts/_validate.py``: the same arguments,
    results and errors), and inside ``torch.compile`` the same checks through the custom op
    ``kvcompat::check_write``: they run inside the op, at run time, and the returned
    int64 ``loc`` is the op's output, so every write that uses it is ordered after its
    check.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import check_write
        >>> from kvcompat.layouts import V4
        >>> buf = torch.zeros(1, V4.page_bytes(4), dtype=torch.uint8)
        >>> rows, loc = check_write(V4, buf, torch.tensor([0]), torch.ones(1, 1, 512), 4,
        ...                         check_finite=True)
        >>> rows.shape, loc.dtype
        (torch.Size([1, 512]), torch.int64)
    """
    if not torch.compiler.is_compiling():
        return validate_write(spec, buf, loc, values, page_size, check_finite=check_finite)
    loc64: torch.Tensor = torch.ops.kvcompat.check_write(
        *op_key(spec), buf, loc, values, page_size, check_finite
    )
    return values.reshape(values.shape[0], spec.dim), loc64


# ------------------------------------------------------------ planned calls (plain rows)


class BufferPlan:
    """One buffer of plain rows (MHA, MLA), resolved once for all its reads and writes.

    Its geometry is checked when the plan is made (:func:`plan_buffer`), so a read or
    write through it checks only its locations and values; it reads and writes whole
    rows with one ``index_select`` / ``index_copy_`` on views made here. An adapter keeps
    one per layer and buffer (on the layer's :class:`~kvcompat.adapters.LayerLayout`);
    it serves while the adapter hands out the same tensor over the same memory
    (:meth:`holds`), and the general path serves anything else.
    """

    __slots__ = ("buf", "capacity", "ptr", "rows", "shape", "span", "spec", "store")

    def __init__(self, spec: LayoutSpec, buf: torch.Tensor, capacity: int) -> None:
        self.spec, self.buf, self.capacity = spec, buf, capacity
        self.ptr, self.shape = buf.data_ptr(), buf.shape
        self.span = (self.ptr, self.ptr + buf.numel() * buf.element_size())  # bytes it spans
        raw = byte_rows(buf)
        self.rows = raw.view(spec.output_dtype)  # [capacity, dim] elements: what reads gather
        # What writes store into: the elements (index_copy_ moves 2-byte rows several times
        # faster than their uint8 view on the CPU), or the bytes for 1-byte (fp8) elements,
        # which index_copy_ does not take.
        self.store = self.rows if self.rows.element_size() > 1 else raw

    def holds(self, buf: torch.Tensor) -> bool:
        """Whether ``buf`` is the tensor this plan was made for, over the same memory."""
        return buf is self.buf and buf.data_ptr() == self.ptr and buf.shape == self.shape


def plan_buffer(
    spec: LayoutSpec, buf: object, page_size: object, *, fnuz: bool
) -> BufferPlan | None:
    """A :class:`BufferPlan` for a buffer of plain rows whose geometry fits ``spec``, else None.

    None for every other layout (packed pages, scales), for ``fnuz`` and for a buffer
    that does not fit: those calls take the general path, which validates and explains.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import mha_layout
        >>> buf = torch.zeros(16, 2, 4, dtype=torch.bfloat16)
        >>> plan = plan_buffer(mha_layout(2, 4, torch.bfloat16), buf, 1, fnuz=False)
        >>> plan.capacity, tuple(plan.rows.shape), plan.holds(buf), plan.holds(buf.clone())
        (16, (16, 8), True, False)
    """
    if (
        spec.codec is not PLAIN_CODEC
        or spec.paged
        or spec.scale_bytes
        or spec.data_bytes != spec.bytes_per_token
        or fnuz
        or not isinstance(buf, torch.Tensor)
    ):
        return None
    try:
        capacity = check_buffer(spec, buf, check_page_size(spec, page_size))
    except LayoutError:
        return None
    return BufferPlan(spec, buf, capacity)


def read_planned(
    plan: BufferPlan | None,
    spec: LayoutSpec,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    *,
    fnuz: bool,
    validate: bool,
    impl: Impl,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """:func:`dequantize`, through ``plan`` when it holds ``buf`` and the twin serves.

    The same checks in the same order, the same errors and the same bytes; only the
    buffer's geometry is not checked again.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import mha_layout
        >>> spec, buf = mha_layout(1, 2, torch.float32), torch.arange(8.0).view(4, 1, 2)
        >>> plan = plan_buffer(spec, buf, 1, fnuz=False)
        >>> read_planned(plan, spec, buf, torch.tensor([2]), 1, fnuz=False, validate=True,
        ...              impl="auto", out=None)
        tensor([[4., 5.]])
    """
    if (
        plan is None
        or not plan.holds(buf)
        or torch.compiler.is_compiling()
        or dispatch(impl, spec, buf, write=False, fnuz=False)  # a kernel: the general path
    ):
        return dequantize(
            spec, buf, loc, page_size, fnuz=fnuz, validate=validate, impl=impl, out=out
        )
    if validate:
        loc = check_loc(
            loc, capacity=plan.capacity, device=buf.device, error=LayoutError, unique=False
        )
    elif loc.dtype is not torch.int64 and loc.dtype is not torch.int32:
        loc = loc.long()
    if out is None:
        return plan.rows.index_select(0, loc)
    _check_out(spec, out, int(loc.shape[0]), buf.device)
    return torch.index_select(plan.rows, 0, loc, out=out)


def quantize_planned(
    parts: Sequence[tuple[LayoutSpec, torch.Tensor, torch.Tensor, torch.Tensor]],
    plans: Sequence[BufferPlan | None],
    page_size: int,
    *,
    fnuz: bool = False,
    impl: Impl = "auto",
) -> None:
    """:func:`quantize_parts`, storing through the parts' plans when every part has one.

    The same kernel choice, alias copies, encoding and all-or-nothing :func:`commit`;
    each part's scatter is one ``index_copy_`` of the encoded bytes, viewed as the
    layout's elements, into its plan's row view.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import mha_layout
        >>> spec, buf = mha_layout(1, 2, torch.float32), torch.zeros(4, 1, 2)
        >>> plan = plan_buffer(spec, buf, 1, fnuz=False)
        >>> quantize_planned([(spec, torch.ones(1, 2), buf, torch.tensor([3]))], [plan], 1)
        >>> buf[3].tolist()
        [[1.0, 1.0]]
    """
    if (
        fnuz
        or not parts
        or torch.compiler.is_compiling()
        or any(
            plan is None or not plan.holds(buf)
            for plan, (_, _, buf, _) in zip(plans, parts, strict=True)
        )
    ):
        return quantize_parts(parts, page_size, fnuz=fnuz, impl=impl)
    kernels = [
        dispatch(impl, spec, buf, write=True, fnuz=False, values_dtype=rows.dtype)
        for spec, rows, buf, _ in parts
    ]
    if all(kernels):
        return quantize_parts(parts, page_size, fnuz=fnuz, impl=impl)
    spans = [plan.span for plan in plans]  # type: ignore[union-attr]
    stores: list[Store] = []
    for (spec, given, _, loc), plan in zip(parts, plans, strict=True):
        rows = given
        if rows.shape[0]:
            # Values that share memory with a buffer of this write are copied first
            # (unaliased(), with the buffers' address ranges known from their plans).
            mine = span(rows)
            if mine is not None and any(lo < mine[1] and mine[0] < hi for lo, hi in spans):
                rows = rows.clone(memory_format=torch.contiguous_format)
            data, _ = spec.codec.encode(spec, rows, fnuz=False)
            target = plan.store  # type: ignore[union-attr]
            stores.append((target, loc, data.view(target.dtype)))  # the encoded bytes
    commit(stores)
    return None


# --------------------------------------------- the custom ops the entry points call when compiling


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
    dense = dequantize(
        spec_for(layout, dim, dtype),
        buf,
        loc,
        page_size,
        fnuz=fnuz,
        validate=validate,
        impl=impl,  # type: ignore[arg-type]
    )
    return fresh(dense, buf, loc)


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
    return empty_read(dim, dtype, buf, loc)


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
    dequantize(
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
    quantize(
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
    _, loc64 = validate_write(
        spec_for(layout, dim, dtype), buf, loc, values, page_size, check_finite=check_finite
    )
    return fresh(loc64, buf, loc, values)


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


OPS = (
    "kvcompat::check_write",
    "kvcompat::dequantize",
    "kvcompat::dequantize_into",
    *_KERNEL_OPS[:2],
    "kvcompat::quantize",
    _KERNEL_OPS[2],
)
"""The registered op names (the codec entry points' and the kernel launchers')."""
