"""Compare kvcompat.layouts with SGLang 0.5.23's own layout code, on CPU.

Run as a script in a fresh process with ``TRITON_INTERPRET=1`` (set before triton is
imported) and SGLang's caches pointed at a temporary folder; ``test_layouts_oracles.py``
does that. Each check prints one JSON line ``{"check", "status", "detail"}`` with status
``pass``, ``fail`` or ``skip``; the exit code is 0 unless the script itself breaks.
Importing this module (to read :data:`CHECKS`) imports neither sglang nor triton.

What is compared byte for byte, and what cannot be (see also docs/layouts/oracles.md):

* Pure-torch SGLang code is compared exactly: the V4.1 reference quantizers and
  dequantizers (``dsv41_kv_quant_reference``, non-finite inputs included), the V4 torch
  reader (``k_cache_reference``; it flushes scale byte 0 to zero where the kernel uses
  ``2**-127``), ``DeepSeekV4UniformFP8KVPool.set_key_buffer_fused``, and the MHA and MLA
  pools' ``set_kv_buffer`` / ``set_mla_kv_buffer`` writes.
* Triton kernels run under the CPU interpreter, which differs from a GPU in three known
  ways: it rounds fp32 -> fp8 half away from zero instead of to even, it converts fp32 ->
  bf16 by truncation and mishandles fp32 subnormal inputs there, and it decodes the e4m3
  NaN codes 0x7F/0xFF as +-480. So: stores that only move bytes (``SetKAndS``) compare
  exactly; quantizing stores compare their scales exactly and their codes against the
  interpreter's own rounding of kvcompat's fp32 pre-rounding values (and kvcompat's
  codes against true round-to-nearest-even of the same values); readers compare exactly
  wherever none of those three cases applies, and the excluded positions are counted.
* Not runnable on CPU: the CUDA JIT stores (V4 ``fused_store_flashmla_cache`` and the
  V4.1 ``store_row_fp8`` / ``store_row_fp4``), which need nvcc and a GPU; their math is
  covered by the torch references and the HIP Triton store above.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

if __name__ == "__main__":  # run as a script: make the repository and tests/ importable
    _ROOT = Path(__file__).resolve().parents[3]
    for _path in (_ROOT, _ROOT / "tests"):
        if str(_path) not in sys.path:
            sys.path.insert(0, str(_path))

from kvcompat.layouts import (
    DSA_FP8,
    DSV4_INDEXER_FP4,
    DSV4_INDEXER_FP4_RNE,
    DSV4_INDEXER_FP8,
    UNIFORM_FP8,
    V4,
    V41,
    V41_FP4,
    V41_FP4_NEW,
    V41_NEW,
    LayoutSpec,
    dequantize,
    get_layout,
    mha_layout,
    mla_layout,
    quantize,
)
from kvcompat.layouts._addressing import gather_rows, scatter_rows

Result = tuple[str, str]
CHECKS: dict[str, Callable[[], Result]] = {}


def check(fn: Callable[[], Result]) -> Callable[[], Result]:
    CHECKS[fn.__name__] = fn
    return fn


# ---------------------------------------------------------------------------- helpers


def tile_values(
    n: int,
    dim: int,
    tile: int,
    seed: int,
    dtype: torch.dtype,
    exponents: tuple[int, int] = (-24, 14),
) -> torch.Tensor:
    """Values whose tiles span many magnitudes, with zeros, ties and exact powers of two."""
    g = torch.Generator().manual_seed(seed)
    tiles = -(-dim // tile)
    mags = torch.exp2(torch.randint(*exponents, (n, tiles, 1), generator=g).float())
    x = torch.randn(n, tiles, tile, generator=g) * mags
    x = x.reshape(n, tiles * tile)[:, :dim].contiguous()
    x[0, :tile] = 0.0  # an all-zero tile
    x[1, :tile] = -0.0
    x[2, :tile] = torch.arange(tile).float() * 0.5 - 3.0  # many exact e4m3/e2m1 ties
    x[3, :tile] = 448.0 * 2.0 ** torch.randint(-8, 4, (tile,), generator=g).float()
    x[4, :tile] = 1e-6  # below the 1e-4 floor
    return x.to(dtype)


def nan_aware_equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: same bits, or both NaN (NaN payloads differ between torch paths)."""
    same = a.view(torch.int16) == b.view(torch.int16)
    return same | (torch.isnan(a.float()) & torch.isnan(b.float()))


def interp_round(y: torch.Tensor, *, fnuz: bool = False) -> torch.Tensor:
    """The Triton interpreter's fp32 -> e4m3 conversion of ``y`` (its RTNE mode)."""
    import triton.language as tl
    from triton._C.libtriton import ir
    from triton.runtime.interpreter import _convert_float

    target = tl.float8e4b8 if fnuz else tl.float8e4nv
    out = _convert_float(y.contiguous().numpy(), tl.float32, target, ir.ROUNDING_MODE.RTNE)
    return torch.from_numpy(out.view("uint8").reshape(y.shape).copy())


def fail_or_pass(problems: list[str], detail: str) -> Result:
    return ("fail", "; ".join(problems)) if problems else ("pass", detail)


def _pages_for(spec: LayoutSpec, page_size: int, num_pages: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (num_pages, spec.page_bytes(page_size)), generator=g).to(
        torch.uint8
    )


# ------------------------------------------------------------------- geometry checks


