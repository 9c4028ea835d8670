"""What code does with a buffer a getter returned: head-dim probes, token rows, anything else.

Two checks read the uses of a buffer:

* ``KVC008`` / ``KVC009`` (in :mod:`kvcompat._scan._analysis`): a buffer of kvcompat's
  key-first adapter (``kvcompat.adapt(pool).get_value_buffer(i)``, ``pool.kvcompat...``, or
  the helpers an older ``kvcompat scan --fix`` wrote) is the pool's *storage*: on DeepSeek-V4
  single-KV pools packed page-major bytes ``[pages, page_bytes]``. Its ``shape[-1]`` is the
  bytes of a page (37,440 on V4), not a head dim, and ``buf[loc]`` reads page rows, silently.
* :func:`hand_checks`: the getters ``--fix`` writes fall back to ``kvcompat.compat(pool)``,
  whose buffers on packed pools are logical views: shapes, gathers by token and row stores
  work; anything else raises ``CompatViewError``. Each use of a rewritten getter's buffer
  the scanner cannot show to be one of those is listed for a check by hand.

The uses are followed through a name the buffer is assigned to (``v = ...``), a pair's
unpacking (``k, v = ...get_kv_buffer(i)``), a pair's ``[0]``/``[1]``, and calls that keep
the layout (``.to(dtype)``, ``.contiguous()``), within the enclosing function.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
from collections.abc import Iterator

__all__ = ["Role", "Use", "UseKind", "buffer_role", "uses"]

# Tensor metadata a logical view answers (kvcompat._compat._view._allowed), as attributes...
_METADATA = frozenset(
    {"shape", "dtype", "device", "ndim", "is_cuda", "is_cpu", "layout", "requires_grad"}
)
# ...and as methods.
_METADATA_CALLS = frozenset(
    {"size", "dim", "ndimension", "numel", "nelement", "element_size", "get_device"}
)
_METADATA_CALLS_BUILTIN = frozenset({"len", "id", "type", "isinstance"})
# Tensor methods that pick token rows (as a subscript does).
_ROW_METHODS = frozenset(
    {"index_select", "index_copy_", "index_put_", "index_fill_", "index_add_", "gather"}
)
_GATHERS = frozenset({"index_select"})
_MAX_DEPTH = 8
# Calls that keep a buffer's layout (``get_value_buffer(i).to(q.dtype)``): on a view they
# are whole-buffer operations (refused); on raw storage the result has the same layout.
_SAME_LAYOUT = frozenset({"to", "contiguous", "float", "half", "bfloat16", "view", "reshape"})


class Role(enum.Enum):
    """Which part of a layer a buffer holds."""

    KEY = "key"
    VALUE = "value"
    PAIR = "pair"  # get_kv_buffer's (key, value)


class UseKind(enum.Enum):
    """What a use of a buffer does."""

    HEAD_DIM = "head_dim"  # shape[...] / size(...) of a value (or key) buffer
    ROWS = "rows"  # buf[loc], buf.index_select(0, loc): token rows read
    STORE = "store"  # buf[loc] = x
    METADATA = "metadata"  # dtype, device, len(), numel(), ...
    OTHER = "other"  # anything else: passed to a kernel, returned, arithmetic, ...


@dataclasses.dataclass(frozen=True)
class Use:
    """One use of a buffer: what it does, the node that does it, the buffer's role there."""

    kind: UseKind
    node: ast.expr
    role: Role
    layout_call: bool = False  # reached through .to()/.contiguous()/...: a whole-buffer op


def buffer_role(method: str) -> Role | None:
    """The role of the buffer a getter returns (``get_kv_buffer`` -> :attr:`Role.PAIR`).

    Example:
        >>> from kvcompat._scan._buffers import buffer_role
        >>> buffer_role("get_value_buffer"), buffer_role("set_kv_buffer")
        (<Role.VALUE: 'value'>, None)
    """
    return {
        "get_key_buffer": Role.KEY,
        "get_value_buffer": Role.VALUE,
        "get_kv_buffer": Role.PAIR,
    }.get(method)


def _part(index: ast.expr) -> Role | None:
    if isinstance(index, ast.Constant) and index.value in (0, 1, -1, -2):
        return Role.KEY if index.value in (0, -2) else Role.VALUE
    return None


