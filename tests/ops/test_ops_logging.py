"""The ``kvcompat`` logger, ``KVCOMPAT_LOG``, ``KVCOMPAT_IMPL`` and ``which_impl``.

A CUDA call that falls back to the torch twin says so, once, with the reason; without
a GPU the tests hand the selection a tensor that reports a CUDA device (the decision
only reads ``device``, ``data_ptr`` and the layout), and check the real CPU path end to
end. The environment switches are read once per process, so they run in subprocesses.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from _pools import make_pool

from kvcompat import _log
from kvcompat._errors import KernelUnavailableError
from kvcompat.kernels import ImplChoice, _select, which_impl
from kvcompat.layouts import V4, V41, dequantize, quantize

ROOT = Path(__file__).resolve().parents[2]


class _CudaLooking(torch.Tensor):
    """A CPU tensor that reports a CUDA device (what the selection reads)."""

    @property  # type: ignore[override]
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)


def _cuda_looking(t: torch.Tensor) -> torch.Tensor:
    return torch.Tensor._make_subclass(_CudaLooking, t)


@pytest.fixture(autouse=True)
def _fresh_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(_log.LOG_ENV, raising=False)
    monkeypatch.delenv(_log.IMPL_ENV, raising=False)
    _log.reset()
    yield
    _log.reset()


def _buf(spec: object = V4, offset: int = 0) -> torch.Tensor:
    page = V4.page_bytes(4) if spec is V4 else V41.page_bytes(4)
    flat = torch.zeros(2 * page + offset, dtype=torch.uint8)
    return _cuda_looking(flat[offset:].view(2, page))


def _records(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "kvcompat"]


def test_cuda_fallbacks_say_why_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.DEBUG, logger="kvcompat")
    monkeypatch.setattr(_select, "_triton_installed", lambda: False)
    for _ in range(3):
        assert not _select.dispatch("auto", V4, _buf(), write=False, fnuz=False)
    assert _records(caplog) == [
        (logging.INFO, ("read of layout 'v4' served by the torch twin: "
         "triton is not installed (pip install triton)")),
    ]  # fmt: skip
    caplog.clear()
    monkeypatch.setattr(_select, "_triton_installed", lambda: True)
    assert not _select.dispatch("auto", V4, _buf(offset=8), write=False, fnuz=False)
    wide = torch.float64
    assert not _select.dispatch("auto", V4, _buf(), write=True, fnuz=False, values_dtype=wide)
    assert _select.dispatch("auto", V4, _buf(), write=True, fnuz=False)
    assert _records(caplog) == [
        (logging.INFO, ("read of layout 'v4' served by the torch twin: "
         "the buffer's address is not a multiple of 16 bytes")),
        (logging.INFO, ("write of layout 'v4' served by the torch twin: "
         "the write kernels take bf16, fp16 or fp32 values, not torch.float64")),
        (logging.DEBUG, ("write of layout 'v4' served by the Triton kernel: "
         "a CUDA tensor and a kernel serves the call")),
    ]  # fmt: skip


def test_the_rocm_portable_path_is_reported(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="kvcompat")
    monkeypatch.setattr(_select, "_triton_installed", lambda: True)
    monkeypatch.setattr(_select, "_ROCM", True)
    choice = which_impl(V41, _buf(V41))
    assert choice == ImplChoice("triton", _select.REASONS["rocm"], fallback=True)
    assert _select.dispatch("auto", V41, _buf(V41), write=False, fnuz=False)
    assert _records(caplog) == [
        (logging.INFO, ("read of layout 'v41' served by the Triton kernel: a ROCm build: "
         "the kernel takes its portable integer fp8/fp4 conversions")),
    ]  # fmt: skip


def test_which_impl_answers_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_select, "_triton_installed", lambda: True)
    assert which_impl(V4, _buf()).impl == "triton"
    assert which_impl("v4", _buf(), impl="torch") == ImplChoice("torch", "impl='torch' was passed")
    assert which_impl(V4, _buf(offset=8)).fallback
    cpu = torch.zeros(1, V4.page_bytes(4), dtype=torch.uint8)
    assert which_impl(V4, cpu) == ImplChoice("torch", _select.REASONS["not_cuda"])
    # Forced where no kernel can run (a CPU buffer, no interpreter): refused up front.
    with pytest.raises(KernelUnavailableError, match="need CUDA tensors"):
        which_impl(V4, cpu, impl="triton")


def test_cpu_reads_and_writes_log_once_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="kvcompat")
    buf = torch.zeros(2, V4.page_bytes(4), dtype=torch.uint8)
    for _ in range(3):
        quantize(V4, torch.ones(2, 512), buf, torch.tensor([1, 2]), 4)
        dequantize(V4, buf, torch.tensor([1, 2]), 4)
    dequantize(V4, buf, torch.tensor([1]), 4, impl="torch")
    reason = "not a CUDA tensor (the kernels run on CUDA tensors)"
    assert _records(caplog) == [
        (logging.DEBUG, f"write of layout 'v4' served by the torch twin: {reason}"),
        (logging.DEBUG, f"read of layout 'v4' served by the torch twin: {reason}"),
        (logging.DEBUG, "read of layout 'v4' served by the torch twin: impl='torch' was passed"),
    ]


def test_a_pools_remembered_choices_end_at_a_reset(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planned MHA/MLA calls remember the choice per buffer; a reset forgets it.

    The environment is read once until ``_log.reset()``, so after a reset a pool already
    used must log its choice again and obey a new ``KVCOMPAT_IMPL``.
    """
    pool = make_pool("mha")  # writes every token: its choices are remembered
    _log.reset()
    loc = torch.tensor([3, 1])
    keys = torch.ones(2, 2, 8, dtype=torch.bfloat16)
    caplog.set_level(logging.DEBUG, logger="kvcompat")
    reason = "not a CUDA tensor (the kernels run on CUDA tensors)"
    expected = [
        (logging.DEBUG, f"write of layout 'mha_2x8_bf16' served by the torch twin: {reason}"),
        (logging.DEBUG, f"read of layout 'mha_2x8_bf16' served by the torch twin: {reason}"),
    ]
    for _ in range(2):
        caplog.clear()
        for _ in range(3):
            pool.write(0, loc, keys, keys)
            pool.read(0, loc)
        assert _records(caplog) == expected
        _log.reset()
    monkeypatch.setenv(_log.IMPL_ENV, "triton")
    _log.reset()
    before = pool.get_key_buffer(0).clone()
    with pytest.raises(KernelUnavailableError, match="KVCOMPAT_IMPL=triton forces"):
        pool.write(0, loc, 2 * keys, 2 * keys)
    with pytest.raises(KernelUnavailableError, match="KVCOMPAT_IMPL=triton forces"):
        pool.read(0, loc)
    assert torch.equal(pool.get_key_buffer(0), before)


