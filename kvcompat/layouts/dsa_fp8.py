"""DSA fp8 rows (SGLang's ``DSATokenToKVPool`` with fp8 storage): 656 B/token by default.

The buffer is ``[rows, 1, row_bytes]`` (uint8 or fp8-typed); row ``loc`` holds token
``loc``. A row is ``[kv_lora_rank e4m3 | kv_lora_rank / 128 fp32 scales | rope bf16]``:
for DeepSeek's 512 + 64 that is 512 + 16 + 128 = 656 bytes. The scales live inside the
row, so the spec has ``scale_bytes == 0`` and describes them as a segment of the data row.

Write (SGLang's ``quantize_k_cache_separate`` Triton kernel), per 128-value tile, in
fp32: ``s = amax * fl(1/448)`` with no floor, ``q = e4m3_rne(clamp(x * (1 / s), -448,
448))``; the scale ``s`` is stored as a little-endian fp32; the rope is stored as bf16.
The kernel's source says ``amax / 448``, but Triton compiles a division by that constant
into a multiply by its rounded reciprocal, so on an NVIDIA GPU the stored ``s`` is
``amax * fl(1/448)`` (last-bit different from the IEEE quotient for over half of the
tiles); the codec does the same and matched an H200 byte for byte. The CPU interpreter
divides exactly instead, so there the scales differ in the last bit.

Read (SGLang's ``dequantize_k_cache_paged_dsa``): ``bf16(fp32(e4m3) * s)`` and the rope
copied; bit-identical to the GPU kernel (H200).

All-zero tiles: ``s = 0`` so ``1 / s`` is inf and ``0 * inf`` is NaN, which Triton's
``clamp`` turns into +448 on an NVIDIA GPU: codes 0x7E with scale 0.0, read back as 0.0.
(The CPU interpreter clamps the NaN to -448 instead.) The codec follows the GPU.

Error bound (finite inputs, non-zero tile): ``|x' - x| <= 0.07 * |x| + 2**-9 * s``
(e4m3 rounding ``2**-4``, the bf16 rounding of the read ``2**-8``, fp32 rounding of
``1 / s`` and ``x / s``; ``2**-10 * s`` for e4m3 subnormals, inflated for the same
roundings).

Non-finite inputs (``check_finite=False``), as measured on the GPU: NaN is dropped from
the tile maximum; a NaN payload value becomes +448; an inf makes ``s`` inf, the finite
values +-0 and the inf itself +448; an all-NaN tile gets a NaN scale and +448 codes.
"""

from __future__ import annotations

import functools

import torch

from kvcompat._errors import LayoutError
from kvcompat.layouts._numerics import (
    E4M3FN_MAX,
    amax_ignoring_nan,
    clamp_nan_high,
    decode_e4m3,
    encode_e4m3_saturating,
    to_bf16,
)
from kvcompat.layouts._spec import Encoding, KernelSpec, LayoutSpec, Segment, SegmentRole

__all__ = ["DSA_FP8", "dsa_fp8_layout"]

TILE = 128
_SCALE_BYTES = 4


