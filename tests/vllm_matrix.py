"""Run the vLLM tier (``tests/vllm``) under every supported vLLM release (``make vllm``).

vLLM is never installed into the test venv. Each release is an *overlay*: ``pip install
--no-deps --target .vllm-releases/<X> vllm==<X>`` (vLLM's wheel alone; with its
dependencies it would pull the multi-GB CUDA stack), plus one shared overlay
``.vllm-releases/deps`` of the light packages its planner, allocator, DeepSeek-V4 Triton ops
and connector base import (``requirements/vllm-cpu.txt``, also ``--no-deps``). Both go first
on ``PYTHONPATH`` of a subprocess running ``pytest tests/vllm`` with ``TRITON_INTERPRET=1``
and an empty ``CUDA_VISIBLE_DEVICES`` (vLLM's Triton readers run under the interpreter).

An install is skipped when its stamp (the pins it was made from) matches. A release that
cannot be installed, imports as another version or fails a test makes the command
exit non-zero (the only skips are capabilities a release lacks, named: 0.33 has no
extensible cache). Per release it writes
``docs/_data/vllm-matrix/<X>.json`` (counts and wall times).

Usage::

    python tests/vllm_matrix.py            # every release
    python tests/vllm_matrix.py 0.34.0     # some releases
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

sys.path.insert(0, str(ROOT))
from kvcompat.adapters._vllm_plan import TESTED_RELEASES  # noqa: E402

RELEASES = TESTED_RELEASES
"""Every vLLM release kvcompat supports, oldest first: a new release is one entry of
``kvcompat/adapters/_vllm_plan.py: TESTED_RELEASES`` (``kvcompat doctor`` reads it too)."""
OVERLAYS = ROOT / ".vllm-releases"
DEPS = OVERLAYS / "deps"
REQUIREMENTS = ROOT / "requirements" / "vllm-cpu.txt"
DATA = ROOT / "docs" / "_data" / "vllm-matrix"
TIER = "tests/vllm"


def _pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", "install", "-q", *args]


def _install(target: Path, stamp_text: str, args: list[str]) -> float:
    """Install into ``target`` unless its stamp matches; the seconds it took."""
    stamp = target / ".kvcompat-stamp"
    if stamp.is_file() and stamp.read_text() == stamp_text:
        return 0.0
    start = time.monotonic()
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        _pip("--no-deps", "--upgrade", "--target", str(target), *args),
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        sys.stderr.write(done.stdout + done.stderr)
        msg = f"pip could not install {args} into {target} (exit {done.returncode})"
        raise SystemExit(msg)
    stamp.write_text(stamp_text)
    return time.monotonic() - start


def install(release: str) -> float:
    """The release's overlay and the shared dependency overlay; install seconds."""
    pins = REQUIREMENTS.read_text()
    seconds = _install(DEPS, pins, ["-r", str(REQUIREMENTS)])
    return seconds + _install(OVERLAYS / release, f"vllm=={release}\n", [f"vllm=={release}"])


def _env(release: str) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(OVERLAYS / release), str(DEPS), str(ROOT)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["TRITON_INTERPRET"] = "1"
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def check_version(release: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import vllm, sys; sys.stdout.write(vllm.__version__)"],
        cwd=ROOT,
        env=_env(release),
        check=False,
        capture_output=True,
        text=True,
    )
    got = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]
    if done.returncode or got != release:
        msg = f"the overlay of vLLM {release} imports as {got!r} (exit {done.returncode})"
        raise SystemExit(msg)


def run_tier(release: str, junit: Path) -> tuple[int, float]:
    start = time.monotonic()
    command = [sys.executable, "-m", "pytest", TIER, "-q", "-p", "no:cacheprovider"]
    command += [f"--junitxml={junit}"]
    done = subprocess.run(command, cwd=ROOT, env=_env(release), check=False)
    return done.returncode, time.monotonic() - start


def summarize(junit: Path) -> dict[str, int]:
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    return {key: int(suite.get(key, "0")) for key in ("tests", "failures", "errors", "skipped")}


def case_outcomes(junit: Path) -> dict[str, str]:
    """Each parametrised case's outcome over its tests: passed, skipped or failed.

    A case is the parameter id of ``test_name[case]`` (``mha@LBNHC``, ``dsv4@BLHNC``); it
    failed if any of its tests failed or errored, passed if every test ran and passed, and
    was skipped if none ran. What ``docs/vllm.md``'s per-case table is generated from.
    """
    outcomes: dict[str, set[str]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "")
        if "[" not in name:
            continue
        param = name[name.index("[") + 1 : name.rindex("]")]
        if any(case.find(tag) is not None for tag in ("failure", "error")):
            result = "failed"
        elif case.find("skipped") is not None:
            result = "skipped"
        else:
            result = "passed"
        outcomes.setdefault(param, set()).add(result)
    return {
        param: "failed" if "failed" in seen else "passed" if "passed" in seen else "skipped"
        for param, seen in sorted(outcomes.items())
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("releases", nargs="*", default=list(RELEASES))
    args = parser.parse_args(argv)
    unknown = [release for release in args.releases if release not in RELEASES]
    if unknown:
        parser.error(f"unknown releases {unknown}; supported: {list(RELEASES)}")
    DATA.mkdir(parents=True, exist_ok=True)
    failed: list[str] = []
    for release in args.releases:
        installed = install(release)
        check_version(release)
        junit = OVERLAYS / f"junit-{release}.xml"
        code, seconds = run_tier(release, junit)
        counts = summarize(junit)
        record = {
            "release": release,
            **counts,
            "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
            "install_s": round(installed, 1),
            "tier_s": round(seconds, 1),
            "cases": case_outcomes(junit),
        }
        (DATA / f"{release}.json").write_text(json.dumps(record, indent=2) + "\n")
        print(f"vLLM {release}: {record}")
        # Every test must run: the only skips allowed are those of a capability the
        # release lacks (0.33 has no extensible cache), which the tier names.
        if code or counts["failures"] or counts["errors"]:
            failed.append(release)
    if failed:
        print(f"the vLLM tier failed under {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
