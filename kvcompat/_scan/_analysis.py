"""Find native pool accesses that no single-KV guard protects, in one parsed module.

Two passes over the tree, both iterative (no recursion, so generated code with
deeply nested expressions cannot exhaust the interpreter's stack):

1. :class:`_Binder` records, per scope, where each local name is bound and
   whether the bound value is a kvcompat adapter (``kvcompat.adapt(...)``), the
   result of a detector (``kvcompat.is_single_kv_pool(...)``) or anything else;
   per class, what ``self.<attr>`` is assigned from.
2. :class:`_Walker` visits every expression with a context that says whether a
   detector guard or a ``try`` protects it, and turns each unprotected access
   into a :class:`Hit` (a finding plus the text edits that fix it, if any).

The rules are documented for users in ``docs/scan.md``.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
from collections.abc import Iterable, Iterator, Sequence

from kvcompat._scan._buffers import Role, UseKind, buffer_role, uses
from kvcompat._scan._families import class_rules, module_rules
from kvcompat._scan._probes import MHA_ONLY_ATTRIBUTES, ProbeIndex
from kvcompat._scan._rules import ATTRIBUTE_RULES, CALL_RULES, Finding, make_message
from kvcompat._scan._source import SourceText, Suppressions, parse_expression
from kvcompat._scan._syntax import (
    FUNCTIONS,
    assigned_names,
    expr_key,
    is_self,
    last_name,
    operands,
    parameters,
    prefixes,
    top_level_defs,
)

__all__ = ["FIX_ADAPTER", "FIX_HELPERS", "LEGACY_FIX_ADAPTER", "Edit", "Hit", "analyze"]

# kvcompat's detectors that tell a single-KV (or key-only) pool apart from the
# others; is_composite_pool and is_supported_pool do not, so they are no guard.
_DETECTORS = frozenset(
    {"is_single_kv_pool", "is_key_only_pool", "pool_kind", "is_split_kv_pool", "is_latent_pool"}
)
# Detectors whose truth value says "this pool is single-KV / key-only", so the
# branch where they are true is known to be the breaking one.
_POLAR_DETECTORS = frozenset({"is_single_kv_pool", "is_key_only_pool"})
_ADAPTERS = frozenset({"adapt", "compat"})
_POOL_WORDS = ("pool", "kv_cache", "kvcache", "token_to_kv")
_POOL_CLASS_WORDS = ("pool", "kvcache")
# Host (CPU offload) pools hold their own k_buffer/kv_buffer tensors, whatever the
# device pool's layout; a receiver or class whose name says "host" is one.
_HOST_WORD = "host"
# Built-in checks that ask what an object is: ``hasattr(pool, "v_buffer")``,
# ``isinstance(pool, MHATokenToKVPool)``, ``type(pool) is X``. A test that applies
# one to an access's receiver (or to a prefix of it) guards that access.
_RECEIVER_CHECKS = frozenset({"hasattr", "isinstance", "type"})
# Tensor methods that pick token rows (like a subscript does).
_ROW_METHODS = frozenset(
    {"index_select", "index_copy_", "index_put_", "index_fill_", "index_add_", "gather"}
)
# Calls that keep a buffer's layout (``get_key_buffer(i).to(q.dtype)``).
_SAME_LAYOUT = frozenset({"to", "contiguous", "float", "half", "bfloat16"})
# A function whose name names a pool family (``attach_mha``, ``_set_mla_kv_buffer``)
# states which pools it is written for, as a hasattr/isinstance check would.
_FAMILY_WORDS = frozenset({"mha", "mla", "dsa"})
# What a row read only for its size or address is used for (``buf[0].nbytes``).
_BYTE_ATTRS = frozenset({"nbytes", "data_ptr", "element_size", "itemsize", "dtype", "device"})

# What a surrounding ``try`` must catch to protect each code. kv_buffer (KVC005)
# has none: on DeepSeek-V4 single-KV pools it exists and silently has another shape.
_NOT_IMPLEMENTED = "NotImplementedError"
_ATTRIBUTE = "AttributeError"
_CATCHES: dict[str, frozenset[str]] = {
    _NOT_IMPLEMENTED: frozenset(
        {"NotImplementedError", "RuntimeError", "Exception", "BaseException"}
    ),
    _ATTRIBUTE: frozenset({"AttributeError", "Exception", "BaseException"}),
}
_NEEDS_CATCH: dict[str, str] = {
    "KVC001": _NOT_IMPLEMENTED,
    "KVC002": _NOT_IMPLEMENTED,
    "KVC003": _NOT_IMPLEMENTED,
    "KVC004": _ATTRIBUTE,
    "KVC007": _NOT_IMPLEMENTED,
}
_EXITS = (ast.Return, ast.Raise, ast.Continue, ast.Break)
_TRY_TYPES: tuple[type[ast.stmt], ...] = tuple(
    t for t in (getattr(ast, "Try", None), getattr(ast, "TryStar", None)) if t is not None
)
# Methods that run without an instance, so without its constructor.
_CLASS_LEVEL = frozenset({"staticmethod", "classmethod"})
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_MAX_SHOWN = 40
# Every name the scanner looks for contains one of these ("kv_buffer" contains
# "v_buffer"). Identifiers are NFKC-normalised, so only ASCII text can skip analysis.
_NEEDLES = (*CALL_RULES, "k_buffer", "v_buffer", "get_key_buffer")

_Position = tuple[int, int]

# The names whose presence tells pool storage layouts apart: a hasattr() about one of
# them asks what the pool is; one about any other method or attribute does not.
_LAYOUT_NAMES = frozenset({*CALL_RULES, *ATTRIBUTE_RULES, "get_key_buffer"})

# SGLang's KV pool classes hold torch tensors and live in ``sglang.srt.mem_cache``.
# A module that imports MLX but neither torch nor that package works on MLX arrays
# and MLX's own pools (``MlxAttentionKVPool``: ``k_buffer``/``v_buffer`` lists of
# ``mx.array``), which none of the rules is about.
_MLX = "mlx"
_TORCH_POOL_MODULES = ("torch", "sglang.srt.mem_cache")

FIX_HELPERS: dict[str, str] = {
    "KVC001": "_kvcompat_get_value_buffer",
    "KVC002": "_kvcompat_get_kv_buffer",
    "KVC003": "_kvcompat_set_kv_buffer",
}
"""Code -> the module-level helper ``--fix`` routes the call through."""
FIX_ADAPTER = "_kvcompat_compat_pool"
"""The helper that keeps one ``kvcompat.compat`` proxy per pool object."""
LEGACY_FIX_ADAPTER = "_kvcompat_adapter"
"""The helper an older ``--fix`` wrote: one raw ``kvcompat.adapt`` adapter per pool."""


def _opening(text: str, name: str) -> int | None:
    """The length of ``.name(`` at the start of ``text`` (whitespace allowed), or None."""
    paren = text.find("(")
    if paren < 0 or "".join(text[:paren].split()) != f".{name}":
        return None
    return paren + 1


class _Kind(enum.Enum):
    """What a name (or ``self`` attribute) holds, as far as the scanner can tell."""

    ADAPTED = "adapted"  # kvcompat.adapt(...): the key-first adapter, raw storage buffers
    COMPAT = "compat"  # kvcompat.compat(...): the pool's own API, logical views
    DETECTED = "detected"
    OTHER = "other"


@dataclasses.dataclass(frozen=True)
class Edit:
    """Replace ``text[start:end]`` with ``text`` (an insertion when start == end)."""

    start: int
    end: int
    text: str


@dataclasses.dataclass(frozen=True)
class Hit:
    """A finding with the span of its node and the edits that fix it (empty if none)."""

    finding: Finding
    span: tuple[int, int]
    edits: tuple[Edit, ...]


@dataclasses.dataclass
class _Scope:
    parent: _Scope | None
    is_class: bool
    bindings: dict[str, list[tuple[_Position, _Kind]]] = dataclasses.field(default_factory=dict)

    def bind(self, name: str, position: _Position, kind: _Kind) -> None:
        self.bindings.setdefault(name, []).append((position, kind))


@dataclasses.dataclass
class _Class:
    name: str
    methods: frozenset[str]  # defined in the class body (methods and properties)
    bases: tuple[str, ...] = ()  # the base classes' names as written (``KVCache``)
    assigned: set[str] = dataclasses.field(default_factory=set)  # self.<x> = / class attrs
    kinds: dict[str, set[_Kind]] = dataclasses.field(default_factory=dict)

    defs: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = dataclasses.field(
        default_factory=dict
    )
    # self.<attr> -> for each assignment in the class, whether a hasattr/isinstance/
    # type check had asked about the assigned value (``assert isinstance(p, C)``, then
    # ``self.pool = p``). Filled by the walker.
    narrowed: dict[str, list[bool]] = dataclasses.field(default_factory=dict)

    def is_narrowed(self, attr: str) -> bool:
        """Every assignment of ``self.<attr>`` in the class stores a checked value."""
        assignments = self.narrowed.get(attr, [])
        return bool(assignments) and all(assignments)

    @property
    def is_pool(self) -> bool:
        """A KV pool class: its name or a base's name says so (``…Pool``, ``KVCache``)."""
        names = (self.name, *self.bases)
        return any(word in name.lower() for name in names for word in _POOL_CLASS_WORDS)

    def kind_of(self, attr: str) -> _Kind:
        kinds = self.kinds.get(attr, set())
        if _Kind.DETECTED in kinds:
            return _Kind.DETECTED
        if kinds and kinds <= {_Kind.ADAPTED, _Kind.COMPAT}:
            return _Kind.ADAPTED if _Kind.ADAPTED in kinds else _Kind.COMPAT
        return _Kind.OTHER


@dataclasses.dataclass
class _Names:
    """How the module spells kvcompat (``import kvcompat as kc``, ``from kvcompat import …``)."""

    modules: set[str] = dataclasses.field(default_factory=lambda: {"kvcompat"})
    # local name -> "adapt" (raw storage buffers) or "compat" (logical views)
    adapters: dict[str, str] = dataclasses.field(
        default_factory=lambda: {
            **{name: name for name in _ADAPTERS},
            FIX_ADAPTER: "compat",
            LEGACY_FIX_ADAPTER: "adapt",
        }
    )
    detectors: dict[str, str] = dataclasses.field(
        default_factory=lambda: {name: name for name in _DETECTORS}
    )
    imported: set[str] = dataclasses.field(default_factory=set)

    @classmethod
    def collect(cls, tree: ast.Module) -> _Names:
        names = cls()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "kvcompat" or (
                        alias.name.startswith("kvcompat.") and alias.asname is None
                    ):
                        names.modules.add(alias.asname or "kvcompat")
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module != "kvcompat" and not node.module.startswith("kvcompat."):
                    continue
                for alias in node.names:
                    local = alias.asname or alias.name
                    names.imported.add(local)
                    if alias.name in _ADAPTERS:
                        names.adapters[local] = alias.name
                    if alias.name in _DETECTORS:
                        names.detectors[local] = alias.name
        return names

    def detector(self, func: ast.expr) -> str | None:
        """The detector a call's ``func`` names, or None."""
        if isinstance(func, ast.Name):
            return self.detectors.get(func.id)
        if isinstance(func, ast.Attribute) and func.attr in _DETECTORS:
            return func.attr
        return None

    def is_adapt_call(self, expr: ast.expr) -> bool:
        return self.adapter_call(expr) is not None

    def adapter_call(self, expr: ast.expr) -> str | None:
        """``"adapt"`` or ``"compat"`` for a call of kvcompat's adapt/compat, else None."""
        while isinstance(expr, ast.NamedExpr):
            expr = expr.value
        if not isinstance(expr, ast.Call):
            return None
        func = expr.func
        if isinstance(func, ast.Name):
            return self.adapters.get(func.id)
        if (
            isinstance(func, ast.Attribute)
            and func.attr in _ADAPTERS
            and isinstance(func.value, ast.Name)
            and func.value.id in self.modules
        ):
            return func.attr
        return None

    def mentions_kvcompat(self, annotation: ast.expr | None) -> bool:
        """Whether a parameter annotation names a kvcompat type."""
        if annotation is None:
            return False
        for node in ast.walk(annotation):
            if isinstance(node, ast.Name) and (node.id in self.modules or node.id in self.imported):
                return True
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                try:
                    parsed = parse_expression(node.value)
                except SyntaxError:
                    continue
                if self.mentions_kvcompat(parsed):
                    return True
        return False

    def classify(self, value: ast.expr) -> _Kind:
        made_by = self.adapter_call(value)
        if made_by is not None:
            return _Kind.COMPAT if made_by == "compat" else _Kind.ADAPTED
        for node in ast.walk(value):
            if isinstance(node, ast.Call) and (
                self.detector(node.func) is not None or _receiver_check(node) is not None
            ):
                return _Kind.DETECTED
        return _Kind.OTHER


def _end(node: ast.expr | ast.stmt) -> _Position:
    end_lineno = node.end_lineno if node.end_lineno is not None else node.lineno
    end_col = node.end_col_offset if node.end_col_offset is not None else node.col_offset
    return end_lineno, end_col


def _target_names(target: ast.expr) -> Iterator[ast.Name]:
    for node in ast.walk(target):
        if isinstance(node, ast.Name):
            yield node


def _receiver_check(call: ast.Call) -> ast.expr | None:
    """The object ``hasattr(x, ...)``, ``isinstance(x, ...)`` or ``type(x)`` asks about.

    A ``hasattr`` counts only when it asks about the storage (``hasattr(pool,
    "kv_buffer")``) or a name it does not spell out: ``hasattr(pool,
    "get_v_head_dim")`` tells hybrid pools apart, not single-KV ones (DeepSeek-V4
    pools have no ``get_v_head_dim``, so its ``else`` still reaches them).
    """
    func = call.func
    if not (isinstance(func, ast.Name) and func.id in _RECEIVER_CHECKS and call.args):
        return None
    if func.id == "hasattr" and len(call.args) == 2:
        name = call.args[1]
        if isinstance(name, ast.Constant) and name.value not in _LAYOUT_NAMES:
            return None
    return call.args[0]


class _Binder:
    """Pass 1: where names are bound, and to what kind of value."""

    def __init__(self, tree: ast.Module, names: _Names) -> None:
        self.names = names
        self.scopes: dict[ast.AST, _Scope] = {}
        self.classes: dict[ast.ClassDef, _Class] = {}
        root = _Scope(parent=None, is_class=False)
        self.scopes[tree] = root
        stack: list[tuple[ast.AST, _Scope, _Class | None]] = [(tree, root, None)]
        while stack:
            node, scope, cls = stack.pop()
            stack.extend(self._visit(node, scope, cls))
        for scope in self.scopes.values():
            for events in scope.bindings.values():
                events.sort(key=lambda event: event[0])

    def _visit(
        self, node: ast.AST, scope: _Scope, cls: _Class | None
    ) -> Iterator[tuple[ast.AST, _Scope, _Class | None]]:
        if isinstance(node, (*FUNCTIONS, ast.Lambda)):
            yield from self._enter_function(node, scope, cls)
            return
        if isinstance(node, ast.ClassDef):
            yield from self._enter_class(node, scope, cls)
            return
        self._record(node, scope, cls)
        for child in ast.iter_child_nodes(node):
            if isinstance(node, ast.comprehension) and child is node.target:
                continue  # comprehension targets are handled by the walker
            yield child, scope, cls

    def _enter_function(
        self,
        node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda,
        scope: _Scope,
        cls: _Class | None,
    ) -> Iterator[tuple[ast.AST, _Scope, _Class | None]]:
        inner = _Scope(parent=scope, is_class=False)
        self.scopes[node] = inner
        start = (node.lineno, node.col_offset)
        for param in parameters(node.args):
            kind = _Kind.OTHER
            if param.annotation is not None and self.names.mentions_kvcompat(param.annotation):
                compat = "Compat" in ast.unparse(param.annotation)
                kind = _Kind.COMPAT if compat else _Kind.ADAPTED
            inner.bind(param.arg, start, kind)
        outer: list[ast.AST] = [*node.args.defaults]
        outer.extend(default for default in node.args.kw_defaults if default is not None)
        if isinstance(node, ast.Lambda):
            yield node.body, inner, cls
        else:
            scope.bind(node.name, _end(node), _Kind.OTHER)
            outer.extend(node.decorator_list)
            outer.extend(p.annotation for p in parameters(node.args) if p.annotation)
            if node.returns is not None:
                outer.append(node.returns)
            for stmt in node.body:
                yield stmt, inner, cls
        yield from ((child, scope, cls) for child in outer)

    def _enter_class(
        self, node: ast.ClassDef, scope: _Scope, cls: _Class | None
    ) -> Iterator[tuple[ast.AST, _Scope, _Class | None]]:
        scope.bind(node.name, _end(node), _Kind.OTHER)
        methods = frozenset(stmt.name for stmt in node.body if isinstance(stmt, FUNCTIONS))
        bases = tuple(last_name(base) for base in node.bases)
        info = _Class(name=node.name, methods=methods, bases=bases)
        info.defs.update((stmt.name, stmt) for stmt in node.body if isinstance(stmt, FUNCTIONS))
        info.assigned.update(assigned_names(node.body))  # ``k_buffer = None`` belongs to it
        self.classes[node] = info
        inner = _Scope(parent=scope, is_class=True)
        self.scopes[node] = inner
        for child in (*node.decorator_list, *node.bases, *node.keywords):
            yield child, scope, cls
        for stmt in node.body:
            yield stmt, inner, info

    def _record(self, node: ast.AST, scope: _Scope, cls: _Class | None) -> None:
        if isinstance(node, ast.Assign):
            kind = self.names.classify(node.value)
            for target in node.targets:
                self._assign(target, kind, _end(node), scope, cls)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            self._assign(node.target, self.names.classify(node.value), _end(node), scope, cls)
        elif isinstance(node, ast.AugAssign):
            self._assign(node.target, _Kind.OTHER, _end(node), scope, cls)
        elif isinstance(node, ast.NamedExpr):
            scope.bind(node.target.id, _end(node), self.names.classify(node.value))
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            self._assign(node.target, _Kind.OTHER, _end(node.target), scope, cls)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            target = node.optional_vars
            self._assign(target, _Kind.OTHER, _end(target), scope, cls)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and is_self(node.value)
            and cls is not None
        ):
            cls.assigned.add(node.attr)
        else:
            self._record_other(node, scope)

    @staticmethod
    def _record_other(node: ast.AST, scope: _Scope) -> None:
        """Bindings that never hold an adapter: imports, ``except ... as``, match captures."""
        if isinstance(node, ast.ExceptHandler) and node.name:
            scope.bind(node.name, (node.lineno, node.col_offset), _Kind.OTHER)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                local = alias.asname or alias.name.partition(".")[0]
                if local != "*":
                    scope.bind(local, _end(node), _Kind.OTHER)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            scope.bind(node.name, (node.lineno, node.col_offset), _Kind.OTHER)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            scope.bind(node.rest, (node.lineno, node.col_offset), _Kind.OTHER)

    @staticmethod
    def _assign(
        target: ast.expr, kind: _Kind, position: _Position, scope: _Scope, cls: _Class | None
    ) -> None:
        if isinstance(target, ast.Name):
            scope.bind(target.id, position, kind)
        elif isinstance(target, ast.Attribute) and is_self(target.value) and cls is not None:
            cls.kinds.setdefault(target.attr, set()).add(kind)
        else:
            for name in _target_names(target):
                scope.bind(name.id, position, _Kind.OTHER)


