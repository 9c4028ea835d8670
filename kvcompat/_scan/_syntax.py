"""Small facts about Python syntax trees that the scanner's passes share."""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterator

__all__ = [
    "FUNCTIONS",
    "Function",
    "assigned_names",
    "blocks",
    "expr_key",
    "is_self",
    "key_rooted_at_self",
    "last_name",
    "operands",
    "parameters",
    "prefixes",
    "single_assignments",
    "statements",
    "top_level_defs",
]

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
Function = ast.FunctionDef | ast.AsyncFunctionDef

# How expr_key() of an expression reached from ``self`` through prefixes() starts: ast.dump
# writes the outermost node first, so ``self.a[i].f(x)`` is Call(func=Attribute(value=...
_SELF_ROOTED_KEY = re.compile(r"(?:(?:Attribute|Subscript)\(value=|Call\(func=)*Name\(id='self'")


def is_self(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Name) and expr.id == "self"


def assigned_names(body: list[ast.stmt]) -> Iterator[str]:
    """The names a class or module body assigns (``k_buffer = None``, ``a, b = 1, 2``)."""
    for stmt in body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                yield from (n.id for n in ast.walk(target) if isinstance(n, ast.Name))


def last_name(expr: ast.expr) -> str:
    """The name a class is written with: ``KVCache`` in ``memory_pool.KVCache``."""
    while isinstance(expr, ast.Subscript):
        expr = expr.value
    if isinstance(expr, ast.Name):
        return expr.id
    return expr.attr if isinstance(expr, ast.Attribute) else ""


def prefixes(expr: ast.expr) -> Iterator[ast.expr]:
    """``a.b[i].c``, ``a.b[i]``, ``a.b``, ``a``: the expression and what it is reached from."""
    while True:
        yield expr
        if isinstance(expr, (ast.Attribute, ast.Subscript)):
            expr = expr.value
        elif isinstance(expr, ast.Call):
            expr = expr.func
        else:
            return


def expr_key(expr: ast.expr) -> str:
    """A spelling-independent key for an expression (positions and context dropped)."""
    return ast.dump(expr)


def key_rooted_at_self(key: str) -> bool:
    """Whether the expression a key was made from is reached from ``self`` (``prefixes``).

    Example:
        >>> import ast
        >>> key = expr_key(ast.parse("self.a[i].f(x)", mode="eval").body)
        >>> key_rooted_at_self(key), key_rooted_at_self(expr_key(ast.Name(id="selfish")))
        (True, False)
    """
    return _SELF_ROOTED_KEY.match(key) is not None


def parameters(args: ast.arguments) -> Iterator[ast.arg]:
    """Every parameter of a function, in order."""
    yield from args.posonlyargs
    yield from args.args
    if args.vararg is not None:
        yield args.vararg
    yield from args.kwonlyargs
    if args.kwarg is not None:
        yield args.kwarg


def top_level_defs(tree: ast.Module) -> Iterator[tuple[str, int, int]]:
    r"""The module's top-level functions and classes: (name, first line, last line).

    The first line is that of the first decorator, if any.

    Example:
        >>> import ast
        >>> list(top_level_defs(ast.parse("x = 1\n@cache\ndef f():\n    pass\n")))
        [('f', 2, 4)]
    """
    for stmt in tree.body:
        if isinstance(stmt, (*FUNCTIONS, ast.ClassDef)):
            first = min([stmt.lineno, *(d.lineno for d in stmt.decorator_list)])
            yield stmt.name, first, stmt.end_lineno or stmt.lineno


def blocks(stmt: ast.stmt) -> Iterator[list[ast.stmt]]:
    """The statement lists nested in a statement: its body, else, finally, handlers, cases."""
    for field in ("body", "orelse", "finalbody"):
        children = getattr(stmt, field, None)
        if isinstance(children, list) and all(isinstance(c, ast.stmt) for c in children):
            yield children
    for clause in (*getattr(stmt, "handlers", []), *getattr(stmt, "cases", [])):
        yield clause.body


def statements(body: list[ast.stmt], *, into_defs: bool = False) -> Iterator[ast.stmt]:
    """The statements of a body in source order, nested blocks included.

    The bodies of nested functions and classes are included only with ``into_defs``.
    """
    stack = list(reversed(body))
    while stack:
        stmt = stack.pop()
        yield stmt
        if into_defs or not isinstance(stmt, (*FUNCTIONS, ast.ClassDef)):
            for block in reversed(list(blocks(stmt))):
                stack.extend(reversed(block))


def operands(test: ast.expr, op: type[ast.boolop]) -> list[ast.expr]:
    """The operands of a ``test`` joined by ``op`` (``and``/``or``), or ``[test]``."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, op):
        return list(test.values)
    return [test]


def single_assignments(function: Function) -> dict[str, ast.expr]:
    r"""Local names a function assigns exactly once (``name = value``), with the value.

    A parameter assigned in the body holds the argument until then, so it is not one.

    Example:
        >>> import ast
        >>> source = "def f(p):\n    a = p.x\n    p = 1\n    b = 2\n    b = 3\n"
        >>> sorted(single_assignments(ast.parse(source).body[0]))
        ['a']
    """
    stores = Counter(
        node.id
        for node in ast.walk(function)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)
    )
    stores.update(param.arg for param in parameters(function.args))
    found: dict[str, ast.expr] = {}
    for stmt in statements(function.body):
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target = stmt.targets[0]
            if isinstance(target, ast.Name) and stores[target.id] == 1:
                found[target.id] = stmt.value
    return found
