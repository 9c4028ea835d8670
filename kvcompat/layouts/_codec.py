"""The function-level seam an adapter calls: :func:`dequantize` and :func:`quantize`.

Validation always runs here, in torch (``validate=True``). The work itself is either the
pure-torch path ("torch twin": gather or encode, scatter) or one fused Triton kernel from
:mod:`kvcompat.kernels`, which writes the same bytes; ``impl`` picks: ``"auto"`` (the
default) takes the kernel for CUDA tensors when triton is installed and a kernel serves
the call, the twin otherwise; ``"torch"`` and ``"triton"`` force one. Triton is imported
only when a kernel is actually chosen. ``KVCOMPAT_IMPL`` sets what ``"auto"`` means; the
choice is logged on the ``"kvcompat"`` logger and :func:`kvcompat.kernels.which_impl`
tells it in advance (``docs/logging.md``). Under ``torch.compile`` both entry points run
as ``torch.library`` custom ops (:mod:`kvcompat._ops`).

Writes are all or nothing (see ``docs/atomic-writes.md``). On the torch path every part of
a write (key, value; data rows, scale rows) and every CPU chunk is encoded before the
first byte of the pool moves; the bytes every scatter but the last one will overwrite are
saved, and restored if anything raises before the write completes. Each scatter is one
``index_copy_``. On the Triton path everything is checked (locations, values, and that a
kernel serves every part) before the first launch, and each part is one fused kernel.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import torch

# Imported here, not inside the traced branch: Dynamo must never trace an import (with
# the lazy top-level package, that would run kvcompat.__getattr__ inside the graph).
from kvcompat import _ops
from kvcompat._errors import ImplError, LayoutError
from kvcompat._protocol import Impl
from kvcompat.kernels._select import dispatch
from kvcompat.layouts._addressing import gather_rows, scatter_targets
from kvcompat.layouts._plain import PLAIN_CODEC
from kvcompat.layouts._registry import get_layout
from kvcompat.layouts._validate import check_read, check_write, unaliased

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from kvcompat.layouts._spec import LayoutSpec

__all__ = [
    "Impl",
    "check_impl",
    "commit",
    "dequantize",
    "encode_part",
    "quantize",
    "quantize_parts",
]

# Defined once, in kvcompat._protocol (re-exported here for the codec's callers).

CPU_CHUNK_TOKENS = 4096
"""On CPU, tokens are encoded and decoded this many at a time, so that the fp32
temporaries of a chunk stay cache-sized (2-3x faster than one pass at 65536 tokens on the
benchmark machine). Other devices take the whole batch at once."""


def _chunks(count: int, device: torch.device) -> Iterator[slice]:
    step = CPU_CHUNK_TOKENS if device.type == "cpu" else max(count, 1)
    for start in range(0, count, step):
        yield slice(start, min(count, start + step))


def _resolve(layout: object, *, fnuz: bool) -> LayoutSpec:
    spec = get_layout(layout)
    if fnuz and not spec.supports_fnuz:
        msg = (
            f"fnuz=True selects the ROCm e4m3fnuz bytes of the V4 layout; layout "
            f"{spec.name!r} has no fnuz variant. Hint: drop fnuz=True."
        )
        raise LayoutError(msg)
    return spec


_LAUNCHERS: list[Any] = []


def _launchers() -> Any:
    """``kvcompat.kernels._launch`` (imports triton on first use; ImportError names pip)."""
    if not _LAUNCHERS:
        from kvcompat import kernels  # noqa: PLC0415 - keeps `import kvcompat` light

        kernels.gather_dequantize  # noqa: B018 - raises the pip-install ImportError
        _LAUNCHERS.append(importlib.import_module("kvcompat.kernels._launch"))
    return _LAUNCHERS[0]


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


def _use_kernel(
    impl: object,
    spec: LayoutSpec,
    buf: object,
    *,
    write: bool,
    fnuz: bool,
    values_dtype: torch.dtype | None = None,
) -> bool:
    """Whether this call goes to a Triton kernel (decided and logged in ``kernels._select``)."""
    return dispatch(impl, spec, buf, write=write, fnuz=fnuz, values_dtype=values_dtype)


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
    spec = _resolve(layout, fnuz=fnuz)
    if torch.compiler.is_compiling():  # one custom op: no graph break (kvcompat._ops)
        return _ops.dequantize(
            spec, buf, loc, page_size, fnuz=fnuz, validate=validate, impl=impl, out=out
        )
    kernel = _use_kernel(impl, spec, buf, write=False, fnuz=fnuz)
    if validate:
        loc = check_read(spec, buf, loc, page_size)
    if out is not None:
        _check_out(spec, out, int(loc.shape[0]), buf.device)
    if kernel:
        dense: torch.Tensor = _launchers().gather_dequantize(
            spec, buf, loc, page_size, out=out, fnuz=fnuz
        )
        return dense
    result = _dequantize_torch(spec, buf, loc.long(), page_size, fnuz=fnuz)
    if out is None:
        return result
    return out.copy_(result)


def _dequantize_torch(
    spec: LayoutSpec, buf: torch.Tensor, loc64: torch.Tensor, page_size: int, *, fnuz: bool
) -> torch.Tensor:
    parts = []
    for part in _chunks(loc64.numel(), buf.device):
        data, scale = gather_rows(spec, buf, loc64[part], page_size)
        parts.append(spec.codec.decode(spec, data, scale, fnuz=fnuz))
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return torch.empty((0, spec.dim), dtype=spec.output_dtype, device=buf.device)
    return torch.cat(parts)


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
    spec = _resolve(layout, fnuz=fnuz)
    if torch.compiler.is_compiling():  # one custom op: no graph break (kvcompat._ops)
        _ops.quantize(
            spec, values, buf, loc, page_size, fnuz=fnuz, check_finite=check_finite,
            validate=validate, impl=impl,
        )  # fmt: skip
        return
    dtype = values.dtype if isinstance(values, torch.Tensor) else None
    kernel = _use_kernel(impl, spec, buf, write=True, fnuz=fnuz, values_dtype=dtype)
    if validate:
        rows, loc = check_write(spec, buf, loc, values, page_size, check_finite=check_finite)
    else:
        rows = values.reshape(values.shape[0], spec.dim)
        rows = rows.detach() if rows.requires_grad else rows
    rows = unaliased(rows, (buf,))
    if kernel:
        _launchers().quantize_scatter(spec, rows, buf, loc, page_size, fnuz=fnuz)
        return
    commit(encode_part(spec, rows, buf, loc.long(), page_size, fnuz=fnuz))


Store = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""One scatter of a write: ``(rows_view, index, source)``, applied as
``rows_view.index_copy_(0, index, source)``."""


