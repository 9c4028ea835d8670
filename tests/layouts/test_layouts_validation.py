"""Bad inputs raise LayoutError/WriteError with a useful message and change nothing."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from _layout_cases import buffer_for, flat_bytes
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcompat import KVCompatError, LayoutError, WriteError
from kvcompat.layouts import (
    DSA_FP8,
    UNIFORM_FP8,
    V4,
    V41,
    LayoutSpec,
    check_read,
    check_write,
    dequantize,
    mha_layout,
    quantize,
)

PAGE = 4


def good(spec: LayoutSpec = V4) -> dict[str, object]:
    rows = 3 if spec.paged else 12
    return {
        "spec": spec,
        "buf": buffer_for(spec, PAGE, rows, seed=0),
        "loc": torch.tensor([1, 5, 7]),
        "values": torch.randn(3, spec.dim, dtype=torch.bfloat16),
        "page_size": PAGE,
    }


def _replace(**changes: object) -> Callable[[dict[str, object]], dict[str, object]]:
    def apply(case: dict[str, object]) -> dict[str, object]:
        return {**case, **changes}

    return apply


def _values(
    fn: Callable[[torch.Tensor], torch.Tensor],
) -> Callable[[dict[str, object]], dict[str, object]]:
    def apply(case: dict[str, object]) -> dict[str, object]:
        values = case["values"]
        assert isinstance(values, torch.Tensor)
        return {**case, "values": fn(values.clone())}

    return apply


def _poison(value: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def apply(values: torch.Tensor) -> torch.Tensor:
        values[1, 7] = value
        return values

    return apply


Mutation = Callable[[dict[str, object]], dict[str, object]]
STRIDED = torch.zeros(3, 2 * 2336, dtype=torch.uint8)[:, ::2]
META_LOC = torch.tensor([1, 5, 7], device="meta")
WRITE_CASES: list[tuple[str, Mutation, type, tuple[str, ...]]] = [
    ("loc-float", _replace(loc=torch.tensor([1.0, 5.0])), WriteError, ("integer", "float32")),
    ("loc-bool", _replace(loc=torch.tensor([True, False])), WriteError, ("integer", "bool")),
    ("loc-list", _replace(loc=[1, 5, 7]), WriteError, ("torch.Tensor", "list")),
    ("loc-2d", _replace(loc=torch.tensor([[1, 5, 7]])), WriteError, ("1-D", "(1, 3)")),
    ("loc-negative", _replace(loc=torch.tensor([1, -1, 7])), WriteError, ("[0, 12)", "-1")),
    ("loc-too-big", _replace(loc=torch.tensor([1, 12, 7])), WriteError, ("[0, 12)", "12")),
    ("loc-duplicate", _replace(loc=torch.tensor([5, 1, 5])), WriteError, ("repeats", "5")),
    ("loc-device", _replace(loc=META_LOC), WriteError, ("meta",)),
    ("values-int", _values(lambda v: v.to(torch.int32)), WriteError, ("floating", "int32")),
    ("values-list", _replace(values=[[0.0] * 512] * 3), WriteError, ("torch.Tensor",)),
    ("values-shape", _values(lambda v: v[:, :500]), WriteError, ("[3, 512]", "[3, 500]")),
    ("values-count", _values(lambda v: v[:2]), WriteError, ("len(loc) = 3", "[2, 512]")),
    ("values-3d", _values(lambda v: v.reshape(3, 2, 256)), WriteError, ("[3, 1, 512]",)),
    ("values-device", _values(lambda v: v.to("meta")), WriteError, ("meta",)),
    ("values-nan", _values(_poison(math.nan)), WriteError, ("nan", "token 1, column 7")),
    ("values-inf", _values(_poison(-math.inf)), WriteError, ("-inf", "check_finite=False")),
    ("page-size-zero", _replace(page_size=0), LayoutError, ("positive int", "0")),
    ("page-size-bool", _replace(page_size=True), LayoutError, ("positive int", "True")),
    ("page-size-float", _replace(page_size=4.0), LayoutError, ("positive int", "4.0")),
    ("page-size-wrong", _replace(page_size=8), LayoutError, ("page_size", "2880", "5184")),
    ("buf-list", _replace(buf=[0, 1]), LayoutError, ("torch.Tensor",)),
    ("buf-strided", _replace(buf=STRIDED), LayoutError, ("contiguous",)),
    ("buf-shape", _replace(buf=torch.zeros(3, 2000, dtype=torch.uint8)), LayoutError, ("2000",)),
    ("layout-unknown", _replace(spec="v5"), LayoutError, ("'v5'", "'v41_fp4'")),
]


@pytest.mark.parametrize(
    ("name", "mutate", "error", "fragments"), WRITE_CASES, ids=[c[0] for c in WRITE_CASES]
)
def test_bad_write_raises_and_changes_nothing(
    name: str,
    mutate: Callable[[dict[str, object]], dict[str, object]],
    error: type,
    fragments: tuple[str, ...],
) -> None:
    case = mutate(good())
    buf, loc, values = case["buf"], case["loc"], case["values"]
    snapshots = [
        t.clone() if isinstance(t, torch.Tensor) and t.device.type != "meta" else None
        for t in (buf, loc, values)
    ]
    with pytest.raises(error) as info:
        quantize(case["spec"], values, buf, loc, case["page_size"])  # type: ignore[arg-type]
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert isinstance(info.value, KVCompatError)
    assert isinstance(info.value, ValueError)
    for tensor, snapshot in zip((buf, loc, values), snapshots, strict=True):
        if snapshot is not None:
            assert isinstance(tensor, torch.Tensor)
            assert torch.equal(as_bytes(tensor), as_bytes(snapshot))


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """Bitwise view (NaN-safe comparison)."""
    return tensor.contiguous().view(torch.uint8)


def test_check_write_returns_normalised_inputs() -> None:
    case = good(V41)
    values = case["values"]
    assert isinstance(values, torch.Tensor)
    rows, loc = check_write(
        V41,
        case["buf"],  # type: ignore[arg-type]
        torch.tensor([1, 5, 7], dtype=torch.int16),
        values[:, None, :],
        PAGE,
    )
    assert rows.shape == (3, 512)
    assert loc.dtype == torch.int64
    before = flat_bytes(case["buf"]).clone()  # type: ignore[arg-type]
    quantize(V41, rows, case["buf"], loc, PAGE, validate=False)  # type: ignore[arg-type]
    assert not torch.equal(flat_bytes(case["buf"]), before)  # type: ignore[arg-type]


def test_all_loc_integer_dtypes_are_accepted() -> None:
    for dtype in (
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.uint16,
        torch.uint32,
        torch.uint64,
    ):
        case = good()
        quantize(V4, case["values"], case["buf"], torch.tensor([1, 5, 7], dtype=dtype), PAGE)  # type: ignore[arg-type]


def test_unscaled_layouts_reject_out_of_range_values() -> None:
    buf = buffer_for(UNIFORM_FP8, PAGE, 2, seed=0)
    before = buf.clone()
    values = torch.ones(2, 512)
    values[1, 3] = 449.0
    with pytest.raises(WriteError, match=r"449\.0.*\|x\| <= 448"):
        quantize(UNIFORM_FP8, values, buf, torch.tensor([0, 1]), PAGE)
    assert torch.equal(buf, before)
    fp16 = mha_layout(1, 4, torch.float16)
    with pytest.raises(WriteError, match="65504"):
        quantize(
            fp16,
            torch.tensor([[7e4, 0, 0, 0]]),
            torch.zeros(2, 1, 4, dtype=torch.float16),
            torch.tensor([0]),
            16,
        )


def test_check_finite_false_stores_non_finite_values() -> None:
    case = good(V41)
    values = case["values"]
    assert isinstance(values, torch.Tensor)
    values[0, 0] = math.nan
    quantize(V41, values, case["buf"], case["loc"], PAGE, check_finite=False)  # type: ignore[arg-type]
    out = dequantize(V41, case["buf"], case["loc"], PAGE)  # type: ignore[arg-type]
    assert bool(torch.isnan(out[0, 0]))  # stored as the NaN code, as the CUDA store does
    assert int(torch.isnan(out).sum()) == 1


def test_dsa_zero_tile_is_not_rejected() -> None:
    buf = buffer_for(DSA_FP8, PAGE, 4, seed=0)
    quantize(DSA_FP8, torch.zeros(1, 576), buf, torch.tensor([2]), PAGE)
    out = dequantize(DSA_FP8, buf, torch.tensor([2]), PAGE)
    assert bool((out == 0).all())


def test_fnuz_only_on_v4() -> None:
    case = good(V41)
    with pytest.raises(LayoutError, match="no fnuz variant"):
        quantize(V41, case["values"], case["buf"], case["loc"], PAGE, fnuz=True)  # type: ignore[arg-type]
    with pytest.raises(LayoutError, match="no fnuz variant"):
        dequantize(V41, case["buf"], case["loc"], PAGE, fnuz=True)  # type: ignore[arg-type]


READ_CASES = [
    ("loc-float", {"loc": torch.tensor([0.0])}, "integer"),
    ("loc-range", {"loc": torch.tensor([0, 12])}, "outside [0, 12)"),
    ("page-size", {"page_size": 3}, "page_size"),
    ("buf", {"buf": torch.zeros(2, 3)}, "bytes per row"),
]


@pytest.mark.parametrize(
    ("name", "changes", "fragment"), READ_CASES, ids=[c[0] for c in READ_CASES]
)
def test_bad_read_raises_layout_error(name: str, changes: dict[str, object], fragment: str) -> None:
    case = {**good(), **changes}
    with pytest.raises(LayoutError, match=fragment.replace("[", r"\[").replace(")", r"\)")):
        dequantize(V4, case["buf"], case["loc"], case["page_size"])  # type: ignore[arg-type]
    with pytest.raises(LayoutError):
        check_read(V4, case["buf"], case["loc"], case["page_size"])  # type: ignore[arg-type]


@st.composite
def bad_writes(
    draw: st.DrawFn,
) -> tuple[LayoutSpec, torch.Tensor, torch.Tensor, torch.Tensor, type]:
    """A write with one random defect: a location out of range, a repeated location, or a
    NaN/inf value at a random place."""
    spec = draw(st.sampled_from([V4, V41, UNIFORM_FP8, DSA_FP8]))
    rows = 3 if spec.paged else 12
    capacity = rows * (PAGE if spec.paged else 1)
    n = draw(st.integers(2, 8))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    loc = torch.randperm(capacity, generator=g)[:n]
    values = torch.randn(n, spec.dim, generator=g).to(torch.bfloat16)
    defect = draw(st.sampled_from(["range", "negative", "duplicate", "nan", "inf"]))
    error: type = WriteError
    if defect == "range":
        loc[draw(st.integers(0, n - 1))] = capacity + draw(st.integers(0, 1000))
    elif defect == "negative":
        loc[draw(st.integers(0, n - 1))] = -draw(st.integers(1, 1000))
    elif defect == "duplicate":
        i, j = draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=2, unique=True))
        loc[i] = loc[j]
    else:
        value = math.nan if defect == "nan" else -math.inf
        values[draw(st.integers(0, n - 1)), draw(st.integers(0, spec.dim - 1))] = value
    return spec, buffer_for(spec, PAGE, rows, seed), loc, values, error


@settings(max_examples=60, deadline=None)
@given(case=bad_writes())
def test_random_bad_writes_change_nothing(
    case: tuple[LayoutSpec, torch.Tensor, torch.Tensor, torch.Tensor, type],
) -> None:
    spec, buf, loc, values, error = case
    snapshots = [as_bytes(t).clone() for t in (buf, loc, values)]
    with pytest.raises(error):
        quantize(spec, values, buf, loc, PAGE)
    for tensor, snapshot in zip((buf, loc, values), snapshots, strict=True):
        assert torch.equal(as_bytes(tensor), snapshot)


@pytest.mark.parametrize("count", [1, 63, 64, 65, 300])
@pytest.mark.parametrize("fault", ["none", "repeat", "low", "high"])
def test_location_checks_agree_below_and_above_the_host_path_threshold(
    count: int, fault: str
) -> None:
    """Few locations are checked from one host copy, many by tensor reductions: same verdicts."""
    from kvcompat import WriteError
    from kvcompat.layouts._validate import check_loc

    loc = torch.randperm(1000)[:count]
    if fault == "repeat" and count > 1:
        loc[-1] = loc[0]
    elif fault == "low":
        loc[count // 2] = -1
    elif fault == "high":
        loc[count // 2] = 1000
    bad = fault in ("low", "high") or (fault == "repeat" and count > 1)
    for unique in (True, False):
        expect_error = fault in ("low", "high") or (bad and unique)
        if expect_error:
            with pytest.raises(WriteError, match=r"outside|repeats"):
                check_loc(loc, capacity=1000, device=loc.device, error=WriteError, unique=unique)
        else:
            got = check_loc(loc, capacity=1000, device=loc.device, error=WriteError, unique=unique)
            assert torch.equal(got, loc)
