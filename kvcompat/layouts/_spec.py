"""The immutable description of one KV-cache byte layout, and the row-codec seam.

A :class:`LayoutSpec` says where each token's bytes live inside a pool buffer and how
they encode values; it holds no tensors and does no arithmetic beyond addressing. The
arithmetic lives in the layout's :class:`RowCodec`, which turns ``[n, dim]`` values into
per-token data and scale bytes and back, with no knowledge of pages. Gathering and
scattering those bytes at token addresses is :mod:`kvcompat.layouts._addressing`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, overload

from kvcompat._errors import LayoutError

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    ErrorBound = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """``max_error(x, scale_rows) -> per-value bound`` (see ``LayoutSpec.max_error``)."""

__all__ = [
    "Encoding",
    "KernelSpec",
    "LayoutSpec",
    "Region",
    "RowCodec",
    "Segment",
    "SegmentRole",
]

Region = Literal["data", "scale"]
"""Which per-token row a segment lives in: the data row or the scale row."""


class Encoding(enum.Enum):
    """How the elements of one segment are encoded.

    Example:
        >>> from kvcompat.layouts import Encoding
        >>> Encoding.UE8M0.value, Encoding.E2M1X2.bits
        ('ue8m0', 4)
    """

    E4M3FN = "e4m3fn"
    """OCP fp8 e4m3 (bias 7, max 448, NaN 0x7F/0xFF, no inf)."""
    E4M3FNUZ = "e4m3fnuz"
    """AMD fp8 e4m3 (bias 8, max 240, NaN 0x80, no negative zero)."""
    E5M2 = "e5m2"
    """OCP fp8 e5m2 (bias 15, max 57344, with inf)."""
    UE8M0 = "ue8m0"
    """Unsigned power-of-two exponent byte: value ``2**(byte - 127)``."""
    E2M1X2 = "e2m1x2"
    """Two fp4 e2m1 codes per byte, the even element in the low nibble."""
    BF16 = "bf16"
    """bfloat16, little endian."""
    FP16 = "fp16"
    """IEEE half, little endian."""
    FP32 = "fp32"
    """IEEE single, little endian."""

    @property
    def bits(self) -> int:
        """Bits per element.

        Example:
            >>> from kvcompat.layouts import Encoding
            >>> Encoding.BF16.bits, Encoding.E4M3FN.bits
            (16, 8)
        """
        return _ENCODING_BITS[self]


_ENCODING_BITS = {
    Encoding.E4M3FN: 8,
    Encoding.E4M3FNUZ: 8,
    Encoding.E5M2: 8,
    Encoding.UE8M0: 8,
    Encoding.E2M1X2: 4,
    Encoding.BF16: 16,
    Encoding.FP16: 16,
    Encoding.FP32: 32,
}


class SegmentRole(enum.Enum):
    """What a segment of a token's bytes holds.

    Example:
        >>> from kvcompat.layouts import V4
        >>> [s.role.value for s in V4.segments]
        ['data', 'rope', 'scale', 'pad']
    """

    DATA = "data"
    """Quantized (or plain) values."""
    ROPE = "rope"
    """The rotary tail, stored apart from the quantized values."""
    SCALE = "scale"
    """Per-tile scale factors."""
    PAD = "pad"
    """Bytes no writer ever stores."""


@dataclass(frozen=True, slots=True)
class Segment:
    """One contiguous run of bytes inside a token's data row or scale row.

    Attributes:
        name: short label (``"nope"``, ``"rope"``, ``"scale"``, ``"pad"``, ...).
        role: what the bytes hold.
        region: ``"data"`` or ``"scale"``: the row the offset is relative to.
        offset: first byte, relative to the start of that row.
        nbytes: length in bytes.
        encoding: element encoding, or None for padding.
        elements: how many values the segment holds (0 for padding).

    Example:
        >>> from kvcompat.layouts import V4
        >>> rope = V4.segment("rope")
        >>> rope.offset, rope.nbytes, rope.encoding.value, rope.elements
        (448, 128, 'bf16', 64)
    """

    name: str
    role: SegmentRole
    region: Region
    offset: int
    nbytes: int
    encoding: Encoding | None
    elements: int

    @property
    def end(self) -> int:
        """One past the last byte, relative to the row start.

        Example:
            >>> from kvcompat.layouts import V4
            >>> V4.segment("nope").end
            448
        """
        return self.offset + self.nbytes


ScaleKind = Literal["none", "ue8m0_v4", "ue8m0", "fp32_in_row", "fp32", "e4m3", "ue8m0_exp2"]
"""How the kernels decode (and write) a layout's scale bytes (see :class:`KernelSpec`)."""

