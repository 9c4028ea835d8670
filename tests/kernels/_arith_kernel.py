"""A Triton kernel that applies two pieces of the ROCm V4 store's scale arithmetic
(:func:`kvcompat.kernels._triton._div_rn` by 240, hardware path, and ``_ceil_log2``) to
fp32 values, so tests can compare them with torch. Importing this module imports triton.
"""

# Triton's conventions (see kvcompat/kernels/_triton.py).
# ruff: noqa: N803
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl

from kvcompat.kernels._triton import _ceil_log2, _div_rn


@triton.jit
def rocm_scale_parts_kernel(x_ptr, quotient_ptr, ceil_ptr, n, BLOCK: tl.constexpr):
    """``quotient = x / 240`` (the fma-corrected product) and ``ceil = ceil(log2(x))``."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = i < n
    x = tl.load(x_ptr + i, mask=live)
    tl.store(quotient_ptr + i, _div_rn(x, 240.0, 1.0 / 240.0, False), mask=live)
    tl.store(ceil_ptr + i, _ceil_log2(x), mask=live)