def _lookup(name: str, position: _Position, scope: _Scope) -> _Kind:
    """The kind of the binding of ``name`` that a use at ``position`` in ``scope`` sees.

    In the use's own scope, the nearest binding before the use (in source order)
    wins. In an enclosing scope (a closure, or a module global used in a
    function), the kind counts only when every binding there agrees. Class
    scopes are skipped when looking outwards, as Python does.
    """
    current: _Scope | None = scope
    own = True
    while current is not None:
        if current.is_class and not own:
            current = current.parent
            continue
        events = current.bindings.get(name)
        if events:
            if own:
                before = [kind for where, kind in events if where <= position]
                return before[-1] if before else _Kind.OTHER
            kinds = {kind for _, kind in events}
            return kinds.pop() if len(kinds) == 1 else _Kind.OTHER
        own = False
        current = current.parent
    return _Kind.OTHER


@dataclasses.dataclass(frozen=True)
class _Ctx:
    """What protects the code being visited."""

    scope: _Scope
    cls: _Class | None
    guarded: bool = False
    caught: frozenset[str] = frozenset()
    comprehension_names: frozenset[str] = frozenset()
    checked: frozenset[str] = frozenset()  # expr_key()s of receivers hasattr/isinstance tested
    # expr_key()s that a later statement of the block checks and leaves on failure
    # (``self.pool = p`` then ``if not isinstance(self.pool, C): raise``).
    checked_later: frozenset[str] = frozenset()
    # (expr_key(), code) pairs: a test this code runs under named the receiver's class, and
    # that class's access for the code works (_probes: flags computed in __init__ too).
    known: frozenset[tuple[str, str]] = frozenset()
    function: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | None = None


