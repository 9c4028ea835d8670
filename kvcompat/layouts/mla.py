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

from kvcompat.layouts._pages import LayoutPage
from kvcompat.layouts._plain import plain_encoding, plain_row_spec, row_size
from kvcompat.layouts._spec import LayoutSpec, Segment, SegmentRole

__all__ = ["mla_layout"]


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
    rank = row_size("MLA", "kv_lora_rank", kv_lora_rank, minimum=1)
    rope = row_size("MLA", "qk_rope_head_dim", qk_rope_head_dim, minimum=0)
    encoding = plain_encoding(dtype, layout="MLA")
    element_bytes = encoding.bits // 8
    segments = [
        Segment("latent", SegmentRole.DATA, "data", 0, rank * element_bytes, encoding, rank)
    ]
    if rope:
        rope_bytes = rope * element_bytes
        offset = rank * element_bytes
        segments.append(
            Segment("rope", SegmentRole.ROPE, "data", offset, rope_bytes, encoding, rope)
        )
    return plain_row_spec(
        name=f"mla_{rank}+{rope}_{encoding.value}",
        dtype=dtype,
        encoding=encoding,
        heads=1,
        value_dim=rank,
        rope_dim=rope,
        segments=tuple(segments),
    )


# A parametrised layout: the page pictures one example and states the row in symbols.
PAGES = (
    LayoutPage(
        "mla",
        mla_layout(512, 64, torch.bfloat16),
        title="MLA rows",
        note="`mla_layout(r, rope, dtype)`",
        cells=("`(r+rope)*size`", "the pool dtype", "none", "row", "row", "token-major"),
    ),
)
