"""The page pictures in docs/layouts/ are exactly what the library renders today."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcompat.layouts import V4, V41_FP4
from kvcompat.layouts._svg import documented_pictures, render_page_svg

DOCS = Path(__file__).resolve().parents[2] / "docs" / "layouts"


@pytest.mark.parametrize("stem", sorted(documented_pictures()))
def test_committed_picture_is_current(stem: str) -> None:
    spec, page_size = documented_pictures()[stem]
    path = DOCS / f"{stem}.svg"
    assert path.exists(), "run: python -m kvcompat.layouts._svg docs/layouts"
    assert path.read_text(encoding="utf-8") == render_page_svg(spec, page_size), (
        f"{path} is stale; run: python -m kvcompat.layouts._svg docs/layouts"
    )


def test_every_picture_is_embedded_in_a_doc_page() -> None:
    pages = "".join(p.read_text(encoding="utf-8") for p in DOCS.glob("*.md"))
    for stem in documented_pictures():
        assert f"{stem}.svg" in pages, stem


def test_picture_marks_every_region() -> None:
    svg = render_page_svg(V4, 4)
    for label in ("nope e4m3fn", "rope bf16", "scale ue8m0", "pad (never written)", "page padding"):
        assert label in svg
    assert svg.count("<text") >= 4 + 5  # token marks and legend
    fp4 = render_page_svg(V41_FP4, 2)
    assert "values e2m1x2" in fp4
    assert "scale e4m3fn" in fp4
    assert render_page_svg(V4, 4) == svg  # deterministic