def _single_when(expr: ast.expr, names: _Names) -> bool | None:
    """The truth value of ``expr`` under which the pool is known to be single-KV/key-only.

    ``is_single_kv_pool(p)`` -> True, ``not is_single_kv_pool(p)`` -> False,
    anything else -> None (unknown).
    """
    negated = False
    while isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        negated = not negated
        expr = expr.operand
    if isinstance(expr, ast.Call) and names.detector(expr.func) in _POLAR_DETECTORS:
        return not negated
    return None


def _exits(body: Sequence[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], _EXITS)


def _handler_names(handler: ast.ExceptHandler) -> Iterator[str]:
    if handler.type is None:
        yield "BaseException"
        return
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    for expr in types:
        if isinstance(expr, ast.Name):
            yield expr.id
        elif isinstance(expr, ast.Attribute):
            yield expr.attr


def _catches(exception_names: Iterable[str]) -> frozenset[str]:
    listed = set(exception_names)
    return frozenset(error for error, names in _CATCHES.items() if listed & names)


def _suppress_names(item: ast.withitem) -> list[str]:
    call = item.context_expr
    if not isinstance(call, ast.Call):
        return []
    func = call.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
    if name != "suppress":
        return []
    return [
        arg.id if isinstance(arg, ast.Name) else arg.attr
        for arg in call.args
        if isinstance(arg, (ast.Name, ast.Attribute))
    ]


