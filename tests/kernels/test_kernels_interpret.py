"""Run the CPU interpreter tier (``_interp_cases.py``) in a fresh process.

``TRITON_INTERPRET=1`` must be set before triton is first imported, and it must not leak
into other tests (it would turn every Triton kernel the session imports afterwards into
an interpreted one, SGLang's included), so the tier runs under its own pytest process and
this test reports its outcome. The summary line lists how many cases passed.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.interpret, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def test_interpreter_tier_passes(tmp_path: Path) -> None:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (pip install triton)")
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "TRITON_CACHE_DIR": str(tmp_path / "triton-cache"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    command = [
        sys.executable, "-m", "pytest", str(HERE / "_interp_cases.py"), "-q",
        "-p", "no:cacheprovider", "-W", "ignore::RuntimeWarning", "--no-header",
        "-o", "addopts=-ra --strict-markers --strict-config",
    ]  # fmt: skip
    proc = subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900, check=False
    )
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    print(summary)  # shown with -rA / -s: the tier's own counts
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert re.search(r"\d+ passed", summary), summary
    assert "skipped" not in summary, summary
