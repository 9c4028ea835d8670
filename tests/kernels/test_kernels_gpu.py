"""GPU tier: the Triton kernels against the torch twins on a CUDA device, byte for byte.

What the CPU interpreter cannot show: the hardware conversions (``cvt`` to e4m3, e5m2 and
bf16 with their real rounding), Triton's GPU code generation (vectorised loads, masks,
multi-program tails), and CUDA-graph capture. Every check runs the kernels' hardware
conversions; the main ones run the pure-integer ``SOFT`` conversions as well (the ones
the CPU tier proves), so both are tied to the twins on the same GPU. Skipped without CUDA.
Results of the last run are in docs/kernels.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from _kernel_cases import (
    ALL_LAYOUTS,
    INDEXER_LAYOUTS,
    PAGED_LAYOUTS,
    ROW_LAYOUTS,
    SCALED_LAYOUTS,
    VALUE_DTYPES,
    as_bytes,
    layout_id,
    make_buffer,
    tile_values,
)
from _kernel_checks import (
    dsa_scales_any_bits,
    empty_loc,
    every_scale_meets_every_code,
    fp32_scale_rows_any_bits,
    layered_matches_per_layer,
    layered_rows_match,
    moved_rows_match,
    read_matches_twin,
    refuses_out_of_range,
    rocm_scale_parts,
    rounding_grid,
    roundtrip_random,
    spaces_match_per_space,
    strided_matches_contiguous,
    write_matches_twin,
)
from _sglang import places
from _sglang.features import sglang_code
from hypothesis import given, settings
from hypothesis import strategies as st

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
    mha_layout,
    quantize,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

DEVICE = "cuda"


@pytest.fixture(params=[False, True], ids=["hw", "soft"])
def soft(request: pytest.FixtureRequest) -> Iterator[bool]:
    """Run a check with the hardware conversions, then with the pure-integer ones."""
    from kvcompat.kernels import _launch

    _launch.FORCE_SOFT = request.param
    yield request.param
    _launch.FORCE_SOFT = False


def _cases(page_sizes: tuple[int, ...]) -> list[tuple[LayoutSpec, int]]:
    return [(s, p) for s in PAGED_LAYOUTS for p in page_sizes] + [(s, 64) for s in ROW_LAYOUTS]


def _ids(case: tuple[LayoutSpec, int]) -> str:
    return f"{case[0].name}-P{case[1]}"


@pytest.mark.parametrize("loc_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("case", _cases((3, 64, 256)), ids=_ids)
def test_read_matches_twin(case: tuple[LayoutSpec, int], loc_dtype: torch.dtype) -> None:
    spec, page_size = case
    read_matches_twin(spec, page_size, loc_dtype, DEVICE, tokens=600)


@pytest.mark.parametrize("spec", ALL_LAYOUTS, ids=layout_id)
def test_read_matches_twin_soft(spec: LayoutSpec, soft: bool) -> None:
    read_matches_twin(spec, 64, torch.int64, DEVICE, tokens=300)


@pytest.mark.parametrize("dtype", VALUE_DTYPES, ids=str)
@pytest.mark.parametrize("case", _cases((3, 64, 256)), ids=_ids)
def test_write_matches_twin(case: tuple[LayoutSpec, int], dtype: torch.dtype) -> None:
    spec, page_size = case
    loc_dtype = torch.int32 if dtype == torch.float16 else torch.int64
    write_matches_twin(spec, page_size, dtype, DEVICE, loc_dtype=loc_dtype, tokens=600)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("spec", ALL_LAYOUTS, ids=layout_id)
def test_write_matches_twin_soft(spec: LayoutSpec, dtype: torch.dtype, soft: bool) -> None:
    write_matches_twin(spec, 64, dtype, DEVICE, tokens=300)


@pytest.mark.parametrize("dtype", VALUE_DTYPES, ids=str)
@pytest.mark.parametrize("spec", SCALED_LAYOUTS, ids=layout_id)
def test_non_finite_writes_follow_the_twin(
    spec: LayoutSpec, dtype: torch.dtype, soft: bool
) -> None:
    write_matches_twin(spec, 4, dtype, DEVICE, non_finite=True)


@pytest.mark.parametrize(
    "spec",
    [V4, V41, V41_NEW, V41_FP4, V41_FP4_NEW, DSV4_INDEXER_FP4, DSV4_INDEXER_FP4_RNE],
    ids=layout_id,
)
def test_every_scale_byte_meets_every_code(spec: LayoutSpec, soft: bool) -> None:
    every_scale_meets_every_code(spec, DEVICE)


def test_indexer_fp8_reads_any_fp32_scale(soft: bool) -> None:
    fp32_scale_rows_any_bits(DSV4_INDEXER_FP8, DEVICE)


@pytest.mark.parametrize("spec", INDEXER_LAYOUTS, ids=layout_id)
def test_out_of_range_writes_are_refused_before_the_kernel(spec: LayoutSpec) -> None:
    refuses_out_of_range(spec, DEVICE)


def test_rocm_store_divides_and_takes_log2_as_torch() -> None:
    """Every fp32 from the store's floor 1e-8 up to 2**121 (about 1.2e9 values)."""
    rocm_scale_parts(DEVICE, exhaustive=True)


