"""The kernels' public surface on a plain CPU process (no interpreter, no GPU).

Lazy imports, the ImportError without triton, the seam's ``impl`` / ``out`` arguments on
the torch path, the clear error for CPU tensors outside the interpreter, and the launch
settings helper.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import pytest
import torch
from _kernel_cases import as_bytes, make_buffer

from kvcompat import LayoutError
from kvcompat.kernels._config import DEFAULTS, OVERRIDES, LaunchSettings, launch_settings
from kvcompat.kernels._plan import (
    edge_span,
    fp4_constants,
    fp8_constants,
    launch_family,
    read_plan,
    unsupported,
    write_plan,
)
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
    Encoding,
    LayoutSpec,
    SegmentRole,
    dequantize,
    dsa_fp8_layout,
    mha_layout,
    mla_layout,
    quantize,
)
from kvcompat.layouts._registry import LAYOUTS
from kvcompat.layouts._spec import KernelSpec


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=False
    )


def test_package_import_does_not_import_triton() -> None:
    result = _run(
        """
        import sys
        import kvcompat.kernels as k
        from kvcompat.kernels import is_available
        from kvcompat.layouts import dequantize, quantize
        import torch
        from kvcompat.layouts import V4
        buf = torch.zeros(1, V4.page_bytes(4), dtype=torch.uint8)
        dequantize(V4, buf, torch.tensor([1]), 4)          # auto on CPU: the twin
        quantize(V4, torch.ones(1, 512), buf, torch.tensor([1]), 4)
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("triton", "sglang")))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_missing_triton_names_the_install_line() -> None:
    result = _run(
        """
        import sys
        sys.modules["triton"] = None  # as if triton were not installed
        import kvcompat.kernels as k
        assert k.is_available() in (True, False)
        try:
            k.gather_dequantize
        except ImportError as exc:
            print("IMPORT-ERROR", exc)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "IMPORT-ERROR" in result.stdout
    assert "pip install triton" in result.stdout


def test_unknown_attribute() -> None:
    import kvcompat.kernels as kernels

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = kernels.nope
    assert {"gather_dequantize", "quantize_scatter", "is_available"} <= set(dir(kernels))


def test_cpu_tensors_need_the_interpreter() -> None:
    pytest.importorskip("triton")
    from kvcompat.kernels import _launch

    if _launch.INTERPRETED:
        pytest.skip("this process runs under TRITON_INTERPRET=1")
    buf = make_buffer(V41, 4, 2, seed=0)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        dequantize(V41, buf, torch.tensor([1]), 4, impl="triton")


def test_rocm_builds_take_the_portable_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a ROCm torch the launcher picks the pure-integer paths (no NVIDIA conversions, no
    inline PTX), e.g. the float FP4 writer instead of the PTX pairs writer."""
    pytest.importorskip("triton")
    from kvcompat.kernels import _launch

    plan = write_plan(V41_FP4, torch.bfloat16, fnuz=False)
    monkeypatch.setattr(_launch, "INTERPRETED", False)
    monkeypatch.setattr(_launch, "FORCE_SOFT", False)
    monkeypatch.setattr(_launch, "ROCM", False)
    assert launch_family(plan, soft=_launch._soft()) == "write_fp4_pairs"
    monkeypatch.setattr(_launch, "ROCM", True)
    assert launch_family(plan, soft=_launch._soft()) == "write_fp4"
    assert _launch._kwargs(plan, launch_settings("write_fp4", 8))["SOFT"] is True


def test_impl_is_checked() -> None:
    buf = make_buffer(V41, 4, 2, seed=0)
    with pytest.raises(ValueError, match="impl must be"):
        dequantize(V41, buf, torch.tensor([1]), 4, impl="cuda")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="impl must be"):
        quantize(V41, torch.ones(1, 512), buf, torch.tensor([1]), 4, impl="fast")  # type: ignore[arg-type]


@pytest.mark.parametrize("impl", ["auto", "torch"])
def test_out_on_the_torch_path(impl: str) -> None:
    buf = make_buffer(V4, 4, 2, seed=1)
    loc = torch.tensor([0, 7, 7], dtype=torch.int32)
    out = torch.empty(3, 512, dtype=torch.bfloat16)
    assert dequantize(V4, buf, loc, 4, out=out, impl=impl) is out  # type: ignore[arg-type]
    assert torch.equal(as_bytes(out), as_bytes(dequantize(V4, buf, loc, 4)))
    with pytest.raises(LayoutError, match=r"out must be a contiguous \[3, 512\]"):
        dequantize(V4, buf, loc, 4, out=torch.empty(3, 511, dtype=torch.bfloat16))
    with pytest.raises(LayoutError, match="out must be"):
        dequantize(V4, buf, loc, 4, out=torch.empty(512, 3, dtype=torch.bfloat16).t())


