"""GPU tier: CUDA-graph capture of every operation declared capturable, and the key-first
loop compiled with fullgraph on CUDA (the Triton kernels inside the custom ops).

Skipped without CUDA. Run on the device machine:
``python -m pytest tests/ops -m gpu -q -p no:cacheprovider``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch
from _capture_cases import CASES, EXTRA_CASES, Case
from _pools import POOLS, as_bytes, buffers, key_first_loop, make_pool, write_args

from kvcompat import _log
from kvcompat._capture import capturability
from kvcompat.kernels import which_impl
from kvcompat.layouts import V4, dequantize

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]
DEVICE = "cuda"


def _capture_and_replay(case: Case) -> None:
    case.refill(0)
    case.step()  # compiles the Triton kernels outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = case.step()
    for seed in (1, 2, 3):
        case.refill(seed)
        graph.replay()
        torch.cuda.synchronize()
        case.check(result)


@pytest.mark.parametrize("operation", sorted(CASES))
def test_every_declared_capturable_operation_captures_and_replays(operation: str) -> None:
    declared = capturability(operation)
    assert declared.capturable
    _capture_and_replay(CASES[operation](declared.kwargs, DEVICE))


@pytest.mark.parametrize("name", sorted(EXTRA_CASES))
def test_more_capture_cases(name: str) -> None:
    kwargs: Mapping[str, object] = capturability("KVPool.read").kwargs
    _capture_and_replay(EXTRA_CASES[name](kwargs, DEVICE))


@pytest.mark.parametrize("name", POOLS)
def test_key_first_loop_compiles_fullgraph_on_cuda(name: str) -> None:
    torch._dynamo.reset()
    eager_pool, compiled_pool = make_pool(name, DEVICE), make_pool(name, DEVICE)
    for layer in compiled_pool.layer_ids:
        compiled_pool.layout(layer)
    key = compiled_pool.get_key_buffer(compiled_pool.layer_ids[0])
    assert which_impl(compiled_pool.layout(0).key, key).impl == "triton"
    loc = torch.tensor([1, 2, 3, 40], device=DEVICE)
    loc2 = torch.tensor([5, 9, 7, 63], device=DEVICE)
    x, v = write_args(eager_pool, 4)
    compiled: Callable[..., list[torch.Tensor]] = torch.compile(key_first_loop, fullgraph=True)
    got = compiled(compiled_pool, loc, loc2, x, v)
    want = key_first_loop(eager_pool, loc, loc2, x, v)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(as_bytes(g), as_bytes(w))
    for g, w in zip(buffers(compiled_pool), buffers(eager_pool), strict=True):
        assert torch.equal(g, w)


def test_launchers_compile_fullgraph_on_cuda() -> None:
    from kvcompat.kernels import gather_dequantize, quantize_scatter

    torch._dynamo.reset()
    buf = make_pool("v4", DEVICE).get_key_buffer(0)
    loc = torch.tensor([3, 70, 9], device=DEVICE)
    values = torch.randn(3, 512, device=DEVICE).to(torch.bfloat16)

    def step(b: torch.Tensor) -> torch.Tensor:
        quantize_scatter(V4, values, b, loc, 64)
        return gather_dequantize(V4, b, loc, 64)

    eager_buf, compiled_buf = buf.clone(), buf.clone()
    want = step(eager_buf)
    got = torch.compile(step, fullgraph=True)(compiled_buf)
    assert torch.equal(as_bytes(got), as_bytes(want))
    assert torch.equal(as_bytes(compiled_buf), as_bytes(eager_buf))


def test_a_real_unaligned_cuda_buffer_falls_back_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _log.reset()
    caplog.set_level(logging.INFO, logger="kvcompat")
    page = V4.page_bytes(4)
    flat = torch.zeros(2 * page + 8, dtype=torch.uint8, device=DEVICE)
    shifted = flat[8:].view(2, page)
    assert which_impl(V4, shifted).impl == "torch"
    dequantize(V4, shifted, torch.tensor([1], device=DEVICE), 4)
    messages = [r.getMessage() for r in caplog.records if r.name == "kvcompat"]
    assert messages == [
        (
            "read of layout 'v4' served by the torch twin: "
            "the buffer's address is not a multiple of 16 bytes"
        )
    ]
    _log.reset()


def test_a_validating_write_breaks_capture() -> None:
    """What the declarations say: validate=True syncs, even with check_finite=False.

    Last in the file: a capture that fails leaves the stream's capture invalidated.
    """
    case_kwargs: Mapping[str, Any] = {"validate": True, "check_finite": False}
    case = CASES["KVPool.write"](case_kwargs, DEVICE)
    case.refill(0)
    case.step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    marker = torch.zeros(1, device=DEVICE)

    def capture() -> None:
        with torch.cuda.graph(graph):
            # One captured op first: a write that fails before it launches anything would
            # otherwise leave an empty graph, whose warning at capture end hides the error.
            marker.add_(1)
            case.step()

    with pytest.raises(RuntimeError):
        capture()
