"""The family table: which pool class is which family, found without importing its engine.

A *family* says what kind of pool a class is and how to adapt it. Families are
registered by the class's qualified name (``"package.module.ClassName"``); a
class is recognised by walking its MRO and looking each base up by name, so
subclasses (``HiSparseC4DevicePool`` under ``DeepSeekV4SingleKVPool``) and test
doubles derived from real classes are recognised too. Each name match is
confirmed against ``sys.modules``: if the engine was never imported, none of
its classes can be present, and nothing here ever imports it.

The per-type answer is cached; the cache is guarded by a lock for writers and
read without one (a dict lookup is atomic). This module is the table alone: the
built-in families (:mod:`kvcompat.adapters.sglang`) install themselves into it, and
:mod:`kvcompat._registry`, which imports them, is what everything else uses.
"""

from __future__ import annotations

import inspect
import reprlib
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvcompat._errors import KVCompatError, PoolStateError, UnsupportedPoolError
from kvcompat._protocol import KVPoolProtocol, PoolKind
from kvcompat.adapters._composite import CompositeAdapter, CompositeParts
from kvcompat.adapters._leaf import LeafAdapter

__all__ = ["Factory", "Family", "adapt_part", "family_of", "qualified_name"]

Factory = Callable[[Any], KVPoolProtocol]


@dataclass(frozen=True)
class Family:
    """What kvcompat knows about one pool class.

    Attributes:
        qualname: ``"module.ClassName"`` of the class the family was registered for.
        kind: the pool kind, or None for a recognised but unsupported class.
        leaf: the leaf adapter class (for pools that can also be a composite's part).
        build: builds an adapter from a native pool (leaf families use ``leaf``).
        reason: why a recognised class is unsupported (``kind is None``).
        native_kind: what the *native* class is, for the detectors, when kvcompat
            refuses to adapt it (``kind is None``): ``is_single_kv_pool`` answers True
            for ``NPUDeepSeekV4SingleKVPool`` although ``adapt`` refuses it. None when
            the class is not a pool of any one kind (an abstract base, a stub).
        subclasses: class names of engine subclasses checked to keep this family's
            storage, served by its adapter; any other subclass defined in the engine's
            namespace is refused (it may add buffers, e.g. scales, the adapter ignores).
        parts: what a composite family declares for ``describe`` and the transfer
            descriptors beyond its components (:class:`~kvcompat.adapters.CompositeParts`).
    """

    qualname: str
    kind: PoolKind | None
    leaf: type[LeafAdapter] | None = None
    build: Factory | None = None
    reason: str | None = None
    native_kind: PoolKind | None = None
    subclasses: tuple[str, ...] = ()
    parts: CompositeParts | None = None

    @property
    def detected_kind(self) -> PoolKind | None:
        """The kind the detectors answer: the served kind, else the native class's kind.

        Example:
            >>> Family("x.Y", None, reason="no", native_kind=PoolKind.SPLIT).detected_kind
            <PoolKind.SPLIT: 'split'>
        """
        return self.kind if self.kind is not None else self.native_kind

    def make(self, native: Any) -> KVPoolProtocol:
        """Build an adapter for ``native`` (which must be of this family).

        A pool whose attributes cannot be read (half-built, or its buffers released)
        raises :class:`~kvcompat.PoolStateError`, never a raw AttributeError.
        """
        if self.build is None and self.leaf is None:
            raise _unsupported(native, self)
        try:
            if self.build is not None:
                return self.build(native)
            return self.leaf(native)  # type: ignore[misc]
        except KVCompatError:
            raise
        except (AttributeError, KeyError, IndexError, TypeError) as exc:
            msg = (
                f"kvcompat cannot read {qualified_name(type(native))} as a {self.qualname} "
                f"pool: {type(exc).__name__}: {exc}.\n"
                "Hint: adapt the pool after its constructor has returned and before its "
                "buffers are released (_clear_buffers())."
            )
            raise PoolStateError(msg) from exc


