"""The lists a new layout joins are derived from the layout and oracle modules, and agree.

Docs pages (one per declared ``LayoutPage``), the layouts table and the oracle table of
the docs (generated from the registry and the ``@check`` declarations), and oracle
coverage (every named layout is compared with SGLang by some check).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _oracle import CHECKS, COVERS, ORACLE_MODULES, ROWS

from kvcompat.layouts._registry import EXPORTS, LAYOUT_FACTORIES, LAYOUT_PAGES, LAYOUTS

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "layouts"
_NOT_LAYOUT_PAGES = {"index", "oracles"}


@pytest.fixture(scope="module")
def gen() -> object:
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import _layouts_gen
    finally:
        sys.path.remove(str(ROOT / "docs"))
    return _layouts_gen


def _page_id(page: object) -> str:
    return str(getattr(page, "stem", page))


@pytest.mark.parametrize("page", LAYOUT_PAGES, ids=_page_id)
def test_every_declared_page_exists_and_has_a_table_row(page: object, gen: object) -> None:
    stem = _page_id(page)
    assert (DOCS / f"{stem}.md").exists(), f"write docs/layouts/{stem}.md"
    rows = [r for r in gen.layouts_table().splitlines() if f"]({stem}.md)" in r]  # type: ignore[attr-defined]
    assert len(rows) == 1, rows
    assert rows[0].count(" | ") == 6  # seven cells, as the table header


def test_every_layout_docs_page_is_declared() -> None:
    stems = {page.stem for page in LAYOUT_PAGES}
    pages = {p.stem for p in DOCS.glob("*.md")} - _NOT_LAYOUT_PAGES
    assert pages == stems, "declare the page in its layout module's PAGES"


def test_every_named_layout_is_documented() -> None:
    documented = {spec for page in LAYOUT_PAGES for spec in (page.spec, *page.also)}
    missing = [name for name, spec in LAYOUTS.items() if spec not in documented]
    assert not missing, f"no page documents {missing} (LayoutPage(..., also=...))"


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_named_layout_has_an_oracle(name: str) -> None:
    covering = [check for check, specs in COVERS.items() if LAYOUTS[name] in specs]
    assert covering, f"no oracle check covers {name!r}: add tests/layouts/_oracle/<module>.py"


@pytest.mark.parametrize("factory", sorted(LAYOUT_FACTORIES))
def test_every_layout_factory_module_has_an_oracle_module(factory: str) -> None:
    module = getattr(LAYOUT_FACTORIES[factory], "__module__", "").rsplit(".", 1)[-1]
    assert module in ORACLE_MODULES, f"add tests/layouts/_oracle/{module}.py"


def test_oracle_table_lists_every_check(gen: object) -> None:
    table = gen.oracle_table()  # type: ignore[attr-defined]
    assert table.startswith(f"{len(CHECKS)} checks.")
    for code, compared, result in ROWS.values():
        assert f"| {code} | {compared} | {result} |" in table


def test_exports_and_names_agree() -> None:
    assert {spec.name for spec in EXPORTS.values()} == set(LAYOUTS)
