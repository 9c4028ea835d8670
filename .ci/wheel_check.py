"""Build the wheel and use it as a new user would: ``make wheel-check`` (part of ``make test``).

1. The install block of ``docs/quickstart.md`` (the fenced block after the
   ``<!-- install-commands`` marker, the same on README.md and docs/index.md), line by line,
   in a clean venv and a temporary folder outside the checkout: the CPU torch first, the
   wheel built from this checkout into ``dist/``, ``pip install dist/kvcompat-*.whl``,
   ``kvcompat demo``. Two lines cannot run verbatim here and are said so when they run:
   the ``pip wheel ... .`` line builds from this checkout without an isolated build env (no
   download); and ``--index-url https://download.pytorch.org/whl/cpu`` is dropped when that
   host does not resolve (CI's machines reach PyPI only; their pip configuration serves the
   same CPU wheel from a local folder). The torch installed must then be the page's pinned
   version, the pin of ``requirements/torch-cpu.txt``, and a CPU build (no CUDA).
2. In that venv: ``pip check``, then ``kvcompat --version``, ``demo``, ``doctor`` (text and
   JSON), ``scan`` and every example, run from the temporary folder (so the checkout is
   never imported). No command may print torch's "Failed to initialize NumPy" warning, or
   anything else on stderr.
3. The torch-free CI recipe of ``docs/scan.md``, read from the page: its workflow step's
   commands run in a venv without torch (the built wheel stands for ``dist/kvcompat-*.whl``
   in the ``pip install`` line, a probe file for ``src/``); ``kvcompat --version`` and
   ``--help`` work there too, and ``kvcompat demo`` fails with one line naming
   ``pip install torch``.

The clean venvs live in ``.wheel-check/`` and are kept between local runs (the torch
install is most of the first run's time; kvcompat is uninstalled before the page's lines
run again). Prints the wall time of each step.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".wheel-check"
PINS = ROOT / "requirements" / "torch-cpu.txt"
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
SCAN_PAGE = ROOT / "docs" / "scan.md"
WHEEL_GLOB = "dist/kvcompat-*.whl"
"""How the scanner's CI recipe names the wheel built from a checkout (the built wheel here)."""
WHEEL_INSTALL = f"pip install --no-deps {WHEEL_GLOB}"
INSTALL_PAGE = ROOT / "docs" / "quickstart.md"
INSTALL_MARKER = "<!-- install-commands"
NUMPY_WARNING = "Failed to initialize NumPy"


class CheckError(RuntimeError):
    """A check failed; the message says which and shows the output."""


def _step(name: str, started: float) -> None:
    print(f"wheel-check: {name} ({time.perf_counter() - started:.1f} s)", flush=True)


def _run(
    cmd: list[str], *, cwd: Path, expect: int = 0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, check=False, env=env, timeout=900
    )
    if result.returncode != expect:
        msg = (
            f"{' '.join(cmd)} exited {result.returncode}, expected {expect}\n"
            f"--- stdout (tail)\n{result.stdout[-3000:]}\n"
            f"--- stderr (tail)\n{result.stderr[-3000:]}"
        )
        raise CheckError(msg)
    return result


