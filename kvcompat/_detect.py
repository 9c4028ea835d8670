"""Detectors: what kind of pool is this? Never imports an engine, never calls a getter.

Each detector accepts a native pool, a pool class, or a kvcompat adapter, and
answers from a per-type cache (see :mod:`kvcompat._registry`), so a cached
answer costs a type lookup and a dict lookup.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import TypeIs

from kvcompat._families import _MISSING, Family, _cache, family_of
from kvcompat._protocol import PoolKind, SupportsGetKeyBuffer

__all__ = [
    "is_composite_pool",
    "is_key_only_pool",
    "is_latent_pool",
    "is_single_kv_pool",
    "is_split_kv_pool",
    "is_supported_pool",
    "pool_kind",
]

PoolLike = SupportsGetKeyBuffer | type[SupportsGetKeyBuffer]


def _family(obj: Any) -> Family | None:
    cls = obj if isinstance(obj, type) else type(obj)
    family: Family | None = _cache.get(cls, _MISSING)
    if family is _MISSING:
        family = family_of(cls)
    return family


def _kind(obj: Any) -> PoolKind | None:
    """What the pool is, even where kvcompat refuses to adapt it (its native kind).

    Inlined (no helper call, no property): detectors run on hot paths.
    """
    cls = obj if isinstance(obj, type) else type(obj)
    family: Family | None = _cache.get(cls, _MISSING)
    if family is _MISSING:
        family = family_of(cls)
    if family is None:
        return None
    kind = family.kind
    return kind if kind is not None else family.native_kind


def pool_kind(obj: object, /) -> PoolKind | None:
    """The :class:`PoolKind` of a pool, pool class or adapter; None if unknown.

    A class kvcompat recognises but refuses to adapt (``NPUDeepSeekV4SingleKVPool``,
    ``MHATokenToKVPoolMXFP8``) still answers its native kind, so code guarded by a
    detector knows what the native getters do; :func:`is_supported_pool` says whether
    :func:`kvcompat.adapt` accepts it.

    Does not import sglang (or any engine) and never calls a getter: an SGLang
    class can only be recognised once the program has imported it.

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import ReferenceMLATokenToKVPool
        >>> kvcompat.pool_kind(ReferenceMLATokenToKVPool)
        <PoolKind.LATENT: 'latent'>
        >>> kvcompat.pool_kind("not a pool") is None
        True
    """
    return _kind(obj)


def is_single_kv_pool(obj: object, /) -> TypeIs[PoolLike]:
    """True for pools whose keys and values share one packed buffer (DeepSeek-V4 family).

    ``DeepSeekV4SingleKVPool`` and its subclasses (``HiSparseC4DevicePool``,
    ``DeepSeekV4UniformFP8KVPool``) answer True; their native
    ``get_value_buffer``/``get_kv_buffer`` raise, kvcompat's return the shared
    storage. Composites (``DeepSeekV4TokenToKVPool``) answer False — check their
    components. Does not import sglang.

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool, ReferenceMHATokenToKVPool
        >>> kvcompat.is_single_kv_pool(ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64))
        True
        >>> kvcompat.is_single_kv_pool(ReferenceMHATokenToKVPool)
        False
    """
    return _kind(obj) is PoolKind.SINGLE_KV


def is_split_kv_pool(obj: object, /) -> TypeIs[PoolLike]:
    """True for pools with separate key and value tensors per layer (MHA family).

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool
        >>> kvcompat.is_split_kv_pool(ReferenceMHATokenToKVPool)
        True
    """
    return _kind(obj) is PoolKind.SPLIT


def is_latent_pool(obj: object, /) -> TypeIs[PoolLike]:
    """True for MLA/DSA latent pools, whose value is a prefix view of the key row.

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import ReferenceMLATokenToKVPool
        >>> kvcompat.is_latent_pool(ReferenceMLATokenToKVPool)
        True
    """
    return _kind(obj) is PoolKind.LATENT


def is_key_only_pool(obj: object, /) -> TypeIs[PoolLike]:
    """True for pools that store keys only (K-only MHA pools, DeepSeek-V4 indexer keys).

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool
        >>> kvcompat.is_key_only_pool(ReferenceMHATokenToKVPool)
        False
    """
    return _kind(obj) is PoolKind.KEY_ONLY


def is_composite_pool(obj: object, /) -> TypeIs[PoolLike]:
    """True for pools that route layers to sub-pools (SWA, hybrid-linear, DeepSeek-V4).

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import ReferenceSWAKVPool
        >>> kvcompat.is_composite_pool(ReferenceSWAKVPool)
        True
    """
    return _kind(obj) is PoolKind.COMPOSITE


def is_supported_pool(obj: object, /) -> TypeIs[PoolLike]:
    """True when :func:`kvcompat.adapt` accepts the pool (or instances of the class).

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool
        >>> kvcompat.is_supported_pool(ReferenceMHATokenToKVPool), kvcompat.is_supported_pool(3)
        (True, False)
    """
    family = _family(obj)
    return family is not None and family.kind is not None
