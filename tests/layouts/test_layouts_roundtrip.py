"""Property tests: write then read within each layout's error bound, touching only the
written tokens' bytes, never modifying the caller's tensors."""

from __future__ import annotations

import pytest
import torch
from _layout_cases import (
    ALL_LAYOUTS,
    buffer_for,
    capacity,
    flat_bytes,
    layout_id,
    tile_values,
    writable_mask,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcompat.layouts import (
    DSA_FP8,
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
from kvcompat.layouts._addressing import gather_rows

SETTINGS = settings(max_examples=25, deadline=None)
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@st.composite
def writes(draw: st.DrawFn, spec: LayoutSpec) -> dict[str, object]:
    """A buffer, distinct locations and values for one write to ``spec``."""
    page_size = draw(st.sampled_from([1, 2, 4, 16, 64])) if spec.paged else 16
    rows = draw(st.integers(1, 3)) if spec.paged else draw(st.integers(1, 40))
    cap = rows * (page_size if spec.paged else 1)
    n = draw(st.integers(0, min(cap, 12)))
    seed = draw(st.integers(0, 2**31 - 1))
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    low = draw(st.integers(-18, 6))
    high = draw(st.integers(low, 8 if spec is not UNIFORM_FP8 else 7))
    if dtype == torch.float16:  # keep values representable in fp16
        low = max(low, -12)
        high = max(low, min(high, 12))
    loc = torch.randperm(cap, generator=torch.Generator().manual_seed(seed))[:n]
    values = tile_values(n, spec, seed=seed, dtype=dtype, low=low, high=high)
    if spec is UNIFORM_FP8 or spec.scale_encoding is None:
        limit = spec.unscaled_max or 1.0
        values = values.float().clamp(-limit, limit).to(dtype)
    if n and draw(st.booleans()):  # an all-zero tile
        values[0, : min(spec.tile_size, spec.dim)] = 0.0
    loc_dtype = draw(st.sampled_from([torch.int64, torch.int32]))
    return {
        "buf": buffer_for(spec, page_size, rows, seed),
        "loc": loc.to(loc_dtype),
        "values": values,
        "page_size": page_size,
    }


def error_bound(
    spec: LayoutSpec, buf: torch.Tensor, loc: torch.Tensor, page_size: int, x: torch.Tensor
) -> torch.Tensor:
    """The documented per-value bound |x' - x| <= bound(x, stored scale)."""
    _, scale_bytes = gather_rows(spec, buf, loc.long(), page_size)
    if spec.max_error is not None:  # the layout declares its bound: nothing to add here
        return spec.max_error(x, scale_bytes)
    ax = x.abs()
    if spec in (V4, V41, V41_NEW):
        width = 448 if spec is V4 else 512
        s = torch.exp2(scale_bytes[:, : width // spec.tile_size].float() - 127)
        s = s.repeat_interleave(spec.tile_size, dim=1)
        bound = torch.zeros_like(x)
        bound[:, :width] = 2.0**-4 * ax[:, :width] + 2.0**-10 * s
        if spec is V4:  # rope: one bf16 rounding (none for bf16 input)
            bound[:, 448:] = 2.0**-8 * ax[:, 448:]
        return bound
    if spec in (V41_FP4, V41_FP4_NEW):
        s = scale_bytes.contiguous().view(torch.float8_e4m3fn).float()
        s = s.repeat_interleave(16, dim=1)
        return torch.maximum(0.25 * torch.maximum(ax, s), ax - 6 * s) * (1 + 1e-6)
    if spec is UNIFORM_FP8:
        return torch.maximum(2.0**-4 * ax, torch.full_like(ax, 2.0**-10))
    if spec.name.startswith("dsa_fp8"):
        data, _ = gather_rows(spec, buf, loc.long(), page_size)
        rank = spec.value_dim or 0
        s = data[:, rank : rank + rank // 32].contiguous().view(torch.float32)
        s = s.repeat_interleave(128, dim=1)
        bound = torch.zeros_like(x)
        bound[:, :rank] = 0.07 * ax[:, :rank] + 2.0**-9 * s
        bound[:, rank:] = 2.0**-8 * ax[:, rank:]
        return bound
    raise AssertionError(spec.name)


def check_write_then_read(spec: LayoutSpec, case: dict[str, object]) -> None:
    buf, loc, values, page_size = case["buf"], case["loc"], case["values"], case["page_size"]
    assert isinstance(buf, torch.Tensor)
    assert isinstance(loc, torch.Tensor)
    assert isinstance(values, torch.Tensor)
    assert isinstance(page_size, int)
    before, values_before, loc_before = flat_bytes(buf).clone(), values.clone(), loc.clone()

    quantize(spec, values, buf, loc, page_size)

    # The caller's tensors are untouched, and only the written tokens' bytes may change.
    assert torch.equal(values, values_before)
    assert torch.equal(loc, loc_before)
    changed = flat_bytes(buf) != before
    allowed = writable_mask(spec, buf, loc.tolist(), page_size)
    assert not bool((changed & ~allowed).any())

    out = dequantize(spec, buf, loc, page_size)
    assert out.shape == (loc.numel(), spec.dim)
    assert out.dtype == spec.output_dtype
    if spec.scale_encoding is None and spec is not UNIFORM_FP8:  # plain MHA / MLA rows
        expected = values.to(spec.output_dtype)
        assert torch.equal(out.view(torch.uint8), expected.view(torch.uint8))
        return
    x = values.float()
    error = (out.float() - x).abs()
    bound = error_bound(spec, buf, loc, page_size, x)
    assert bool((error <= bound).all()), float((error - bound).max())


@pytest.mark.parametrize("spec", ALL_LAYOUTS, ids=layout_id)
def test_write_then_read(spec: LayoutSpec) -> None:
    @SETTINGS
    @given(case=writes(spec))
    def run(case: dict[str, object]) -> None:
        check_write_then_read(spec, case)

    run()


@pytest.mark.parametrize("spec", ALL_LAYOUTS, ids=layout_id)
def test_rewriting_one_token_leaves_the_others(spec: LayoutSpec) -> None:
    page_size = 4
    buf = buffer_for(spec, page_size, 3 if spec.paged else 12, seed=1)
    cap = capacity(spec, buf, page_size)
    loc = torch.arange(cap)
    values = tile_values(cap, spec, seed=2, dtype=torch.bfloat16, low=-4, high=4)
    quantize(spec, values, buf, loc, page_size)
    first = dequantize(spec, buf, loc, page_size)
    quantize(spec, values[5:6] * 2, buf, loc[5:6], page_size)
    second = dequantize(spec, buf, loc, page_size)
    keep = torch.ones(cap, dtype=torch.bool)
    keep[5] = False
    assert torch.equal(first[keep].view(torch.uint8), second[keep].view(torch.uint8))
    # Writing the same values again gives the same bytes (the store is deterministic).
    snapshot = flat_bytes(buf).clone()
    quantize(spec, values[5:6] * 2, buf, loc[5:6], page_size)
    assert torch.equal(flat_bytes(buf), snapshot)


@pytest.mark.parametrize("spec", [V4, V41, DSA_FP8], ids=layout_id)
def test_value_shapes_are_equivalent(spec: LayoutSpec) -> None:
    values = tile_values(3, spec, seed=3, dtype=torch.bfloat16)
    loc = torch.tensor([2, 0, 5])
    results = []
    for shaped in (values, values[:, None, :]):
        buf = buffer_for(spec, 4, 2 if spec.paged else 8, seed=0)
        quantize(spec, shaped, buf, loc, 4)
        results.append(flat_bytes(buf))
    assert torch.equal(results[0], results[1])


def test_mha_accepts_head_shaped_values() -> None:
    from kvcompat.layouts import mha_layout

    spec = mha_layout(4, 8, torch.bfloat16)
    values = torch.randn(3, 4, 8)
    a, b = buffer_for(spec, 16, 8, seed=0), buffer_for(spec, 16, 8, seed=0)
    quantize(spec, values, a, torch.tensor([1, 2, 3]), 16)
    quantize(spec, values.reshape(3, 32), b, torch.tensor([1, 2, 3]), 16)
    assert torch.equal(flat_bytes(a), flat_bytes(b))


def test_v4_pad_byte_and_page_padding_are_never_written() -> None:
    page_size = 2
    buf = torch.full((2, V4.page_bytes(page_size)), 0xAB, dtype=torch.uint8)
    quantize(V4, torch.randn(4, 512), buf, torch.arange(4), page_size)
    for slot in range(page_size):
        assert int(buf[0, page_size * 576 + slot * 8 + 7]) == 0xAB
    padding = buf[:, page_size * 584 :]
    assert padding.numel() == 2 * 560
    assert bool((padding == 0xAB).all())


@pytest.mark.parametrize("spec", [V4, V41, UNIFORM_FP8, DSA_FP8], ids=layout_id)
def test_reads_may_repeat_locations(spec: LayoutSpec) -> None:
    buf = buffer_for(spec, 4, 2 if spec.paged else 8, seed=9)
    loc = torch.tensor([3, 3, 0, 3])
    out = dequantize(spec, buf, loc, 4)
    assert torch.equal(
        out[0].view(torch.int16 if out.dtype.itemsize == 2 else torch.uint8),
        out[1].view(torch.int16 if out.dtype.itemsize == 2 else torch.uint8),
    )


@pytest.mark.parametrize("spec", ALL_LAYOUTS, ids=layout_id)
def test_empty_read_and_write(spec: LayoutSpec) -> None:
    buf = buffer_for(spec, 4, 2, seed=0)
    before = flat_bytes(buf).clone()
    empty = torch.zeros(0, dtype=torch.int64)
    quantize(spec, torch.zeros(0, spec.dim), buf, empty, 4)
    assert torch.equal(flat_bytes(buf), before)
    assert dequantize(spec, buf, empty, 4).shape == (0, spec.dim)


@pytest.mark.parametrize("fnuz", [False, True])
def test_v4_flavours_write_different_bytes(fnuz: bool) -> None:
    values = tile_values(4, V4, seed=5, dtype=torch.bfloat16, low=-3, high=3)
    a = buffer_for(V4, 4, 1, seed=0)
    quantize(V4, values, a, torch.arange(4), 4, fnuz=fnuz)
    out = dequantize(V4, a, torch.arange(4), 4, fnuz=fnuz)
    assert bool(((out.float() - values.float()).abs() <= values.float().abs() / 8 + 1e-3).all())
    # Reading with the other flavour misreads: the bytes are not interchangeable.
    wrong = dequantize(V4, a, torch.arange(4), 4, fnuz=not fnuz)
    assert not torch.equal(wrong.view(torch.int16), out.view(torch.int16))


@pytest.mark.parametrize("spec", [V4, V41_FP4, DSA_FP8], ids=layout_id)
def test_cpu_chunking_does_not_change_bytes(
    spec: LayoutSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvcompat.layouts._codec as codec

    values = tile_values(11, spec, seed=8, dtype=torch.bfloat16)
    loc = torch.tensor([0, 9, 3, 5, 1, 7, 11, 2, 4, 10, 6])
    whole = buffer_for(spec, 4, 3 if spec.paged else 12, seed=1)
    chunked = whole.clone()
    quantize(spec, values, whole, loc, 4)
    monkeypatch.setattr(codec, "CPU_CHUNK_TOKENS", 3)
    quantize(spec, values, chunked, loc, 4)
    assert torch.equal(flat_bytes(whole), flat_bytes(chunked))
    read_chunked = dequantize(spec, chunked, loc, 4)
    monkeypatch.setattr(codec, "CPU_CHUNK_TOKENS", 4096)
    assert torch.equal(
        read_chunked.view(torch.int16), dequantize(spec, whole, loc, 4).view(torch.int16)
    )
