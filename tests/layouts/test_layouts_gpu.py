"""GPU tier: the torch twins on CUDA, and SGLang's own GPU kernels, byte for byte.

What the CPU cannot show: SGLang's CUDA JIT stores (``store.cuh``, compiled unmodified
through ``_oracle/store_harness.cu``), its Triton kernels' real fp8/bf16 rounding, and the
torch twins running on a CUDA device. Everything here is skipped without a CUDA device;
the SGLang parts also need SGLang's sources (an installed ``sglang``, or
``KVCOMPAT_SGLANG_DIR`` pointing at an ``sglang`` package folder), ``nvcc`` and the
``tvm_ffi`` headers (``KVCOMPAT_TVM_FFI_INCLUDE`` overrides where they are looked for).

Results of the last run are recorded in docs/layouts/oracles.md.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from _layout_cases import ALL_LAYOUTS, layout_id, tile_values
from _sglang import places
from _sglang.features import (
    ReleaseLacks,
    declared_kv_layouts,
    fp4_indexer_store,
    jit_dir,
    sglang_code,
)

from kvcompat.layouts import (
    DSA_FP8,
    DSV4_INDEXER_FP4,
    DSV4_INDEXER_FP4_RNE,
    DSV4_INDEXER_FP8,
    UNIFORM_FP8,
    V4,
    LayoutSpec,
    dequantize,
    get_layout,
    mla_layout,
    quantize,
)
from kvcompat.layouts._addressing import scatter_rows
from kvcompat.layouts._registry import KV_LAYOUT_NAMES

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

HARNESS = Path(__file__).resolve().parent / "_oracle" / "store_harness.cu"
# SGLang's DeepSeek-V4 CUDA stores and Triton readers serve every scaled KVLayout value
# (the uniform-fp8 pool writes with torch): derived from the registry, so a new value is
# compared with SGLang's kernels (the harness refuses a name it does not know, loudly).
STORE_LAYOUTS = {
    name: get_layout(name)
    for name in KV_LAYOUT_NAMES
    if get_layout(name).scale_encoding is not None
}


def special_values(
    spec: LayoutSpec, n: int, seed: int, dtype: torch.dtype, *, non_finite: bool
) -> torch.Tensor:
    values = tile_values(n, spec, seed=seed, dtype=torch.float32)
    tile = min(spec.tile_size, spec.dim)
    values[0, :tile] = 0.0
    values[1, :tile] = torch.arange(tile).float() * 0.25 - 2.0  # ties
    values[2, :tile] = 1e-6  # below every floor
    if spec.unscaled_max is not None:
        values = values.clamp(-spec.unscaled_max, spec.unscaled_max)
    if non_finite:
        values[3, 3] = math.nan
        values[4, 5] = math.inf
        values[5, 1] = -math.inf
        values[6, :] = math.nan
        values[7, :16] = -math.nan
    return values.to(dtype)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


# ------------------------------------------------------------- torch twins on CUDA


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("spec", ALL_LAYOUTS, ids=layout_id)
def test_twin_on_cuda_matches_cpu(spec: LayoutSpec, dtype: torch.dtype) -> None:
    page_size = 64
    rows = 3 if spec.paged else 200
    per_row = page_size if spec.paged else 1
    cases = [False, True] if spec.scale_encoding is not None else [False]
    for non_finite in cases:
        values = special_values(spec, 48, seed=1, dtype=dtype, non_finite=non_finite)
        loc = torch.randperm(rows * per_row, generator=torch.Generator().manual_seed(3))[:48]
        flavours = [False, True] if spec.supports_fnuz else [False]
        for fnuz in flavours:
            cpu = torch.randint(0, 256, (rows, spec.page_bytes(per_row)), dtype=torch.uint8)
            gpu = cpu.cuda()
            # special_values holds saturating magnitudes (beyond fp4 tiles' 2688, say): the
            # default check refuses those, so the twins are compared on what
            # check_finite=False stores.
            kwargs = {"fnuz": fnuz, "check_finite": False}
            quantize(spec, values, cpu, loc, page_size, **kwargs)
            quantize(spec, values.cuda(), gpu, loc.cuda(), page_size, **kwargs)
            assert torch.equal(cpu, gpu.cpu())
            out_cpu = dequantize(spec, cpu, loc, page_size, fnuz=fnuz)
            out_gpu = dequantize(spec, gpu, loc.cuda(), page_size, fnuz=fnuz).cpu()
            # NaN payload bits are not part of any layout's contract (a NaN scale times a
            # code gives a device-specific payload): NaN positions must agree, the rest
            # bit for bit.
            nan = torch.isnan(out_cpu)
            assert torch.equal(nan, torch.isnan(out_gpu))
            assert torch.equal(bits(out_cpu[~nan]), bits(out_gpu[~nan]))


# ---------------------------------------------------- SGLang's CUDA JIT stores (store.cuh)


def _sglang_dir() -> Path | None:
    if os.environ.get("KVCOMPAT_SGLANG_DIR"):
        return Path(os.environ["KVCOMPAT_SGLANG_DIR"])
    spec = importlib.util.find_spec("sglang")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _tvm_ffi_include() -> Path | None:
    if os.environ.get("KVCOMPAT_TVM_FFI_INCLUDE"):
        return Path(os.environ["KVCOMPAT_TVM_FFI_INCLUDE"])
    spec = importlib.util.find_spec("tvm_ffi")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "include"


V41_STORE = "fused_store_flashmla_cache_v41"
"""The V4.1 stores' kernel: store.cuh has it from 0.5.21 on."""
OPTIONAL_V41_LAYOUTS = ("UNIFORM_FP8", "V41_NEW", "V41_FP4_NEW")
"""Members of the V4.1 stores' ``KVLayout`` enum that not every release with them declares."""


