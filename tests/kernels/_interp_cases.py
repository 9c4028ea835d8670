"""CPU tier: the Triton kernels under ``TRITON_INTERPRET=1`` against the torch twins.

Run by ``test_kernels_interpret.py`` in a fresh process with ``TRITON_INTERPRET=1`` set
before triton is imported (so no other test's triton is affected); anywhere else this
module skips itself before importing anything heavy.

What this tier proves byte for byte (uint8 views, ``rtol=0, atol=0``): the addressing of
every layout (page boundaries, the last token, odd page sizes, int32 and int64
locations, repeated read locations), that a write changes exactly the bytes the layout
documents (V4's pad byte, page padding and other tokens are untouched), and the values,
because the kernels' ``SOFT`` conversions are pure-integer arithmetic that the
interpreter executes exactly. What it cannot prove: the GPU's hardware conversions
(``cvt`` to fp8 / bf16, which the interpreter replaces by half-away-from-zero and
truncating roundings) and Triton's GPU code generation; ``test_kernels_gpu.py`` checks
those on an H200, hardware and ``SOFT`` paths both.
"""

from __future__ import annotations

import os

import pytest

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip(
        "run by test_kernels_interpret.py under TRITON_INTERPRET=1", allow_module_level=True
    )

import math

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
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcompat import LayoutError, WriteError
from kvcompat.kernels import _launch
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
    quantize,
)

pytestmark = pytest.mark.interpret

PAGED_PAGE_SIZES = (1, 3, 4, 64)
DEVICE = "cpu"


def test_kernels_are_interpreted() -> None:
    assert _launch.INTERPRETED


def _cases(page_sizes: tuple[int, ...]) -> list[tuple[object, int]]:
    cases: list[tuple[object, int]] = [(s, p) for s in PAGED_LAYOUTS for p in page_sizes]
    cases += [(s, 4) for s in ROW_LAYOUTS]
    return cases


def _ids(case: tuple[object, int]) -> str:
    spec, page_size = case
    return f"{spec.name}-P{page_size}"  # type: ignore[attr-defined]


@pytest.mark.parametrize("loc_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("case", _cases(PAGED_PAGE_SIZES), ids=_ids)
def test_read_matches_twin(case: tuple, loc_dtype: torch.dtype) -> None:
    spec, page_size = case
    read_matches_twin(spec, page_size, loc_dtype, DEVICE)


@pytest.mark.parametrize("dtype", VALUE_DTYPES, ids=str)
@pytest.mark.parametrize("case", _cases((1, 3, 64)), ids=_ids)
def test_write_matches_twin_and_touches_only_its_bytes(case: tuple, dtype: torch.dtype) -> None:
    spec, page_size = case
    loc_dtype = torch.int32 if dtype == torch.float16 else torch.int64
    write_matches_twin(spec, page_size, dtype, DEVICE, loc_dtype=loc_dtype)


@pytest.mark.parametrize("dtype", VALUE_DTYPES, ids=str)
@pytest.mark.parametrize("spec", SCALED_LAYOUTS, ids=layout_id)
def test_non_finite_writes_follow_the_twin(spec: object, dtype: torch.dtype) -> None:
    write_matches_twin(spec, 4, dtype, DEVICE, non_finite=True)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "spec",
    [V4, V41, V41_NEW, V41_FP4, V41_FP4_NEW, DSV4_INDEXER_FP4, DSV4_INDEXER_FP4_RNE],
    ids=layout_id,
)
def test_every_scale_byte_meets_every_code(spec: object) -> None:
    every_scale_meets_every_code(spec, DEVICE)  # type: ignore[arg-type]


def test_indexer_fp8_reads_any_fp32_scale() -> None:
    fp32_scale_rows_any_bits(DSV4_INDEXER_FP8, DEVICE)


@pytest.mark.parametrize("spec", INDEXER_LAYOUTS, ids=layout_id)
def test_out_of_range_writes_are_refused_before_the_kernel(spec: LayoutSpec) -> None:
    refuses_out_of_range(spec, DEVICE)


def test_rocm_store_divides_and_takes_log2_as_torch() -> None:
    rocm_scale_parts(DEVICE, exhaustive=False)


def test_dsa_reads_any_fp32_scale() -> None:
    dsa_scales_any_bits(DSA_FP8, DEVICE)


@pytest.mark.parametrize(
    "spec",
    [UNIFORM_FP8, *(s for s in ROW_LAYOUTS if s.output_dtype.itemsize == 1)],
    ids=layout_id,
)
def test_unscaled_fp8_rounding_grid(spec: object) -> None:
    rounding_grid(spec, DEVICE)  # type: ignore[arg-type]


@pytest.mark.parametrize("spec", ALL_LAYOUTS, ids=layout_id)
def test_empty_loc(spec: object) -> None:
    empty_loc(spec, DEVICE)  # type: ignore[arg-type]


