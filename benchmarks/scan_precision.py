"""Precision and recall of ``kvcompat scan``, per rule, on the labelled corpus of real code.

The corpus (``tests/scan/corpus/labels.json``) names files of the real SGLang 0.5.23
package and of the LMCache 0.5.6 and eagle-harness 0.1.3 wheels, each with its SHA-256,
and labels every finding the scanner reports on them (TP or FP) plus the true accesses
it misses (FN), each with a one-line reason written after reading the code. Nothing of
those packages is copied here: the files are scanned where they are installed
(SGLang) or from the wheels pip downloads.

Usage:
    python benchmarks/scan_precision.py                 # the installed sglang only
    python benchmarks/scan_precision.py --download      # and pip download the wheels
    python benchmarks/scan_precision.py --unpacked lmcache=DIR   # DIR: an unpacked wheel

Prints one row per rule (TP, FP, FN, precision, recall) and the totals, on the whole
corpus and without SGLang's model definitions, then the totals on the generic
attention backends and on the model definitions; exits 1 if a finding has no label, a
labelled TP/FP is no longer reported, or a file's hash differs from the label's.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LABELS = REPO / "tests" / "scan" / "corpus" / "labels.json"
if str(REPO) not in sys.path:  # measure this checkout's scanner, not an installed kvcompat
    sys.path.insert(0, str(REPO))

Key = tuple[str, str, int, int, str]  # package, path, line, col, rule
# Model definitions (SGLang's srt/models, a plugin's models package): code written for
# one architecture, whose pool class the engine picks for it (invisible to a one-file scan).
MODEL_GROUP = "model"


@dataclasses.dataclass(frozen=True)
class Score:
    """Counts for one rule (or all of them)."""

    tp: int = 0
    fp: int = 0
    fn: int = 0

    @property
    def precision(self) -> float | None:
        found = self.tp + self.fp
        return self.tp / found if found else None

    @property
    def recall(self) -> float | None:
        true = self.tp + self.fn
        return self.tp / true if true else None


def load(path: Path = LABELS) -> dict[str, Any]:
    """The labels document."""
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def package_root(name: str) -> Path | None:
    """Where an installed top-level package lives, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def download_wheel(requirement: str, wheel: str, into: Path, timeout: float = 180) -> Path:
    """``pip download`` one wheel (no dependencies) and unpack it; the unpacked root.

    Raises:
        RuntimeError: pip could not download it (no network, no such release).
    """
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
        "--quiet", "--dest", str(into), requirement,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    archive = into / wheel
    if done.returncode != 0 or not archive.is_file():
        msg = f"pip download {requirement} failed: {done.stderr.strip()[-400:]}"
        raise RuntimeError(msg)
    unpacked = into / "unpacked"
    with zipfile.ZipFile(archive) as zipped:
        zipped.extractall(unpacked)
    return unpacked


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check(data: Mapping[str, Any], roots: Mapping[str, Path]) -> tuple[set[Key], list[str]]:
    """Scan the corpus files under ``roots`` (package -> its directory).

    Returns:
        The findings as keys, and the problems: files whose hash differs from the
        label's, findings without a label, TP/FP labels no longer reported, FN
        labels that are now reported.
    """
    from kvcompat.scan import scan_paths

    problems: list[str] = []
    paths: dict[str, tuple[str, str]] = {}  # real path -> (package, path in the corpus)
    for entry in data["files"]:
        root = roots.get(entry["package"])
        if root is None:
            continue
        file = root / entry["path"]
        if not file.is_file():
            problems.append(f"{entry['package']}/{entry['path']}: missing")
            continue
        if sha256(file) != entry["sha256"]:
            problems.append(f"{entry['package']}/{entry['path']}: not the labelled version")
            continue
        paths[os.path.realpath(file)] = (entry["package"], entry["path"])
    # Whole packages, as a user scans a tree: which modules are model code depends on
    # who imports them. Only the findings on corpus files are scored.
    scanned = sorted({str(roots[package]) for package, _ in paths.values()})
    report = scan_paths(scanned)
    problems.extend(error.format() for error in report.errors)
    found = {
        (*paths[real], finding.line, finding.col, finding.code)
        for finding in report.findings
        if (real := os.path.realpath(finding.path)) in paths
    }
    labelled = {
        _key(label): label["label"] for label in data["labels"] if label["package"] in roots
    }
    problems.extend(f"unlabelled finding: {_show(key)}" for key in sorted(found - labelled.keys()))
    for key, label in sorted(labelled.items()):
        if label in ("TP", "FP") and key not in found:
            problems.append(f"labelled {label} but not reported: {_show(key)}")
        if label == "FN" and key in found:
            problems.append(f"labelled FN but now reported (relabel it TP): {_show(key)}")
    return found, problems


