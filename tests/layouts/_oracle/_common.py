"""Shared pieces of the SGLang oracles: the ``@check`` registry and comparison helpers.

Each oracle module (one per layout module, ``tests/layouts/_oracle/<module>.py``)
registers its checks with :func:`check`, which records the table row the docs show
(``docs/layouts/oracles.md`` is generated from :data:`ROWS`) and the layouts the check
covers. Importing this module imports neither sglang nor triton.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kvcompat.layouts import LayoutSpec

Result = tuple[str, str]
CHECKS: dict[str, Callable[[], Result]] = {}
"""Every registered check, by name, in registration order."""
ROWS: dict[str, tuple[str, str, str]] = {}
"""Per check: (SGLang code, what is compared, result), a row of the docs' oracle table."""
COVERS: dict[str, tuple[LayoutSpec, ...]] = {}
"""Per check: the layouts whose bytes it compares with SGLang's."""


def check(
    *layouts: LayoutSpec, code: str, compared: str, result: str = "exact"
) -> Callable[[Callable[[], Result]], Callable[[], Result]]:
    """Register a check of ``layouts`` against SGLang's ``code`` (a row of the docs table)."""

    def register(fn: Callable[[], Result]) -> Callable[[], Result]:
        if fn.__name__ in CHECKS:
            msg = f"two oracle checks are named {fn.__name__!r}"
            raise ValueError(msg)
        CHECKS[fn.__name__] = fn
        ROWS[fn.__name__] = (code, compared, result)
        COVERS[fn.__name__] = layouts
        return fn

    return register


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


def pages_for(spec: LayoutSpec, page_size: int, num_pages: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (num_pages, spec.page_bytes(page_size)), generator=g).to(
        torch.uint8
    )
