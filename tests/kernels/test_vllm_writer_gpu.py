"""vLLM's DeepSeek-V4 cache writer, run unmodified on a GPU, against kvcompat's V4 write.

The vLLM tier (``tests/vllm``) compares every byte of vLLM's ``quantize_and_insert_k_cache``
with kvcompat's write except the e4m3 payload, because the Triton interpreter rounds
fp32 to e4m3 unlike the GPU. This test closes that gap where a GPU is present: it takes
vLLM's own writer -- the kernel and its launcher, read from an installed vLLM wheel's
source and executed as written, with the four names they import from elsewhere in vLLM
supplied -- and compares the whole storage byte for byte with kvcompat's write into a
strided (block-outer, as vLLM's ``BLHNC``) page view (all but each written token's scale
padding byte, which vLLM zeroes and kvcompat leaves), for every release whose source is
found (``.vllm-releases/<release>/`` of ``make vllm``, or ``KVCOMPAT_VLLM_SOURCES``, a
``os.pathsep``-separated list of ``cache_utils.py`` paths). Skipped without CUDA or source.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from kvcompat import _ops
from kvcompat.layouts import V4

ROOT = Path(__file__).resolve().parents[2]
_MODULE = "vllm/models/deepseek_v4/common/ops/cache_utils.py"
_NAMES = ("quantize_and_insert_k_kernel", "quantize_and_insert_k_cache")


def _sources() -> list[Path]:
    listed = os.environ.get("KVCOMPAT_VLLM_SOURCES")
    if listed:
        return [Path(p) for p in listed.split(os.pathsep) if p]
    return sorted(ROOT.glob(f".vllm-releases/*/{_MODULE}"))


SOURCES = _sources()

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not SOURCES, reason="no vLLM source (make vllm installs the releases)"),
]


def _vllm_writer(source: Path, folder: Path) -> Any:
    """vLLM's ``quantize_and_insert_k_cache`` from ``source``, its two functions as written."""
    import triton
    import triton.language as tl

    text = source.read_text(encoding="utf-8")
    tree = ast.parse(text)
    found = {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name in _NAMES
    }
    assert set(found) == set(_NAMES), f"{source}: no {set(_NAMES) - set(found)}"
    lines = text.splitlines(keepends=True)
    code = "".join(
        "".join(lines[min(d.lineno for d in [node, *node.decorator_list]) - 1 : node.end_lineno])
        for node in (found[name] for name in _NAMES)
    )
    namespace: dict[str, Any] = {
        "torch": torch,
        "triton": triton,
        "tl": tl,
        "current_platform": SimpleNamespace(is_fp8_fnuz=lambda: False),
        "get_fp8_min_max": lambda: (-448.0, 448.0),
        "__name__": "vllm_cache_utils_under_test",
    }
    path = folder / "vllm_cache_utils.py"  # triton.jit reads its function's source file
    path.write_text(code, encoding="utf-8")
    exec(compile(code, str(path), "exec"), namespace)
    return namespace["quantize_and_insert_k_cache"]


@pytest.mark.parametrize("impl", ["triton", "torch"])
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.parents[5].name)
def test_vllm_writer_and_kvcompat_store_the_same_bytes_e4m3_payload_included(
    source: Path, impl: str, tmp_path: Path
) -> None:
    write = _vllm_writer(source, tmp_path)
    blocks, layers, page = 12, 3, V4.page_bytes(64)
    g = torch.Generator().manual_seed(11)
    start = torch.randint(0, 256, (blocks, layers, page), generator=g, dtype=torch.uint8)
    theirs = start.to("cuda", copy=True)
    ours = start.to("cuda", copy=True)
    loc = torch.randperm(blocks * 64, generator=g)[:300].to("cuda")  # out of order
    keys = (torch.randn(300, 512, generator=g) * torch.logspace(-3, 3, 300)[:, None]).to(
        torch.bfloat16
    )
    keys = keys.to("cuda")
    write(keys, theirs[:, 1], loc)
    _ops.quantize(V4, keys, ours[:, 1], loc, 64, impl=impl)  # type: ignore[arg-type]
    torch.cuda.synchronize()
    assert not torch.equal(theirs, start.to("cuda")), "vLLM's writer wrote nothing"
    # The one byte the two writers treat differently: each written token's eighth scale
    # byte, padding no reader looks at. vLLM stores 0 there; kvcompat leaves it as it was,
    # as SGLang's store does (V4's ``scale_pad``). vLLM allocates its caches zeroed.
    pad = torch.zeros(blocks, layers, page, dtype=torch.bool)
    for slot in loc.tolist():
        pad[slot // 64, 1, 64 * 576 + (slot % 64) * 8 + 7] = True
    pad = pad.to("cuda")
    assert bool((theirs[pad] == 0).all())
    assert torch.equal(ours[pad], start.to("cuda")[pad])
    differ = (theirs != ours) & ~pad
    where = differ.view(-1).nonzero().flatten()
    assert where.numel() == 0, f"{where.numel()} bytes differ, first at {where[:8].tolist()}"