def scores(
    data: Mapping[str, Any],
    packages: Iterable[str],
    group: str | None = None,
    *,
    without: str | None = None,
) -> dict[str, Score]:
    """Per-rule scores from the labels of ``packages``.

    Only files of ``group`` count if it is given, and none of ``without``.
    """
    wanted = set(packages)
    in_group = {
        (entry["package"], entry["path"])
        for entry in data["files"]
        if (group is None or entry["group"] == group) and entry["group"] != without
    }
    counts: dict[str, dict[str, int]] = {}
    for label in data["labels"]:
        if label["package"] not in wanted or (label["package"], label["path"]) not in in_group:
            continue
        rule = counts.setdefault(label["rule"], {"TP": 0, "FP": 0, "FN": 0})
        rule[label["label"]] += 1
    return {rule: Score(tp=c["TP"], fp=c["FP"], fn=c["FN"]) for rule, c in sorted(counts.items())}


def total(per_rule: Mapping[str, Score]) -> Score:
    return Score(
        tp=sum(s.tp for s in per_rule.values()),
        fp=sum(s.fp for s in per_rule.values()),
        fn=sum(s.fn for s in per_rule.values()),
    )


def table(per_rule: Mapping[str, Score]) -> str:
    """A Markdown table: rule, TP, FP, FN, precision, recall."""
    rows = ["| Rule | TP | FP | FN | Precision | Recall |", "|---|---|---|---|---|---|"]
    for rule, score in (*per_rule.items(), ("all", total(per_rule))):
        rows.append(
            f"| {rule} | {score.tp} | {score.fp} | {score.fn} | "
            f"{_percent(score.precision)} | {_percent(score.recall)} |"
        )
    return "\n".join(rows)


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f} %"


def _key(label: Mapping[str, Any]) -> Key:
    return label["package"], label["path"], label["line"], label["col"], label["rule"]


def _show(key: Key) -> str:
    package, path, line, col, rule = key
    return f"{package}/{path}:{line}:{col} {rule}"


def wheel_root(info: Mapping[str, Any], unpacked: Path) -> Path:
    """The directory the corpus paths of a wheel package are relative to."""
    top = unpacked / info["root"]
    return top if top.is_dir() else unpacked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--unpacked",
        action="append",
        default=[],
        metavar="PACKAGE=DIR",
        help="a wheel of the corpus, already unpacked into DIR (repeatable)",
    )
    parser.add_argument("--download", action="store_true", help="pip download the wheels not given")
    args = parser.parse_args(argv)
    data = load()
    roots: dict[str, Path] = {}
    sglang = package_root("sglang")
    if sglang is not None:
        roots["sglang"] = sglang
    given = dict(item.split("=", 1) for item in args.unpacked)
    with tempfile.TemporaryDirectory() as tmp:
        for name, info in sorted(data["packages"].items()):
            if "wheel" not in info:
                continue
            if name in given:
                roots[name] = wheel_root(info, Path(given[name]))
            elif args.download:
                into = Path(tmp) / name
                into.mkdir()
                requirement = f"{name}=={info['version']}"
                roots[name] = wheel_root(info, download_wheel(requirement, info["wheel"], into))
        _, problems = check(data, roots)
    for problem in problems:
        print(f"corpus: {problem}", file=sys.stderr)
    print(f"packages scanned: {', '.join(sorted(roots)) or 'none'}\n")
    print(table(scores(data, roots)))
    print(f"\nwithout model definitions (group {MODEL_GROUP!r}):\n")
    print(table(scores(data, roots, without=MODEL_GROUP)))
    print()
    groups = (
        ("generic-backend", "generic attention backends"),
        (MODEL_GROUP, "model definitions"),
    )
    for group, name in groups:
        score = total(scores(data, roots, group=group))
        print(
            f"{name}: precision {_percent(score.precision)}, recall {_percent(score.recall)} "
            f"({score.tp} TP, {score.fp} FP, {score.fn} FN)"
        )
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