def test_dsa_reads_any_fp32_scale(soft: bool) -> None:
    dsa_scales_any_bits(DSA_FP8, DEVICE)


@pytest.mark.parametrize(
    "spec",
    [UNIFORM_FP8, *(s for s in ROW_LAYOUTS if s.output_dtype.itemsize == 1)],
    ids=layout_id,
)
def test_unscaled_fp8_rounding_grid(spec: LayoutSpec, soft: bool) -> None:
    rounding_grid(spec, DEVICE)


@pytest.mark.parametrize("spec", ALL_LAYOUTS, ids=layout_id)
def test_empty_loc(spec: LayoutSpec) -> None:
    empty_loc(spec, DEVICE)


@settings(max_examples=30)
@given(
    index=st.integers(0, len(ALL_LAYOUTS) - 1),
    page_size=st.integers(1, 6),
    rows=st.integers(1, 5),
    data=st.data(),
)
def test_random_distinct_locs_roundtrip(
    index: int, page_size: int, rows: int, data: st.DataObject
) -> None:
    spec = ALL_LAYOUTS[index]
    cap = rows * page_size if spec.paged else rows * 4
    picked = data.draw(st.lists(st.integers(0, cap - 1), unique=True, max_size=12), label="loc")
    loc = torch.tensor(picked, dtype=torch.int64)
    rows_total = rows if spec.paged else cap
    roundtrip_random(spec, page_size, loc, rows_total, seed=index + 7 * page_size, device=DEVICE)


