"""Precision and recall of ``kvcompat scan``, per rule, on the labelled corpus of real code.

The corpus (``tests/scan/corpus/labels.json``) names files of the real SGLang 0.5.23
package and of the LMCache 0.5.6 and eagle-harness 0.1.3 wheels, each with its SHA-256,
and labels every finding the scanner reports on them (TP or FP) plus the true accesses
it misses (FN), each with a one-line reason written after reading the code. Nothing of
those packages is copied here: the files are scanned where they are installed
(SGLang) or from the wheels pip downloads.

``tests/scan/corpus/releases.json`` labels the code of other SGLang builds that 0.5.23
does not have: every older release of the release matrix (0.5.12 to 0.5.22) and
KTransformers' fork, sglang-kt 0.7.2. That is every finding outside their tests whose line
(path, rule, enclosing function, text, column in it, occurrence of that text in the
function) is not a labelled 0.5.23 finding, each line counted once however many builds
carry it. Those count for precision only: no one read the whole files for misses.

Usage:
    python benchmarks/scan_precision.py                 # the installed sglang only
    python benchmarks/scan_precision.py --download      # and pip download the wheels
    python benchmarks/scan_precision.py --unpacked lmcache=DIR   # DIR: an unpacked wheel
    python benchmarks/scan_precision.py --release 0.5.20=DIR     # an older SGLang, unpacked
    python benchmarks/scan_precision.py --release kt-0.7.2=DIR   # the sglang-kt fork, unpacked

Prints one row per rule (TP, FP, FN, precision with its 95 % Wilson interval, recall) and
the totals, on the whole corpus and without SGLang's model definitions, then the totals on
the generic attention backends and on the model definitions, and with other builds given,
their own code's scores (the older releases, the forks, all of it with the corpus); exits 1
if a finding has no label, a labelled TP/FP is no longer reported, or a file's (or wheel's)
hash differs from the label's.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LABELS = REPO / "tests" / "scan" / "corpus" / "labels.json"
RELEASE_LABELS = REPO / "tests" / "scan" / "corpus" / "releases.json"
if str(REPO) not in sys.path:  # measure this checkout's scanner, not an installed kvcompat
    sys.path.insert(0, str(REPO))

Key = tuple[str, str, int, int, str]  # package, path, line, col, rule
# What a finding is, across releases: path, rule, the qualified name of the function it is
# in ("" at module level), the stripped source line and the column in it. Line numbers
# move between releases; the same code in the same function does not. The same line can
# occur more than once in a function: the last item numbers the occurrences of one text
# in the function, in line order. (Numbering them per file instead matched a fork's
# ``forward_mtp`` write with a release's ``forward_dllm`` one, once the fork had dropped
# ``forward_dllm``.)
CodeKey = tuple[str, str, str, str, int, int]
Where = tuple[str, int, int, str]  # path, line, col, rule: a finding in one release
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

    @property
    def precision_interval(self) -> tuple[float, float] | None:
        """The 95 % Wilson score interval of the precision (None without findings)."""
        return wilson(self.tp, self.tp + self.fp)


_Z95 = 1.959963984540054  # the 97.5 % quantile of the standard normal distribution


def wilson(successes: int, trials: int, z: float = _Z95) -> tuple[float, float] | None:
    """The Wilson score interval of a proportion ``successes / trials``, or None if no trials.

    Unlike ``p ± z·sqrt(p(1-p)/n)`` it stays inside [0, 1] and is not empty at 0 or n
    successes, which is what a rule with a handful of findings has.

    Example:
        >>> [round(100 * b, 1) for b in wilson(0, 1)], [round(100 * b, 1) for b in wilson(5, 10)]
        ([0.0, 79.3], [23.7, 76.3])
    """
    if not 0 <= successes <= trials:
        msg = f"wilson() needs 0 <= successes <= trials, got {successes} of {trials}"
        raise ValueError(msg)
    if trials == 0:
        return None
    p = successes / trials
    z2 = z * z
    centre = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = z / (1 + z2 / trials) * (p * (1 - p) / trials + z2 / (4 * trials * trials)) ** 0.5
    # At 0 or n successes a bound is exactly 0 or 1; floating point would miss it by an ulp.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == trials else min(1.0, centre + half)
    return low, high


def load(path: Path = LABELS) -> dict[str, Any]:
    """The labels document (``RELEASE_LABELS`` for the older releases' own code)."""
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def package_root(name: str) -> Path | None:
    """Where an installed top-level package lives, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def download_wheel(
    requirement: str, wheel: str, into: Path, timeout: float = 180, *, digest: str | None = None
) -> Path:
    """``pip download`` one wheel (no dependencies) and unpack it; the unpacked root.

    Raises:
        RuntimeError: pip could not download it (no network, no such release).
        ValueError: the wheel's SHA-256 is not ``digest`` (another build of the release).
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
    if digest is not None and (got := sha256(archive)) != digest:
        msg = f"{wheel}: SHA-256 {got}, the labels are for {digest}"
        raise ValueError(msg)
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


def is_test_code(path: str) -> bool:
    """SGLang's own tests (``test/...``, ``test_*.py``): pools they build themselves."""
    return path.startswith("test/") or path.rsplit("/", 1)[-1].startswith("test_")


def _functions(source: str) -> list[tuple[int, int, str]]:
    """Every function and class of a module: first line, last line, qualified name."""
    spans: list[tuple[int, int, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                spans.append((child.lineno, child.end_lineno or child.lineno, name))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return spans


def _enclosing(spans: list[tuple[int, int, str]], line: int) -> str:
    """The qualified name of the innermost function or class holding ``line`` ("" if none)."""
    inner = [(first, name) for first, last, name in spans if first <= line <= last]
    return max(inner)[1] if inner else ""


def _numbered(wheres: Iterable[Where], root: Path) -> dict[Where, CodeKey]:
    """Each finding's release-independent key (``CodeKey``), for findings under ``root``."""
    keys: dict[Where, CodeKey] = {}
    seen: Counter[tuple[str, str, str, str, int]] = Counter()
    files: dict[str, tuple[list[str], list[tuple[int, int, str]]]] = {}
    for where in sorted(set(wheres)):
        path, line, col, rule = where
        if path not in files:
            source = (root / path).read_text(encoding="utf-8")
            files[path] = source.splitlines(), _functions(source)
        lines, spans = files[path]
        raw = lines[line - 1] if 0 < line <= len(lines) else ""
        text = raw.strip()
        code = (path, rule, _enclosing(spans, line), text, col - (len(raw) - len(raw.lstrip())))
        keys[where] = (*code, seen[code])
        seen[code] += 1
    return keys


def requirement(version: str, info: Mapping[str, Any]) -> str:
    """What ``pip download`` fetches for a build of ``releases.json`` (SGLang's own by default)."""
    return str(info.get("requirement", f"sglang=={version}"))


def _build(version: str, info: Mapping[str, Any]) -> str:
    return requirement(version, info).replace("==", " ")


def is_release(version: str, info: Mapping[str, Any]) -> bool:
    """Whether a build of ``releases.json`` is an SGLang release (else a fork of SGLang)."""
    return requirement(version, info).startswith("sglang==")


def check_release(
    data: Mapping[str, Any],
    releases: Mapping[str, Any],
    version: str,
    root: Path,
    base_root: Path,
) -> tuple[dict[Where, CodeKey], list[str]]:
    """Scan another SGLang build whole; check its own findings against ``releases``.

    A build's own findings are those outside its test code whose key (``CodeKey``:
    path, rule, enclosing function, line text, column in it, occurrence in the function)
    is not that of a labelled finding of the base release (``data``'s ``sglang`` labels,
    read under ``base_root``), and those with such a key that a label marked
    ``splits_base`` claims for the build: the same line under other guards. Each must be
    labelled in ``releases`` for ``version`` at its line and column, with the line's
    function, text and occurrence.

    Returns:
        The build's own findings (with their keys), and the problems: unlabelled
        findings, labels no longer reported, labels whose function, text or occurrence
        is not the build's.
    """
    from kvcompat.scan import scan_paths

    name = _build(version, releases.get("releases", {}).get(version, {}))
    labelled_base = [
        (label["path"], label["line"], label["col"], label["rule"])
        for label in data["labels"]
        if label["package"] == "sglang" and label["label"] in ("TP", "FP")
    ]
    base = set(_numbered(labelled_base, base_root).values())
    report = scan_paths([str(root)])
    problems = [error.format() for error in report.errors]
    if not report.findings:  # every SGLang build has base findings: nothing scanned
        problems.append(f"{name}: no finding at all under {root}; is it the unpacked sglang?")
    found = [
        (Path(f.path).resolve().relative_to(root.resolve()).as_posix(), f.line, f.col, f.code)
        for f in report.findings
    ]
    # A line with the key of a labelled 0.5.23 line that this build decides otherwise (its
    # guards differ) has a label of its own, marked ``splits_base``: it is the build's own.
    split = {
        (label["path"], at["line"], at["col"], label["rule"])
        for label in releases["labels"]
        if label.get("splits_base") and (at := label["releases"].get(version)) is not None
    }
    numbered = _numbered(found, root)
    problems.extend(
        f"{name}: {_where(where)} is labelled splits_base, but its line is not a labelled "
        f"{releases.get('base', 'base')} line; drop splits_base"
        for where in sorted(split)
        if where in numbered and numbered[where] not in base
    )
    own = {
        where: key
        for where, key in numbered.items()
        if not is_test_code(where[0]) and (key not in base or where in split)
    }
    labelled: dict[Where, tuple[str, str, int]] = {}
    for label in releases["labels"]:
        at = label["releases"].get(version)
        if at is not None:
            where = (label["path"], at["line"], at["col"], label["rule"])
            labelled[where] = label["function"], label["code"], label["occurrence"]
    problems.extend(
        f"{name}: unlabelled finding: {_where(where)}"
        for where in sorted(own.keys() - labelled.keys())
    )
    for where, expected in sorted(labelled.items()):
        if where not in own:
            problems.append(f"{name}: labelled but not reported: {_where(where)}")
            continue
        _, _, function, text, _, occurrence = own[where]
        if (function, text, occurrence) != expected:
            problems.append(
                f"{name}: {_where(where)} is occurrence {occurrence} of {text!r} in "
                f"{function or 'the module'}, labelled as occurrence {expected[2]} of "
                f"{expected[1]!r} in {expected[0] or 'the module'}"
            )
    return own, problems


def release_scores(
    releases: Mapping[str, Any],
    versions: Iterable[str],
    group: str | None = None,
    *,
    without: str | None = None,
) -> dict[str, Score]:
    """Per-rule scores of the older releases' own code: each labelled code counts once."""
    wanted = set(versions)
    return _tally(
        label
        for label in releases["labels"]
        if wanted & label["releases"].keys()
        and (group is None or label["group"] == group)
        and label["group"] != without
    )


def combined(*parts: Mapping[str, Score]) -> dict[str, Score]:
    """Per-rule sums of several score tables."""
    out: dict[str, Score] = {}
    for part in parts:
        for rule, score in part.items():
            was = out.get(rule, Score())
            out[rule] = Score(tp=was.tp + score.tp, fp=was.fp + score.fp, fn=was.fn + score.fn)
    return dict(sorted(out.items()))


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
    return _tally(
        label
        for label in data["labels"]
        if label["package"] in wanted and (label["package"], label["path"]) in in_group
    )


def _tally(labels: Iterable[Mapping[str, Any]]) -> dict[str, Score]:
    """Per-rule counts of the labels' TP, FP and FN."""
    counts: dict[str, dict[str, int]] = {}
    for label in labels:
        rule = counts.setdefault(label["rule"], {"TP": 0, "FP": 0, "FN": 0})
        rule[label["label"]] += 1
    return {rule: Score(tp=c["TP"], fp=c["FP"], fn=c["FN"]) for rule, c in sorted(counts.items())}


def total(per_rule: Mapping[str, Score]) -> Score:
    return Score(
        tp=sum(s.tp for s in per_rule.values()),
        fp=sum(s.fp for s in per_rule.values()),
        fn=sum(s.fn for s in per_rule.values()),
    )


def table(per_rule: Mapping[str, Score], *, recall: bool = True) -> str:
    """A Markdown table: rule, TP, FP, FN, precision and its 95 % interval, recall.

    Without ``recall``: TP, FP, precision and its interval only.
    """
    if not recall:
        rows = ["| Rule | TP | FP | Precision | 95 % interval |", "|---|---|---|---|---|"]
        for rule, score in (*per_rule.items(), ("all", total(per_rule))):
            rows.append(
                f"| {rule} | {score.tp} | {score.fp} | {_percent(score.precision)} | "
                f"{_interval(score.precision_interval)} |"
            )
        return "\n".join(rows)
    rows = [
        "| Rule | TP | FP | FN | Precision | 95 % interval | Recall |",
        "|---|---|---|---|---|---|---|",
    ]
    for rule, score in (*per_rule.items(), ("all", total(per_rule))):
        rows.append(
            f"| {rule} | {score.tp} | {score.fp} | {score.fn} | "
            f"{_percent(score.precision)} | {_interval(score.precision_interval)} | "
            f"{_percent(score.recall)} |"
        )
    return "\n".join(rows)


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f} %"


def _interval(bounds: tuple[float, float] | None) -> str:
    return "n/a" if bounds is None else f"{100 * bounds[0]:.1f}-{100 * bounds[1]:.1f} %"


def _key(label: Mapping[str, Any]) -> Key:
    return label["package"], label["path"], label["line"], label["col"], label["rule"]


def _where(where: Where) -> str:
    path, line, col, rule = where
    return f"{path}:{line}:{col} {rule}"


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
    parser.add_argument(
        "--release",
        action="append",
        default=[],
        metavar="VERSION=DIR",
        help="a build of releases.json (its key), its wheel unpacked into DIR (repeatable)",
    )
    parser.add_argument("--download", action="store_true", help="pip download the wheels not given")
    args = parser.parse_args(argv)
    data = load()
    releases = load(RELEASE_LABELS)
    roots: dict[str, Path] = {}
    sglang = package_root("sglang")
    if sglang is not None:
        roots["sglang"] = sglang
    given = dict(item.split("=", 1) for item in args.unpacked)
    given_releases = dict(item.split("=", 1) for item in args.release)
    release_roots: dict[str, Path] = {}
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, info in sorted(data["packages"].items()):
            if "wheel" not in info:
                continue
            if name in given:
                roots[name] = wheel_root(info, Path(given[name]))
            elif args.download:
                into = Path(tmp) / name
                into.mkdir()
                wanted = f"{name}=={info['version']}"
                roots[name] = wheel_root(info, download_wheel(wanted, info["wheel"], into))
        for version, info in sorted(releases["releases"].items()):
            if version in given_releases:
                release_roots[version] = Path(given_releases[version]) / "sglang"
            elif args.download:
                into = Path(tmp) / f"build-{version}"
                into.mkdir()
                unpacked = download_wheel(
                    requirement(version, info), info["wheel"], into, digest=info["sha256"]
                )
                release_roots[version] = unpacked / "sglang"
        _, problems = check(data, roots)
        if release_roots and sglang is None:
            problems.append("the other builds are compared with an installed sglang: none")
        elif release_roots:
            for version, root in sorted(release_roots.items()):
                problems += check_release(data, releases, version, root, roots["sglang"])[1]
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
    if release_roots:
        builds = releases["releases"]
        older = [v for v in sorted(release_roots) if is_release(v, builds[v])]
        forks = [v for v in sorted(release_roots) if v not in older]
        for versions, whose in ((older, "older SGLang releases'"), (forks, "SGLang forks'")):
            if versions:
                names = ", ".join(_build(v, builds[v]) for v in versions)
                print(f"\n{whose} own code ({names}), precision only:\n")
                print(table(release_scores(releases, versions), recall=False))
        print("\nthe corpus and every build's own code together, precision only:\n")
        own = release_scores(releases, sorted(release_roots))
        print(table(combined(scores(data, roots), own), recall=False))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
