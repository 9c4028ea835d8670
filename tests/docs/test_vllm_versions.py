"""docs/vllm.md names exactly the vLLM releases the tier runs, and each one's results are green."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kvcompat.adapters._vllm_plan import TESTED_RELEASES

REPO = Path(__file__).resolve().parents[2]


def test_the_versions_table_lists_the_tested_releases() -> None:
    page = (REPO / "docs" / "vllm.md").read_text()
    section = page.split("## Supported versions", 1)[1].split("\n## ", 1)[0]
    listed = tuple(re.findall(r"^\| (\d+\.\d+\.\d+) \|", section, flags=re.M))
    assert listed == TESTED_RELEASES


def test_every_tested_release_has_green_tier_results() -> None:
    for release in TESTED_RELEASES:
        data = json.loads((REPO / "docs" / "_data" / "vllm-matrix" / f"{release}.json").read_text())
        assert data["release"] == release
        assert data["failures"] == data["errors"] == 0
        assert data["passed"] > 0
