"""What a layout module declares about its documentation page (picture and table row).

A layout module may set ``PAGES`` to a tuple of :class:`LayoutPage`; without it, each
named :class:`~kvcompat.layouts.LayoutSpec` the module exports gets the default page
(``docs/layouts/<name>.md``, a picture of a 4-token page). The registry collects them
(:data:`kvcompat.layouts._registry.LAYOUT_PAGES`); the page pictures
(:func:`kvcompat.layouts._svg.documented_pictures`) and the layouts table of the docs are
generated from them, so a new layout module needs no other list to join.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvcompat.layouts._spec import LayoutSpec

__all__ = ["LayoutPage"]


@dataclass(frozen=True)
class LayoutPage:
    """One page of the layout docs, ``docs/layouts/<stem>.md``.

    Attributes:
        stem: the page's (and its picture's) file name without suffix.
        spec: the layout the picture draws and the table row describes.
        picture_page_size: tokens in the pictured page (a page size SGLang allows).
        title: the link text in the layouts table; by default the spec's exported name.
        note: text after the layout names in the table's first cell.
        also: other named layouts the page documents (same bytes, another rounding...).
        cells: the table's other six cells (bytes/token, data, scales, tile, page align,
            arrangement) for a parametrised layout, whose pictured spec is one example;
            empty: derived from ``spec``.

    Example:
        >>> from kvcompat.layouts import V4
        >>> LayoutPage("v4", V4).picture_page_size
        4
    """

    stem: str
    spec: LayoutSpec
    picture_page_size: int = 4
    title: str = ""
    note: str = ""
    also: tuple[LayoutSpec, ...] = ()
    cells: tuple[str, ...] = ()
