"""DeepSeek-V4 fp4 indexer keys: 68 B/token, 128 e2m1 values + 4 ue8m0 exponents.

The buffer of ``DeepSeekV4IndexerPool`` with ``use_fp4_indexer`` (CUDA) is
``[pages, P * 68]`` uint8: each page holds ``P`` 64-byte data rows (128 e2m1 codes, two
per byte, the even element in the low nibble), then ``P`` 4-byte scale words (one ue8m0
exponent per 32 values: byte ``g`` of the word is group ``g``'s).

Write (SGLang's Triton ``quantize_fp4_indexer_tensor`` + ``store_fp4_index_k_cache``),
per 32-value group, in fp32: ``e = clamp(ceil_exp(max(amax / 6, 1e-4)), 1, 254)`` (the
biased exponent of the fp32 bits, plus one when the mantissa is not zero), ``s =
2**(e - 127)``, and each code is the e2m1 code of ``min(|x / s|, 6)`` counted against the
thresholds 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 — strictly above them (``threshold``,
the default) or with ties to even (``_rne``, used by the ratio-1/2 pools:
``index_k_rne``); the sign bit is set only on a non-zero code.

Read (SGLang's ``DeepSeekV4IndexerPool.get_index_k_dequant``): ``bf16(e2m1(code) *
exp2(e - 127))`` (exact).

Error bound (finite inputs): ``|x' - x| <= max(|x|, s) / 4``, with ``s`` the group's
power-of-two scale (``amax / 6 <= s``, so ``|x / s| <= 6``; the e2m1 grid steps are 0.5
below 2, 1 below 4, and 2 up to 6); a group whose ``amax / 6`` is below ``1e-4`` keeps
the ``2**-13`` scale (values below ``3.1e-5`` become 0). The read is exact in bf16.

Non-finite inputs (``check_finite=False``): as the GPU kernel does them: NaN is dropped
from the group maximum, and a NaN value becomes ``min(NaN, 6) = 6`` (code 0x7); an inf
makes the exponent 254 and saturates to +-6.
"""

from __future__ import annotations

import torch

from kvcompat.layouts._numerics import (
    E2M1_MAX,
    amax_ignoring_nan,
    biased_exponent_ceil,
    decode_e2m1,
    pack_nibbles,
    to_bf16,
    unpack_nibbles,
)
from kvcompat.layouts._pages import LayoutPage
from kvcompat.layouts._spec import Encoding, KernelSpec, LayoutSpec, Segment, SegmentRole

__all__ = ["DSV4_INDEXER_FP4", "DSV4_INDEXER_FP4_RNE"]

DIM = 128
GROUP = 32
GROUPS = DIM // GROUP  # 4
MIN_SCALE = 1.0e-4
_THRESHOLDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _codes(y: torch.Tensor, *, rne: bool) -> torch.Tensor:
    """e2m1 codes of fp32 ``y`` by threshold counting (SGLang's ``_fp4_e2m1_code[_rne]``)."""
    nan = torch.isnan(y)
    magnitude = torch.where(nan, E2M1_MAX, y.abs().clamp_max(E2M1_MAX))  # fminf(NaN, 6) = 6
    index = torch.zeros_like(y, dtype=torch.uint8)
    boundary = torch.zeros_like(y, dtype=torch.bool)
    for threshold in _THRESHOLDS:
        index += (magnitude >= threshold if rne else magnitude > threshold).to(torch.uint8)
        boundary |= magnitude == threshold
    if rne:
        index = torch.where(boundary & (index & 1 == 1), index - 1, index)
    sign = ((y < 0) & (index != 0)).to(torch.uint8) << 3
    return index | sign


