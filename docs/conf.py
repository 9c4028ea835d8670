"""Sphinx configuration. The build runs in the test command with -W (warnings fail it)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _gen import write_generated  # noqa: E402

import kvcompat  # noqa: E402

project = "kvcompat"
author = "kvcompat developers"
release = kvcompat.__version__
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "_generated/*.md"]
myst_enable_extensions = ["colon_fence", "attrs_block"]
myst_heading_anchors = 3
html_theme = "furo"
html_title = f"kvcompat {release}"  # the version, in every page's sidebar and title
html_static_path = ["_static"]
html_css_files = ["kvcompat.css"]  # wide tables that stay readable at 1280 px and on a phone
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
suppress_warnings = ["myst.header"]
# The docs build needs no GPU stack: triton is mocked, so the kernel launchers'
# API reference builds from their signatures and docstrings with or without it.
autodoc_mock_imports = ["triton"]

write_generated(Path(__file__).resolve().parent / "_generated")
__import__("_capture_gen").write_capture_table(Path(__file__).resolve().parent / "_generated")
__import__("_layouts_gen").write_layout_fragments(Path(__file__).resolve().parent / "_generated")
