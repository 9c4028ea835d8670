"""Every example under examples/ runs to completion (they are documentation that executes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip(), "an example should print what it shows"


def test_demo_command_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kvcompat", "demo"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "raises NotImplementedError('Use get_key_buffer instead.')" in out
    assert "single_kv  True" in out
    assert out.count(" yes") >= 6
    assert " NO" not in out
    # part 4: exact round trips on bf16 pools, a small bounded error on the fp8 V4 layout
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert rows["MHA"][-2:] == ["0", "0"]
    assert rows["MLA"][-2:] == ["0", "0"]
    v4 = next(line.split() for line in out.splitlines() if " v4 " in line)
    assert 0 < float(v4[-2]) < 0.5
    assert 0 < float(v4[-1]) < 0.1
