"""What a user gets from PyPI: the wheel's metadata and files, a complete sdist that runs its
own tests, one version source, developer tools as dependency groups, the pre-commit hook.

The wheel in a clean venv (demo, doctor, scan, the examples) is ``make wheel-check``
(``.ci/wheel_check.py``), part of ``make test``.
"""

from __future__ import annotations

import email.parser
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import kvcompat

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _name(requirement: str) -> str:
    return _normal(re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0])


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "wheel", "-q",
         "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT)],
        check=True, capture_output=True, cwd=out,
    )  # fmt: skip
    (built,) = out.glob("kvcompat-*.whl")
    return built


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sdist")
    code = "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))"
    result = subprocess.run(
        [sys.executable, "-c", code, str(out)], check=True, capture_output=True, text=True,
        cwd=ROOT,
    )  # fmt: skip
    return out / result.stdout.strip().splitlines()[-1]


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(archive.read(name).decode())


# -- license, URLs, classifiers ------------------------------------------------------------------


def test_license_is_the_full_apache_2_text() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text
    assert "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert len(text.splitlines()) > 150
    assert PROJECT["license"] == "Apache-2.0"
    assert PROJECT["license-files"] == ["LICENSE"]


def test_wheel_ships_the_license_and_the_typing_marker(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (license_name,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert archive.read(license_name) == (ROOT / "LICENSE").read_bytes()
    assert "kvcompat/py.typed" in names
    assert "kvcompat/_version.py" in names
    assert not [n for n in names if n.startswith(("tests/", "docs/", "examples/"))]


def test_wheel_metadata(wheel: Path) -> None:
    meta = _metadata(wheel)
    assert meta["Version"] == kvcompat.__version__
    assert meta["License-Expression"] == "Apache-2.0"
    urls = dict(value.split(", ", 1) for value in meta.get_all("Project-URL") or [])
    assert {"Homepage", "Documentation", "Source", "Issues", "Changelog"} <= set(urls)
    assert all(url.startswith("https://") for url in urls.values())
    classifiers = meta.get_all("Classifier") or []
    assert any(c.startswith("Development Status :: ") for c in classifiers)
    low = int(PROJECT["requires-python"].removeprefix(">=3."))
    for minor in range(low, 14):
        assert f"Programming Language :: Python :: 3.{minor}" in classifiers
    assert "Typing :: Typed" in classifiers
    # runtime extras only: the developer tools are dependency groups
    assert meta.get_all("Provides-Extra") == ["triton"]
    requires = {_name(r) for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r}
    assert requires == {"torch", "numpy", "typing-extensions"}


# -- one version ---------------------------------------------------------------------------------


def test_the_version_is_written_once() -> None:
    assert PROJECT["dynamic"] == ["version"]
    assert "version" not in PROJECT
    source = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]
    assert source == {"attr": "kvcompat._version.__version__"}
    from kvcompat import _version

    assert kvcompat.__version__ == _version.__version__
    literal = f'"{kvcompat.__version__}"'
    holders = [
        str(path.relative_to(ROOT))
        for path in [ROOT / "pyproject.toml", *sorted((ROOT / "kvcompat").rglob("*.py"))]
        if literal in path.read_text(encoding="utf-8")
    ]
    assert holders == ["kvcompat/_version.py"]


# -- changelog -----------------------------------------------------------------------------------


def test_changelog_has_unreleased_and_this_version_and_a_docs_page() -> None:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "## [Unreleased]" in text
    assert f"## [{kvcompat.__version__}] - " in text
    page = (ROOT / "docs" / "changelog.md").read_text(encoding="utf-8")
    assert "{include} ../CHANGELOG.md" in page
    assert "changelog" in (ROOT / "docs" / "index.md").read_text(encoding="utf-8")


# -- dependency groups ---------------------------------------------------------------------------


def test_developer_tools_are_dependency_groups_pinned_in_requirements() -> None:
    assert set(PROJECT["optional-dependencies"]) == {"triton"}
    groups = PYPROJECT["dependency-groups"]
    assert {"test", "lint", "docs", "dev"} <= set(groups)
    included = {entry["include-group"] for entry in groups["dev"] if isinstance(entry, dict)}
    assert included == {"test", "lint", "docs"}
    pinned = {
        _name(line)
        for file in ("dev.txt", "sglang-cpu.txt")
        for line in (ROOT / "requirements" / file).read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    for group in ("test", "lint", "docs"):
        for requirement in groups[group]:
            assert _name(requirement) in pinned, f"{requirement} ({group}) is not pinned"
    assert "triton" not in {_name(r) for r in groups["docs"]}  # the docs build needs no GPU stack


# -- the sdist -----------------------------------------------------------------------------------


def _sdist_names(sdist: Path) -> set[str]:
    with tarfile.open(sdist) as archive:
        prefix = archive.getnames()[0].split("/")[0] + "/"
        return {n.removeprefix(prefix) for n in archive.getnames() if n.startswith(prefix)}


def test_sdist_holds_every_tracked_file(sdist: Path) -> None:
    names = _sdist_names(sdist)
    for needed in (
        "LICENSE", "CHANGELOG.md", "README.md", "Makefile", "pyproject.toml", ".ci/run",
        ".ci/wheel_check.py", ".pre-commit-hooks.yaml", "hooks/kvcompat-scan",
        "requirements/torch-cpu.txt", "tests/conftest.py", "docs/conf.py", "docs/index.md",
        "examples/wrap_pool.py", "benchmarks/bench_getters.py", "tests/fixtures/layouts/v4.pt",
    ):  # fmt: skip
        assert needed in names, needed
    assert not [n for n in names if "__pycache__" in n or n.startswith("docs/_build")]
    if shutil.which("git") and (ROOT / ".git").exists():
        tracked = subprocess.run(
            ["git", "ls-files"], capture_output=True, text=True, check=True, cwd=ROOT
        ).stdout.split()
        missing = sorted(set(tracked) - names - {".gitignore"})
        assert missing == [], f"tracked files missing from the sdist: {missing[:20]}"


def test_sdist_runs_its_own_tests(sdist: Path, tmp_path: Path) -> None:
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path, filter="data")
    (tree,) = tmp_path.iterdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run(
        [sys.executable, "-c", "import kvcompat; print(kvcompat.__file__)"],
        capture_output=True, text=True, check=True, cwd=tree, env=env,
    )  # fmt: skip
    assert where.stdout.strip() == str(tree / "kvcompat" / "__init__.py")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
         "tests/core", "tests/layouts/test_layouts_svg.py", "tests/scan/test_scan_cli.py"],
        capture_output=True, text=True, check=False, cwd=tree, env=env, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout


# -- the pre-commit hook -------------------------------------------------------------------------


def test_pre_commit_hook_runs_the_scanner_without_torch(tmp_path: Path) -> None:
    yaml = pytest.importorskip("yaml")
    (hook,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))
    assert hook["id"] == "kvcompat-scan"
    assert hook["language"] == "script"  # installs nothing: no torch
    assert hook["types"] == ["python"]
    entry = ROOT / hook["entry"]
    assert os.access(entry, os.X_OK)
    bad, good = tmp_path / "bad.py", tmp_path / "good.py"
    bad.write_text("k, v = token_to_kv_pool.get_kv_buffer(layer_id)\n")
    good.write_text("import kvcompat\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"PYTHON": sys.executable, "PYTHONPROFILEIMPORTTIME": "1"}
    found = subprocess.run(
        [str(entry), str(bad), str(good)], capture_output=True, text=True, check=False,
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert found.returncode == 1
    assert "bad.py:1:" in found.stdout
    assert "KVC002" in found.stdout
    imported = {line.rsplit("|", 1)[1].strip() for line in found.stderr.splitlines() if "|" in line}
    assert "kvcompat.scan" in imported
    assert not {m for m in imported if m.split(".")[0] == "torch"}
    clean = subprocess.run(
        [str(entry), str(good)], capture_output=True, text=True, check=False, cwd=tmp_path,
        env=env,
    )  # fmt: skip
    assert clean.returncode == 0


# -- CI ------------------------------------------------------------------------------------------


def test_make_test_checks_the_built_wheel() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    test_line = next(line for line in makefile.splitlines() if line.startswith("test:"))
    for target in ("lint", "typecheck", "docs", "unit", "wheel-check"):
        assert target in test_line.split()
    assert "wheel-check:" in makefile
    assert ".ci/wheel_check.py" in makefile
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
