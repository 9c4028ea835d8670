"""The vLLM tier: vLLM's own planner, allocator, readers and connector objects on the CPU.

Runs where vLLM is importable: ``python tests/vllm_matrix.py`` (``make vllm``) installs each
release of ``tests/vllm_matrix.py: RELEASES`` as an overlay and runs this directory under it.
Elsewhere every test here is skipped, with the reason.

vLLM's Triton readers run under the interpreter: ``TRITON_INTERPRET=1`` and an empty
``CUDA_VISIBLE_DEVICES`` (vLLM replaces its kernels with placeholders on a machine without a
GPU driver unless it takes that branch) are set before anything imports triton, where vLLM
is installed (the matrix sets them for its subprocess too).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings

import pytest


def _installed() -> bool:
    # A real vLLM module, not "vllm": with tests/ on sys.path this directory itself
    # imports as a namespace package named vllm where vLLM is not installed.
    try:
        return importlib.util.find_spec("vllm.v1.kv_cache_interface") is not None
    except ImportError:
        return False


INSTALLED = _installed()

if INSTALLED:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    # vLLM's import chain warns (torch.jit deprecations, its own notices); the suite turns
    # warnings into errors, so the tier imports what it uses once, here, silenced.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import vllm.distributed.kv_transfer.kv_connector.v1.base
        import vllm.models.deepseek_v4.common.ops.cache_utils  # noqa: F401

        import tests._vllm.builders  # noqa: F401


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/vllm/" in item.nodeid.replace(os.sep, "/"):
            item.add_marker(pytest.mark.vllm)


_STATUS: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Leave without the interpreter's final module teardown, keeping pytest's exit status.

    Under vLLM 0.34 (with this suite's warnings-as-errors filter) that teardown crashes
    with SIGSEGV in a C extension's capsule destructor after every test has run and every
    report is written; 0.33 does not. The tier's results are final by now.
    """
    if _STATUS and INSTALLED:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_STATUS[-1])