def _indexed(function: ast.AST, name: str, after: int) -> int | None:
    """The first line at or after ``after`` where ``function`` indexes ``name`` by rows."""
    lines: list[int] = []
    for node in ast.walk(function):
        if not isinstance(node, ast.expr) or node.lineno < after:
            continue
        base: ast.expr | None = None
        if isinstance(node, ast.Subscript):
            base = node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _ROW_METHODS
        ):
            base = node.func.value
        if isinstance(base, ast.Name) and base.id == name:
            lines.append(node.lineno)
    return min(lines) if lines else None


def _shown(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_SHOWN else "…" + text[-(_MAX_SHOWN - 1) :]


def _is_proxy_adapter(expr: ast.expr) -> bool:
    """``pool.kvcompat``: a compat proxy's key-first adapter."""
    return isinstance(expr, ast.Attribute) and expr.attr == "kvcompat"


def _head_dim_index(node: ast.expr) -> bool:
    """Whether ``buf.shape[i]`` / ``buf.size(i)`` asks for a dimension other than the rows."""
    index: ast.expr | None = None
    if isinstance(node, ast.Subscript):
        index = node.slice
    elif isinstance(node, ast.Call) and node.args:
        index = node.args[0]
    if isinstance(index, ast.UnaryOp) and isinstance(index.op, ast.USub):
        return True  # shape[-1], size(-2)
    if isinstance(index, ast.Constant) and isinstance(index.value, int):
        return index.value != 0
    return False


def _legacy_getters(tree: ast.Module) -> dict[str, str]:
    """The getter helpers of an older ``--fix`` (their fallback: ``kvcompat.adapt``), by name.

    Such a module defines ``_kvcompat_adapter`` and builds ``kvcompat.adapt(pool)`` in it.
    """
    defs = {stmt.name: stmt for stmt in tree.body if isinstance(stmt, FUNCTIONS)}
    legacy = defs.get(LEGACY_FIX_ADAPTER)
    if legacy is None or not any(
        isinstance(node, ast.Attribute) and node.attr == "adapt" for node in ast.walk(legacy)
    ):
        return {}
    getters = {FIX_HELPERS["KVC001"]: "get_value_buffer", FIX_HELPERS["KVC002"]: "get_kv_buffer"}
    return {name: method for name, method in getters.items() if name in defs}


class _Walker:
    """Pass 2: visit every node with what protects it; collect unprotected accesses."""

    def __init__(
        self, tree: ast.Module, source: SourceText, path: str, names: _Names, binder: _Binder
    ) -> None:
        self.source = source
        self.path = path
        self.names = names
        self.binder = binder
        self.hits: list[Hit] = []
        self.family_rules = module_rules(tree)
        self.class_family_rules: dict[int, frozenset[str]] = {}
        # hit index -> the class and ``self`` attribute its receiver is reached from;
        # the hit stands only if that attribute is not narrowed (see _Class.narrowed).
        self.through: dict[int, tuple[_Class, str]] = {}
        self.module = tree
        self.parents: dict[ast.AST, ast.AST] = {
            child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)
        }
        self.functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {
            stmt.name: stmt for stmt in tree.body if isinstance(stmt, FUNCTIONS)
        }
        self.probes = ProbeIndex(tree)
        self.legacy_getters = _legacy_getters(tree)
        self.class_nodes = {id(info): node for node, info in binder.classes.items()}
        stack: list[tuple[ast.AST, _Ctx]] = []
        self._push_block(stack, tree.body, _Ctx(scope=binder.scopes[tree], cls=None))
        while stack:
            node, ctx = stack.pop()
            self._check(node, ctx)
            self._push_children(stack, node, ctx)
        self.hits = [
            hit
            for index, hit in enumerate(self.hits)
            if not ((through := self.through.get(index)) and through[0].is_narrowed(through[1]))
        ]

    # -- what protects a node -------------------------------------------------

    def _kind(self, expr: ast.expr, ctx: _Ctx) -> _Kind:
        if isinstance(expr, ast.Name):
            if expr.id in ctx.comprehension_names:
                return _Kind.OTHER
            return _lookup(expr.id, (expr.lineno, expr.col_offset), ctx.scope)
        if isinstance(expr, ast.Attribute) and is_self(expr.value) and ctx.cls is not None:
            return ctx.cls.kind_of(expr.attr)
        return _Kind.OTHER

    def _mentions_detector(self, test: ast.expr, ctx: _Ctx) -> bool:
        for node in ast.walk(test):
            if isinstance(node, ast.Call) and self.names.detector(node.func) is not None:
                return True
            if isinstance(node, (ast.Name, ast.Attribute)) and (
                self._kind(node, ctx) is _Kind.DETECTED
            ):
                return True
        return False

    def _branches(self, test: ast.expr, ctx: _Ctx) -> tuple[_Ctx, _Ctx]:
        """The contexts of the true and the false branch of a test."""
        if_true, if_false = self._detector_branches(test, ctx)
        cls = self.class_nodes.get(id(ctx.cls)) if ctx.cls is not None else None
        known = self.probes.when_true(test, ctx.function, cls)
        if known:
            pairs = frozenset((key, code) for key, codes in known.items() for code in codes)
            if_true = dataclasses.replace(if_true, known=if_true.known | pairs)
        return if_true, if_false

    def _detector_branches(self, test: ast.expr, ctx: _Ctx) -> tuple[_Ctx, _Ctx]:
        """The contexts of both branches, as receiver checks and detectors set them."""
        checked = frozenset(
            expr_key(subject)
            for node in ast.walk(test)
            if isinstance(node, ast.Call) and (subject := _receiver_check(node)) is not None
        )
        if checked:  # the code asks what the receiver is: both branches know
            ctx = dataclasses.replace(ctx, checked=ctx.checked | checked)
        if not self._mentions_detector(test, ctx):
            return ctx, ctx
        single_if_true = any(_single_when(o, self.names) is True for o in operands(test, ast.And))
        single_if_false = any(_single_when(o, self.names) is False for o in operands(test, ast.Or))
        return (
            dataclasses.replace(ctx, guarded=not single_if_true),
            dataclasses.replace(ctx, guarded=not single_if_false),
        )

    def _after(self, stmt: ast.stmt, ctx: _Ctx) -> _Ctx:
        """The context of the statements that follow ``stmt`` in its block."""
        if isinstance(stmt, ast.If) and _exits(stmt.body):
            return self._branches(stmt.test, ctx)[1]
        if isinstance(stmt, ast.Assert):
            return self._branches(stmt.test, ctx)[0]
        return ctx

    def _protected(  # noqa: PLR0911 -- one return per kind of protection
        self, code: str, receiver: ast.expr, ctx: _Ctx, *, adapted_ok: bool = True
    ) -> bool:
        if ctx.guarded or _NEEDS_CATCH.get(code) in ctx.caught:
            return True
        if code in self.family_rules or code in self._class_rules(ctx):
            return True
        if ctx.checked and any(expr_key(prefix) in ctx.checked for prefix in prefixes(receiver)):
            return True
        if ctx.known and any(
            (expr_key(prefix), code) in ctx.known for prefix in prefixes(receiver)
        ):
            return True
        if self._own(receiver, ctx) or _HOST_WORD in self.source.segment(receiver).lower():
            return True
        function = ctx.function
        if isinstance(function, FUNCTIONS) and _FAMILY_WORDS & set(function.name.split("_")):
            return True
        if not adapted_ok:
            return False
        if self.names.is_adapt_call(receiver) or _is_proxy_adapter(receiver):
            return True
        return self._kind(receiver, ctx) in (_Kind.ADAPTED, _Kind.COMPAT)

    def _class_rules(self, ctx: _Ctx) -> frozenset[str]:
        """The rules that cannot fire here: code of an object whose constructor ran.

        Only a method called on an instance qualifies: the class body, a
        ``staticmethod`` and a ``classmethod`` run without ``__init__``.
        """
        cls = ctx.cls
        if cls is None:
            return frozenset()
        class_node = self.class_nodes[id(cls)]
        method: ast.AST | None = ctx.function
        while method is not None and self.parents.get(method) is not class_node:
            method = self.parents.get(method)
        if not isinstance(method, FUNCTIONS):
            return frozenset()
        if any(last_name(d) in _CLASS_LEVEL for d in method.decorator_list):
            return frozenset()
        rules = self.class_family_rules.get(id(cls))
        if rules is None:
            rules = self.class_family_rules[id(cls)] = class_rules(class_node)
        return rules

    @staticmethod
    def _own(receiver: ast.expr, ctx: _Ctx) -> bool:
        """Code in a pool class: its implementation, on its storage, sub-pools or device pool.

        A pool knows the classes of the pools it is built from (a host pool is
        made for one device-pool class, a composite for its sub-pools), so its
        accesses are not the generic code the scanner looks for.
        """
        del receiver
        return ctx.cls is not None and ctx.cls.is_pool

    # -- traversal ------------------------------------------------------------

    def _push_block(
        self, stack: list[tuple[ast.AST, _Ctx]], body: Sequence[ast.stmt], ctx: _Ctx
    ) -> None:
        later = self._validated_later(body)
        for stmt, validated in zip(body, later, strict=True):
            here = ctx
            if validated:
                here = dataclasses.replace(ctx, checked_later=ctx.checked_later | validated)
            stack.append((stmt, here))
            ctx = self._after(stmt, ctx)

    @staticmethod
    def _validated_later(body: Sequence[ast.stmt]) -> list[frozenset[str]]:
        """Per statement, the receivers that an exiting check after it in the block tests.

        ``if not isinstance(x, C): raise ...`` and ``assert isinstance(x, C)`` stop the
        code when ``x`` is something else, so a value stored in ``x`` before them is
        a checked one once the block has run.
        """
        later: list[frozenset[str]] = []
        seen: frozenset[str] = frozenset()
        for stmt in reversed(body):
            later.append(seen)
            if isinstance(stmt, (ast.If, ast.Assert)) and (
                isinstance(stmt, ast.Assert) or _exits(stmt.body)
            ):
                seen = seen | {
                    expr_key(subject)
                    for node in ast.walk(stmt.test)
                    if isinstance(node, ast.Call) and (subject := _receiver_check(node)) is not None
                }
        later.reverse()
        return later

    def _fresh(self, node: ast.AST, cls: _Class | None) -> _Ctx:
        """A new scope: guards and ``try`` blocks outside it do not protect its body."""
        function = node if isinstance(node, (*FUNCTIONS, ast.Lambda)) else None
        return _Ctx(scope=self.binder.scopes[node], cls=cls, function=function)

    def _push_children(  # noqa: PLR0912 -- one branch per construct that changes protection
        self, stack: list[tuple[ast.AST, _Ctx]], node: ast.AST, ctx: _Ctx
    ) -> None:
        if isinstance(node, FUNCTIONS):
            self._push_block(stack, node.body, self._fresh(node, ctx.cls))
            outer = [*node.decorator_list, node.args]
            if node.returns is not None:
                outer.append(node.returns)
            stack.extend((child, ctx) for child in outer)
        elif isinstance(node, ast.Lambda):
            stack.append((node.body, self._fresh(node, ctx.cls)))
            stack.append((node.args, ctx))
        elif isinstance(node, ast.ClassDef):
            inner = self._fresh(node, self.binder.classes[node])
            self._push_block(stack, node.body, inner)
            outer = [*node.decorator_list, *node.bases, *node.keywords]
            stack.extend((child, ctx) for child in outer)
        elif isinstance(node, (ast.If, ast.IfExp)):
            if_true, if_false = self._branches(node.test, ctx)
            if isinstance(node, ast.If):
                self._push_block(stack, node.body, if_true)
                self._push_block(stack, node.orelse, if_false)
            else:
                stack.extend(((node.body, if_true), (node.orelse, if_false)))
            stack.append((node.test, ctx))
        elif isinstance(node, ast.BoolOp):
            self._push_bool_op(stack, node, ctx)
        elif isinstance(node, _TRY_TYPES):
            self._push_try(stack, node, ctx)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            names = [name for item in node.items for name in _suppress_names(item)]
            inner = dataclasses.replace(ctx, caught=ctx.caught | _catches(names))
            self._push_block(stack, node.body, inner)
            stack.extend((item, ctx) for item in node.items)
        elif isinstance(node, ast.Match):
            if self._mentions_detector(node.subject, ctx):
                inner = dataclasses.replace(ctx, guarded=True)
            else:
                inner = ctx
            stack.extend((case, inner) for case in node.cases)
            stack.append((node.subject, ctx))
        elif isinstance(node, _COMPREHENSIONS):
            self._push_comprehension(stack, node, ctx)
        else:
            self._push_fields(stack, node, ctx)

    def _push_fields(self, stack: list[tuple[ast.AST, _Ctx]], node: ast.AST, ctx: _Ctx) -> None:
        for _, value in ast.iter_fields(node):
            if isinstance(value, list):
                if value and isinstance(value[0], ast.stmt):
                    self._push_block(stack, value, ctx)
                else:
                    stack.extend((item, ctx) for item in value if isinstance(item, ast.AST))
            elif isinstance(value, ast.AST):
                stack.append((value, ctx))

    def _push_bool_op(self, stack: list[tuple[ast.AST, _Ctx]], node: ast.BoolOp, ctx: _Ctx) -> None:
        # An operand runs only when the ones before it were all true (and) or all
        # false (or): the same rule as an if whose test is those operands.
        current = ctx
        for index, value in enumerate(node.values):
            stack.append((value, current))
            previous = ast.BoolOp(op=node.op, values=node.values[: index + 1])
            if_true, if_false = self._branches(previous, ctx)
            current = if_true if isinstance(node.op, ast.And) else if_false

    def _push_try(self, stack: list[tuple[ast.AST, _Ctx]], node: ast.AST, ctx: _Ctx) -> None:
        handlers: list[ast.ExceptHandler] = getattr(node, "handlers", [])
        names = [name for handler in handlers for name in _handler_names(handler)]
        inner = dataclasses.replace(ctx, caught=ctx.caught | _catches(names))
        self._push_block(stack, getattr(node, "body", []), inner)
        stack.extend((handler, ctx) for handler in handlers)
        self._push_block(stack, getattr(node, "orelse", []), ctx)
        self._push_block(stack, getattr(node, "finalbody", []), ctx)

    def _push_comprehension(
        self,
        stack: list[tuple[ast.AST, _Ctx]],
        node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp,
        ctx: _Ctx,
    ) -> None:
        bound = frozenset(
            name.id for generator in node.generators for name in _target_names(generator.target)
        )
        inner = dataclasses.replace(ctx, comprehension_names=ctx.comprehension_names | bound)
        first, *rest = node.generators
        stack.append((first.iter, ctx))
        stack.extend((condition, inner) for condition in first.ifs)
        for generator in rest:
            stack.extend((child, inner) for child in (generator.iter, *generator.ifs))
        if isinstance(node, ast.DictComp):
            stack.extend(((node.key, inner), (node.value, inner)))
        else:
            stack.append((node.elt, inner))

    # -- findings -------------------------------------------------------------

    def _record_narrowing(self, node: ast.AST, ctx: _Ctx) -> None:
        """Note, per ``self.<attr> = value``, whether a check asked about ``value`` first."""
        cls = ctx.cls
        if cls is None:
            return
        value: ast.expr | None = None
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            value, targets = node.value, node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            value, targets = node.value, [node.target]
        elif isinstance(node, (ast.AugAssign, ast.For, ast.AsyncFor)):
            targets = [node.target]
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            targets = [node.optional_vars]
        checked = value is not None and expr_key(value) in ctx.checked
        for target in targets:
            if isinstance(target, ast.Attribute) and is_self(target.value):
                load = ast.Attribute(value=target.value, attr=target.attr, ctx=ast.Load())
                validated = checked or expr_key(load) in ctx.checked_later
                cls.narrowed.setdefault(target.attr, []).append(validated)
                continue
            for inner in ast.walk(target):  # self.a, self.b = ...: not one checked value
                if isinstance(inner, ast.Attribute) and is_self(inner.value):
                    cls.narrowed.setdefault(inner.attr, []).append(False)

    @staticmethod
    def _self_attribute(receiver: ast.expr, ctx: _Ctx) -> tuple[_Class, str] | None:
        """The class and attribute of the ``self.<attr>`` a receiver is reached from."""
        if ctx.cls is None:
            return None
        for prefix in prefixes(receiver):
            if isinstance(prefix, ast.Attribute) and is_self(prefix.value):
                return ctx.cls, prefix.attr
        return None

    def _check(self, node: ast.AST, ctx: _Ctx) -> None:
        self._record_narrowing(node, ctx)
        if isinstance(node, ast.Call):
            self._check_raw_buffer(node, ctx)
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in CALL_RULES:
                self._check_call(node, func, ctx)
            elif isinstance(func, ast.Attribute) and func.attr == "get_key_buffer":
                self._check_key_rows(node, func, ctx)
            elif isinstance(func, ast.Name) and func.id == "getattr":
                self._check_getattr(node, ctx)
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in ATTRIBUTE_RULES
            and isinstance(node.ctx, ast.Load)
        ):
            self._check_attribute(node, node.value, node.attr, node, ctx)

    def _name_position(self, node: ast.Attribute) -> tuple[int, int]:
        """1-based line and column of the attribute name in ``<expr>.<name>``."""
        end_lineno, end_col = _end(node)
        return end_lineno, self.source.char_col(end_lineno, end_col - len(node.attr)) + 1

    def _check_call(self, node: ast.Call, func: ast.Attribute, ctx: _Ctx) -> None:
        receiver = func.value
        if (
            isinstance(receiver, ast.Call)
            and isinstance(receiver.func, ast.Name)
            and receiver.func.id == "super"
        ):
            return  # a pool subclass calling its base class's implementation
        if is_self(receiver) and ctx.cls is not None and func.attr in ctx.cls.methods:
            return  # a pool calling its own implementation of the method
        function = ctx.function
        if isinstance(function, FUNCTIONS) and function.name == func.attr:
            return  # a method of that name delegating to another pool (composites)
        code = CALL_RULES[func.attr]
        if code == "KVC007" and (node.args or node.keywords):
            return  # SGLang's get_kv_buffer_shape() takes no arguments: another API
        if self._protected(code, receiver, ctx):
            return
        recv = _shown(self.source.segment(receiver))
        edits, reason = self._call_fix(node, func, code)
        note = f"; not auto-fixable: {reason}" if reason else ""
        line, col = self._name_position(func)
        message = make_message(code, f"{recv}.{func.attr}()", recv, note)
        self._add(node, line, col, code, message, edits, self._self_attribute(receiver, ctx))

    def _raw(self, receiver: ast.expr, ctx: _Ctx) -> bool:
        """Whether ``receiver`` is kvcompat's key-first adapter (its buffers are raw storage).

        ``kvcompat.adapt(pool)``, a name or ``self`` attribute bound to one, a parameter
        annotated with a kvcompat protocol, and a compat proxy's ``.kvcompat``; not
        ``kvcompat.compat(pool)``, whose getters hand out logical views.
        """
        if _is_proxy_adapter(receiver):
            return True
        if self.names.adapter_call(receiver) == "adapt":
            return True
        return self._kind(receiver, ctx) is _Kind.ADAPTED

    def _pool_of(self, adapter: ast.expr) -> str:
        """The source text of the pool a raw adapter wraps (for the suggested replacement)."""
        if isinstance(adapter, ast.Attribute) and _is_proxy_adapter(adapter):
            return _shown(self.source.segment(adapter.value))
        call = adapter
        while isinstance(call, ast.NamedExpr):
            call = call.value
        if self.names.adapter_call(call) == "adapt" and isinstance(call, ast.Call) and call.args:
            return _shown(self.source.segment(call.args[0]))
        return f"{_shown(self.source.segment(adapter))}.native"

    def _check_raw_buffer(self, node: ast.Call, ctx: _Ctx) -> None:
        """``KVC008`` / ``KVC009``: a raw adapter buffer probed for a head dim or read by token."""
        func = node.func
        note = ""
        if isinstance(func, ast.Attribute):
            role = buffer_role(func.attr)
            if role is None or not self._raw(func.value, ctx):
                return
            receiver: ast.expr = func.value
            getter = f"{_shown(self.source.segment(receiver))}.{func.attr}()"
            recv = self._pool_of(receiver)
        elif isinstance(func, ast.Name) and func.id in self.legacy_getters and node.args:
            role = buffer_role(self.legacy_getters[func.id])
            if role is None:  # pragma: no cover - legacy_getters holds getters only
                return
            receiver = node.args[0]
            recv = _shown(self.source.segment(receiver))
            getter = f"{func.id}({recv}, …)"
            note = (
                f"; this module's {LEGACY_FIX_ADAPTER}() comes from an older `kvcompat scan "
                "--fix` and answers with kvcompat.adapt(pool): make it return "
                "kvcompat.compat(pool), and its set_kv_buffer fallback call "
                ".set_kv_buffer(layer, loc, cache_k, cache_v) on that"
            )
        else:
            return
        if self._protected("KVC008", receiver, ctx, adapted_ok=False):
            return
        function: ast.AST = ctx.function if ctx.function is not None else self.module
        for use in uses(node, role, self.parents, function):
            if use.kind is UseKind.HEAD_DIM and _head_dim_index(use.node):
                code = "KVC008"
            elif use.kind in (UseKind.ROWS, UseKind.STORE):
                code = "KVC006" if role is Role.KEY else "KVC009"
            else:
                continue
            part = "" if use.role is Role.PAIR else f"the {use.role.value} buffer of "
            what = f"{_shown(self.source.segment(use.node))} ({part}{getter}, line {node.lineno})"
            message = make_message(code, what, recv, note)
            line = use.node.lineno
            col = self.source.char_col(line, use.node.col_offset) + 1
            self._add(use.node, line, col, code, message, (), self._self_attribute(receiver, ctx))

    def _check_getattr(self, node: ast.Call, ctx: _Ctx) -> None:
        if len(node.args) != 2 or node.keywords:
            return  # getattr(pool, "k_buffer", default) is a probe, like hasattr
        receiver, name = node.args
        if isinstance(name, ast.Constant) and name.value in ATTRIBUTE_RULES:
            attr = str(name.value)
            self._check_attribute(node, receiver, attr, None, ctx)

    def _check_attribute(
        self,
        node: ast.expr,
        receiver: ast.expr,
        attr: str,
        attribute: ast.Attribute | None,
        ctx: _Ctx,
    ) -> None:
        if not self._pool_like(receiver, attr, ctx):
            return
        code = ATTRIBUTE_RULES[attr]
        if self._protected(code, receiver, ctx):
            return
        if code == "KVC004" and self._read_mha_attribute_before(node, receiver, ctx):
            return
        if code == "KVC005" and not self._token_rows(node):
            return  # per-layer tensors used whole (bytes, pointers, lengths): any layout
        recv = _shown(self.source.segment(receiver))
        if attribute is None:
            what = f'getattr({recv}, "{attr}")'
            line = node.lineno
            col = self.source.char_col(node.lineno, node.col_offset) + 1
        else:
            what = f"{recv}.{attr}"
            line, col = self._name_position(attribute)
        getter = "get_value_buffer" if attr == "v_buffer" else "get_key_buffer"
        use = f"kvcompat.adapt({recv}).{getter}(layer_id) or .read(layer_id, loc)"
        message = make_message(code, what, recv, use=use)
        self._add(node, line, col, code, message, (), self._self_attribute(receiver, ctx))

    def _read_mha_attribute_before(self, node: ast.expr, receiver: ast.expr, ctx: _Ctx) -> bool:
        """Whether the function read an MHA-only attribute of ``receiver`` before ``node``.

        Only statements at the top of the function body count, and of an ``if`` or
        ``assert`` only the test: those run whenever ``node`` does.
        """
        function = ctx.function
        if not isinstance(function, FUNCTIONS):
            return False
        wanted = expr_key(receiver)
        for stmt in function.body:
            if _end(stmt) >= (node.lineno, node.col_offset):
                return False
            if isinstance(stmt, (ast.If, ast.Assert)):
                always: ast.AST = stmt.test
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.Expr)):
                always = stmt
            else:
                continue
            for inner in ast.walk(always):
                if (
                    isinstance(inner, ast.Attribute)
                    and inner.attr in MHA_ONLY_ATTRIBUTES
                    and expr_key(inner.value) == wanted
                ):
                    return True
        return False

    def _pool_like(self, receiver: ast.expr, attr: str, ctx: _Ctx) -> bool:
        if is_self(receiver) and ctx.cls is not None:
            return False  # a class's own (or inherited) attribute: pools own their storage
        text = self.source.segment(receiver).lower()
        return any(word in text for word in _POOL_WORDS)

    def _token_rows(self, node: ast.expr) -> bool:
        """Whether a per-layer buffer list is indexed down to token rows.

        ``pool.kv_buffer[layer][loc]``, ``pool.kv_buffer[layer].index_select(0, loc)``
        and ``pool.kv_buffer[:, loc]`` are; ``pool.kv_buffer[layer].data_ptr()``,
        ``len(pool.kv_buffer)`` and ``for buf in pool.kv_buffer`` are not.
        """
        layer = self.parents.get(node)
        if not (isinstance(layer, ast.Subscript) and layer.value is node):
            return False
        if isinstance(layer.slice, ast.Tuple):
            return True
        return self._rows_of(layer) is not None

    def _rows_of(self, buffer: ast.expr) -> ast.expr | None:
        """The subscript or ``index_select``-like call that picks rows of ``buffer``, if any."""
        while True:  # look through layout-preserving calls: buffer.to(q.dtype)[loc]
            outer = self.parents.get(buffer)
            call = self.parents.get(outer) if outer is not None else None
            if (
                isinstance(outer, ast.Attribute)
                and outer.attr in _SAME_LAYOUT
                and isinstance(call, ast.Call)
                and call.func is outer
            ):
                buffer = call
                continue
            break
        if isinstance(outer, ast.Subscript) and outer.value is buffer:
            used = self.parents.get(outer)
            if isinstance(used, ast.Attribute) and used.attr in _BYTE_ATTRS:
                return None  # buf[0].nbytes: the size of one row, whatever the layout
            return outer
        if isinstance(outer, ast.Attribute) and outer.attr in _ROW_METHODS:
            return outer
        return None

    def _check_key_rows(self, node: ast.Call, func: ast.Attribute, ctx: _Ctx) -> None:
        """``KVC006``: a ``get_key_buffer(i)`` result indexed as ``[tokens, heads, dim]``."""
        receiver = func.value
        if self._protected("KVC006", receiver, ctx):
            return
        where = self._key_rows(node, ctx)
        if where is None:
            return
        recv = _shown(self.source.segment(receiver))
        line, col = self._name_position(func)
        what = f"{recv}.get_key_buffer() indexed by token (line {where})"
        use = f"kvcompat.adapt({recv}).read(layer_id, loc) / .write(layer_id, loc, key)"
        message = make_message("KVC006", what, recv, use=use)
        self._add(node, line, col, "KVC006", message, (), self._self_attribute(receiver, ctx))

    def _key_rows(self, node: ast.Call, ctx: _Ctx) -> int | None:
        """The line where the buffer ``node`` returns is indexed by token, if it is."""
        rows = self._rows_of(node)
        if rows is not None:
            return rows.lineno
        value: ast.expr = node
        while True:  # the expression the buffer ends up as: node, or node.to(...)
            outer = self.parents.get(value)
            call = self.parents.get(outer) if outer is not None else None
            if (
                isinstance(outer, ast.Attribute)
                and outer.attr in _SAME_LAYOUT
                and isinstance(call, ast.Call)
                and call.func is outer
            ):
                value = call
                continue
            break
        parent = self.parents.get(value)
        function: ast.AST = ctx.function if ctx.function is not None else self.module
        if (
            isinstance(parent, ast.Assign)
            and len(parent.targets) == 1
            and isinstance(parent.targets[0], ast.Name)
        ):
            name = parent.targets[0].id
            found = _indexed(function, name, parent.lineno)
            if found is not None:
                return found
            return self._passed_on(function, name, parent.lineno, ctx)
        if isinstance(parent, ast.Call) and value in parent.args:
            return self._param_indexed(parent, parent.args.index(value), None, ctx)
        if isinstance(parent, ast.keyword) and parent.arg is not None:
            call = self.parents.get(parent)
            if isinstance(call, ast.Call):
                return self._param_indexed(call, None, parent.arg, ctx)
        return None

    def _passed_on(self, function: ast.AST, name: str, after: int, ctx: _Ctx) -> int | None:
        """A call in ``function`` that hands the name to a function that indexes it."""
        for call in ast.walk(function):
            if not isinstance(call, ast.Call) or call.lineno < after:
                continue
            for index, arg in enumerate(call.args):
                if isinstance(arg, ast.Name) and arg.id == name:
                    found = self._param_indexed(call, index, None, ctx)
                    if found is not None:
                        return found
            for keyword in call.keywords:
                value = keyword.value
                if keyword.arg and isinstance(value, ast.Name) and value.id == name:
                    found = self._param_indexed(call, None, keyword.arg, ctx)
                    if found is not None:
                        return found
        return None

    def _param_indexed(
        self, call: ast.Call, index: int | None, keyword: str | None, ctx: _Ctx
    ) -> int | None:
        """Whether the function ``call`` calls (defined in this module) indexes that argument."""
        func = call.func
        target: ast.FunctionDef | ast.AsyncFunctionDef | None = None
        skip = 0
        if isinstance(func, ast.Attribute) and is_self(func.value) and ctx.cls is not None:
            target, skip = ctx.cls.defs.get(func.attr), 1
        elif isinstance(func, ast.Name):
            target = self.functions.get(func.id)
        if target is None:
            return None
        params = [*target.args.posonlyargs, *target.args.args][skip:]
        names = [param.arg for param in params]
        if index is not None:
            name = names[index] if index < len(names) else None
        else:
            kwonly = [param.arg for param in target.args.kwonlyargs]
            name = keyword if keyword in (*names, *kwonly) else None
        return None if name is None else _indexed(target, name, target.lineno)

    def _call_fix(
        self, node: ast.Call, func: ast.Attribute, code: str
    ) -> tuple[tuple[Edit, ...], str]:
        """The edits that route the call through a ``--fix`` helper, or why there are none.

        ``X.get_value_buffer(i)`` becomes ``_kvcompat_get_value_buffer(X, i)``: a
        helper that ``--fix`` adds to the module, which makes the native call and
        asks kvcompat only where that raises ``NotImplementedError``.
        """
        if code not in FIX_HELPERS:
            return (), "kvcompat has no get_kv_buffer_shape(); read get_key_buffer(i).shape"
        expected = 4 if code == "KVC003" else 1
        if any(isinstance(arg, ast.Starred) for arg in node.args):
            return (), "it passes *args"
        if node.keywords:
            return (), "it passes keyword arguments"
        if len(node.args) != expected:
            return (), f"it passes {len(node.args)} positional arguments, not {expected}"
        source = self.source
        receiver = func.value
        first = node.args[0]
        after = source.end(receiver)
        opening = _opening(source.text[after : source.start(first)], func.attr)
        if opening is None or not (self._located(receiver) and self._located(first)):
            return (), "its source text could not be located exactly"
        edits = (
            Edit(source.start(receiver), source.start(receiver), f"{FIX_HELPERS[code]}("),
            Edit(after, after + opening, ", "),  # comments after the "(" stay
        )
        return edits, ""

    def _located(self, node: ast.expr) -> bool:
        """Whether ``node``'s reported span holds exactly its source (a guard for rewrites)."""
        try:
            reparsed = parse_expression(f"({self.source.segment(node)})")
        except SyntaxError:
            return False
        return ast.dump(reparsed) == ast.dump(node)

    def _add(
        self,
        node: ast.expr,
        line: int,
        col: int,
        code: str,
        message: str,
        edits: tuple[Edit, ...],
        through: tuple[_Class, str] | None = None,
    ) -> None:
        finding = Finding(self.path, line, col, code, message, fixable=bool(edits))
        span = (self.source.start(node), self.source.end(node))
        if through is not None:
            self.through[len(self.hits)] = through
        self.hits.append(Hit(finding=finding, span=span, edits=edits))


