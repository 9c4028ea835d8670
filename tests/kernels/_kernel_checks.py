"""Kernel-vs-twin checks shared by the CPU interpreter tier and the GPU tier.

Each function runs one comparison on ``device`` and asserts byte equality of uint8 views
(``rtol=0, atol=0``): the Triton path (``impl="triton"``) against the torch twin
(``impl="torch"``) on the same inputs. Importing this module does not import triton.
"""

from __future__ import annotations

import math

import pytest
import torch
from _kernel_cases import (
    as_bytes,
    capacity,
    edge_locs,
    exhaustive_rows,
    make_buffer,
    special_values,
    tile_values,
    writable_mask,
)

from kvcompat.layouts import LayoutSpec, dequantize, quantize
from kvcompat.layouts._addressing import scatter_rows


def _rows_for(spec: LayoutSpec, page_size: int, tokens: int) -> int:
    return -(-tokens // page_size) if spec.paged else tokens


def read_matches_twin(
    spec: LayoutSpec, page_size: int, loc_dtype: torch.dtype, device: str, *, tokens: int = 40
) -> None:
    from kvcompat.kernels import gather_dequantize

    rows = _rows_for(spec, page_size, tokens)
    buf = make_buffer(spec, page_size, rows, seed=page_size, device=device)
    cap = capacity(spec, buf, page_size)
    loc = edge_locs(spec, page_size, cap, seed=1, n=min(cap, 24))
    loc = torch.cat((loc, loc[:3])).to(device=device, dtype=loc_dtype)  # reads may repeat
    before = buf.clone()
    twin = dequantize(spec, buf, loc, page_size, impl="torch")
    ours = dequantize(spec, buf, loc, page_size, impl="triton")
    assert ours.dtype == twin.dtype
    assert ours.shape == twin.shape == (loc.numel(), spec.dim)
    assert torch.equal(as_bytes(ours), as_bytes(twin))
    out = torch.empty_like(twin)
    assert gather_dequantize(spec, buf, loc, page_size, out=out) is out
    assert torch.equal(as_bytes(out), as_bytes(twin))
    assert torch.equal(as_bytes(buf), as_bytes(before))
    if spec.supports_fnuz:
        twin = dequantize(spec, buf, loc, page_size, impl="torch", fnuz=True)
        ours = dequantize(spec, buf, loc, page_size, impl="triton", fnuz=True)
        assert torch.equal(as_bytes(ours), as_bytes(twin))


def write_matches_twin(
    spec: LayoutSpec,
    page_size: int,
    dtype: torch.dtype,
    device: str,
    *,
    non_finite: bool = False,
    loc_dtype: torch.dtype = torch.int64,
    tokens: int = 40,
) -> None:
    rows = _rows_for(spec, page_size, tokens)
    buf = make_buffer(spec, page_size, rows, seed=page_size + 1, device=device)
    cap = capacity(spec, buf, page_size)
    n = min(cap, 24)
    loc = edge_locs(spec, page_size, cap, seed=2, n=n)
    values = special_values(spec, n, seed=page_size, dtype=dtype, non_finite=non_finite)
    values = values.to(device)
    if spec.heads > 1:
        values = values.view(n, spec.heads, spec.dim // spec.heads)
    kept = values.clone()
    outside = ~writable_mask(spec, buf, loc.tolist(), page_size).to(device)
    for fnuz in (False, True) if spec.supports_fnuz else (False,):
        theirs, ours = buf.clone(), buf.clone()
        # The large tiles saturate fp4 (|x| > 2688), which only check_finite=False allows.
        saturates = spec.data_encoding.value == "e2m1x2"
        kwargs = {"check_finite": not (non_finite or saturates), "fnuz": fnuz}
        quantize(spec, values, theirs, loc.to(device), page_size, impl="torch", **kwargs)
        quantize(spec, values, ours, loc.to(device, loc_dtype), page_size, impl="triton", **kwargs)
        diff = as_bytes(ours) != as_bytes(theirs)
        assert not bool(diff.any()), (
            f"fnuz={fnuz}: {int(diff.sum())} bytes differ, first at {diff.nonzero()[:4].tolist()}"
        )
        assert torch.equal(as_bytes(ours)[outside], as_bytes(buf)[outside])
        assert torch.equal(as_bytes(values), as_bytes(kept))  # values untouched


def every_scale_meets_every_code(spec: LayoutSpec, device: str, *, page_size: int = 4) -> None:
    data, scale = exhaustive_rows(spec)
    n = data.shape[0]
    buf = torch.zeros(-(-n // page_size), spec.page_bytes(page_size), dtype=torch.uint8)
    loc = torch.randperm(n, generator=torch.Generator().manual_seed(3))
    scatter_rows(spec, buf, loc, page_size, data, scale[:, : spec.scale_bytes_written])
    buf, loc = buf.to(device), loc.to(device)
    for fnuz in (False, True) if spec.supports_fnuz else (False,):
        twin = dequantize(spec, buf, loc, page_size, impl="torch", fnuz=fnuz)
        ours = dequantize(spec, buf, loc, page_size, impl="triton", fnuz=fnuz)
        assert torch.equal(as_bytes(ours), as_bytes(twin))


def dsa_scales_any_bits(spec: LayoutSpec, device: str) -> None:
    """DSA rows whose fp32 scales are arbitrary bit patterns (NaN, inf, subnormal, 0)."""
    n = 300
    g = torch.Generator().manual_seed(5)
    raw = torch.randint(0, 256, (n, spec.data_bytes), generator=g).to(torch.uint8)
    tiles = (spec.value_dim or 0) // 128
    specials = torch.tensor(
        [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 1, 0x007FFFFF, 0x00800000,
         0x3F800000, 0x7F7FFFFF], dtype=torch.int64,
    )  # fmt: skip
    words = torch.randint(0, 1 << 32, (n, tiles), generator=g, dtype=torch.int64)
    words[: len(specials), 0] = specials
    raw[:, spec.value_dim : spec.value_dim + 4 * tiles] = (
        words.to(torch.int32).contiguous().view(torch.uint8).reshape(n, 4 * tiles)
    )
    buf = raw.view(n, 1, spec.data_bytes).to(device)
    loc = torch.randperm(n, generator=g).to(device)
    twin = dequantize(spec, buf, loc, 1, impl="torch")
    ours = dequantize(spec, buf, loc, 1, impl="triton")
    assert torch.equal(as_bytes(ours), as_bytes(twin))


def rounding_grid(spec: LayoutSpec, device: str) -> None:
    """Unscaled fp8 writes of every representable value, every midpoint and its neighbours."""
    fp8 = (
        spec.output_dtype
        if spec.scale_encoding is None and spec.output_dtype.itemsize == 1
        else (torch.float8_e4m3fn)
    )
    grid = torch.arange(256, dtype=torch.int64).to(torch.uint8).view(fp8).to(torch.float32)
    grid = grid[torch.isfinite(grid)].unique()
    mids = (grid[1:] + grid[:-1]) / 2
    near = torch.cat((mids, torch.nextafter(mids, mids + 1), torch.nextafter(mids, mids - 1)))
    values = torch.cat((grid, near, -near, torch.tensor([0.0, -0.0, 1e-30, -1e-30])))
    values = values[values.abs() <= float(torch.finfo(fp8).max)]
    dim = spec.dim
    count = -(-values.numel() // dim)
    padded = torch.zeros(count * dim)
    padded[: values.numel()] = values
    rows = padded.view(count, dim)
    if spec.paged:
        page_size = 2
        buf = torch.zeros(-(-count // page_size), spec.page_bytes(page_size), dtype=torch.uint8)
    else:
        page_size = 1
        buf = make_buffer(spec, 1, count, seed=0)
    buf = buf.to(device)
    loc = torch.randperm(count, generator=torch.Generator().manual_seed(1)).to(device)
    theirs, ours = buf.clone(), buf.clone()
    quantize(spec, rows.to(device), theirs, loc, page_size, impl="torch")
    quantize(spec, rows.to(device), ours, loc, page_size, impl="triton")
    assert torch.equal(as_bytes(ours), as_bytes(theirs))


def empty_loc(spec: LayoutSpec, device: str) -> None:
    page_size = 4
    buf = make_buffer(spec, page_size, 2 if spec.paged else 8, seed=9, device=device)
    before = buf.clone()
    loc = torch.empty(0, dtype=torch.int64, device=device)
    ours = dequantize(spec, buf, loc, page_size, impl="triton")
    assert ours.shape == (0, spec.dim)
    assert ours.dtype == spec.output_dtype
    out = torch.empty(0, spec.dim, dtype=spec.output_dtype, device=device)
    assert dequantize(spec, buf, loc, page_size, impl="triton", out=out) is out
    values = torch.empty(0, spec.dim, dtype=torch.bfloat16, device=device)
    quantize(spec, values, buf, loc, page_size, impl="triton")
    assert torch.equal(as_bytes(buf), as_bytes(before))


def roundtrip_random(
    spec: LayoutSpec, page_size: int, loc: torch.Tensor, rows: int, seed: int, device: str
) -> None:
    """Hypothesis body: write at distinct ``loc`` then read back, kernel vs twin."""
    buf = make_buffer(spec, page_size, rows, seed=seed, device=device)
    values = tile_values(spec, loc.numel(), seed=seed, low=-8, high=6)
    if spec.unscaled_max is not None:
        values = values.clamp(-spec.unscaled_max, spec.unscaled_max)
    values = values.to(device=device, dtype=torch.bfloat16)
    loc = loc.to(device)
    theirs, ours = buf.clone(), buf.clone()
    quantize(spec, values, theirs, loc, page_size, impl="torch")
    quantize(spec, values, ours, loc, page_size, impl="triton")
    assert torch.equal(as_bytes(ours), as_bytes(theirs))
    read_twin = dequantize(spec, ours, loc, page_size, impl="torch")
    read_ours = dequantize(spec, ours, loc, page_size, impl="triton")
    assert torch.equal(as_bytes(read_ours), as_bytes(read_twin))


def rocm_scale_parts(device: str, *, exhaustive: bool) -> None:
    """The ROCm V4 store's ``amax / 240`` and ``ceil(log2(s))`` against torch's, bit for bit.

    For fp32 from ``1e-8`` (the store's floor) to ``2**121`` (beyond ``fp32_max / 240``):
    every one (``exhaustive``, on a GPU), else the 64 smallest mantissas of every binade
    (where a ``log2`` can round down onto the integer) and 2**20 random ones. torch divides
    by a tensor: a Python-scalar divisor makes it multiply by the reciprocal on CUDA.
    """
    import triton
    from _arith_kernel import rocm_scale_parts_kernel

    lo = int(torch.tensor(1e-8).view(torch.int32))
    hi = int(torch.tensor(2.0**121).view(torch.int32))
    if exhaustive:
        chunks = [
            torch.arange(start, min(start + (1 << 26), hi), dtype=torch.int32, device=device)
            for start in range(lo, hi, 1 << 26)
        ]
    else:
        binades = torch.arange(lo >> 23, hi >> 23, dtype=torch.int32)
        small = ((binades[:, None] << 23) + torch.arange(64, dtype=torch.int32)).reshape(-1)
        g = torch.Generator().manual_seed(11)
        sampled = torch.randint(lo, hi, (1 << 20,), generator=g, dtype=torch.int32)
        chunks = [torch.cat((small[small >= lo], sampled)).to(device)]
    for bits in chunks:
        x = bits.view(torch.float32)
        quotient, ceil = torch.empty_like(x), torch.empty_like(bits)
        grid = (triton.cdiv(x.numel(), 4096),)
        rocm_scale_parts_kernel[grid](x, quotient, ceil, x.numel(), BLOCK=4096)
        ieee = x / torch.full_like(x, 240.0)
        wrong = quotient.view(torch.int32) != ieee.view(torch.int32)
        assert not bool(wrong.any()), f"x / 240 differs at {x[wrong][:4].tolist()}"
        wrong = ceil != torch.ceil(torch.log2(x)).to(torch.int32)
        assert not bool(wrong.any()), f"ceil(log2(x)) differs at {x[wrong][:4].tolist()}"


_FP32_SPECIAL_WORDS = (
    0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 1, 0x007FFFFF,
    0x00800000, 0x3F800000, 0x7F7FFFFF, 0xBF800000,
)  # fmt: skip
"""fp32 scale words of every kind: +-0, +-inf, NaNs, subnormals, the extremes, +-1."""


def fp32_scale_rows_any_bits(spec: LayoutSpec, device: str, *, page_size: int = 4) -> None:
    """fp32 scale rows (the fp8 indexer keys) of every kind against every e4m3 code.

    Each special scale word meets all 256 code bytes (two tokens of 128 codes), then
    random words and codes; reads are compared with the twin byte for byte (NaN included:
    both give every NaN as ``0x7FFFFFFF``).
    """
    specials = torch.tensor(_FP32_SPECIAL_WORDS, dtype=torch.int64)
    per_word = -(-256 // spec.data_bytes)
    n = len(specials) * per_word + 200
    g = torch.Generator().manual_seed(6)
    data = torch.randint(0, 256, (n, spec.data_bytes), generator=g).to(torch.uint8)
    codes = torch.arange(256, dtype=torch.int64).to(torch.uint8)
    words = torch.randint(0, 1 << 32, (n,), generator=g, dtype=torch.int64)
    for i, word in enumerate(specials.tolist()):
        rows = slice(i * per_word, (i + 1) * per_word)
        data[rows] = codes.reshape(per_word, spec.data_bytes)
        words[rows] = word
    scale = words.to(torch.int32).view(torch.uint8).reshape(n, 4)
    buf = torch.zeros(-(-n // page_size), spec.page_bytes(page_size), dtype=torch.uint8)
    loc = torch.randperm(n, generator=g)
    scatter_rows(spec, buf, loc, page_size, data, scale)
    buf, loc = buf.to(device), loc.to(device)
    twin = dequantize(spec, buf, loc, page_size, impl="torch")
    ours = dequantize(spec, buf, loc, page_size, impl="triton")
    assert torch.equal(as_bytes(ours), as_bytes(twin))
    assert bool(torch.isnan(twin).any())
    assert bool(torch.isinf(twin).any())


def refuses_out_of_range(spec: LayoutSpec, device: str, *, page_size: int = 4) -> None:
    """``check_finite=True`` writes of NaN, inf and (where the layout has one) values
    beyond its largest storable magnitude raise WriteError before any kernel runs: every
    byte of the buffer stays as it was."""
    from kvcompat import WriteError
    from kvcompat.layouts._validate import value_limits

    buf = make_buffer(spec, page_size, 3, seed=13, device=device)
    before = buf.clone()
    loc = torch.tensor([0, 5, 2 * page_size + 1], device=device)
    values = tile_values(spec, 3, seed=2).to(device)
    bad = [math.nan, math.inf, -math.inf]
    limit = min(run[3] for run in value_limits(spec))
    if limit < float(torch.finfo(torch.float32).max):
        bad.append(float(torch.nextafter(torch.tensor(limit), torch.tensor(math.inf))))
    for value in bad:
        poisoned = values.clone()
        poisoned[2, 7] = value
        with pytest.raises(WriteError, match="cannot be stored"):
            quantize(spec, poisoned, buf, loc, page_size, impl="triton")
        assert torch.equal(as_bytes(buf), as_bytes(before)), value


def layered_matches_per_layer(
    spec: LayoutSpec, page_size: int, dtype: torch.dtype, device: str, *, layers: int = 3
) -> None:
    """One layered launch == one single-layer twin call per layer, reads and writes.

    The layers are separate allocations (so their offsets from layer 0 are arbitrary,
    some negative), the locations cross pages in shuffled order, and only the written
    tokens' bytes may change, on every layer.
    """
    from kvcompat import _ops

    rows = _rows_for(spec, page_size, 40)
    bufs = [make_buffer(spec, page_size, rows, seed=7 * i + page_size, device=device)
            for i in range(layers)]  # fmt: skip
    bufs = bufs[::-1]  # later allocations first: negative offsets from layer 0
    cap = capacity(spec, bufs[0], page_size)
    n = min(cap, 16)
    loc = edge_locs(spec, page_size, cap, seed=3, n=n).to(device)
    for fnuz in (False, True) if spec.supports_fnuz else (False,):
        plan = _ops.plan_layers(spec, bufs, page_size, fnuz=fnuz)
        ours = _ops.read_layers(plan, loc, impl="triton")
        for i, buf in enumerate(bufs):
            twin = dequantize(spec, buf, loc, page_size, impl="torch", fnuz=fnuz)
            assert torch.equal(as_bytes(ours[i]), as_bytes(twin)), (spec.name, fnuz, i)
    values = torch.stack(
        [special_values(spec, n, seed=s, dtype=dtype, non_finite=False) for s in range(layers)]
    ).to(device)
    saturates = spec.data_encoding.value == "e2m1x2"
    theirs = [buf.clone() for buf in bufs]
    mine = [buf.clone() for buf in bufs]
    for i, buf in enumerate(theirs):
        quantize(spec, values[i], buf, loc, page_size, impl="torch", check_finite=not saturates)
    plan = _ops.plan_layers(spec, mine, page_size)
    _ops.write_layers(plan, loc, values, impl="triton", check_finite=not saturates)
    for i in range(layers):
        diff = as_bytes(mine[i]) != as_bytes(theirs[i])
        assert not bool(diff.any()), f"{spec.name} layer {i}: {int(diff.sum())} bytes differ"
    # Each layer its own locations (a sparse step's per-layer top-k): loc is [layers, n].
    rows = torch.stack([loc.roll(i) for i in range(layers)])
    plan = _ops.plan_layers(spec, mine, page_size)
    ours = _ops.read_layers(plan, rows, impl="triton")
    for i, buf in enumerate(mine):
        twin = dequantize(spec, buf, rows[i], page_size, impl="torch")
        assert torch.equal(as_bytes(ours[i]), as_bytes(twin)), (spec.name, "per-layer loc", i)
    for i, buf in enumerate(theirs):
        quantize(spec, values[i], buf, rows[i], page_size, impl="torch", check_finite=not saturates)
    _ops.write_layers(plan, rows, values, impl="triton", check_finite=not saturates)
    for i in range(layers):
        assert torch.equal(as_bytes(mine[i]), as_bytes(theirs[i])), (spec.name, "per-layer", i)


def spaces_match_per_space(spec: LayoutSpec, dtype: torch.dtype, device: str) -> None:
    """One launch over several token spaces == the twin per buffer, reads and writes.

    Three spaces of one layout with different page sizes, layer counts and location counts
    (a DeepSeek-V4 pool's sliding-window, c4 and c128 pages), buffers allocated in reverse
    (negative offsets from the first), locations in shuffled order, one space's as int32.
    Where the kernel takes several spaces the read comes back as views of one launch's
    output; elsewhere each space is its own launch. Only the written tokens change.
    """
    from kvcompat import _ops
    from kvcompat.kernels._plan import align_bytes, geometry, read_plan

    shapes = ((3, 3, 16), (2, 2, 5), (5, 1, 9))  # page size (tokens per row), layers, n
    if not spec.paged:
        shapes = tuple((1, layers, n) for _, layers, n in shapes)
    groups, locs = [], []
    for index, (page_size, layers, n) in enumerate(shapes):
        rows = _rows_for(spec, page_size, 40)
        bufs = [make_buffer(spec, page_size, rows, seed=11 * index + i, device=device)
                for i in range(layers)][::-1]  # fmt: skip
        cap = capacity(spec, bufs[0], page_size)
        loc = edge_locs(spec, page_size, cap, seed=index, n=min(n, cap))
        locs.append(loc.to(torch.int32 if index == 1 else torch.int64).to(device))
        groups.append((bufs, page_size))
    plan = _ops.plan_spaces(spec, groups)
    one = plan.one_launch("triton", write=False, values_dtype=None)
    tiles = read_plan(spec, fnuz=False)
    # The segmented launch takes 16-byte page pitches (every shipped layout's); others
    # (rows of 264 B, say) take one launch per space.
    pitches = [geometry(spec, page_size) for page_size, _, _ in shapes]
    aligned = all(align_bytes(g["PAGE_BYTES"], g["SCALE_BASE"]) == 16 for g in pitches)
    assert one == (not isinstance(tiles, str) and tiles.family == "read_fp8" and aligned), spec.name
    for validate in (True, False):
        ours = _ops.read_spaces(plan, locs, impl="triton", validate=validate)
        if one:  # one launch: every space is a slice of one output
            assert len({t.untyped_storage().data_ptr() for t in ours}) == 1, spec.name
        for space, ((bufs, page_size), loc) in enumerate(zip(groups, locs, strict=True)):
            for i, buf in enumerate(bufs):
                twin = dequantize(spec, buf, loc.long(), page_size, impl="torch")
                assert torch.equal(as_bytes(ours[space][i]), as_bytes(twin)), (spec.name, space, i)
    saturates = spec.data_encoding.value == "e2m1x2"
    values = [
        torch.stack([
            special_values(spec, int(loc.shape[0]), seed=7 * space + i, dtype=dtype,
                           non_finite=False)
            for i in range(len(bufs))
        ]).to(device)
        for space, ((bufs, _), loc) in enumerate(zip(groups, locs, strict=True))
    ]  # fmt: skip
    theirs = [[buf.clone() for buf in bufs] for bufs, _ in groups]
    for (_, page_size), loc, rows, copies in zip(groups, locs, values, theirs, strict=True):
        for i, buf in enumerate(copies):
            quantize(spec, rows[i], buf, loc.long(), page_size, impl="torch",
                     check_finite=not saturates)  # fmt: skip
    _ops.write_spaces([(plan, locs, values)], impl="triton", check_finite=not saturates)
    for space, ((bufs, _), copies) in enumerate(zip(groups, theirs, strict=True)):
        for i, (buf, copy) in enumerate(zip(bufs, copies, strict=True)):
            diff = as_bytes(buf) != as_bytes(copy)
            assert not bool(diff.any()), f"{spec.name} space {space} layer {i}: {int(diff.sum())}"


def layered_rows_match(device: str) -> None:
    """The raw multi-buffer row moves on strided rows: gather == index_select, scatter exact."""
    from kvcompat import _ops

    g = torch.Generator().manual_seed(5)
    backing = [torch.randint(0, 256, (9, 96), generator=g).to(torch.uint8).to(device)
               for _ in range(4)]  # fmt: skip
    srcs = [b[:, 16:56] for b in backing]  # 40-byte rows, 96 bytes apart
    rows = torch.tensor([8, 0, 3, 3], device=device)
    got = _ops.gather_rows_layers(srcs, rows, impl="triton")
    for i, src in enumerate(srcs):
        assert torch.equal(got[i], src[rows])
    before = [b.clone() for b in backing]
    payload = torch.randint(0, 256, (4, 2, 40), generator=g).to(torch.uint8).to(device)
    where = torch.tensor([7, 1], device=device)
    _ops.scatter_rows_layers(srcs, where, payload, impl="triton")
    for i, b in enumerate(backing):
        expect = before[i].clone()
        expect[where, 16:56] = payload[i]
        assert torch.equal(b, expect), i


def moved_rows_match(device: str) -> None:
    """Pool-to-pool row moves (a direct transfer) on strided rows of different pitches.

    Every destination row named gets its source row; every other byte of the destination
    (between rows, other rows) stays; the sources are unchanged.
    """
    from kvcompat import _ops

    g = torch.Generator().manual_seed(6)
    src_back = [torch.randint(0, 256, (9, 96), generator=g).to(torch.uint8).to(device)
                for _ in range(3)]  # fmt: skip
    dst_back = [torch.randint(0, 256, (7, 72), generator=g).to(torch.uint8).to(device)
                for _ in range(3)]  # fmt: skip
    srcs = [b[:, 16:56] for b in src_back]  # 40-byte rows, 96 bytes apart
    dsts = [b[:, 8:48] for b in dst_back]  # the same rows, 72 bytes apart
    take = torch.tensor([8, 0, 3, 3], device=device)
    put = torch.tensor([6, 1, 0, 4], device=device)
    sources = [b.clone() for b in src_back]
    expect = [b.clone() for b in dst_back]
    for i, e in enumerate(expect):
        e[put, 8:48] = sources[i][take, 16:56]
    _ops.move_rows_layers(srcs, take, dsts, put, impl="triton")
    for i in range(3):
        assert torch.equal(dst_back[i], expect[i]), i
        assert torch.equal(src_back[i], sources[i]), i


def strided_matches_contiguous(
    spec: LayoutSpec, page_size: int, dtype: torch.dtype, device: str, impls: tuple[str, ...]
) -> None:
    """A strided view's rows (pages or token rows ``pitch`` bytes apart) read and write as
    the same rows held contiguously, and a write touches nothing between the rows.

    The storage interleaves three layers row by row (a block-outer layout such as vLLM's
    ``BLHNC``); the view is the middle layer's rows.
    """
    rows = _rows_for(spec, page_size, max(40, 4 * page_size))  # several rows, so a stride
    dense = make_buffer(spec, page_size, rows, seed=page_size + 11, device=device)
    g = torch.Generator().manual_seed(3)

    def row_bytes(t: torch.Tensor) -> torch.Tensor:
        return t.view(torch.uint8).reshape(rows, -1)

    width = row_bytes(dense).shape[1]
    pad = 0 if spec.paged else -width % 16  # token rows: every row 16-byte aligned
    backing = torch.randint(0, 256, (rows, 3, width + pad), generator=g)
    backing = backing.to(torch.uint8).to(device)
    backing[:, 1, :width] = row_bytes(dense)
    view = backing[:, 1, :width]
    if dense.dtype != torch.uint8:
        view = view.view(dense.dtype).view(dense.shape)
    assert not view.is_contiguous()
    cap = capacity(spec, dense, page_size)
    n = min(cap, 16)
    loc = edge_locs(spec, page_size, cap, seed=4, n=n).to(device)
    values = special_values(spec, n, seed=2, dtype=dtype, non_finite=False).to(device)
    saturates = spec.data_encoding.value == "e2m1x2"
    for impl in impls:
        strided_read = dequantize(spec, view, loc, page_size, impl=impl)
        dense_read = dequantize(spec, dense, loc, page_size, impl=impl)
        assert torch.equal(as_bytes(strided_read), as_bytes(dense_read)), (spec.name, impl)
        before = backing.clone()
        mine, theirs = view, dense.clone()
        quantize(spec, values, mine, loc, page_size, impl=impl, check_finite=not saturates)
        quantize(spec, values, theirs, loc, page_size, impl="torch", check_finite=not saturates)
        assert torch.equal(backing[:, 1, :width], row_bytes(theirs)), (spec.name, impl)
        assert torch.equal(backing[:, 1, width:], before[:, 1, width:]), (spec.name, impl)
        assert torch.equal(backing[:, 0], before[:, 0]), (spec.name, impl)
        assert torch.equal(backing[:, 2], before[:, 2]), (spec.name, impl)
        backing.copy_(before)
