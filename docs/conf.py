"""Sphinx configuration. The build runs in the test command with -W (warnings fail it)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

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
# Types print by name ("LayoutSpec"), not by the private module that defines them
# ("kvcompat.layouts._spec.LayoutSpec"): readers import the public name
# (tests/docs/test_rendered.py checks that no page names a private module).
autodoc_typehints_format = "short"
python_use_unqualified_type_names = True
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
__import__("_transfer_gen").write_transfer_tables(Path(__file__).resolve().parent / "_generated")


# A default value that is a class prints as its repr, "<class 'kvcompat.testing._reference.X'>":
# the class's name is what a reader can use.
_CLASS_REPR = re.compile(r"<class '(?:[\w]+\.)*(\w+)'>")


def _public_signature(
    app: object,
    what: str,
    name: str,
    obj: object,
    options: object,
    signature: str | None,
    return_annotation: str | None,
) -> tuple[str | None, str | None]:
    del app, what, name, obj, options
    if signature is not None:
        signature = _CLASS_REPR.sub(r"\1", signature)
    return signature, return_annotation


# Napoleon writes an attribute's type from its annotation with the defining module
# ("tuple[kvcompat.inspection._memory.ComponentMemory, ...]"); the name is the public part.
_PRIVATE_QUALIFIED = re.compile(r"(?<![\w.])kvcompat(?:\.\w+)*\._\w+\.(\w+)")


def _public_docstring(
    app: object, what: str, name: str, obj: object, options: object, lines: list[str]
) -> None:
    del app, what, name, obj, options
    lines[:] = [_PRIVATE_QUALIFIED.sub(r"\1", line) for line in lines]


def setup(app: Any) -> None:
    app.connect("autodoc-process-signature", _public_signature)
    app.connect("autodoc-process-docstring", _public_docstring, priority=600)  # after napoleon
