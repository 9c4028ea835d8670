"""A drop-in proxy for backends written against the MHA pool interface.

``kvcompat.compat(pool)`` returns an object with the native pool's method names
where the calls that raise on single-KV pools work: ``get_value_buffer`` and
``get_kv_buffer`` return the shared storage, ``set_kv_buffer`` quantizes and
stores through :meth:`KVPoolProtocol.write`. Every other attribute passes
through to the native pool, so an unported backend runs unchanged. It is a
bridge: porting to the key-first API (``kvcompat.adapt``) is the clean fix.
"""

from __future__ import annotations

from typing import Any

import torch

from kvcompat._errors import WriteError
from kvcompat._protocol import KVPair, KVPoolProtocol, PoolKind
from kvcompat._registry import adapt

__all__ = ["CompatPool", "compat"]


class CompatPool:
    """The native pool's interface, working on every pool kind kvcompat supports.

    Getters take the absolute layer ids the native getters take and return the same
    storage (see :class:`kvcompat.KVPoolProtocol`), performing the native
    layer-transfer wait. ``set_kv_buffer(layer, loc, cache_k, cache_v, k_scale=None,
    v_scale=None, layer_id_override=None)`` accepts SGLang's arguments: ``loc`` may be
    a tensor or a ``KVWriteLoc`` (its ``swa_loc`` is used for a composite's
    sliding-window layers), the scales divide copies of the inputs (never the caller's
    tensors), and on pools whose value lives inside the key row (latent, single-KV)
    ``cache_v`` is ignored, as SGLang's MLA pool ignores it.

    Example:
        >>> import torch, kvcompat
        >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
        >>> native = ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64)
        >>> pool = kvcompat.compat(native)
        >>> k, v = pool.get_kv_buffer(0)                 # the native call raises
        >>> k is v, pool.page_size, pool.kv_cache_total_dim   # other names pass through
        (True, 64, 584)
    """

    __slots__ = ("_adapter", "_native")

    def __init__(self, pool: Any) -> None:
        adapter = adapt(pool)
        object.__setattr__(self, "_adapter", adapter)
        object.__setattr__(self, "_native", adapter.native)

    @property
    def kvcompat(self) -> KVPoolProtocol:
        """The key-first adapter behind the proxy (the API to port to).

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMLATokenToKVPool
            >>> kvcompat.compat(ReferenceMLATokenToKVPool(size=16, page_size=16)).kvcompat.kind
            <PoolKind.LATENT: 'latent'>
        """
        adapter: KVPoolProtocol = self._adapter
        return adapter

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """The layer's key storage (as the native getter, on every pool kind).

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMLATokenToKVPool
            >>> pool = kvcompat.compat(ReferenceMLATokenToKVPool(size=16, page_size=16))
            >>> pool.get_key_buffer(0).shape
            torch.Size([32, 1, 576])
        """
        key: torch.Tensor = self._adapter.get_key_buffer(layer_id)
        return key

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """The layer's value storage; the shared key storage on single-KV pools.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
            >>> pool = kvcompat.compat(ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64))
            >>> pool.get_value_buffer(0).shape[-1]    # a v_head_dim probe no longer crashes
            37440
        """
        value: torch.Tensor = self._adapter.get_value_buffer(layer_id)
        return value

    def get_kv_buffer(self, layer_id: int) -> KVPair:
        """The layer's ``(key, value)`` storage pair (a 2-tuple with a ``shared`` flag).

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> k, v = kvcompat.compat(ReferenceMHATokenToKVPool(16, 16)).get_kv_buffer(0)
            >>> k.shape == v.shape
            True
        """
        pair: KVPair = self._adapter.get_kv_buffer(layer_id)
        return pair

    def set_kv_buffer(
        self,
        layer: Any,
        loc: Any,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor | None = None,
        k_scale: float | None = None,
        v_scale: float | None = None,
        layer_id_override: int | None = None,
        **_: Any,
    ) -> None:
        """Store ``cache_k`` (and ``cache_v``) at ``loc`` through kvcompat's quantizing write.

        Example:
            >>> import torch, kvcompat
            >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
            >>> pool = kvcompat.compat(ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64))
            >>> class Layer:
            ...     layer_id = 0
            >>> pool.set_kv_buffer(Layer(), torch.tensor([3]), torch.ones(1, 1, 512), None)
            >>> pool.kvcompat.read(0, torch.tensor([3])).sum().item()
            512.0
        """
        adapter = self._adapter
        if layer_id_override is not None:
            layer_id = layer_id_override
        elif hasattr(layer, "layer_id"):
            layer_id = layer.layer_id
        else:
            msg = (
                f"set_kv_buffer needs a layer with a layer_id (or layer_id_override); got "
                f"{type(layer).__name__}.\nHint: pass the RadixAttention layer, as SGLang does."
            )
            raise WriteError(msg)
        token_loc = _token_loc(adapter, layer_id, loc)
        key = cache_k if k_scale in (None, 1.0) else cache_k / k_scale
        value = None
        if adapter.kind is PoolKind.SPLIT or _routes_to(adapter, layer_id, PoolKind.SPLIT):
            value = cache_v if v_scale in (None, 1.0) or cache_v is None else cache_v / v_scale
        adapter.write(layer_id, token_loc, key, value)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._native, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._native, name, value)

    def __repr__(self) -> str:
        return f"<kvcompat CompatPool over {type(self._native).__qualname__}>"


def _routes_to(adapter: KVPoolProtocol, layer_id: int, kind: PoolKind) -> bool:
    if adapter.kind is not PoolKind.COMPOSITE:
        return False
    part = adapter.component_for(layer_id)
    return part is not None and adapter.components[part].kind is kind


def _token_loc(adapter: KVPoolProtocol, layer_id: int, loc: Any) -> Any:
    """A bare ``loc``, or the right field of SGLang's ``KVWriteLoc`` for this layer."""
    if isinstance(loc, torch.Tensor):
        return loc
    swa_loc = getattr(loc, "swa_loc", None)
    if adapter.kind is PoolKind.COMPOSITE and adapter.component_for(layer_id) == "swa":
        if swa_loc is None:
            msg = (
                f"layer {layer_id} lives in the sliding-window sub-pool, but the write location "
                "carries no swa_loc.\nHint: pass KVWriteLoc(loc, swa_loc=...) as SGLang's "
                "attention backends do."
            )
            raise WriteError(msg)
        return swa_loc
    return getattr(loc, "loc", loc)


def compat(pool: Any) -> CompatPool:
    """Wrap a pool so code written against the native MHA interface runs on it unchanged.

    Raises:
        UnsupportedPoolError: ``pool`` is not a pool kvcompat knows.

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
        >>> native = ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64)
        >>> kvcompat.compat(native).get_value_buffer(0) is not None
        True
    """
    if isinstance(pool, CompatPool):
        return pool
    return CompatPool(pool)
