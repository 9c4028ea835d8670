"""Adapter classes: one per storage family, plus the composite.

Most users never touch these directly: :func:`kvcompat.adapt` picks the right
one. They are public so a new pool class can be taught with a few lines —
subclass :class:`LeafAdapter` (or build a :class:`CompositeAdapter`) and pass
it to :func:`kvcompat.register_adapter`.

Example:
    >>> import kvcompat
    >>> from kvcompat.adapters import SingleKVAdapter
    >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
    >>> native = ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64)
    >>> isinstance(kvcompat.adapt(native), SingleKVAdapter)
    True
"""

from __future__ import annotations

from kvcompat.adapters._base import AdapterBase, Buffer
from kvcompat.adapters._components import ComponentsPlan
from kvcompat.adapters._composite import CompositeAdapter, CompositeParts
from kvcompat.adapters._io import LayerLayout
from kvcompat.adapters._leaf import (
    IndexKeyAdapter,
    KeyOnlyAdapter,
    LatentAdapter,
    LeafAdapter,
    SingleKVAdapter,
    SplitAdapter,
)

__all__ = [
    "AdapterBase",
    "Buffer",
    "ComponentsPlan",
    "CompositeAdapter",
    "CompositeParts",
    "IndexKeyAdapter",
    "KeyOnlyAdapter",
    "LatentAdapter",
    "LayerLayout",
    "LeafAdapter",
    "SingleKVAdapter",
    "SplitAdapter",
]
