"""Every example under examples/ runs to completion (they are documentation that executes)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.py"))


SGLANG_INSTALLED = importlib.util.find_spec("sglang") is not None
REAL_SGLANG = Path(__file__).resolve().parents[1] / "examples" / "real_sglang_cpu.py"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip(), "an example should print what it shows"
    if path == REAL_SGLANG:
        _check_real_sglang_output(result.stdout)


def _check_real_sglang_output(out: str) -> None:
    if not SGLANG_INSTALLED:
        assert out.startswith("skipped: sglang is not installed here."), out
        return
    # SGLang's own classes, adapted: bf16 MHA round-trips exactly, the fp8 V4 layout with a
    # small non-zero error (the same bound as the demo's).
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert out.splitlines()[0].startswith("torchvision: "), out
    assert re.search(r"split +layout mha_2x8_bf16 +K \(80, 2, 8\) torch\.bfloat16; "
                     r"write\+read max error 0$", rows["MHATokenToKVPool"]), out  # fmt: skip
    for name in ("DeepSeekV4SingleKVPool", "HiSparseC4DevicePool", ".components['swa']"):
        line = rows[name]
        assert "single_kv layout v4" in line, line
        assert 0 < float(line.rsplit(" ", 1)[1]) <= 0.5, line
    assert rows["DeepSeekV4TokenToKVPool"].endswith(
        "composite, layers [0, 1, 2]; swa: single_kv, c4: single_kv, c128: single_kv, "
        "c4_indexer: key_only"
    )


def test_real_sglang_example_skips_cleanly_without_sglang() -> None:
    # sys.modules["sglang"] = None makes find_spec("sglang") answer None, as where it is absent
    code = (
        "import runpy, sys; sys.modules['sglang'] = None; "
        "runpy.run_path(sys.argv[1], run_name='__main__')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(REAL_SGLANG)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr == ""
    assert result.stdout == (
        "skipped: sglang is not installed here. Install it as docs/real-sglang.md says "
        "(pip install --no-deps -r requirements/sglang-cpu.txt), then run this again.\n"
    )


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