def uses(  # noqa: PLR0911, PLR0912 -- one branch per construct a buffer flows through
    node: ast.expr,
    role: Role,
    parents: dict[ast.AST, ast.AST],
    function: ast.AST,
    *,
    layout_call: bool = False,
    depth: int = 0,
) -> Iterator[Use]:
    r"""The uses of the buffer ``node`` evaluates to, within ``function``.

    Example:
        >>> import ast
        >>> from kvcompat._scan._buffers import Role, uses
        >>> tree = ast.parse("def f(p, loc):\n    k, v = g(p)\n    v.shape[-1]\n    k[loc]\n")
        >>> call = tree.body[0].body[0].value
        >>> parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
        >>> [(u.kind.value, u.role.value, u.node.lineno)
        ...  for u in uses(call, Role.PAIR, parents, tree.body[0])]
        [('rows', 'key', 4), ('head_dim', 'value', 3)]
    """
    if depth > _MAX_DEPTH:  # a name assigned to a name ... eight deep: give up
        yield Use(UseKind.OTHER, node, role, layout_call)
        return
    parent = parents.get(node)
    if isinstance(parent, ast.Attribute) and parent.value is node:
        outer_call = parents.get(parent)
        call = (
            outer_call if isinstance(outer_call, ast.Call) and outer_call.func is parent else None
        )
        if parent.attr == "shape" and role is not Role.PAIR:
            outer = parents.get(parent)
            if isinstance(outer, ast.Subscript) and outer.value is parent:
                yield Use(UseKind.HEAD_DIM, outer, role, layout_call)
            else:
                yield Use(UseKind.METADATA, parent, role, layout_call)
            return
        if parent.attr in _METADATA:
            yield Use(UseKind.METADATA, parent, role, layout_call)
            return
        if call is not None and parent.attr == "size" and role is not Role.PAIR:
            kind = UseKind.HEAD_DIM if call.args else UseKind.METADATA
            yield Use(kind, call, role, layout_call)
            return
        if call is not None and parent.attr in _METADATA_CALLS:
            yield Use(UseKind.METADATA, call, role, layout_call)
            return
        if call is not None and parent.attr in _ROW_METHODS and role is not Role.PAIR:
            kind = UseKind.ROWS if parent.attr in _GATHERS else UseKind.STORE
            yield Use(kind, call, role, layout_call)
            return
        if call is not None and parent.attr in _SAME_LAYOUT and role is not Role.PAIR:
            yield from uses(call, role, parents, function, layout_call=True, depth=depth + 1)
            return
        yield Use(UseKind.OTHER, parent, role, layout_call)
        return
    if isinstance(parent, ast.Subscript) and parent.value is node:
        if role is Role.PAIR:
            part = _part(parent.slice)
            if part is None:
                yield Use(UseKind.OTHER, parent, role, layout_call)
            else:
                yield from uses(parent, part, parents, function, depth=depth + 1)
            return
        kind = UseKind.STORE if isinstance(parent.ctx, ast.Store) else UseKind.ROWS
        yield Use(kind, parent, role, layout_call)
        return
    if isinstance(parent, ast.Call) and node in parent.args:
        func = parent.func
        if isinstance(func, ast.Name) and func.id in _METADATA_CALLS_BUILTIN:
            yield Use(UseKind.METADATA, parent, role, layout_call)
            return
        yield Use(UseKind.OTHER, parent, role, layout_call)
        return
    if isinstance(parent, (ast.Assign, ast.AnnAssign)) and parent.value is node:
        targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
        for target in targets:
            yield from _bound(target, node, role, parents, function, layout_call, depth)
        return
    if isinstance(parent, ast.NamedExpr) and parent.value is node:
        yield from _bound(parent.target, node, role, parents, function, layout_call, depth)
        return
    if isinstance(parent, ast.Expr):
        return  # evaluated and dropped
    yield Use(UseKind.OTHER, node, role, layout_call)


def _bound(
    target: ast.expr,
    value: ast.expr,
    role: Role,
    parents: dict[ast.AST, ast.AST],
    function: ast.AST,
    layout_call: bool,
    depth: int,
) -> Iterator[Use]:
    if isinstance(target, ast.Name):
        yield from _name_uses(target.id, target, role, parents, function, layout_call, depth)
        return
    if isinstance(target, (ast.Tuple, ast.List)) and role is Role.PAIR and len(target.elts) == 2:
        for part, element in zip((Role.KEY, Role.VALUE), target.elts, strict=True):
            if isinstance(element, ast.Name):
                yield from _name_uses(
                    element.id, element, part, parents, function, layout_call, depth
                )
            else:  # k, *rest = ...; a[i], b = ...: it escapes
                yield Use(UseKind.OTHER, value, part, layout_call)
        return
    yield Use(UseKind.OTHER, value, role, layout_call)  # self.k = ..., a[i] = ...: it escapes


def _name_uses(
    name: str,
    target: ast.Name,
    role: Role,
    parents: dict[ast.AST, ast.AST],
    function: ast.AST,
    layout_call: bool,
    depth: int,
) -> Iterator[Use]:
    """The uses of ``name`` in ``function`` after ``target`` binds it (until it is rebound)."""
    if name == "_":
        return
    after = (target.lineno, target.col_offset)
    rebound: tuple[int, int] | None = None
    loads: list[ast.Name] = []
    for inner in ast.walk(function):
        if not isinstance(inner, ast.Name) or inner.id != name:
            continue
        where = (inner.lineno, inner.col_offset)
        if where <= after:
            continue
        if isinstance(inner.ctx, ast.Store):
            rebound = where if rebound is None else min(rebound, where)
        else:
            loads.append(inner)
    for load in sorted(loads, key=lambda n: (n.lineno, n.col_offset)):
        if rebound is not None and (load.lineno, load.col_offset) > rebound:
            break
        yield from uses(load, role, parents, function, layout_call=layout_call, depth=depth + 1)