def test_every_layout_has_kernels() -> None:
    specs = [
        *(V4, V41, V41_FP4_NEW, UNIFORM_FP8, DSA_FP8, dsa_fp8_layout(256, 0)),
        *(DSV4_INDEXER_FP8, DSV4_INDEXER_FP4, DSV4_INDEXER_FP4_RNE),
        *(mha_layout(2, 8, torch.float8_e4m3fnuz), mla_layout(512, 64, torch.bfloat16)),
    ]
    for spec in specs:
        assert not isinstance(read_plan(spec, fnuz=False), str), spec
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            assert unsupported(spec, write=True, fnuz=False, values_dtype=dtype) is None, spec
    assert write_plan(mla_layout(8, 0, torch.bfloat16), torch.bfloat16, fnuz=False).family == (
        "scatter_rows"
    )
    assert write_plan(UNIFORM_FP8, torch.bfloat16, fnuz=False).family == "write_plain"
    for dtype in (torch.bfloat16, torch.float16, torch.float32):  # the ROCm V4 store
        assert write_plan(V4, dtype, fnuz=True).constants["MODE"] == 3  # type: ignore[union-attr]
        assert write_plan(V4, dtype, fnuz=False).constants["MODE"] == 0  # type: ignore[union-attr]
    assert unsupported(V4, write=False, fnuz=True) is None
    indexer = (DSV4_INDEXER_FP8, DSV4_INDEXER_FP4, DSV4_INDEXER_FP4_RNE)
    for spec in (V41, DSA_FP8, UNIFORM_FP8, mha_layout(2, 8, torch.bfloat16), *indexer):
        for write in (False, True):
            reason = unsupported(spec, write=write, fnuz=True, values_dtype=torch.bfloat16)
            assert reason == f"layout {spec.name!r} has no fnuz variant"


_PLANNED = [
    *LAYOUTS.values(),
    *(dsa_fp8_layout(256, 0), dsa_fp8_layout(384, 64)),
    *(mha_layout(2, 8, torch.bfloat16), mha_layout(4, 64, torch.float8_e5m2)),
    *(mla_layout(512, 64, torch.bfloat16), mla_layout(512, 64, torch.float8_e4m3fn)),
]


@pytest.mark.parametrize("spec", _PLANNED, ids=lambda spec: spec.name)
def test_kernel_plans_agree_with_their_layout_spec(spec: LayoutSpec) -> None:
    """Every constant a kernel is compiled with re-reads the spec's own byte map."""
    plan = read_plan(spec, fnuz=False)
    kernel = spec.kernel
    if kernel is None:  # plain rows go through the row kernels, the rest through torch
        if isinstance(plan, str):
            assert plan == f"no kernel reads layout {spec.name!r}"
        else:
            assert plan.family == "gather_rows"
            assert plan.constants == {"ROW_BYTES": spec.data_bytes}
        return
    assert not isinstance(plan, str), plan
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        assert unsupported(spec, write=True, fnuz=False, values_dtype=dtype) is None
    if kernel.family == "fp4":
        assert plan.family == "read_fp4"
        assert spec.data_encoding is Encoding.E2M1X2
        c = plan.constants
        assert 2 * c["NT"] * c["TB"] == spec.dim == 2 * spec.data_bytes
        assert 2 * c["TB"] == spec.tile_size
        (scale,) = [s for s in spec.segments if s.role is SegmentRole.SCALE]
        assert (scale.region, scale.offset, scale.elements) == ("scale", 0, c["NT"])
        expected = {0: Encoding.E4M3FN, 1: Encoding.UE8M0}[int(c["SCALE_KIND"])]
        assert scale.encoding is expected
        return
    c = plan.constants
    assert plan.family == "read_fp8"
    assert spec.data_encoding is Encoding.E4M3FN
    assert c["OUT_DIM"] == spec.dim == c["NQ"] + c["NROPE"]
    assert c["NT"] * c["TILE"] == c["NQ"]
    assert c["NT_P2"] >= c["NT"] > c["NT_P2"] // 2
    e4m3 = [s for s in spec.segments if s.encoding is Encoding.E4M3FN and s.region == "data"]
    assert sum(s.nbytes for s in e4m3) == c["NQ"]  # one byte per quantized value
    assert c["OUT_F32"] == (spec.output_dtype == torch.float32)
    if c["NROPE"]:
        rope = next(s for s in spec.segments if s.region == "data" and s.offset == c["ROPE_OFF"])
        assert (rope.role, rope.encoding) == (SegmentRole.ROPE, Encoding.BF16)
        assert rope.elements == c["NROPE"]
    scales = [s for s in spec.segments if s.role is SegmentRole.SCALE]
    if kernel.scales == "none":
        assert not scales
        assert spec.scale_bytes == 0
    elif kernel.scales == "fp32_in_row":
        (scale,) = scales
        assert (scale.region, scale.encoding) == ("data", Encoding.FP32)
        assert (scale.offset, scale.elements) == (c["SCALE_IN_ROW"], c["NT"])
    elif kernel.scales == "fp32":  # one fp32 word per tile, in the scale row
        (scale,) = scales
        assert (scale.region, scale.encoding, scale.offset) == ("scale", Encoding.FP32, 0)
        assert scale.elements == c["NT"]
        assert 4 * c["NT"] == spec.scale_bytes_written
    else:  # one ue8m0 byte per tile, in the scale row
        (scale,) = scales
        assert (scale.region, scale.encoding) == ("scale", Encoding.UE8M0)
        assert scale.elements == c["NT"] == spec.scale_bytes_written
        assert spec.tile_size == c["TILE"]