_lock = threading.Lock()
_families: dict[str, Family] = {}
# Class-name fallback for engine modules that moved between releases: only
# consulted for classes whose module starts with one of these prefixes.
_by_class_name: dict[tuple[str, str], Family] = {}
_cache: dict[type, Family | None] = {}
# Engine namespaces whose classes must be registered one by one: a subclass found only
# through a supported base is refused (it may add buffers, e.g. scales, the base's
# adapter would ignore), so a new engine release cannot slip a class through silently.
_sealed_prefixes: set[str] = set()
_MISSING: Any = object()


def qualified_name(cls: type) -> str:
    """``"module.QualName"`` of a class.

    Example:
        >>> qualified_name(int)
        'builtins.int'
    """
    return f"{cls.__module__}.{cls.__qualname__}"


def _install(family: Family, *, name_fallback: str | None = None) -> None:
    _families[family.qualname] = family
    if name_fallback is not None:
        short = family.qualname.rsplit(".", 1)[1]
        _by_class_name[(name_fallback, short)] = family
        _sealed_prefixes.add(name_fallback)


def _confirmed(cls: type) -> bool:
    """The class really lives where its name says (its module is imported and holds it)."""
    module = sys.modules.get(cls.__module__)
    if module is None:
        return False
    target: Any = module
    for part in cls.__qualname__.split("."):
        target = inspect.getattr_static(target, part, None)
        if target is None:
            return False
    return target is cls


def _lookup(base: type) -> Family | None:
    family = _families.get(qualified_name(base))
    if family is not None and _confirmed(base):
        return family
    for (prefix, short), found in _by_class_name.items():
        if (
            base.__qualname__ == short
            and base.__module__.startswith(prefix)
            and _confirmed(base)  # a class that only copies the names is not the real one
        ):
            return found
    return None


def _engine_class(cls: type) -> bool:
    return any(cls.__module__.startswith(prefix) for prefix in _sealed_prefixes)


def _resolve(cls: type) -> Family | None:
    passed: list[type] = []  # engine classes met before the nearest registered base
    for base in cls.__mro__:
        family = _lookup(base)
        if family is not None:
            if family.kind is not None:
                for sub in passed:
                    if sub.__qualname__ not in family.subclasses:
                        return _unchecked_subclass(sub, family)
            return family
        if _engine_class(base):
            passed.append(base)
    return _structural(cls)


def _unchecked_subclass(cls: type, base: Family) -> Family:
    """A refusal for an engine class kvcompat reaches only through a supported base."""
    reason = (
        f"it subclasses {base.qualname}, but kvcompat has not checked this subclass: it may "
        "keep buffers (scales, remapped rows) the base's adapter would ignore, and reading "
        "or writing it as its base could be silently wrong"
    )
    return Family(qualified_name(cls), None, reason=reason + ".", native_kind=base.kind)


def _structural(cls: type) -> Family | None:
    """Adapters (ours or a third party's) say their kind as a plain class attribute."""
    if issubclass(cls, (LeafAdapter, CompositeAdapter)):
        return Family(qualified_name(cls), cls.kind)
    kind = inspect.getattr_static(cls, "kind", None)
    if isinstance(kind, PoolKind) and all(
        inspect.getattr_static(cls, method, None) is not None
        for method in ("get_key_buffer", "get_value_buffer", "get_kv_buffer", "layer_ids")
    ):
        return Family(qualified_name(cls), kind)
    return None


def family_of(obj: Any) -> Family | None:
    """The family of a pool, a pool class, or an adapter; None when unknown.

    Never imports an engine and never calls a getter. Cached per type.

    Example:
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool
        >>> family_of(ReferenceMHATokenToKVPool).kind
        <PoolKind.SPLIT: 'split'>
        >>> family_of(3) is None
        True
    """
    cls = obj if isinstance(obj, type) else type(obj)
    family = _cache.get(cls, _MISSING)
    if family is _MISSING:
        resolved = _resolve(cls)
        with _lock:
            _cache[cls] = resolved
        return resolved
    known: Family | None = family
    return known


_THE_POOL = (
    "the pool object itself (in SGLang, model_runner.token_to_kv_pool: an MHATokenToKVPool, "
    "a DeepSeekV4TokenToKVPool, ...; the supported-pools page lists them)"
)