@pytest.mark.parametrize("spec", ALL_LAYOUTS, ids=layout_id)
def test_many_tokens_many_programs(spec: LayoutSpec) -> None:
    """100k random tokens of a page-64 pool (many programs, ragged tail), read and write."""
    page_size, n = 64, 100_003
    rows = -(-2 * n // page_size) if spec.paged else 2 * n
    buf = make_buffer(spec, page_size, rows, seed=4, device=DEVICE)
    cap = rows * (page_size if spec.paged else 1)
    loc = torch.randperm(cap, device=DEVICE)[:n]
    twin = dequantize(spec, buf, loc, page_size, impl="torch")
    assert torch.equal(
        as_bytes(dequantize(spec, buf, loc, page_size, impl="triton")), as_bytes(twin)
    )
    values = tile_values(spec, n, seed=3, low=-6, high=6)
    if spec.unscaled_max is not None:
        values = values.clamp(-spec.unscaled_max, spec.unscaled_max)
    values = values.to(DEVICE, torch.bfloat16)
    theirs, ours = buf.clone(), buf.clone()
    quantize(spec, values, theirs, loc, page_size, impl="torch")
    quantize(spec, values, ours, loc.int(), page_size, impl="triton")
    assert torch.equal(as_bytes(ours), as_bytes(theirs))


def test_auto_takes_the_kernel_on_cuda_and_the_twin_where_none_serves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``impl="auto"`` (the default, and what adapters pass) launches the kernels for CUDA
    buffers, and falls back to the twin for an unaligned buffer or fp64 values."""
    from kvcompat.kernels import _launch

    calls: list[str] = []

    def recording(name: str) -> Any:
        launcher = getattr(_launch, name)

        def launch(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return launcher(*args, **kwargs)

        return launch

    for name in ("gather_dequantize", "quantize_scatter"):
        monkeypatch.setattr(_launch, name, recording(name))
    buf = make_buffer(V41, 64, 2, seed=0, device=DEVICE)
    loc = torch.tensor([3, 70], device=DEVICE)
    values = torch.randn(2, 512, device=DEVICE)
    dequantize(V41, buf, loc, 64)
    quantize(V41, values, buf, loc, 64)
    assert calls == ["gather_dequantize", "quantize_scatter"]
    calls.clear()
    quantize(V41, values.double(), buf, loc, 64)  # no kernel takes fp64 values
    flat = torch.zeros(2 * V41.page_bytes(64) + 8, dtype=torch.uint8, device=DEVICE)
    shifted = flat[8:].view(2, V41.page_bytes(64))  # 8-byte aligned, not 16
    dequantize(V41, shifted, loc, 64)
    assert calls == []


@pytest.mark.parametrize("spec", INDEXER_LAYOUTS, ids=layout_id)
def test_auto_serves_the_indexer_keys_with_a_kernel(spec: LayoutSpec) -> None:
    """The indexer layouts declare their kernels: ``impl="auto"`` takes them on CUDA."""
    from kvcompat.kernels import which_impl

    buf = make_buffer(spec, 64, 2, seed=0, device=DEVICE)
    for dtype in VALUE_DTYPES:
        for write in (False, True):
            choice = which_impl(spec, buf, write=write, values_dtype=dtype)
            assert (choice.impl, choice.fallback) == ("triton", False), choice


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
@pytest.mark.parametrize("spec", ALL_LAYOUTS, ids=layout_id)
def test_kernels_launch_on_the_buffers_device(spec: LayoutSpec) -> None:
    """A pool on the second GPU, read and written while the first is current (Triton
    launches on the current device): the launch follows the buffer."""
    with torch.cuda.device(0):
        read_matches_twin(spec, 64, torch.int64, "cuda:1", tokens=300)
        write_matches_twin(spec, 64, torch.bfloat16, "cuda:1", tokens=300)
    torch.cuda.synchronize(1)


@pytest.mark.parametrize(
    "spec",
    [V4, V41_NEW, V41_FP4, DSA_FP8, mha_layout(8, 128, torch.bfloat16), *INDEXER_LAYOUTS],
    ids=layout_id,
)
def test_cuda_graph_capture_and_replay(spec: LayoutSpec) -> None:
    """Read (with ``out``) and write (``validate=False``) captured once, replayed on new data."""
    page_size, n = 64, 512
    rows = 32 if spec.paged else 2048
    buf = make_buffer(spec, page_size, rows, seed=8, device=DEVICE)
    cap = rows * (page_size if spec.paged else 1)
    read_loc = torch.randperm(cap, device=DEVICE)[:n]
    write_loc = torch.randperm(cap, device=DEVICE)[:n]
    values = torch.randn(n, spec.dim, device=DEVICE, dtype=torch.bfloat16)
    out = torch.empty(n, spec.dim, dtype=spec.output_dtype, device=DEVICE)

    def step() -> None:
        dequantize(spec, buf, read_loc, page_size, impl="triton", validate=False, out=out)
        quantize(spec, values, buf, write_loc, page_size, impl="triton", validate=False)

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed in range(3):
        g = torch.Generator(device=DEVICE).manual_seed(seed)
        read_loc.copy_(torch.randperm(cap, device=DEVICE, generator=g)[:n])
        write_loc.copy_(torch.randperm(cap, device=DEVICE, generator=g)[:n])
        values.copy_(torch.randn(n, spec.dim, device=DEVICE, generator=g).to(torch.bfloat16))
        expected_buf = buf.clone()
        expected_out = dequantize(spec, expected_buf, read_loc, page_size, impl="torch")
        quantize(spec, values, expected_buf, write_loc, page_size, impl="torch")
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(as_bytes(out), as_bytes(expected_out))
        assert torch.equal(as_bytes(buf), as_bytes(expected_buf))


@pytest.mark.sglang
def test_sglang_v4_reader_agrees() -> None:
    reader = sglang_code(*places.V4_READER)
    buf = make_buffer(V4, 64, 64, seed=12, device=DEVICE)
    loc = torch.randperm(64 * 64, device=DEVICE)[:3000]
    theirs = reader(buf, loc, 64).reshape(-1, 512)
    ours = dequantize(V4, buf, loc, 64, impl="triton")
    # SGLang's kernel multiplies by exp2(byte - 127), which the GPU flushes to 0 for byte 0,
    # as the twin does; every other byte is an exact power of two.
    assert torch.equal(as_bytes(ours), as_bytes(theirs))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("spec", ALL_LAYOUTS, ids=layout_id)
def test_a_layered_launch_equals_one_twin_call_per_layer(
    spec: LayoutSpec, dtype: torch.dtype, soft: bool
) -> None:
    layered_matches_per_layer(spec, 64 if spec.paged else 1, dtype, "cuda")


def test_layered_raw_rows_on_strided_buffers() -> None:
    layered_rows_match("cuda")


@pytest.mark.parametrize("spec", ALL_LAYOUTS, ids=layout_id)
def test_one_launch_over_token_spaces_equals_the_twin_per_buffer(spec: LayoutSpec) -> None:
    spaces_match_per_space(spec, torch.bfloat16, "cuda")


def test_pool_to_pool_row_moves_on_strided_buffers() -> None:
    moved_rows_match("cuda")


@pytest.mark.parametrize("spec", ALL_LAYOUTS, ids=layout_id)
def test_a_strided_view_equals_its_rows_held_contiguously(spec: LayoutSpec, soft: bool) -> None:
    strided_matches_contiguous(spec, 64 if spec.paged else 1, torch.bfloat16, "cuda", ("triton",))


def _launches(spec: LayoutSpec, shifts: tuple[int, ...]) -> list[torch.Tensor]:
    """Reads and writes of ``spec`` into outputs and from values shifted by ``shifts``
    elements (bf16: 2 bytes each), so their addresses differ modulo 16 from one call to
    the next; the bytes of every output and the buffer after each write."""
    page_size, rows = 64, 8 if spec.paged else 512
    buf = make_buffer(spec, page_size, rows, seed=3, device=DEVICE)
    capacity = rows * (page_size if spec.paged else 1)
    results = []
    for index, (shift, n) in enumerate(zip(shifts, (33, 64, 17, 48, 1, 5), strict=False)):
        g = torch.Generator(device=DEVICE).manual_seed(index)
        loc = torch.randperm(capacity, device=DEVICE, generator=g)[:n]
        room = torch.empty(n * spec.dim + 8, dtype=spec.output_dtype, device=DEVICE)
        out = room[shift : shift + n * spec.dim].view(n, spec.dim)
        dequantize(spec, buf, loc, page_size, impl="triton", validate=False, out=out)
        values = torch.randn(n * spec.dim + 8, device=DEVICE, generator=g).to(torch.bfloat16)
        quantize(spec, values[shift : shift + n * spec.dim].view(n, spec.dim), buf, loc,
                 page_size, impl="triton", validate=False)  # fmt: skip
        results += [as_bytes(out).clone(), as_bytes(buf).clone()]
    torch.cuda.synchronize()
    return results


@pytest.mark.parametrize("spec", [V4, DSA_FP8, mha_layout(8, 128, torch.bfloat16)], ids=layout_id)
def test_a_warm_launch_equals_the_dispatchers(
    spec: LayoutSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Launches past the first skip Triton's dispatcher; they must pick the kernel it would.

    An aligned output first, then outputs and values 2, 4 and 8 bytes off 16 with the
    same token counts modulo 16: a signature that ignored an address's alignment would
    reuse the kernel compiled for 16-byte accesses and fault or write the wrong bytes.
    The second round is all warm launches (none reaches the dispatcher).
    """
    from kvcompat.kernels import _fast

    shifts = (0, 1, 2, 4, 0, 1)
    first = _launches(spec, shifts)
    cold_calls: list[object] = []
    remember = _fast._first
    monkeypatch.setattr(_fast, "_first", lambda *a: (cold_calls.append(a), remember(*a)))
    again = _launches(spec, shifts)
    assert cold_calls == []
    monkeypatch.setattr(_fast, "ENABLED", False)
    reference = _launches(spec, shifts)
    assert len(first) == len(again) == len(reference) == 2 * len(shifts)
    for ours, warm, theirs in zip(first, again, reference, strict=True):
        assert torch.equal(ours, theirs)
        assert torch.equal(warm, theirs)


def test_a_launch_hook_sees_every_launch() -> None:
    """A profiler's launch hook (Proton's way in) is called for warm launches too."""
    import triton

    from kvcompat.kernels import _fast

    assert _fast.ENABLED
    buf = make_buffer(V4, 64, 4, seed=1, device=DEVICE)
    loc = torch.arange(10, device=DEVICE)
    out = torch.empty(10, V4.dim, dtype=V4.output_dtype, device=DEVICE)
    for _ in range(2):  # the kernel is warm from here on
        dequantize(V4, buf, loc, 64, impl="triton", validate=False, out=out)
    seen: list[object] = []
    triton.knobs.runtime.launch_enter_hook.add(seen.append)
    try:
        for _ in range(3):
            dequantize(V4, buf, loc, 64, impl="triton", validate=False, out=out)
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(seen.append)
    assert len(seen) == 3


def test_warm_segment_launches_take_each_calls_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """One launch over three token spaces, then again with other counts of the same
    signature (equal modulo 16): the warm launch passes this call's counts, locations
    and row starts (the kernel's run-time scalars), not the first call's."""
    from kvcompat import _ops
    from kvcompat.kernels import _fast

    pages = (3, 5, 2)
    groups = [
        ([make_buffer(V4, page, 24, seed=10 * s + i, device=DEVICE) for i in range(2)], page)
        for s, page in enumerate(pages)
    ]
    plan = _ops.plan_spaces(V4, groups)
    assert plan.one_launch("triton", write=False, values_dtype=None)
    cold: list[object] = []
    remember = _fast._first
    for round_, counts in enumerate(((5, 3, 2), (21, 19, 18))):
        flat = torch.zeros(3 * 32, dtype=torch.int64, device=DEVICE)  # offsets 0, 32, 64
        for s, (page, count) in enumerate(zip(pages, counts, strict=True)):
            flat[32 * s : 32 * s + count] = torch.randperm(24 * page, device=DEVICE)[:count]
        locs = [flat[32 * s : 32 * s + count] for s, count in enumerate(counts)]
        ours = _ops.read_spaces(plan, locs, impl="triton", validate=False)
        twin = _ops.read_spaces(plan, locs, impl="torch")
        for got, want in zip(ours, twin, strict=True):
            assert torch.equal(as_bytes(got), as_bytes(want)), round_
        if round_ == 0:
            monkeypatch.setattr(_fast, "_first", lambda *a: (cold.append(a), remember(*a)))
    assert cold == []  # the second round was one warm launch
