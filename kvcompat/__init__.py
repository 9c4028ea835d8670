"""kvcompat: one key-first API over the KV-cache pools of LLM serving engines.

Wrap any supported pool with :func:`adapt` and use ``get_key_buffer`` first —
it works on every pool kind, including SGLang's DeepSeek-V4 single-KV pools,
whose native ``get_value_buffer``/``get_kv_buffer``/``set_kv_buffer`` raise.
Detectors (:func:`is_single_kv_pool`, :func:`pool_kind`, ...) recognise pools
without importing their engine. ``import kvcompat`` never imports sglang or
triton.

Example:
    >>> import kvcompat
    >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
    >>> native = ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64, layer_num=2)
    >>> pool = kvcompat.adapt(native)
    >>> for layer in pool.layer_ids:
    ...     k, v = pool.get_kv_buffer(layer)
    >>> pool.kind, k is v
    (<PoolKind.SINGLE_KV: 'single_kv'>, True)
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from kvcompat._version import __version__

if TYPE_CHECKING:  # the real objects, for type checkers and IDEs; at run time see _LAZY
    from kvcompat import adapters
    from kvcompat._detect import (
        is_composite_pool,
        is_key_only_pool,
        is_latent_pool,
        is_single_kv_pool,
        is_split_kv_pool,
        is_supported_pool,
        pool_kind,
    )
    from kvcompat._errors import (
        ImplError,
        KernelUnavailableError,
        KVCompatError,
        LayerIdTypeError,
        LayerOutOfRangeError,
        LayoutError,
        NoValueBufferError,
        PoolStateError,
        UnsupportedPoolError,
        WriteError,
    )
    from kvcompat._protocol import KVPair, KVPoolProtocol, PoolKind, SupportsGetKeyBuffer
    from kvcompat._registry import adapt, register_adapter, unregister_adapter
    from kvcompat.compat import CompatPool, compat
    from kvcompat.inspection import describe, memory_report, transfer_descriptors

__all__ = [
    "CompatPool",
    "ImplError",
    "KVCompatError",
    "KVPair",
    "KVPoolProtocol",
    "KernelUnavailableError",
    "LayerIdTypeError",
    "LayerOutOfRangeError",
    "LayoutError",
    "NoValueBufferError",
    "PoolKind",
    "PoolStateError",
    "SupportsGetKeyBuffer",
    "UnsupportedPoolError",
    "WriteError",
    "__version__",
    "adapt",
    "adapters",
    "compat",
    "describe",
    "is_composite_pool",
    "is_key_only_pool",
    "is_latent_pool",
    "is_single_kv_pool",
    "is_split_kv_pool",
    "is_supported_pool",
    "memory_report",
    "pool_kind",
    "register_adapter",
    "transfer_descriptors",
    "unregister_adapter",
]

# Every public name but __version__ is imported on first access (PEP 562), so that
# ``kvcompat --version``, ``--help`` and ``kvcompat scan`` never import torch.
_LAZY: dict[str, str] = {
    "CompatPool": "kvcompat.compat",
    "ImplError": "kvcompat._errors",
    "KVCompatError": "kvcompat._errors",
    "KVPair": "kvcompat._protocol",
    "KVPoolProtocol": "kvcompat._protocol",
    "KernelUnavailableError": "kvcompat._errors",
    "LayerIdTypeError": "kvcompat._errors",
    "LayerOutOfRangeError": "kvcompat._errors",
    "LayoutError": "kvcompat._errors",
    "NoValueBufferError": "kvcompat._errors",
    "PoolKind": "kvcompat._protocol",
    "PoolStateError": "kvcompat._errors",
    "SupportsGetKeyBuffer": "kvcompat._protocol",
    "UnsupportedPoolError": "kvcompat._errors",
    "WriteError": "kvcompat._errors",
    "adapt": "kvcompat._registry",
    "compat": "kvcompat.compat",
    "describe": "kvcompat.inspection",
    "is_composite_pool": "kvcompat._detect",
    "is_key_only_pool": "kvcompat._detect",
    "is_latent_pool": "kvcompat._detect",
    "is_single_kv_pool": "kvcompat._detect",
    "is_split_kv_pool": "kvcompat._detect",
    "is_supported_pool": "kvcompat._detect",
    "memory_report": "kvcompat.inspection",
    "pool_kind": "kvcompat._detect",
    "register_adapter": "kvcompat._registry",
    "transfer_descriptors": "kvcompat.inspection",
    "unregister_adapter": "kvcompat._registry",
}


def __getattr__(name: str) -> Any:
    if name == "adapters":
        return importlib.import_module("kvcompat.adapters")
    where = _LAZY.get(name)
    if where is None:
        msg = f"module 'kvcompat' has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """Keeps ``kvcompat.compat`` the function once the submodule of that name is imported.

    Importing ``kvcompat.compat`` (the module) binds it as an attribute of the package;
    the public name ``kvcompat.compat`` is the function, as it was before the package
    became lazy.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "compat" and isinstance(value, types.ModuleType):
            value = value.compat
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