SCALE_KINDS: tuple[ScaleKind, ...] = (
    "none", "ue8m0_v4", "ue8m0", "fp32_in_row", "fp32", "e4m3", "ue8m0_exp2",
)  # fmt: skip
"""The scale kinds, in the order of the kernels' ``SCALE_KIND`` constant (fp8: 0-4)."""

Fp4Rounding = Literal["nearest", "threshold", "threshold_even"]
"""How the fp4 write kernels turn ``x / s`` into e2m1 codes (see :class:`KernelSpec`)."""


@dataclass(frozen=True, slots=True)
class KernelSpec:
    """Which Triton kernel family serves a layout, as the layout's module declares it.

    The kernel plan (``kvcompat.kernels._plan``) derives every compile-time constant
    from the spec's segments and this declaration; layouts declaring none are served by
    the plain row kernels when their codec is the plain one, else by the torch twin.

    Attributes:
        family: ``"fp8"`` (e4m3 values in tiles, an optional bf16 rotary tail) or
            ``"fp4"`` (e2m1 codes, two per byte, in tiles with one scale byte each).
        scales: how the scale bytes decode, and how a write computes them. fp8:
            ``"none"`` (unscaled: written as plain e4m3 casts), ``"ue8m0_v4"`` (V4: byte
            0 reads 0), ``"ue8m0"`` (V4.1: byte 0 is ``2**-127``, 255 is NaN),
            ``"fp32_in_row"`` (DSA: fp32 scales inside the data row, at the scale
            segment, ``amax * fl(1/448)``), ``"fp32"`` (DSv4 indexer: one fp32 scale per
            tile in the scale row, ``max(amax, 1e-4) / 448``, read back as fp32). fp4:
            ``"e4m3"`` (V4.1: e4m3 scale bytes), ``"ue8m0_exp2"`` (DSv4 indexer: byte
            ``b`` reads ``2**(b - 127)``, 0 is ``2**-127``, 255 is inf).
        tile: fp8 only: the kernels' column tile; None means the layout's
            ``tile_size`` (an unscaled layout may pick any divisor of its width).
        rounding: fp4 only: how a write turns ``x / s`` into e2m1 codes. ``"nearest"``
            (``cvt.rn.satfinite``: ties to even, the sign kept on zero), ``"threshold"``
            (counted strictly above each midpoint, the sign only on a non-zero code: SGLang's
            indexer quantizer), ``"threshold_even"`` (the same with ties to even).
        read_launch, write_launch: ``(tokens per program, warps)`` for this layout's
            read / write launches, where a sweep (``benchmarks/bench_kernels_gpu.py
            --sweep``) found the kernel family's default slow for this layout's row
            width; None takes the family's default (``kvcompat.kernels._config``).

    Example:
        >>> from kvcompat.layouts import DSV4_INDEXER_FP8, V4
        >>> V4.kernel.family, V4.kernel.scales, V4.kernel.read_launch
        ('fp8', 'ue8m0_v4', None)
        >>> DSV4_INDEXER_FP8.kernel.read_launch, DSV4_INDEXER_FP8.kernel.write_launch
        ((4, 2), (8, 4))
    """

    family: Literal["fp8", "fp4"]
    scales: ScaleKind = "none"
    tile: int | None = None
    rounding: Fp4Rounding = "nearest"
    read_launch: tuple[int, int] | None = None
    write_launch: tuple[int, int] | None = None


