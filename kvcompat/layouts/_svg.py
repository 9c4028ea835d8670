"""Render the byte map of one page of a layout as a small, deterministic SVG picture.

``python -m kvcompat.layouts._svg docs/layouts`` rewrites the pictures the layout docs
embed; a test regenerates them and compares, so they cannot drift from the specs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvcompat.layouts._spec import SegmentRole

if TYPE_CHECKING:
    from kvcompat.layouts._spec import LayoutSpec

__all__ = ["documented_pictures", "render_page_svg", "text_width", "write_pictures"]

_CELL_W = 6
_CELL_H = 9
_LEFT = 52
_TOP = 30
_MAX_LINES = 48

# (fill for even tokens, fill for odd tokens) per role; padding is grey.
_FILLS = {
    SegmentRole.DATA: ("#4c78a8", "#7fa6d1"),
    SegmentRole.ROPE: ("#54a24b", "#88c77f"),
    SegmentRole.SCALE: ("#f58518", "#f8b26a"),
    SegmentRole.PAD: ("#9d9d9d", "#9d9d9d"),
}
_PAGE_PAD_FILL = "#e4e4e4"
_TITLE_SIZE = 11
_MONO_ADVANCE = 0.62
"""A monospace glyph's advance as a fraction of the font size, rounded up (DejaVu Sans Mono
and Liberation Mono: 0.60); the picture is made wide enough for its longest text with it."""


def text_width(text: str, font_size: float) -> float:
    """The width ``text`` takes in the pictures' monospace font, rounded up.

    Example:
        >>> text_width("v4", 10)
        12.4
    """
    return len(text) * font_size * _MONO_ADVANCE


@dataclass(frozen=True)
class _Byte:
    fill: str
    label: str


def _byte_map(spec: LayoutSpec, page_size: int) -> list[_Byte]:
    per_row = spec.tokens_per_row(page_size)
    tokens = page_size if not spec.paged else per_row
    size = spec.page_bytes(per_row) * (tokens // per_row)
    cells = [_Byte(_PAGE_PAD_FILL, "page padding")] * size
    for token in range(tokens):
        starts = {
            "data": spec.data_offset(token, per_row),
            "scale": spec.scale_offset(token, per_row),
        }
        for seg in spec.segments:
            fill = _FILLS[seg.role][token % 2]
            if seg.encoding is None:
                label = f"{seg.name} (never written)"
            else:
                label = f"{seg.name} {seg.encoding.value}"
            start = starts[seg.region] + seg.offset
            for offset in range(start, start + seg.nbytes):
                cells[offset] = _Byte(fill, label)
    return cells


def render_page_svg(spec: LayoutSpec, page_size: int = 4, *, bytes_per_line: int = 0) -> str:
    """An SVG byte map of one page of ``page_size`` tokens of ``spec``.

    Each square is one byte, ``bytes_per_line`` to a line (by default the smallest multiple
    of 64 that keeps the picture within 48 lines). Colours mark values, rope, scales,
    never-written pad bytes and page padding; alternate tokens are shaded lighter, and
    ``tN`` marks where token ``N``'s data row starts. Token-major layouts show
    ``page_size`` consecutive rows.

    Example:
        >>> from kvcompat.layouts import V4
        >>> from kvcompat.layouts._svg import render_page_svg
        >>> svg = render_page_svg(V4, 4)
        >>> svg.startswith("<svg") and "2880 bytes" in svg
        True
    """
    cells = _byte_map(spec, page_size)
    size = len(cells)
    if bytes_per_line <= 0:
        bytes_per_line = 64 * max(1, -(-size // (64 * _MAX_LINES)))
    lines = -(-size // bytes_per_line)
    first_fill: dict[str, str] = {}
    for cell in cells:  # byte order: each label's first colour is token 0's
        first_fill.setdefault(cell.label, cell.fill)
    legend = sorted(
        ((f, label) for label, f in first_fill.items()), key=lambda fl: _legend_order(fl[1])
    )
    legend_top = _TOP + lines * _CELL_H + 14
    height = legend_top + 16 * len(legend) + 6
    tokens = page_size
    payload = tokens * spec.bytes_per_token
    title = (
        f"{spec.name}: one page of {tokens} tokens = {size} bytes "
        f"({tokens} x {spec.bytes_per_token} + {size - payload} padding)"
    )
    if not spec.paged:
        rows = f"{tokens} x {spec.bytes_per_token}"
        title = f"{spec.name}: {tokens} token-major rows = {size} bytes ({rows})"
    longest_label = max((text_width(label, 9) for _, label in legend), default=0.0)
    width = max(
        _LEFT + bytes_per_line * _CELL_W + 10,  # the byte grid
        4 + int(text_width(title, _TITLE_SIZE)) + 10,  # the title, never cut
        _LEFT + 18 + int(longest_label) + 10,  # the legend
    )
    out = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="monospace" font-size="9">'
        ),
        f"<title>{title}</title>",
        f'<text x="4" y="14" font-size="{_TITLE_SIZE}">{title}</text>',
    ]
    for line in range(lines):
        y = _TOP + line * _CELL_H
        out.append(f'<text x="4" y="{y + _CELL_H - 1}">{line * bytes_per_line:6d}</text>')
        start = line * bytes_per_line
        end = min(size, start + bytes_per_line)
        run_start = start
        for offset in range(start, end + 1):
            if offset == end or cells[offset].fill != cells[run_start].fill:
                x = _LEFT + (run_start - start) * _CELL_W
                w = (offset - run_start) * _CELL_W
                out.append(
                    f'<rect x="{x}" y="{y}" width="{w}" height="{_CELL_H - 1}" '
                    f'fill="{cells[run_start].fill}"/>'
                )
                run_start = offset
    for token in range(tokens):
        offset = spec.data_offset(token, spec.tokens_per_row(page_size))
        line, column = divmod(offset, bytes_per_line)
        x = _LEFT + column * _CELL_W + 1
        y = _TOP + line * _CELL_H + _CELL_H - 2
        out.append(f'<text x="{x}" y="{y}" fill="#ffffff" font-size="8">t{token}</text>')
    for i, (fill, label) in enumerate(legend):
        y = legend_top + 16 * i
        out.append(f'<rect x="{_LEFT}" y="{y}" width="12" height="10" fill="{fill}"/>')
        out.append(f'<text x="{_LEFT + 18}" y="{y + 9}">{label}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _legend_order(label: str) -> tuple[int, str]:
    order = ("nope", "values", "latent", "rope", "scale", "pad", "page")
    for rank, prefix in enumerate(order):
        if label.startswith(prefix):
            return rank, label
    return len(order), label


def documented_pictures() -> dict[str, tuple[LayoutSpec, int]]:
    """The pictures the docs embed: file stem -> (spec, page size).

    One per page the layout modules declare (``LAYOUT_PAGES``, discovered from
    :mod:`kvcompat.layouts`): a new layout module's picture needs no list here.

    Example:
        >>> from kvcompat.layouts._svg import documented_pictures
        >>> sorted(documented_pictures())[:3]
        ['dsa_fp8', 'dsv4_indexer_fp4', 'dsv4_indexer_fp8']
    """
    from kvcompat.layouts._registry import LAYOUT_PAGES  # noqa: PLC0415 -- imports every layout

    return {page.stem: (page.spec, page.picture_page_size) for page in LAYOUT_PAGES}


def write_pictures(folder: Path) -> list[Path]:
    """Write every documented picture into ``folder``; return the paths written.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from kvcompat.layouts._svg import write_pictures
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     len(write_pictures(Path(tmp)))
        11
    """
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, (spec, page_size) in documented_pictures().items():
        path = folder / f"{stem}.svg"
        path.write_text(render_page_svg(spec, page_size), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    for written_path in write_pictures(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/layouts")):
        sys.stdout.write(f"wrote {written_path}\n")
