"""The layout pages' generated fragments: the layouts table and the oracle table.

Both come from what the layout modules and the oracle modules declare (the layout
registry's ``LAYOUT_PAGES``; the ``@check`` rows of ``tests/layouts/_oracle``), so a new
layout joins them without an edit here or in the pages that include them.
"""

from __future__ import annotations

import sys
from pathlib import Path

from kvcompat.layouts import LayoutSpec, SegmentRole
from kvcompat.layouts._pages import LayoutPage
from kvcompat.layouts._registry import EXPORTS, LAYOUT_PAGES

_TESTS = Path(__file__).resolve().parents[1] / "tests" / "layouts"

# The table's element names: e4m3 and e2m1 values (their fn / x2-packing is on the page).
_SHORT = {"e4m3fn": "e4m3", "e2m1x2": "e2m1"}


def _elements(spec: LayoutSpec, roles: tuple[SegmentRole, ...]) -> list[str]:
    found = []
    for seg in spec.segments:
        if seg.role not in roles:
            continue
        if seg.encoding is None:
            found.append(f"{seg.nbytes} pad")
            continue
        text = f"{seg.elements} {_SHORT.get(seg.encoding.value, seg.encoding.value)}"
        if seg.role is SegmentRole.SCALE and seg.region == "data":
            text += " (in the row)"
        found.append(text)
    return found


def _derived_cells(spec: LayoutSpec) -> tuple[str, ...]:
    scales = _elements(spec, (SegmentRole.SCALE, SegmentRole.PAD))
    if not spec.paged:
        arrangement = "token-major"
    else:
        arrangement = "interleaved" if spec.interleaved else "block-split"
    return (
        str(spec.bytes_per_token),
        " + ".join(_elements(spec, (SegmentRole.DATA, SegmentRole.ROPE))),
        " + ".join(scales) or "none",
        str(spec.tile_size),
        str(spec.page_align) if spec.paged else "row",
        arrangement,
    )


def _export_name(spec: LayoutSpec) -> str:
    return next((name for name, found in EXPORTS.items() if found is spec), spec.name)


def _title_cell(page: LayoutPage) -> str:
    title = page.title or _export_name(page.spec)
    cell = f"[{title}]({page.stem}.md)"
    if not page.cells:  # a named layout: the names get_layout() takes
        names = ", ".join(f'`"{spec.name}"`' for spec in (page.spec, *page.also))
        cell += f" ({names})"
    return cell + (f": {page.note}" if page.note else "")


def layouts_table() -> str:
    """Every layout page the layout modules declare, one row each, in registry order.

    ``{.kv-layouts}`` gives the table the class the docs' stylesheet keeps on screen.
    """
    lines = [
        "{.kv-layouts}",
        "| layout | bytes/token | data | scales | tile | page align | arrangement |",
        "|---|---|---|---|---|---|---|",
    ]
    for page in LAYOUT_PAGES:
        cells = page.cells or _derived_cells(page.spec)
        lines.append("| " + " | ".join((_title_cell(page), *cells)) + " |")
    return "\n".join(lines) + "\n"


def oracle_table() -> str:
    """The CPU oracle checks, one row per distinct (SGLang code, comparison, result)."""
    for folder in (_TESTS, _TESTS.parent):  # _oracle, and the _sglang it imports
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    from _oracle import CHECKS, ROWS  # noqa: PLC0415 -- the test tree, at docs build time

    lines = [
        f"{len(CHECKS)} checks.",
        "",
        "| SGLang code | what is compared | result |",
        "|---|---|---|",
    ]
    seen: list[tuple[str, str, str]] = []
    for name in CHECKS:
        row = ROWS[name]
        if row not in seen:
            seen.append(row)
    lines += [f"| {code} | {compared} | {result} |" for code, compared, result in seen]
    return "\n".join(lines) + "\n"


def write_layout_fragments(folder: Path) -> None:
    """Write the layouts table and the oracle table under ``folder`` (when they changed)."""
    folder.mkdir(exist_ok=True)
    for name, text in (
        ("layouts_table.md", layouts_table()),
        ("oracle_table.md", oracle_table()),
    ):
        target = folder / name
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