def test_getters_never_log(caplog: pytest.LogCaptureFixture) -> None:
    pool = make_pool("v4")
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="kvcompat")
    for layer in pool.layer_ids:
        pool.get_key_buffer(layer)
        pool.get_value_buffer(layer)
        pool.get_kv_buffer(layer)
        pool.layout(layer)
    assert _records(caplog) == []


def test_forcing_triton_where_no_kernel_serves_is_a_clear_error() -> None:
    buf = torch.zeros(2, V4.page_bytes(4), dtype=torch.uint8)
    wide = torch.ones(1, 512, dtype=torch.float64)
    with pytest.raises(NotImplementedError, match=r"impl='triton' forces .* bf16, fp16 or fp32"):
        quantize(V4, wide, buf, torch.tensor([1]), 4, impl="triton")
    assert not buf.any()
    with pytest.raises(ValueError, match="impl must be 'auto', 'torch' or 'triton'"):
        dequantize(V4, buf, torch.tensor([1]), 4, impl="cuda")  # type: ignore[arg-type]


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KVCOMPAT_")}
    environ.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-c", code], env=environ, capture_output=True, text=True, check=False
    )


_READ_WRITE = (
    "import torch\n"
    "from kvcompat.layouts import V4, dequantize, quantize\n"
    "buf = torch.zeros(2, V4.page_bytes(4), dtype=torch.uint8)\n"
    "quantize(V4, torch.ones(2, 512), buf, torch.tensor([1, 2]), 4)\n"
    "dequantize(V4, buf, torch.tensor([1, 2]), 4)\n"
    "dequantize(V4, buf, torch.tensor([1, 2]), 4)\n"
)


