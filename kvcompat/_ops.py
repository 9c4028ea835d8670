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

import bisect
from typing import TYPE_CHECKING, Any

import torch

from kvcompat._errors import ImplError, LayoutError, WriteError
from kvcompat._protocol import Impl
from kvcompat.kernels._library import OPS as _KERNEL_OPS
from kvcompat.kernels._library import empty_read, fresh
from kvcompat.kernels._plan import word_bytes
from kvcompat.kernels._select import dispatch, load_launchers
from kvcompat.layouts._addressing import byte_rows, row_pitch
from kvcompat.layouts._codec import PLAIN_CODEC, commit, dequantize_torch, encode_part
from kvcompat.layouts._lookup import op_key, register_layout, spec_for
from kvcompat.layouts._validate import (
    check_buffer,
    check_loc,
    check_page_size,
    check_read,
    check_values,
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
    "LayersPlan",
    "RowMoves",
    "SpacesPlan",
    "check_impl",
    "check_layer_loc",
    "check_write",
    "dequantize",
    "gather_rows_layers",
    "move_rows_layers",
    "plan_buffer",
    "plan_layers",
    "plan_spaces",
    "quantize",
    "quantize_parts",
    "quantize_planned",
    "read_layers",
    "read_planned",
    "read_spaces",
    "register_layout",
    "scatter_rows_layers",
    "spec_for",
    "write_layer_parts",
    "write_layers",
    "write_spaces",
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
            layouts (uint8 or fp8-typed), ``[rows, ...]`` for token-major rows. Contiguous,
            or a view striding only its first dimension (rows further apart than their size).
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
        _check_out_shape(spec, out, (int(loc.shape[0]), spec.dim), buf.device)
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

    __slots__ = ("buf", "capacity", "chosen", "ptr", "rows", "shape", "span", "spec", "store")

    def __init__(self, spec: LayoutSpec, buf: torch.Tensor, capacity: int) -> None:
        self.spec, self.buf, self.capacity = spec, buf, capacity
        self.ptr, self.shape = buf.data_ptr(), buf.shape
        self.span = span(buf) or (self.ptr, self.ptr)  # the bytes it spans
        raw = byte_rows(buf)
        self.rows = raw.view(spec.output_dtype)  # [capacity, dim] elements: what reads gather
        # What writes store into: the elements (index_copy_ moves 2-byte rows several times
        # faster than their uint8 view on the CPU), or the bytes for 1-byte (fp8) elements,
        # which index_copy_ does not take.
        self.store = self.rows if self.rows.element_size() > 1 else raw
        self.chosen: dict[Any, tuple[bool, Any]] = {}  # dispatch()'s memo for this buffer

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
        or dispatch(impl, spec, buf, write=False, fnuz=False, memo=plan.chosen)  # a kernel
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
    _check_out_shape(spec, out, (int(loc.shape[0]), spec.dim), buf.device)
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
    if fnuz or not parts or torch.compiler.is_compiling():
        return quantize_parts(parts, page_size, fnuz=fnuz, impl=impl)
    kernels = 0
    for (spec, rows, buf, _), plan in zip(parts, plans, strict=True):
        if plan is None or not plan.holds(buf):
            return quantize_parts(parts, page_size, fnuz=fnuz, impl=impl)
        kernels += dispatch(
            impl, spec, buf, write=True, fnuz=False, values_dtype=rows.dtype, memo=plan.chosen
        )
    if kernels == len(parts):
        return quantize_parts(parts, page_size, fnuz=fnuz, impl=impl)
    stores: list[Store] = []
    for (spec, given, _, loc), plan in zip(parts, plans, strict=True):
        target = plan.store  # type: ignore[union-attr]
        if not given.shape[0]:
            continue
        # Values that share memory with a buffer of this write are copied first (as
        # unaliased() does, with the buffers' address ranges known from their plans).
        rows = (
            given.clone(memory_format=torch.contiguous_format)
            if _touches_any(given, plans)
            else given
        )
        if rows.dtype != target.dtype:  # else the rows are the stored elements already
            rows = spec.codec.encode(spec, rows, fnuz=False)[0].view(target.dtype)
        stores.append((target, loc, rows))
    commit(stores)
    return None


def _touches_any(rows: torch.Tensor, plans: Sequence[BufferPlan | None]) -> bool:
    """Whether ``rows`` can share bytes with a buffer of ``plans`` (none of them None)."""
    mine = span(rows)
    if mine is not None:
        for plan in plans:
            if plan.span[0] < mine[1] and mine[0] < plan.span[1]:  # type: ignore[union-attr]
                return True
    return False


# ------------------------------------------------------------ many layers, one call


class LayersPlan:
    """One layout over the buffers of many layers, checked once for all their calls.

    What :func:`plan_layers` returns and :func:`read_layers` / :func:`write_layers` run:
    the buffers' geometry is checked when the plan is made, so a call checks only its
    locations and values, once for every layer. A Triton launch reads a table of the
    layers' base addresses (made on the first launch and kept), so every layer of the
    call is one launch; the torch twin runs the same call layer by layer, byte-equal.

    Attributes:
        spec: the layout every buffer holds.
        bufs: the layers' buffers, in call order.
        page_size: the pool's page size in tokens.
        capacity: token locations every buffer holds (the smallest buffer's).
        capacities: token locations each buffer holds, in call order.
        fnuz: the buffers hold ROCm e4m3fnuz V4 bytes.
    """

    __slots__ = (
        "_bases", "_spans", "bufs", "capacities", "capacity", "fnuz", "page_size", "ptrs", "spec",
    )  # fmt: skip

    def __init__(
        self,
        spec: LayoutSpec,
        bufs: tuple[torch.Tensor, ...],
        page_size: int,
        capacities: tuple[int, ...],
        *,
        fnuz: bool,
    ) -> None:
        self.spec, self.bufs, self.page_size = spec, bufs, page_size
        self.capacities, self.capacity, self.fnuz = capacities, min(capacities), fnuz
        self.ptrs = tuple(buf.data_ptr() for buf in bufs)
        self._bases: torch.Tensor | None = None
        self._spans: tuple[list[int], list[int]] | None = None

    def holds(self, bufs: Sequence[torch.Tensor]) -> bool:
        """Whether ``bufs`` are this plan's tensors, over the same memory."""
        return len(bufs) == len(self.bufs) and all(
            a is b and a.data_ptr() == ptr
            for a, b, ptr in zip(bufs, self.bufs, self.ptrs, strict=True)
        )

    def bases(self) -> torch.Tensor:
        """The layers' byte offsets from the first buffer, on their device (kept)."""
        if self._bases is None:
            self._bases = _launch().layer_bases(self.spec, self.bufs, self.page_size)
        return self._bases

    def touches(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` can share bytes with any of the buffers (address ranges only).

        The buffers' ranges are merged and sorted once; a call bisects them, so checking
        a write's values costs the same for 61 layers as for one.
        """
        mine = span(tensor)
        if mine is None or tensor.device != self.bufs[0].device:
            return False
        if self._spans is None:
            merged: list[list[int]] = []
            for start, end in sorted(s for s in map(span, self.bufs) if s is not None):
                if merged and start <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], end)
                else:
                    merged.append([start, end])
            self._spans = ([m[0] for m in merged], [m[1] for m in merged])
        starts, ends = self._spans
        last = bisect.bisect_left(starts, mine[1]) - 1  # the last range starting before ours ends
        return last >= 0 and ends[last] > mine[0]

    def __repr__(self) -> str:
        return (
            f"LayersPlan({self.spec.name!r}, layers={len(self.bufs)}, "
            f"page_size={self.page_size}, capacity={self.capacity})"
        )


def plan_layers(
    spec: LayoutSpec, bufs: Sequence[torch.Tensor], page_size: int, *, fnuz: bool = False
) -> LayersPlan:
    """Check every buffer of a multi-layer call once; the plan its calls run.

    Raises:
        LayoutError: no buffers, a buffer that does not hold ``spec`` pages of
            ``page_size`` tokens, or buffers on different devices.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import V4
        >>> bufs = [torch.zeros(2, V4.page_bytes(4), dtype=torch.uint8) for _ in range(3)]
        >>> plan_layers(V4, bufs, 4)
        LayersPlan('v4', layers=3, page_size=4, capacity=8)
    """
    if not bufs:
        msg = (
            "a multi-layer call needs at least one layer; received none. "
            "Hint: pass the layer ids to read, e.g. pool.layer_ids."
        )
        raise LayoutError(msg)
    size = check_page_size(spec, page_size)
    capacities = tuple(check_buffer(spec, buf, size) for buf in bufs)
    device, pitch = bufs[0].device, row_pitch(bufs[0])
    for buf in bufs:
        if buf.device != device:
            msg = (
                f"every layer's buffer must be on one device; received {device} and "
                f"{buf.device}. Hint: call once per device."
            )
            raise LayoutError(msg)
        if row_pitch(buf) != pitch:
            msg = (
                "every layer's rows must be the same number of bytes apart for one call; "
                f"received {pitch} and {row_pitch(buf)} (strides {buf.stride()}). Hint: plan "
                "layers whose buffers have the same strides together."
            )
            raise LayoutError(msg)
    return LayersPlan(spec, tuple(bufs), size, capacities, fnuz=fnuz)


def read_layers(
    plan: LayersPlan,
    loc: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    validate: bool = True,
    impl: Impl = "auto",
) -> torch.Tensor:
    """Read tokens ``loc`` of every layer of ``plan``: ``[layers, n, dim]``, one launch.

    The same bytes as one :func:`dequantize` per layer. ``loc`` is checked once (one host
    sync); with ``validate=False`` and a pre-allocated ``out`` the Triton path
    allocates nothing after the first call and can be captured in a CUDA graph.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import mha_layout
        >>> spec = mha_layout(1, 2, torch.float32)
        >>> bufs = [torch.arange(8.0).view(4, 1, 2) + 100 * i for i in range(2)]
        >>> read_layers(plan_layers(spec, bufs, 1), torch.tensor([3])).tolist()
        [[[6.0, 7.0]], [[106.0, 107.0]]]
    """
    spec, bufs = plan.spec, plan.bufs
    kernel = dispatch(impl, spec, bufs[0], write=False, fnuz=plan.fnuz)
    if validate:
        loc = check_layer_loc(
            loc, len(bufs), capacity=plan.capacity, device=bufs[0].device, error=LayoutError,
            unique=False, capacities=plan.capacities,
        )  # fmt: skip
    elif loc.dtype is not torch.int64 and loc.dtype is not torch.int32:
        loc = loc.long()
    n = int(loc.shape[-1])
    shape = (len(bufs), n, spec.dim)
    if out is not None:
        _check_out_shape(spec, out, shape, bufs[0].device)
    if kernel:
        if out is None:
            out = torch.empty(shape, dtype=spec.output_dtype, device=bufs[0].device)
        result: torch.Tensor = _launch().gather_dequantize_layers(
            spec, bufs, plan.bases(), loc, plan.page_size, out=out, fnuz=plan.fnuz
        )
        return result
    if out is None:
        out = torch.empty(shape, dtype=spec.output_dtype, device=bufs[0].device)
    loc64 = loc.long()
    plain = _plain_rows(spec)
    for layer, buf in enumerate(bufs):
        where = loc64[layer] if loc64.dim() == 2 else loc64
        if plain:
            torch.index_select(byte_rows(buf).view(spec.output_dtype), 0, where, out=out[layer])
        else:
            out[layer].copy_(dequantize_torch(spec, buf, where, plan.page_size, fnuz=plan.fnuz))
    return out


def check_layer_loc(
    loc: object,
    layers: int,
    *,
    capacity: int,
    device: torch.device,
    error: type[LayoutError] | type[WriteError],
    unique: bool,
    capacities: Sequence[int] | None = None,
) -> torch.Tensor:
    """A multi-layer call's ``loc`` as int64, checked once for every layer.

    1-D: the same locations on every layer (:func:`check_loc`). ``[layers, n]``: row ``l``
    is layer ``l``'s locations (a sparse step's per-layer top-k); every row in range (of its
    own layer's ``capacities[l]`` when given: layers of a composite's components hold
    different numbers of tokens) and, with ``unique``, free of repeats within the row.

    Example:
        >>> import torch
        >>> check_layer_loc(torch.tensor([[1, 2], [2, 1]]), 2, capacity=4,
        ...                 device=torch.device("cpu"), error=LayoutError, unique=True).shape
        torch.Size([2, 2])
    """
    if not isinstance(loc, torch.Tensor) or loc.dim() != 2:
        return check_loc(loc, capacity=capacity, device=device, error=error, unique=unique)
    if loc.shape[0] != layers:
        msg = (
            f"loc must be 1-D (every layer) or [{layers}, n] (one row per layer); received "
            f"shape {list(loc.shape)}. Hint: stack one row of locations per planned layer."
        )
        raise error(msg)
    widest = max(capacities) if capacities else capacity
    flat = check_loc(loc.reshape(-1), capacity=widest, device=device, error=error, unique=False)
    rows = flat.view(layers, -1)
    if capacities and min(capacities) != widest and rows.numel():
        limits = torch.tensor(capacities, device=rows.device).unsqueeze(1)
        over = rows >= limits
        if bool(over.any()):
            layer = int(over.any(dim=1).nonzero()[0, 0])
            msg = (
                f"loc row {layer} holds locations outside [0, {capacities[layer]}), the "
                f"tokens layer {layer} of the call holds: "
                f"{rows[layer][over[layer]].tolist()[:8]}. Hint: each row addresses its own "
                "layer's component."
            )
            raise error(msg)
    if unique and rows.shape[1] > 1:
        ordered = rows.sort(dim=1).values
        same = ordered[:, 1:] == ordered[:, :-1]
        if bool(same.any()):
            layer = int(same.any(dim=1).nonzero()[0, 0])
            msg = (
                f"loc repeats a location within row {layer} (layer {layer} of the call): "
                f"{sorted(set(ordered[layer, 1:][same[layer]].tolist()))[:8]}. A write must name "
                "each slot of a layer at most once. Hint: deduplicate each row."
            )
            raise error(msg)
    return rows


def _check_out_shape(
    spec: LayoutSpec, out: object, shape: tuple[int, ...], device: torch.device
) -> None:
    if (
        not isinstance(out, torch.Tensor)
        or tuple(out.shape) != shape
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
            f"out must be a contiguous {list(shape)} {spec.output_dtype} tensor on "
            f"{device} for layout {spec.name!r}; received {got}."
        )
        raise LayoutError(msg)


def write_layers(
    plan: LayersPlan,
    loc: torch.Tensor,
    values: object,
    *,
    check_finite: bool = True,
    validate: bool = True,
    impl: Impl = "auto",
) -> None:
    """Write ``values[l]`` as tokens ``loc`` of layer ``l`` of ``plan`` — all or nothing.

    ``values`` is ``[layers, n, dim]`` (or ``[layers, n, heads, head_dim]``). The same
    bytes as one :func:`quantize` per layer; ``loc`` and ``values`` are checked once,
    before any byte moves; the Triton path is one launch, the torch twin encodes every
    layer first and stores them with one all-or-nothing :func:`commit`.

    Raises:
        WriteError: bad locations (range, duplicates, dtype, device) or values (shape,
            dtype, device, non-finite with ``check_finite``); nothing is written.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import V4
        >>> bufs = [torch.zeros(1, V4.page_bytes(4), dtype=torch.uint8) for _ in range(2)]
        >>> plan = plan_layers(V4, bufs, 4)
        >>> write_layers(plan, torch.tensor([1]), torch.ones(2, 1, 512))
        >>> read_layers(plan, torch.tensor([1]))[:, 0, 0].tolist()
        [1.0, 1.0]
    """
    write_layer_parts(
        [(plan, values)], loc, check_finite=check_finite, validate=validate, impl=impl
    )


def write_layer_parts(
    parts: Sequence[tuple[LayersPlan, object]],
    loc: torch.Tensor,
    *,
    check_finite: bool = True,
    validate: bool = True,
    impl: Impl = "auto",
    what: Sequence[str] = ("key", "value"),
) -> None:
    """:func:`write_layers` of several buffer roles at once (keys and values): all or nothing.

    Every part is checked before any byte moves (``loc`` once per capacity); the kernel
    path launches once per part only when a kernel serves every part; the torch path
    encodes every layer of every part and stores them with one :func:`commit`.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import mha_layout
        >>> spec = mha_layout(1, 2, torch.float32)
        >>> k, v = [torch.zeros(4, 1, 2)], [torch.zeros(4, 1, 2)]
        >>> parts = [(plan_layers(spec, k, 1), torch.ones(1, 1, 2)),
        ...          (plan_layers(spec, v, 1), torch.full((1, 1, 2), 2.0))]
        >>> write_layer_parts(parts, torch.tensor([3]))
        >>> k[0][3].tolist(), v[0][3].tolist()
        ([[1.0, 1.0]], [[2.0, 2.0]])
    """
    checked: dict[tuple[int, ...], torch.Tensor] = {}
    ready: list[tuple[LayersPlan, torch.Tensor, torch.Tensor]] = []
    for index, (plan, values) in enumerate(parts):
        role = what[index] if index < len(what) else f"part {index}"
        ready.append(_check_layer_part(plan, loc, values, role, checked, check_finite, validate))
    plans = [plan for plan, _, _ in ready]
    ready = [(plan, _unaliased(rows, plans), loc64) for plan, rows, loc64 in ready]
    kernels = [
        dispatch(impl, plan.spec, plan.bufs[0], write=True, fnuz=plan.fnuz, values_dtype=rows.dtype)
        for plan, rows, _ in ready
    ]
    if ready and all(kernels):
        launch = _launch().quantize_scatter_layers
        for plan, rows, loc64 in ready:
            launch(plan.spec, rows, plan.bufs, plan.bases(), loc64, plan.page_size, fnuz=plan.fnuz)
        return
    commit([store for plan, rows, loc64 in ready for store in _layer_stores(plan, rows, loc64)])


def _unaliased(rows: torch.Tensor, plans: Sequence[LayersPlan]) -> torch.Tensor:
    """:func:`~kvcompat.layouts._validate.unaliased` against every buffer of ``plans``."""
    if any(plan.touches(rows) for plan in plans):
        return rows.clone(memory_format=torch.contiguous_format)
    return rows


def _layer_stores(plan: LayersPlan, rows: torch.Tensor, loc64: torch.Tensor) -> list[Store]:
    """Every layer of one checked part encoded: the scatters a :func:`commit` applies."""
    where = loc64.long()
    spec = plan.spec
    stores: list[Store] = []
    if _plain_rows(spec) and not plan.fnuz:
        # Whole rows: store the elements (index_copy_ moves 2-byte rows several times
        # faster than their bytes), or the bytes of 1-byte elements.
        for layer, buf in enumerate(plan.bufs):
            raw = byte_rows(buf)
            target = raw.view(spec.output_dtype) if spec.output_dtype.itemsize > 1 else raw
            source = rows[layer]
            if source.dtype != target.dtype:
                source = spec.codec.encode(spec, source, fnuz=False)[0].view(target.dtype)
            stores.append((target, where[layer] if where.dim() == 2 else where, source))
        return stores
    for layer, buf in enumerate(plan.bufs):
        at = where[layer] if where.dim() == 2 else where
        stores.extend(encode_part(spec, rows[layer], buf, at, plan.page_size, fnuz=plan.fnuz))
    return stores


def _plain_rows(spec: LayoutSpec) -> bool:
    """Whether ``spec`` is whole token rows of one element type (MHA, MLA): no scales, no pages."""
    return spec.codec is PLAIN_CODEC and not spec.paged and spec.data_bytes == spec.bytes_per_token


def _check_layer_part(
    plan: LayersPlan,
    loc: torch.Tensor,
    values: object,
    role: str,
    checked: dict[tuple[int, ...], torch.Tensor],
    check_finite: bool,
    validate: bool,
) -> tuple[LayersPlan, torch.Tensor, torch.Tensor]:
    """``(plan, rows [L, n, dim], loc)`` of one part, checked (``checked``: loc by capacity)."""
    spec, layers, device = plan.spec, len(plan.bufs), plan.bufs[0].device
    if not isinstance(values, torch.Tensor):
        msg = (
            f"the {role}s must be a [layers, n, dim] torch.Tensor; received "
            f"{type(values).__name__}. Hint: stack the layers' values, torch.stack([x0, x1])."
        )
        raise WriteError(msg)
    if not validate:
        n = int(loc.shape[-1])
        rows = values.reshape(layers, n, spec.dim)
        return plan, (rows.detach() if rows.requires_grad else rows), loc
    loc64 = checked.get(plan.capacities)
    if loc64 is None or loc64.device != device:
        loc64 = check_layer_loc(
            loc, layers, capacity=plan.capacity, device=device, error=WriteError, unique=True,
            capacities=plan.capacities,
        )  # fmt: skip
        checked[plan.capacities] = loc64
    n = int(loc64.shape[-1])
    if values.dim() < 2 or values.shape[0] != layers or values.shape[1] != n:
        msg = (
            f"the {role}s must hold one block per layer: shape [{layers}, {n}, {spec.dim}] "
            f"(or [{layers}, {n}, heads, head_dim]); received {list(values.shape)}. "
            "Hint: torch.stack the layers' values."
        )
        raise WriteError(msg)
    try:
        flat = check_values(
            spec, values.reshape(layers * n, *values.shape[2:]), layers * n, device,
            check_finite=check_finite,
        )  # fmt: skip
    except WriteError as exc:
        msg = f"writing the {role}s of {layers} layers: {exc}"
        raise WriteError(msg) from None
    return plan, flat.view(layers, n, spec.dim), loc64


# ------------------------------------------- many token spaces (a composite's components)


class SpacesPlan:
    """One layout over the layers of several token spaces, checked once for all their calls.

    What :func:`plan_spaces` returns and :func:`read_spaces` / :func:`write_spaces` run: the
    components of a composite pool that share a byte layout (a DeepSeek-V4 pool's
    sliding-window, c4 and c128 pages) but not a page size or a token space. Each space
    is a :class:`LayersPlan` of its own; on CUDA the e4m3-tile kernels read or write every
    layer of up to :data:`~kvcompat.kernels._launch.MAX_SEGMENTS` spaces in one launch,
    each layer with its own page geometry (a table made on the first launch and kept).
    Other layouts, and the torch twin, run one :class:`LayersPlan` call per space; the
    bytes are the same.

    Attributes:
        spec: the layout every buffer holds.
        spaces: one :class:`LayersPlan` per token space, in call order.
        fnuz: the buffers hold ROCm e4m3fnuz V4 bytes.
    """

    __slots__ = ("_chosen", "_serves", "_table", "_tabled", "fnuz", "spaces", "spec")

    def __init__(self, spec: LayoutSpec, spaces: tuple[LayersPlan, ...], *, fnuz: bool) -> None:
        self.spec, self.spaces, self.fnuz = spec, spaces, fnuz
        self._table: torch.Tensor | None = None
        self._tabled = False
        self._chosen: dict[Any, tuple[bool, Any]] = {}  # dispatch()'s memo (first buffer)
        self._serves: dict[tuple[bool, torch.dtype | None], bool] = {}  # segments_serve()

    def table(self) -> torch.Tensor | None:
        """Every layer's geometry for one launch over all the spaces, on their device (kept).

        None where their pages cannot share one launch (a page pitch that is not a
        multiple of 16 bytes); each space then takes its own.
        """
        if not self._tabled:
            groups = [(part.bufs, part.page_size) for part in self.spaces]
            self._table = _launch().segment_table(self.spec, groups)
            self._tabled = True
        return self._table

    def launch_table(
        self, impl: Impl, *, write: bool, values_dtype: torch.dtype | None
    ) -> torch.Tensor | None:
        """:meth:`table` where a call with this ``impl`` moves every space in one launch."""
        if not self.one_launch(impl, write=write, values_dtype=values_dtype):
            return None
        return self.table()

    def holds(self, bufs: Sequence[Sequence[torch.Tensor]]) -> bool:
        """Whether each space's buffers are still ``bufs[s]``, over the same memory."""
        return len(bufs) == len(self.spaces) and all(
            part.holds(group) for part, group in zip(self.spaces, bufs, strict=True)
        )

    def one_launch(self, impl: Impl, *, write: bool, values_dtype: torch.dtype | None) -> bool:
        """Whether a call with this ``impl`` moves every space in one launch."""
        if not 1 < len(self.spaces) <= _MAX_SPACES or not dispatch(
            impl, self.spec, self.spaces[0].bufs[0], write=write, fnuz=self.fnuz,
            values_dtype=values_dtype, memo=self._chosen,
        ):  # fmt: skip
            return False
        serves = self._serves.get((write, values_dtype))
        if serves is None:  # the kernel plan depends only on these: decided once
            serves = self._launch_serves(write, values_dtype)
        return serves

    def _launch_serves(self, write: bool, values_dtype: torch.dtype | None) -> bool:
        serves: bool = _launch().segments_serve(
            self.spec, write=write, values_dtype=values_dtype, fnuz=self.fnuz
        ) and (self.table() is not None)
        self._serves[write, values_dtype] = serves
        return serves

    def __repr__(self) -> str:
        sizes = ", ".join(f"{len(p.bufs)} x {p.page_size}" for p in self.spaces)
        return f"SpacesPlan({self.spec.name!r}, spaces=[{sizes}] (layers x page size))"


_MAX_SPACES = 4
"""As many token spaces as one launch takes (``kernels/_launch.py``'s ``MAX_SEGMENTS``)."""


def plan_spaces(
    spec: LayoutSpec,
    groups: Sequence[tuple[Sequence[torch.Tensor], int]],
    *,
    fnuz: bool = False,
) -> SpacesPlan:
    """Check every buffer of a call over several token spaces once; the plan its calls run.

    ``groups`` holds, per token space, its layers' buffers and its page size.

    Raises:
        LayoutError: no spaces, a space without buffers, a buffer that does not hold
            ``spec`` pages of its space's page size, or buffers on different devices.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import V4
        >>> swa = [torch.zeros(2, V4.page_bytes(8), dtype=torch.uint8) for _ in range(3)]
        >>> c4 = [torch.zeros(3, V4.page_bytes(2), dtype=torch.uint8) for _ in range(2)]
        >>> plan_spaces(V4, [(swa, 8), (c4, 2)])
        SpacesPlan('v4', spaces=[3 x 8, 2 x 2] (layers x page size))
    """
    if not groups:
        msg = (
            "a call over token spaces needs at least one space; received none. "
            "Hint: pass (buffers, page_size) per component."
        )
        raise LayoutError(msg)
    spaces = tuple(plan_layers(spec, bufs, page_size, fnuz=fnuz) for bufs, page_size in groups)
    device = spaces[0].bufs[0].device
    for part in spaces:
        if part.bufs[0].device != device:
            msg = (
                f"every space's buffers must be on one device; received {device} and "
                f"{part.bufs[0].device}. Hint: call once per device."
            )
            raise LayoutError(msg)
    return SpacesPlan(spec, spaces, fnuz=fnuz)


def read_spaces(
    plan: SpacesPlan,
    locs: Sequence[torch.Tensor],
    *,
    validate: bool = True,
    impl: Impl = "auto",
    names: Sequence[str] = (),
) -> list[torch.Tensor]:
    """Read tokens ``locs[s]`` of every layer of space ``s``: one ``[layers, n_s, dim]`` each.

    The same bytes as :func:`read_layers` per space. Each ``locs[s]`` is checked against
    its own space (one host sync each); where :meth:`SpacesPlan.one_launch` holds, every
    space's layers are read by one launch into one tensor, whose slices are returned.
    ``[layers, n]`` locations (a row per layer) are read one launch per space.

    Raises:
        LayoutError: not one location tensor per space, or a bad one; nothing is read.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import V4
        >>> swa = [torch.zeros(2, V4.page_bytes(8), dtype=torch.uint8) for _ in range(3)]
        >>> c4 = [torch.zeros(3, V4.page_bytes(2), dtype=torch.uint8) for _ in range(2)]
        >>> plan = plan_spaces(V4, [(swa, 8), (c4, 2)])
        >>> [tuple(t.shape) for t in read_spaces(plan, [torch.tensor([9, 1]), torch.tensor([5])])]
        [(3, 2, 512), (2, 1, 512)]
    """
    locs = _space_locs(plan, locs, LayoutError)
    spaces, spec = plan.spaces, plan.spec
    if validate:
        locs = [
            _check_space_loc(part, loc, names[place] if place < len(names) else f"space {place}")
            for place, (part, loc) in enumerate(zip(spaces, locs, strict=True))
        ]
    table = (
        plan.launch_table(impl, write=False, values_dtype=None)
        if all(loc.dim() == 1 for loc in locs)
        else None
    )
    if table is not None:
        locs = _one_dtype(locs)
        counts = [
            len(part.bufs) * int(loc.shape[0]) for part, loc in zip(spaces, locs, strict=True)
        ]
        first = spaces[0].bufs[0]
        out = torch.empty(sum(counts), spec.dim, dtype=spec.output_dtype, device=first.device)
        _launch().gather_dequantize_segments(
            spec, first, table, locs, [len(part.bufs) for part in spaces], out,
            page_size=spaces[0].page_size, fnuz=plan.fnuz,
        )  # fmt: skip
        found, start = [], 0
        for part, count in zip(spaces, counts, strict=True):
            found.append(out[start : start + count].view(len(part.bufs), -1, spec.dim))
            start += count
        return found
    return [
        read_layers(part, loc, validate=False, impl=impl)
        for part, loc in zip(spaces, locs, strict=True)
    ]


def _check_space_loc(
    part: LayersPlan,
    loc: object,
    label: str,
    error: type[LayoutError] | type[WriteError] = LayoutError,
    *,
    unique: bool = False,
) -> torch.Tensor:
    """One space's locations, checked; an error says which space (``label``)."""
    try:
        return check_layer_loc(
            loc, len(part.bufs), capacity=part.capacity, device=part.bufs[0].device,
            error=error, unique=unique, capacities=part.capacities,
        )  # fmt: skip
    except error as exc:
        msg = f"{label}: {exc}"
        raise error(msg) from None


def write_spaces(
    parts: Sequence[tuple[SpacesPlan, Sequence[torch.Tensor], Sequence[object]]],
    *,
    check_finite: bool = True,
    validate: bool = True,
    impl: Impl = "auto",
    names: Sequence[Sequence[str]] = (),
) -> None:
    """Write ``values[s]`` as tokens ``locs[s]`` of every layer of space ``s`` — all or nothing.

    ``parts`` are ``(plan, locs, values)``, one per layout (keys and values, or each layout
    of a composite); ``values[s]`` is ``[layers, n_s, dim]`` (or ``[..., heads,
    head_dim]``). Every part of every space is checked before any byte moves; the kernel
    path runs only where a kernel serves every part (one launch per part where
    :meth:`SpacesPlan.one_launch` holds, else one per space), and the torch twin encodes
    everything first and stores it with one :func:`commit`. ``names`` label the spaces
    in errors.

    Raises:
        WriteError: bad locations or values of any space; nothing is written.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import V4
        >>> swa = [torch.zeros(2, V4.page_bytes(8), dtype=torch.uint8) for _ in range(3)]
        >>> c4 = [torch.zeros(3, V4.page_bytes(2), dtype=torch.uint8) for _ in range(2)]
        >>> plan = plan_spaces(V4, [(swa, 8), (c4, 2)])
        >>> locs = [torch.tensor([9]), torch.tensor([5])]
        >>> write_spaces([(plan, locs, [torch.ones(3, 1, 512), torch.ones(2, 1, 512)])])
        >>> [t[:, 0, 0].tolist() for t in read_spaces(plan, locs)]
        [[1.0, 1.0, 1.0], [1.0, 1.0]]
    """
    ready: list[tuple[SpacesPlan, list[tuple[LayersPlan, torch.Tensor, torch.Tensor]]]] = []
    for index, (plan, locs, values) in enumerate(parts):
        checked_locs = _space_locs(plan, locs, WriteError)
        labels = names[index] if index < len(names) else ()
        if not isinstance(values, (list, tuple)) or len(values) != len(plan.spaces):
            got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
            msg = (
                f"write needs one values tensor per space ({len(plan.spaces)}); received "
                f"{got}. Hint: pass [values_0, values_1, ...] in the plan's space order."
            )
            raise WriteError(msg)
        spaces = []
        for place, (part, loc, given) in enumerate(
            zip(plan.spaces, checked_locs, values, strict=True)
        ):
            role = labels[place] if place < len(labels) else f"space {place}'s value"
            spaces.append(_check_space_part(part, loc, given, role, check_finite, validate))
        ready.append((plan, spaces))
    targets = [part for _, spaces in ready for part, _, _ in spaces]
    ready = [
        (plan, [(part, _unaliased(rows, targets), loc) for part, rows, loc in spaces])
        for plan, spaces in ready
    ]
    kernels = [
        dispatch(impl, plan.spec, plan.spaces[0].bufs[0], write=True, fnuz=plan.fnuz,
                 values_dtype=spaces[0][1].dtype)
        for plan, spaces in ready
    ]  # fmt: skip
    if ready and all(kernels):
        for plan, spaces in ready:
            _write_space_kernels(plan, spaces, impl)
        return
    commit([
        store for _, spaces in ready for part, rows, loc in spaces
        for store in _layer_stores(part, rows, loc)
    ])  # fmt: skip


def _check_space_part(
    part: LayersPlan,
    loc: torch.Tensor,
    values: object,
    role: str,
    check_finite: bool,
    validate: bool,
) -> tuple[LayersPlan, torch.Tensor, torch.Tensor]:
    """:func:`_check_layer_part` of one space, its locations checked first as that space's."""
    checked: dict[tuple[int, ...], torch.Tensor] = {}
    if validate:
        checked[part.capacities] = _check_space_loc(part, loc, role, WriteError, unique=True)
    return _check_layer_part(part, loc, values, role, checked, check_finite, validate)


def _write_space_kernels(
    plan: SpacesPlan, spaces: list[tuple[LayersPlan, torch.Tensor, torch.Tensor]], impl: Impl
) -> None:
    dtypes = {rows.dtype for _, rows, _ in spaces}
    locs = [loc for _, _, loc in spaces]
    table = (
        plan.launch_table(impl, write=True, values_dtype=dtypes.pop())
        if len(dtypes) == 1 and all(loc.dim() == 1 for loc in locs)
        else None
    )
    if table is not None:
        first = plan.spaces[0]
        _launch().quantize_scatter_segments(
            plan.spec, [rows.reshape(-1, plan.spec.dim) for _, rows, _ in spaces],
            first.bufs[0], table, _one_dtype(locs), [len(p.bufs) for p in plan.spaces],
            page_size=first.page_size, fnuz=plan.fnuz,
        )  # fmt: skip
        return
    launch = _launch().quantize_scatter_layers
    for part, rows, loc in spaces:
        launch(part.spec, rows, part.bufs, part.bases(), loc, part.page_size, fnuz=part.fnuz)


def _space_locs(
    plan: SpacesPlan, locs: object, error: type[LayoutError] | type[WriteError]
) -> list[torch.Tensor]:
    if not isinstance(locs, (list, tuple)) or len(locs) != len(plan.spaces):
        got = f"{len(locs)} entries" if isinstance(locs, (list, tuple)) else type(locs).__name__
        msg = (
            f"a call over {len(plan.spaces)} token spaces needs one loc per space, in the "
            f"plan's order; received {got}. Hint: pass [loc_0, loc_1, ...], each in its "
            "own space."
        )
        raise error(msg)
    return list(locs)


def _one_dtype(locs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The locations as one integer dtype (a launch addresses all of them from the first)."""
    if all(loc.dtype is locs[0].dtype for loc in locs) and locs[0].dtype in (
        torch.int64, torch.int32
    ):  # fmt: skip
        return list(locs)
    return [loc.long() for loc in locs]


# ------------------------------------------------------ raw rows of many buffers (page moves)


def _check_row_buffers(bufs: object, what: str) -> tuple[int, int, int]:
    """``(row_bytes, rows, row_stride)`` of 2-D uint8 row buffers, or LayoutError."""
    if not isinstance(bufs, (list, tuple)) or not bufs:
        msg = (
            f"{what} must be a non-empty list of 2-D uint8 tensors; received "
            f"{type(bufs).__name__ if not isinstance(bufs, (list, tuple)) else 'an empty list'}. "
            "Hint: a paged buffer's pages are buf.view(torch.uint8).reshape(num_pages, -1)."
        )
        raise LayoutError(msg)
    first = bufs[0]
    for i, buf in enumerate(bufs):
        if (
            not isinstance(buf, torch.Tensor)
            or buf.dtype != torch.uint8
            or buf.dim() != 2
            or (buf.shape[1] > 1 and buf.stride(1) != 1)
            or buf.shape[1] != first.shape[1]
            or buf.stride(0) != first.stride(0)
            or buf.device != first.device
        ):
            got = (
                f"shape {list(buf.shape)}, strides {list(buf.stride())}, dtype {buf.dtype}, "
                f"device {buf.device}"
                if isinstance(buf, torch.Tensor)
                else type(buf).__name__
            )
            msg = (
                f"{what}[{i}] must be a 2-D uint8 tensor of rows with unit column stride and "
                f"the same row width, row stride and device as {what}[0] (shape "
                f"{list(first.shape)}, strides {list(first.stride())}, {first.device}); "
                f"received {got}."
            )
            raise LayoutError(msg)
    return int(first.shape[1]), min(int(b.shape[0]) for b in bufs), int(first.stride(0))


def gather_rows_layers(
    srcs: Sequence[torch.Tensor],
    rows: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    impl: Impl = "auto",
) -> torch.Tensor:
    """Copy rows ``rows`` of every buffer in ``srcs`` into ``out[l]``: raw bytes, one launch.

    The raw form of a multi-layer page move (a transfer's pack step): each ``srcs[l]`` is
    a 2-D uint8 view ``[R, row_bytes]`` (a page per row; the row stride may exceed the row),
    ``rows`` 1-D integer row indices (may repeat), ``out`` uint8 ``[L, n, row_bytes]``.
    On CUDA with triton one launch moves every layer; elsewhere one ``index_select`` a
    layer. Nothing is decoded.

    Raises:
        LayoutError: bad buffers, rows out of range, or a bad ``out``.

    Example:
        >>> import torch
        >>> pages = [torch.arange(12, dtype=torch.uint8).view(3, 4) + 100 * i for i in range(2)]
        >>> gather_rows_layers(pages, torch.tensor([2, 0]))[1].tolist()
        [[108, 109, 110, 111], [100, 101, 102, 103]]
    """
    check_impl(impl)
    row_bytes, count, stride = _check_row_buffers(srcs, "srcs")
    device = srcs[0].device
    rows = check_loc(rows, capacity=count, device=device, error=LayoutError, unique=False)
    shape = (len(srcs), int(rows.shape[0]), row_bytes)
    if out is None:
        out = torch.empty(shape, dtype=torch.uint8, device=device)
    elif (
        not isinstance(out, torch.Tensor)
        or tuple(out.shape) != shape
        or out.dtype != torch.uint8
        or out.device != device
        or not out.is_contiguous()
    ):
        got = (
            f"shape {list(out.shape)}, dtype {out.dtype}"
            if isinstance(out, torch.Tensor)
            else (type(out).__name__)
        )
        msg = f"out must be a contiguous uint8 {list(shape)} tensor on {device}; received {got}."
        raise LayoutError(msg)
    if _rows_kernel(impl, srcs):
        _launch().copy_rows_layers(
            srcs[0], _row_bases(srcs), rows, out, row_bytes=row_bytes, row_stride=stride,
            gather=True, addresses=[s.data_ptr() for s in srcs],
        )  # fmt: skip
        return out
    wide = _wide_rows([*srcs, out[0]])
    if wide is None:
        for layer, src in enumerate(srcs):
            torch.index_select(src, 0, rows, out=out[layer])
        return out
    dense = out.view(wide)
    for layer, src in enumerate(srcs):
        torch.index_select(src.view(wide), 0, rows, out=dense[layer])
    return out


def _wide_rows(views: Sequence[torch.Tensor]) -> torch.dtype | None:
    """The widest integer type that every uint8 row view can be read as (None: bytes).

    ``index_select`` / ``index_copy_`` move 8-byte words several times faster than bytes on
    the CPU; a view qualifies when its row width, row stride and address divide the word.
    """
    first = views[0]
    width = int(first.shape[-1])
    for dtype in (torch.int64, torch.int32, torch.int16):
        size = dtype.itemsize
        if width % size == 0 and all(
            view.data_ptr() % size == 0
            and view.storage_offset() % size == 0
            and all(stride % size == 0 for stride in view.stride()[:-1])
            for view in views
        ):
            return dtype
    return None


def scatter_rows_layers(
    dsts: Sequence[torch.Tensor],
    rows: torch.Tensor,
    src: torch.Tensor,
    *,
    impl: Impl = "auto",
    validate: bool = True,
) -> None:
    """Copy ``src[l]`` (uint8 ``[L, n, row_bytes]``) into rows ``rows`` of ``dsts[l]``.

    All or nothing.

    The inverse of :func:`gather_rows_layers` (a transfer's unpack step). Everything is
    checked before any byte moves (rows in range and distinct, ``src``'s shape, dtype
    and device); on the torch path the stores are one all-or-nothing :func:`commit`.

    Raises:
        WriteError: bad rows or ``src``; nothing is written.
        LayoutError: bad buffers.

    Example:
        >>> import torch
        >>> pages = [torch.zeros(3, 2, dtype=torch.uint8) for _ in range(2)]
        >>> src = torch.full((2, 1, 2), 7, dtype=torch.uint8)
        >>> scatter_rows_layers(pages, torch.tensor([1]), src)
        >>> pages[1].tolist()
        [[0, 0], [7, 7], [0, 0]]
    """
    check_impl(impl)
    row_bytes, count, stride = _check_row_buffers(dsts, "dsts")
    device = dsts[0].device
    if validate:
        rows = check_loc(rows, capacity=count, device=device, error=WriteError, unique=True)
        shape = (len(dsts), int(rows.shape[0]), row_bytes)
        if (
            not isinstance(src, torch.Tensor)
            or tuple(src.shape) != shape
            or src.dtype != torch.uint8
            or src.device != device
        ):
            got = (
                f"shape {list(src.shape)}, dtype {src.dtype}, device {src.device}"
                if isinstance(src, torch.Tensor)
                else type(src).__name__
            )
            msg = f"src must be a uint8 {list(shape)} tensor on {device}; received {got}."
            raise WriteError(msg)
    src = unaliased(src, dsts)
    if _rows_kernel(impl, dsts):
        _launch().copy_rows_layers(
            dsts[0], _row_bases(dsts), rows, src.contiguous(), row_bytes=row_bytes,
            row_stride=stride, gather=False, addresses=[d.data_ptr() for d in dsts],
        )  # fmt: skip
        return
    rows64 = rows.long()
    source = src.contiguous()
    wide = _wide_rows([*dsts, source[0]]) if source.numel() else None
    if wide is None:
        commit([(dst, rows64, source[layer]) for layer, dst in enumerate(dsts)])
        return
    words = source.view(wide)
    commit([(dst.view(wide), rows64, words[layer]) for layer, dst in enumerate(dsts)])


class RowMoves:
    """Row moves from fixed source buffers into fixed destinations, checked once.

    What :func:`move_rows_layers` runs, kept by a caller that moves rows between the same
    buffers again and again (a direct pull, once per request): the buffers' widths,
    pitches, devices and overlap are checked here, and each :meth:`run` only checks the
    rows (or nothing, with ``validate=False``) before its one launch.

    Raises:
        LayoutError: bad buffers, or as many sources as destinations not given.

    Example:
        >>> import torch
        >>> a = [torch.arange(6, dtype=torch.uint8).view(3, 2) + 10 * i for i in range(2)]
        >>> b = [torch.zeros(4, 2, dtype=torch.uint8) for _ in range(2)]
        >>> moves = RowMoves(a, b)
        >>> moves.run(torch.tensor([2]), torch.tensor([0]))
        >>> b[1][0].tolist()
        [14, 15]
    """

    __slots__ = (
        "_bases", "_counts", "_dst_pitch", "_impl", "_overlap", "_row_bytes", "_src_pitch",
        "_wide", "_word", "dsts", "srcs",
    )  # fmt: skip

    def __init__(
        self, srcs: Sequence[torch.Tensor], dsts: Sequence[torch.Tensor], *, impl: Impl = "auto"
    ) -> None:
        check_impl(impl)
        row_bytes, src_count, src_pitch = _check_row_buffers(srcs, "srcs")
        dst_bytes, dst_count, dst_pitch = _check_row_buffers(dsts, "dsts")
        device = dsts[0].device
        if len(srcs) != len(dsts) or row_bytes != dst_bytes or srcs[0].device != device:
            msg = (
                f"srcs and dsts must pair layer for layer with rows of one width on one "
                f"device; received {len(srcs)} sources of {row_bytes} B rows on "
                f"{srcs[0].device} and {len(dsts)} destinations of {dst_bytes} B rows on "
                f"{device}."
            )
            raise LayoutError(msg)
        self.srcs, self.dsts = list(srcs), list(dsts)
        self._impl: Impl = impl
        self._row_bytes, self._src_pitch, self._dst_pitch = row_bytes, src_pitch, dst_pitch
        self._counts = (src_count, dst_count)
        self._overlap = _any_overlap(self.srcs, self.dsts)
        kernel = not self._overlap and _rows_kernel(impl, self.dsts)
        # Planned once, not per run: the launch's bases and word size, or the twin's word views.
        self._bases = (_row_bases(self.srcs), _row_bases(self.dsts)) if kernel else None
        self._word = word_bytes(
            row_bytes, src_pitch, dst_pitch, *(t.data_ptr() for t in (*self.srcs, *self.dsts))
        )
        self._wide = None if kernel or self._overlap else _wide_rows([*self.srcs, *self.dsts])

    def check(
        self, src_rows: torch.Tensor, dst_rows: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(src_rows, dst_rows)`` checked for :meth:`run` (one host sync); nothing moves.

        In range of their buffers, the destinations distinct, as many of each. Check every
        batch of a move first to keep several runs all or nothing together.

        Raises:
            WriteError: bad rows.
        """
        device = self.dsts[0].device
        src_rows = check_loc(
            src_rows, capacity=self._counts[0], device=device, error=WriteError, unique=False
        )
        dst_rows = check_loc(
            dst_rows, capacity=self._counts[1], device=device, error=WriteError, unique=True
        )
        if src_rows.shape != dst_rows.shape:
            msg = (
                f"src_rows and dst_rows must name as many rows; received {src_rows.shape[0]} "
                f"and {dst_rows.shape[0]}."
            )
            raise WriteError(msg)
        return src_rows, dst_rows

    def run(self, src_rows: torch.Tensor, dst_rows: torch.Tensor, *, validate: bool = True) -> None:
        """Copy row ``src_rows[i]`` of every source to row ``dst_rows[i]`` of its destination.

        All or nothing. With ``validate`` the rows are checked first (:meth:`check`);
        without, nothing is checked.

        Raises:
            WriteError: bad rows; nothing is written.
        """
        if validate:
            src_rows, dst_rows = self.check(src_rows, dst_rows)
        srcs, dsts = self.srcs, self.dsts
        if self._overlap:  # every source row read before any destination row is written
            moved = gather_rows_layers(srcs, src_rows, impl=self._impl)
            scatter_rows_layers(dsts, dst_rows, moved, impl=self._impl, validate=False)
            return
        if self._bases is not None:
            _launch().move_rows_layers(
                srcs[0], self._bases[0], src_rows, dsts[0], self._bases[1], dst_rows,
                row_bytes=self._row_bytes, src_pitch=self._src_pitch,
                dst_pitch=self._dst_pitch, word=self._word,
            )  # fmt: skip
            return
        if self._wide is not None:
            srcs = [t.view(self._wide) for t in srcs]
            dsts = [t.view(self._wide) for t in dsts]
        take, put = src_rows.long(), dst_rows.long()
        commit([(d, put, t.index_select(0, take)) for t, d in zip(srcs, dsts, strict=True)])


def move_rows_layers(
    srcs: Sequence[torch.Tensor],
    src_rows: torch.Tensor,
    dsts: Sequence[torch.Tensor],
    dst_rows: torch.Tensor,
    *,
    impl: Impl = "auto",
    validate: bool = True,
) -> None:
    """Copy row ``src_rows[i]`` of ``srcs[l]`` to row ``dst_rows[i]`` of ``dsts[l]``: one pass.

    All or nothing.

    The pool-to-pool form of a page move (a direct transfer): no staging buffer, so each
    byte is read and written once. Each ``srcs[l]`` / ``dsts[l]`` is a 2-D uint8 view of
    rows (pages); every source has one row width and pitch, every destination too, and the
    widths agree. On CUDA with triton one launch moves every layer; elsewhere one
    ``index_select`` a layer, stored with one all-or-nothing :func:`commit`. Where a source
    shares memory with a destination the rows are staged first, so the result is that of
    reading every source row before writing any. To move rows between the same buffers
    repeatedly, keep a :class:`RowMoves` (the buffer checks are made once).

    Raises:
        WriteError: ``src_rows`` / ``dst_rows`` out of range, of different lengths, or
            ``dst_rows`` repeating a row (checked with ``validate``); nothing is written.
        LayoutError: bad buffers, or as many sources as destinations not given.

    Example:
        >>> import torch
        >>> a = [torch.arange(6, dtype=torch.uint8).view(3, 2) + 10 * i for i in range(2)]
        >>> b = [torch.zeros(4, 2, dtype=torch.uint8) for _ in range(2)]
        >>> move_rows_layers(a, torch.tensor([2, 0]), b, torch.tensor([1, 3]))
        >>> b[1].tolist()
        [[0, 0], [14, 15], [0, 0], [10, 11]]
    """
    RowMoves(srcs, dsts, impl=impl).run(src_rows, dst_rows, validate=validate)


def _any_overlap(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> bool:
    """Whether a tensor of ``a`` can share bytes with one of ``b``: one sweep, not |a| x |b|."""
    spans = sorted(
        (found[0], found[1], side)
        for side, group in enumerate((a, b))
        for tensor in group
        if (found := span(tensor)) is not None
    )
    reach = [-1, -1]  # the furthest end seen so far on each side
    for lo, hi, side in spans:
        if lo < reach[1 - side]:
            return True
        reach[side] = max(reach[side], hi)
    return False


def _rows_kernel(impl: Impl, bufs: Sequence[torch.Tensor]) -> bool:
    """Whether a raw row move launches the kernel (CUDA, triton importable, or asked for)."""
    if impl == "torch":
        return False
    if impl == "triton":
        return True
    if bufs[0].device.type != "cuda":
        return False
    try:
        _launch()
    except ImportError:
        return False
    return True


_ROW_BASES: dict[tuple[int, ...], torch.Tensor] = {}


def _row_bases(bufs: Sequence[torch.Tensor]) -> torch.Tensor:
    """The buffers' byte offsets from the first, on their device (memoised by addresses)."""
    key = tuple(buf.data_ptr() for buf in bufs)
    hit = _ROW_BASES.get(key)
    if hit is None or hit.device != bufs[0].device:
        if len(_ROW_BASES) > 256:
            _ROW_BASES.clear()
        origin = key[0]
        hit = torch.tensor([p - origin for p in key], dtype=torch.int64).to(bufs[0].device)
        _ROW_BASES[key] = hit
    return hit


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
