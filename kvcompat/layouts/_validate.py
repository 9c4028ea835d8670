"""Checks that run before any byte moves: buffer geometry, locations, values.

Every failure raises :class:`~kvcompat.LayoutError` (the buffer or page size does not fit
the layout, or a read location is invalid) or :class:`~kvcompat.WriteError` (a write's
locations or values are invalid). Nothing here modifies its inputs.

Policies:

* **Duplicate locations** in one write raise ``WriteError``: on a GPU the surviving value
  would be whichever thread stored last, so the result would not be reproducible.
  Reads may repeat locations.
* **NaN / Inf / overflow**: with ``check_finite=True`` (the default) a write raises
  ``WriteError`` when any value is NaN or +-Inf, or when a finite value is beyond what its
  segment can represent (:func:`value_limits`): a bf16 rope tail (``|x| <= 3.39e38``,
  else it would round to inf), an fp4 tile (``|x| <= 6 * 448 = 2688``, else it would
  saturate), an unscaled e4m3 / fp16 / ... element (the format's largest finite value),
  and for every layout the fp32 range its codec computes in (an fp64 ``1e39`` would
  become inf). The check is one ``amax`` of ``|values|`` and one host sync (a column-wise
  second pass only when a value exceeds the layout's smallest segment limit). With
  ``check_finite=False`` nothing is checked (no sync) and the codecs encode such values
  exactly as SGLang's store would; each layout's page documents what that is.
* **Aliasing**: values that share memory with a buffer the write stores into (a "move
  tokens" call ``write(l, dst, pool.get_key_buffer(l)[a:b])``) are copied first
  (:func:`unaliased`), so the write reads the old bytes, as if values were a copy.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import torch

from kvcompat._errors import LayoutError, WriteError
from kvcompat.layouts._addressing import byte_rows, row_pitch, rows_apart
from kvcompat.layouts._registry import get_layout
from kvcompat.layouts._spec import Encoding, SegmentRole

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kvcompat.layouts._spec import LayoutSpec

__all__ = [
    "check_buffer",
    "check_loc",
    "check_page_size",
    "check_read",
    "check_values",
    "check_write",
    "overlaps",
    "resolve_layout",
    "span",
    "unaliased",
    "value_limits",
]

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
_VALUE_DTYPES = frozenset(
    {
        torch.bfloat16,
        torch.float16,
        torch.float32,
        torch.float64,
        torch.float8_e4m3fn,
        torch.float8_e4m3fnuz,
        torch.float8_e5m2,
        torch.float8_e5m2fnuz,
    }
)
_SHOWN = 5  # offending values quoted in an error message


def _not_dense(tensor: torch.Tensor) -> str | None:
    """How ``tensor`` is not a plain strided tensor (nested, sparse, mkldnn), or None."""
    if tensor.is_nested:
        return "a nested tensor"
    if tensor.layout != torch.strided:
        return f"a {str(tensor.layout).removeprefix('torch.')} tensor"
    return None


def _preview(values: torch.Tensor) -> str:
    shown = ", ".join(str(v) for v in values[:_SHOWN].tolist())
    return shown + (", ..." if values.numel() > _SHOWN else "")


def resolve_layout(layout: object, *, fnuz: bool) -> LayoutSpec:
    """The :class:`LayoutSpec` ``layout`` names (:func:`get_layout`), checked against ``fnuz``.

    Raises:
        LayoutError: an unknown layout, or ``fnuz`` on a layout without it.

    Example:
        >>> resolve_layout("v4", fnuz=True).name
        'v4'
    """
    spec = get_layout(layout)
    if fnuz and not spec.supports_fnuz:
        msg = (
            f"fnuz=True selects the ROCm e4m3fnuz bytes of the V4 layout; layout "
            f"{spec.name!r} has no fnuz variant. Hint: drop fnuz=True."
        )
        raise LayoutError(msg)
    return spec


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
    if buf.dim() < 1 or not rows_apart(buf):
        msg = (
            f"buf for layout {spec.name!r} must be a tensor of at least one dimension whose "
            "rows (pages, or token rows) are each contiguous and do not overlap; received "
            f"shape {tuple(buf.shape)} with strides {buf.stride()}. "
            "Hint: pass the pool's per-layer buffer itself (kv_buffer[i]) or a view that "
            "only strides its first dimension."
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
    pitch = row_pitch(buf)
    if per_row > 1 and pitch != expected:
        data_stride, _, scale_stride = spec.row_addressing(per_row)
        if pitch % data_stride or (spec.scale_bytes and pitch % scale_stride):
            msg = (
                f"buf's pages are {pitch} bytes apart, which layout {spec.name!r} cannot "
                f"address: a strided page view must place pages a multiple of "
                f"{data_stride} bytes apart (its token rows)"
                + (f" and of {scale_stride} (its scale rows)" if spec.scale_bytes else "")
                + f"; received strides {buf.stride()}. Hint: pass the pages of one "
                "layer as they sit in the pool's storage."
            )
            raise LayoutError(msg)
    return int(buf.shape[0]) * per_row


_FEW = 64
"""Up to this many locations are checked on the host from one copy (cheaper than the
tensor reductions, and still one host read)."""


def check_loc(
    loc: object,
    *,
    capacity: int,
    device: torch.device,
    error: type[LayoutError] | type[WriteError],
    unique: bool,
) -> torch.Tensor:
    """``loc`` as int64, checked: dense, 1-D, integer, on ``device``, in range, distinct.

    Distinct only when ``unique``; any failure raises ``error``.
    """
    if not isinstance(loc, torch.Tensor):
        msg = (
            f"loc must be a 1-D integer torch.Tensor; received {type(loc).__name__}. "
            "Hint: torch.as_tensor(loc, dtype=torch.int64, device=buf.device)."
        )
        raise error(msg)
    kind = _not_dense(loc)
    if kind is not None:
        msg = (
            f"loc must be a dense 1-D integer tensor; received {kind}. "
            "Hint: pass loc.to_dense() (or torch.cat of the nested pieces)."
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
    count = loc64.numel()
    if count == 0:
        return loc64
    repeats = False
    if count <= _FEW:  # a few locations: one copy to the host, the checks in Python
        values = loc64.tolist()
        low, high = min(values), max(values)
        repeats = unique and len(set(values)) != count
    elif unique:  # one host read of the range and the duplicate flag together
        ordered = loc64.sort().values
        flags = torch.stack((*torch.aminmax(loc64), (ordered[1:] == ordered[:-1]).any().long()))
        low, high, repeated_flag = flags.tolist()
        repeats = bool(repeated_flag)
    else:
        low, high = torch.stack(torch.aminmax(loc64)).tolist()
    if low < 0 or high >= capacity:
        bad = loc64[(loc64 < 0) | (loc64 >= capacity)]
        msg = (
            f"loc holds {bad.numel()} location(s) outside [0, {capacity}): {_preview(bad)}. "
            f"Hint: the buffer holds {capacity} token slots."
        )
        raise error(msg)
    if repeats:
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
    return check_loc(loc, capacity=capacity, device=buf.device, error=LayoutError, unique=False)


def _value_shapes(spec: LayoutSpec, n: int) -> list[tuple[int, ...]]:
    shapes = [(n, spec.dim), (n, 1, spec.dim)]
    if spec.heads > 1:
        shapes.append((n, spec.heads, spec.dim // spec.heads))
    return shapes


def check_values(
    spec: LayoutSpec, values: object, n: int, device: torch.device, *, check_finite: bool
) -> torch.Tensor:
    """``values`` checked for a write of ``n`` tokens, as ``[n, dim]``; WriteError otherwise."""
    if not isinstance(values, torch.Tensor):
        msg = f"values must be a torch.Tensor; received {type(values).__name__}."
        raise WriteError(msg)
    kind = _not_dense(values)
    if kind is not None:
        msg = (
            f"values must be a dense (strided) tensor; received {kind}. "
            "Hint: pass values.to_dense()."
        )
        raise WriteError(msg)
    if values.dtype not in _VALUE_DTYPES:
        accepted = ", ".join(sorted(str(d).removeprefix("torch.") for d in _VALUE_DTYPES))
        msg = (
            f"values must have a real floating dtype kvcompat can encode ({accepted}); "
            f"received {values.dtype}. "
            "Hint: pass the key rows as bf16, fp16 or fp32 (dequantize packed inputs first)."
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
    if rows.requires_grad:
        rows = rows.detach()  # storing must not make the pool's buffer part of a graph
    if check_finite and n:
        _check_finite(spec, rows)
    return rows


_FP32_MAX = float(torch.finfo(torch.float32).max)
_ENCODING_MAX = {
    Encoding.E4M3FN: 448.0,
    Encoding.E4M3FNUZ: 240.0,
    Encoding.E5M2: float(torch.finfo(torch.float8_e5m2).max),
    Encoding.E2M1X2: 6.0,
    Encoding.BF16: float(torch.finfo(torch.bfloat16).max),
    Encoding.FP16: float(torch.finfo(torch.float16).max),
    Encoding.FP32: _FP32_MAX,
    Encoding.UE8M0: 2.0**127,
}


_E4M3_UNDER_2_POW_128 = 1.875 * 2.0**127  # the largest 4-significant-bit value below 2**128
# With a power-of-two scale s = 2**126 (the scale of any amax above 1.5 * 2**127), e2m1
# codes round x / s >= 3.5 up to 4, i.e. to 2**128 (inf on read): the largest fp32 below
# 1.75 * 2**127 is the last value that stays finite.
_E2M1_UNDER_2_POW_128 = (1.75 - 2.0**-23) * 2.0**127


def _segment_limit(spec: LayoutSpec, encoding: Encoding, *, scaled: bool) -> tuple[float, str]:
    element = _ENCODING_MAX[encoding]
    if scaled and spec.scale_encoding is not None:
        limit = element * _ENCODING_MAX[spec.scale_encoding]
        why = f"{encoding.value} codes with {spec.scale_encoding.value} scales"
        if spec.scale_encoding is Encoding.UE8M0 and encoding in (
            Encoding.E4M3FN,
            Encoding.E4M3FNUZ,
        ):
            # Power-of-two scales keep e4m3's 4 significant bits: values that round up to
            # 2**128 would read back as inf.
            limit = min(limit, _E4M3_UNDER_2_POW_128)
        if spec.scale_encoding is Encoding.UE8M0 and encoding is Encoding.E2M1X2:
            limit = min(limit, _E2M1_UNDER_2_POW_128)
    else:
        limit = element
        why = f"{encoding.value}, no scale"
    read_max = float(torch.finfo(spec.output_dtype).max)
    if read_max < limit:
        limit, why = read_max, f"{why}; read back as {spec.output_dtype}"
    if limit > _FP32_MAX:
        limit, why = _FP32_MAX, f"{why}; fp32 compute range"
    return limit, why


@functools.cache
def value_limits(spec: LayoutSpec) -> tuple[tuple[str, int, int, float, str], ...]:
    """The largest magnitude each value column of a write can hold without inf or saturation.

    Returns ``(segment, first column, end column, limit, why)`` runs covering columns
    ``0 .. spec.dim``, in value order. A bf16 rope tail holds ``|x| <= 3.39e38`` (larger
    values round to inf); a scaled segment holds its element maximum times its scale
    maximum (fp4 e2m1 x e4m3: 2688, beyond which values saturate; e4m3 with power-of-two
    scales: 1.875 * 2**127, above which values round to 2**128, inf on read); an unscaled
    one its element maximum; and nothing holds more than the dtype reads return or the
    fp32 range the codecs compute in.

    Example:
        >>> from kvcompat.layouts import V4, V41_FP4
        >>> [(name, lo, hi, f"{limit:.3g}") for name, lo, hi, limit, _ in value_limits(V4)]
        [('nope', 0, 448, '3.19e+38'), ('rope', 448, 512, '3.39e+38')]
        >>> value_limits(V41_FP4)[0][3]
        2688.0
    """
    runs: list[tuple[str, int, int, float, str]] = []
    column = 0
    for segment in spec.segments:
        if segment.role not in (SegmentRole.DATA, SegmentRole.ROPE) or segment.encoding is None:
            continue
        scaled = segment.role is SegmentRole.DATA
        limit, why = _segment_limit(spec, segment.encoding, scaled=scaled)
        if spec.unscaled_max is not None and spec.unscaled_max < limit:
            limit, why = spec.unscaled_max, f"{why}; layout maximum"
        runs.append((segment.name, column, column + segment.elements, limit, why))
        column += segment.elements
    if column != spec.dim:  # a layout whose segments do not list its values: one safe bound
        limit = min((run[3] for run in runs), default=_FP32_MAX)
        return (("values", 0, spec.dim, limit, "smallest segment bound"),)
    return tuple(runs)


# Keyed by the spec's id (hashing a LayoutSpec hashes all its fields: too slow per write);
# the entry keeps the spec alive, so the id cannot be reused.
_LIMIT_TENSORS: dict[tuple[int, torch.device], tuple[LayoutSpec, torch.Tensor]] = {}


def _limit_tensor(spec: LayoutSpec, device: torch.device) -> torch.Tensor:
    found = _LIMIT_TENSORS.get((id(spec), device))
    if found is None:
        limits = torch.empty(spec.dim, dtype=torch.float32)
        for _, lo, hi, limit, _ in value_limits(spec):
            limits[lo:hi] = limit
        found = (spec, limits.to(device))
        _LIMIT_TENSORS[(id(spec), device)] = found
    return found[1]


_SMALLEST_LIMIT: dict[int, tuple[LayoutSpec, float]] = {}


def _smallest_limit(spec: LayoutSpec) -> float:
    found = _SMALLEST_LIMIT.get(id(spec))
    if found is None:
        found = (spec, min(run[3] for run in value_limits(spec)))
        _SMALLEST_LIMIT[id(spec)] = found
    return found[1]


def _check_finite(spec: LayoutSpec, rows: torch.Tensor) -> None:
    wide = rows if rows.dtype.itemsize > 1 else rows.to(torch.float32)
    # One pass over the values and one host sync decide the common case: aminmax and
    # maximum propagate NaN (and NaN <= x is False), inf is above every limit, and values
    # under the smallest segment limit fit everywhere. (|x| is made only past this point:
    # a copy of the values, three times the memory traffic of the one pass.)
    low, high = torch.aminmax(wide)
    peak = float(torch.maximum(high, -low))
    if peak <= _smallest_limit(spec):
        return
    magnitude = wide.abs()
    limits = _limit_tensor(spec, rows.device)
    if math.isfinite(peak) and bool((magnitude.amax(dim=0) <= limits).all()):
        return  # large values, but each within its own segment's limit
    bad = ~(magnitude <= limits)
    where = bad.nonzero()
    row, col = (int(v) for v in where[0])
    first = float(wide[row, col])
    name, _, _, limit, why = next(run for run in value_limits(spec) if run[1] <= col < run[2])
    msg = (
        f"values hold {where.shape[0]} element(s) that cannot be stored; the first is "
        f"{first!r} at token {row}, column {col} (segment {name!r} of layout {spec.name!r}); "
        f"expected finite values with |x| <= {limit:.6g} there ({why}). "
        "Hint: fix the producer, or pass check_finite=False to store them exactly as "
        "SGLang's store would (inf, NaN or saturated bytes, as the layout's page documents)."
    )
    raise WriteError(msg)


def span(tensor: torch.Tensor) -> tuple[int, int] | None:
    """``[first, last + 1)`` byte addresses ``tensor`` can touch, or None when empty."""
    count = tensor.numel()
    if count == 0:
        return None
    start = tensor.data_ptr()
    if tensor.is_contiguous():
        return start, start + count * tensor.element_size()
    extent = sum(
        (size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True)
    )
    return start, start + (extent + 1) * tensor.element_size()


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` can share bytes (same device, intersecting address ranges).

    Conservative: two interleaved strided views that never touch the same element count
    as overlapping. Reads no tensor data (no host sync).

    Example:
        >>> import torch
        >>> buf = torch.zeros(8, 4)
        >>> overlaps(buf[2:4], buf), overlaps(buf[2:4], buf[4:]), overlaps(buf.clone(), buf)
        (True, False, False)
    """
    span_a, span_b = span(a), span(b)
    if span_a is None or span_b is None:
        return False
    return span_a[0] < span_b[1] and span_b[0] < span_a[1] and a.device == b.device


def unaliased(values: torch.Tensor, buffers: Sequence[torch.Tensor]) -> torch.Tensor:
    """``values``, or a contiguous copy of it when it shares memory with any of ``buffers``.

    A write stores into ``buffers``; values that are a view of them (``write(l, dst,
    pool.get_key_buffer(l)[a:b])``, a natural "move tokens" call) would otherwise be read
    while they are being overwritten. Copying keeps the meaning "store these values as
    they were when the call began". Costs pointer arithmetic only, unless a copy is due.

    Example:
        >>> import torch
        >>> buf = torch.arange(8.0).view(4, 2)
        >>> unaliased(buf[1:3], (buf,)).data_ptr() == buf[1:3].data_ptr()
        False
    """
    if any(overlaps(values, buf) for buf in buffers):
        return values.clone(memory_format=torch.contiguous_format)
    return values


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
    size = check_page_size(spec, page_size)
    capacity = check_buffer(spec, buf, size)
    loc64 = check_loc(loc, capacity=capacity, device=buf.device, error=WriteError, unique=True)
    rows = check_values(spec, values, loc64.numel(), buf.device, check_finite=check_finite)
    return rows, loc64
