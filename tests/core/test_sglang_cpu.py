"""kvcompat.testing.sglang_cpu(): the torchvision import shim, only where none works.

Each case runs in a fresh interpreter (the shim is process-wide) with a torchvision of its
own making first on sys.path: a working one, a broken one (as PyPI's wheel beside the CPU
build of torch), or none at all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_PROBE = textwrap.dedent(
    """
    import importlib, importlib.util, json, sys
    from kvcompat.testing import sglang_cpu
    first = sglang_cpu()
    second = sglang_cpu()
    import torchvision
    shims = [f for f in sys.meta_path if type(f).__module__ == "kvcompat.testing._sglang_cpu"]
    print(json.dumps({
        "torchvision": first.torchvision,
        "reason": first.reason,
        "str": str(first),
        "same": first is second,
        "shims": len(shims),
        "version": torchvision.__version__,
        "origin": torchvision.__spec__.origin,
        "leftovers": sorted(m for m in sys.modules if m.startswith("torchvision._")),
    }))
    """
)


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )


def _probe(tmp_path: Path) -> dict[str, object]:
    result = _run(_PROBE, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    report: dict[str, object] = json.loads(result.stdout)
    return report


def _package(tmp_path: Path, init: str) -> None:
    package = tmp_path / "torchvision"
    package.mkdir()
    (package / "_meta.py").write_text("LOADED = True\n")
    (package / "__init__.py").write_text(textwrap.dedent(init))


def test_a_working_torchvision_is_left_alone(tmp_path: Path) -> None:
    _package(tmp_path, "__version__ = '9.9.9'\n")
    report = _probe(tmp_path)
    assert report["torchvision"] == "real"
    assert report["reason"] is None
    assert report["shims"] == 0, "no shim where a real torchvision imports"
    assert report["version"] == "9.9.9"
    assert report["str"] == "torchvision: the installed one imports; no shim"


def test_a_broken_torchvision_is_replaced_and_named(tmp_path: Path) -> None:
    # What PyPI's torchvision does beside the CPU build of torch 2.13, after a partial import.
    _package(
        tmp_path,
        """
        from torchvision import _meta
        raise RuntimeError("operator torchvision::nms does not exist")
        """,
    )
    report = _probe(tmp_path)
    assert report["torchvision"] == "shim"
    assert report["reason"] == (
        "the installed torchvision fails to import: "
        "RuntimeError: operator torchvision::nms does not exist"
    )
    assert report["str"] == (
        "torchvision: kvcompat's import-only shim (the installed torchvision fails to import: "
        "RuntimeError: operator torchvision::nms does not exist)"
    )
    assert report["same"] is True
    assert report["shims"] == 1
    assert report["version"] == "0.28.0+kvcompat.shim"
    assert "kvcompat.testing.sglang_cpu" in str(report["origin"])
    assert report["leftovers"] == [], "the broken package's half-import must be dropped"


def test_a_missing_torchvision_is_replaced(tmp_path: Path) -> None:
    # Asked in a fresh interpreter: this one may already hold the shim (doctests, real tier).
    probe = "import importlib.util as u, sys; sys.exit(u.find_spec('torchvision') is not None)"
    if subprocess.run([sys.executable, "-c", probe], check=False).returncode:
        pytest.skip("a torchvision is installed here")
    report = _probe(tmp_path)
    assert report["torchvision"] == "shim"
    assert report["reason"] == "torchvision is not installed"
    assert report["shims"] == 1
    assert report["version"] == "0.28.0+kvcompat.shim"


def test_the_shim_serves_six_modules_and_nothing_else(tmp_path: Path) -> None:
    _package(tmp_path, "raise OSError('libc10_cuda.so: cannot open shared object file')\n")
    code = textwrap.dedent(
        """
        import importlib, importlib.util, json, sys
        from kvcompat.testing import sglang_cpu
        assert sglang_cpu().shimmed
        names = ["torchvision", "torchvision.io", "torchvision.transforms",
                 "torchvision.transforms.functional", "torchvision.transforms.v2",
                 "torchvision.transforms.v2.functional"]
        out = {}
        for name in names:
            module = importlib.import_module(name)
            placeholder = module.Resize
            try:
                placeholder(3)(None)
                called = "no error"
            except RuntimeError as exc:
                called = str(exc)
            out[name] = {
                "spec": importlib.util.find_spec(name) is not None,
                "package": hasattr(module, "__path__"),
                "modes": [m.name for m in module.InterpolationMode],
                "same": module.Resize is placeholder,
                "called": called,
                "wrapped": hasattr(module, "__wrapped__"),
            }
        from torchvision.transforms import InterpolationMode, functional
        out["from_import"] = functional.__name__
        try:
            import torchvision.ops
            out["ops"] = "imported"
        except ModuleNotFoundError as exc:
            out["ops"] = str(exc)
        print(json.dumps(out))
        """
    )
    result = _run(code, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout)
    packages = {"torchvision", "torchvision.transforms", "torchvision.transforms.v2"}
    for name in (
        "torchvision",
        "torchvision.io",
        "torchvision.transforms",
        "torchvision.transforms.functional",
        "torchvision.transforms.v2",
        "torchvision.transforms.v2.functional",
    ):
        entry = out[name]
        assert entry["spec"], name  # transformers probes with find_spec
        assert entry["package"] == (name in packages), name
        assert entry["modes"] == [
            "NEAREST",
            "NEAREST_EXACT",
            "BILINEAR",
            "BICUBIC",
            "BOX",
            "HAMMING",
            "LANCZOS",
        ]
        assert entry["same"], "one placeholder class per name"
        assert entry["called"].startswith(f"{name}.Resize is a placeholder of kvcompat")
        assert "Hint: install a torchvision build that matches your torch" in entry["called"]
        assert not entry["wrapped"], "dunder probes must see an ordinary module"
    assert out["from_import"] == "torchvision.transforms.functional"
    assert out["ops"] == "No module named 'torchvision.ops'"


def test_sglang_cpu_imports_no_engine(tmp_path: Path) -> None:
    code = (
        "import sys\nfrom kvcompat.testing import sglang_cpu\nsglang_cpu()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sglang', 'triton')))"
    )
    result = _run(code, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"