def _clean_env() -> dict[str, str]:
    """The caller's environment without anything that would put the checkout on sys.path."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME"}}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _quiet(result: subprocess.CompletedProcess[str], what: str) -> None:
    if NUMPY_WARNING in result.stderr:
        msg = f"{what}: torch printed its NumPy warning:\n{result.stderr[-2000:]}"
        raise CheckError(msg)


def _venv(name: str, requirements: list[str]) -> Path:
    """A venv under .wheel-check/, rebuilt when its requirement lines change."""
    folder = WORK / name
    key = hashlib.sha256("\n".join(requirements).encode()).hexdigest()
    stamp = folder / ".stamp"
    if stamp.exists() and stamp.read_text() == key:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    _run([sys.executable, "-m", "venv", str(folder)], cwd=WORK)
    if requirements:
        pip = [str(folder / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
        _run([*pip, "install", "-q", *requirements], cwd=WORK)
    stamp.write_text(key)
    return folder


def build_wheel(dist: Path) -> Path:
    """The wheel of this checkout, built without network or an isolated build env."""
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    cmd = [*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(ROOT)]
    dist.mkdir(parents=True, exist_ok=True)
    subprocess.run(cmd, check=True, cwd=dist)
    (wheel,) = dist.glob("kvcompat-*.whl")
    return wheel


def install_commands(text: str) -> list[str]:
    """The commands of the fenced block after the install marker, without their comments."""
    if INSTALL_MARKER not in text:
        msg = f"no {INSTALL_MARKER} marker on the page"
        raise CheckError(msg)
    after = text[text.index(INSTALL_MARKER) :]
    after = after[after.index("\n") + 1 :]
    if not after.startswith("```bash\n"):
        msg = f"the line after {INSTALL_MARKER} ... --> must open a ```bash block"
        raise CheckError(msg)
    body = after[len("```bash\n") : after.index("\n```", len("```bash"))]
    commands = []
    for line in body.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            commands.append(" ".join(words))
    return commands


def _resolves(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return False
    return True


def page_steps(commands: list[str], *, reachable: bool | None = None) -> list[tuple[str, str]]:
    """``(kind, command)`` for each line of the install block.

    ``torch`` and ``shell`` lines run in the venv's shell; ``build`` is this checkout's
    wheel build into ``dist/``. ``--index-url URL`` is dropped from the ``torch`` line when
    URL's host does not resolve (``reachable`` overrides the look-up, for tests).
    """
    steps: list[tuple[str, str]] = []
    for command in commands:
        words = command.split()
        if words[:2] == ["pip", "wheel"]:
            if words[2:] != ["--no-deps", "-w", "dist", "."]:
                msg = f"the page's build line changed ({command}): update .ci/wheel_check.py"
                raise CheckError(msg)
            steps.append(("build", command))
        elif words[:2] == ["pip", "install"] and any(w.startswith("torch==") for w in words):
            if "--index-url" in words:
                at = words.index("--index-url")
                url = words[at + 1]
                if not (_resolves(url) if reachable is None else reachable):
                    words = words[:at] + words[at + 2 :]
            steps.append(("torch", " ".join(words)))
        else:
            steps.append(("shell", command))
    return steps


def follow_install_page(venv: Path, outside: Path) -> Path:
    """Run the install block of docs/quickstart.md in ``venv``; returns the built wheel."""
    commands = install_commands(INSTALL_PAGE.read_text(encoding="utf-8"))
    env = _clean_env()
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"  # as if activated
    env["VIRTUAL_ENV"] = str(venv)
    wheel: Path | None = None
    for kind, command in page_steps(commands):
        started = time.perf_counter()
        if kind == "build":
            wheel = build_wheel(outside / "dist")
            _step(
                f"page: {command} (built {wheel.name}: this checkout, no build isolation)", started
            )
            continue
        if kind == "torch" and command not in commands:
            print(f"wheel-check: page: torch's CPU index does not resolve here: {command}")
        result = _run(["sh", "-c", command], cwd=outside, env=env)
        _quiet(result, command)
        if kind == "shell" and command.startswith("kvcompat") and result.stderr:
            msg = f"{command} printed on stderr:\n{result.stderr[-2000:]}"
            raise CheckError(msg)
        _step(f"page: {command}", started)
    if wheel is None:
        msg = f"{INSTALL_PAGE.name}'s install block builds no wheel: {commands}"
        raise CheckError(msg)
    probe = "import torch; print(torch.__version__, torch.version.cuda)"
    found = _run([str(venv / "bin" / "python"), "-c", probe], cwd=outside, env=env)
    version, cuda = found.stdout.split()
    if version.split("+")[0] != _pinned("torch") or cuda != "None":
        msg = f"the page installed torch {version} (CUDA {cuda}), not the CPU build of the pin"
        raise CheckError(msg)
    return wheel


def check_with_torch(outside: Path) -> Path:
    """The install page's commands in a clean venv, then every command and example there."""
    started = time.perf_counter()
    venv = _venv("torch", [])
    py, kv = str(venv / "bin" / "python"), str(venv / "bin" / "kvcompat")
    pip = [py, "-m", "pip", "--disable-pip-version-check"]
    _run([*pip, "uninstall", "-q", "-y", "kvcompat"], cwd=outside)  # a kept venv's old build
    _step("clean venv", started)
    wheel = follow_install_page(venv, outside)
    started = time.perf_counter()
    _run([*pip, "check"], cwd=outside)  # the page's installs satisfy every declared dependency
    _step("pip check", started)
    env = _clean_env()
    where = _run([py, "-c", "import kvcompat; print(kvcompat.__file__)"], cwd=outside, env=env)
    if not where.stdout.strip().startswith(str(venv)):
        msg = f"kvcompat was imported from {where.stdout.strip()}, not from the venv"
        raise CheckError(msg)

    started = time.perf_counter()
    for args, expect in (
        (["--version"], 0),
        (["demo"], 0),
        (["doctor"], 0),
        (["doctor", "--format", "json"], 0),
        (["inspect", "--format", "json"], 0),
    ):
        result = _run([kv, *args], cwd=outside, expect=expect, env=env)
        _quiet(result, f"kvcompat {' '.join(args)}")
        if result.stderr:
            msg = f"kvcompat {' '.join(args)} printed on stderr:\n{result.stderr[-2000:]}"
            raise CheckError(msg)
    doctor = json.loads(_run([kv, "doctor", "--json"], cwd=outside, env=env).stdout)
    if doctor["torch"]["version"].split("+")[0] != _pinned("torch"):
        msg = f"the clean venv has torch {doctor['torch']['version']}, not the pin"
        raise CheckError(msg)
    _step("kvcompat --version, demo, doctor, inspect", started)

    started = time.perf_counter()
    copies = outside / "examples"
    copies.mkdir()
    for example in EXAMPLES:
        shutil.copy(example, copies / example.name)
        result = _run([py, str(copies / example.name)], cwd=outside, env=env)
        _quiet(result, example.name)
        if not result.stdout.strip():
            msg = f"{example.name} printed nothing"
            raise CheckError(msg)
    _step(f"{len(EXAMPLES)} examples", started)

    started = time.perf_counter()
    scanned = _run([kv, "scan", str(copies)], cwd=outside, expect=1, env=env)  # they call
    _quiet(scanned, "kvcompat scan")  # native getters on purpose, to show what breaks
    if "finding" not in scanned.stdout:
        msg = f"kvcompat scan printed no summary:\n{scanned.stdout[-2000:]}"
        raise CheckError(msg)
    _step("kvcompat scan of the examples", started)
    return wheel


