"""The eager launchers of the Triton kernels (importing this module imports triton).

:mod:`kvcompat._ops` calls them after its own validation; ``kvcompat.kernels`` exports
them through :mod:`kvcompat.kernels._library`, which turns them into custom ops under
``torch.compile``. The launchers check only what the host already knows (dtypes, shapes, devices,
contiguity, alignment): they never read a device value, so they do not synchronise and,
given a pre-allocated ``out``, can be captured in a CUDA graph. Location ranges, duplicate
write locations and non-finite values are checked by :func:`kvcompat.layouts.dequantize`
and :func:`kvcompat.layouts.quantize` (``validate=True``) before they call in here.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch
import triton

from kvcompat._errors import LayoutError, WriteError
from kvcompat.kernels import _triton as jit
from kvcompat.kernels._config import KernelFamily, LaunchSettings, launch_settings
from kvcompat.kernels._fast import launch
from kvcompat.kernels._plan import (
    Plan,
    align_bytes,
    cached_geometry,
    chunk_words,
    launch_family,
    read_plan,
    word_bytes,
    write_plan,
)
from kvcompat.layouts._addressing import row_pitch
from kvcompat.layouts._spec import LayoutSpec
from kvcompat.layouts._validate import check_buffer, check_page_size, resolve_layout

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "FORCE_SOFT",
    "INTERPRETED",
    "MAX_SEGMENTS",
    "copy_rows_layers",
    "gather_dequantize",
    "gather_dequantize_layers",
    "gather_dequantize_segments",
    "layer_bases",
    "move_rows_layers",
    "quantize_scatter",
    "quantize_scatter_layers",
    "quantize_scatter_segments",
    "segment_table",
    "segments_serve",
]

INTERPRETED: bool = type(jit._read_fp8_kernel).__name__ == "InterpretedFunction"
"""Whether this process imported the kernels under ``TRITON_INTERPRET=1``."""

FORCE_SOFT = False
"""Use the pure-integer conversions on a GPU too (tests compare them with the hardware's)."""

ROCM: bool = torch.version.hip is not None
"""A ROCm build of torch: the kernels take the pure-integer paths, because the hardware
ones use NVIDIA's fp8 conversions and inline PTX. (Not run on a ROCm GPU.)"""

_ALIGN = 16
"""Every pool buffer a kernel takes starts on a multiple of this; the layered kernels tell
the compiler so of every per-layer offset (``BASE_ALIGN``, ``_segment_block``)."""
_MAX_BLOCK_C = 512


def _soft() -> bool:
    return INTERPRETED or FORCE_SOFT or ROCM


def _check_device(buf: torch.Tensor) -> None:
    if buf.device.type == "cuda" or (buf.device.type == "cpu" and INTERPRETED):
        return
    if buf.device.type == "cpu":
        msg = (
            "the Triton kernels run on CPU tensors only under the Triton interpreter. "
            "Hint: set TRITON_INTERPRET=1 before triton is first imported, or use "
            "impl='torch' (or 'auto') for CPU tensors."
        )
    else:
        msg = f"the Triton kernels need CUDA tensors; the buffer is on {buf.device}."
    raise RuntimeError(msg)


def _on_device(buf: torch.Tensor) -> contextlib.AbstractContextManager[object]:
    """Make ``buf``'s GPU the current device for a launch (Triton launches on the current one).

    A no-op when it already is, which is the usual case (one process per GPU).
    """
    if buf.device.type == "cuda" and buf.device.index != torch.cuda.current_device():
        return torch.cuda.device(buf.device)
    return contextlib.nullcontext()


def _check_aligned(what: str, tensor: torch.Tensor, align: int) -> None:
    if tensor.data_ptr() % align:
        msg = (
            f"{what} starts at an address that is not a multiple of {align} bytes. "
            "Hint: pass the pool's own per-layer buffer (or a copy), or use impl='torch'."
        )
        raise NotImplementedError(msg)


def _check_loc(loc: object, device: torch.device, error: type[ValueError]) -> torch.Tensor:
    if not isinstance(loc, torch.Tensor) or loc.dim() != 1 or loc.dtype.is_floating_point:
        got = (
            f"shape {tuple(loc.shape)}, dtype {loc.dtype}"
            if isinstance(loc, torch.Tensor)
            else (type(loc).__name__)
        )
        msg = f"loc must be a 1-D integer tensor; received {got}."
        raise error(msg)
    if loc.device != device:
        msg = f"loc is on {loc.device} but the buffer is on {device}."
        raise error(msg)
    if loc.dtype not in (torch.int32, torch.int64):
        loc = loc.long()
    return loc if loc.is_contiguous() else loc.contiguous()


def _plan(result: Plan | str) -> Plan:
    if isinstance(result, str):
        msg = f"{result}. Hint: use impl='torch' (impl='auto' falls back to it by itself)."
        raise NotImplementedError(msg)
    return result


def _raw(tensor: torch.Tensor) -> torch.Tensor:
    """One-byte float tensors as uint8 (Triton has no pointer type for e4m3fnuz on NVIDIA)."""
    if tensor.element_size() == 1 and tensor.dtype != torch.uint8:
        return tensor.view(torch.uint8)
    return tensor


def _check_buf(spec: LayoutSpec, buf: object, page_size: object) -> dict[str, int]:
    """Host-only buffer checks (fast path first); the page geometry on success.

    A buffer whose rows (pages, or token rows) sit further apart than their size (a
    strided view) gets the geometry with ``PAGE_BYTES`` set to that pitch: the kernels
    address every row from it, so the same compiled kernel serves both.
    """
    if type(page_size) is int and page_size > 0 and isinstance(buf, torch.Tensor):
        geo = cached_geometry(spec, page_size)
        rows = buf.shape[0] if buf.dim() else 0
        if (
            rows
            and buf.is_contiguous()
            and (buf.numel() // rows * buf.element_size() == geo["PAGE_BYTES"])
        ):
            if not buf.is_cuda:
                _check_device(buf)
            _check_aligned("buf", buf, _ALIGN)
            return geo
    size = check_page_size(spec, page_size)
    check_buffer(spec, buf, size)  # raises with the full explanation
    _check_device(buf)  # type: ignore[arg-type]
    _check_aligned("buf", buf, _ALIGN)  # type: ignore[arg-type]
    geo = cached_geometry(spec, size)
    pitch = row_pitch(buf)  # type: ignore[arg-type]
    if pitch and pitch != geo["PAGE_BYTES"]:
        return {**geo, "PAGE_BYTES": pitch}
    return geo


_KWARGS: dict[tuple[int, LaunchSettings, int, bool], dict[str, object]] = {}


def _kwargs(plan: Plan, settings: LaunchSettings, word: int = 0) -> dict[str, object]:
    """The constexpr keyword arguments of a launch, memoised (they only depend on these)."""
    soft = _soft()
    key = (id(plan), settings, word, soft)
    hit = _KWARGS.get(key)
    if hit is None:
        hit = {
            "EVICT": "evict_first" if settings.evict_first else "",
            "BLOCK_T": settings.block_tokens,
            "num_warps": settings.num_warps,
        }
        constants = dict(plan.constants)
        if plan.family in ("gather_rows", "scatter_rows"):
            words = int(constants.pop("ROW_BYTES")) // word
            block, tail = chunk_words(words)
            constants.update(ROW_WORDS=words, WORD=word, BLOCK_C=block, TAIL_C=tail,
                             GATHER=plan.family == "gather_rows")  # fmt: skip
        else:
            constants["SOFT"] = soft
            if plan.family == "write_plain":
                constants["BLOCK_C"] = min(
                    triton.next_power_of_2(int(constants["DIM"])), _MAX_BLOCK_C
                )
        hit.update(constants)
        _KWARGS[key] = hit
        _PLANS_ALIVE.append(plan)  # keeps id(plan) from being reused
    return hit


_PLANS_ALIVE: list[Plan] = []


def gather_dequantize(
    spec: LayoutSpec | str | object,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    *,
    out: torch.Tensor | None = None,
    fnuz: bool = False,
) -> torch.Tensor:
    """:func:`kvcompat.kernels.gather_dequantize`, eager (no ``torch.compile`` routing)."""
    spec = resolve_layout(spec, fnuz=fnuz)
    plan = _plan(read_plan(spec, fnuz=fnuz))
    geo = _check_buf(spec, buf, page_size)
    loc = _check_loc(loc, buf.device, LayoutError)
    n = loc.shape[0]
    if out is None:
        out = torch.empty((n, spec.dim), dtype=spec.output_dtype, device=buf.device)
    else:
        _check_dense_out(spec, out, (n, spec.dim), buf.device)
    _read(plan, geo, buf, loc, out, n, None, 1)
    return out


def _check_dense_out(
    spec: LayoutSpec, out: torch.Tensor, shape: tuple[int, ...], device: torch.device
) -> None:
    if (
        tuple(out.shape) != shape
        or out.dtype != spec.output_dtype
        or out.device != device
        or not out.is_contiguous()
    ):
        msg = (
            f"out must be a contiguous {list(shape)} {spec.output_dtype} tensor on "
            f"{device}; received shape {list(out.shape)}, dtype {out.dtype}, device "
            f"{out.device}, contiguous={out.is_contiguous()}."
        )
        raise LayoutError(msg)


def _read(
    plan: Plan,
    geo: dict[str, int],
    buf: torch.Tensor,
    loc: torch.Tensor,
    out: torch.Tensor,
    n: int,
    bases: torch.Tensor | None,
    layers: int,
) -> None:
    """Launch ``plan``'s read kernel over ``layers`` layers (``bases``: their offsets)."""
    if n == 0 or layers == 0:
        return
    settings = launch_settings(plan.family, None if INTERPRETED else n * layers, plan.launch)
    grid = (-(-n // settings.block_tokens), layers)
    table = loc if bases is None else bases  # not read unless LAYERED
    layered = bases is not None
    per_layer = {"LOC_LAYERS": loc.dim() == 2}
    if plan.family == "read_fp4":
        _check_aligned("out", out, 4)
    with _on_device(buf):
        if plan.family == "gather_rows":
            word = word_bytes(
                int(plan.constants["ROW_BYTES"]), geo["PAGE_BYTES"], buf.data_ptr(), out.data_ptr()
            )
            launch(jit._copy_rows_kernel, grid,
                _raw(buf), _raw(out), loc, table, n, geo["PAGE"], geo["PAGE_BYTES"],
                geo["DATA_STRIDE"], **_kwargs(plan, settings, word), LAYERED=layered, **per_layer,
                BASE_ALIGN=_ALIGN,  # layer_bases() of 16-byte aligned buffers
            )  # fmt: skip
        elif plan.family == "read_fp4":
            launch(jit._read_fp4_kernel, grid,
                out, _raw(buf), loc, table, n, *geo.values(), **_kwargs(plan, settings),
                LAYERED=layered, **per_layer,
            )  # fmt: skip
        else:
            launch(jit._read_fp8_kernel, grid,
                out, _raw(buf), loc, table, n, *geo.values(), **_kwargs(plan, settings),
                LAYERED=layered, **per_layer, **_ONE_SPACE,
            )  # fmt: skip


def quantize_scatter(
    spec: LayoutSpec | str | object,
    values: torch.Tensor,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    *,
    fnuz: bool = False,
) -> None:
    """:func:`kvcompat.kernels.quantize_scatter`, eager (no ``torch.compile`` routing)."""
    spec = resolve_layout(spec, fnuz=fnuz)
    plan = _plan(write_plan(spec, _values_dtype(values), fnuz=fnuz))
    geo = _check_buf(spec, buf, page_size)
    loc = _check_loc(loc, buf.device, WriteError)
    n = loc.shape[0]
    _check_values(values, n * spec.dim, [n, spec.dim], buf.device)
    _write(plan, geo, values, buf, loc, n, None, 1)


def _values_dtype(values: object) -> torch.dtype:
    dtype = getattr(values, "dtype", None)
    if not isinstance(dtype, torch.dtype):
        msg = f"values must be a torch.Tensor; received {type(values).__name__}."
        raise WriteError(msg)
    return dtype


def _check_values(values: torch.Tensor, count: int, shape: list[int], device: torch.device) -> None:
    if values.numel() != count or values.device != device:
        msg = (
            f"values must hold {shape} elements on {device}; received shape "
            f"{list(values.shape)} on {values.device}."
        )
        raise WriteError(msg)


def _write(
    plan: Plan,
    geo: dict[str, int],
    values: torch.Tensor,
    buf: torch.Tensor,
    loc: torch.Tensor,
    n: int,
    bases: torch.Tensor | None,
    layers: int,
) -> None:
    """Launch ``plan``'s write kernel over ``layers`` layers (``bases``: their offsets)."""
    if n == 0 or layers == 0:
        return
    rows = values if values.is_contiguous() else values.contiguous()
    family = launch_family(plan, soft=_soft())
    if plan.family in ("write_fp4", "write_fp4_ue8m0") and rows.data_ptr() % 8:
        rows = rows.clone()  # the FP4 kernels load value pairs as one word
    settings = launch_settings(family, None if INTERPRETED else n * layers, plan.launch)
    grid = (-(-n // settings.block_tokens), layers)
    table = loc if bases is None else bases
    extra: dict[str, object] = {"LAYERED": bases is not None, "LOC_LAYERS": loc.dim() == 2}
    with _on_device(buf):
        if plan.family == "scatter_rows":
            word = word_bytes(
                int(plan.constants["ROW_BYTES"]), geo["PAGE_BYTES"], buf.data_ptr(), rows.data_ptr()
            )
            launch(jit._copy_rows_kernel, grid,
                rows, _raw(buf), loc, table, n, geo["PAGE"], geo["PAGE_BYTES"], geo["DATA_STRIDE"],
                **_kwargs(plan, settings, word), **extra, BASE_ALIGN=_ALIGN,
            )  # fmt: skip
        elif plan.family == "write_plain":
            launch(jit._write_plain_kernel, grid,
                rows, _raw(buf), loc, table, n, geo["PAGE"], geo["PAGE_BYTES"], geo["DATA_STRIDE"],
                **_kwargs(plan, settings), **extra,
            )  # fmt: skip
        else:
            kernel = {
                "write_fp4_pairs": jit._write_fp4_pairs_kernel,
                "write_fp4": jit._write_fp4_kernel,
                "write_fp4_ue8m0": jit._write_fp4_ue8m0_kernel,
            }.get(family, jit._write_fp8_kernel)
            if kernel is jit._write_fp8_kernel:
                extra.update(_ONE_SPACE)
            launch(kernel, grid,
                rows, _raw(buf), loc, table, n, *geo.values(), **_kwargs(plan, settings), **extra,
            )  # fmt: skip


# ------------------------------------------------------------------ many layers, one launch


def layer_bases(spec: LayoutSpec, bufs: Sequence[torch.Tensor], page_size: int) -> torch.Tensor:
    """The int64 byte offsets of ``bufs`` from ``bufs[0]``, on their device (host checks only).

    Every buffer must pass the single-layer launch checks (geometry, device, alignment)
    and sit on one device; the result is what a layered launch reads per layer. Made
    once per set of buffers (a plan keeps it), so a launch over them costs no copy.
    """
    if not bufs:
        msg = "layers must name at least one layer; received none."
        raise LayoutError(msg)
    first = bufs[0]
    pitch = _check_buf(spec, first, page_size)["PAGE_BYTES"]
    for buf in bufs:
        if _check_buf(spec, buf, page_size)["PAGE_BYTES"] != pitch:
            msg = (
                "every layer's rows must be the same number of bytes apart for one launch; "
                f"received {row_pitch(first)} and {row_pitch(buf)}. Hint: plan layers whose "
                "buffers have the same strides together."
            )
            raise LayoutError(msg)
        if buf.device != first.device:
            msg = (
                f"every layer's buffer must be on one device; received {first.device} and "
                f"{buf.device}."
            )
            raise LayoutError(msg)
    origin = first.data_ptr()
    offsets = [buf.data_ptr() - origin for buf in bufs]
    return torch.tensor(offsets, dtype=torch.int64).to(first.device)


def _check_layer_loc(
    loc: object, layers: int, device: torch.device, error: type[ValueError]
) -> torch.Tensor:
    """A layered launch's ``loc``: 1-D (every layer) or ``[layers, n]`` (one row a layer)."""
    if isinstance(loc, torch.Tensor) and loc.dim() == 2:
        if loc.shape[0] != layers:
            msg = f"loc must be 1-D or [{layers}, n]; received shape {list(loc.shape)}."
            raise error(msg)
        rows = _check_loc(loc.reshape(-1), device, error)
        return rows.view(layers, -1)
    return _check_loc(loc, device, error)


def gather_dequantize_layers(
    spec: LayoutSpec,
    bufs: Sequence[torch.Tensor],
    bases: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    *,
    out: torch.Tensor,
    fnuz: bool = False,
) -> torch.Tensor:
    """Read tokens ``loc`` of every buffer in ``bufs`` into ``out[l]``: one launch.

    ``bases`` is :func:`layer_bases` of ``bufs``; ``out`` a contiguous
    ``[len(bufs), n, dim]`` tensor. Host checks only, as :func:`gather_dequantize`.
    """
    plan = _plan(read_plan(spec, fnuz=fnuz))
    geo = _check_buf(spec, bufs[0], page_size)
    loc = _check_layer_loc(loc, len(bufs), bufs[0].device, LayoutError)
    n = loc.shape[-1]
    _check_dense_out(spec, out, (len(bufs), n, spec.dim), bufs[0].device)
    _read(plan, geo, bufs[0], loc, out, n, bases, len(bufs))
    return out


def quantize_scatter_layers(
    spec: LayoutSpec,
    values: torch.Tensor,
    bufs: Sequence[torch.Tensor],
    bases: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    *,
    fnuz: bool = False,
) -> None:
    """Write ``values[l]`` (``[L, n, dim]``) as tokens ``loc`` of ``bufs[l]``: one launch.

    ``bases`` is :func:`layer_bases` of ``bufs``. Host checks only, as
    :func:`quantize_scatter`; the caller validated ``loc`` and ``values``.
    """
    plan = _plan(write_plan(spec, _values_dtype(values), fnuz=fnuz))
    geo = _check_buf(spec, bufs[0], page_size)
    loc = _check_layer_loc(loc, len(bufs), bufs[0].device, WriteError)
    n = loc.shape[-1]
    _check_values(values, len(bufs) * n * spec.dim, [len(bufs), n, spec.dim], bufs[0].device)
    _write(plan, geo, values, bufs[0], loc, n, bases, len(bufs))


_ROW_PLANS: dict[tuple[int, bool], Plan] = {}


def copy_rows_layers(
    pool: torch.Tensor,
    bases: torch.Tensor,
    rows: torch.Tensor,
    dense: torch.Tensor,
    *,
    row_bytes: int,
    row_stride: int,
    gather: bool,
    addresses: Sequence[int] = (),
) -> None:
    """Copy rows ``rows`` of every layer's uint8 rows to ``dense`` ``[L, n, row_bytes]`` or back.

    ``pool`` is the first layer's rows (``row_stride`` bytes apart), ``bases`` the
    layers' byte offsets from it (:func:`layer_bases`); one launch moves every layer's
    rows. The caller validated everything (the raw form of a page move); ``addresses``
    are the layers' row-0 addresses, which the copy's word size must divide.
    """
    key = (row_bytes, gather)
    plan = _ROW_PLANS.get(key)
    if plan is None:
        family: KernelFamily = "gather_rows" if gather else "scatter_rows"
        plan = _ROW_PLANS[key] = Plan(family, {"ROW_BYTES": row_bytes})
    layers, n = int(bases.shape[0]), int(rows.shape[0])
    if n == 0 or layers == 0:
        return
    _check_device(pool)
    settings = launch_settings(plan.family, None if INTERPRETED else n * layers, plan.launch)
    grid = (-(-n // settings.block_tokens), layers)
    # One scan of the layers' addresses: the power of two dividing them all divides every
    # base (the kernel is told so), and the word must divide it too.
    align = align_bytes(pool.data_ptr(), *addresses)
    word = word_bytes(row_bytes, row_stride, dense.data_ptr(), align)
    if not addresses:
        align = 1  # the bases' alignment is unknown
    src, dst = (pool, dense) if gather else (dense, pool)
    with _on_device(pool):
        launch(jit._copy_rows_kernel, grid,
            src, dst, rows, bases, n, 1, row_stride, 0,
            **_kwargs(plan, settings, word), LAYERED=True, BASE_ALIGN=align,
        )  # fmt: skip


def move_rows_layers(
    src: torch.Tensor,
    src_bases: torch.Tensor,
    src_rows: torch.Tensor,
    dst: torch.Tensor,
    dst_bases: torch.Tensor,
    dst_rows: torch.Tensor,
    *,
    row_bytes: int,
    src_pitch: int,
    dst_pitch: int,
    word: int,
) -> None:
    """Copy row ``src_rows[i]`` of every source layer to row ``dst_rows[i]`` of its destination.

    One launch, no staging: ``src`` / ``dst`` are the first layer's rows, ``src_bases`` /
    ``dst_bases`` every layer's byte offsets from them (:func:`layer_bases`), rows
    ``src_pitch`` / ``dst_pitch`` bytes apart, moved in ``word``-byte words (a
    :func:`word_bytes` of the row width, the pitches and every layer's row-0 address, which
    the caller works out once). The caller validated everything.
    """
    layers, n = int(src_bases.shape[0]), int(src_rows.shape[0])
    if n == 0 or layers == 0:
        return
    _check_device(src)
    settings = launch_settings("move_rows", None if INTERPRETED else n * layers)
    words = row_bytes // word
    block, tail = chunk_words(words)
    grid = (-(-n // settings.block_tokens), layers)
    with _on_device(src):
        launch(jit._move_rows_kernel, grid,
            src, dst, src_rows, dst_rows, src_bases, dst_bases, n, src_pitch, dst_pitch,
            ROW_WORDS=words, WORD=word, BLOCK_C=block, TAIL_C=tail,
            BLOCK_T=settings.block_tokens, num_warps=settings.num_warps,
        )  # fmt: skip


# ------------------------------------------------ several token spaces (segments), one launch

MAX_SEGMENTS = 4
"""The most token spaces one segmented launch takes (its per-call numbers are scalars)."""


def segments_serve(
    spec: LayoutSpec, *, write: bool, values_dtype: torch.dtype | None, fnuz: bool
) -> bool:
    """Whether the kernel of this read (or write) takes several token spaces in one launch.

    The e4m3-tile kernels do (V4, V4.1, DSA, the DeepSeek-V4 indexer): what a DeepSeek-V4
    composite's sliding-window, c4 and c128 pages and its indexer keys are.
    """
    if write:
        if values_dtype is None:
            return False
        found = write_plan(spec, values_dtype, fnuz=fnuz)
        return not isinstance(found, str) and found.family == "write_fp8"
    found = read_plan(spec, fnuz=fnuz)
    return not isinstance(found, str) and found.family == "read_fp8"


def segment_table(
    spec: LayoutSpec, groups: Sequence[tuple[Sequence[torch.Tensor], int]]
) -> torch.Tensor | None:
    """The ``[layers, 6]`` int64 table a segmented launch reads, on the buffers' device.

    ``groups`` are the segments' buffers, each with its page size; a layer's row holds its
    buffer's byte offset from the first buffer, its page size, page pitch and scale-row
    offset, its segment and its place in the segment. Host checks only (geometry, device,
    alignment), made once per plan. None where a page pitch or scale-row offset is not a
    multiple of 16 bytes (a strided view of odd pitch): the kernel assumes they are, so
    such spaces take one launch each.
    """
    if not groups or not all(bufs for bufs, _ in groups):
        msg = "a segmented launch needs at least one buffer in every segment; received none."
        raise LayoutError(msg)
    first = groups[0][0][0]
    rows: list[list[int]] = []
    for segment, (bufs, page_size) in enumerate(groups):
        for place, buf in enumerate(bufs):
            geo = _check_buf(spec, buf, page_size)
            if buf.device != first.device:
                msg = (
                    f"every buffer of one launch must be on one device; received {first.device} "
                    f"and {buf.device}."
                )
                raise LayoutError(msg)
            if align_bytes(geo["PAGE_BYTES"], geo["SCALE_BASE"]) < _ALIGN:
                return None
            rows.append([
                buf.data_ptr() - first.data_ptr(), geo["PAGE"], geo["PAGE_BYTES"],
                geo["SCALE_BASE"], segment, place,
            ])  # fmt: skip
    return torch.tensor(rows, dtype=torch.int64).to(first.device)


def _segment_scalars(
    counts: Sequence[int], firsts: Sequence[int], rows: Sequence[int]
) -> dict[str, int]:
    padded: list[tuple[int, int, int]] = list(zip(counts, firsts, rows, strict=True))
    padded += [(0, 0, 0)] * (MAX_SEGMENTS - len(padded))
    found: dict[str, int] = {}
    for index, (count, first, row) in enumerate(padded):
        found[f"n{index}"], found[f"loc{index}"], found[f"row{index}"] = count, first, row
    return found


_ONE_SPACE: dict[str, bool] = {"SEGMENTS": False}
"""The segment argument of an e4m3-tile launch over one token space (every one but
:func:`gather_dequantize_segments` / :func:`quantize_scatter_segments`); the segment
scalars keep their defaults (0), unread."""


def _loc_firsts(locs: Sequence[torch.Tensor]) -> list[int]:
    """Each ``locs[s]``'s element offset from ``locs[0]`` (one dtype, so it divides)."""
    size, origin = locs[0].element_size(), locs[0].data_ptr()
    return [(loc.data_ptr() - origin) // size for loc in locs]


def gather_dequantize_segments(
    spec: LayoutSpec,
    first: torch.Tensor,
    table: torch.Tensor,
    locs: Sequence[torch.Tensor],
    layers: Sequence[int],
    out: torch.Tensor,
    *,
    page_size: int,
    fnuz: bool = False,
) -> None:
    """Read ``locs[s]`` on each of segment ``s``'s ``layers[s]`` layers into ``out``: one launch.

    ``first`` is the first layer's buffer and ``table`` :func:`segment_table` of every
    segment's buffers, ``page_size`` the first segment's; ``locs`` are 1-D, of one dtype
    and device. ``out`` is contiguous
    ``[rows, dim]``: segment 0's layers first, each ``n_0`` rows, then segment 1's. The
    caller validated everything; the read kernel must serve (:func:`segments_serve`).
    """
    plan = _plan(read_plan(spec, fnuz=fnuz))
    counts = [int(loc.shape[0]) for loc in locs]
    starts, total = [], 0
    for count, n_layers in zip(counts, layers, strict=True):
        starts.append(total)
        total += count * n_layers
    widest, depth = max(counts), int(table.shape[0])
    if widest == 0 or depth == 0:
        return
    geo = cached_geometry(spec, page_size)  # its strides; each layer's pages are in the table
    settings = launch_settings(plan.family, None if INTERPRETED else total, plan.launch)
    grid = (-(-widest // settings.block_tokens), depth)
    with _on_device(first):
        launch(jit._read_fp8_kernel, grid,
            out, _raw(first), locs[0], table, widest, *geo.values(), **_kwargs(plan, settings),
            LAYERED=True, SEGMENTS=True,
            runtime=_segment_scalars(counts, _loc_firsts(locs), starts),
        )  # fmt: skip


def quantize_scatter_segments(
    spec: LayoutSpec,
    values: Sequence[torch.Tensor],
    first: torch.Tensor,
    table: torch.Tensor,
    locs: Sequence[torch.Tensor],
    layers: Sequence[int],
    *,
    page_size: int,
    fnuz: bool = False,
) -> None:
    """Write ``values[s]`` (``[layers[s] * n_s, dim]``) as tokens ``locs[s]``: one launch.

    As :func:`gather_dequantize_segments`, the other way; the values are of one dtype.
    Where they do not sit a whole number of rows apart in memory they are first copied
    into one tensor (the launch addresses every segment's rows from the first one's).
    """
    plan = _plan(write_plan(spec, _values_dtype(values[0]), fnuz=fnuz))
    counts = [int(loc.shape[0]) for loc in locs]
    widest, depth = max(counts), int(table.shape[0])
    if widest == 0 or depth == 0:
        return
    rows_of = [v if v.is_contiguous() else v.contiguous() for v in values]
    pitch = spec.dim * rows_of[0].element_size()
    gaps = [v.data_ptr() - rows_of[0].data_ptr() for v in rows_of]
    if any(gap % pitch for gap in gaps):
        joined = torch.cat([v.reshape(-1) for v in rows_of])
        rows_of, starts, total = [joined], [], 0
        for count, n_layers in zip(counts, layers, strict=True):
            starts.append(total)
            total += count * n_layers
    else:
        starts = [gap // pitch for gap in gaps]
    geo = cached_geometry(spec, page_size)
    family = launch_family(plan, soft=_soft())
    total_rows = sum(c * n for c, n in zip(counts, layers, strict=True))
    settings = launch_settings(family, None if INTERPRETED else total_rows, plan.launch)
    grid = (-(-widest // settings.block_tokens), depth)
    with _on_device(first):
        launch(jit._write_fp8_kernel, grid,
            rows_of[0], _raw(first), locs[0], table, widest, *geo.values(),
            **_kwargs(plan, settings), LAYERED=True, LOC_LAYERS=False, SEGMENTS=True,
            runtime=_segment_scalars(counts, _loc_firsts(locs), starts),
        )  # fmt: skip
