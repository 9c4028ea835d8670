"""How kvcompat's own entry points see through a compat proxy (no imports, no cycles)."""

from __future__ import annotations

from typing import Any

__all__ = ["PROXY_MARKER", "proxy_adapter", "unwrap_proxy"]

PROXY_MARKER = "_kvcompat_proxy_"
"""Class attribute (True) on every proxy type :func:`kvcompat.compat` creates."""


def unwrap_proxy(obj: Any) -> Any:
    """The native pool behind a :func:`kvcompat.compat` proxy; anything else unchanged.

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool
        >>> native = ReferenceMHATokenToKVPool(size=16, page_size=16)
        >>> unwrap_proxy(kvcompat.compat(native)) is native, unwrap_proxy(3)
        (True, 3)
    """
    if getattr(type(obj), PROXY_MARKER, False) is True:
        return obj.kvcompat.native
    return obj


def proxy_adapter(obj: Any) -> Any:
    """The key-first adapter of a compat proxy, or None for anything else.

    Example:
        >>> proxy_adapter(object()) is None
        True
    """
    if getattr(type(obj), PROXY_MARKER, False) is True:
        return obj.kvcompat
    return None