class RowCodec(Protocol):
    """Pure per-token arithmetic of a layout: values <-> (data bytes, scale bytes).

    A codec knows nothing about pages or locations. ``encode`` takes ``[n, dim]`` values of
    any floating dtype (never modified) and returns ``(data, scale)``: uint8 tensors of shape
    ``[n, spec.data_bytes]`` and ``[n, spec.scale_bytes_written]``. ``decode`` takes uint8
    ``[n, spec.data_bytes]`` and ``[n, spec.scale_bytes]`` (the whole scale row, padding
    included) and returns ``[n, spec.dim]`` values of ``spec.output_dtype``. Both run on the
    device of their inputs.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import V41
        >>> data, scale = V41.codec.encode(V41, torch.ones(2, 512), fnuz=False)
        >>> data.shape, scale.shape, int(scale[0, 0])
        (torch.Size([2, 512]), torch.Size([2, 16]), 119)
    """

    def encode(
        self, spec: LayoutSpec, values: torch.Tensor, /, *, fnuz: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Quantize ``[n, dim]`` values into ``(data, scale)`` uint8 rows."""
        ...

    def decode(
        self, spec: LayoutSpec, data: torch.Tensor, scale: torch.Tensor, /, *, fnuz: bool
    ) -> torch.Tensor:
        """Dequantize ``(data, scale)`` uint8 rows into ``[n, dim]`` values."""
        ...


@dataclass(frozen=True, slots=True, repr=False)
class LayoutSpec:
    """Geometry and element encodings of one KV-cache byte layout (immutable).

    Each token owns a *data row* of ``data_bytes`` and a *scale row* of ``scale_bytes``.
    In a **block-split** page (``interleaved=False``) the page holds ``P`` data rows, then
    ``P`` scale rows, then padding up to ``page_bytes(P)``; in an **interleaved** page each
    token is its data row immediately followed by its scale row. **Token-major** layouts
    (``paged=False``: SGLang's MHA, MLA and DSA pools) index the buffer's first dimension
    by token location directly, whatever the pool's page size; they behave as interleaved
    pages of one token.

    Attributes:
        name: registry name (SGLang's ``KVLayout`` value for the DeepSeek-V4 layouts).
        data_bytes: bytes of one token's data row.
        scale_bytes: bytes of one token's scale row (0 when scales, if any, live in the
            data row, as in DSA's 656-byte rows).
        scale_pad: trailing bytes of the scale row that no writer stores (V4: 1).
        tile_size: values sharing one scale (``dim`` for unscaled layouts).
        page_align: the page stride is padded to a multiple of this many bytes.
        interleaved: data and scale rows alternate per token (else block-split).
        paged: the buffer is ``[num_pages, page_bytes]`` (else ``[rows, ...]``, row = loc).
        dim: values per token (the width :func:`~kvcompat.layouts.dequantize` returns).
        heads: heads per token (MHA rows; 1 elsewhere): writes also accept values shaped
            ``[n, heads, dim // heads]``.
        value_dim: leading columns a consumer reads as V, where the pool defines it
            (MLA/DSA: ``kv_lora_rank``; MHA: ``dim``); None for DeepSeek-V4 layouts.
        rope_dim: trailing rotary values (stored apart in V4 and DSA; 0 when none).
        data_encoding: encoding of the values (the non-rotary ones when stored apart).
        scale_encoding: encoding of the scales, or None for unscaled layouts.
        rope_encoding: encoding of the rotary tail, or None when it has none.
        output_dtype: dtype that dequantization returns.
        unscaled_max: for layouts that store values without a scale, the largest finite
            magnitude the storage format holds (writes with ``check_finite=True`` reject
            larger inputs); None for scaled layouts.
        supports_fnuz: whether the ROCm e4m3fnuz byte flavour exists for this layout.
        segments: the byte map of the data and scale rows.
        error_bound: the documented write-then-read error bound, in words.
        codec: the per-token arithmetic (not part of equality or hashing).
        max_error: the error bound as a function, where the layout declares one:
            ``max_error(x, scale)`` takes fp32 values ``[n, dim]`` and the stored scale
            rows ``[n, scale_bytes]`` (uint8) and returns the per-value bound on
            ``|dequantize(quantize(x)) - x|`` for finite ``x``; the round-trip tests and
            :func:`kvcompat.testing.check_pool` use it (not part of equality or hashing).
        kernel: the Triton kernel family serving the layout, where one does
            (:class:`KernelSpec`); None for the plain row layouts (served by the row
            kernels through their codec) and layouts only the torch twin serves.

    Example:
        >>> from kvcompat.layouts import V4
        >>> V4.bytes_per_token, V4.page_bytes(64), V4.row_addressing(64)
        (584, 37440, (576, 36864, 8))
    """

    name: str
    data_bytes: int
    scale_bytes: int
    scale_pad: int
    tile_size: int
    page_align: int
    interleaved: bool
    paged: bool
    dim: int
    heads: int
    value_dim: int | None
    rope_dim: int
    data_encoding: Encoding
    scale_encoding: Encoding | None
    rope_encoding: Encoding | None
    output_dtype: torch.dtype
    unscaled_max: float | None
    supports_fnuz: bool
    segments: tuple[Segment, ...]
    error_bound: str
    codec: RowCodec = field(compare=False, hash=False, repr=False)
    max_error: ErrorBound | None = field(default=None, compare=False, hash=False, repr=False)
    kernel: KernelSpec | None = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        for region, size in (("data", self.data_bytes), ("scale", self.scale_bytes)):
            covered = sorted((s.offset, s.end) for s in self.segments if s.region == region)
            cursor = 0
            for start, end in covered:
                if start != cursor:
                    msg = f"layout {self.name!r}: the {region} row has a gap or overlap at {start}"
                    raise LayoutError(msg)
                cursor = end
            if cursor != size:
                msg = f"layout {self.name!r}: segments cover {cursor} of {size} {region} bytes"
                raise LayoutError(msg)
        if not self.paged and self.page_align != self.bytes_per_token:
            msg = f"token-major layout {self.name!r} must align pages to its row size"
            raise LayoutError(msg)
        # Row addressing relies on the data and scale strides dividing every page size.
        data_stride, _, scale_stride = self.row_addressing(1)
        strides = (data_stride, scale_stride) if self.scale_bytes else (data_stride,)
        if any(self.page_align % stride for stride in strides):
            msg = (
                f"layout {self.name!r}: page_align {self.page_align} is not a multiple of {strides}"
            )
            raise LayoutError(msg)

    def __repr__(self) -> str:
        arrangement = (
            "token-major"
            if not self.paged
            else "interleaved"
            if self.interleaved
            else "block-split"
        )
        return f"LayoutSpec({self.name!r}, {self.bytes_per_token} B/token, {arrangement})"

    @property
    def bytes_per_token(self) -> int:
        """Data plus scale bytes of one token.

        Example:
            >>> from kvcompat.layouts import V41_FP4
            >>> V41_FP4.bytes_per_token
            288
        """
        return self.data_bytes + self.scale_bytes

    @property
    def scale_bytes_written(self) -> int:
        """Scale-row bytes a writer stores (``scale_bytes - scale_pad``).

        Example:
            >>> from kvcompat.layouts import V4
            >>> V4.scale_bytes_written
            7
        """
        return self.scale_bytes - self.scale_pad

    def segment(self, name: str) -> Segment:
        """The segment called ``name``.

        Raises:
            LayoutError: no segment has that name.

        Example:
            >>> from kvcompat.layouts import DSA_FP8
            >>> DSA_FP8.segment("scale").offset
            512
        """
        for seg in self.segments:
            if seg.name == name:
                return seg
        names = ", ".join(repr(s.name) for s in self.segments)
        msg = f"layout {self.name!r} has no segment {name!r}; its segments are {names}."
        raise LayoutError(msg)

    def page_bytes(self, page_size: int) -> int:
        """Bytes of one page of ``page_size`` tokens: ``ceil(P * bpt / align) * align``.

        For token-major layouts this is ``page_size * bytes_per_token`` (rows are never
        padded).

        Example:
            >>> from kvcompat.layouts import V4, V41_NEW
            >>> V4.page_bytes(2), V41_NEW.page_bytes(2)
            (1728, 1056)
        """
        raw = page_size * self.bytes_per_token
        return -(-raw // self.page_align) * self.page_align

    def tokens_per_row(self, page_size: int) -> int:
        """Tokens held by one row of the buffer: ``page_size`` if paged, else 1.

        Example:
            >>> from kvcompat.layouts import V4, DSA_FP8
            >>> V4.tokens_per_row(64), DSA_FP8.tokens_per_row(64)
            (64, 1)
        """
        return page_size if self.paged else 1

    def row_addressing(self, page_size: int) -> tuple[int, int, int]:
        """``(data_stride, scale_base, scale_stride)`` of slots inside one buffer row.

        Slot ``s``'s data starts at ``s * data_stride`` and its scales at
        ``scale_base + s * scale_stride`` from the start of its page.

        Example:
            >>> from kvcompat.layouts import V41, V41_NEW
            >>> V41.row_addressing(4), V41_NEW.row_addressing(4)
            ((512, 2048, 16), (528, 512, 528))
        """
        if self.interleaved or not self.paged:
            return self.bytes_per_token, self.data_bytes, self.bytes_per_token
        return self.data_bytes, page_size * self.data_bytes, self.scale_bytes

    @overload
    def data_offset(self, loc: int, page_size: int) -> int: ...
    @overload
    def data_offset(self, loc: torch.Tensor, page_size: int) -> torch.Tensor: ...
    def data_offset(self, loc: int | torch.Tensor, page_size: int) -> int | torch.Tensor:
        """Byte offset of token ``loc``'s data row in the flattened buffer.

        ``page = loc // P`` and ``slot = loc % P`` (for token-major layouts ``P`` is 1).

        Example:
            >>> from kvcompat.layouts import V4
            >>> V4.data_offset(65, 64)  # page 1, slot 1
            38016
        """
        per_row = self.tokens_per_row(page_size)
        data_stride, _, _ = self.row_addressing(per_row)
        return (loc // per_row) * self.page_bytes(per_row) + (loc % per_row) * data_stride

    @overload
    def scale_offset(self, loc: int, page_size: int) -> int: ...
    @overload
    def scale_offset(self, loc: torch.Tensor, page_size: int) -> torch.Tensor: ...
    def scale_offset(self, loc: int | torch.Tensor, page_size: int) -> int | torch.Tensor:
        """Byte offset of token ``loc``'s scale row in the flattened buffer.

        Example:
            >>> from kvcompat.layouts import V4, V41_NEW
            >>> V4.scale_offset(65, 64), V41_NEW.scale_offset(1, 64)
            (74312, 1040)
        """
        per_row = self.tokens_per_row(page_size)
        _, scale_base, scale_stride = self.row_addressing(per_row)
        return (
            (loc // per_row) * self.page_bytes(per_row)
            + scale_base
            + (loc % per_row) * scale_stride
        )