def test_kernel_constants_of_the_dsv4_and_dsa_layouts() -> None:
    """The constants the fp8 kernels were written for, pinned (derived from the specs)."""
    expected = {
        V4: (448, 64, 7, 8, 1, 0, 64, 448),
        V41: (512, 32, 16, 16, 2, 0, 0, 0),
        V41_NEW: (512, 32, 16, 16, 2, 0, 0, 0),
        UNIFORM_FP8: (512, 64, 8, 8, 0, 0, 0, 0),
        DSA_FP8: (512, 128, 4, 4, 3, 512, 64, 528),
        DSV4_INDEXER_FP8: (128, 128, 1, 1, 4, 0, 0, 0),
    }
    names = ("NQ", "TILE", "NT", "NT_P2", "SCALE_KIND", "SCALE_IN_ROW", "NROPE", "ROPE_OFF")
    for spec, values in expected.items():
        constants = fp8_constants(spec)
        assert constants is not None
        assert tuple(constants[name] for name in names) == values, spec.name


def test_kernel_constants_of_the_fp4_layouts() -> None:
    """The fp4 kernels' tile grids and scale decoding, pinned (derived from the specs)."""
    assert fp4_constants(V41_FP4) == {"NT": 32, "TB": 8, "SCALE_KIND": 0}
    assert fp4_constants(V41_FP4_NEW) == {"NT": 32, "TB": 8, "SCALE_KIND": 0}
    for spec, rne in ((DSV4_INDEXER_FP4, False), (DSV4_INDEXER_FP4_RNE, True)):
        assert fp4_constants(spec) == {"NT": 4, "TB": 16, "SCALE_KIND": 1}
        plan = write_plan(spec, torch.float16, fnuz=False)
        assert not isinstance(plan, str)
        assert plan.family == "write_fp4_ue8m0"
        assert plan.constants == {"NT": 4, "TB": 16, "IN_KIND": 1, "RNE": rne}
        assert launch_family(plan, soft=False) == "write_fp4_ue8m0"


@pytest.mark.parametrize(
    ("spec", "kernel"),
    [
        (DSV4_INDEXER_FP4, KernelSpec("fp4", scales="e4m3")),  # its scale bytes are ue8m0
        (DSV4_INDEXER_FP4, KernelSpec("fp8", scales="ue8m0")),  # its codes are e2m1
        (DSV4_INDEXER_FP8, KernelSpec("fp8", scales="fp32_in_row")),  # no scale in its row
        (DSV4_INDEXER_FP8, KernelSpec("fp8", scales="ue8m0_exp2")),  # an fp4 kind
        (V41, KernelSpec("fp8", scales="fp32")),  # V4.1's scales are bytes, not fp32 words
        (V41_FP4, KernelSpec("fp4", scales="ue8m0_exp2")),  # e4m3 scale bytes
    ],
    ids=lambda value: getattr(value, "name", None) or repr(value),
)
def test_a_kernel_declaration_that_does_not_fit_its_layout_is_refused(
    spec: LayoutSpec, kernel: KernelSpec
) -> None:
    """A declaration whose family or scale kind does not match the spec's byte map gets no
    kernel (the twin serves the call) rather than a kernel that would misread the bytes."""
    bad = dataclasses.replace(spec, name=f"{spec.name}_mis", kernel=kernel)
    read = read_plan(bad, fnuz=False)
    write = write_plan(bad, torch.bfloat16, fnuz=False)
    assert read == f"no kernel reads layout {bad.name!r}"
    assert write == f"no kernel writes layout {bad.name!r}"


def test_a_layout_without_a_kernel_declaration_falls_back_to_torch() -> None:
    bare = dataclasses.replace(V41, name="v41_no_kernel", kernel=None)
    assert read_plan(bare, fnuz=False) == "no kernel reads layout 'v41_no_kernel'"
    assert unsupported(bare, write=True, fnuz=False, values_dtype=torch.bfloat16) == (
        "no kernel writes layout 'v41_no_kernel'"
    )


