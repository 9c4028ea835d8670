"""What a truthy test tells about a pool's class: direct probes and flags a class computes.

A backend often asks once, in ``__init__``, what its pool is, and keeps the answer::

    def _pool_is_vec5d(pool):
        if isinstance(pool, SWAKVPool):
            return getattr(pool.full_kv_pool, "kv_cache_layout", "nhd") == "vectorized_5d"
        return getattr(pool, "kv_cache_layout", "nhd") == "vectorized_5d"

    self.token_to_kv_pool = model_runner.token_to_kv_pool
    self.kv_cache_is_vectorized_5d = _pool_is_vec5d(model_runner.token_to_kv_pool)
    ...
    if self.kv_cache_is_vectorized_5d:
        self.token_to_kv_pool.set_kv_buffer(...)   # runs only on an MHA or SWA pool

:func:`when_true` answers, for a test, which pool expressions are known to be of a class
where which rules' accesses work, *in the branch where the test is true* (the false branch
learns nothing: "not MHA" may be anything). It follows ``and``/``or``, calls of functions
of the module or methods of the class (their truthy returns, and the ``if`` tests those
returns sit under), and ``self.<flag>`` attributes every assignment of which is such a
test. Names are resolved through parameters and single assignments. What a flag tells
reaches other methods only about ``self`` attributes: those its test names, and the one
attribute the assigning method stores the probed pool in, if nothing else assigns it
(``self.token_to_kv_pool = model_runner.token_to_kv_pool``); a parameter of one method is
another object in the next. Depth is bounded, so recursive helpers cannot loop.

A probe is positive only when its truth names the class:

* ``isinstance(P, C)`` for the classes of :data:`POSITIVE_CLASSES`;
* ``getattr(P, A, d) == c`` (``c`` a constant other than ``d``) and ``P.A == c`` for an
  attribute ``A`` of :data:`MHA_ONLY_ATTRIBUTES`: only MHA pools carry it.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Mapping

from kvcompat._scan._rules import RULES
from kvcompat._scan._syntax import (
    FUNCTIONS,
    Function,
    assigned_names,
    blocks,
    expr_key,
    is_self,
    key_rooted_at_self,
    last_name,
    single_assignments,
    statements,
)

__all__ = ["MHA_ONLY_ATTRIBUTES", "POSITIVE_CLASSES", "Known", "ProbeIndex"]

Known = dict[str, frozenset[str]]
"""Pool expression key (``ast.dump``) -> the rule codes whose accesses work on it."""

_ALL = frozenset(RULES)
_METHODS = frozenset({"KVC001", "KVC002", "KVC003", "KVC006"})

# Attributes only SGLang's MHATokenToKVPool (and its subclasses) sets, in 0.5.23
# (tests/real/test_scan_facts_real.py checks the installed wheel): a pool that has one is
# an MHA pool, with k_buffer/v_buffer and working getters and writer.
MHA_ONLY_ATTRIBUTES = frozenset(
    {"native_k_scale_buffer", "native_v_scale_buffer", "kv_cache_layout"}
)

# isinstance(P, C) true -> the rules whose accesses work on P. SWAKVPool forwards the
# methods to its MHA sub-pools but has no k_buffer/v_buffer/kv_buffer of its own, and its
# get_kv_buffer_shape() raises KeyError when the pool starts past layer 0 (0.5.23).
POSITIVE_CLASSES: Mapping[str, frozenset[str]] = {
    "MHATokenToKVPool": _ALL,
    "SWAKVPool": _METHODS,
}

_MAX_DEPTH = 6  # nested calls, and/or and conditional expressions
_Assignment = tuple[ast.expr | None, Function | None]


def _root(expr: ast.expr) -> ast.Name | None:
    while isinstance(expr, (ast.Attribute, ast.Subscript)):
        expr = expr.value
    return expr if isinstance(expr, ast.Name) else None


def _both(first: Known, second: Known) -> Known:
    """What ``a and b`` being true tells: everything either tells."""
    merged = dict(first)
    for key, codes in second.items():
        merged[key] = merged.get(key, frozenset()) | codes
    return merged


def _either(first: Known, second: Known) -> Known:
    """What ``a or b`` being true tells: only what both tell."""
    return {
        key: first[key] & second[key]
        for key in first.keys() & second.keys()
        if first[key] & second[key]
    }


def _never_true(expr: ast.expr | None) -> bool:
    return expr is None or (isinstance(expr, ast.Constant) and not expr.value)


class _Frame:
    """A function being read: its parameters' arguments and its single-assigned locals."""

    def __init__(
        self, function: Function | ast.Lambda | None, args: Mapping[str, ast.expr]
    ) -> None:
        self.function = function
        self.args = dict(args)
        self.locals = single_assignments(function) if isinstance(function, FUNCTIONS) else {}

    def resolve(self, expr: ast.expr, depth: int = 0) -> ast.expr:
        """``expr`` with its root name replaced by the argument or value it stands for."""
        root = _root(expr)
        if root is None or depth > _MAX_DEPTH or is_self(root):
            return expr
        if root.id in self.args:
            replacement = self.args[root.id]
        elif root.id in self.locals:
            replacement = self.resolve(self.locals[root.id], depth + 1)
        else:
            return expr
        if expr is root:
            return replacement
        rebuilt = copy.deepcopy(expr)
        node: ast.expr = rebuilt
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            if isinstance(node.value, ast.Name):
                node.value = replacement
                break
            node = node.value
        return rebuilt