class _IndexerFp4Codec:
    """Row codec of the fp4 indexer layouts (see the module docstring)."""

    def __init__(self, *, rne: bool) -> None:
        self.rne = rne

    def encode(
        self, spec: LayoutSpec, values: torch.Tensor, /, *, fnuz: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = values.shape[0]
        x = values.to(torch.float32).reshape(n, GROUPS, GROUP)
        amax = amax_ignoring_nan(x, dim=-1)
        quotient = amax / torch.full_like(amax, E2M1_MAX)
        quotient = torch.fmax(quotient, torch.full_like(quotient, MIN_SCALE))
        exponent = biased_exponent_ceil(quotient).clamp(1, 254)
        scale = (exponent << 23).view(torch.float32)
        codes = _codes(x / scale.unsqueeze(-1), rne=self.rne).reshape(n, DIM)
        return pack_nibbles(codes), exponent.to(torch.uint8)

    def decode(
        self, spec: LayoutSpec, data: torch.Tensor, scale: torch.Tensor, /, *, fnuz: bool
    ) -> torch.Tensor:
        n = data.shape[0]
        values = decode_e2m1(unpack_nibbles(data)).reshape(n, GROUPS, GROUP)
        factor = torch.exp2(scale.to(torch.float32) - 127.0)
        # to_bf16: every NaN (0 * inf, scale byte 255) as 0x7FFF, as on the GPU.
        return to_bf16((values * factor.unsqueeze(-1)).reshape(n, DIM))


_SEGMENTS = (
    Segment("values", SegmentRole.DATA, "data", 0, DIM // 2, Encoding.E2M1X2, DIM),
    Segment("scale", SegmentRole.SCALE, "scale", 0, GROUPS, Encoding.UE8M0, GROUPS),
)
_BOUND = "|x' - x| <= max(|x|, s) / 4, s = 2**(e - 127) the group's ue8m0 scale (e >= 114)"


def _max_error(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``max(|x|, s) / 4`` per value, ``s`` its group's ue8m0 scale (the module's bound)."""
    s = torch.exp2(scale.to(torch.float32) - 127.0).repeat_interleave(GROUP, dim=1)
    return 0.25 * torch.maximum(x.abs(), s) * (1 + 1e-6)


def _spec(name: str, *, rne: bool) -> LayoutSpec:
    return LayoutSpec(
        name=name,
        data_bytes=DIM // 2,
        scale_bytes=GROUPS,
        scale_pad=0,
        tile_size=GROUP,
        # SGLang's page is exactly P * 68 bytes; 64 is the largest alignment that keeps
        # that for every P that is a multiple of 16 (the pools use 64, 128, 256).
        page_align=DIM // 2,
        interleaved=False,
        paged=True,
        dim=DIM,
        heads=1,
        value_dim=None,
        rope_dim=0,
        data_encoding=Encoding.E2M1X2,
        scale_encoding=Encoding.UE8M0,
        rope_encoding=None,
        output_dtype=torch.bfloat16,
        unscaled_max=None,
        supports_fnuz=False,
        segments=_SEGMENTS,
        error_bound=_BOUND,
        codec=_IndexerFp4Codec(rne=rne),
        max_error=_max_error,
        kernel=KernelSpec(
            "fp4", scales="ue8m0_exp2", rounding="threshold_even" if rne else "threshold"
        ),
    )


DSV4_INDEXER_FP4 = _spec("dsv4_indexer_fp4", rne=False)
"""DeepSeek-V4 fp4 indexer keys (threshold rounding): 64 B e2m1 + 4 B ue8m0 per token.

Example:
    >>> import torch
    >>> from kvcompat.layouts import DSV4_INDEXER_FP4, dequantize, quantize
    >>> buf = torch.zeros(1, 64 * 68, dtype=torch.uint8)
    >>> quantize(DSV4_INDEXER_FP4, torch.full((1, 128), -3.0), buf, torch.tensor([1]), 64)
    >>> hex(int(buf[0, 64])), int(buf[0, 64 * 64 + 4])  # codes 0xF (-6), scale 2**-1
    ('0xff', 126)
    >>> dequantize(DSV4_INDEXER_FP4, buf, torch.tensor([1]), 64)[0, :2]
    tensor([-3., -3.], dtype=torch.bfloat16)
"""

DSV4_INDEXER_FP4_RNE = _spec("dsv4_indexer_fp4_rne", rne=True)
"""The same bytes as :data:`DSV4_INDEXER_FP4`, written with ties to even (``index_k_rne``).

Example:
    >>> import torch
    >>> from kvcompat.layouts import DSV4_INDEXER_FP4, DSV4_INDEXER_FP4_RNE, quantize
    >>> row = torch.tensor([[0.75] + [6.0] * 127])  # scale 1; 0.75 sits on a boundary
    >>> codes = []
    >>> for spec in (DSV4_INDEXER_FP4, DSV4_INDEXER_FP4_RNE):
    ...     buf = torch.zeros(1, 64 * 68, dtype=torch.uint8)
    ...     quantize(spec, row, buf, torch.tensor([0]), 64)
    ...     codes.append(int(buf[0, 0]) & 0xF)
    >>> codes  # threshold: not above 0.75 -> 0.5 (code 1); ties to even -> 1.0 (code 2)
    [1, 2]
"""

# One page for both roundings (the bytes are the same); the picture shows a 16-token page.
PAGES = (
    LayoutPage(
        "dsv4_indexer_fp4",
        DSV4_INDEXER_FP4,
        16,
        note="fp4 indexer keys",
        also=(DSV4_INDEXER_FP4_RNE,),
    ),
)
