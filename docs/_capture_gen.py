"""Generated fragment of docs/compile-and-graphs.md: the CUDA-graph capturability table.

Written from ``kvcompat._capture.CAPTURE`` at docs build time (hooked into conf.py), so the
page cannot drift from the declarations the GPU test captures.
"""

from __future__ import annotations

from pathlib import Path

from kvcompat._capture import markdown_table


def write_capture_table(folder: Path) -> None:
    """Write ``capture_table.md`` under ``folder`` (only when its text changed)."""
    folder.mkdir(exist_ok=True)
    target = folder / "capture_table.md"
    text = markdown_table()
    if not target.exists() or target.read_text() != text:
        target.write_text(text)
