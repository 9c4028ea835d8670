"""Where a DeepSeek-V4 composite keeps its compressed and indexer pools, across releases.

Shared by the composite's adapter (:mod:`kvcompat.adapters.sglang`) and its native
description (:mod:`kvcompat.inspection._dsv4`), which reads the same attributes
statically; neither imports the other for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["dsv4_compressed_pools"]

_NAMED_KV_POOLS = ((4, "c4_kv_pool"), (128, "c128_kv_pool"))
_NAMED_INDEX_POOLS = ((4, "c4_indexer_kv_pool"),)

_Pools = dict[int, tuple[str, Any]]


def dsv4_compressed_pools(
    native: Any, read: Callable[[Any, str, Any], Any] = getattr
) -> tuple[_Pools, _Pools]:
    """A DSv4 composite's compressed KV pools and indexer pools: ratio -> (path, pool).

    Reads ``kv_pools`` / ``index_pools`` (SGLang 0.5.20 on) or, when the composite has
    no such dicts, the ``c4_kv_pool``, ``c128_kv_pool`` and ``c4_indexer_kv_pool``
    attributes that 0.5.12-0.5.19 keep. ``path`` is the attribute path from the
    composite (``"kv_pools[4]"`` or ``"c4_kv_pool"``). A ratio the composite lists with no
    pool (None: ``unified_kv`` mode keeps those rows elsewhere) is kept, as None.
    ``read(obj, name, default)`` is ``getattr`` or a static reader that runs no code.

    Example:
        >>> from types import SimpleNamespace
        >>> old = SimpleNamespace(c4_kv_pool="A", c128_kv_pool="B", c4_indexer_kv_pool="I")
        >>> dsv4_compressed_pools(old)
        ({4: ('c4_kv_pool', 'A'), 128: ('c128_kv_pool', 'B')}, {4: ('c4_indexer_kv_pool', 'I')})
        >>> new = SimpleNamespace(kv_pools={4: "A", 128: None}, index_pools={4: "I"})
        >>> dsv4_compressed_pools(new)
        ({4: ('kv_pools[4]', 'A'), 128: ('kv_pools[128]', None)}, {4: ('index_pools[4]', 'I')})
    """
    absent = object()
    found: list[_Pools] = []
    for attr, named in (("kv_pools", _NAMED_KV_POOLS), ("index_pools", _NAMED_INDEX_POOLS)):
        table = read(native, attr, None)
        if isinstance(table, dict):
            pools = {int(r): (f"{attr}[{int(r)}]", p) for r, p in table.items()}
        else:
            pools = {
                ratio: (name, pool)
                for ratio, name in named
                if (pool := read(native, name, absent)) is not absent
            }
        found.append(pools)
    return found[0], found[1]
