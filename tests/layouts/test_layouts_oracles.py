"""kvcompat's codecs against the installed SGLang release's own code, run on CPU.

The comparisons live in ``_oracle/sglang_oracles.py`` (its docstring says what is compared
byte for byte and what the Triton interpreter cannot show); they run in one subprocess
with ``TRITON_INTERPRET=1`` set before triton is imported, so this process's triton (if
any) is untouched. Skipped when sglang is not installed. The release matrix
(``tests/release_matrix.py``) runs it under every release it covers; a check whose code a
release does not have is a capability skip there ("release lacks: ...").
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _oracle import CHECKS

pytestmark = [pytest.mark.sglang, pytest.mark.interpret, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "_oracle" / "sglang_oracles.py"


@pytest.fixture(scope="module")
def oracle_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    if importlib.util.find_spec("sglang") is None:
        pytest.skip(
            "sglang is not installed (pip install --no-deps sglang==0.5.23; see "
            "shared/reference/sglang-on-cpu.md)"
        )
    cache = tmp_path_factory.mktemp("sglang-cache")
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "SGLANG_CACHE_DIR": str(cache),
        "SGLANG_JIT_CACHE_DIR": str(cache),
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
        ),
    }
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", str(SCRIPT)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=900,
        check=False,
    )
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            results[record["check"]] = record
    if proc.returncode != 0 or not results:
        pytest.fail(f"oracle script failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
    return results


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_matches_sglang(oracle_results: dict[str, dict[str, str]], check: str) -> None:
    record = oracle_results.get(check)
    assert record is not None, f"{check} produced no result"
    if record["status"] == "skip":
        pytest.skip(record["detail"])
    assert record["status"] == "pass", record["detail"]
