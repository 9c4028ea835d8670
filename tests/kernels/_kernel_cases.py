"""Shared cases of the kernel tests (CPU interpreter tier and GPU tier).

Importing this module imports neither triton nor kvcompat.kernels' launchers.
"""

from __future__ import annotations

import math

import torch

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
    dsa_fp8_layout,
    mha_layout,
    mla_layout,
)
from kvcompat.layouts._spec import Encoding

DSV4_LAYOUTS: tuple[LayoutSpec, ...] = (V4, V41, V41_FP4, UNIFORM_FP8, V41_NEW, V41_FP4_NEW)
INDEXER_LAYOUTS: tuple[LayoutSpec, ...] = (DSV4_INDEXER_FP8, DSV4_INDEXER_FP4, DSV4_INDEXER_FP4_RNE)
PAGED_LAYOUTS = DSV4_LAYOUTS + INDEXER_LAYOUTS
ROW_LAYOUTS: tuple[LayoutSpec, ...] = (
    DSA_FP8,
    dsa_fp8_layout(256, 0),
    dsa_fp8_layout(384, 64),
    mha_layout(2, 8, torch.bfloat16),
    mha_layout(8, 128, torch.bfloat16),
    mha_layout(4, 16, torch.float8_e4m3fn),
    mha_layout(1, 24, torch.float16),
    mha_layout(2, 12, torch.float8_e4m3fnuz),
    mla_layout(32, 16, torch.bfloat16),
    mla_layout(512, 64, torch.bfloat16),
    mla_layout(64, 0, torch.float8_e5m2),
    mla_layout(16, 8, torch.float32),
    mla_layout(3, 2, torch.float16),
)
ALL_LAYOUTS = PAGED_LAYOUTS + ROW_LAYOUTS
SCALED_LAYOUTS = tuple(spec for spec in ALL_LAYOUTS if spec.scale_encoding is not None)
VALUE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def layout_id(spec: LayoutSpec) -> str:
    return spec.name


def per_row(spec: LayoutSpec, page_size: int) -> int:
    return page_size if spec.paged else 1