@check
def layout_geometry() -> Result:
    from sglang.kernels.ops.attention.dsv4.kv_layout import KVLayout

    problems = []
    for member in KVLayout:
        spec = get_layout(member)
        for attr, ours in (
            ("data_bytes", spec.data_bytes),
            ("scale_bytes", spec.scale_bytes),
            ("tile_size", spec.tile_size),
            ("bytes_per_token", spec.bytes_per_token),
            ("page_align", spec.page_align),
            ("is_interleaved", spec.interleaved),
        ):
            if getattr(member, attr) != ours:
                problems.append(f"{member.value}.{attr}: {getattr(member, attr)} != {ours}")
        for page_size in (1, 2, 4, 64, 128, 256, 512):
            if member.page_bytes(page_size) != spec.page_bytes(page_size):
                problems.append(f"{member.value}.page_bytes({page_size})")
            if member.row_addressing(page_size) != spec.row_addressing(page_size):
                problems.append(f"{member.value}.row_addressing({page_size})")
    return fail_or_pass(problems, f"{len(KVLayout)} KVLayout members, 7 page sizes")


@check
def dsv4_pool_buffers() -> Result:
    from _sglang.env import prepare_sglang

    session = prepare_sglang()
    module = session.deepseek_v4_memory_pool
    kv_layout = session.kv_layout.KVLayout
    problems, seen = [], []
    for member in (KVLayout_ for KVLayout_ in kv_layout if KVLayout_.value != "uniform_fp8"):
        for page_size in (2, 64, 256):
            pool = module.DeepSeekV4SingleKVPool(
                size=page_size * 2,
                page_size=page_size,
                dtype=torch.float8_e4m3fn,
                qk_nope_head_dim=448,
                qk_rope_head_dim=64,
                layer_num=1,
                device="cpu",
                enable_memory_saver=False,
                kv_layout=member,
            )
            buf = pool.kv_buffer[0]
            spec = get_layout(pool.kv_layout)
            if buf.shape[1] != spec.page_bytes(page_size) or buf.dtype != torch.uint8:
                problems.append(f"{member.value} P={page_size}: {tuple(buf.shape)} {buf.dtype}")
            seen.append(f"{member.value}/{page_size}")
    pool = module.DeepSeekV4UniformFP8KVPool(
        size=128,
        page_size=64,
        dtype=torch.float8_e4m3fn,
        qk_nope_head_dim=448,
        qk_rope_head_dim=64,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    buf = pool.kv_buffer[0]
    if buf.shape[1] != UNIFORM_FP8.page_bytes(64):
        problems.append(f"uniform_fp8: {tuple(buf.shape)}")
    return fail_or_pass(problems, f"buffers of {len(seen) + 1} pools match page_bytes")


# ------------------------------------------------------------------------- V4 checks


def _exhaustive_v4_tokens(page_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens whose nope codes cover all 256 bytes and whose 7 scales cover all 256 bytes."""
    n = 2 * 37  # 37 tokens x 7 tiles >= 256 scale bytes, twice for two code offsets
    codes = (torch.arange(448).repeat(n, 1) + torch.arange(n)[:, None] * 13) % 256
    g = torch.Generator().manual_seed(7)
    rope = torch.randint(0, 256, (n, 128), generator=g).to(torch.uint8)
    data = torch.cat((codes.to(torch.uint8), rope), dim=1)
    scales = ((torch.arange(n)[:, None] * 7 + torch.arange(7)[None, :]) % 256).to(torch.uint8)
    buf = torch.zeros(-(-n // page_size), V4.page_bytes(page_size), dtype=torch.uint8)
    loc = torch.randperm(n, generator=g)
    scatter_rows(V4, buf, loc, page_size, data, scales)
    # Row i of a read at ``loc`` is token i of ``data`` (scatter_rows wrote row i at loc[i]).
    return buf, loc, torch.cat((codes, scales.repeat_interleave(64, dim=1)), dim=1)


def _interpreter_blind_spots(
    codes_and_scales: torch.Tensor, ours: torch.Tensor, *, fnuz: bool
) -> torch.Tensor:
    """Positions where the interpreter cannot match a GPU (NaN codes, fp32 subnormals)."""
    codes, scale_bytes = codes_and_scales[:, :448], codes_and_scales[:, 448:]
    nan_code = (codes == 0x80) if fnuz else ((codes & 0x7F) == 0x7F)
    product = ours[:, :448].float()
    tiny = (product != 0) & (product.abs() < 2.0**-126)
    tiny |= scale_bytes < 8  # 2**(b - 127) itself is subnormal or nearly so
    blind = torch.zeros_like(ours, dtype=torch.bool)
    blind[:, :448] = nan_code | tiny
    return blind


def _v4_dequant_vs_triton(*, fnuz: bool) -> Result:
    from sglang.kernels.ops.attention.dsv4 import dequant_k_cache as dq

    page_size = 4
    buf, loc, codes_and_scales = _exhaustive_v4_tokens(page_size)
    ours = dequantize(V4, buf, loc, page_size, fnuz=fnuz)
    if fnuz:
        n = loc.numel()
        theirs = torch.empty(n, 1, 512, dtype=torch.bfloat16)
        dq._dequantize_k_cache_paged_kernel[(-(-n // 4),)](
            theirs,
            buf.view(torch.float8_e4m3fnuz).reshape(-1),
            buf.view(torch.bfloat16).reshape(-1),
            buf.reshape(-1),
            loc,
            theirs.stride(0),
            n,
            BYTES_PER_PAGE=buf.shape[1],
            PAGE_SIZE=page_size,
            DIM_NOPE=448,
            DIM_ROPE=64,
            TILE_SIZE=64,
            NUM_SCALE_TILES=7,
            NOPE_ROPE_BYTES=576,
            PADDED_SCALE_PER_TOKEN=8,
            S_OFFSET_BYTES=page_size * 576,
            TOKENS_PER_PROG=4,
        )
    else:
        theirs = dq.dequantize_k_cache_paged_dsv4(buf, loc, page_size)
    theirs = theirs.reshape(-1, 512)
    equal = nan_aware_equal(ours, theirs)
    blind = _interpreter_blind_spots(codes_and_scales, ours, fnuz=fnuz)
    wrong = ~equal & ~blind
    detail = (
        f"{equal.numel()} values (all 256 codes x all 256 scale bytes, rope copied): "
        f"{int((~blind).sum())} compared exactly, {int(blind.sum())} in interpreter blind "
        f"spots ({int((~equal & blind).sum())} of them differ)"
    )
    if wrong.any():
        r, c = (int(v) for v in wrong.nonzero()[0])
        return "fail", f"{int(wrong.sum())} mismatches, first at token {r} col {c}: {detail}"
    return "pass", detail


@check
def v4_dequant_triton() -> Result:
    return _v4_dequant_vs_triton(fnuz=False)


@check
def v4_fnuz_dequant_triton() -> Result:
    return _v4_dequant_vs_triton(fnuz=True)


@check
def v4_dequant_torch_reference() -> Result:
    from sglang.test.kernels.deepseek_v4 import k_cache_reference as ref

    page_size = 4
    buf, loc, _ = _exhaustive_v4_tokens(page_size)
    ours = dequantize(V4, buf, loc, page_size)
    theirs = ref.dequantize_k_cache_paged_ref(buf, loc, page_size).reshape(-1, 512)
    equal = nan_aware_equal(ours, theirs)
    detail = f"{equal.numel()} values exact, scale byte 0 read as 0 by both"
    return fail_or_pass([f"{int((~equal).sum())} mismatches"] if (~equal).any() else [], detail)


@check
def v4_pack_store_triton() -> Result:
    from sglang.kernels.ops.kvcache.dsv4_main_kv_store import (
        NopeFp8RopeBf16Pack,
        _set_k_and_s_triton,
    )

    problems = []
    for page_size in (2, 4, 64):
        n = 12
        values = tile_values(n, 512, 64, seed=page_size, dtype=torch.bfloat16)
        data, scale = V4.codec.encode(V4, values, fnuz=False)
        pack = NopeFp8RopeBf16Pack(
            k_nope_fp8=data[:, :448].contiguous().view(torch.float8_e4m3fn),
            k_rope_bf16=data[:, 448:].contiguous().view(torch.bfloat16),
            scale_k_nope_ue8m0=scale.contiguous(),
        )
        before = _pages_for(V4, page_size, 3 * 64 // page_size + 1, seed=3)
        g = torch.Generator().manual_seed(page_size)
        loc = torch.randperm(before.shape[0] * page_size, generator=g)[:n]
        theirs, ours = before.clone(), before.clone()
        _set_k_and_s_triton(theirs, loc, pack, page_size)
        quantize(V4, values, ours, loc, page_size)
        if not torch.equal(ours, theirs):
            problems.append(f"P={page_size}: {int((ours != theirs).sum())} bytes differ")
    return fail_or_pass(problems, "SetKAndS and kvcompat write identical pages (P=2,4,64)")


def _v4_store_vs_hip_triton(*, fnuz: bool) -> Result:
    from sglang.kernels.ops.kvcache import triton_store_cache as hip

    page_size, n = 4, 16
    # Tile maxima >= 448 * 1e-4, so the CUDA (1e-4) and HIP (1e-8) floors never apply.
    values = tile_values(n, 512, 64, seed=11, dtype=torch.bfloat16, exponents=(-3, 12))
    values[:5, :64] = values[5:10, :64]  # drop the special tiles (zeros, tiny values)
    before = _pages_for(V4, page_size, 6, seed=5)
    loc = torch.randperm(before.shape[0] * page_size, generator=torch.Generator().manual_seed(2))
    loc = loc[:n]
    theirs, ours = before.clone(), before.clone()
    limit = 240.0 if fnuz else 448.0
    hip._triton_fused_store_flashmla_kernel[(n, 8)](
        values,
        theirs.view(torch.float8_e4m3fnuz if fnuz else torch.float8_e4m3fn),
        theirs.view(torch.bfloat16),
        theirs,
        loc.to(torch.int32),
        n,
        PAGE_SIZE=page_size,
        BYTES_PER_PAGE=theirs.shape[1],
        BYTES_PER_PAGE_BF16=theirs.shape[1] // 2,
        S_OFFSET=page_size * 576,
        TILE_SIZE=64,
        HEAD_DIM=512,
        NOPE_DIM=448,
        SLOT_BYTES=576,
        BF16_SLOT_ELEMS=288,
        BF16_ROPE_OFFSET=224,
        SCALES_PER_TOKEN=8,
        ROPE_TILE_ID=7,
        UE8M0_BIAS=127,
        FP8_MIN=-limit,
        FP8_MAX=limit,
        EPS=1e-8,
    )
    quantize(V4, values, ours, loc, page_size, fnuz=fnuz)
    # Scale bytes and rope bytes: exact. Codes: the interpreter's rounding of the fp32
    # values x * 2**-c that kvcompat computed (c from kvcompat's scale byte), and
    # kvcompat's codes against round-to-nearest-even of the same values.
    pages, slots = loc // page_size, loc % page_size
    data_at = pages[:, None] * theirs.shape[1] + slots[:, None] * 576 + torch.arange(576)
    scale_at = pages[:, None] * theirs.shape[1] + page_size * 576 + slots[:, None] * 8
    scale_at = scale_at + torch.arange(8)
    flat_ours, flat_theirs = ours.reshape(-1), theirs.reshape(-1)
    problems = []
    if not torch.equal(flat_ours[scale_at], flat_theirs[scale_at]):
        problems.append("scale bytes differ")
    if not torch.equal(flat_ours[data_at[:, 448:]], flat_theirs[data_at[:, 448:]]):
        problems.append("rope bytes differ")
    exponent = flat_ours[scale_at[:, :7]].to(torch.int32) - 127
    inverse = torch.exp2(-exponent.float()).repeat_interleave(64, dim=1)
    scaled = (values[:, :448].float() * inverse).clamp(-limit, limit)
    dtype = torch.float8_e4m3fnuz if fnuz else torch.float8_e4m3fn
    if not torch.equal(flat_theirs[data_at[:, :448]], interp_round(scaled, fnuz=fnuz)):
        problems.append("SGLang's codes are not the interpreter's rounding of kvcompat's values")
    rne = scaled.to(dtype).view(torch.uint8)
    if not torch.equal(flat_ours[data_at[:, :448]], rne):
        problems.append("kvcompat's codes are not RNE of its values")
    untouched = torch.ones_like(flat_ours, dtype=torch.bool)
    untouched[data_at.reshape(-1)] = False
    untouched[scale_at[:, :7].reshape(-1)] = False
    if not torch.equal(flat_ours[untouched], flat_theirs[untouched]):
        problems.append("bytes outside the written tokens differ")
    ties = int((flat_ours[data_at[:, :448]] != flat_theirs[data_at[:, :448]]).sum())
    flavour = "e4m3fnuz, max 240" if fnuz else "e4m3fn, max 448 (vs kvcompat's CUDA flavour)"
    return fail_or_pass(problems, f"{flavour}: scales and rope exact, {ties} tie codes differ")


@check
def v4_hip_store_triton_e4m3fn() -> Result:
    return _v4_store_vs_hip_triton(fnuz=False)


@check
def v4_fnuz_hip_store_triton() -> Result:
    return _v4_store_vs_hip_triton(fnuz=True)


# ----------------------------------------------------------------------- V4.1 checks


def _v41_reference_store(spec: LayoutSpec, *, non_finite: bool) -> Result:
    """Whole pages against the torch reference; with NaN/inf, the tiles holding them are
    excluded: there kvcompat follows the CUDA store (verified on an H200), which does not
    poison the tile the way the reference does."""
    from sglang.test.kernels.deepseek_v4 import dsv41_kv_quant_reference as ref

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
        quant = ref.quantize_k_cache_v41_fp4 if fp4 else ref.quantize_k_cache_v41
        expected = quant(values.view(num_pages, page_size, 512), spec.page_bytes(page_size))
        if spec.interleaved:
            expected = ref.interleave_pages(expected, page_size, spec.data_bytes, spec.scale_bytes)
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
        check(_make)


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
    from sglang.kernels.ops.attention.dsv4 import dequant_k_cache as dq

    fp4 = spec.data_encoding.value == "e2m1x2"
    page_size = 4
    buf, loc, data, scales = _exhaustive_v41_tokens(spec, page_size)
    n = loc.numel()
    ours = dequantize(spec, buf, loc, page_size)
    theirs = torch.empty(n, 1, 512, dtype=torch.bfloat16)
    kernel = (
        dq._dequantize_k_cache_paged_v41_fp4_kernel
        if fp4
        else dq._dequantize_k_cache_paged_v41_fp8_kernel
    )
    data_stride, scale_base, scale_stride = spec.row_addressing(page_size)
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
        DATA_STRIDE=data_stride,
        SCALE_BASE=scale_base,
        SCALE_STRIDE=scale_stride,
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
    check(_make_dq)


def _v41_dequant_vs_reference(spec: LayoutSpec) -> Result:
    from sglang.test.kernels.deepseek_v4 import dsv41_kv_quant_reference as ref

    fp4 = spec.data_encoding.value == "e2m1x2"
    page_size = 4
    buf, _, _, _ = _exhaustive_v41_tokens(spec, page_size)
    num_pages = buf.shape[0]
    loc = torch.arange(num_pages * page_size)
    ours = dequantize(spec, buf, loc, page_size)
    pages = buf
    if spec.interleaved:
        pages = ref.deinterleave_pages(buf, page_size, spec.data_bytes, spec.scale_bytes)
    read = ref.dequantize_k_cache_v41_fp4 if fp4 else ref.dequantize_k_cache_v41
    theirs = read(pages, page_size).reshape(-1, 512)
    equal = nan_aware_equal(ours, theirs)
    if not equal.all():
        return "fail", f"{int((~equal).sum())} of {equal.numel()} values differ"
    return "pass", f"{equal.numel()} values exact (every data byte x every scale byte)"


for _spec in (V41, V41_NEW, V41_FP4, V41_FP4_NEW):

    def _make_ref(spec: LayoutSpec = _spec) -> Result:
        return _v41_dequant_vs_reference(spec)

    _make_ref.__name__ = f"{_spec.name}_dequant_torch_reference"
    check(_make_ref)


# ---------------------------------------------------------------- uniform-fp8 checks


@check
def uniform_fp8_pool_store() -> Result:
    from _sglang.env import prepare_sglang

    module = prepare_sglang().deepseek_v4_memory_pool
    page_size, n = 4, 10
    pool = module.DeepSeekV4UniformFP8KVPool(
        size=32,
        page_size=page_size,
        dtype=torch.float8_e4m3fn,
        qk_nope_head_dim=448,
        qk_rope_head_dim=64,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    problems = []
    for dtype in (torch.bfloat16, torch.float32):
        values = tile_values(n, 512, 64, seed=21, dtype=dtype)
        values[5, :4] = torch.tensor([500.0, -470.0, float("nan"), float("inf")]).to(dtype)
        start = _pages_for(UNIFORM_FP8, page_size, pool.kv_buffer[0].shape[0], seed=8)
        pool.kv_buffer[0].view(torch.uint8).copy_(start)
        ours = start.clone().view(torch.float8_e4m3fn)
        loc = torch.randperm(start.shape[0] * page_size, generator=torch.Generator().manual_seed(1))
        loc = loc[:n]
        pool.set_key_buffer_fused(0, loc, values)
        quantize(UNIFORM_FP8, values, ours, loc, page_size, check_finite=False)
        if not torch.equal(ours.view(torch.uint8), pool.kv_buffer[0].view(torch.uint8)):
            problems.append(f"{dtype}: bytes differ")
        read = dequantize(UNIFORM_FP8, pool.kv_buffer[0], loc, page_size)
        native = pool.get_key_buffer(0).view(-1, 512)[loc].to(torch.float32)
        if not nan_aware_equal(read, native.to(torch.bfloat16)).all():
            problems.append(f"{dtype}: read differs from the pool's fp8 rows")
    return fail_or_pass(problems, "set_key_buffer_fused bytes identical (bf16, fp32; >448, NaN)")


# ------------------------------------------------------------------------ DSA checks


def _dsa_scaled(values: torch.Tensor, scale: torch.Tensor, *, nan_to: float) -> torch.Tensor:
    """``clamp(x * (1 / s))`` in fp32 for stored scales ``s``; a NaN becomes ``nan_to``."""
    n = values.shape[0]
    nope = values[:, :512].float().reshape(n, 4, 128)
    scaled = nope * (torch.ones_like(scale) / scale).unsqueeze(-1)
    return torch.where(torch.isnan(scaled), nan_to, scaled.clamp(-448, 448)).reshape(n, 512)


def _dsa_scales(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(IEEE ``amax / 448`` as the interpreter divides, ``amax * fl(1/448)`` as a GPU does)."""
    amax = values[:, :512].float().reshape(-1, 4, 128).abs().amax(-1)
    return amax / torch.full_like(amax, 448.0), amax * torch.full_like(amax, 1.0 / 448.0)


@check
def dsa_quantize_triton() -> Result:
    """The interpreter divides exactly (IEEE) and clamps NaN to -448; on an NVIDIA GPU the
    kernel multiplies by fl(1/448) and clamps NaN to +448, which kvcompat follows (checked
    byte for byte on an H200). So: SGLang's bytes against the interpreter's arithmetic,
    kvcompat's against the GPU's, both on the same inputs."""
    from sglang.kernels.ops.quantization.dsa_quant_k_cache import quantize_k_cache_separate

    n = 24
    values = tile_values(n, 576, 128, seed=31, dtype=torch.bfloat16)
    nope_part, rope_part = quantize_k_cache_separate(values[:, :512], values[:, 512:])
    theirs = torch.cat((nope_part.squeeze(1), rope_part.squeeze(1)), dim=1)
    ours, _ = DSA_FP8.codec.encode(DSA_FP8, values, fnuz=False)
    ieee, gpu = _dsa_scales(values)
    problems = []
    if not torch.equal(
        theirs[:, 512:528].contiguous().view(torch.float32).view(torch.int32),
        ieee.view(torch.int32),
    ):
        problems.append("SGLang's scales are not the IEEE quotient")
    if not torch.equal(
        ours[:, 512:528].contiguous().view(torch.float32).view(torch.int32), gpu.view(torch.int32)
    ):
        problems.append("kvcompat's scales are not amax * fl(1/448)")
    if not torch.equal(ours[:, 528:], theirs[:, 528:]):
        problems.append("rope bytes differ")
    if not torch.equal(theirs[:, :512], interp_round(_dsa_scaled(values, ieee, nan_to=-448.0))):
        problems.append("SGLang's codes are not the interpreter's rounding of x / s")
    expected = _dsa_scaled(values, gpu, nan_to=448.0).to(torch.float8_e4m3fn).view(torch.uint8)
    if not torch.equal(ours[:, :512], expected):
        problems.append("kvcompat's codes are not RNE of x * (1 / s)")
    if not bool((theirs[0, :128] == 0xFE).all()) or not bool((ours[0, :128] == 0x7E).all()):
        problems.append("zero tile: expected -448 under the interpreter, +448 in kvcompat")
    differ = int((ieee != gpu).sum())
    return fail_or_pass(
        problems,
        f"same arithmetic; {differ} of {ieee.numel()} scales differ "
        "in the last bit between IEEE and the GPU's reciprocal",
    )


@check
def dsa_pool_store() -> Result:
    from _sglang.builders import radix_layer
    from _sglang.env import prepare_sglang

    module = prepare_sglang().memory_pool
    pool = module.DSATokenToKVPool(
        size=128,
        page_size=64,
        kv_lora_rank=512,
        dtype=torch.float8_e4m3fn,
        qk_rope_head_dim=64,
        layer_num=1,
        device="cpu",
        index_head_dim=128,
        enable_memory_saver=False,
        kv_cache_dim=656,
    )
    if not pool.dsa_kv_cache_store_fp8:
        return "fail", "the pool did not select fp8 DSA storage"
    buf = pool.kv_buffer[0]
    start = torch.randint(0, 256, buf.shape, generator=torch.Generator().manual_seed(4))
    buf.view(torch.uint8).copy_(start.to(torch.uint8))
    ours = buf.clone()
    n = 12
    values = tile_values(n, 576, 128, seed=41, dtype=torch.bfloat16)
    # Slot 0 is skipped by SGLang's MLA scatter (reserved for CUDA-graph padding).
    loc = 1 + torch.randperm(buf.shape[0] - 1, generator=torch.Generator().manual_seed(5))[:n]

    pool.set_mla_kv_buffer(radix_layer(0), loc, values[:, None, :512], values[:, None, 512:])
    quantize(DSA_FP8, values, ours, loc, 64)
    ours_rows = ours.view(torch.uint8).reshape(buf.shape[0], 656)
    theirs_rows = buf.view(torch.uint8).reshape(buf.shape[0], 656)
    ieee, _ = _dsa_scales(values)
    problems = []
    if not torch.equal(ours_rows[loc, 528:], theirs_rows[loc, 528:]):
        problems.append("rope bytes differ")
    if not torch.equal(theirs_rows[loc, 512:528].contiguous().view(torch.float32), ieee):
        problems.append("the pool's scales are not the (interpreter's) IEEE quotient")
    untouched = torch.ones(buf.shape[0], dtype=torch.bool)
    untouched[loc] = False
    if not torch.equal(ours_rows[untouched], theirs_rows[untouched]):
        problems.append("bytes of unwritten rows differ")
    expected = interp_round(_dsa_scaled(values, ieee, nan_to=-448.0))
    if not torch.equal(theirs_rows[loc, :512], expected):
        problems.append("the pool's codes are not the interpreter's rounding of x / s")
    return fail_or_pass(
        problems,
        "rows written through DSATokenToKVPool.set_mla_kv_buffer: "
        "placement, rope and arithmetic identical",
    )


@check
def dsa_dequant_triton() -> Result:
    from sglang.kernels.ops.attention.dsa.dequant_k_cache import dequantize_k_cache_paged_dsa

    rows = 40
    g = torch.Generator().manual_seed(6)
    values = tile_values(rows, 576, 128, seed=51, dtype=torch.bfloat16)
    buf = torch.zeros(rows, 1, 656, dtype=torch.uint8)
    quantize(DSA_FP8, values, buf, torch.arange(rows), 1)
    loc = torch.randint(0, rows, (64,), generator=g)
    ours = dequantize(DSA_FP8, buf, loc, 1)
    theirs = dequantize_k_cache_paged_dsa(buf.view(torch.float8_e4m3fn), loc).reshape(-1, 576)
    # The interpreter truncates fp32 -> bf16; compare against truncation of the fp32
    # product, and kvcompat's output against round-to-nearest-even of the same product.
    row = buf.reshape(rows, 656)[loc]
    codes = row[:, :512].contiguous().view(torch.float8_e4m3fn).float().reshape(-1, 4, 128)
    scale = row[:, 512:528].contiguous().view(torch.float32)
    product = (codes * scale.unsqueeze(-1)).reshape(-1, 512)
    truncated = (product.view(torch.int32) >> 16).to(torch.int16)
    problems = []
    normal = product.abs() >= 2.0**-126
    if not torch.equal(theirs[:, :512].view(torch.int16)[normal], truncated[normal]):
        problems.append("SGLang's nope is not the truncated fp32 product")
    if not torch.equal(
        ours[:, :512].view(torch.int16), product.to(torch.bfloat16).view(torch.int16)
    ):
        problems.append("kvcompat's nope is not the RNE fp32 product")
    if not torch.equal(ours[:, 512:].view(torch.int16), theirs[:, 512:].view(torch.int16)):
        problems.append("rope differs")
    return fail_or_pass(problems, "same fp32 products and rope (interpreter truncates to bf16)")


# ------------------------------------------------------------------- MHA/MLA checks


@check
def mha_pool_store() -> Result:
    from _sglang.builders import build_mha_pool, radix_layer

    problems = []
    for dtype in (
        torch.bfloat16,
        torch.float16,
        torch.float32,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
    ):
        pool = build_mha_pool(dtype=dtype, layer_num=1, size=64, page_size=16)  # 2 x 8 heads
        spec = mha_layout(2, 8, dtype)
        k_ours = pool.k_buffer[0].clone()
        g = torch.Generator().manual_seed(9)
        loc = torch.randperm(80, generator=g)[:20]
        k = torch.randn(20, 2, 8, generator=g) * 3
        v = torch.randn(20, 2, 8, generator=g)

        pool.set_kv_buffer(radix_layer(0), loc, k, v)
        quantize(spec, k, k_ours, loc, 16)
        if not torch.equal(k_ours.view(torch.uint8), pool.k_buffer[0].view(torch.uint8)):
            problems.append(f"{dtype}: k bytes differ")
        read = dequantize(spec, pool.k_buffer[0], loc, 16)
        native = pool.get_key_buffer(0)[loc].reshape(20, 16)
        if not torch.equal(read.view(torch.uint8), native.contiguous().view(torch.uint8)):
            problems.append(f"{dtype}: read differs from get_key_buffer")
    return fail_or_pass(problems, "set_kv_buffer K rows identical for bf16/fp16/fp32/e4m3/e5m2")


@check
def mla_pool_store() -> Result:
    from _sglang.builders import build_mla_pool, radix_layer

    problems = []
    for dtype in (torch.bfloat16, torch.float8_e4m3fn):
        pool = build_mla_pool(dtype=dtype, layer_num=1)  # 64 tokens, page 16, rank 32 + rope 16
        spec = mla_layout(32, 16, dtype)
        ours = pool.kv_buffer[0].clone()
        g = torch.Generator().manual_seed(10)
        loc = 1 + torch.randperm(79, generator=g)[:20]  # slot 0 is skipped by SGLang
        rows = torch.randn(20, 1, 48, generator=g).to(torch.bfloat16)

        pool.set_mla_kv_buffer(radix_layer(0), loc, rows[..., :32], rows[..., 32:])
        quantize(spec, rows, ours, loc, 16)
        if not torch.equal(ours.view(torch.uint8), pool.kv_buffer[0].view(torch.uint8)):
            problems.append(f"{dtype}: set_mla_kv_buffer bytes differ")
        read = dequantize(spec, pool.kv_buffer[0], loc, 16)
        native = pool.get_key_buffer(0)[loc].reshape(20, 48)
        if not torch.equal(read.view(torch.uint8), native.contiguous().view(torch.uint8)):
            problems.append(f"{dtype}: read differs from get_key_buffer")
    return fail_or_pass(problems, "set_mla_kv_buffer rows identical for bf16 and e4m3")


# ------------------------------------------------------------------------------ main


# -------------------------------------------------------------- DSv4 indexer keys (fp4)


def _indexer_fp4_store(spec: LayoutSpec, *, rne: bool) -> Result:
    """SGLang's Triton quantizer + store (``store_fp4_index_k_cache``) under the interpreter,
    against kvcompat's codec, whole pages. The interpreter's arithmetic here is exact (IEEE
    ``amax / 6``, a division by a power of two, comparisons, integer exponents). A GPU may
    compile ``amax / 6`` into ``amax * fl(1/6)`` (as it does DSA's ``/ 448``); the ceiled
    exponent then differs only if the two land on opposite sides of a power of two (the
    GPU run is owed)."""
    from sglang.kernels.ops.kvcache.dsv4_fp4_index_k_cache import store_fp4_index_k_cache

    problems, tokens = [], 0
    for page_size, seed in ((64, 41), (128, 42)):
        n = 3 * page_size // 2
        values = tile_values(n, 128, 32, seed=seed, dtype=torch.bfloat16)
        values[5, :32] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 4) * -1
        values[5, 31] = 6.0  # scale exactly 1: the thresholds themselves are the values
        g = torch.Generator().manual_seed(seed)
        loc = torch.randperm(3 * page_size, generator=g)[:n]
        theirs = torch.zeros(3, page_size * 68, dtype=torch.uint8)
        store_fp4_index_k_cache(values, theirs, loc, page_size=page_size, rne=rne)
        ours = torch.zeros_like(theirs)
        quantize(spec, values, ours, loc, page_size)
        if not torch.equal(theirs, ours):
            bad = int((theirs != ours).sum())
            problems.append(f"P={page_size}: {bad} of {theirs.numel()} bytes differ")
        tokens += n
    return fail_or_pass(problems, f"{tokens} tokens, whole pages byte-identical")


@check
def dsv4_indexer_fp4_store_triton() -> Result:
    return _indexer_fp4_store(DSV4_INDEXER_FP4, rne=False)


@check
def dsv4_indexer_fp4_rne_store_triton() -> Result:
    return _indexer_fp4_store(DSV4_INDEXER_FP4_RNE, rne=True)


@check
def dsv4_indexer_fp4_pool_dequant() -> Result:
    """``DeepSeekV4IndexerPool.get_index_k_dequant`` (torch) on pages of random bytes, every
    payload byte against every scale byte, against kvcompat's reader."""
    from _sglang.builders import build_dsv4_indexer_pool

    pool = build_dsv4_indexer_pool(use_fp4_indexer=True, layer_num=1)
    buf = pool.index_k_with_scale_buffer[0]
    page = pool.page_size
    g = torch.Generator().manual_seed(7)
    buf.copy_(torch.randint(0, 256, buf.shape, generator=g).to(torch.uint8))
    slots = torch.arange(min(pool.size, buf.shape[0] * page))
    # Every scale byte for some group: overwrite the first 64 tokens' scale words.
    scale_bytes = torch.arange(256, dtype=torch.uint8).reshape(64, 4)
    buf[0, page * 64 : page * 64 + 256] = scale_bytes.reshape(-1)
    theirs = pool.get_index_k_dequant(0, slots)
    ours = dequantize(DSV4_INDEXER_FP4, buf, slots, page)
    same = nan_aware_equal(theirs, ours)
    if not bool(same.all()):
        return "fail", f"{int((~same).sum())} of {same.numel()} values differ"
    return "pass", f"{slots.numel()} tokens x 128 values identical (all 256 scale bytes)"


@check
def dsv4_indexer_fp4_pool_io() -> Result:
    """kvcompat's ``write`` on a real fp4 ``DeepSeekV4IndexerPool`` against the pool's own
    ``set_index_fp4`` (Triton, interpreter), both roundings; ``read`` against
    ``get_index_k_dequant``."""
    from _sglang.builders import build_dsv4_indexer_pool

    import kvcompat

    problems = []
    for rne in (False, True):
        theirs = build_dsv4_indexer_pool(use_fp4_indexer=True, layer_num=2)
        ours = build_dsv4_indexer_pool(use_fp4_indexer=True, layer_num=2)
        theirs.index_k_rne = ours.index_k_rne = rne
        loc = torch.tensor([1, 5, 63, 64, 100])
        values = tile_values(loc.numel(), 128, 32, seed=9, dtype=torch.bfloat16)
        theirs.set_index_fp4(1, loc, values)
        pool = kvcompat.adapt(ours)
        pool.write(1, loc, values)
        problems.extend(
            f"rne={rne}: layer {layer} bytes differ after the write"
            for layer in (0, 1)
            if not torch.equal(
                theirs.index_k_with_scale_buffer[layer], ours.index_k_with_scale_buffer[layer]
            )
        )
        back = pool.read(1, loc).reshape(loc.numel(), -1)
        if not bool(nan_aware_equal(back, theirs.get_index_k_dequant(1, loc)).all()):
            problems.append(f"rne={rne}: read differs from get_index_k_dequant")
    return fail_or_pass(problems, "write bytes and read values identical (both roundings)")


@check
def dsv4_indexer_fp8_pool_store() -> Result:
    """kvcompat's ``write`` on a real fp8 ``DeepSeekV4IndexerPool`` against the pool's own
    ``set_index_k_scale_buffer`` (SGLang's Triton ``SetKAndS``, interpreter) handed the codes
    and scales kvcompat's codec computes: placement, scale bytes and untouched bytes. The
    quantizing store is CUDA JIT (``fused_store_indexer_cache``): its arithmetic is checked
    on the GPU tier (owed)."""
    from _sglang.builders import build_dsv4_indexer_pool

    import kvcompat

    theirs = build_dsv4_indexer_pool(use_fp4_indexer=False, layer_num=2)
    ours = build_dsv4_indexer_pool(use_fp4_indexer=False, layer_num=2)
    for pool in (theirs, ours):
        for buf in pool.index_k_with_scale_buffer:
            noise = torch.randint(0, 256, buf.shape, generator=torch.Generator().manual_seed(5))
            buf.copy_(noise.to(torch.uint8))
    loc = torch.randperm(theirs.size, generator=torch.Generator().manual_seed(3))[:9]
    values = tile_values(loc.numel(), 128, 128, seed=11, dtype=torch.bfloat16)
    codes, scales = DSV4_INDEXER_FP8.codec.encode(DSV4_INDEXER_FP8, values, fnuz=False)
    theirs.set_index_k_scale_buffer(
        1, loc, codes.view(torch.float8_e4m3fn), scales.view(torch.float32).reshape(-1)
    )
    pool = kvcompat.adapt(ours)
    pool.write(1, loc, values)
    problems = [
        f"layer {layer} bytes differ"
        for layer in (0, 1)
        if not torch.equal(
            theirs.index_k_with_scale_buffer[layer], ours.index_k_with_scale_buffer[layer]
        )
    ]
    back = pool.read(1, loc).reshape(loc.numel(), -1)
    expected = codes.view(torch.float8_e4m3fn).float() * scales.view(torch.float32)
    if not torch.equal(back, expected):
        problems.append("read is not fp32(e4m3) * scale")
    return fail_or_pass(problems, f"{loc.numel()} tokens placed byte-identically")


@check
def dsa_index_k_cache_store() -> Result:
    """DSA's ``IndexKeyCache`` holds the fp8 indexer bytes: the pool's own
    ``set_index_k_scale_buffer`` (``store_quantized``, SGLang's Triton ``SetKAndS`` under the
    interpreter) handed kvcompat's codes and scales equals kvcompat's ``quantize`` of the same
    values into the kernel view ``get_index_k_with_scale_buffer`` at ``index_page_size``; the
    read back is ``fp32(e4m3) * scale``. (On CUDA, DSA's fused store
    ``dsa/fused_store_index_cache.cuh`` has the DSv4 indexer store's arithmetic.)"""
    from _sglang.builders import build_dsa_pool

    pool = build_dsa_pool()
    view = pool.get_index_k_with_scale_buffer(0)
    page = int(pool.index_page_size)
    expected = view.clone()
    loc = torch.randperm(view.shape[0] * page, generator=torch.Generator().manual_seed(4))[:7]
    values = tile_values(loc.numel(), 128, 128, seed=12, dtype=torch.bfloat16)
    codes, scales = DSV4_INDEXER_FP8.codec.encode(DSV4_INDEXER_FP8, values, fnuz=False)
    pool.set_index_k_scale_buffer(
        0, loc, codes.view(torch.float8_e4m3fn), scales.view(torch.float32).reshape(-1)
    )
    quantize(DSV4_INDEXER_FP8, values, expected, loc, page)
    problems = []
    if not torch.equal(pool.get_index_k_with_scale_buffer(0), expected):
        problems.append("pool bytes differ from kvcompat's quantize")
    back = dequantize(DSV4_INDEXER_FP8, expected, loc, page)
    if not torch.equal(back, codes.view(torch.float8_e4m3fn).float() * scales.view(torch.float32)):
        problems.append("read is not fp32(e4m3) * scale")
    return fail_or_pass(problems, f"{loc.numel()} tokens, page {page}: byte-identical")


def main(argv: list[str]) -> int:
    names = argv or list(CHECKS)
    for name in names:
        try:
            status, detail = CHECKS[name]()
        except ModuleNotFoundError as exc:
            status, detail = "skip", f"{exc}"
        except Exception:
            status, detail = "fail", traceback.format_exc(limit=8)
        record: dict[str, Any] = {"check": name, "status": status, "detail": detail}
        print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
