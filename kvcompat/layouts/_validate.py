"""Checks that run before any byte moves: buffer geometry, locations, values.

Every failure raises :class:`~kvcompat.LayoutError` (the buffer or page size does not fit
the layout, or a read location is invalid) or :class:`~kvcompat.WriteError` (a write's
locations or values are invalid). Nothing here modifies its inputs.

Policies:

* **Duplicate locations** in one write raise ``WriteError``: on a GPU the surviving value
  would be whichever thread stored last, so the result would not be reproducible.
  Reads may repeat locations.
* **NaN / Inf**: with ``check_finite=True`` (the default) a write raises ``WriteError``
  when any value is NaN or +-Inf, or (for layouts that store values without a scale) when
  a finite value exceeds the storage format's largest finite magnitude. With
  ``check_finite=False`` the codecs encode such values exactly as SGLang's store would;
  each layout's page documents what that is.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from kvcompat._errors import LayoutError, WriteError
from kvcompat.layouts._addressing import byte_rows

if TYPE_CHECKING:
    from kvcompat.layouts._spec import LayoutSpec

__all__ = ["check_buffer", "check_page_size", "check_read", "check_write"]

_INTEGER_DTYPES = frozenset(
    {
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.uint16,
        torch.uint32,
        torch.uint64,
    }
)
_SHOWN = 5  # offending values quoted in an error message


def _preview(values: torch.Tensor) -> str:
    shown = ", ".join(str(v) for v in values[:_SHOWN].tolist())
    return shown + (", ..." if values.numel() > _SHOWN else "")


def check_page_size(spec: LayoutSpec, page_size: object) -> int:
    """``page_size`` as a positive int, or :class:`~kvcompat.LayoutError`."""
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size <= 0:
        msg = (
            f"page_size must be a positive int; received {page_size!r} "
            f"({type(page_size).__name__}) for layout {spec.name!r}. "
            "Hint: pass the pool's page_size attribute."
        )
        raise LayoutError(msg)
    return page_size


def check_buffer(spec: LayoutSpec, buf: object, page_size: int) -> int:
    """Check that ``buf`` holds ``spec`` pages of ``page_size`` tokens; return the capacity.

    The capacity is the number of token locations the buffer holds: ``num_pages * P`` for
    paged layouts, the number of rows for token-major ones.
    """
    if not isinstance(buf, torch.Tensor):
        msg = f"buf must be a torch.Tensor; received {type(buf).__name__} for {spec.name!r}."
        raise LayoutError(msg)
    if buf.dim() < 1 or not buf.is_contiguous():
        msg = (
            f"buf for layout {spec.name!r} must be a contiguous tensor of at least one "
            f"dimension; received shape {tuple(buf.shape)} with strides {buf.stride()}. "
            "Hint: pass the pool's per-layer buffer itself (kv_buffer[i]), not a strided view."
        )
        raise LayoutError(msg)
    row_bytes = byte_rows(buf).shape[1] if buf.numel() else 0
    per_row = spec.tokens_per_row(page_size)
    expected = spec.page_bytes(per_row)
    if row_bytes != expected:
        what = f"pages of {page_size} tokens" if spec.paged else "one token per row"
        msg = (
            f"buf rows hold {row_bytes} bytes but layout {spec.name!r} with {what} needs "
            f"{expected} bytes per row (received shape {tuple(buf.shape)}, dtype {buf.dtype}). "
            "Hint: check the layout and that page_size is the pool's page_size."
        )
        raise LayoutError(msg)
    return int(buf.shape[0]) * per_row


def _check_loc(
    loc: object,
    *,
    capacity: int,
    device: torch.device,
    error: type[LayoutError] | type[WriteError],
    unique: bool,
) -> torch.Tensor:
    if not isinstance(loc, torch.Tensor):
        msg = (
            f"loc must be a 1-D integer torch.Tensor; received {type(loc).__name__}. "
            "Hint: torch.as_tensor(loc, dtype=torch.int64, device=buf.device)."
        )
        raise error(msg)
    if loc.dtype not in _INTEGER_DTYPES:
        msg = (
            f"loc must be an integer tensor; received dtype {loc.dtype}. "
            "Hint: token locations are int64 (or int32) slot indices, e.g. loc.long()."
        )
        raise error(msg)
    if loc.dim() != 1:
        msg = f"loc must be 1-D; received shape {tuple(loc.shape)}. Hint: loc.flatten()."
        raise error(msg)
    if loc.device != device:
        msg = (
            f"loc is on {loc.device} but the buffer is on {device}. "
            "Hint: move loc to the buffer's device first."
        )
        raise error(msg)
    loc64 = loc.to(torch.int64)
    if loc64.numel() == 0:
        return loc64
    low, high = torch.stack(torch.aminmax(loc64)).tolist()
    if low < 0 or high >= capacity:
        bad = loc64[(loc64 < 0) | (loc64 >= capacity)]
        msg = (
            f"loc holds {bad.numel()} location(s) outside [0, {capacity}): {_preview(bad)}. "
            f"Hint: the buffer holds {capacity} token slots."
        )
        raise error(msg)
    if unique:
        ordered = loc64.sort().values
        repeated = ordered[1:][ordered[1:] == ordered[:-1]]
        if repeated.numel():
            dups = torch.unique(repeated)
            msg = (
                f"loc repeats {dups.numel()} location(s): {_preview(dups)}. A write must "
                "name each slot at most once (on a GPU the surviving value would depend on "
                "thread order). Hint: deduplicate, keeping the value you want stored."
            )
            raise error(msg)
    return loc64


def check_read(
    spec: LayoutSpec, buf: torch.Tensor, loc: torch.Tensor, page_size: int
) -> torch.Tensor:
    """Validate a read of tokens ``loc`` from ``buf``; return ``loc`` as int64.

    Args:
        spec: the buffer's layout.
        buf: the pool's per-layer buffer (``[num_pages, page_bytes]`` for paged layouts,
            ``[rows, ...]`` for token-major ones), any dtype, contiguous.
        loc: 1-D integer tensor of token locations on ``buf``'s device (may repeat).
        page_size: the pool's page size (tokens per page).

    Returns:
        ``loc`` converted to int64 (a new tensor when it was not int64 already).

    Raises:
        LayoutError: the buffer or page size does not fit the layout, or ``loc`` is not a
            1-D integer tensor on the buffer's device with every value in ``[0, capacity)``.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import V4, check_read
        >>> buf = torch.zeros(2, V4.page_bytes(64), dtype=torch.uint8)
        >>> check_read(V4, buf, torch.tensor([0, 127], dtype=torch.int32), 64).dtype
        torch.int64
    """
    size = check_page_size(spec, page_size)
    capacity = check_buffer(spec, buf, size)
    return _check_loc(loc, capacity=capacity, device=buf.device, error=LayoutError, unique=False)


def _value_shapes(spec: LayoutSpec, n: int) -> list[tuple[int, ...]]:
    shapes = [(n, spec.dim), (n, 1, spec.dim)]
    if spec.heads > 1:
        shapes.append((n, spec.heads, spec.dim // spec.heads))
    return shapes


def _check_values(
    spec: LayoutSpec, values: object, n: int, device: torch.device, *, check_finite: bool
) -> torch.Tensor:
    if not isinstance(values, torch.Tensor):
        msg = f"values must be a torch.Tensor; received {type(values).__name__}."
        raise WriteError(msg)
    if not values.dtype.is_floating_point:
        msg = (
            f"values must have a floating dtype; received {values.dtype}. "
            "Hint: pass the key rows as bf16, fp16 or fp32."
        )
        raise WriteError(msg)
    shapes = _value_shapes(spec, n)
    if tuple(values.shape) not in shapes:
        accepted = " or ".join(str(list(s)) for s in shapes)
        msg = (
            f"values for layout {spec.name!r} must have shape {accepted} (n = len(loc) = {n}); "
            f"received {list(values.shape)}."
        )
        raise WriteError(msg)
    if values.device != device:
        msg = (
            f"values are on {values.device} but the buffer is on {device}. "
            "Hint: move the values to the buffer's device first."
        )
        raise WriteError(msg)
    rows = values.reshape(n, spec.dim)
    if check_finite and n:
        _check_finite(spec, rows)
    return rows


def _check_finite(spec: LayoutSpec, rows: torch.Tensor) -> None:
    wide = rows if rows.dtype.itemsize > 1 else rows.to(torch.float32)
    limit = spec.unscaled_max
    # One reduction decides the common case: amax propagates NaN, and inf is not finite.
    peak = float(wide.abs().amax())
    if math.isfinite(peak) and (limit is None or peak <= limit):
        return
    bad = ~torch.isfinite(wide)
    if limit is not None:
        bad |= wide.abs() > limit
    where = bad.nonzero()
    row, col = (int(v) for v in where[0])
    first = float(wide[row, col])
    if limit is None:
        expected = "finite values"
    else:
        expected = f"finite values with |x| <= {limit:g} (layout {spec.name!r} has no scale)"
    msg = (
        f"values hold {where.shape[0]} element(s) that cannot be stored; the first is "
        f"{first!r} at token {row}, column {col}; expected {expected}. "
        "Hint: fix the producer, or pass check_finite=False to store them exactly as "
        "SGLang's store would."
    )
    raise WriteError(msg)


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

    Args:
        spec: the buffer's layout.
        buf: the pool's per-layer buffer, contiguous.
        loc: 1-D integer tensor of distinct token locations on ``buf``'s device.
        values: ``[n, dim]`` (also ``[n, 1, dim]``, and ``[n, heads, head_dim]`` for MHA
            layouts) floating tensor on ``buf``'s device, ``n = len(loc)``.
        page_size: the pool's page size.
        check_finite: reject NaN/Inf values (and, for unscaled layouts, values beyond the
            storage format's range).

    Returns:
        ``(values_2d, loc_int64)``: a ``[n, dim]`` view (or copy) of ``values`` and
        ``loc`` as int64, ready for :func:`~kvcompat.layouts.quantize` with
        ``validate=False``.

    Raises:
        LayoutError: the buffer or page size does not fit the layout.
        WriteError: bad locations (type, shape, device, range, duplicates) or values
            (type, dtype, shape, device, non-finite).

    Example:
        >>> import torch
        >>> from kvcompat import WriteError
        >>> from kvcompat.layouts import V41, check_write
        >>> buf = torch.zeros(1, V41.page_bytes(64), dtype=torch.uint8)
        >>> try:
        ...     check_write(V41, buf, torch.tensor([3, 3]), torch.zeros(2, 512), 64)
        ... except WriteError as exc:
        ...     print(str(exc).split(".")[0])
        loc repeats 1 location(s): 3
    """
    if torch.compiler.is_compiling():  # the host reads run inside a custom op (kvcompat._ops)
        from kvcompat import _ops  # noqa: PLC0415 - registers the ops on first compile

        return _ops.check_write(spec, buf, loc, values, page_size, check_finite=check_finite)
    size = check_page_size(spec, page_size)
    capacity = check_buffer(spec, buf, size)
    loc64 = _check_loc(loc, capacity=capacity, device=buf.device, error=WriteError, unique=True)
    rows = _check_values(spec, values, loc64.numel(), buf.device, check_finite=check_finite)
    return rows, loc64
