"""Which kernel serves a layout, with which compile-time constants (no triton import).

:func:`read_plan` and :func:`write_plan` map a :class:`~kvcompat.layouts.LayoutSpec` and
the call's arguments to a :class:`Plan` (kernel family and constants), or explain in one
sentence why no kernel serves the call; :func:`unsupported` is that explanation alone,
which lets ``impl="auto"`` fall back to the torch twin without importing triton.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from kvcompat.layouts._plain import PLAIN_CODEC
from kvcompat.layouts._spec import SCALE_KINDS, Encoding, SegmentRole

if TYPE_CHECKING:
    from kvcompat.kernels._config import KernelFamily
    from kvcompat.layouts._spec import LayoutSpec

__all__ = [
    "VALUE_DTYPES",
    "Plan",
    "align_bytes",
    "cached_geometry",
    "chunk_words",
    "edge_span",
    "fp4_constants",
    "fp8_constants",
    "geometry",
    "launch_family",
    "read_plan",
    "unsupported",
    "word_bytes",
    "write_plan",
]

VALUE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
"""Value dtypes the write kernels load directly (others fall back to the torch twin);
a value's index here is the kernels' ``IN_KIND``."""

_PLAIN_OUT_KIND = {
    Encoding.BF16: 0,
    Encoding.FP16: 1,
    Encoding.FP32: 2,
    Encoding.E4M3FN: 3,
    Encoding.E5M2: 4,
    Encoding.E4M3FNUZ: 5,
}


@dataclass(frozen=True)
class Plan:
    """A kernel family and the compile-time constants of one layout's launch."""

    family: KernelFamily
    constants: dict[str, int | bool] = field(default_factory=dict)
    launch: tuple[int, int] | None = None
    """``(tokens per program, warps)`` the layout declares (``KernelSpec``), else None."""


def geometry(spec: LayoutSpec, page_size: int) -> dict[str, int]:
    """Page geometry constants shared by every kernel (token-major rows: pages of one)."""
    per_row = spec.tokens_per_row(page_size)
    data_stride, scale_base, scale_stride = spec.row_addressing(per_row)
    return {
        "PAGE": per_row,
        "PAGE_BYTES": spec.page_bytes(per_row),
        "DATA_STRIDE": data_stride,
        "SCALE_BASE": scale_base,
        "SCALE_STRIDE": scale_stride,
    }


def chunk_words(words: int, *, cap: int = 256) -> tuple[int, int]:
    """``(block, tail)`` column blocks for rows of ``words`` words.

    ``block`` is the largest power of two up to ``cap`` that fits the row, repeated while
    it fits; ``tail`` is the power of two covering what is left (0 when nothing is).

    Example:
        >>> from kvcompat.kernels._plan import chunk_words
        >>> chunk_words(144), chunk_words(256), chunk_words(5), chunk_words(4096 + 3)
        ((128, 16), (256, 0), (4, 1), (256, 4))
    """
    block = min(1 << (max(words, 1).bit_length() - 1), cap)
    rest = words % block
    return block, (1 << (rest - 1).bit_length()) if rest else 0


def align_bytes(*offsets: int) -> int:
    """The largest power of two up to 16 dividing every one of ``offsets`` (byte addresses).

    What a layered launch tells the compiler of its per-layer offsets, so that it may
    move 16 bytes at a time where a one-layer launch does.

    Example:
        >>> from kvcompat.kernels._plan import align_bytes
        >>> align_bytes(4096, 48), align_bytes(4096, 8), align_bytes()
        (16, 8, 16)
    """
    return _lowest_bit(math.gcd(*offsets), 16)


def word_bytes(row_bytes: int, *pointers: int) -> int:
    """The widest word (8, 4, 2 or 1 bytes) dividing ``row_bytes`` and every address."""
    return _lowest_bit(math.gcd(row_bytes, *pointers), 8)


def _lowest_bit(value: int, cap: int) -> int:
    """The largest power of two up to ``cap`` (itself one) that divides ``value``."""
    return cap if value == 0 else min(cap, value & -value)


