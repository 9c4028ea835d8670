"""Set-up of the real-SGLang tier (``tests/real``).

* Every test here gets the ``sglang`` marker.
* The tier is skipped, with the reason below, only when the ``sglang`` distribution is not
  installed. An installed-but-broken or different-version SGLang fails loudly instead.
* One session-scoped fixture pays the 4-11 s module import once and installs the dummy
  published runtime config; it is undone when the session ends.
* The repository turns warnings into errors. Importing SGLang's pool modules emits a few
  warnings that say nothing about kvcompat; they are ignored, each one narrowly (by
  message, category and emitting module) and only for this tier's tests
  (``_sglang.env.IMPORT_WARNING_FILTERS``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _sglang.env import (
    IMPORT_WARNING_FILTERS,
    SGLangSession,
    prepare_sglang,
    release_sglang,
    sglang_installed,
)
from _sglang.features import SKIP_PREFIX, release

_TIER_DIR = Path(__file__).resolve().parent

_SKIP_REASON = (
    "sglang is not installed; the real-SGLang tier needs `pip install --no-deps sglang==0.5.23` "
    "plus `pip install --no-deps -r requirements/sglang-cpu.txt` (see tests/real/README.md)"
)


def pytest_report_header(config: pytest.Config) -> str:
    """Say which SGLang release the tier runs against (the matrix runs several)."""
    del config
    return f"kvcompat real tier: SGLang {release()} (capability skips start {SKIP_PREFIX!r})"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Name the SGLang release in every failure report of this tier."""
    del call
    report = yield
    if report.failed and _in_tier(item):
        report.sections.append(("SGLang release", f"this failure is on SGLang {release()}"))
    return report


def _in_tier(item: pytest.Item) -> bool:
    return _TIER_DIR in Path(str(item.path)).resolve().parents


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    del config
    installed = sglang_installed()
    for item in items:
        if not _in_tier(item):
            continue
        item.add_marker(pytest.mark.sglang)
        for spec in IMPORT_WARNING_FILTERS:
            item.add_marker(pytest.mark.filterwarnings(spec))
        if not installed:
            item.add_marker(pytest.mark.skip(reason=_SKIP_REASON))


@pytest.fixture(scope="session", autouse=True)
def sglang_session() -> Iterator[SGLangSession]:
    """The process-wide SGLang set-up (see ``_sglang.env``), released at session end."""
    session = prepare_sglang()
    yield session
    release_sglang()
