"""`kvcompat doctor` imports SGLang's pool modules (in a child process) and names what is missing;
`kvcompat inspect --sglang` names the missing dependency.

The failures are made in a subprocess by a ``sitecustomize`` that puts a blocker first on
``sys.meta_path``: torchvision raising as PyPI's wheel does beside the CPU build of torch, or
a light dependency that is not installed. The children (doctor's probe included) inherit it.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvcompat.inspection._cli import run_doctor

ROOT = Path(__file__).resolve().parents[2]
SGLANG_INSTALLED = pytest.importorskip("importlib.util").find_spec("sglang") is not None
needs_sglang = pytest.mark.skipif(not SGLANG_INSTALLED, reason="sglang is not installed")

_BLOCKER = textwrap.dedent(
    """
    import importlib.machinery, sys

    class _Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] != {name!r}:
                return None
            if {broken!r}:  # found, and fails while it runs (as the CUDA-built wheel does)
                return importlib.machinery.ModuleSpec(name, self)
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            raise RuntimeError("operator torchvision::nms does not exist")

    sys.meta_path.insert(0, _Blocker())
    """
)


def _kvcompat(tmp_path: Path, *args: str, block: str, broken: bool = False) -> dict[str, str]:
    (tmp_path / "sitecustomize.py").write_text(_BLOCKER.format(name=block, broken=broken))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    result = subprocess.run(
        [sys.executable, "-m", "kvcompat", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=600,
    )
    return {"rc": str(result.returncode), "out": result.stdout, "err": result.stderr}


@needs_sglang
def test_doctor_imports_the_pool_modules_here() -> None:
    out = io.StringIO()
    assert run_doctor(out, json=True) == 0
    report = json.loads(out.getvalue())["sglang_import"]
    assert report["modules"] == [
        "sglang.srt.mem_cache.memory_pool",
        "sglang.srt.mem_cache.swa_memory_pool",
        "sglang.srt.mem_cache.deepseek_v4_memory_pool",
    ]
    # Decided apart from doctor: does a real torchvision import in this environment?
    probe = subprocess.run(
        [sys.executable, "-c", "import torchvision"], capture_output=True, check=False
    )
    assert report["ok"] is (probe.returncode == 0)
    if report["ok"]:
        assert report["fix"] is None
        return
    # This environment (sglang --no-deps, no torchvision): the plain import fails on it, and
    # the public shim makes all three import.
    assert report["missing"] == "torchvision"
    assert report["error"] == "ModuleNotFoundError: No module named 'torchvision'"
    assert report["shim"]["ok"] is True
    assert report["shim"]["said"] == (
        "torchvision: kvcompat's import-only shim (torchvision is not installed)"
    )
    assert "call kvcompat.testing.sglang_cpu() before importing sglang" in report["fix"]
    text = io.StringIO()
    run_doctor(text)
    lines = text.getvalue().splitlines()
    assert (
        "  FAILED: sglang.srt.mem_cache.memory_pool: ModuleNotFoundError: No module named "
        "'torchvision'" in lines
    )
    assert any(
        line.startswith("  with kvcompat.testing.sglang_cpu(): all 3 import") for line in lines
    )
    assert "docs/real-sglang.md" in text.getvalue()


@needs_sglang
def test_doctor_names_a_broken_torchvision_and_the_shim_fix(tmp_path: Path) -> None:
    result = _kvcompat(tmp_path, "doctor", "--format", "json", block="torchvision", broken=True)
    assert result["rc"] == "0", result["err"][-3000:]
    report = json.loads(result["out"])["sglang_import"]
    assert report["ok"] is False
    assert report["torchvision"] is True
    assert report["error"] == "RuntimeError: operator torchvision::nms does not exist"
    assert report["shim"]["ok"] is True, report["shim"]
    assert "install a torchvision built for torch 2." in report["fix"]
    assert "kvcompat.testing.sglang_cpu()" in report["fix"]


@needs_sglang
def test_doctor_names_a_missing_light_dependency(tmp_path: Path) -> None:
    result = _kvcompat(tmp_path, "doctor", block="psutil")
    assert result["rc"] == "0", result["err"][-3000:]
    text = result["out"]
    assert "No module named 'psutil'" in text
    assert "SGLang's pool modules need the module 'psutil', which is not installed." in text
    assert "pip install --no-deps -r requirements/sglang-cpu.txt" in text
    assert "with kvcompat.testing.sglang_cpu()" not in text, "the shim does not fix psutil"


@needs_sglang
def test_inspect_sglang_names_the_missing_dependency(tmp_path: Path) -> None:
    args = ("inspect", "--sglang", "MHATokenToKVPool", "size=64", "page_size=16")
    result = _kvcompat(tmp_path, *args, block="torchvision")
    assert result["rc"] == "2"
    err = result["err"]
    assert "is SGLang installed?" not in err
    assert (
        "cannot import sglang.srt.mem_cache.memory_pool (No module named 'torchvision'); "
        "SGLang's pool modules import torchvision" in err
    )
    assert "kvcompat.testing.sglang_cpu()" in err


@needs_sglang
def test_inspect_sglang_names_a_broken_torchvision(tmp_path: Path) -> None:
    args = ("inspect", "--sglang", "MHATokenToKVPool", "size=64", "page_size=16")
    result = _kvcompat(tmp_path, *args, block="torchvision", broken=True)
    assert result["rc"] == "2"
    assert (
        "(RuntimeError: operator torchvision::nms does not exist); SGLang's pool modules "
        "import torchvision" in result["err"]
    )


def test_inspect_sglang_says_when_sglang_is_missing(tmp_path: Path) -> None:
    args = ("inspect", "--sglang", "MHATokenToKVPool")
    result = _kvcompat(tmp_path, *args, block="sglang")
    assert result["rc"] == "2"
    assert (
        "cannot import sglang.srt.mem_cache.memory_pool (No module named 'sglang'); "
        "sglang is not installed. Hint: pip install sglang; see the docs page "
        "'Real SGLang pools on a CPU' (docs/real-sglang.md) for a CPU machine." in result["err"]
    )
