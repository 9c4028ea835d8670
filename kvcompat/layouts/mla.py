"""Token-major MLA latent rows (SGLang's ``MLATokenToKVPool`` ``kv_buffer``).

The buffer is ``[rows, 1, kv_lora_rank + qk_rope_head_dim]``; row ``loc`` holds token
``loc``. The first ``kv_lora_rank`` columns are the compressed latent, which consumers
also read as V (``value_dim``); the rest is the rope part. Elements are stored as the
pool's dtype exactly as for MHA rows (fp8 as uint8 bytes of the logical dtype); writes
are ``values.to(dtype)`` (SGLang's ``set_kv_buffer`` / ``set_mla_kv_buffer`` for
non-DSA pools), reads return the logical dtype.

Error bound: exact for input in the pool's dtype, else one round-to-nearest-even.
"""

from __future__ import annotations

import functools

import torch

from kvcompat._errors import LayoutError
from kvcompat.layouts._plain import PLAIN_CODEC, plain_encoding
from kvcompat.layouts._spec import LayoutSpec, Segment, SegmentRole

__all__ = ["mla_layout"]


def _size(name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        msg = f"MLA rows need an int {name} >= {minimum}; received {value!r}."
        raise LayoutError(msg)
    return value


@functools.cache
def mla_layout(kv_lora_rank: int, qk_rope_head_dim: int, dtype: torch.dtype) -> LayoutSpec:
    """The token-major latent-row layout of an MLA pool.

    Args:
        kv_lora_rank: latent width (``pool.kv_lora_rank``), also the V width.
        qk_rope_head_dim: rope width (``pool.qk_rope_head_dim``; may be 0).
        dtype: the pool's logical dtype (``pool.dtype``).

    Returns:
        The (cached, immutable) spec; ``dim = kv_lora_rank + qk_rope_head_dim``.

    Raises:
        LayoutError: bad sizes or an unsupported dtype.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import mla_layout
        >>> spec = mla_layout(512, 64, torch.bfloat16)
        >>> spec.name, spec.bytes_per_token, spec.value_dim, spec.segment("rope").offset
        ('mla_512+64_bf16', 1152, 512, 1024)
    """
    rank = _size("kv_lora_rank", kv_lora_rank, minimum=1)
    rope = _size("qk_rope_head_dim", qk_rope_head_dim, minimum=0)
    encoding = plain_encoding(dtype, layout="MLA")
    dim = rank + rope
    element_bytes = encoding.bits // 8
    row_bytes = dim * element_bytes
    segments = [
        Segment("latent", SegmentRole.DATA, "data", 0, rank * element_bytes, encoding, rank)
    ]
    if rope:
        segments.append(
            Segment(
                "rope",
                SegmentRole.ROPE,
                "data",
                rank * element_bytes,
                rope * element_bytes,
                encoding,
                rope,
            )
        )
    return LayoutSpec(
        name=f"mla_{rank}+{rope}_{encoding.value}",
        data_bytes=row_bytes,
        scale_bytes=0,
        scale_pad=0,
        tile_size=dim,
        page_align=row_bytes,
        interleaved=True,
        paged=False,
        dim=dim,
        heads=1,
        value_dim=rank,
        rope_dim=rope,
        data_encoding=encoding,
        scale_encoding=None,
        rope_encoding=encoding if rope else None,
        output_dtype=dtype,
        unscaled_max=float(torch.finfo(dtype).max),
        supports_fnuz=False,
        segments=tuple(segments),
        error_bound=f"exact for {dtype} input, else one round-to-nearest-even into {dtype}",
        codec=PLAIN_CODEC,
    )
