"""Oracle of the V4.1 layouts (``dsv4_v41.py``, ``dsv4_v41_fp4.py``): SGLang's torch references and
Triton readers."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from _sglang import places
from _sglang.features import require, sglang_code

from _oracle._common import (
    Result,
    check,
    fail_or_pass,
    nan_aware_equal,
    tile_values,
)
from kvcompat.layouts import (
    V41,
    V41_FP4,
    V41_FP4_NEW,
    V41_NEW,
    LayoutSpec,
    dequantize,
    quantize,
)
from kvcompat.layouts._addressing import gather_rows, scatter_rows


def _v41_reference() -> Any:
    """SGLang's torch reference of the V4.1 layouts (0.5.21 on; earlier releases lack V4.1)."""
    return sglang_code(*places.V41_REFERENCE)


def _reference_part(ref: Any, name: str) -> Any:
    """``ref.<name>``, or a capability skip: 0.5.21-0.5.22's reference has the fp4 codecs
    only, and no ``interleave_pages`` / ``deinterleave_pages`` (no ``_NEW`` layouts yet)."""
    part = getattr(ref, name, None)
    require(callable(part), ".".join((*places.V41_REFERENCE[0], name)))
    return part


def _v41_reference_store(spec: LayoutSpec, *, non_finite: bool) -> Result:
    """Whole pages against the torch reference; with NaN/inf, the tiles holding them are
    excluded: there kvcompat follows the CUDA store (verified on an H200), which does not
    poison the tile the way the reference does."""
    ref = _v41_reference()

    fp4 = spec.data_encoding.value == "e2m1x2"
    problems, excluded = [], 0
    for page_size in (2, 4, 64):
        num_pages = 3
        n = num_pages * page_size
        values = tile_values(n, 512, spec.tile_size, seed=page_size, dtype=torch.bfloat16)
        if non_finite:
            values[0, 5] = float("nan")
            values[1, 40] = float("inf")
            values[2, 100] = -float("inf")
            values[3, 7], values[3, 9] = float("nan"), float("inf")
        quant = _reference_part(ref, "quantize_k_cache_v41_fp4" if fp4 else "quantize_k_cache_v41")
        expected = quant(values.view(num_pages, page_size, 512), spec.page_bytes(page_size))
        if spec.interleaved:
            interleave = _reference_part(ref, "interleave_pages")
            expected = interleave(expected, page_size, spec.data_bytes, spec.scale_bytes)
        ours = torch.zeros(num_pages, spec.page_bytes(page_size), dtype=torch.uint8)
        loc = torch.arange(n)
        # tile_values reaches past 2688, where fp4 tiles saturate: that needs check_finite=False.
        quantize(spec, values, ours, loc, page_size, check_finite=not (non_finite or fp4))
        bad_tiles = ~torch.isfinite(values.float()).reshape(n, -1, spec.tile_size).all(-1)
        excluded += int(bad_tiles.sum())
        ours_data, ours_scale = gather_rows(spec, ours, loc, page_size)
        ref_data, ref_scale = gather_rows(spec, expected, loc, page_size)
        per_tile = spec.data_bytes // bad_tiles.shape[1]
        keep_data = (~bad_tiles).repeat_interleave(per_tile, dim=1)
        if not torch.equal(ours_data[keep_data], ref_data[keep_data]):
            problems.append(f"P={page_size}: data bytes of finite tiles differ")
        if not torch.equal(ours_scale[~bad_tiles], ref_scale[~bad_tiles]):
            problems.append(f"P={page_size}: scale bytes of finite tiles differ")
        outside = torch.ones(num_pages, spec.page_bytes(page_size), dtype=torch.uint8)
        scatter_rows(
            spec, outside, loc, page_size, torch.zeros_like(ours_data), torch.zeros_like(ours_scale)
        )
        if not torch.equal(ours[outside.bool()], expected[outside.bool()]):
            problems.append(f"P={page_size}: padding differs")
    kind = "finite"
    if non_finite:
        kind = f"finite tiles ({excluded} NaN/inf tiles follow the CUDA store)"
    return fail_or_pass(problems, f"whole pages byte-identical to the torch reference, {kind}")


for _spec in (V41, V41_NEW, V41_FP4, V41_FP4_NEW):
    for _non_finite in (False, True):

        def _make(spec: LayoutSpec = _spec, non_finite: bool = _non_finite) -> Result:
            return _v41_reference_store(spec, non_finite=non_finite)

        _make.__name__ = f"{_spec.name}_store_torch_reference" + (
            "_non_finite" if _non_finite else ""
        )
        check(
            _spec,
            code="`dsv41_kv_quant_reference` quantizers (V41, V41_FP4, both `_NEW` via "
            "`interleave_pages`)",
            compared="whole pages, P = 2, 4, 64; with NaN/inf, the finite tiles",
        )(_make)