def test_environment_switches_in_fresh_processes() -> None:
    silent = _run(_READ_WRITE)
    assert (silent.returncode, silent.stdout, silent.stderr) == (0, "", "")
    info = _run(_READ_WRITE, KVCOMPAT_LOG="info")  # CPU choices are DEBUG: nothing to say
    assert (info.returncode, info.stderr) == (0, "")
    debug = _run(_READ_WRITE, KVCOMPAT_LOG="DEBUG")
    assert debug.returncode == 0, debug.stderr
    assert debug.stderr.splitlines() == [
        (
            "kvcompat DEBUG: write of layout 'v4' served by the torch twin: not a CUDA tensor "
            "(the kernels run on CUDA tensors)"
        ),
        (
            "kvcompat DEBUG: read of layout 'v4' served by the torch twin: not a CUDA tensor "
            "(the kernels run on CUDA tensors)"
        ),
    ]
    forced = _run(
        _READ_WRITE
        + "from kvcompat.kernels import which_impl\n"
        + "print(which_impl(V4, buf).reason, which_impl(V4, buf, impl='triton').impl)\n",
        KVCOMPAT_IMPL="torch",
        KVCOMPAT_LOG="debug",
        TRITON_INTERPRET="1",  # so a forced kernel can serve a CPU buffer at all
    )
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout == "KVCOMPAT_IMPL=torch triton\n"
    assert "served by the torch twin: KVCOMPAT_IMPL=torch" in forced.stderr


def test_forcing_triton_from_the_environment_names_the_variable() -> None:
    code = (
        "import sys, torch\n"
        "from kvcompat.layouts import V4, quantize\n"
        "buf = torch.zeros(2, V4.page_bytes(4), dtype=torch.uint8)\n"
        "try:\n"
        "    quantize(V4, torch.ones(1, 512, dtype=torch.float64), buf, torch.tensor([1]), 4)\n"
        "except NotImplementedError as exc:\n"
        "    print(exc)\n"
        "print('triton' in sys.modules)\n"
    )
    result = _run(code, KVCOMPAT_IMPL="triton")
    assert result.returncode == 0, result.stderr
    message, imported = result.stdout.splitlines()
    assert message.startswith("KVCOMPAT_IMPL=triton forces the Triton kernel, but none serves")
    assert "bf16, fp16 or fp32" in message
    assert imported == "False"  # refused before importing triton


@pytest.mark.parametrize(
    ("name", "value", "accepted"),
    [("KVCOMPAT_IMPL", "cuda", "'auto', 'torch', 'triton'"),
     ("KVCOMPAT_LOG", "verbose", "'off', 'info', 'debug'")],
)  # fmt: skip
def test_bad_environment_values_are_clear_errors(name: str, value: str, accepted: str) -> None:
    result = _run(_READ_WRITE, **{name: value})
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last == (
        f"ValueError: environment variable {name}={value!r} is not one of {accepted}. "
        f"Hint: unset {name} or set it to one of those values."
    )


def test_bad_environment_values_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVCOMPAT_IMPL", "Torch ")  # case and spaces are forgiven
    assert _log.env_impl() == "torch"
    _log.reset()
    monkeypatch.setenv("KVCOMPAT_IMPL", "gpu")
    with pytest.raises(ValueError, match="KVCOMPAT_IMPL='gpu' is not one of"):
        which_impl(V4, torch.zeros(1, V4.page_bytes(4), dtype=torch.uint8))