def _not_a_pool(obj: Any, cls: type) -> str | None:
    """The message for None, a builtin value or container, or a tensor; None for other types."""
    if any(c.__module__ == "torch" and c.__name__ == "Tensor" for c in cls.__mro__):
        shape = list(getattr(obj, "shape", ()))
        return (
            f"adapt() takes a KV pool, got a tensor ({qualified_name(cls)}, shape {shape}, "
            f"dtype {getattr(obj, 'dtype', '?')}): a tensor is a pool's buffer, not a pool.\n"
            f"Hint: pass {_THE_POOL}, not one of its buffers."
        )
    if cls.__module__ != "builtins":
        return None
    got = "None" if obj is None else f"{cls.__name__} {reprlib.repr(obj)}"
    return (
        f"adapt() takes a KV pool, got {got}: a builtin value or container is not a pool.\n"
        f"Hint: pass {_THE_POOL}; adapt the pools of a list or dict one by one; None "
        "often means the pool has not been built yet."
    )


def _unsupported(obj: Any, family: Family | None) -> UnsupportedPoolError:
    cls = obj if isinstance(obj, type) else type(obj)
    name = qualified_name(cls)
    if family is not None and family.reason:
        msg = (
            f"kvcompat recognises {name} (as {family.qualname}) but does not support it: "
            f"{family.reason}\n"
            "Hint: if your build of this class behaves like a supported pool, register it: "
            f'kvcompat.register_adapter("{name}", "<supported class qualname>").'
        )
        return UnsupportedPoolError(msg)
    not_a_pool = _not_a_pool(obj, cls)
    if not_a_pool is not None:
        return UnsupportedPoolError(not_a_pool)
    msg = (
        f"kvcompat does not know how to adapt an object of type {name}.\n"
        "Hint: pass an SGLang KV pool (see the supported-pools page), or teach kvcompat "
        f'about this class with kvcompat.register_adapter("{name}", factory, kind=...) — '
        "or reuse a built-in adapter with "
        f'kvcompat.register_adapter("{name}", '
        '"sglang.srt.mem_cache.memory_pool.MHATokenToKVPool").'
    )
    return UnsupportedPoolError(msg)


def adapt_part(
    native: Any,
    *,
    owner: str,
    component: str,
    slots: Mapping[int, int],
    wait_owner: Any = None,
    wait_offset: int = 0,
) -> KVPoolProtocol:
    """Adapt a composite's sub-pool as a named component with absolute layer ids.

    ``slots`` maps each absolute layer id the component serves to the index of
    its buffer in the sub-pool's per-layer list. With ``wait_owner`` (the native
    composite, where SGLang registers the layer-transfer counter) the part's
    getters wait on ``wait_owner.layer_transfer_counter`` at
    ``layer_id - wait_offset``, as the composite's native getters do.

    Example:
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool
        >>> sub = ReferenceMHATokenToKVPool(size=16, page_size=16, layer_num=2)
        >>> part = adapt_part(sub, owner="demo", component="full", slots={1: 0, 3: 1})
        >>> part.layer_ids, part.component_for(3)
        ((1, 3), 'full')
    """
    family = family_of(native)
    if family is None or family.leaf is None:
        kind = "unknown" if family is None else "custom or composite"
        msg = (
            f"{owner}: its {component!r} part is a {qualified_name(type(native))} "
            f"({kind} family); kvcompat can only use built-in leaf adapters as composite parts.\n"
            "Hint: register the sub-pool class with a built-in adapter, e.g. "
            f'kvcompat.register_adapter("{qualified_name(type(native))}", '
            '"sglang.srt.mem_cache.memory_pool.MHATokenToKVPool").'
        )
        raise UnsupportedPoolError(msg)
    if wait_owner is None:
        return family.leaf(native, slots=slots, component=component)
    return family.leaf(
        native,
        slots=slots,
        component=component,
        wait_owner=wait_owner,
        wait_index={layer: layer - wait_offset for layer in slots},
    )
