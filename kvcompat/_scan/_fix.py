"""Scanning and fixing one module's source text.

Fixes are text edits at the spans ``ast`` reports, so everything outside those
spans (comments, formatting, line endings) stays byte-for-byte as it was. A
rewrite is kept only if the result parses.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterable, Sequence

from kvcompat._scan._analysis import FIX_ADAPTER, FIX_HELPERS, Edit, Hit, analyze
from kvcompat._scan._rules import Finding
from kvcompat._scan._source import SourceText, parse_module

__all__ = ["fix_source", "parse", "scan_source"]

# Nested fixable calls (one in another's receiver or arguments) are fixed one
# level per pass; no real module nests anywhere near this deep.
_MAX_PASSES = 50
_NEWLINE = re.compile(r"\r\n|\r|\n")

# What ``--fix`` adds to a module it rewrites (each piece only if the module lacks
# it). The native call runs first, so code that worked before behaves exactly as
# before (same tensors, same errors); only where the native pool raises
# NotImplementedError does kvcompat answer, through ``kvcompat.compat(pool)``: the
# pool's own methods, with getters that hand out logical views on packed pools
# (DeepSeek-V4: ``shape[-1]`` is the head dim, ``buf[loc]`` gathers token rows) and a
# set_kv_buffer that treats ``cache_v`` as ``compat`` does (ignored where the value is
# part of the key row). Anything else done with such a view raises CompatViewError,
# never reads packed bytes as rows. compat() costs tens of microseconds, so it is
# built once per pool object and looked up afterwards (well under a microsecond).
_HEADER = """\
# Added by `kvcompat scan --fix`: the native call runs first, and kvcompat.compat(pool)
# answers where the pool raises NotImplementedError (one proxy per pool object).
import weakref as _kvcompat_weakref

_kvcompat_compat_pools = _kvcompat_weakref.WeakKeyDictionary()
"""
_ADAPTER = f"""\


def {FIX_ADAPTER}(pool):
    try:
        return _kvcompat_compat_pools[pool]
    except (KeyError, TypeError):
        pass
    proxy = kvcompat.compat(pool)
    try:
        _kvcompat_compat_pools[pool] = proxy
    except TypeError:  # not weakly referenceable: wrap again on the next fallback
        pass
    return proxy
"""
_HELPERS: dict[str, str] = {
    "KVC001": """\


def {name}(pool, layer_id):
    try:
        return pool.get_value_buffer(layer_id)
    except NotImplementedError:
        return {adapter}(pool).get_value_buffer(layer_id)
""",
    "KVC002": """\


def {name}(pool, layer_id):
    try:
        return pool.get_kv_buffer(layer_id)
    except NotImplementedError:
        return {adapter}(pool).get_kv_buffer(layer_id)
""",
    "KVC003": """\


def {name}(pool, layer, loc, cache_k, cache_v):
    try:
        return pool.set_kv_buffer(layer, loc, cache_k, cache_v)
    except NotImplementedError:
        return {adapter}(pool).set_kv_buffer(layer, loc, cache_k, cache_v)