def fp8_constants(spec: LayoutSpec) -> dict[str, int | bool] | None:
    """The fp8 kernels' constants of ``spec``, derived from its segments and ``spec.kernel``.

    ``NQ`` quantized values in ``NT`` tiles of ``TILE`` (``NT_P2`` the next power of two),
    then ``NROPE`` bf16 rotary values stored apart at byte ``ROPE_OFF`` of the data row;
    ``SCALE_KIND`` indexes :data:`~kvcompat.layouts._spec.SCALE_KINDS`; ``SCALE_IN_ROW``
    is the byte of in-row fp32 scales. None when the layout declares no fp8 kernel, or
    when its byte map is not what the declared scale kind reads (e4m3 values, the scales
    in the kind's row and encoding, one per tile): the twin then serves it.

    Example:
        >>> from kvcompat.kernels._plan import fp8_constants
        >>> from kvcompat.layouts import V4
        >>> c = fp8_constants(V4)
        >>> c["NQ"], c["TILE"], c["NT"], c["NROPE"], c["ROPE_OFF"], c["SCALE_KIND"]
        (448, 64, 7, 64, 448, 1)
    """
    kernel = spec.kernel
    if kernel is None or kernel.family != "fp8" or kernel.scales not in _FP8_SCALES:
        return None
    rope = [
        seg
        for seg in spec.segments
        if seg.role is SegmentRole.ROPE and seg.encoding is Encoding.BF16 and seg.region == "data"
    ]
    nrope = sum(seg.elements for seg in rope)
    nq = spec.dim - nrope
    tile = kernel.tile or spec.tile_size
    tiles = nq // tile
    in_row = kernel.scales == "fp32_in_row"
    if tiles * tile != nq or not _fp8_scales_fit(spec, kernel.scales, tiles):
        return None
    return {
        "NQ": nq,
        "TILE": tile,
        "NT": tiles,
        "NT_P2": 1 << (tiles - 1).bit_length(),
        "SCALE_KIND": SCALE_KINDS.index(kernel.scales),
        "SCALE_IN_ROW": spec.segment("scale").offset if in_row else 0,
        "NROPE": nrope,
        "ROPE_OFF": rope[0].offset if rope else 0,
    }


_FP8_SCALES = SCALE_KINDS[:5]
"""The scale kinds the fp8 kernels decode (``SCALE_KIND`` 0-4)."""

_FP4_SCALES = {"e4m3": 0, "ue8m0_exp2": 1}
"""The fp4 kernels' ``SCALE_KIND``: e4m3 scale bytes (V4.1), ``2**(b - 127)`` (indexer)."""

_FP4_ROUNDING = {"threshold": 0, "threshold_even": 1}
"""The indexer fp4 write kernel's ``RNE`` constant, by the layout's declared rounding."""


_FP8_SCALE_SEGMENTS = {
    "ue8m0_v4": ("scale", Encoding.UE8M0, 1),
    "ue8m0": ("scale", Encoding.UE8M0, 1),
    "fp32_in_row": ("data", Encoding.FP32, 4),
    "fp32": ("scale", Encoding.FP32, 4),
}
"""Where each scaled fp8 kind's scales live: (region, encoding, bytes per tile)."""


def _fp8_scales_fit(spec: LayoutSpec, kind: str, tiles: int) -> bool:
    """Whether ``spec``'s byte map is what the fp8 kernels read for scale kind ``kind``.

    e4m3 values, and: no scale segment (``"none"``), or one segment of ``tiles`` scales
    of the kind's encoding in the kind's row (at the start of the scale row, for the
    scale-row kinds, and exactly what a writer stores there).
    """
    if spec.data_encoding is not Encoding.E4M3FN:
        return False
    scales = [seg for seg in spec.segments if seg.role is SegmentRole.SCALE]
    if kind == "none":
        return not scales
    region, encoding, width = _FP8_SCALE_SEGMENTS[kind]
    if len(scales) != 1:
        return False
    (seg,) = scales
    fits = (seg.region, seg.encoding, seg.elements, seg.nbytes) == (
        region, encoding, tiles, width * tiles
    )  # fmt: skip
    if region == "scale":
        fits = fits and seg.offset == 0 and spec.scale_bytes_written == seg.nbytes
    return fits


