"""Token-major MHA rows (SGLang's ``MHATokenToKVPool`` K or V buffer).

The buffer is ``[rows, head_num, head_dim]``; row ``loc`` holds token ``loc`` whatever
the pool's page size (the NHD layout). Elements are stored as the pool's dtype: bf16,
fp16 and fp32 as themselves, fp8 (e4m3fn, e4m3fnuz, e5m2) as uint8 bytes of that logical
dtype. Writes are ``values.to(dtype)``, as SGLang's ``set_kv_buffer`` without k/v scales;
reads return the stored elements in the logical dtype (no scale is applied).

Error bound: exact when ``values`` already have the pool's dtype; otherwise one rounding
to nearest even in that dtype (relative ``2**-8`` bf16, ``2**-11`` fp16, ``2**-4`` e4m3,
``2**-3`` e5m2, plus half the smallest subnormal step). ``check_finite=True`` rejects
magnitudes beyond the dtype's largest finite value.
"""

from __future__ import annotations

import functools

import torch

from kvcompat.layouts._pages import LayoutPage
from kvcompat.layouts._plain import plain_encoding, plain_row_spec, row_size
from kvcompat.layouts._spec import LayoutSpec, Segment, SegmentRole

__all__ = ["mha_layout"]


@functools.cache
def mha_layout(head_num: int, head_dim: int, dtype: torch.dtype) -> LayoutSpec:
    """The token-major row layout of an MHA pool's K (or V) buffer.

    Args:
        head_num: KV heads stored per token (``pool.head_num``).
        head_dim: elements per head (``pool.head_dim``; ``v_head_dim`` for V).
        dtype: the pool's logical dtype (``pool.dtype``): bf16, fp16, fp32, or an fp8.

    Returns:
        The (cached, immutable) spec; ``dim = head_num * head_dim``.

    Raises:
        LayoutError: a non-positive size or an unsupported dtype.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import dequantize, mha_layout, quantize
        >>> spec = mha_layout(2, 8, torch.float8_e4m3fn)
        >>> spec.name, spec.bytes_per_token
        ('mha_2x8_e4m3fn', 16)
        >>> k_buffer = torch.zeros(32, 2, 8, dtype=torch.uint8)
        >>> quantize(spec, torch.full((1, 2, 8), 0.3), k_buffer, torch.tensor([5]), 16)
        >>> dequantize(spec, k_buffer, torch.tensor([5]), 16)[0, 0]
        tensor(0.3125, dtype=torch.float8_e4m3fn)
    """
    heads = row_size("MHA", "head_num", head_num, minimum=1)
    width = row_size("MHA", "head_dim", head_dim, minimum=1)
    encoding = plain_encoding(dtype, layout="MHA")
    dim = heads * width
    return plain_row_spec(
        name=f"mha_{heads}x{width}_{encoding.value}",
        dtype=dtype,
        encoding=encoding,
        heads=heads,
        value_dim=dim,
        rope_dim=0,
        segments=(
            Segment("values", SegmentRole.DATA, "data", 0, dim * encoding.bits // 8, encoding, dim),
        ),
    )


# A parametrised layout: the page pictures one example and states the row in symbols.
PAGES = (
    LayoutPage(
        "mha",
        mha_layout(2, 16, torch.bfloat16),
        title="MHA rows",
        note="`mha_layout(H, D, dtype)`",
        cells=("`H*D*size`", "the pool dtype", "none", "row", "row", "token-major"),
    ),
)
