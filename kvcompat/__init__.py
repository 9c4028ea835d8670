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
from kvcompat.adapters import sglang as _sglang_families  # noqa: F401  (installs the families)
from kvcompat.compat import CompatPool, compat
from kvcompat.inspection import describe, memory_report, transfer_descriptors

__version__ = "0.1.0"

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
