"""KV-cache byte layouts: immutable specs and their pure-torch codecs ("torch twins").

One module per byte layout holds its :class:`LayoutSpec` and row codec: DeepSeek-V4's
packed page layouts (``V4``, ``V41``, ``V41_FP4``, ``UNIFORM_FP8``, ``V41_NEW``,
``V41_FP4_NEW``) and indexer keys (``DSV4_INDEXER_FP8/FP4``), SGLang's token-major
MHA and MLA rows (:func:`mha_layout`, :func:`mla_layout`) and DSA's 656-byte fp8 rows
(``DSA_FP8``, :func:`dsa_fp8_layout`).
:func:`dequantize` and :func:`quantize` read and write tokens of a pool buffer on any
device, byte for byte as SGLang 0.5.23's readers and stores do on an NVIDIA GPU (checked
against its CUDA and Triton kernels on an H200; see ``docs/layouts/oracles.md``);
:func:`check_read` and :func:`check_write` run their validation alone. Importing this
package never imports sglang or triton.

Example:
    >>> import torch
    >>> from kvcompat.layouts import V41, dequantize, get_layout, quantize
    >>> spec = get_layout("v41")
    >>> buf = torch.zeros(4, spec.page_bytes(64), dtype=torch.uint8)
    >>> loc = torch.tensor([3, 64, 200])
    >>> values = torch.randn(3, 512, dtype=torch.bfloat16)
    >>> quantize(spec, values, buf, loc, 64)
    >>> out = dequantize(spec, buf, loc, 64)
    >>> out.shape, out.dtype, bool(((out - values).abs() <= values.abs() / 8 + 1e-3).all())
    (torch.Size([3, 512]), torch.bfloat16, True)
"""

from __future__ import annotations

from kvcompat.layouts._codec import dequantize, quantize
from kvcompat.layouts._registry import get_layout
from kvcompat.layouts._spec import Encoding, LayoutSpec, Segment, SegmentRole
from kvcompat.layouts._validate import check_read, check_write
from kvcompat.layouts.dsa_fp8 import DSA_FP8, dsa_fp8_layout
from kvcompat.layouts.dsv4_indexer_fp4 import DSV4_INDEXER_FP4, DSV4_INDEXER_FP4_RNE
from kvcompat.layouts.dsv4_indexer_fp8 import DSV4_INDEXER_FP8
from kvcompat.layouts.dsv4_uniform_fp8 import UNIFORM_FP8
from kvcompat.layouts.dsv4_v4 import V4
from kvcompat.layouts.dsv4_v41 import V41, V41_NEW
from kvcompat.layouts.dsv4_v41_fp4 import V41_FP4, V41_FP4_NEW
from kvcompat.layouts.mha import mha_layout
from kvcompat.layouts.mla import mla_layout

__all__ = [
    "DSA_FP8",
    "DSV4_INDEXER_FP4",
    "DSV4_INDEXER_FP4_RNE",
    "DSV4_INDEXER_FP8",
    "UNIFORM_FP8",
    "V4",
    "V41",
    "V41_FP4",
    "V41_FP4_NEW",
    "V41_NEW",
    "Encoding",
    "LayoutSpec",
    "Segment",
    "SegmentRole",
    "check_read",
    "check_write",
    "dequantize",
    "dsa_fp8_layout",
    "get_layout",
    "mha_layout",
    "mla_layout",
    "quantize",
]