@settings(max_examples=int(os.environ.get("KVCOMPAT_KERNEL_EXAMPLES", "40")))
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
    rows_total = rows if spec.paged else cap
    loc = torch.tensor(picked, dtype=torch.int64)
    roundtrip_random(spec, page_size, loc, rows_total, seed=index + 7 * page_size, device=DEVICE)


# ------------------------------------------------------ the seam around the kernels


def test_validation_runs_before_the_kernel() -> None:
    buf = make_buffer(V41, 4, 2, seed=0)
    before = buf.clone()
    values = torch.ones(2, 512)
    with pytest.raises(LayoutError, match="outside"):
        dequantize(V41, buf, torch.tensor([0, 8]), 4, impl="triton")
    with pytest.raises(WriteError, match="repeats"):
        quantize(V41, values, buf, torch.tensor([1, 1]), 4, impl="triton")
    with pytest.raises(WriteError, match="cannot be stored"):
        quantize(V41, values * math.nan, buf, torch.tensor([1, 2]), 4, impl="triton")
    assert torch.equal(buf, before)


def test_out_is_checked_and_filled() -> None:
    buf = make_buffer(V4, 4, 2, seed=0)
    loc = torch.tensor([7, 0])
    with pytest.raises(LayoutError, match="out must be"):
        dequantize(V4, buf, loc, 4, impl="triton", out=torch.empty(2, 512))
    out = torch.full((2, 512), 3.0, dtype=torch.bfloat16)
    assert dequantize(V4, buf, loc, 4, impl="triton", validate=False, out=out) is out
    assert torch.equal(as_bytes(out), as_bytes(dequantize(V4, buf, loc, 4, impl="torch")))


def test_calls_no_kernel_serves_raise_or_fall_back() -> None:
    buf = make_buffer(V4, 4, 2, seed=0)
    values = torch.ones(1, 512, dtype=torch.float64)
    with pytest.raises(NotImplementedError, match="bf16, fp16 or fp32"):
        quantize(V4, values, buf.clone(), torch.tensor([1]), 4, impl="triton")
    with pytest.raises(LayoutError, match="no fnuz variant"):
        quantize(V41, values.float(), buf.clone(), torch.tensor([1]), 4, impl="triton", fnuz=True)
    # "auto" takes the torch twin on CPU tensors, whatever the interpreter does.
    auto, twin = buf.clone(), buf.clone()
    quantize(V4, values, auto, torch.tensor([1]), 4)
    quantize(V4, values, twin, torch.tensor([1]), 4, impl="torch")
    assert torch.equal(auto, twin)
    flat = torch.zeros(2 * V41.page_bytes(4) + 8, dtype=torch.uint8)
    shifted = flat[8:].view(2, V41.page_bytes(4))  # 8-byte aligned, not 16
    with pytest.raises(NotImplementedError, match="16 bytes"):
        dequantize(V41, shifted, torch.tensor([0]), 4, impl="triton")


@pytest.mark.parametrize("spec", [V41_FP4, V41_FP4_NEW], ids=layout_id)
def test_fp4_write_of_unaligned_values(spec: LayoutSpec) -> None:
    """Values starting 2 bytes past a word boundary (a view into a larger tensor) are
    copied to an aligned buffer first; the bytes are the twin's."""
    storage = torch.randn(3 * spec.dim + 1).to(torch.bfloat16)
    values = storage[1:].view(3, spec.dim)
    assert values.data_ptr() % 8
    buf = make_buffer(spec, 4, 2, seed=9)
    ours, twin = buf.clone(), buf.clone()
    loc = torch.tensor([5, 0, 2])
    quantize(spec, values, ours, loc, 4, impl="triton")
    quantize(spec, values, twin, loc, 4, impl="torch")
    assert torch.equal(as_bytes(ours), as_bytes(twin))


@pytest.mark.parametrize("spec", ALL_LAYOUTS, ids=layout_id)
def test_a_layered_launch_equals_one_twin_call_per_layer(spec: LayoutSpec) -> None:
    layered_matches_per_layer(spec, 3 if spec.paged else 1, torch.bfloat16, "cpu")


@pytest.mark.parametrize("spec", ALL_LAYOUTS, ids=layout_id)
def test_one_launch_over_token_spaces_equals_the_twin_per_buffer(spec: LayoutSpec) -> None:
    spaces_match_per_space(spec, torch.bfloat16, "cpu")


def test_layered_raw_rows_on_strided_buffers() -> None:
    layered_rows_match("cpu")


def test_pool_to_pool_row_moves_on_strided_buffers() -> None:
    moved_rows_match("cpu")


@pytest.mark.parametrize("spec", ALL_LAYOUTS, ids=layout_id)
def test_a_strided_view_equals_its_rows_held_contiguously(spec: LayoutSpec) -> None:
    strided_matches_contiguous(spec, 3 if spec.paged else 1, torch.bfloat16, "cpu", ("triton",))
