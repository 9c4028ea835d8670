"""docs/supported-pools.md cannot drift from what kvcompat really does with the real classes.

* The generated class table (``docs/_gen.py: supported_table()``, included by the page) gives
  every class of the conformance cases the kind ``kvcompat.pool_kind(native)`` really assigns,
  and every supported class in it has a conformance case.
* The page's composite table names the components the adapters really expose.
* Every numbered trap on the page has its tests in test_conformance.py (``TRAP_TESTS``).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from _sglang.cases import CONFORMANCE_CASES, POOL_CASES

import kvcompat

from . import test_conformance
from .test_conformance import TRAP_TESTS

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGE = DOCS / "supported-pools.md"
_ROW = re.compile(r"^\| `(?P<name>\w+)` \((?P<module>[\w.]+)\) \| (?P<kind>\w+) \|(?P<rest>.*)$")
_TRAP = re.compile(r"^(?P<number>\d+)\. \*\*(?P<title>.+?)\*\*")


def _load_gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kvcompat_docs_gen", DOCS / "_gen.py")
    assert spec is not None, "docs/_gen.py not found"
    assert spec.loader is not None, "docs/_gen.py has no loader"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _section(title: str) -> list[str]:
    lines = PAGE.read_text().splitlines()
    start = lines.index(title)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start + 1 : end]


def generated_rows() -> dict[str, dict[str, str]]:
    rows = {}
    for line in _load_gen().supported_table().splitlines():
        match = _ROW.match(line)
        if match:
            rows[match["name"]] = match.groupdict()
    return rows


def _row_for(cls: type, rows: dict[str, dict[str, str]]) -> tuple[str, dict[str, str]]:
    """The table row of ``cls`` or of its nearest documented base (subclasses use the base)."""
    for base in cls.__mro__:
        row = rows.get(base.__name__)
        if row is not None and base.__module__ == f"sglang.srt.{row['module']}":
            return base.__name__, row
    msg = f"no row of the supported-pools table covers {cls.__module__}.{cls.__qualname__}"
    raise AssertionError(msg)


def test_the_page_includes_the_generated_table() -> None:
    text = PAGE.read_text()
    assert "```{include} _generated/supported_table.md" in text
    assert "write_generated" in (DOCS / "conf.py").read_text(), "conf.py must regenerate it"


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, id=c.cls_name) for c in {c.cls_name: c for c in CONFORMANCE_CASES}.values()],
)
def test_table_kind_is_what_kvcompat_assigns(case: Any) -> None:
    rows = generated_rows()
    native = case.build()
    name, row = _row_for(type(native), rows)
    real = kvcompat.pool_kind(native)
    assert real is not None, f"{case.cls_name}: kvcompat does not support it"
    assert row["kind"] == real.value, (
        f"{case.cls_name}: the supported-pools table says {row['kind']!r} (row {name}), "
        f"kvcompat assigns {real.value!r}"
    )
    if case.cls_name != name:  # a subclass (the legacy double) is served as its documented base
        assert (
            kvcompat.pool_kind(next(k for k in type(native).__mro__ if k.__name__ == name)) is real
        )


def test_every_supported_class_in_the_table_has_a_conformance_case() -> None:
    supported = {name for name, row in generated_rows().items() if row["kind"] != "unsupported"}
    covered = {case.cls_name for case in POOL_CASES}
    assert supported - covered == set(), (
        f"supported in the docs but built by no POOL_CASES case: {sorted(supported - covered)}"
    )


def _components_column() -> dict[str, tuple[list[str], str]]:
    out = {}
    for line in _section("## Composites"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            out[cells[0].strip("`")] = (re.findall(r"`([^`]+)`", cells[1]), cells[2])
    return out


def _documented(name: str, tokens: list[str]) -> bool:
    for token in tokens:
        pattern = re.escape(token).replace(re.escape("{ratio}"), r"\d+")
        if re.fullmatch(pattern, name):
            return True
    return False


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, id=c.id)
        for c in CONFORMANCE_CASES
        if c.family in test_conformance.COMPOSITES
    ],
)
def test_composite_table_names_the_real_components(case: Any) -> None:
    table = _components_column()
    assert case.cls_name in table, f"{case.cls_name} is missing from the page's composite table"
    tokens, primary = table[case.cls_name]
    pool = kvcompat.adapt(case.build())
    undocumented = [name for name in pool.components if not _documented(name, tokens)]
    assert undocumented == [], (
        f"{case.id}: components {undocumented} are not on the page (documented: {tokens})"
    )
    fixed = re.fullmatch(r"`(\w+)`", primary)
    if fixed:  # a fixed primary component (SWAKVPool's depends on the layer)
        routes = {pool.component_for(layer) for layer in pool.layer_ids}
        assert routes == {fixed[1]}, f"{case.id}: primary components {routes}, page says {primary}"


def _page_traps() -> dict[int, str]:
    traps = {}
    for line in _section("## Where SGLang's own getters differ (the traps)"):
        match = _TRAP.match(line)
        if match:
            traps[int(match["number"])] = match["title"]
    return traps


def test_every_numbered_trap_on_the_page_has_a_conformance_test() -> None:
    traps = _page_traps()
    assert sorted(traps) == list(range(1, len(traps) + 1)), f"trap numbering {sorted(traps)}"
    assert set(traps) == set(TRAP_TESTS), (
        f"traps on the page {sorted(traps)} vs mapped in TRAP_TESTS {sorted(TRAP_TESTS)}"
    )
    for number, names in TRAP_TESTS.items():
        assert names, f"trap {number} ({traps[number]}) maps to no test"
        for name in names:
            test = getattr(test_conformance, name, None)
            assert callable(test), (
                f"trap {number} ({traps[number]}): test_conformance.{name} does not exist"
            )
            assert name.startswith("test_"), f"trap {number}: {name} is not collected by pytest"
            doc = (test.__doc__ or "").strip()
            assert doc.startswith(f"Trap {number}"), (
                f"trap {number}: {name}'s docstring should start with 'Trap {number}': {doc[:60]!r}"
            )