def make_buffer(
    spec: LayoutSpec, page_size: int, rows: int, *, seed: int, device: str = "cpu"
) -> torch.Tensor:
    """Random bytes shaped as SGLang allocates ``spec``'s buffer (every byte value occurs)."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (rows, spec.page_bytes(per_row(spec, page_size))), generator=g)
    raw = raw.to(torch.uint8)
    if not spec.paged:
        if spec.heads > 1:
            raw = raw.view(rows, spec.heads, spec.data_bytes // spec.heads)
        else:
            raw = raw.view(rows, 1, spec.data_bytes)
        raw = raw.view(spec.output_dtype)
    return raw.to(device)


def capacity(spec: LayoutSpec, buf: torch.Tensor, page_size: int) -> int:
    return buf.shape[0] * per_row(spec, page_size)


def edge_locs(spec: LayoutSpec, page_size: int, cap: int, *, seed: int, n: int) -> torch.Tensor:
    """Distinct locations: page boundaries, the first and last token, then random ones."""
    step = per_row(spec, page_size)
    edges = {0, cap - 1}
    for page in range(0, cap, step):
        edges.update({page, min(page + step - 1, cap - 1)})
    chosen = sorted(edges)[: n // 2]
    g = torch.Generator().manual_seed(seed)
    rest = [int(i) for i in torch.randperm(cap, generator=g) if int(i) not in set(chosen)]
    picked = chosen + rest[: max(0, n - len(chosen))]
    order = torch.randperm(len(picked), generator=g)
    return torch.tensor(picked, dtype=torch.int64)[order]


def tile_values(
    spec: LayoutSpec, n: int, *, seed: int, low: int = -20, high: int = 10
) -> torch.Tensor:
    """fp32 ``[n, dim]`` values whose tiles have magnitudes ``2**low .. 2**high``."""
    g = torch.Generator().manual_seed(seed)
    tile = min(spec.tile_size, spec.dim)
    tiles = -(-spec.dim // tile)
    mags = torch.exp2(torch.randint(low, high + 1, (n, tiles, 1), generator=g).float())
    values = (torch.randn(n, tiles, tile, generator=g) * mags).reshape(n, tiles * tile)
    return values[:, : spec.dim].contiguous()


def special_values(
    spec: LayoutSpec, n: int, *, seed: int, dtype: torch.dtype, non_finite: bool
) -> torch.Tensor:
    """Random tiles plus zeros, e4m3/e2m1 ties, values below every floor, huge tiles."""
    values = tile_values(spec, max(n, 14), seed=seed)
    tile = min(spec.tile_size, spec.dim)
    if spec.data_encoding is Encoding.E2M1X2 and spec.scale_encoding is Encoding.UE8M0:
        values[11:14] = pow2_e2m1_ties(spec.dim, spec.tile_size, dtype).float()
    elif spec.data_encoding is Encoding.E2M1X2:
        values[11:14] = e2m1_ties(spec.dim, dtype).float()
    elif spec.scale_encoding is Encoding.FP32 and spec.scale_bytes:  # the fp8 indexer keys
        values[11:14] = fp32_scale_edges(spec.dim, dtype).float()
    if spec.supports_fnuz:
        values[11:14, : spec.tile_size * 7] = power_edge_tiles(spec.tile_size)
    values[0, :tile] = 0.0
    values[1, :tile] = torch.arange(tile).float() * 0.25 - 2.0  # ties
    values[2, :tile] = 1e-6  # below every floor
    values[8, :tile] = torch.arange(tile).float() * 0.0625 + 1.03125  # e4m3 ties after scaling
    values[9, :] = 3.0e4  # large tiles (fp16-safe)
    values[10, :tile] = -1e-30  # negatives that round to zero
    limit = spec.unscaled_max
    if dtype == torch.float16:
        limit = min(limit or math.inf, 6.0e4)
    if limit is not None:
        values = values.clamp(-limit, limit)
    if non_finite:
        values[3, 3] = math.nan
        values[4, 5] = math.inf
        values[5, 1] = -math.inf
        values[6, :] = math.nan
        values[7, :16] = -math.nan
    return values[:n].to(dtype)


def power_edge_tiles(tile: int) -> torch.Tensor:
    """Three rows of seven fp32 tiles whose scale quotient sits on or just above a power of 2.

    Row 0: amax ``240 * 2**k`` (the ROCm store's quotient is exactly ``2**k``); row 1:
    the same plus ``t + 1`` units in the last place, where an fp32 ``log2`` may round down
    onto ``k``; row 2: ``448 * 2**k`` plus ``t`` units (the CUDA store's boundary). The
    other values of each tile are fractions of its amax, both signs.
    """
    rows = torch.empty(3, 7, tile)
    fractions = torch.linspace(-0.97, 0.97, tile - 1)
    for t in range(7):
        exact = torch.tensor(240.0 * 2.0 ** (t - 6))
        amaxes = (
            exact,
            (exact.view(torch.int32) + (t + 1)).view(torch.float32),
            (torch.tensor(448.0 * 2.0 ** (t - 8)).view(torch.int32) + t).view(torch.float32),
        )
        for r, amax in enumerate(amaxes):
            rows[r, t, 0] = amax
            rows[r, t, 1:] = amax * fractions
    return rows.reshape(3, 7 * tile)


def pow2_e2m1_ties(dim: int, group: int, dtype: torch.dtype) -> torch.Tensor:
    """Three ``[dim]`` rows of ``group``-value tiles on e2m1's rounding boundaries, for
    power-of-two scales (the fp4 indexer keys).

    Each tile's amax is ``6 * 2**k``, so ``amax / 6`` is exactly ``2**k`` and the scale is
    ``s = 2**k``; the tile holds ``+-m * s`` for every midpoint ``m`` (exact ties of
    ``x / s``) and every e2m1 magnitude, then (rows 1 and 2) the same values one unit in
    the last place of ``dtype`` above and below (the amax and the zeros kept).
    """
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    grid = torch.tensor([0.5, 1.0, 1.5, 2.0, 3.0, 4.0])  # 6 is the amax, kept unperturbed
    small = torch.tensor([-1 / 16, 1 / 16, -0.1])  # round to zero: no sign bit on code 0
    tiles, steps = [], []
    exponents = (-9, -1, 0, 6)
    for t in range(dim // group):
        s = 2.0 ** exponents[t % len(exponents)]
        body = torch.cat([mids, -mids, grid, -grid, small])[: group - 3] * s
        tile = torch.cat([torch.tensor([6 * s]), body, torch.zeros(group - 1 - body.numel())])
        tile[-1] = -0.0
        tiles.append(tile)
        steps.append(torch.cat([torch.zeros(1), torch.ones(body.numel()),
                                torch.zeros(group - 1 - body.numel())]))  # fmt: skip
    row = torch.cat(tiles).to(dtype)
    bits = row.view(torch.int16 if dtype.itemsize == 2 else torch.int32)
    step = torch.cat(steps).to(bits.dtype)
    return torch.stack([row, (bits + step).view(dtype), (bits - step).view(dtype)])


def fp32_scale_edges(dim: int, dtype: torch.dtype) -> torch.Tensor:
    """Three ``[dim]`` rows for fp32-scaled e4m3 keys: e4m3 subnormal codes, fp32-subnormal
    inputs, and values on e4m3 ties at the scale ``448 / 448 = 1``.

    Row 0: amax 448 (scale 1) with the rest from ``2**-12`` to ``2**-5`` (e4m3's subnormal
    range and its edge). Row 1: tiny inputs (``dtype``'s subnormals; amax below the
    ``1e-4`` floor). Row 2: amax 448 and the midpoints between neighbouring e4m3 values.
    """
    rows = torch.zeros(3, dim)
    rows[0, 0] = 448.0
    signs = torch.tensor([1.0, -1.0]).repeat(dim)[: dim - 1]
    rows[0, 1:] = torch.exp2(torch.linspace(-12.0, -5.0, dim - 1)) * signs
    tiny = torch.finfo(dtype).tiny
    rows[1] = torch.linspace(-1.0, 1.0, dim) * tiny
    grid = torch.arange(0x38, 0x7F, dtype=torch.int64).to(torch.uint8).view(torch.float8_e4m3fn)
    grid = grid.to(torch.float32)
    mids = (grid[1:] + grid[:-1]) / 2
    rows[2, 0] = 448.0
    rows[2, 1:] = mids.repeat(-(-(dim - 1) // mids.numel()))[: dim - 1]
    return rows.to(dtype)


def e2m1_ties(dim: int, dtype: torch.dtype) -> torch.Tensor:
    """Three ``[dim]`` rows of 16-value tiles on e2m1's rounding boundaries.

    Each tile's amax is ``6 * s`` for an e4m3 value ``s`` (so its scale is ``s`` itself) and
    it holds ``+-m * s`` for every midpoint ``m`` between e2m1 magnitudes (exact ties of
    ``x / s``), then the same values one unit in the last place of ``dtype`` above and
    below (the amax and a zero kept).
    """
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    tiles = []
    for t in range(dim // 16):
        s = (1 + (t % 8) / 8) * 2.0 ** ((t % 16) - 8)
        tiles.append(torch.cat([torch.tensor([6 * s]), mids * s, -mids * s, torch.zeros(1)]))
    row = torch.cat(tiles).to(dtype)
    bits = row.view(torch.int16 if dtype.itemsize == 2 else torch.int32)
    step = torch.ones_like(bits)
    step[::16] = 0
    step[15::16] = 0
    return torch.stack([row, (bits + step).view(dtype), (bits - step).view(dtype)])


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8).reshape(-1)


def writable_mask(
    spec: LayoutSpec, buf: torch.Tensor, loc: list[int], page_size: int
) -> torch.Tensor:
    """Bytes a write of tokens ``loc`` may change, from the documented offsets."""
    mask = torch.zeros(as_bytes(buf).numel(), dtype=torch.bool)
    written_scale = spec.scale_bytes - spec.scale_pad
    for token in loc:
        data = spec.data_offset(token, page_size)
        mask[data : data + spec.data_bytes] = True
        scale = spec.scale_offset(token, page_size)
        mask[scale : scale + written_scale] = True
    return mask


def exhaustive_rows(spec: LayoutSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, scale) uint8 rows in which every scale byte meets every data byte.

    For the DeepSeek-V4 layouts with scale bytes (V4, V41, V41_FP4 and the ``_NEW``
    twins): each (scale byte ``s``, block of data bytes ``b``) pair fills one tile, so all
    256 x 256 combinations occur (for e2m1 each data byte holds two codes, so every code
    meets every scale). The V4 rope and pad bytes are random.
    """
    written = spec.scale_bytes_written
    tile_bytes = spec.tile_size * spec.data_encoding.bits // 8
    blocks = 256 // tile_bytes
    pairs = [(s, b) for s in range(256) for b in range(blocks)]
    n = -(-len(pairs) // written)
    g = torch.Generator().manual_seed(11)
    data = torch.randint(0, 256, (n, spec.data_bytes), generator=g).to(torch.uint8)
    scale = torch.randint(0, 256, (n, spec.scale_bytes), generator=g).to(torch.uint8)
    for k in range(n * written):
        token, tile = divmod(k, written)
        s, b = pairs[k % len(pairs)]
        start = tile * tile_bytes
        data[token, start : start + tile_bytes] = torch.arange(tile_bytes) + b * tile_bytes
        scale[token, tile] = s
    return data, scale