def _exhaustive_v41_tokens(
    spec: LayoutSpec, page_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens covering every data byte against every scale byte."""
    tiles = spec.scale_bytes
    n = -(-256 // tiles) * 2
    g = torch.Generator().manual_seed(13)
    data = (torch.arange(spec.data_bytes).repeat(n, 1) + torch.arange(n)[:, None] * 7) % 256
    scales = (torch.arange(n)[:, None] * tiles + torch.arange(tiles)[None, :]) % 256
    data, scales = data.to(torch.uint8), scales.to(torch.uint8)
    buf = torch.zeros(-(-n // page_size), spec.page_bytes(page_size), dtype=torch.uint8)
    loc = torch.randperm(n, generator=g)
    scatter_rows(spec, buf, loc, page_size, data, scales)
    return buf, loc, data, scales


def _v41_dequant_vs_triton(spec: LayoutSpec) -> Result:
    fp4 = spec.data_encoding.value == "e2m1x2"
    page_size = 4
    buf, loc, data, scales = _exhaustive_v41_tokens(spec, page_size)
    n = loc.numel()
    ours = dequantize(spec, buf, loc, page_size)
    theirs = torch.empty(n, 1, 512, dtype=torch.bfloat16)
    kernel = sglang_code(*(places.V41_FP4_READER_KERNEL if fp4 else places.V41_FP8_READER_KERNEL))
    data_stride, scale_base, scale_stride = spec.row_addressing(page_size)
    addressing = {
        "DATA_STRIDE": data_stride, "SCALE_BASE": scale_base, "SCALE_STRIDE": scale_stride
    }  # fmt: skip
    if "S_OFFSET_BYTES" in inspect.signature(kernel.fn).parameters:
        # 0.5.21-0.5.22: block-split pages only, addressed by where the scale rows start.
        require(not spec.interleaved, f"{kernel.fn.__name__} over interleaved pages")
        addressing = {"S_OFFSET_BYTES": scale_base}
    kernel[(n,)](
        theirs,
        buf.view(torch.float8_e4m3fn).reshape(-1),
        buf.reshape(-1),
        loc,
        theirs.stride(0),
        BYTES_PER_PAGE=buf.shape[1],
        PAGE_SIZE=page_size,
        DATA_BYTES=spec.data_bytes,
        SCALE_BYTES=spec.scale_bytes,
        TILE_SIZE=spec.tile_size,
        **addressing,
        IS_HIP=False,
    )
    theirs = theirs.reshape(n, 512)
    equal = nan_aware_equal(ours, theirs)
    scale_per_value = scales.repeat_interleave(spec.tile_size, dim=1)
    product = ours.float()
    blind = (product != 0) & (product.abs() < 2.0**-126)
    if fp4:
        blind |= (scale_per_value & 0x7F) == 0x7F  # e4m3 NaN scale, read as 480
    else:
        blind |= ((data & 0x7F) == 0x7F) | (scale_per_value < 8)
    wrong = ~equal & ~blind
    detail = (
        f"{equal.numel()} values (every data byte x every scale byte): "
        f"{int((~blind).sum())} exact, {int(blind.sum())} in interpreter blind spots"
    )
    if wrong.any():
        return "fail", f"{int(wrong.sum())} mismatches; {detail}"
    return "pass", detail


for _spec in (V41, V41_NEW, V41_FP4, V41_FP4_NEW):

    def _make_dq(spec: LayoutSpec = _spec) -> Result:
        return _v41_dequant_vs_triton(spec)

    _make_dq.__name__ = f"{_spec.name}_dequant_triton"
    check(
        _spec,
        code="`_dequantize_k_cache_paged_v41_fp8/fp4_kernel` (called directly: the wrapper "
        "refuses below SM100)",
        compared="every data byte x every scale byte, block-split and interleaved",
        result="exact outside blind spots",
    )(_make_dq)


def _v41_dequant_vs_reference(spec: LayoutSpec) -> Result:
    ref = _v41_reference()

    fp4 = spec.data_encoding.value == "e2m1x2"
    page_size = 4
    buf, _, _, _ = _exhaustive_v41_tokens(spec, page_size)
    num_pages = buf.shape[0]
    loc = torch.arange(num_pages * page_size)
    ours = dequantize(spec, buf, loc, page_size)
    pages = buf
    if spec.interleaved:
        deinterleave = _reference_part(ref, "deinterleave_pages")
        pages = deinterleave(buf, page_size, spec.data_bytes, spec.scale_bytes)
    read = _reference_part(ref, "dequantize_k_cache_v41_fp4" if fp4 else "dequantize_k_cache_v41")
    theirs = read(pages, page_size).reshape(-1, 512)
    equal = nan_aware_equal(ours, theirs)
    if not equal.all():
        return "fail", f"{int((~equal).sum())} of {equal.numel()} values differ"
    return "pass", f"{equal.numel()} values exact (every data byte x every scale byte)"


for _spec in (V41, V41_NEW, V41_FP4, V41_FP4_NEW):

    def _make_ref(spec: LayoutSpec = _spec) -> Result:
        return _v41_dequant_vs_reference(spec)

    _make_ref.__name__ = f"{_spec.name}_dequant_torch_reference"
    check(
        _spec,
        code="`dsv41_kv_quant_reference` dequantizers",
        compared="every data byte x every scale byte",
    )(_make_ref)