def fp4_constants(spec: LayoutSpec) -> dict[str, int | bool] | None:
    """The fp4 kernels' constants of ``spec``, derived from its segments and ``spec.kernel``.

    ``NT`` tiles of ``TB`` code bytes (``2 * TB`` values) per token, one scale byte per
    tile at the start of the scale row, decoded as ``SCALE_KIND`` (0 e4m3, 1
    ``2**(b - 127)``). None when the layout declares no fp4 kernel or its geometry is not
    one the kernels take (power-of-two tiles and tile counts, one scale byte per tile).

    Example:
        >>> from kvcompat.kernels._plan import fp4_constants
        >>> from kvcompat.layouts import DSV4_INDEXER_FP4, V41_FP4
        >>> fp4_constants(V41_FP4), fp4_constants(DSV4_INDEXER_FP4)
        ({'NT': 32, 'TB': 8, 'SCALE_KIND': 0}, {'NT': 4, 'TB': 16, 'SCALE_KIND': 1})
    """
    kernel = spec.kernel
    if kernel is None or kernel.family != "fp4" or kernel.scales not in _FP4_SCALES:
        return None
    values = [seg for seg in spec.segments if seg.encoding is Encoding.E2M1X2]
    scales = [seg for seg in spec.segments if seg.role is SegmentRole.SCALE]
    tile = spec.tile_size
    tiles = spec.dim // tile if tile else 0
    encoding = Encoding.E4M3FN if kernel.scales == "e4m3" else Encoding.UE8M0
    fits = (
        len(values) == 1
        and (values[0].region, values[0].offset, values[0].nbytes) == ("data", 0, spec.dim // 2)
        and spec.data_bytes == spec.dim // 2
        and len(scales) == 1
        and (scales[0].region, scales[0].offset, scales[0].encoding) == ("scale", 0, encoding)
        and scales[0].elements == tiles == spec.scale_bytes_written
        and tiles * tile == spec.dim
        and tile % 2 == 0
        and _power_of_two(tiles)
        and _power_of_two(tile // 2)
    )
    if not fits:
        return None
    return {"NT": tiles, "TB": tile // 2, "SCALE_KIND": _FP4_SCALES[kernel.scales]}


def _power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def _declared_launch(spec: LayoutSpec, *, write: bool) -> tuple[int, int] | None:
    if spec.kernel is None:
        return None
    return spec.kernel.write_launch if write else spec.kernel.read_launch


def _kernel_family(spec: LayoutSpec) -> str | None:
    return None if spec.kernel is None else spec.kernel.family


_READ_PLANS: dict[tuple[int, bool], tuple[LayoutSpec, Plan | str]] = {}
_WRITE_PLANS: dict[tuple[int, torch.dtype, bool], tuple[LayoutSpec, Plan | str]] = {}
_GEOMETRY: dict[tuple[int, int], tuple[LayoutSpec, dict[str, int]]] = {}


def cached_geometry(spec: LayoutSpec, page_size: int) -> dict[str, int]:
    """:func:`geometry`, memoised by spec identity (launches stay cheap on the host)."""
    key = (id(spec), page_size)
    hit = _GEOMETRY.get(key)
    if hit is None or hit[0] is not spec:
        hit = _GEOMETRY[key] = (spec, geometry(spec, page_size))
    return hit[1]


def read_plan(spec: LayoutSpec, *, fnuz: bool) -> Plan | str:
    """The read kernel of ``spec``, or why there is none (memoised by spec identity).

    Example:
        >>> from kvcompat.kernels._plan import read_plan
        >>> from kvcompat.layouts import V41_FP4_NEW
        >>> read_plan(V41_FP4_NEW, fnuz=False).family
        'read_fp4'
    """
    key = (id(spec), fnuz)
    hit = _READ_PLANS.get(key)
    if hit is None or hit[0] is not spec:
        hit = _READ_PLANS[key] = (spec, _read_plan(spec, fnuz=fnuz))
    return hit[1]


def _read_plan(spec: LayoutSpec, *, fnuz: bool) -> Plan | str:  # noqa: PLR0911 - one per refusal
    if fnuz and not spec.supports_fnuz:
        return f"layout {spec.name!r} has no fnuz variant"
    if spec.codec is PLAIN_CODEC:
        return Plan("gather_rows", {"ROW_BYTES": spec.data_bytes})
    if _kernel_family(spec) == "fp4":
        fp4 = fp4_constants(spec)
        if fp4 is None:
            return f"no kernel reads layout {spec.name!r}"
        return Plan("read_fp4", fp4, _declared_launch(spec, write=False))
    constants = fp8_constants(spec)
    if constants is None:
        return f"no kernel reads layout {spec.name!r}"
    out_f32 = spec.output_dtype == torch.float32
    if not out_f32 and spec.output_dtype != torch.bfloat16:
        return f"no kernel reads layout {spec.name!r} into {spec.output_dtype}"
    return Plan(
        "read_fp8",
        {**constants, "OUT_DIM": spec.dim, "OUT_F32": out_f32, "FNUZ": fnuz},
        _declared_launch(spec, write=False),
    )


def write_plan(spec: LayoutSpec, values_dtype: torch.dtype, *, fnuz: bool) -> Plan | str:
    """The write kernel of ``spec`` for ``values_dtype`` values, or why there is none.

    Memoised by spec identity.

    Example:
        >>> import torch
        >>> from kvcompat.kernels._plan import write_plan
        >>> from kvcompat.layouts import V4
        >>> write_plan(V4, torch.bfloat16, fnuz=False).family
        'write_fp8'
        >>> write_plan(V4, torch.bfloat16, fnuz=True).constants["MODE"]  # the ROCm store
        3
    """
    key = (id(spec), values_dtype, fnuz)
    hit = _WRITE_PLANS.get(key)
    if hit is None or hit[0] is not spec:
        hit = _WRITE_PLANS[key] = (spec, _write_plan(spec, values_dtype, fnuz=fnuz))
    return hit[1]


def _write_plan(  # noqa: PLR0911 - one return per kernel family, one per refusal
    spec: LayoutSpec, values_dtype: torch.dtype, *, fnuz: bool
) -> Plan | str:
    if fnuz and not spec.supports_fnuz:
        return f"layout {spec.name!r} has no fnuz variant"
    if values_dtype not in VALUE_DTYPES:
        return f"the write kernels take bf16, fp16 or fp32 values, not {values_dtype}"
    in_bf16 = values_dtype == torch.bfloat16
    if spec.codec is PLAIN_CODEC and spec.output_dtype == values_dtype:
        return Plan("scatter_rows", {"ROW_BYTES": spec.data_bytes})
    unscaled_fp8 = spec.kernel is not None and spec.kernel.scales == "none"
    if spec.codec is PLAIN_CODEC or (_kernel_family(spec) == "fp8" and unscaled_fp8):
        esize = spec.data_encoding.bits // 8
        return Plan(
            "write_plain",
            {"DIM": spec.dim, "ESIZE": esize, "OUT_KIND": _PLAIN_OUT_KIND[spec.data_encoding],
             "IN_BF16": in_bf16},
        )  # fmt: skip
    if _kernel_family(spec) == "fp4":
        return _write_fp4_plan(spec, values_dtype)
    constants = fp8_constants(spec)
    if constants is None:
        return f"no kernel writes layout {spec.name!r}"
    kind = int(constants.pop("SCALE_KIND"))
    if kind == 0:
        return f"no kernel writes layout {spec.name!r}"  # unscaled: write_plain above
    # MODE 3 is the V4 store of SGLang's ROCm build (e4m3fnuz codes, log2-based scale).
    mode = 3 if fnuz else {1: 0, 2: 1, 3: 2, 4: 4}[kind]
    return Plan(
        "write_fp8",
        {**constants, "MODE": mode, "IN_DIM": spec.dim, "IN_BF16": in_bf16,
         "SPAN": edge_span(spec)},
        _declared_launch(spec, write=True),
    )  # fmt: skip


def _write_fp4_plan(spec: LayoutSpec, values_dtype: torch.dtype) -> Plan | str:
    """V4.1's e4m3-scaled writer, or the indexer's power-of-two one, as the spec declares."""
    kernel = spec.kernel
    constants = fp4_constants(spec)
    in_kind = VALUE_DTYPES.index(values_dtype)
    if kernel is None or constants is None:
        return f"no kernel writes layout {spec.name!r}"
    if constants["SCALE_KIND"] == 0 and kernel.rounding == "nearest":
        if (constants["NT"], constants["TB"]) != (32, 8):  # the V4.1 writers' fixed grid
            return f"no kernel writes layout {spec.name!r} (512 values in tiles of 16 only)"
        return Plan("write_fp4", {"IN_KIND": in_kind})
    if constants["SCALE_KIND"] == 1 and kernel.rounding in _FP4_ROUNDING:
        return Plan(
            "write_fp4_ue8m0",
            {"NT": constants["NT"], "TB": constants["TB"], "IN_KIND": in_kind,
             "RNE": bool(_FP4_ROUNDING[kernel.rounding])},
            _declared_launch(spec, write=True),
        )  # fmt: skip
    return f"no kernel writes layout {spec.name!r} (scales {kernel.scales!r}, {kernel.rounding!r})"


def launch_family(plan: Plan, *, soft: bool) -> KernelFamily:
    """The kernel (and launch settings) family that runs ``plan``.

    A plan's own family, except V41_FP4 writes of bf16 / fp16 values on a GPU
    (``soft=False``), which take the packed-pair kernel; fp32 values and the CPU
    interpreter (``soft=True``) keep the float kernel.

    Example:
        >>> import torch
        >>> from kvcompat.kernels._plan import launch_family, write_plan
        >>> from kvcompat.layouts import V41_FP4
        >>> plan = write_plan(V41_FP4, torch.bfloat16, fnuz=False)
        >>> launch_family(plan, soft=False), launch_family(plan, soft=True)
        ('write_fp4_pairs', 'write_fp4')
    """
    if plan.family == "write_fp4" and plan.constants["IN_KIND"] != 2 and not soft:
        return "write_fp4_pairs"
    return plan.family


def edge_span(spec: LayoutSpec) -> int:
    """The bytes a token's write spans from its data offset if they can split a sector.

    That is the contiguous span when it can start or end inside a 32-byte DRAM sector (the
    write kernels then prefetch those edge sectors), else 0.

    Example:
        >>> from kvcompat.kernels._plan import edge_span
        >>> from kvcompat.layouts import DSA_FP8, V4, V41_NEW
        >>> edge_span(V41_NEW), edge_span(DSA_FP8), edge_span(V4)
        (528, 656, 0)
    """
    span = spec.data_bytes
    if spec.interleaved and spec.scale_bytes:
        span += spec.scale_bytes_written
    stride = spec.row_addressing(1)[0] if spec.interleaved or not spec.paged else span
    return span if span % 32 or stride % 32 else 0


def unsupported(
    spec: LayoutSpec, *, write: bool, fnuz: bool, values_dtype: torch.dtype | None = None
) -> str | None:
    """Why no kernel serves this read or write (None when one does).

    Example:
        >>> import torch
        >>> from kvcompat.kernels._plan import unsupported
        >>> from kvcompat.layouts import V41
        >>> unsupported(V41, write=True, fnuz=False, values_dtype=torch.float64)
        'the write kernels take bf16, fp16 or fp32 values, not torch.float64'
    """
    if write:
        plan = write_plan(spec, values_dtype or torch.float32, fnuz=fnuz)
    else:
        plan = read_plan(spec, fnuz=fnuz)
    return plan if isinstance(plan, str) else None
