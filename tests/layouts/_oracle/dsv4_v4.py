"""Oracle of the V4 layout (``kvcompat/layouts/dsv4_v4.py``): SGLang's V4 readers and stores."""

from __future__ import annotations

import torch
from _sglang import places
from _sglang.features import sglang_code

from _oracle._common import (
    Result,
    check,
    fail_or_pass,
    interp_round,
    nan_aware_equal,
    pages_for,
    tile_values,
)
from kvcompat.layouts import (
    V4,
    dequantize,
    quantize,
)
from kvcompat.layouts._addressing import scatter_rows


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
    page_size = 4
    buf, loc, codes_and_scales = _exhaustive_v4_tokens(page_size)
    ours = dequantize(V4, buf, loc, page_size, fnuz=fnuz)
    if fnuz:
        kernel = sglang_code(*places.V4_READER_KERNEL)
        n = loc.numel()
        theirs = torch.empty(n, 1, 512, dtype=torch.bfloat16)
        # 0.5.21 on: several tokens per program; before, one program per token.
        per_prog = 4 if "TOKENS_PER_PROG" in kernel.arg_names else 1
        counts = (n,) if per_prog > 1 else ()
        extra = {"TOKENS_PER_PROG": per_prog} if per_prog > 1 else {}
        kernel[(-(-n // per_prog),)](
            theirs,
            buf.view(torch.float8_e4m3fnuz).reshape(-1),
            buf.view(torch.bfloat16).reshape(-1),
            buf.reshape(-1),
            loc,
            theirs.stride(0),
            *counts,
            BYTES_PER_PAGE=buf.shape[1],
            PAGE_SIZE=page_size,
            DIM_NOPE=448,
            DIM_ROPE=64,
            TILE_SIZE=64,
            NUM_SCALE_TILES=7,
            NOPE_ROPE_BYTES=576,
            PADDED_SCALE_PER_TOKEN=8,
            S_OFFSET_BYTES=page_size * 576,
            **extra,
        )
    else:
        theirs = sglang_code(*places.V4_READER)(buf, loc, page_size)
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


@check(
    V4,
    code="`dequantize_k_cache_paged_dsv4` (V4 Triton reader)",
    compared="all 256 codes x all 256 scale bytes, rope",
    result="exact outside interpreter blind spots (below)",
)
def v4_dequant_triton() -> Result:
    return _v4_dequant_vs_triton(fnuz=False)


@check(
    V4,
    code="the same kernel on e4m3fnuz bytes",
    compared="as above, `fnuz=True`",
    result="exact outside blind spots",
)
def v4_fnuz_dequant_triton() -> Result:
    return _v4_dequant_vs_triton(fnuz=True)


@check(
    V4,
    code="`k_cache_reference.dequantize_k_cache_paged_ref` (torch)",
    compared="all codes x all scale bytes",
)
def v4_dequant_torch_reference() -> Result:
    reference = sglang_code(*places.V4_REFERENCE_READER)
    page_size = 4
    buf, loc, _ = _exhaustive_v4_tokens(page_size)
    ours = dequantize(V4, buf, loc, page_size)
    theirs = reference(buf, loc, page_size).reshape(-1, 512)
    equal = nan_aware_equal(ours, theirs)
    detail = f"{equal.numel()} values exact, scale byte 0 read as 0 by both"
    return fail_or_pass([f"{int((~equal).sum())} mismatches"] if (~equal).any() else [], detail)


@check(
    V4,
    code="`SetKAndS` / `_set_k_and_s_triton` (V4 pack store)",
    compared="whole pages after storing kvcompat's encoded rows, P = 2, 4, 64",
    result="exact (placement, pad byte, padding)",
)
def v4_pack_store_triton() -> Result:
    store = sglang_code(*places.V4_PACK_STORE)
    pack_class = sglang_code(*places.V4_PACK_CLASS)

    problems = []
    for page_size in (2, 4, 64):
        n = 12
        values = tile_values(n, 512, 64, seed=page_size, dtype=torch.bfloat16)
        data, scale = V4.codec.encode(V4, values, fnuz=False)
        pack = pack_class(
            k_nope_fp8=data[:, :448].contiguous().view(torch.float8_e4m3fn),
            k_rope_bf16=data[:, 448:].contiguous().view(torch.bfloat16),
            scale_k_nope_ue8m0=scale.contiguous(),
        )
        before = pages_for(V4, page_size, 3 * 64 // page_size + 1, seed=3)
        g = torch.Generator().manual_seed(page_size)
        loc = torch.randperm(before.shape[0] * page_size, generator=g)[:n]
        theirs, ours = before.clone(), before.clone()
        store(theirs, loc, pack, page_size)
        quantize(V4, values, ours, loc, page_size)
        if not torch.equal(ours, theirs):
            problems.append(f"P={page_size}: {int((ours != theirs).sum())} bytes differ")
    return fail_or_pass(problems, "SetKAndS and kvcompat write identical pages (P=2,4,64)")


def _floor_free_values(n: int, seed: int) -> torch.Tensor:
    """V4 rows whose tile maxima are >= 448 * 1e-4: the CUDA store's floor (1e-4, which
    kvcompat follows) and the HIP store's and quantizer's (1e-8) never apply."""
    values = tile_values(n, 512, 64, seed=seed, dtype=torch.bfloat16, exponents=(-3, 12))
    values[:5, :64] = values[5:10, :64]  # drop the special tiles (zeros, tiny values)
    return values


def _code_problems(
    values: torch.Tensor,
    scale_bytes: torch.Tensor,
    ours: torch.Tensor,
    theirs: torch.Tensor,
    *,
    fnuz: bool,
) -> list[str]:
    """The nope codes of an interpreted SGLang quantizer against kvcompat's.

    Both divide by the power of two of kvcompat's scale bytes (``[n, 7]``), exactly, so
    the fp32 values are the same: SGLang's codes must be the interpreter's rounding of
    them, kvcompat's codes round-to-nearest-even. ``ours`` / ``theirs``: ``[n, 448]`` uint8.
    """
    limit = 240.0 if fnuz else 448.0
    exponent = scale_bytes.to(torch.int32) - 127
    inverse = torch.exp2(-exponent.float()).repeat_interleave(64, dim=1)
    scaled = (values[:, :448].float() * inverse).clamp(-limit, limit)
    dtype = torch.float8_e4m3fnuz if fnuz else torch.float8_e4m3fn
    problems = []
    if not torch.equal(theirs, interp_round(scaled, fnuz=fnuz)):
        problems.append("SGLang's codes are not the interpreter's rounding of kvcompat's values")
    if not torch.equal(ours, scaled.to(dtype).view(torch.uint8)):
        problems.append("kvcompat's codes are not RNE of its values")
    return problems


def _v4_store_vs_hip_triton(*, fnuz: bool) -> Result:
    kernel = sglang_code(*places.V4_HIP_STORE_KERNEL)

    page_size, n = 4, 16
    values = _floor_free_values(n, seed=11)
    before = pages_for(V4, page_size, 6, seed=5)
    loc = torch.randperm(before.shape[0] * page_size, generator=torch.Generator().manual_seed(2))
    loc = loc[:n]
    theirs, ours = before.clone(), before.clone()
    limit = 240.0 if fnuz else 448.0
    kernel[(n, 8)](
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
    problems += _code_problems(
        values,
        flat_ours[scale_at[:, :7]],
        flat_ours[data_at[:, :448]],
        flat_theirs[data_at[:, :448]],
        fnuz=fnuz,
    )
    untouched = torch.ones_like(flat_ours, dtype=torch.bool)
    untouched[data_at.reshape(-1)] = False
    untouched[scale_at[:, :7].reshape(-1)] = False
    if not torch.equal(flat_ours[untouched], flat_theirs[untouched]):
        problems.append("bytes outside the written tokens differ")
    ties = int((flat_ours[data_at[:, :448]] != flat_theirs[data_at[:, :448]]).sum())
    flavour = "e4m3fnuz, max 240" if fnuz else "e4m3fn, max 448 (vs kvcompat's CUDA flavour)"
    return fail_or_pass(problems, f"{flavour}: scales and rope exact, {ties} tie codes differ")


@check(
    V4,
    code="`triton_fused_store_flashmla` (HIP V4 store, e4m3fn and e4m3fnuz parameters)",
    compared="scale bytes and rope exact; codes against the interpreter's rounding of kvcompat's "
    "fp32 values",
)
def v4_hip_store_triton_e4m3fn() -> Result:
    return _v4_store_vs_hip_triton(fnuz=False)


@check(
    V4,
    code="`triton_fused_store_flashmla` (HIP V4 store, e4m3fn and e4m3fnuz parameters)",
    compared="scale bytes and rope exact; codes against the interpreter's rounding of kvcompat's "
    "fp32 values",
)
def v4_fnuz_hip_store_triton() -> Result:
    return _v4_store_vs_hip_triton(fnuz=True)


@check(
    V4,
    code="`quant_to_nope_fp8_rope_bf16_pack_triton` (V4 quantizer: codes, UE8M0 scales, rope)",
    compared="scale bytes and rope exact; codes against the interpreter's rounding of kvcompat's "
    "fp32 values",
)
def v4_quantize_triton() -> Result:
    """SGLang's own V4 quantizer, the one release 0.5.12 has besides the pack store."""
    quantizer = sglang_code(*places.V4_QUANTIZER)
    n = 16
    values = _floor_free_values(n, seed=13)
    pack = quantizer(values)
    data, scale = V4.codec.encode(V4, values, fnuz=False)
    problems = []
    if not torch.equal(pack.scale_k_nope_ue8m0.view(torch.uint8), scale[:, :7]):
        problems.append("scale bytes differ")
    if not torch.equal(pack.k_rope_bf16.contiguous().view(torch.uint8), data[:, 448:]):
        problems.append("rope bytes differ")
    theirs = pack.k_nope_fp8.view(torch.uint8)
    problems += _code_problems(values, scale[:, :7], data[:, :448], theirs, fnuz=False)
    ties = int((data[:, :448] != theirs).sum())
    return fail_or_pass(problems, f"{n} tokens: scales and rope exact, {ties} tie codes differ")