def _imported_modules(tree: ast.Module) -> Iterator[str]:
    """The absolute module names a module imports, anywhere in it."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def _mlx_only(tree: ast.Module) -> bool:
    """Whether the module imports MLX and nothing that can hand it an SGLang pool."""
    modules = list(_imported_modules(tree))

    def under(module: str, package: str) -> bool:
        return module == package or module.startswith(f"{package}.")

    return any(under(module, _MLX) for module in modules) and not any(
        under(module, package) for module in modules for package in _TORCH_POOL_MODULES
    )


def _lines_of(tree: ast.Module, names: frozenset[str]) -> list[tuple[int, int]]:
    """The lines (decorators included) of the module's top-level defs named in ``names``."""
    if not names:
        return []
    return [(first, last) for name, first, last in top_level_defs(tree) if name in names]


def analyze(
    tree: ast.Module, text: str, path: str, *, exempt: frozenset[str] = frozenset()
) -> list[Hit]:
    r"""Every unguarded, unsuppressed pool access in a parsed module, in source order.

    Args:
        tree: ``ast.parse(text)``.
        text: The module's source.
        path: The name to put into findings.
        exempt: Top-level functions and classes whose accesses are not reported (the
            model code of :mod:`kvcompat._scan._models`).

    Returns:
        The hits, sorted by line and column.

    Example:
        >>> import ast
        >>> from kvcompat._scan._analysis import analyze
        >>> text = "pool.get_kv_buffer(0)\n"
        >>> [hit.finding.code for hit in analyze(ast.parse(text), text, "x.py")]
        ['KVC002']
    """
    if text.isascii() and not any(name in text for name in _NEEDLES):
        return []  # the fast path for the many modules that never mention these names
    if _mlx_only(tree):
        return []  # MLX arrays and MLX pools: none of SGLang's torch pool classes
    names = _Names.collect(tree)
    binder = _Binder(tree, names)
    walker = _Walker(tree, SourceText(text), path, names, binder)
    if not walker.hits:
        return []
    suppressions = Suppressions.parse(text)
    exempt_lines = _lines_of(tree, exempt)
    hits = [
        hit
        for hit in walker.hits
        if not suppressions.covers(hit.finding.line, hit.finding.code)
        and not any(first <= hit.finding.line <= last for first, last in exempt_lines)
    ]
    hits.sort(key=lambda hit: (hit.finding.line, hit.finding.col, hit.finding.code))
    return hits