@pytest.fixture(scope="module")
def store_harness(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, frozenset[str]]:
    """The harness built against the release's ``store.cuh``, and the layouts it stores.

    V4 and the fp8 indexer keys always; V4.1 layouts where ``store.cuh`` has the V4.1
    store, each one the release's ``KVLayout`` enum declares.
    """
    sglang_dir, tvm_include, nvcc = _sglang_dir(), _tvm_ffi_include(), shutil.which("nvcc")
    if sglang_dir is None or tvm_include is None or nvcc is None:
        pytest.skip("needs SGLang's sources, the tvm_ffi headers and nvcc")
    jit = jit_dir(sglang_dir)
    sources = jit / "csrc" / "deepseek_v4"
    has_v41 = V41_STORE in (sources / "store.cuh").read_text()
    layouts = {V4.name, DSV4_INDEXER_FP8.name}
    flags = ["-DKVCOMPAT_NO_V41"]
    if has_v41:
        declared = declared_kv_layouts(jit)
        layouts |= declared & set(STORE_LAYOUTS)
        flags = [
            f"-DKVCOMPAT_HAS_{name}" for name in OPTIONAL_V41_LAYOUTS if name.lower() in declared
        ]
    major, minor = torch.cuda.get_device_capability()
    binary = tmp_path_factory.mktemp("harness") / "store_harness"
    command = [
        nvcc, "-std=c++20", "-O3", "--expt-relaxed-constexpr", f"-arch=sm_{major}{minor}",
        f"-DSGL_CUDA_ARCH={major * 100 + minor * 10}", *flags,
        "-I", str(jit / "include"), "-I", str(sources),
        "-I", str(tvm_include), "-o", str(binary), str(HARNESS),
    ]  # fmt: skip
    built = subprocess.run(command, capture_output=True, text=True, check=False)
    if built.returncode:
        pytest.fail(f"building the store harness failed:\n{built.stderr[-3000:]}")
    return binary, frozenset(layouts)


