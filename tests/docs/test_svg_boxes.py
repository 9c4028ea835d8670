"""No text of a layout picture runs past its picture's edge (computed, no browser needed).

The monospace advance is DejaVu Sans Mono's (0.602 em, the font chromium and most Linux
desktops pick for ``monospace``); the browser test measures the real glyphs too.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from kvcompat.layouts._svg import documented_pictures, render_page_svg

DOCS = Path(__file__).resolve().parents[2] / "docs" / "layouts"
ADVANCE = 0.602
_SVG = re.compile(r'<svg [^>]*width="(\d+)" height="(\d+)"[^>]*font-size="(\d+)"')
_TEXT = re.compile(
    r'<text x="(\d+)" y="(\d+)"(?: fill="[^"]*")?(?: font-size="(\d+)")?>([^<]*)</text>'
)


@pytest.mark.parametrize("stem", sorted(documented_pictures()))
def test_every_text_fits_inside_its_picture(stem: str) -> None:
    spec, page_size = documented_pictures()[stem]
    for svg in (render_page_svg(spec, page_size), (DOCS / f"{stem}.svg").read_text("utf-8")):
        head = _SVG.search(svg)
        assert head, "an <svg> with width, height and a default font-size"
        width, height, default_size = (int(g) for g in head.groups())
        texts = _TEXT.findall(svg)
        assert len(texts) > 5
        for x, y, size, content in texts:
            right = int(x) + len(html.unescape(content)) * int(size or default_size) * ADVANCE
            assert right <= width, f"{stem}: {content!r} ends at {right:.0f} of {width} px"
            assert int(y) <= height


def test_the_title_is_the_first_text_and_matches_the_svg_title() -> None:
    for stem, (spec, page_size) in documented_pictures().items():
        svg = render_page_svg(spec, page_size)
        title = re.search(r"<title>([^<]*)</title>", svg)
        first = _TEXT.search(svg)
        assert title, stem
        assert first, stem
        assert first.group(4) == title.group(1), stem