def ci_recipe() -> list[str]:
    """The commands of the workflow step under "In CI" in docs/scan.md."""
    text = SCAN_PAGE.read_text(encoding="utf-8")
    section = text[text.index("### In CI") :]
    block = section[section.index("```yaml") : section.index("```", section.index("```yaml") + 7)]
    lines = block.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "run: |") + 1
    return [line.strip() for line in lines[start:] if line.strip()]


def check_without_torch(wheel: Path, outside: Path) -> None:
    """The docs' torch-free recipe: ``pip install --no-deps`` of the wheel runs the scanner."""
    started = time.perf_counter()
    venv = _venv("no-torch", [])
    bin_dir = venv / "bin"
    py, kv = str(bin_dir / "python"), str(bin_dir / "kvcompat")
    env = _clean_env()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"  # as if the venv were active
    project = outside / "project"
    (project / "src").mkdir(parents=True)
    (project / "tests" / "fixtures").mkdir(parents=True)
    (project / "src" / "probe.py").write_text("k, v = token_to_kv_pool.get_kv_buffer(layer_id)\n")
    (project / "tests" / "fixtures" / "old.py").write_text("v = pool.get_value_buffer(0)\n")
    recipe = ci_recipe()
    if not recipe or not recipe[0].startswith(WHEEL_INSTALL):
        msg = f"docs/scan.md's CI step should start with {WHEEL_INSTALL}: {recipe}"
        raise CheckError(msg)
    found = None
    for line in recipe:
        words = line.split()
        if words[:2] == ["pip", "install"]:
            words = [
                py,
                "-m",
                "pip",
                "--disable-pip-version-check",
                "install",
                "-q",
                "--force-reinstall",
                *[str(wheel) if w == WHEEL_GLOB else w for w in words[2:]],
            ]
            _run(words, cwd=project, env=env)
        else:
            found = _run(["sh", "-c", line], cwd=project, expect=1, env=env)  # the probe's finding
    _run(
        [py, "-c", "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is not None)"],
        cwd=outside,
        env=env,
    )
    if found is None or "KVC002" not in found.stdout or "KVC001" in found.stdout or found.stderr:
        msg = (
            f"the CI recipe's scan misbehaved:\n{found and found.stdout}\n{found and found.stderr}"
        )
        raise CheckError(msg)
    probe = project / "src" / "probe.py"
    version = _run([kv, "--version"], cwd=outside, env=env)
    _run([kv, "--help"], cwd=outside, env=env)
    if version.stderr:
        msg = f"kvcompat --version printed on stderr:\n{version.stderr}"
        raise CheckError(msg)
    _run([kv, "scan", "--format", "json", str(probe)], cwd=outside, expect=1, env=env)
    demo = _run([kv, "demo"], cwd=outside, expect=1, env=env)
    lines = demo.stderr.strip().splitlines()
    if len(lines) != 1 or "pip install torch" not in lines[0]:
        msg = (
            "kvcompat demo without torch should print one line naming pip install torch:\n"
            f"{demo.stderr}"
        )
        raise CheckError(msg)
    _step("torch-free venv: --version, --help, scan; demo refused in one line", started)


def _pinned(name: str) -> str:
    for line in PINS.read_text().splitlines():
        if line.startswith(f"{name}=="):
            return line.split("==", 1)[1].strip()
    msg = f"{PINS} pins no {name}"
    raise CheckError(msg)


def main() -> int:
    """Run every check; print the time of each and the total."""
    total = time.perf_counter()
    WORK.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kvcompat-wheel-check-") as tmp:
        outside = Path(tmp) / "outside"
        outside.mkdir()
        try:
            wheel = check_with_torch(outside)
            check_without_torch(wheel, outside)
        except CheckError as exc:
            print(f"wheel-check: FAILED: {exc}", file=sys.stderr)
            return 1
    _step("all checks passed", total)
    return 0


if __name__ == "__main__":
    sys.exit(main())
