"""Adapting pools: :func:`adapt`, :func:`register_adapter`, :func:`unregister_adapter`.

Works on the family table of :mod:`kvcompat._families` (how a class is recognised without
importing its engine, and the per-type cache) and imports SGLang's built-in families
(:mod:`kvcompat.adapters.sglang`), which install themselves into that table: every module
that imports this one sees them, whichever kvcompat module came first.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, cast

from torch import Tensor

from kvcompat._compat._marker import proxy_adapter
from kvcompat._errors import UnsupportedPoolError

# The family table itself lives below the built-in families, which install into it.
from kvcompat._families import (
    Factory,
    Family,
    _cache,
    _families,
    _lock,
    _unsupported,
    adapt_part,
    family_of,
    qualified_name,
)
from kvcompat._protocol import KVPoolProtocol, PoolKind
from kvcompat.adapters._composite import CompositeParts
from kvcompat.adapters._leaf import LeafAdapter
from kvcompat.adapters.vllm import adapt_vllm, needs_config, refuse_config

__all__ = [
    "Family",
    "adapt",
    "adapt_part",
    "family_of",
    "qualified_name",
    "register_adapter",
    "unregister_adapter",
]


def adapt(pool: Any, *, config: Any = None) -> KVPoolProtocol:
    """Wrap a native KV pool in kvcompat's uniform, key-first API.

    Idempotent (an adapter is returned as is) and never mutates ``pool``.
    Building an adapter resolves every layer's buffers once, so adapt a pool
    once and keep the adapter rather than adapting on every step.

    vLLM: ``adapt(kv_caches, config=kv_cache_config)`` with the ``dict[str, Tensor]``
    that ``KVConnectorBase_V1.register_kv_caches`` receives and the ``KVCacheConfig``
    the connector's constructor receives (``docs/vllm.md``). ``config`` is refused for
    every other pool: SGLang pools carry their own geometry.

    Raises:
        UnsupportedPoolError: ``pool`` is not a pool kvcompat knows (a TypeError), a
            ``config`` beside a pool that takes none, or a vLLM dict without its config.

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
        >>> native = ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64, layer_num=2)
        >>> pool = kvcompat.adapt(native)
        >>> k, v = pool.get_kv_buffer(1)      # the native get_kv_buffer raises here
        >>> k is v, kvcompat.adapt(pool) is pool
        (True, True)
    """
    if config is not None:
        if isinstance(pool, Mapping):
            return adapt_vllm(pool, config)
        raise refuse_config(pool, config)
    if isinstance(pool, Mapping) and pool and all(isinstance(v, Tensor) for v in pool.values()):
        raise needs_config(pool)
    proxied = proxy_adapter(pool)
    if proxied is not None:
        return proxied  # type: ignore[no-any-return]  # a kvcompat.compat proxy: its adapter
    family = family_of(pool)
    if isinstance(pool, type):
        msg = (
            f"adapt() takes a pool instance, got the class {qualified_name(pool)}.\n"
            "Hint: construct the pool first; detectors such as kvcompat.pool_kind() "
            "accept classes."
        )
        raise UnsupportedPoolError(msg)
    if family is not None and family.build is None and family.leaf is None and family.kind:
        return pool  # type: ignore[no-any-return]  # already an adapter
    if family is None or family.kind is None:
        raise _unsupported(pool, family)
    return family.make(pool)


def register_adapter(
    qualname: str,
    factory: Factory | str,
    *,
    kind: PoolKind | str | None = None,
    replace: bool = False,
    parts: CompositeParts | None = None,
) -> None:
    """Teach kvcompat a pool class by its qualified name, without importing it.

    Args:
        qualname: ``"package.module.ClassName"`` of the class (subclasses match too).
        factory: a :class:`~kvcompat.adapters.LeafAdapter` subclass (every feature:
            getters, read/write, describe, transfers, composite parts — see
            ``docs/extending.md``), any callable building a :class:`KVPoolProtocol`
            from a native pool, or the qualified name of a class kvcompat already
            supports, to reuse its adapter (e.g. a vendor fork of ``MHATokenToKVPool``).
        kind: the :class:`PoolKind`; required with a callable factory, taken
            from the reused family or the :class:`~kvcompat.adapters.LeafAdapter`
            subclass otherwise.
        replace: allow replacing an existing registration.
        parts: with a callable factory of a composite family, what ``describe`` and
            the transfer descriptors need beyond its components
            (:class:`~kvcompat.adapters.CompositeParts`).

    Raises:
        ValueError: malformed qualname, unknown family to reuse, missing kind,
            or a name already registered (without ``replace=True``).

    Example:
        >>> import kvcompat
        >>> kvcompat.register_adapter(
        ...     "vendor.pools.FastMHAPool", "sglang.srt.mem_cache.memory_pool.MHATokenToKVPool"
        ... )
        >>> kvcompat.unregister_adapter("vendor.pools.FastMHAPool")
        True
    """
    if not isinstance(qualname, str) or "." not in qualname.strip(".") or " " in qualname:
        msg = (
            f"qualname must be 'package.module.ClassName', got {qualname!r}.\n"
            "Hint: use f'{cls.__module__}.{cls.__qualname__}' of the class to teach."
        )
        raise ValueError(msg)
    if qualname in _families and not replace:
        msg = (
            f"{qualname} is already registered (as a {_families[qualname].kind} pool).\n"
            "Hint: pass replace=True to override it."
        )
        raise ValueError(msg)
    if isinstance(factory, str):
        base = _families.get(factory)
        if base is None or base.kind is None:
            known = ", ".join(sorted(n for n, f in _families.items() if f.kind is not None))
            msg = (
                f"cannot reuse the adapter of {factory!r}: it is not a supported class.\n"
                f"Hint: choose one of: {known}."
            )
            raise ValueError(msg)
        if kind is not None and PoolKind(kind) is not base.kind:
            msg = f"kind={kind!r} contradicts the reused family {factory} ({base.kind})."
            raise ValueError(msg)
        family = Family(qualname, base.kind, leaf=base.leaf, build=base.build, parts=base.parts)
    elif isinstance(factory, type) and issubclass(factory, LeafAdapter):
        # A leaf adapter class: the family's one place. Its buffers, layer_buffers and
        # detect_layout hooks serve describe, transfers, read/write and composite parts.
        declared = inspect.getattr_static(factory, "kind", None)
        if not isinstance(declared, PoolKind):
            msg = f"{factory.__qualname__} must set kind = kvcompat.PoolKind.<KIND>."
            raise ValueError(msg)
        if kind is not None and PoolKind(kind) is not declared:
            msg = f"kind={kind!r} contradicts {factory.__qualname__}.kind ({declared})."
            raise ValueError(msg)
        family = Family(qualname, declared, leaf=factory)
    elif callable(factory):
        if kind is None:
            msg = (
                f"register_adapter({qualname!r}, <callable>) needs kind=...: detectors answer "
                "without building an adapter.\n"
                "Hint: kind=kvcompat.PoolKind.SPLIT (or LATENT, SINGLE_KV, KEY_ONLY, COMPOSITE)."
            )
            raise ValueError(msg)
        try:
            resolved = PoolKind(kind)
        except ValueError:
            msg = f"kind must be a PoolKind, got {kind!r}; valid: {[k.value for k in PoolKind]}."
            raise ValueError(msg) from None
        family = Family(qualname, resolved, build=cast("Factory", factory), parts=parts)
    else:  # runtime guard for untyped callers
        msg = (  # type: ignore[unreachable]
            f"factory must be a callable or the qualified name of a supported class, "
            f"got {type(factory).__name__}."
        )
        raise TypeError(msg)
    with _lock:
        _families[qualname] = family
        _cache.clear()


def unregister_adapter(qualname: str) -> bool:
    """Forget a registration made with :func:`register_adapter`; True if one existed.

    Example:
        >>> import kvcompat
        >>> kvcompat.unregister_adapter("nobody.registered.This")
        False
    """
    with _lock:
        existed = _families.pop(qualname, None) is not None
        _cache.clear()
    return existed


# SGLang's families register themselves when their module is imported. Importing it
# here means every use of the registry knows them, whichever kvcompat module came
# first (the top-level package imports lazily, so it cannot be relied on for this).
import kvcompat.adapters.sglang  # noqa: E402, F401
