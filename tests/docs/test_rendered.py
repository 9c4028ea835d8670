"""The built docs, rendered in a real headless browser at 1280x800 and at a phone's width.

The docs are built once per session without triton (the ``docs`` dependency group has
none), which is itself a test: ``sphinx -W`` used to fail there. Then chromium loads the
pages and a script in the page measures them:

* every column of the supported-pools tables (and the layouts index) is on screen, with
  nothing scrolled away or clipped: a column name is visible for every cell;
* no SVG text in the layout pictures runs outside its picture, with the real fonts;
* the landing page is short, and the version and the changelog are shown;
* no page names a private module or a path outside the repository (without the browser).
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from _browser import DOCS, build_docs_without_triton, measure

WIDTHS = [pytest.param((1280, 800), id="1280x800"), pytest.param((390, 844), id="phone-390")]

_TABLES_JS = """() => {
  const tables = [];
  for (const table of document.querySelectorAll("article table")) {
    const wrap = table.closest(".table-wrapper") || table.parentElement;
    const box = wrap.getBoundingClientRect();
    const heads = [...table.querySelectorAll("thead th")];
    const headShown = heads.length > 0 && heads.every(th => {
      const r = th.getBoundingClientRect();
      return r.width > 1 && r.height > 1 && r.left >= box.left - 1 && r.right <= box.right + 1;
    });
    const bad = [];
    const unlabelled = [];
    for (const row of table.querySelectorAll("tbody tr")) {
      [...row.children].forEach((cell, i) => {
        const r = cell.getBoundingClientRect();
        const inside = r.width > 1 && r.left >= box.left - 1 && r.right <= box.right + 1
          && r.right <= document.documentElement.clientWidth + 1;
        const overflows = cell.scrollWidth > cell.clientWidth + 1;
        if (!inside || overflows) {
          bad.push({text: cell.textContent.trim().slice(0, 60), column: i,
                    left: r.left, right: r.right, box: [box.left, box.right],
                    scroll: cell.scrollWidth, client: cell.clientWidth});
        }
        const label = getComputedStyle(cell, "::before").content;
        const named = headShown || (label && label !== "none" && label !== "normal"
          && heads[i] && label.replace(/^"|"$/g, "") === heads[i].textContent.trim());
        if (!named) unlabelled.push({column: i, label});
      });
    }
    tables.push({
      classes: table.className,
      headers: heads.map(th => th.textContent.trim()),
      headShown,
      wrapScroll: wrap.scrollWidth,
      wrapClient: wrap.clientWidth,
      rows: table.querySelectorAll("tbody tr").length,
      bad: bad.slice(0, 5),
      unlabelled: unlabelled.slice(0, 5),
    });
  }
  return {tables};
}"""

_IMAGES_JS = """() => {
  const out = [];
  for (const img of document.querySelectorAll("article img")) {
    const box = img.closest("article").getBoundingClientRect();
    const r = img.getBoundingClientRect();
    out.push({src: img.getAttribute("src"), left: r.left, right: r.right, width: r.width,
              natural: img.naturalWidth, box: [box.left, box.right]});
  }
  return {images: out};
}"""

_SVG_TEXT_JS = """() => {
  const cut = [];
  let texts = 0;
  for (const svg of document.querySelectorAll("svg[data-file]")) {
    const vb = svg.viewBox.baseVal;
    for (const text of svg.querySelectorAll("text")) {
      texts += 1;
      const b = text.getBBox();
      if (b.x < vb.x - 0.5 || b.y < vb.y - 0.5 || b.x + b.width > vb.x + vb.width + 0.5
          || b.y + b.height > vb.y + vb.height + 0.5) {
        cut.push({file: svg.dataset.file, text: text.textContent,
                  right: b.x + b.width, width: vb.width});
      }
    }
  }
  return {cut, texts, svgs: document.querySelectorAll("svg[data-file]").length};
}"""


@pytest.fixture(scope="session")
def html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs-html")
    result = build_docs_without_triton(out)
    assert result.returncode == 0, (
        f"sphinx -W failed without triton:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    return out


def _assert_tables_fit(data: dict[str, Any], page: str, expected: int) -> None:
    tables = data["tables"]
    assert len(tables) >= expected, f"{page}: found {len(tables)} tables, expected {expected}"
    for table in tables:
        where = f"{page} table {table['headers']} at {data['innerWidth']} px"
        assert table["rows"] > 0, where
        assert table["wrapScroll"] <= table["wrapClient"] + 1, (
            f"{where}: {table['wrapScroll'] - table['wrapClient']} px scrolled out of view"
        )
        assert table["bad"] == [], f"{where}: cells outside the visible table: {table['bad']}"
        assert table["unlabelled"] == [], f"{where}: cells with no visible column name"
    assert data["pageScrollWidth"] <= data["clientWidth"] + 1, f"{page} scrolls sideways"


@pytest.mark.parametrize("size", WIDTHS)
def test_supported_pools_tables_show_every_column(html: Path, size: tuple[int, int]) -> None:
    data = measure(html / "supported-pools.html", _TABLES_JS, *size)
    _assert_tables_fit(data, "supported-pools", expected=3)  # supported, refused, composites
    supported, refused = data["tables"][0], data["tables"][1]
    assert supported["headers"] == [
        "SGLang class",
        "kvcompat kind",
        "get_key_buffer(l)",
        "get_value_buffer(l)",
    ]
    assert refused["headers"] == ["SGLang class", "why adapt() refuses it"]
    if size[0] >= 1280:
        assert supported["headShown"], "the column names must be visible at 1280 px"


def test_unsupported_reasons_are_not_under_get_key_buffer(html: Path) -> None:
    page = (html / "supported-pools.html").read_text(encoding="utf-8")
    start = page.index('class="kv-pools')
    supported = page[start : page.index("</table>", start)]
    assert "unsupported" not in supported
    assert "placeholder buffers" in page[page.index('class="kv-refused') :]


@pytest.mark.parametrize("size", WIDTHS)
def test_layouts_index_shows_every_column(html: Path, size: tuple[int, int]) -> None:
    data = measure(html / "layouts" / "index.html", _TABLES_JS, *size)
    _assert_tables_fit(data, "layouts/index", expected=1)
    assert data["tables"][0]["headers"][0] == "layout"


def _widest_picture() -> str:
    def width(svg: Path) -> int:
        return int(re.search(r'width="(\d+)"', svg.read_text(encoding="utf-8"))[1])  # type: ignore[index]

    return max(sorted((DOCS / "layouts").glob("*.svg")), key=width).stem


@pytest.mark.parametrize("size", WIDTHS)
def test_the_widest_layout_picture_fits_its_page(html: Path, size: tuple[int, int]) -> None:
    stem = _widest_picture()
    images = measure(html / "layouts" / f"{stem}.html", _IMAGES_JS, *size)["images"]
    assert [image["src"] for image in images] == [f"../_images/{stem}.svg"]
    for image in images:
        assert image["left"] >= image["box"][0] - 1, image
        assert image["right"] <= image["box"][1] + 1, image


def test_no_svg_text_is_clipped(html: Path) -> None:
    svgs = sorted((DOCS / "layouts").glob("*.svg"))
    body = "".join(
        svg.read_text(encoding="utf-8").replace("<svg ", f'<svg data-file="{svg.name}" ', 1)
        for svg in svgs
    )
    page = html / "svg-text.html"
    page.write_text(f"<!doctype html><html><body>{body}</body></html>", encoding="utf-8")
    data = measure(page, _SVG_TEXT_JS, 1280, 800)
    assert data["svgs"] == len(svgs)
    assert data["texts"] > 10 * len(svgs)
    assert data["cut"] == [], f"SVG text outside its picture: {data['cut']}"


def test_landing_page_is_short_and_shows_version_and_changelog(html: Path) -> None:
    import kvcompat

    index = (html / "index.html").read_text(encoding="utf-8")
    article = index[index.index("<article") : index.index("</article>")]
    assert "toctree-l1" not in article, "the toctrees are hidden (in the sidebar only)"
    assert article.count("<li") <= 12, "the landing page body is a short page, not a toctree"
    assert f"kvcompat {kvcompat.__version__}" in index
    changelog = (html / "changelog.html").read_text(encoding="utf-8")
    assert "Unreleased" in changelog
    assert kvcompat.__version__ in changelog
    assert 'href="changelog.html"' in index
    quickstart = re.sub(r"<[^>]+>", "", (html / "quickstart.html").read_text(encoding="utf-8"))
    # Not on PyPI yet: the page installs the wheel built in a checkout (test_install_docs.py)
    assert "pip install dist/kvcompat-*.whl" in quickstart
    assert "pip install kvcompat" not in quickstart
    assert "pip install -e ." not in quickstart
    assert "CPU build" in quickstart


class _Text(HTMLParser):
    """The text a reader sees on a page (no scripts, styles or attributes)."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        del attrs
        self._hidden += tag in ("script", "style")

    def handle_endtag(self, tag: str) -> None:
        self._hidden -= tag in ("script", "style")

    def handle_data(self, data: str) -> None:
        if not self._hidden:
            self.parts.append(data)


def test_the_built_docs_name_no_private_module_and_no_outside_path(html: Path) -> None:
    # The sources are checked in test_docs_sources.py; this is what autodoc adds on top
    # (attribute types, default values, signatures) as a reader sees it.
    from test_docs_sources import MACHINE_PATH, private_modules

    pages = [
        page
        for page in sorted(html.rglob("*.html"))
        if not {"_modules", "_sources", "_static"} & set(page.relative_to(html).parts)
    ]
    assert len(pages) > 20
    named = {}
    for page in pages:
        parser = _Text()
        parser.feed(page.read_text(encoding="utf-8"))
        text = "".join(parser.parts)
        found = sorted(set(private_modules(text))) + MACHINE_PATH.findall(text)
        if found:
            named[str(page.relative_to(html))] = found[:5]
    assert named == {}
