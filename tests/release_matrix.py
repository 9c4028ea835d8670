"""Run the real-SGLang tier under every SGLang release with DeepSeek-V4 pools (``make releases``).

The tier is ``tests/real`` plus the layout oracles (``tests/layouts/test_layouts_oracles.py``:
kvcompat's codecs byte for byte against each release's own quantizers, readers and stores),
the check that the GPU tiers' kernel-only tree of the release offers the same layout code
(``tests/layouts/test_kernel_overlay.py``) and the adversarial tier's cases on SGLang's
pools (bad inputs, faults mid-write, races): every test marked ``sglang`` under those paths.

Each release other than the test venv's own (0.5.23) is an *overlay*: ``pip install --no-deps
--target .sglang-releases/<X> -r requirements/sglang-releases/<X>.txt`` (sglang itself plus the
few pins that release needs), put first on ``PYTHONPATH`` on top of the 0.5.23 venv. Measured in
``shared/reference/sglang-releases.md``: results identical to full environments, 16-25 s and
0.2-0.4 GB per release. An install is skipped when its stamp (a hash of the requirements file)
matches; a release that cannot be installed, imports as another version, or fails a test makes
the whole command exit non-zero -- nothing is skipped silently.

Per release the script writes ``docs/_data/sglang-matrix/<X>.json`` (counts, wall times, the
status of every pool class, the capability skips and their reasons) and re-renders
``docs/supported-versions.md`` from all of them (``tests/real/test_supported_versions.py``
checks the committed page equals the committed data).

Usage::

    python tests/release_matrix.py                 # every release, then render the page
    python tests/release_matrix.py 0.5.12 0.5.20   # some releases
    python tests/release_matrix.py --render        # only re-render the page from the JSON
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def release_key(release: str) -> tuple[int, ...]:
    """Sort key of a release: ``0.5.12`` < ``0.5.12.post1`` < ``0.5.13``."""
    numbers = release.replace(".post", ".").split(".")
    if len(numbers) == 3:
        numbers.append("-1")
    return tuple(int(part) for part in numbers)


RELEASES = (
    "0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1",
    "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23",
)  # fmt: skip
"""Every release with DSv4 pools, 0.5.12 (the first) to 0.5.23 (the test venv's own), and the
three patch builds among them (0.5.12.post1, 0.5.13.post1, 0.5.15.post1), oldest first."""
BASE = "0.5.23"
TIER = (
    "tests/real",
    "tests/layouts/test_layouts_oracles.py",
    "tests/layouts/test_kernel_overlay.py",
    "tests/adversarial",
)
"""What runs under each release: the tests of these paths marked ``sglang`` (those that
build SGLang objects; every test of ``tests/real`` is)."""
OVERLAYS = ROOT / ".sglang-releases"
REQUIREMENTS = ROOT / "requirements" / "sglang-releases"
DATA = ROOT / "docs" / "_data" / "sglang-matrix"
PAGE = ROOT / "docs" / "supported-versions.md"
SKIP_PREFIX = "release lacks:"  # tests/_sglang/features.py: SKIP_PREFIX

CLASSES = (
    "MHATokenToKVPool",
    "MHATokenToKOnlyPool",
    "MLATokenToKVPool",
    "DSATokenToKVPool",
    "HybridLinearKVPool",
    "SWAKVPool",
    "DeepSeekV4SingleKVPool",
    "DeepSeekV4UniformFP8KVPool",
    "HiSparseC4DevicePool",
    "DeepSeekV4IndexerPool",
    "DeepSeekV4TokenToKVPool",
    "LegacyDeepSeekV4SingleKVPool",
)
_CLASS_IN_ID = re.compile(r"\[(?:[^\]]*?)(" + "|".join(sorted(CLASSES, key=len)[::-1]) + r")")


class MatrixError(RuntimeError):
    """A release could not be installed or imported as itself."""


def _python() -> str:
    return sys.executable


def _stamp_text(release: str) -> str:
    req = REQUIREMENTS / f"{release}.txt"
    return hashlib.sha256(req.read_bytes()).hexdigest() + "\n"


def install(release: str) -> tuple[Path | None, float]:
    """The overlay folder for ``release`` (None for the base venv) and the install seconds."""
    req = REQUIREMENTS / f"{release}.txt"
    if not req.is_file():
        msg = f"no {req.relative_to(ROOT)}: add the release's pins there (see its siblings)"
        raise MatrixError(msg)
    if release == BASE:
        return None, 0.0
    target = OVERLAYS / release
    stamp = target / ".kvcompat-stamp"
    if stamp.is_file() and stamp.read_text() == _stamp_text(release):
        return target, 0.0
    started = time.perf_counter()
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    command = [
        _python(), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
        "--no-deps", "--target", str(target), "-r", str(req),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(target, ignore_errors=True)
        msg = (
            f"SGLang {release}: `{' '.join(command)}` failed (exit {done.returncode}):\n"
            f"{done.stderr[-3000:]}"
        )
        raise MatrixError(msg)
    stamp.write_text(_stamp_text(release))
    return target, time.perf_counter() - started


def _env(overlay: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(ROOT)] if overlay is None else [str(overlay), str(ROOT)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def check_version(release: str, overlay: Path | None) -> None:
    """The interpreter must see exactly ``release`` (not the venv's 0.5.23 underneath)."""
    code = "import importlib.metadata as m; print(m.version('sglang'))"
    done = subprocess.run(
        [_python(), "-c", code], cwd=ROOT, env=_env(overlay), capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    seen = done.stdout.strip()
    if done.returncode != 0 or seen != release:
        msg = f"SGLang {release}: the interpreter sees sglang {seen!r} ({done.stderr[-500:]})"
        raise MatrixError(msg)


def run_tier(release: str, overlay: Path | None, junit: Path) -> tuple[int, float]:
    """Run the tier (:data:`TIER`) under ``release``; its exit status and wall seconds."""
    command = [
        _python(), "-m", "pytest", *TIER, "-m", "sglang and not latest_only", "-q",
        "-p", "no:cacheprovider", "-rfE", "--tb=short", f"--junitxml={junit}",
    ]  # fmt: skip
    print(f"== SGLang {release}: {' '.join(command)}", flush=True)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=_env(overlay), check=False)
    return done.returncode, time.perf_counter() - started


def _class_of(name: str) -> str | None:
    match = _CLASS_IN_ID.search(name)
    return match.group(1) if match else None


def summarize(
    release: str, junit: Path, install_s: float, tests_s: float, rc: int
) -> dict[str, Any]:
    """The committed per-release result: counts, classes, capability skips."""
    root = ET.parse(junit).getroot()
    outcomes: Counter[str] = Counter()
    per_class: dict[str, Counter[str]] = {c: Counter() for c in CLASSES}
    lacks: Counter[str] = Counter()
    failures: list[str] = []
    for case in root.iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        skipped = case.find("skipped")
        failed = case.find("failure") if case.find("failure") is not None else case.find("error")
        if failed is not None:
            outcome = "failed"
            failures.append(name)
        elif skipped is not None:
            outcome = "skipped"
            message = skipped.get("message", "")
            if SKIP_PREFIX in message:
                reason = message.split(SKIP_PREFIX, 1)[1].strip()
                lacks[re.sub(r"^SGLang \S+ has no ", "", reason)] += 1
                outcome = "lacks"
        else:
            outcome = "passed"
        outcomes[outcome] += 1
        cls = _class_of(case.get("name", ""))
        if cls is not None:
            per_class[cls][outcome] += 1
    classes = {}
    for cls, counts in per_class.items():
        if counts["failed"]:
            status = "failing"
        elif counts["passed"]:
            status = "supported"
        elif counts["lacks"]:
            status = "absent"
        else:
            status = "not built"
        classes[cls] = {"status": status, **{k: counts[k] for k in ("passed", "failed", "lacks")}}
    return {
        "release": release,
        "overlay": release != BASE,
        "exit_status": rc,
        "tests": {k: outcomes[k] for k in ("passed", "failed", "skipped", "lacks")},
        "install_seconds": round(install_s, 1),
        "tests_seconds": round(tests_s, 1),
        "classes": classes,
        "capability_skips": dict(sorted(lacks.items())),
        "failures": sorted(failures)[:50],
    }


def load_results() -> list[dict[str, Any]]:
    """Every committed per-release result, oldest release first."""
    found = [json.loads(p.read_text()) for p in DATA.glob("*.json")]
    return sorted(found, key=lambda r: release_key(r["release"]))


def render(results: list[dict[str, Any]]) -> str:
    """``docs/supported-versions.md`` from the matrix results."""
    releases = [r["release"] for r in results]
    lines = [
        "# Supported SGLang versions",
        "",
        "<!-- Generated by `python tests/release_matrix.py` (`make releases`) from",
        "     docs/_data/sglang-matrix/*.json; do not edit by hand. -->",
        "",
        "kvcompat is tested against the real pool classes of every SGLang release listed",
        "here: the whole real tier (`tests/real`), the layout oracles (kvcompat's codecs byte",
        "for byte against the release's own quantizers, readers and stores,",
        "`tests/layouts/test_layouts_oracles.py`), the check that the GPU tiers' kernel-only",
        "tree of the release offers the same layout code (`tests/layouts/test_kernel_overlay.py`)",
        "and the adversarial cases on SGLang's pools (bad inputs, faults mid-write, races;",
        "`tests/adversarial`) run under each one.",
        "Releases other than the",
        "test environment's own are overlays (`pip install --no-deps --target",
        ".sglang-releases/<X> -r requirements/sglang-releases/<X>.txt` on top of it). Which",
        "constructor arguments, attributes and methods a release has is read from its classes,",
        "not from its version string. 0.5.12 is the first release with DeepSeek-V4 pools;",
        "0.5.12.post1 changed its DeepSeek-V4 pool's translation cache and the SWA allocator's",
        "full->SWA mapping (the patch builds of 0.5.13 and 0.5.15 change no pool code);",
        "0.5.13 renamed NSA to DSA; 0.5.14 introduced `srt/runtime_context` and `KVWriteLoc`;",
        "0.5.16 moved the layout code under `sglang.kernels`; 0.5.18 has the same DSv4 pool",
        "files as 0.5.19 (the state of August 2026); 0.5.20 introduced the `kv_pools` dict;",
        "0.5.21 `kv_layout`.",
        "",
        "Status per pool class: **supported** (every test of the class passes), **absent** (the",
        "release has no such class or configuration: its tests are skipped by capability),",
        "**failing** (a test fails).",
        "",
        "| class | " + " | ".join(releases) + " |",
        "|---|" + "---|" * len(releases),
    ]
    for cls in CLASSES:
        cells = []
        for result in results:
            info = result["classes"].get(cls, {"status": "not built"})
            cells.append(info["status"])
        lines.append(f"| `{cls}` | " + " | ".join(cells) + " |")
    lines += [
        "",
        "`LegacyDeepSeekV4SingleKVPool` is the test double of `tests/_sglang/legacy.py`: a",
        "subclass of each release's real `DeepSeekV4SingleKVPool` that behaves like 0.5.12's",
        "class (no `kv_layout`, `quantize_block_size = 64`, `(S + P + 1) // P` pages, a raw-index",
        "`uint8` `get_key_buffer`).",
        "",
        "## Test counts and wall time",
        "",
        "| release | passed | failed | skipped by capability | other skips | install (s) | tests (s) |",  # noqa: E501
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        t = r["tests"]
        lines.append(
            f"| {r['release']} | {t['passed']} | {t['failed']} | {t['lacks']} | {t['skipped']} "
            f"| {r['install_seconds']} | {r['tests_seconds']} |"
        )
    lines += [
        "",
        "Install time is 0 when the overlay's stamp matched (already installed).",
        "",
        "## What each release lacks (capability skips)",
        "",
    ]
    for r in results:
        skips = r["capability_skips"]
        lines.append(f"- **{r['release']}**: {sum(skips.values())} tests" if skips else
                     f"- **{r['release']}**: nothing")  # fmt: skip
        lines.extend(f"  - {what}: {n}" for what, n in skips.items())
    lines.append("")
    return "\n".join(lines)


def write_page() -> None:
    PAGE.write_text(render(load_results()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("releases", nargs="*", default=list(RELEASES))
    parser.add_argument("--render", action="store_true", help="only re-render the page")
    args = parser.parse_args(argv)
    if args.render:
        write_page()
        return 0
    DATA.mkdir(parents=True, exist_ok=True)
    OVERLAYS.mkdir(exist_ok=True)
    bad: list[str] = []
    for release in args.releases:
        try:
            overlay, install_s = install(release)
            check_version(release, overlay)
        except MatrixError as exc:
            print(f"FAILED: {exc}", file=sys.stderr, flush=True)
            bad.append(f"{release} (install)")
            continue
        junit = OVERLAYS / f"junit-{release}.xml"
        rc, tests_s = run_tier(release, overlay, junit)
        result = summarize(release, junit, install_s, tests_s, rc)
        (DATA / f"{release}.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        write_page()  # page and data agree after every release (a later tier checks that)
        t = result["tests"]
        print(
            f"== SGLang {release}: exit {rc}, {t['passed']} passed, {t['failed']} failed, "
            f"{t['lacks']} skipped by capability, {t['skipped']} other skips; "
            f"install {install_s:.0f} s, tests {tests_s:.0f} s",
            flush=True,
        )
        if rc != 0:
            bad.append(f"{release} (tests: {', '.join(result['failures'][:5])})")
    write_page()
    if bad:
        print("release matrix FAILED: " + "; ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
