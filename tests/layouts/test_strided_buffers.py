"""Strided pool buffers: rows (pages or token rows) further apart than their size.

A layer's view of a storage shared by several layers (vLLM's block-outer layouts) strides
its first dimension. The torch twin reads and writes such a view in place, byte-equal to
the same rows held contiguously, and touches nothing between the rows; the Triton kernels
are checked the same way in the interpreter and GPU tiers. Buffers that cannot be
addressed are refused before anything is read or written.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))

from _kernel_cases import ALL_LAYOUTS, layout_id
from _kernel_checks import strided_matches_contiguous

from kvcompat import LayoutError
from kvcompat.layouts import V4, dequantize, mha_layout, quantize


@pytest.mark.parametrize("spec", ALL_LAYOUTS, ids=layout_id)
def test_a_strided_view_reads_and_writes_as_its_rows_held_contiguously(spec: object) -> None:
    strided_matches_contiguous(spec, 3 if spec.paged else 1, torch.bfloat16, "cpu", ("torch",))  # type: ignore[attr-defined]


def test_buffers_whose_rows_cannot_be_addressed_are_refused() -> None:
    spec = mha_layout(2, 8, torch.bfloat16)
    heads_strided = torch.zeros(16, 8, 2, dtype=torch.bfloat16).transpose(1, 2)
    with pytest.raises(LayoutError, match=r"rows .* are each contiguous"):
        dequantize(spec, heads_strided, torch.tensor([1]), 1)
    page = V4.page_bytes(4)
    odd_pitch = torch.zeros(3 * page + 3, dtype=torch.uint8).as_strided((3, page), (page + 1, 1))
    with pytest.raises(LayoutError, match="bytes apart"):
        dequantize(V4, odd_pitch, torch.tensor([1]), 4)
    before = odd_pitch.clone()
    with pytest.raises(LayoutError, match="bytes apart"):
        quantize(V4, torch.ones(1, 512), odd_pitch, torch.tensor([1]), 4)
    assert torch.equal(odd_pitch, before)
    overlapping = torch.zeros(4 * page, dtype=torch.uint8).as_strided((3, page), (page // 2, 1))
    with pytest.raises(LayoutError, match="do not overlap"):
        dequantize(V4, overlapping, torch.tensor([1]), 4)