class _DsaFp8Codec:
    """Row codec of DSA fp8 rows (see the module docstring)."""

    def __init__(self, rank: int, rope: int) -> None:
        self.rank = rank
        self.rope = rope
        self.tiles = rank // TILE

    def encode(
        self, spec: LayoutSpec, values: torch.Tensor, /, *, fnuz: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = values.shape[0]
        nope = values[:, : self.rank].to(torch.float32).reshape(n, self.tiles, TILE)
        amax = amax_ignoring_nan(nope, dim=-1)
        # Triton compiles `amax / 448` (a constexpr divisor) into a multiply by fl(1/448).
        scale = amax * torch.full_like(amax, 1.0 / E4M3FN_MAX)
        inverse = torch.ones_like(scale) / scale
        scaled = clamp_nan_high(nope * inverse.unsqueeze(-1), E4M3FN_MAX)
        codes = encode_e4m3_saturating(scaled).reshape(n, self.rank)
        scale_bytes = scale.contiguous().view(torch.uint8).reshape(n, self.tiles * _SCALE_BYTES)
        tail = values[:, self.rank :]
        rope_bf16 = tail if tail.dtype == torch.bfloat16 else to_bf16(tail.to(torch.float32))
        rope = rope_bf16.contiguous().view(torch.uint8)
        data = torch.cat((codes, scale_bytes, rope.reshape(n, 2 * self.rope)), dim=1)
        return data, data.new_empty((n, 0))

    def decode(
        self, spec: LayoutSpec, data: torch.Tensor, scale: torch.Tensor, /, *, fnuz: bool
    ) -> torch.Tensor:
        n = data.shape[0]
        split = self.rank + self.tiles * _SCALE_BYTES
        values = decode_e4m3(data[:, : self.rank]).reshape(n, self.tiles, TILE)
        scales = data[:, self.rank : split].contiguous().view(torch.float32)
        nope = to_bf16((values * scales.unsqueeze(-1)).reshape(n, self.rank))
        rope = data[:, split:].contiguous().view(torch.bfloat16)
        return torch.cat((nope, rope), dim=1)


@functools.cache
def dsa_fp8_layout(kv_lora_rank: int = 512, qk_rope_head_dim: int = 64) -> LayoutSpec:
    """The fp8 row layout of a DSA pool (``dsa_kv_cache_store_fp8``).

    Args:
        kv_lora_rank: latent width, a positive multiple of 128.
        qk_rope_head_dim: rope width, 64 or 0 (as SGLang's quantizer accepts).

    Returns:
        The (cached, immutable) spec, ``kv_lora_rank + kv_lora_rank // 32 +
        2 * qk_rope_head_dim`` bytes per token.

    Raises:
        LayoutError: unsupported widths.

    Example:
        >>> from kvcompat.layouts import dsa_fp8_layout
        >>> spec = dsa_fp8_layout(512, 64)
        >>> spec.bytes_per_token, [(s.name, s.offset, s.nbytes) for s in spec.segments]
        (656, [('nope', 0, 512), ('scale', 512, 16), ('rope', 528, 128)])
    """
    valid_rank = (
        isinstance(kv_lora_rank, int)
        and not isinstance(kv_lora_rank, bool)
        and kv_lora_rank > 0
        and kv_lora_rank % TILE == 0
    )
    if not valid_rank or qk_rope_head_dim not in (0, 64) or isinstance(qk_rope_head_dim, bool):
        msg = (
            "DSA fp8 rows need kv_lora_rank a positive multiple of 128 and "
            f"qk_rope_head_dim 64 or 0; received {kv_lora_rank!r} and {qk_rope_head_dim!r}."
        )
        raise LayoutError(msg)
    tiles = kv_lora_rank // TILE
    scale_end = kv_lora_rank + tiles * _SCALE_BYTES
    row_bytes = scale_end + 2 * qk_rope_head_dim
    segments = [
        Segment("nope", SegmentRole.DATA, "data", 0, kv_lora_rank, Encoding.E4M3FN, kv_lora_rank),
        Segment("scale", SegmentRole.SCALE, "data", kv_lora_rank, tiles * 4, Encoding.FP32, tiles),
    ]
    if qk_rope_head_dim:
        segments.append(
            Segment(
                "rope",
                SegmentRole.ROPE,
                "data",
                scale_end,
                2 * qk_rope_head_dim,
                Encoding.BF16,
                qk_rope_head_dim,
            )
        )
    default = (kv_lora_rank, qk_rope_head_dim) == (512, 64)
    return LayoutSpec(
        name="dsa_fp8" if default else f"dsa_fp8_{kv_lora_rank}+{qk_rope_head_dim}",
        data_bytes=row_bytes,
        scale_bytes=0,
        scale_pad=0,
        tile_size=TILE,
        page_align=row_bytes,
        interleaved=True,
        paged=False,
        dim=kv_lora_rank + qk_rope_head_dim,
        heads=1,
        value_dim=kv_lora_rank,
        rope_dim=qk_rope_head_dim,
        data_encoding=Encoding.E4M3FN,
        scale_encoding=Encoding.FP32,
        rope_encoding=Encoding.BF16 if qk_rope_head_dim else None,
        output_dtype=torch.bfloat16,
        unscaled_max=None,
        supports_fnuz=False,
        segments=tuple(segments),
        error_bound="|x' - x| <= 0.07 * |x| + 2**-9 * s, s the tile's fp32 scale (non-zero tiles)",
        codec=_DsaFp8Codec(kv_lora_rank, qk_rope_head_dim),
        kernel=KernelSpec("fp8", scales="fp32_in_row"),
    )


DSA_FP8 = dsa_fp8_layout()
"""DSA fp8 rows for DeepSeek (512 + 64): 512 e4m3 | 4 fp32 scales | 64 bf16 = 656 bytes.

Example:
    >>> import torch
    >>> from kvcompat.layouts import DSA_FP8, dequantize, quantize
    >>> kv_buffer = torch.zeros(8, 1, 656, dtype=torch.uint8)
    >>> x = torch.full((1, 576), 2.0)
    >>> quantize(DSA_FP8, x, kv_buffer, torch.tensor([3]), 64)
    >>> kv_buffer[3, 0, 512:516].view(torch.float32)  # the first tile's scale, 2 / 448
    tensor([0.0045])
    >>> dequantize(DSA_FP8, kv_buffer, torch.tensor([3]), 64)[0, 0]
    tensor(2., dtype=torch.bfloat16)
"""
