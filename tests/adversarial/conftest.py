"""Set-up of the adversarial tier (``tests/adversarial``).

* Cases built from SGLang 0.5.23's own classes carry the ``sglang`` marker and are skipped
  (with the reason) where sglang is not installed; they get the same narrow import-warning
  filters as ``tests/real``.
* Every test records how many bad inputs, faults or races it tried (``_harness.tried``);
  the terminal summary prints the tier's figure: "N bad inputs / faults tried: clear
  error, 0 bytes changed".
"""

from __future__ import annotations

import pytest
from _sglang.env import sglang_installed

from ._harness import TRIED

_SKIP_REASON = (
    "sglang is not installed; these cases need `pip install --no-deps sglang==0.5.23` plus "
    "`pip install --no-deps -r requirements/sglang-cpu.txt` (see tests/real/README.md)"
)

# The warnings SGLang 0.5.23's pool modules emit on import (see tests/real/conftest.py).
_IMPORT_WARNING_FILTERS = (
    (
        r"ignore:Only CUDA, HIP and XPU support AWQ currently\.:UserWarning:"
        r"sglang\.srt\.layers\.quantization\.awq\.awq"
    ),
    (
        r"ignore:Only CUDA, MUSA and NPU support GGUF quantization currently\.:UserWarning:"
        r"sglang\.srt\.layers\.quantization\.gguf"
    ),
    r"ignore:`torch\.jit\.script_method` is deprecated:DeprecationWarning:torch\.jit\._script",
    r"ignore:builtin type Swig\w+ has no __module__ attribute:DeprecationWarning",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    del config
    installed = sglang_installed()
    for item in items:
        if item.get_closest_marker("sglang") is None:
            continue
        for spec in _IMPORT_WARNING_FILTERS:
            item.add_marker(pytest.mark.filterwarnings(spec))
        if not installed:
            item.add_marker(pytest.mark.skip(reason=_SKIP_REASON))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not TRIED:
        return
    total = sum(TRIED.values())
    parts = ", ".join(f"{kind} {count}" for kind, count in sorted(TRIED.items()))
    terminalreporter.write_line(
        f"adversarial tier: {total} bad inputs / faults tried: clear error, 0 bytes changed "
        f"({parts})"
    )