class ProbeIndex:
    """Positive probes of one module: its functions, and per class its methods and flags."""

    def __init__(self, module: ast.Module) -> None:
        self.functions: dict[str, Function] = {
            stmt.name: stmt for stmt in module.body if isinstance(stmt, FUNCTIONS)
        }
        self._flags: dict[tuple[int, str], Known] = {}
        self._assigned: dict[int, dict[str, list[_Assignment]]] = {}
        self._frames: dict[int, _Frame] = {}

    def _frame(self, function: Function | ast.Lambda | None) -> _Frame:
        """The argument-less frame of a function (its locals), built once."""
        frame = self._frames.get(id(function))
        if frame is None:
            frame = self._frames[id(function)] = _Frame(function, {})
        return frame

    # -- entry point ----------------------------------------------------------

    def when_true(
        self, test: ast.expr, function: Function | ast.Lambda | None, cls: ast.ClassDef | None
    ) -> Known:
        """Pool keys known, in the true branch of ``test``, to be of a positive class."""
        return self._truthy(test, self._frame(function), cls, 0)

    # -- expressions ----------------------------------------------------------

    def _truthy(  # noqa: PLR0911 -- one return per kind of expression
        self, expr: ast.expr, frame: _Frame, cls: ast.ClassDef | None, depth: int
    ) -> Known:
        if depth > _MAX_DEPTH:
            return {}
        if isinstance(expr, ast.BoolOp):
            parts = [self._truthy(value, frame, cls, depth + 1) for value in expr.values]
            result = parts[0]
            for part in parts[1:]:
                result = (
                    _both(result, part) if isinstance(expr.op, ast.And) else _either(result, part)
                )
            return result
        if isinstance(expr, ast.NamedExpr):
            return self._truthy(expr.value, frame, cls, depth + 1)
        if isinstance(expr, ast.Compare):
            return self._compare(expr, frame)
        if isinstance(expr, ast.Call):
            return self._call(expr, frame, cls, depth)
        if isinstance(expr, ast.Attribute) and is_self(expr.value) and cls is not None:
            return self._flag(cls, expr.attr)
        if isinstance(expr, ast.Name) and expr.id in frame.locals:
            return self._truthy(frame.locals[expr.id], frame, cls, depth + 1)
        return {}

    def _compare(self, expr: ast.Compare, frame: _Frame) -> Known:
        if len(expr.ops) != 1 or not isinstance(expr.ops[0], ast.Eq):
            return {}
        left, right = expr.left, expr.comparators[0]
        if not (isinstance(right, ast.Constant) and right.value is not None):
            return {}
        subject: ast.expr | None = None
        if (
            isinstance(left, ast.Call)
            and isinstance(left.func, ast.Name)
            and left.func.id == "getattr"
            and len(left.args) == 3
            and not left.keywords
        ):
            pool, name, default = left.args
            same_as_default = isinstance(default, ast.Constant) and default.value == right.value
            if (
                isinstance(name, ast.Constant)
                and name.value in MHA_ONLY_ATTRIBUTES
                and not same_as_default
            ):
                subject = pool
        elif isinstance(left, ast.Attribute) and left.attr in MHA_ONLY_ATTRIBUTES:
            subject = left.value
        if subject is None:
            return {}
        return {expr_key(frame.resolve(subject)): _ALL}

    def _call(self, call: ast.Call, frame: _Frame, cls: ast.ClassDef | None, depth: int) -> Known:
        func = call.func
        if isinstance(func, ast.Name) and func.id == "isinstance" and len(call.args) == 2:
            pool, classes = call.args
            names = classes.elts if isinstance(classes, ast.Tuple) else [classes]
            codes: frozenset[str] | None = None
            for name in names:
                works = POSITIVE_CLASSES.get(last_name(name), frozenset())
                codes = works if codes is None else codes & works
            return {expr_key(frame.resolve(pool)): codes} if codes else {}
        callee, bound = self._callee(func, frame, cls)
        if callee is None or call.keywords or any(isinstance(a, ast.Starred) for a in call.args):
            return {}
        params = [p.arg for p in (*callee.args.posonlyargs, *callee.args.args)][bound:]
        args = {name: frame.resolve(arg) for name, arg in zip(params, call.args, strict=False)}
        return self._returns(callee, _Frame(callee, args), cls, depth + 1)

    def _callee(
        self, func: ast.expr, frame: _Frame, cls: ast.ClassDef | None
    ) -> tuple[Function | None, int]:
        """The function a call runs, if the module defines it, and how many parameters bind."""
        if isinstance(func, ast.Name):
            function = frame.function
            if isinstance(function, FUNCTIONS):
                for stmt in statements(function.body):
                    if isinstance(stmt, FUNCTIONS) and stmt.name == func.id:
                        return stmt, 0
            return self.functions.get(func.id), 0
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and cls is not None
            and func.value.id in {"self", "cls", cls.name}
        ):
            for stmt in cls.body:
                if isinstance(stmt, FUNCTIONS) and stmt.name == func.attr:
                    static = any(last_name(d) == "staticmethod" for d in stmt.decorator_list)
                    return stmt, 0 if static or func.value.id == cls.name else 1
        return None, 0

    def _returns(
        self, function: Function, frame: _Frame, cls: ast.ClassDef | None, depth: int
    ) -> Known:
        """What a truthy return of ``function`` tells: the intersection over its returns."""
        result: Known | None = None
        stack: list[tuple[list[ast.stmt], Known]] = [(function.body, {})]
        while stack:
            body, around = stack.pop()
            for stmt in body:
                if isinstance(stmt, ast.Return):
                    if _never_true(stmt.value):
                        continue
                    assert stmt.value is not None
                    here = _both(around, self._value(stmt.value, frame, cls, depth))
                    result = here if result is None else _either(result, here)
                elif isinstance(stmt, ast.If):
                    stack.append(
                        (stmt.body, _both(around, self._truthy(stmt.test, frame, cls, depth)))
                    )
                    stack.append((stmt.orelse, around))
                elif not isinstance(stmt, (*FUNCTIONS, ast.ClassDef)):
                    stack.extend((block, around) for block in blocks(stmt))
        return result or {}

    def _value(self, expr: ast.expr, frame: _Frame, cls: ast.ClassDef | None, depth: int) -> Known:
        """What a truthy returned value tells; ``x if test else None`` tells the test too."""
        if depth > _MAX_DEPTH:
            return {}
        depth += 1
        if isinstance(expr, ast.IfExp):
            if _never_true(expr.orelse):
                return _both(
                    self._truthy(expr.test, frame, cls, depth),
                    self._value(expr.body, frame, cls, depth),
                )
            if _never_true(expr.body):
                return self._value(expr.orelse, frame, cls, depth)
            return _either(
                self._value(expr.body, frame, cls, depth),
                self._value(expr.orelse, frame, cls, depth),
            )
        return self._truthy(expr, frame, cls, depth)

    # -- classes --------------------------------------------------------------

    def _self_assignments(self, cls: ast.ClassDef) -> dict[str, list[_Assignment]]:
        """``self.<attr>`` -> each assignment in the class, with its method.

        The value is None where the assignment is not a plain ``self.<attr> = value``: a
        tuple target, ``+=``, a bare annotation, a class attribute.
        """
        found = self._assigned.get(id(cls))
        if found is not None:
            return found
        found = {}
        for method in cls.body:
            if not isinstance(method, FUNCTIONS):
                continue
            for stmt in statements(method.body):
                targets: list[ast.expr] = []
                value: ast.expr | None = None
                if isinstance(stmt, ast.Assign):
                    targets, value = stmt.targets, stmt.value
                elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
                    targets = [stmt.target]
                    value = stmt.value if isinstance(stmt, ast.AnnAssign) else None
                for target in targets:
                    for node in ast.walk(target):
                        if isinstance(node, ast.Attribute) and is_self(node.value):
                            plain = value if node is target else None
                            found.setdefault(node.attr, []).append((plain, method))
        for name in assigned_names(cls.body):  # a class attribute is an assignment too
            found.setdefault(name, []).append((None, None))
        self._assigned[id(cls)] = found
        return found

    def _flag(self, cls: ast.ClassDef, attr: str) -> Known:
        """What ``self.<attr>`` being true tells, in any method of the class.

        Computed once per flag with a fresh depth budget, so the answer does not depend on
        which test asked first; a flag that depends on itself tells nothing.
        """
        cache = (id(cls), attr)
        if cache in self._flags:
            return self._flags[cache]
        self._flags[cache] = {}
        result: Known | None = None
        for value, method in self._self_assignments(cls).get(attr, []):
            if value is None:
                result = {}
                break
            here = self._value(value, self._frame(method), cls, 1)
            here = self._on_self(here, cls, method)
            result = here if result is None else _either(result, here)
        self._flags[cache] = result or {}
        return self._flags[cache]

    def _on_self(self, known: Known, cls: ast.ClassDef, method: Function | None) -> Known:
        """What a flag assigned in ``method`` tells any method: only ``self``-rooted keys.

        A key rooted at one of ``method``'s parameters or locals means another object in
        another method, so it is carried over only through a ``self.<attr>`` that
        ``method`` stores it in (``self.token_to_kv_pool = model_runner.token_to_kv_pool``),
        and only if no other assignment of that attribute stores anything else.
        """
        carried: Known = {}
        for key, codes in known.items():
            if key_rooted_at_self(key):
                carried[key] = carried.get(key, frozenset()) | codes
        for attr, (value_key, where) in self._class_aliases(cls).items():
            if where is method and value_key in known:
                load = ast.Attribute(
                    value=ast.Name(id="self", ctx=ast.Load()), attr=attr, ctx=ast.Load()
                )
                carried = _both(carried, {expr_key(load): known[value_key]})
        return carried

    def _class_aliases(self, cls: ast.ClassDef) -> dict[str, tuple[str, Function]]:
        """``self.<attr>`` -> the pool expression its one assignment stores, and where."""
        aliases = {}
        for attr, entries in self._self_assignments(cls).items():
            if len(entries) != 1:
                continue
            value, method = entries[0]
            if (
                method is not None
                and isinstance(value, (ast.Name, ast.Attribute))
                and _root(value) is not None
            ):
                aliases[attr] = (expr_key(self._frame(method).resolve(value)), method)
        return aliases