""",
}


def parse(text: str, path: str) -> ast.Module | Finding:
    r"""Parse ``text``, or describe why it does not parse as a ``KVC900`` finding.

    Example:
        >>> from kvcompat._scan._fix import parse
        >>> print(parse("x = (\n", "a.py").format())  # doctest: +NORMALIZE_WHITESPACE
        a.py:1:5: KVC900 syntax error: '(' was never closed;
        fix the file (or exclude it) and scan again
    """
    try:
        return parse_module(text, path)
    except SyntaxError as exc:
        line = exc.lineno or 0
        col = (exc.offset or 1) if line else 0
        reason = exc.msg
    except (RecursionError, MemoryError):
        line, col, reason = 0, 0, "too deeply nested for Python's parser"
    except ValueError as exc:  # null bytes, on Python versions that raise ValueError
        line, col, reason = 0, 0, str(exc)
    message = f"syntax error: {reason}; fix the file (or exclude it) and scan again"
    return Finding(path, line, col, "KVC900", message, fixable=False)


def scan_source(source: str, path: str = "<string>") -> list[Finding]:
    """Find the unguarded native pool accesses in one module's source.

    Args:
        source: Python source text.
        path: The name to put into the findings.

    Returns:
        The findings in source order. A module that does not parse gives one
        ``KVC900`` finding instead (this function never raises on bad input).
        Accesses in model definitions are reported too: telling those apart needs
        the module's importers, which :func:`~kvcompat.scan.scan_paths` reads.

    Example:
        >>> from kvcompat.scan import scan_source
        >>> source = '''
        ... def probe(pool, layer_id):
        ...     v_head_dim = pool.get_value_buffer(layer_id).shape[-1]
        ...     if kvcompat.is_single_kv_pool(pool):
        ...         return None
        ...     return pool.k_buffer[layer_id], v_head_dim
        ... '''
        >>> [(f.line, f.col, f.code) for f in scan_source(source, "probe.py")]
        [(3, 23, 'KVC001')]
    """
    tree = parse(source, path)
    if isinstance(tree, Finding):
        return [tree]
    return [hit.finding for hit in analyze(tree, source, path)]


def fix_source(source: str, path: str = "<string>") -> tuple[str, list[Finding]]:
    r"""Route the mechanical cases through kvcompat; report what is left.

    ``X.get_value_buffer(i)``, ``X.get_kv_buffer(i)`` and
    ``X.set_kv_buffer(layer, loc, k, v)`` (exactly these positional arguments)
    become ``_kvcompat_get_value_buffer(X, i)``, ``_kvcompat_get_kv_buffer(X, i)``
    and ``_kvcompat_set_kv_buffer(X, layer, loc, k, v)``: helpers that ``--fix``
    adds to the module (with ``import kvcompat`` if it is missing) after the
    docstring and ``__future__`` imports. Each makes the native call first, so
    code that worked behaves exactly as before; only where the native pool
    raises ``NotImplementedError`` does it make the same call on
    ``kvcompat.compat(pool)``, one proxy kept per pool object (``compat()`` costs
    tens of microseconds; the lookup does not): logical views on packed pools,
    and a ``set_kv_buffer`` that treats ``cache_v`` as ``compat`` does. Every
    other character is kept as it was, and the result always parses. What the
    rewrite cannot vouch for is listed by ``kvcompat scan`` as ``KVC100`` notes.

    Args:
        source: Python source text.
        path: The name to put into the findings.

    Returns:
        The fixed text (``source`` itself when nothing changed) and the findings
        that remain in it.

    Example:
        >>> from kvcompat.scan import fix_source
        >>> source = (
        ...     "from __future__ import annotations\n"
        ...     "def forward(pool, layer, loc, k, v):\n"
        ...     "    pool.set_kv_buffer(layer, loc, k, v)\n"
        ...     "    return pool.get_kv_buffer(layer.layer_id)\n"
        ... )
        >>> fixed, remaining = fix_source(source)
        >>> print(fixed.split("\n\n\n")[-1], end="")  # the module's own code
        def forward(pool, layer, loc, k, v):
            _kvcompat_set_kv_buffer(pool, layer, loc, k, v)
            return _kvcompat_get_kv_buffer(pool, layer.layer_id)
        >>> "import kvcompat\n" in fixed, "def _kvcompat_set_kv_buffer(" in fixed, remaining
        (True, True, [])
    """
    return fix_module(source, path)


def fix_module(
    source: str, path: str = "<string>", *, exempt: frozenset[str] = frozenset()
) -> tuple[str, list[Finding]]:
    """:func:`fix_source`, leaving the top-level defs named in ``exempt`` as they are.

    Their accesses are neither rewritten nor reported (model code, for ``scan_paths``).
    """
    tree = parse(source, path)
    if isinstance(tree, Finding):
        return source, [tree]
    original, text = tree, source
    changed = False
    for _ in range(_MAX_PASSES):
        step = _fix_pass(text, tree, path, exempt)
        if step is None:
            break
        text, tree = step
        changed = True
    if changed:
        header = _header(tree)
        if header:
            with_header = _add_import(text, tree, header)
            parsed = parse(with_header, path)
            if isinstance(parsed, Finding):  # pragma: no cover - the header always parses
                found = analyze(original, source, path, exempt=exempt)
                return source, [hit.finding for hit in found]
            text, tree = with_header, parsed
    remaining = [hit.finding for hit in analyze(tree, text, path, exempt=exempt)]
    return text, [_unfixed(finding) for finding in remaining]


def apply_edits(text: str, edits: Iterable[Edit]) -> str:
    """Apply non-overlapping edits to ``text``.

    Example:
        >>> from kvcompat._scan._analysis import Edit
        >>> from kvcompat._scan._fix import apply_edits
        >>> apply_edits("pool.x", [Edit(0, 0, "f("), Edit(4, 4, ")")])
        'f(pool).x'
    """
    pieces: list[str] = []
    cursor = 0
    for edit in sorted(edits, key=lambda edit: (edit.start, edit.end)):
        pieces.append(text[cursor : edit.start])
        pieces.append(edit.text)
        cursor = edit.end
    pieces.append(text[cursor:])
    return "".join(pieces)


def _fix_pass(
    text: str, tree: ast.Module, path: str, exempt: frozenset[str]
) -> tuple[str, ast.Module] | None:
    """Fix every fixable hit that does not overlap another; None when none is left."""
    hits = [hit for hit in analyze(tree, text, path, exempt=exempt) if hit.edits]
    hits.sort(key=lambda hit: (hit.span[0], -hit.span[1]))
    disjoint: list[Hit] = []
    for hit in hits:
        if not disjoint or hit.span[0] >= disjoint[-1].span[1]:
            disjoint.append(hit)
    if not disjoint:
        return None
    fixed = _try(text, disjoint, path)
    if fixed is not None:
        return fixed
    # Some rewrite does not parse (say, a yield expression as the receiver):
    # keep the ones that parse on their own, and leave the rest reported.
    working = [hit for hit in disjoint if _try(text, [hit], path) is not None]
    return _try(text, working, path) if working else None


def _try(text: str, hits: Sequence[Hit], path: str) -> tuple[str, ast.Module] | None:
    candidate = apply_edits(text, [edit for hit in hits for edit in hit.edits])
    parsed = parse(candidate, path)
    return None if isinstance(parsed, Finding) else (candidate, parsed)


def _unfixed(finding: Finding) -> Finding:
    """A fixable finding still there after fixing is one whose rewrite did not parse."""
    if not finding.fixable:
        return finding
    message = f"{finding.message}; not auto-fixable: the rewrite would not parse"
    return dataclasses.replace(finding, message=message, fixable=False)


def _imports_kvcompat(tree: ast.Module) -> bool:
    """Whether a top-level statement binds the name ``kvcompat`` to the package."""
    for stmt in tree.body:
        if not isinstance(stmt, ast.Import):
            continue
        for alias in stmt.names:
            plain = alias.asname is None and (
                alias.name == "kvcompat" or alias.name.startswith("kvcompat.")
            )
            if plain or (alias.name == "kvcompat" and alias.asname == "kvcompat"):
                return True
    return False


def _header(tree: ast.Module) -> str:
    """``import kvcompat`` and the helpers the rewritten calls use, where missing."""
    defined = {stmt.name for stmt in tree.body if isinstance(stmt, ast.FunctionDef)}
    called = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    helpers = [
        template.format(name=FIX_HELPERS[code], adapter=FIX_ADAPTER)
        for code, template in _HELPERS.items()
        if FIX_HELPERS[code] in called and FIX_HELPERS[code] not in defined
    ]
    parts = [] if _imports_kvcompat(tree) else ["import kvcompat\n"]
    if helpers and FIX_ADAPTER not in defined:
        parts.extend((_HEADER, _ADAPTER))
    parts.extend(helpers)
    if helpers:
        parts.append("\n\n")  # two blank lines before the module's own code
    return "".join(parts)


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def _add_import(text: str, tree: ast.Module, header: str = "import kvcompat\n") -> str:
    """Insert ``header`` after the docstring and ``from __future__`` imports.

    It goes just before the next statement, so a shebang, an encoding line and
    header comments stay where they are.
    """
    body = tree.body
    index = 1 if body and _is_docstring(body[0]) else 0
    while (
        index < len(body)
        and isinstance(body[index], ast.ImportFrom)
        and getattr(body[index], "module", None) == "__future__"
    ):
        index += 1
    match = _NEWLINE.search(text)
    newline = match.group() if match else "\n"
    header = header.replace("\n", newline)
    if index == len(body):  # only a docstring and __future__ imports: append
        separator = "" if not text or text.endswith(("\n", "\r")) else newline
        return f"{text}{separator}{header}"
    stmt = body[index]
    first_line = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", []))])
    source = SourceText(text)
    line_start = source.offset(first_line, 0)
    before = source.line(first_line)[: source.char_col(first_line, stmt.col_offset)]
    if first_line == stmt.lineno and before.strip():
        # The statement shares its line with the one before it (``"""doc"""; x = 1``).
        at = source.start(stmt)
        if header == f"import kvcompat{newline}":
            return f"{text[:at]}import kvcompat; {text[at:]}"
        return f"{text[:at]}{header}{text[at:]}"
    return f"{text[:line_start]}{header}{text[line_start:]}"