def _encode_rows(
    spec: LayoutSpec, rows: torch.Tensor, *, fnuz: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode all ``rows`` (chunk by chunk on the CPU) before anything is stored."""
    n = rows.shape[0]
    steps = [slice(0, n)] if spec.codec is PLAIN_CODEC else list(_chunks(n, rows.device))
    if len(steps) <= 1:
        return spec.codec.encode(spec, rows, fnuz=fnuz)
    data = torch.empty((n, spec.data_bytes), dtype=torch.uint8, device=rows.device)
    scale = torch.empty((n, spec.scale_bytes_written), dtype=torch.uint8, device=rows.device)
    for step in steps:
        data[step], scale[step] = spec.codec.encode(spec, rows[step], fnuz=fnuz)
    return data, scale


def encode_part(
    spec: LayoutSpec,
    rows: torch.Tensor,
    buf: torch.Tensor,
    loc64: torch.Tensor,
    page_size: int,
    *,
    fnuz: bool,
) -> list[Store]:
    """Encode one buffer's part of a write into its scatters; nothing is stored yet.

    ``rows`` are the validated ``[n, dim]`` values and ``loc64`` the int64 locations
    (:func:`check_write`'s results).

    Example:
        >>> import torch
        >>> from kvcompat.layouts import V4
        >>> buf = torch.zeros(1, V4.page_bytes(64), dtype=torch.uint8)
        >>> stores = encode_part(V4, torch.ones(2, 512), buf, torch.tensor([0, 1]), 64, fnuz=False)
        >>> [tuple(source.shape) for _, _, source in stores], int(buf.count_nonzero())
        ([(2, 576), (2, 7)], 0)
    """
    if rows.shape[0] == 0:
        return []
    data, scale = _encode_rows(spec, rows, fnuz=fnuz)
    targets = scatter_targets(spec, buf, loc64, page_size)
    return [
        (view, index, source) for (view, index), source in zip(targets, (data, scale), strict=False)
    ]


def commit(stores: Sequence[Store]) -> None:
    """Apply every scatter of a write, all or nothing.

    The scatters run smallest first. Before the first one, the bytes that every scatter
    but the last (the largest) will overwrite are read back; if anything raises before
    the last scatter has returned, they are put back, so the buffers hold exactly what
    they held before. The last scatter needs no copy: a single ``index_copy_`` either
    stores all its rows or raises before storing any.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import V4
        >>> buf = torch.zeros(1, V4.page_bytes(64), dtype=torch.uint8)
        >>> commit(encode_part(V4, torch.ones(1, 512), buf, torch.tensor([3]), 64, fnuz=False))
        >>> int(buf[0, 3 * 576])  # token 3's first e4m3 code (1.0 at scale 2**-8)
        120
    """
    if not stores:
        return
    ordered = sorted(stores, key=lambda store: store[2].numel())
    saved = [view.index_select(0, index) for view, index, _ in ordered[:-1]]
    started = 0
    try:
        for view, index, source in ordered:
            started += 1
            view.index_copy_(0, index, source)
    except BaseException:
        for (view, index, _), old in zip(ordered[:started], saved, strict=False):
            view.index_copy_(0, index, old)
        raise


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
        # stored by one custom op (kvcompat._ops). The save-and-restore rollback across
        # parts and the alias copy are eager-mode guarantees (docs/atomic-writes.md).
        for spec, rows, buf, loc in parts:
            _ops.quantize(
                spec, rows, buf, loc, page_size, fnuz=fnuz, check_finite=False,
                validate=False, impl=impl,
            )  # fmt: skip
        return
    buffers = tuple(buf for _, _, buf, _ in parts)
    parts = [(spec, unaliased(rows, buffers), buf, loc) for spec, rows, buf, loc in parts]
    kernels = [
        _use_kernel(impl, spec, buf, write=True, fnuz=fnuz, values_dtype=rows.dtype)
        for spec, rows, buf, _ in parts
    ]
    if all(kernels) and parts:
        launch = _launchers().quantize_scatter
        for spec, rows, buf, loc in parts:
            launch(spec, rows, buf, loc, page_size, fnuz=fnuz)
        return
    stores: list[Store] = []
    for spec, rows, buf, loc in parts:
        stores.extend(encode_part(spec, rows, buf, loc.long(), page_size, fnuz=fnuz))
    commit(stores)