def run_store(binary: Path, tmp: Path, name: str, page_bits: int, values: torch.Tensor,
              loc: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:  # fmt: skip
    (tmp / "in.bin").write_bytes(bits(values).numpy().tobytes())
    (tmp / "loc.bin").write_bytes(loc.to(torch.int64).numpy().tobytes())
    (tmp / "cache.bin").write_bytes(cache.numpy().tobytes())
    dtype = "bf16" if values.dtype == torch.bfloat16 else "fp32"
    args = [str(binary), name, str(page_bits), dtype, str(loc.numel())]
    args += [str(tmp / "in.bin"), str(tmp / "loc.bin"), str(tmp / "cache.bin")]
    subprocess.run(args, check=True, capture_output=True)
    data = bytearray((tmp / "cache.bin").read_bytes())
    return torch.frombuffer(data, dtype=torch.uint8).reshape(cache.shape)


@pytest.mark.sglang
@pytest.mark.parametrize("non_finite", [False, True], ids=["finite", "non-finite"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("page_bits", [1, 2, 6])
@pytest.mark.parametrize("name", sorted(STORE_LAYOUTS))
def test_sglang_cuda_store_is_reproduced(
    store_harness: tuple[Path, frozenset[str]], tmp_path: Path, name: str, page_bits: int,
    dtype: torch.dtype, non_finite: bool,
) -> None:  # fmt: skip
    binary, layouts = store_harness
    if name not in layouts:
        raise ReleaseLacks(f"a CUDA store of {name}", f"{V41_STORE} and its KVLayout enum")
    spec, page_size = STORE_LAYOUTS[name], 1 << page_bits
    rows = max(2, 256 // page_size)
    n = min(rows * page_size, 160)
    values = special_values(spec, n, seed=page_bits, dtype=dtype, non_finite=non_finite)
    loc = torch.randperm(rows * page_size, generator=torch.Generator().manual_seed(5))[:n]
    cache = torch.randint(0, 256, (rows, spec.page_bytes(page_size)), dtype=torch.uint8)
    theirs = run_store(binary, tmp_path, name, page_bits, values, loc, cache.clone())
    ours = cache.clone()
    # special_values holds saturating magnitudes (beyond fp4 tiles' 2688): the default
    # check refuses those, so SGLang's bytes are compared with what check_finite=False
    # stores for the same inputs.
    quantize(spec, values, ours, loc, page_size, check_finite=False)
    assert torch.equal(ours, theirs), int((ours != theirs).sum())


@pytest.mark.sglang
@pytest.mark.parametrize("non_finite", [False, True], ids=["finite", "non-finite"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_sglang_cuda_indexer_store_is_reproduced(
    store_harness: tuple[Path, frozenset[str]],
    tmp_path: Path,
    dtype: torch.dtype,
    non_finite: bool,
) -> None:
    """``fused_store_indexer_cache`` (fp8 indexer keys, 132 B/token) at P = 64."""
    spec, page_bits = DSV4_INDEXER_FP8, 6
    page_size, rows = 1 << page_bits, 4
    n = 160
    values = special_values(spec, n, seed=8, dtype=dtype, non_finite=non_finite)
    loc = torch.randperm(rows * page_size, generator=torch.Generator().manual_seed(6))[:n]
    cache = torch.randint(0, 256, (rows, spec.page_bytes(page_size)), dtype=torch.uint8)
    theirs = run_store(store_harness[0], tmp_path, spec.name, page_bits, values, loc, cache.clone())
    ours = cache.clone()
    # special_values holds saturating magnitudes (beyond fp4 tiles' 2688): the default
    # check refuses those, so SGLang's bytes are compared with what check_finite=False
    # stores for the same inputs.
    quantize(spec, values, ours, loc, page_size, check_finite=False)
    assert torch.equal(ours, theirs), int((ours != theirs).sum())


# ------------------------------------------------------------- SGLang's Triton kernels


@pytest.mark.sglang
@pytest.mark.parametrize("spec", list(STORE_LAYOUTS.values()), ids=layout_id)
def test_sglang_triton_readers_are_reproduced(spec: LayoutSpec) -> None:
    """Every data byte against every scale byte, NaN bits included."""
    page_size = 4
    if spec is V4:
        n = 74
        codes = (torch.arange(448).repeat(n, 1) + torch.arange(n)[:, None] * 13) % 256
        rope = torch.randint(0, 256, (n, 128), generator=torch.Generator().manual_seed(7))
        data = torch.cat((codes, rope), dim=1).to(torch.uint8)
        scales = (torch.arange(n)[:, None] * 7 + torch.arange(7)[None, :]) % 256
    else:
        n = -(-256 // spec.scale_bytes) * 2
        data = (torch.arange(spec.data_bytes).repeat(n, 1) + torch.arange(n)[:, None] * 7) % 256
        scales = (
            torch.arange(n)[:, None] * spec.scale_bytes + torch.arange(spec.scale_bytes)
        ) % 256
    buf = torch.zeros(-(-n // page_size), spec.page_bytes(page_size), dtype=torch.uint8)
    loc = torch.randperm(n, generator=torch.Generator().manual_seed(2))
    scatter_rows(spec, buf, loc, page_size, data.to(torch.uint8), scales.to(torch.uint8))
    ours = dequantize(spec, buf, loc, page_size)
    if spec is V4:
        theirs = sglang_code(*places.V4_READER)(buf.cuda(), loc.cuda(), page_size)
    else:
        reader = sglang_code(*places.V41_READER)
        if spec.name not in {member.value for member in sglang_code(*places.KV_LAYOUT)}:
            raise ReleaseLacks(f"KVLayout {spec.name!r}", "dequantize_k_cache_paged_v41")
        try:
            theirs = reader(buf.cuda(), loc.cuda(), page_size, layout=spec.name)
        except RuntimeError as exc:  # SGLang's own capability check (SM100+ or gfx950)
            if "requires" not in str(exc):
                raise
            pytest.skip(f"SGLang's reader refuses this GPU: {exc}")
    assert torch.equal(bits(ours), bits(theirs.reshape(n, 512).cpu()))


@pytest.mark.sglang
def test_sglang_triton_v4_quantizer_is_reproduced() -> None:
    """``quant_to_nope_fp8_rope_bf16_pack_triton`` (a test reference in 0.5.21 on, the V4
    quantizer of 0.5.12-0.5.20) with real GPU rounding: codes, scales and rope bytes.

    Its floor is 1e-8, kvcompat's (the CUDA store's) 1e-4: every tile here has a maximum
    of at least 448 * 1e-4, where the two agree."""
    n = 256
    values = tile_values(n, V4, seed=13, dtype=torch.bfloat16, low=-3, high=12)
    pack = sglang_code(*places.V4_QUANTIZER)(values.cuda())
    data, scale = V4.codec.encode(V4, values, fnuz=False)
    assert torch.equal(pack.scale_k_nope_ue8m0.view(torch.uint8).cpu(), scale[:, :7])
    assert torch.equal(pack.k_rope_bf16.contiguous().view(torch.uint8).cpu(), data[:, 448:])
    codes = pack.k_nope_fp8.view(torch.uint8).cpu()
    assert torch.equal(codes, data[:, :448]), int((codes != data[:, :448]).sum())


@pytest.mark.sglang
def test_sglang_dsa_triton_kernels_are_reproduced() -> None:
    quantize_k_cache_separate = sglang_code(*places.DSA_QUANTIZER)
    for non_finite in (False, True):
        values = special_values(DSA_FP8, 96, seed=3, dtype=torch.bfloat16, non_finite=non_finite)
        nope, rope = quantize_k_cache_separate(values[:, :512].cuda(), values[:, 512:].cuda())
        theirs = torch.cat((nope.squeeze(1), rope.squeeze(1)), dim=1).cpu()
        ours = torch.zeros(96, 1, 656, dtype=torch.uint8)
        quantize(DSA_FP8, values, ours, torch.arange(96), 1, check_finite=not non_finite)
        assert torch.equal(ours.reshape(96, 656), theirs)
    loc = torch.randint(0, 96, (128,), generator=torch.Generator().manual_seed(1))
    read = sglang_code(*places.DSA_READER)(ours.cuda().view(torch.float8_e4m3fn), loc.cuda())
    assert torch.equal(bits(dequantize(DSA_FP8, ours, loc, 1)), bits(read.reshape(128, 576).cpu()))


@pytest.mark.sglang
@pytest.mark.parametrize("n", [200, 1024])
@pytest.mark.parametrize("case", ["bf16", "e4m3fn", "dsa_fp8"])
def test_sglang_mla_row_write_is_reproduced(
    case: str, n: int, caplog: pytest.LogCaptureFixture
) -> None:
    """``set_mla_kv_buffer_triton``, the MLA and DSA pools' GPU row write, with what the
    pools hand it: an MLA pool's rows cast to its dtype and viewed as its storage dtype
    (bytes for fp8); a DSA fp8 pool's ``quantize_k_cache_separate`` output.

    On SM90 it picks SGLang's CUDA JIT copy (TMA bulk stores): always from 0.5.21 on, from
    768 locations in 0.5.12-0.5.20; otherwise a Triton kernel. A JIT that fails to build
    makes SGLang fall back to Triton with a warning, which fails this test: each size runs
    the path a deployment runs. Whole buffers are compared (placement, the nope/rope seam,
    untouched rows). 0.5.20 on never write slot 0 (CUDA-graph padding; 0.5.12 and 0.5.18
    do), so ``loc`` avoids it."""
    scatter = sglang_code(*places.MLA_SCATTER)
    rows, page_size = 1088, 64
    g = torch.Generator().manual_seed(21)
    loc = 1 + torch.randperm(rows - 1, generator=g)[:n]
    if case == "dsa_fp8":
        spec = DSA_FP8
        values = special_values(spec, n, seed=22, dtype=torch.bfloat16, non_finite=False)
        nope, rope = sglang_code(*places.DSA_QUANTIZER)(
            values[:, :512].cuda(), values[:, 512:].cuda()
        )
    else:
        dtype = torch.bfloat16 if case == "bf16" else torch.float8_e4m3fn
        spec = mla_layout(512, 64, dtype)
        values = (torch.randn(n, 576, generator=g) * 8).to(torch.bfloat16)
        rows_in = values.cuda().to(dtype)[:, None, :]
        if dtype.itemsize == 1:
            rows_in = rows_in.view(torch.uint8)  # the pool's store_dtype
        nope, rope = rows_in[..., :512], rows_in[..., 512:]
    start = torch.randint(0, 256, (rows, 1, spec.page_bytes(1)), generator=g, dtype=torch.uint8)
    theirs = start.cuda()
    target = theirs if nope.dtype == torch.uint8 else theirs.view(nope.dtype)
    with caplog.at_level(logging.WARNING):
        scatter(target, loc.cuda(), nope, rope)
    fallbacks = [r.getMessage() for r in caplog.records if "Failed to load JIT" in r.getMessage()]
    assert not fallbacks, fallbacks
    ours = start.clone()
    quantize(spec, values, ours, loc, page_size)
    assert torch.equal(ours, theirs.cpu()), int((ours != theirs.cpu()).sum())


def test_uniform_fp8_twin_is_the_torch_cast_on_cuda() -> None:
    values = special_values(UNIFORM_FP8, 16, seed=4, dtype=torch.bfloat16, non_finite=False).cuda()
    buf = torch.zeros(1, UNIFORM_FP8.page_bytes(16), dtype=torch.uint8, device="cuda")
    quantize(UNIFORM_FP8, values, buf, torch.arange(16, device="cuda"), 16)
    assert torch.equal(buf.view(16, 512), values.to(torch.float8_e4m3fn).view(torch.uint8))


@pytest.mark.sglang
@pytest.mark.parametrize("non_finite", [False, True], ids=["finite", "non-finite"])
@pytest.mark.parametrize("spec", [DSV4_INDEXER_FP4, DSV4_INDEXER_FP4_RNE], ids=layout_id)
def test_sglang_triton_fp4_indexer_store_is_reproduced(spec: LayoutSpec, non_finite: bool) -> None:
    """``store_fp4_index_k_cache`` with real GPU rounding (``amax / 6``, NaN handling)."""
    store = fp4_indexer_store(rne=spec is DSV4_INDEXER_FP4_RNE)
    page_size, rows, n = 64, 4, 160
    values = special_values(spec, n, seed=9, dtype=torch.bfloat16, non_finite=non_finite).cuda()
    loc = torch.randperm(rows * page_size, generator=torch.Generator().manual_seed(2))[:n].cuda()
    theirs = torch.zeros(rows, spec.page_bytes(page_size), dtype=torch.uint8, device="cuda")
    store(values, theirs, loc, page_size=page_size)
    ours = torch.zeros_like(theirs)
    quantize(spec, values, ours, loc, page_size, check_finite=not non_finite)
    assert torch.equal(ours.cpu(), theirs.cpu()), int((ours != theirs).sum())
