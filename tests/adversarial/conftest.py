"""Set-up of the adversarial tier (``tests/adversarial``).

* Cases built from SGLang's own classes carry the ``sglang`` marker and are skipped (with
  the reason) where sglang is not installed; they get the same narrow import-warning
  filters as ``tests/real`` (``_sglang.env.IMPORT_WARNING_FILTERS``). The release matrix
  runs them under every release it covers.
* Every test records how many bad inputs, faults or races it tried (``_harness.tried``);
  the terminal summary prints the tier's figure: "N bad inputs / faults tried: clear
  error, 0 bytes changed".
"""

from __future__ import annotations

import pytest
from _sglang.env import IMPORT_WARNING_FILTERS, sglang_installed

from ._harness import TRIED

_SKIP_REASON = (
    "sglang is not installed; these cases need `pip install --no-deps sglang==0.5.23` plus "
    "`pip install --no-deps -r requirements/sglang-cpu.txt` (see tests/real/README.md)"
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    del config
    installed = sglang_installed()
    for item in items:
        if item.get_closest_marker("sglang") is None:
            continue
        for spec in IMPORT_WARNING_FILTERS:
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
