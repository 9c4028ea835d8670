"""The public surface of kvcompat.scan: names, docstrings, value types, dependencies."""

from __future__ import annotations

import ast
import dataclasses
import doctest
import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import kvcompat.scan
from kvcompat.scan import RULES, Finding, ScanReport, scan_source

REPO = Path(__file__).resolve().parents[2]
MODULES = [
    "kvcompat.scan",
    "kvcompat._scan",
    "kvcompat._scan._rules",
    "kvcompat._scan._source",
    "kvcompat._scan._analysis",
    "kvcompat._scan._fix",
    "kvcompat._scan._run",
]


def test_all_is_pinned() -> None:
    assert kvcompat.scan.__all__ == [
        "RULES",
        "Finding",
        "Rule",
        "ScanReport",
        "fix_source",
        "main",
        "scan_paths",
        "scan_source",
    ]
    for name in kvcompat.scan.__all__:
        assert hasattr(kvcompat.scan, name)


@pytest.mark.parametrize("name", kvcompat.scan.__all__)
def test_public_objects_have_examples(name: str) -> None:
    obj = getattr(kvcompat.scan, name)
    if name == "RULES":
        return
    doc = inspect.getdoc(obj) or ""
    assert "Example:" in doc, name
    if inspect.isclass(obj):
        for attribute, member in vars(obj).items():
            if attribute.startswith("_"):
                continue
            target = member.fget if isinstance(member, property) else member
            if callable(target):
                assert "Example:" in (inspect.getdoc(target) or ""), f"{name}.{attribute}"


@pytest.mark.parametrize("module", MODULES)
def test_doctests(module: str) -> None:
    result = doctest.testmod(
        importlib.import_module(module), optionflags=doctest.ELLIPSIS, verbose=False
    )
    assert result.failed == 0


@pytest.mark.parametrize("module", MODULES)
def test_only_the_standard_library_is_imported(module: str) -> None:
    path = Path(importlib.import_module(module).__file__ or "")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            roots = [node.module or ""]
        else:
            continue
        for root in roots:
            top = root.partition(".")[0]
            assert top in sys.stdlib_module_names or root.startswith("kvcompat._scan"), root


def test_scan_runs_without_torch() -> None:
    # Load kvcompat.scan under an empty stand-in for the kvcompat package, so
    # nothing but the scanner's own modules can be imported.
    code = (
        "import sys, types\n"
        "package = types.ModuleType('kvcompat')\n"
        f"package.__path__ = [{str(REPO / 'kvcompat')!r}]\n"
        "sys.modules['kvcompat'] = package\n"
        "import kvcompat.scan\n"
        "assert kvcompat.scan.scan_source('pool.kv_buffer[0][i]\\n')[0].code == 'KVC005'\n"
        "heavy = {'torch', 'triton', 'sglang', 'numpy'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_finding_is_a_frozen_value() -> None:
    finding = scan_source("pool.get_kv_buffer(0)\n")[0]
    assert [field.name for field in dataclasses.fields(Finding)] == [
        "path",
        "line",
        "col",
        "code",
        "message",
        "fixable",
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        finding.line = 2  # type: ignore[misc]
    assert finding == Finding(*dataclasses.astuple(finding))
    assert len({finding, Finding(*dataclasses.astuple(finding))}) == 1


def test_report_exit_codes() -> None:
    finding = Finding("a.py", 1, 1, "KVC001", "m", True)
    error = Finding("b.py", 0, 0, "KVC902", "m", False)
    assert ScanReport(findings=()).exit_code == 0
    assert ScanReport(findings=(finding,)).exit_code == 1
    assert ScanReport(findings=(finding,), errors=(error,)).exit_code == 2
    assert error.format() == "b.py: KVC902 m"


def test_rules_table() -> None:
    assert sorted(RULES) == [f"KVC00{n}" for n in range(1, 10)]
    for code, rule in RULES.items():
        assert rule.code == code
        assert rule.classes
        assert rule.replacement.startswith(("kvcompat.adapt({recv}).", "kvcompat.compat({recv})."))
    # The getters' replacements are compat's: the adapter's buffers are raw storage, whose
    # shape[-1] on a DeepSeek-V4 pool is a page's bytes (KVC008), not a head dim.
    for code in ("KVC001", "KVC002", "KVC003"):
        assert RULES[code].replacement.startswith("kvcompat.compat({recv})."), code


def test_docs_cover_every_code() -> None:
    docs = (REPO / "docs" / "scan.md").read_text(encoding="utf-8")
    for code in [*RULES, "KVC100", "KVC900", "KVC901", "KVC902", "KVC903"]:
        assert f"`{code}`" in docs, code
    for class_name in {name for rule in RULES.values() for name in rule.classes}:
        assert class_name in docs, class_name
