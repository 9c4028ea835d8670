"""What the docs name: nothing outside this repository, and no private kvcompat module.

The built docs are the docs sources (``docs/**/*.md``, the README and the changelog they
include), the fragments ``docs/conf.py`` generates at build time, and the docstrings the API
reference pulls in with autodoc. All of them are checked here, at the source, without a
Sphinx build (``tests/docs/test_rendered.py`` builds and renders the site, which needs
chromium):

* a relative link, ``{include}``/``{literalinclude}`` or ``{doc}`` target must resolve to a
  file inside the repository (``../CHANGELOG.md`` from ``docs/`` does; ``../../x`` does not),
  and exist;
* no text names a path of the development machine (``shared/reference/...``, ``/work/...``):
  a reader of the published docs has neither;
* a path of this repository written in code (``tests/scan/test_scan_fix_dsv4.py``) exists;
* no text names a private module (``kvcompat._ops``, ``kvcompat.layouts._codec``): readers
  take a dotted name as something to import. A maintainer's command (``python -m
  kvcompat.layouts._svg``) is not an import; a private file of the source tree is written as
  a path (``kvcompat/_ops.py``).
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
SOURCES = sorted(
    [p for p in DOCS.rglob("*.md") if "_build" not in p.parts and "_generated" not in p.parts]
    + [REPO / "README.md", REPO / "CHANGELOG.md"]
)

PRIVATE_MODULE = re.compile(r"(?<![\w.])kvcompat(?:\.[A-Za-z0-9_]+)*\._[A-Za-z][A-Za-z0-9_]*")
MAINTAINER_COMMAND = re.compile(r"-m\s+$")  # what precedes ``kvcompat...`` in ``python -m``
MACHINE_PATH = re.compile(r"(?<![\w./-])(?:shared/reference|shared/briefs|/work/|~/)[\w./-]*")
LINK = re.compile(r"\]\(([^)\s]+)\)")
INCLUDE = re.compile(r"^```\{(?:include|literalinclude)\}\s+(\S+)", re.MULTILINE)
DOC_ROLE = re.compile(r"\{doc\}`(?:[^`<]*<)?([^`>]+)>?`")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
TOP_DIRS = ("docs", "tests", "kvcompat", "benchmarks", "examples", "requirements", ".ci")
AUTODOC = re.compile(r"^\.\. auto(?:function|class|exception|module|data)::\s+(\S+)", re.M)


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def _inside_repo(path: Path) -> bool:
    try:
        path.resolve().relative_to(REPO)
    except ValueError:
        return False
    return True


def private_modules(text: str) -> list[str]:
    """The private kvcompat modules ``text`` names (not counting ``python -m`` commands).

    Example:
        >>> private_modules("see kvcompat._ops.register_layout, not kvcompat.adapt")
        ['kvcompat._ops']
        >>> private_modules("python -m kvcompat.layouts._svg docs/layouts")
        []
        >>> private_modules("kvcompat/_ops.py and kvcompat.__version__")
        []
    """
    found = []
    for match in PRIVATE_MODULE.finditer(text):
        if MAINTAINER_COMMAND.search(text[max(0, match.start() - 8) : match.start()]):
            continue
        found.append(match.group())
    return found


def _targets(text: str) -> list[str]:
    found = [m.group(1) for m in LINK.finditer(text)]
    found += [m.group(1) for m in INCLUDE.finditer(text)]
    found += [m.group(1) for m in DOC_ROLE.finditer(text)]
    return [
        target
        for target in found
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target)  # https:, mailto:, ...
        and not target.startswith("#")
    ]


@pytest.mark.parametrize("source", SOURCES, ids=_rel)
def test_no_private_module_is_named(source: Path) -> None:
    text = source.read_text(encoding="utf-8")
    assert private_modules(text) == [], (
        f"{_rel(source)} names private modules; name the public API, or write a source file "
        "as a path (kvcompat/_ops.py)"
    )


@pytest.mark.parametrize("source", SOURCES, ids=_rel)
def test_no_path_of_the_development_machine(source: Path) -> None:
    text = source.read_text(encoding="utf-8")
    assert MACHINE_PATH.findall(text) == [], f"{_rel(source)}: not in the repository"


@pytest.mark.parametrize("source", SOURCES, ids=_rel)
def test_relative_targets_stay_inside_the_repository_and_exist(source: Path) -> None:
    text = source.read_text(encoding="utf-8")
    bad = []
    for target in _targets(text):
        path = target.split("#", 1)[0]
        if not path:
            continue
        resolved = (source.parent / path) if not path.startswith("/") else REPO / path[1:]
        if not _inside_repo(resolved):
            bad.append(f"{target} (outside the repository)")
        elif "_generated" in resolved.parts:
            continue  # written by docs/conf.py at build time (checked below)
        elif not (resolved.exists() or resolved.with_suffix(".md").exists()):
            bad.append(f"{target} (no such file)")
    assert bad == [], f"{_rel(source)}: {bad}"


@pytest.mark.parametrize("source", SOURCES, ids=_rel)
def test_repository_paths_in_code_exist(source: Path) -> None:
    text = source.read_text(encoding="utf-8")
    missing = []
    for span in CODE_SPAN.findall(text):
        for raw in span.split():
            word = raw.strip(",;:()[]'\"")
            head = word.split("/", 1)[0]
            if head not in TOP_DIRS or "/" not in word or re.search(r"[*<>{}$]", word):
                continue
            path = word.split("::", 1)[0].rstrip(".")
            if not (REPO / path).exists():
                missing.append(path)
    assert missing == [], f"{_rel(source)} names paths this repository does not have"


def _generated(tmp: Path) -> list[Path]:
    sys.path.insert(0, str(DOCS))
    try:
        importlib.import_module("_gen").write_generated(tmp)
        importlib.import_module("_capture_gen").write_capture_table(tmp)
        importlib.import_module("_layouts_gen").write_layout_fragments(tmp)
    finally:
        sys.path.remove(str(DOCS))
    return sorted(tmp.rglob("*.md"))


def test_the_generated_fragments_name_nothing_private(tmp_path: Path) -> None:
    fragments = _generated(tmp_path)
    assert fragments  # the generators ran
    for fragment in fragments:
        text = fragment.read_text(encoding="utf-8")
        assert private_modules(text) == [], fragment.name
        assert MACHINE_PATH.findall(text) == [], fragment.name


def _autodoc_objects() -> list[str]:
    return sorted(set(AUTODOC.findall((DOCS / "api.md").read_text(encoding="utf-8"))))


def _resolve(name: str) -> object:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    msg = f"cannot import {name}"
    raise ImportError(msg)


def test_the_api_reference_documents_public_names_only() -> None:
    names = _autodoc_objects()
    assert len(names) > 50  # the reference is read
    assert [name for name in names if private_modules(name)] == []


@pytest.mark.parametrize("name", _autodoc_objects())
def test_the_api_reference_docstrings_name_nothing_private(name: str) -> None:
    obj = _resolve(name)
    doc = inspect.getdoc(obj) or ""
    assert private_modules(doc) == [], name
    assert MACHINE_PATH.findall(doc) == [], name
