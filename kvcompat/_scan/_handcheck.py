"""What ``--fix`` leaves to a check by hand: the uses of its rewritten calls it cannot vouch for.

The getters ``--fix`` writes make the native call first and, where the pool raises
``NotImplementedError`` (DeepSeek-V4 single-KV, indexer and composite pools, key-only
pools), answer through ``kvcompat.compat(pool)``. On packed pools those buffers are
logical views: shapes, gathers by token and metadata answer correctly; anything else
raises ``CompatViewError``, and a whole-row store quantizes into the pool (on a
single-KV pool the value view is the key row). So each use of a rewritten getter's buffer
that is not a shape, a metadata read or a gather by token is listed, as is each rewritten
``set_kv_buffer`` (its ``cache_v`` is not stored where the value is part of the key row,
as ``kvcompat.compat`` and SGLang's MLA pool do). They are notes, not findings: they do
not change the exit status, and ``# kvcompat: ignore[KVC100]`` on the line silences one.
"""

from __future__ import annotations

import ast

from kvcompat._scan._analysis import FIX_HELPERS
from kvcompat._scan._buffers import Role, UseKind, buffer_role, uses
from kvcompat._scan._rules import HAND_CHECK, Finding
from kvcompat._scan._source import SourceText, Suppressions
from kvcompat._scan._syntax import FUNCTIONS

__all__ = ["hand_checks"]

_GETTERS = {
    FIX_HELPERS["KVC001"]: "get_value_buffer",
    FIX_HELPERS["KVC002"]: "get_kv_buffer",
}
_SETTER = FIX_HELPERS["KVC003"]
_SAFE = frozenset({UseKind.HEAD_DIM, UseKind.ROWS, UseKind.METADATA})
_VIEW = (
    "where the pool's own {method}() raises (DeepSeek-V4, key-only pools) that buffer is a "
    "kvcompat.compat view, which answers shapes, metadata and gathers by token and raises "
    "CompatViewError for anything else"
)
_STORE = (
    "where the pool's own {method}() raises that buffer is a kvcompat.compat view, and "
    "this store quantizes whole rows into the pool; on DeepSeek-V4 single-KV pools the "
    "value view is the key row, so a value stored here replaces the key"
)
_PORT = "; run it once on such a pool, or port it to kvcompat.adapt(pool).read / .write"
_SET = (
    "{call} — on pools whose value is part of the key row (MLA, DSA, DeepSeek-V4) cache_v "
    "is not stored, as kvcompat.compat(pool).set_kv_buffer and SGLang's MLA pool do: the "
    "value read back is the key's latent. Check that the backend passes the latent as "
    "cache_k there (as DeepSeek models do)"
)


def hand_checks(tree: ast.Module, text: str, path: str) -> list[Finding]:
    r"""The lines of a module ``--fix`` rewrote that still need a check by hand.

    Args:
        tree: ``ast.parse(text)``.
        text: The module's source.
        path: The name to put into the notes.

    Returns:
        ``KVC100`` notes in source order (``fixable`` False), suppressed ones left out.

    Example:
        >>> import ast
        >>> from kvcompat._scan._handcheck import hand_checks
        >>> text = (
        ...     "def f(pool, loc):\n"
        ...     "    k, v = _kvcompat_get_kv_buffer(pool, 0)\n"
        ...     "    dim = v.shape[-1]\n"            # a shape: fine
        ...     "    rows = k[loc]\n"                # a gather by token: fine
        ...     "    return kernel(k, v, dim)\n"     # passed on whole: listed
        ... )
        >>> [(n.line, n.code) for n in hand_checks(ast.parse(text), text, "f.py")]
        [(5, 'KVC100')]
    """
    if "_kvcompat_" not in text:
        return []
    source = SourceText(text)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    notes: dict[tuple[int, int], Finding] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        name = node.func.id
        if name == _SETTER:
            call = " ".join(source.segment(node).split())
            _note(notes, source, path, node, _SET.format(call=_short(call)))
            continue
        method = _GETTERS.get(name)
        role = buffer_role(method) if method else None
        if method is None or role is None:
            continue
        function: ast.AST = _enclosing(node, parents) or tree
        for use in uses(node, role, parents, function):
            if use.kind in _SAFE and not use.layout_call:
                continue
            shown = _short(" ".join(source.segment(use.node).split()))
            part = "" if use.role is Role.PAIR else f"{use.role.value} "
            what = f"{shown} — uses the {part}buffer of {name}() (line {node.lineno})"
            template = _STORE if use.kind is UseKind.STORE else _VIEW
            _note(notes, source, path, use.node, f"{what}; {template.format(method=method)}{_PORT}")
    suppressions = Suppressions.parse(text)
    kept = [n for n in notes.values() if not suppressions.covers(n.line, HAND_CHECK)]
    return sorted(kept, key=lambda n: (n.line, n.col))


def _enclosing(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> ast.AST | None:
    current = parents.get(node)
    while current is not None and not isinstance(current, (*FUNCTIONS, ast.Lambda)):
        current = parents.get(current)
    return current


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _note(
    notes: dict[tuple[int, int], Finding],
    source: SourceText,
    path: str,
    node: ast.expr,
    message: str,
) -> None:
    line = node.lineno
    col = source.char_col(line, node.col_offset) + 1
    key = (line, col)
    if key in notes:  # the same node reached twice (k and v passed to one call): one note
        return
    notes[key] = Finding(path, line, col, HAND_CHECK, f"check by hand: {message}", fixable=False)
