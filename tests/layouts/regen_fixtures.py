"""Build (and, run as a script, rewrite) the golden fixtures of kvcompat.layouts.

Each fixture ``tests/fixtures/layouts/<case>.pt`` holds a fixed write and read of one
layout: the input values, the locations, the buffer before and after
:func:`~kvcompat.layouts.quantize`, and the bytes of :func:`~kvcompat.layouts.dequantize`.
Inputs come from integer formulas (no RNG, no libm), so they are the same on every
platform; ``test_layouts_fixtures.py`` rebuilds every case and compares byte for byte.

Usage::

    python tests/layouts/regen_fixtures.py          # rewrite the fixtures
    python tests/layouts/regen_fixtures.py --check  # exit 1 if any differs
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from kvcompat.layouts import (
    V4,
    LayoutSpec,
    dequantize,
    mha_layout,
    mla_layout,
    quantize,
)
from kvcompat.layouts._registry import LAYOUTS

FIXTURE_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "layouts"
PAGE_SIZE = 2
ROWS = 3  # pages (or token-major rows x 2)

# Every registered layout has a fixture named after it (a new layout module gets one by
# running this script), plus the variants no name covers.
CASES: dict[str, tuple[LayoutSpec, bool]] = {
    **{name: (spec, False) for name, spec in LAYOUTS.items()},
    "v4_fnuz": (V4, True),
    "mha_2x8_e4m3fn": (mha_layout(2, 8, torch.float8_e4m3fn), False),
    "mla_32+16_bf16": (mla_layout(32, 16, torch.bfloat16), False),
}


def fixture_values(spec: LayoutSpec, n: int) -> torch.Tensor:
    """bf16 ``[n, dim]`` built from integer bit patterns, with a zero tile and exact ties."""
    tile = min(spec.tile_size, spec.dim)
    bits = []
    for token in range(n):
        row = []
        for j in range(spec.dim):
            exponent = (token * 5 + (j // tile) * 3) % 16 - 8  # 2**-8 .. 2**7 per tile
            mantissa = (token * 131 + j * 71 + 17) % 128
            sign = ((token + j * 3) % 2) << 15
            row.append(sign | (127 + exponent) << 7 | mantissa)
        bits.append(row)
    values = torch.tensor(bits, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    values[0, :tile] = 0.0  # an all-zero tile
    if n > 1:  # halves and quarters: exact e2m1/e4m3 ties after scaling
        values[1, : min(tile, 16)] = torch.arange(min(tile, 16), dtype=torch.float32) * 0.25
    return values


def initial_buffer(spec: LayoutSpec) -> torch.Tensor:
    """A buffer shaped as SGLang allocates it, every byte ``(i * 151 + 29) % 256``."""
    rows = ROWS if spec.paged else 2 * ROWS
    per_row = PAGE_SIZE if spec.paged else 1
    row_bytes = spec.page_bytes(per_row)
    index = torch.arange(rows * row_bytes, dtype=torch.int64)
    raw = ((index * 151 + 29) % 256).to(torch.uint8).reshape(rows, row_bytes)
    if spec.heads > 1:
        return raw.view(rows, spec.heads, row_bytes // spec.heads).view(spec.output_dtype)
    return raw if spec.paged else raw.view(rows, 1, row_bytes)


def build(case: str) -> dict[str, torch.Tensor]:
    """The fixture tensors of ``case``, freshly computed."""
    spec, fnuz = CASES[case]
    buf = initial_buffer(spec)
    before = buf.contiguous().view(torch.uint8).reshape(-1).clone()
    capacity = buf.shape[0] * (PAGE_SIZE if spec.paged else 1)
    loc = torch.tensor([capacity - 1, 0, 3, 2], dtype=torch.int64)  # across pages, slot 0
    values = fixture_values(spec, loc.numel())
    quantize(spec, values, buf, loc, PAGE_SIZE, fnuz=fnuz)
    out = dequantize(spec, buf, loc, PAGE_SIZE, fnuz=fnuz)
    return {
        "values": values,
        "loc": loc,
        "page_size": torch.tensor(PAGE_SIZE),
        "before": before,
        "after": buf.contiguous().view(torch.uint8).reshape(-1).clone(),
        "dequantized": out.contiguous().view(torch.uint8).reshape(out.shape[0], -1),
    }


def path_of(case: str) -> Path:
    return FIXTURE_DIR / f"{case}.pt"


def load(case: str) -> dict[str, torch.Tensor]:
    loaded = torch.load(path_of(case), weights_only=True)
    if not isinstance(loaded, dict):
        msg = f"{path_of(case)} does not hold a dict of tensors"
        raise TypeError(msg)
    return loaded


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Equal keys and byte-identical tensors (dtype and shape included)."""
    if a.keys() != b.keys():
        return False
    return all(
        a[k].dtype == b[k].dtype
        and a[k].shape == b[k].shape
        and torch.equal(_bytes(a[k]), _bytes(b[k]))
        for k in a
    )


def main(argv: list[str]) -> int:
    check_only = "--check" in argv
    FIXTURE_DIR.mkdir(parents=True, exist_ok=True)
    status = 0
    for case in CASES:
        fresh = build(case)
        if check_only:
            if not path_of(case).exists() or not same(load(case), fresh):
                sys.stdout.write(f"DIFFERS {case}\n")
                status = 1
            continue
        torch.save(fresh, path_of(case))
        sys.stdout.write(f"wrote {path_of(case)} ({path_of(case).stat().st_size} bytes)\n")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
