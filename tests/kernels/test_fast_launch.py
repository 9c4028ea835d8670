"""The warm launch's signature and switches (``kvcompat/kernels/_fast.py``), on any machine.

That a warm launch runs the kernel the dispatcher would, byte for byte, is the GPU tier's
to check (``test_kernels_gpu.py``: ``test_a_warm_launch_equals_the_dispatchers`` and the
segment and hook cases); these pin what the signature tells apart.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kvcompat.kernels import _fast


def test_releases_parse_and_anything_else_is_unknown() -> None:
    assert _fast._release("3.6.0") == (3, 6)
    assert _fast._release("3.10.1+git4f2a") == (3, 10)
    assert _fast._release("nightly") == (0, 0)
    assert _fast._release(object()) == (0, 0)  # a mocked triton (the docs build)
    assert _fast._CHECKED[0] <= (3, 6) <= _fast._CHECKED[1]


def test_the_signature_tells_apart_what_triton_compiles_by() -> None:
    sig = _fast._signature
    backing = torch.zeros(64, dtype=torch.uint8)
    assert sig(backing[16:]) == sig(backing[32:])  # both 16-byte aligned (offsets from one base)
    assert sig(backing[16:]) != sig(backing[18:])  # alignment
    assert sig(backing) != sig(backing.view(torch.int8))  # dtype
    assert sig(16) == sig(4096)  # both multiples of 16, neither 1
    assert sig(1) != sig(17)  # Triton folds 1 into the kernel
    assert sig(5) != sig(6)
    assert sig(3) != sig(3 + (1 << 32))  # 32 against 64 bits
    assert sig(True) != sig(1)
    assert sig(None) is None


def test_an_argument_the_signature_cannot_cover_goes_to_the_dispatcher() -> None:
    with pytest.raises(_fast._UnsupportedArgError):
        _fast._signature(0.5)
    with pytest.raises(_fast._UnsupportedArgError):
        _fast._signature("x")


def test_an_interpreted_process_never_bypasses_the_dispatcher() -> None:
    from kvcompat.kernels import _launch

    if _launch.INTERPRETED:
        assert not _fast.ENABLED


def test_hooks_send_launches_to_the_dispatcher() -> None:
    import triton

    class Kernel:
        def __init__(self) -> None:
            self.pre_run_hooks: list[object] = []

    runtime = triton.knobs.runtime
    assert not _fast._hooked(Kernel())

    def hook(*_: object) -> None:
        return None

    runtime.launch_exit_hook.add(hook)
    try:
        assert _fast._hooked(Kernel())
    finally:
        runtime.launch_exit_hook.remove(hook)
    hooked = Kernel()
    hooked.pre_run_hooks.append(hook)
    assert _fast._hooked(hooked)


def test_a_constant_passed_by_position_or_as_run_time_is_never_remembered() -> None:
    """The signature keys positional and run-time arguments by their properties only, so
    a ``tl.constexpr`` among them (whose exact value picks the compiled kernel) must keep
    every such launch with the dispatcher; checked on the shipped kernels' parameters."""
    from kvcompat.kernels import _triton as jit

    kernel = jit._read_fp8_kernel
    if not hasattr(kernel, "params"):
        pytest.skip("interpreted kernels (no parameters to read; launches never bypass there)")
    first_constant = next(i for i, p in enumerate(kernel.params) if p.is_constexpr)
    assert first_constant == 10  # out, buf, loc, table, n and the five geometry numbers
    assert _fast._keyable(kernel, first_constant, None)
    assert _fast._keyable(kernel, first_constant, {"n0": 3, "row2": 16})
    assert not _fast._keyable(kernel, first_constant + 1, None)
    assert not _fast._keyable(kernel, first_constant, {"SEGMENTS": True})