@pytest.mark.parametrize("spec", [V41_FP4, V41_FP4_NEW], ids=lambda spec: spec.name)
def test_fp4_writes_of_half_values_take_the_pairs_kernel_on_a_gpu(spec: LayoutSpec) -> None:
    for dtype, gpu_family in (
        (torch.bfloat16, "write_fp4_pairs"),
        (torch.float16, "write_fp4_pairs"),
        (torch.float32, "write_fp4"),
    ):
        plan = write_plan(spec, dtype, fnuz=False)
        assert not isinstance(plan, str)
        assert launch_family(plan, soft=False) == gpu_family
        assert launch_family(plan, soft=True) == "write_fp4"  # the interpreter's kernel
    for other in (write_plan(V41, torch.bfloat16, fnuz=False), read_plan(spec, fnuz=False)):
        assert not isinstance(other, str)
        assert launch_family(other, soft=False) == other.family


def test_only_sector_splitting_rows_prefetch_their_edges() -> None:
    assert edge_span(V41_NEW) == 528  # 512 codes + 16 scales, 16-byte aligned
    assert edge_span(DSA_FP8) == 656
    for spec in (V4, V41, V41_FP4, V41_FP4_NEW, UNIFORM_FP8, mha_layout(8, 128, torch.bfloat16)):
        assert edge_span(spec) == 0, spec.name
    plan = write_plan(V41_NEW, torch.bfloat16, fnuz=False)
    assert not isinstance(plan, str)
    assert plan.constants["SPAN"] == 528


def test_launch_settings_live_in_one_helper() -> None:
    assert launch_settings("read_fp8") == DEFAULTS["read_fp8"]
    OVERRIDES["read_fp8"] = LaunchSettings(block_tokens=2, num_warps=1)
    try:
        assert launch_settings("read_fp8").block_tokens == 2
    finally:
        del OVERRIDES["read_fp8"]
    for settings in DEFAULTS.values():
        assert settings.block_tokens & (settings.block_tokens - 1) == 0
        assert settings.num_warps in (1, 2, 4, 8, 16)


def test_a_layout_declares_its_launch_settings() -> None:
    """The fp8 indexer keys' 132-byte rows declare what the H200 sweep picked for them;
    every other layout keeps its family's defaults, and a sweep's override wins."""
    read, write = (
        read_plan(DSV4_INDEXER_FP8, fnuz=False),
        write_plan(DSV4_INDEXER_FP8, torch.bfloat16, fnuz=False),
    )
    assert not isinstance(read, str)
    assert not isinstance(write, str)
    assert (read.family, read.launch) == ("read_fp8", (4, 2))
    assert (write.family, write.launch) == ("write_fp8", (8, 4))
    v4 = write_plan(V4, torch.bfloat16, fnuz=False)
    assert not isinstance(v4, str)
    assert v4.launch is None
    assert launch_settings("write_fp8", None, write.launch) == LaunchSettings(8, 4)
    assert launch_settings("write_fp8", None, v4.launch) == DEFAULTS["write_fp8"]
    assert launch_settings("write_fp8", 4096, write.launch).block_tokens == 4  # small batch
    OVERRIDES["write_fp8"] = LaunchSettings(16, 8)
    try:
        assert launch_settings("write_fp8", None, write.launch) == LaunchSettings(16, 8)
    finally:
        del OVERRIDES["write_fp8"]


def test_a_segment_table_is_made_only_of_16_byte_pitches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one launch over several token spaces tells the compiler that every page pitch
    and scale-row offset in its table is a multiple of 16 bytes (so it moves 16 bytes at a
    time); where one is not, no table is made and each space takes its own launch."""
    from kvcompat import _ops
    from kvcompat.kernels import _launch

    monkeypatch.setattr(_launch, "_check_device", lambda buf: None)  # host checks only here
    bufs = [make_buffer(V4, 2, 6, seed=i) for i in range(3)]
    groups = [(bufs[:2], 2), (bufs[2:], 2)]
    table = _launch.segment_table(V4, groups)
    assert table is not None
    assert table[:, 2].tolist() == [V4.page_bytes(2)] * 3
    real = _launch._check_buf

    def odd_pitch(spec: LayoutSpec, buf: object, page_size: object) -> dict[str, int]:
        geo = real(spec, buf, page_size)
        return {**geo, "PAGE_BYTES": geo["PAGE_BYTES"] + 8}

    monkeypatch.setattr(_launch, "_check_buf", odd_pitch)
    assert _launch.segment_table(V4, groups) is None
    assert _ops.plan_spaces(V4, groups).table() is None
