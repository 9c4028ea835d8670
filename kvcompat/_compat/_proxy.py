"""The compat proxy: the native pool's class and state, with getters that never lie.

``kvcompat.compat(pool)`` returns an instance of a proxy type made once per native class:
``class Compat<Native>(CompatPool, <Native>)``. The instance shares the native pool's
``__dict__`` (the same dict object, not a copy), so every attribute, property and native
method sees and changes the very state of the native pool, and ``isinstance(proxy, Native)``
holds; the native pool itself is never modified. The proxy type overrides the four generic
methods -- ``get_key_buffer``, ``get_value_buffer``, ``get_kv_buffer``, ``set_kv_buffer`` --
and native helpers that call them on ``self`` (``get_kv_buffer_shape()``...) get the proxy's.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import types
from typing import Any

import torch

from kvcompat._compat._locs import LocSpace, loc_space
from kvcompat._compat._marker import PROXY_MARKER
from kvcompat._compat._view import LogicalView, plan_views
from kvcompat._errors import UnsupportedPoolError, WriteError
from kvcompat._protocol import KVPair, KVPoolProtocol, PoolKind
from kvcompat._registry import adapt

__all__ = ["CompatPool", "compat"]

_KV_CANARY = "sglang.srt.kv_canary.pool_patcher.api"


class _Layer:
    """A layer's cached answer: its storage, location space, and views (None: native)."""

    __slots__ = ("key", "pair", "space", "storage", "value")

    def __init__(
        self,
        storage: torch.Tensor,
        space: LocSpace,
        key: LogicalView | None,
        value: LogicalView | None,
        pair: KVPair | None,
    ) -> None:
        self.storage = storage
        self.space = space
        self.key = key
        self.value = value
        self.pair = pair


class CompatPool:
    """Base of every compat proxy type: the native pool, with getters that never lie.

    ``kvcompat.compat(pool)`` builds the proxy; ``isinstance(proxy, type(pool))`` and
    ``isinstance(proxy, CompatPool)`` both hold. On split (MHA-family) pools and on pools of
    plain token rows (bf16/fp8 MLA, K-only MHA) the getters return the native tensors. On
    packed pools (DeepSeek-V4 single, HiSparse, uniform-fp8, the V4 composite's parts, DSA
    fp8, the V4 indexer) they return :class:`~kvcompat.compat.LogicalView` objects: the logical
    ``[rows, heads, head_dim]`` geometry, gathers by token index that dequantize, and clear
    errors for anything else. ``set_kv_buffer(layer, loc, cache_k, cache_v, k_scale=None,
    v_scale=None, layer_id_override=None)`` stores through kvcompat's all-or-nothing write.

    Example:
        >>> import torch, kvcompat
        >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
        >>> native = ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64)
        >>> pool = kvcompat.compat(native)
        >>> isinstance(pool, ReferenceDeepSeekV4SingleKVPool), pool.page_size
        (True, 64)
        >>> pool.get_value_buffer(0).shape[-1]          # the v_head_dim probe: the model's
        512
    """

    __slots__ = ()
    _kvcompat_proxy_ = True
    _kvcompat_adapter: KVPoolProtocol
    _kvcompat_layers: dict[int, _Layer]

    def __new__(cls, pool: Any = None) -> Any:
        if cls is CompatPool:
            return compat(pool)
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: the proxy's state is the native pool's (``compat`` sets it up)."""

    @property
    def kvcompat(self) -> KVPoolProtocol:
        """The key-first adapter behind the proxy (the API to port to).

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMLATokenToKVPool
            >>> kvcompat.compat(ReferenceMLATokenToKVPool(size=16, page_size=16)).kvcompat.kind
            <PoolKind.LATENT: 'latent'>
        """
        return self._kvcompat_adapter

    # -- the four generic methods -------------------------------------------------------

    def _kvcompat_layer(self, layer_id: int, storage: torch.Tensor) -> _Layer:
        layer = self._kvcompat_layers.get(layer_id)
        if (
            layer is not None
            and layer.storage is storage
            and (layer.space.fixed or layer.space.is_current())
        ):
            return layer
        adapter = self._kvcompat_adapter
        plan = plan_views(adapter, layer_id, storage)
        rows = int(storage.shape[0]) if plan is None else plan.rows
        space = loc_space(adapter, layer_id, rows, views=plan is not None)
        if plan is None:
            layer = _Layer(storage, space, None, None, None)
        else:
            plan = dataclasses.replace(plan, rows=space.rows)
            key = LogicalView(adapter, layer_id, "key", plan, storage, space)
            value = pair = None
            if plan.value_dim is not None:
                value = (
                    key
                    if plan.value_cols is None
                    else LogicalView(adapter, layer_id, "value", plan, storage, space)
                )
                part = adapter.component_for(layer_id)
                pair = KVPair(key, value, shared=True, component=part)
            layer = _Layer(storage, space, key, value, pair)
        self._kvcompat_layers[layer_id] = layer
        return layer

    def get_key_buffer(self, layer_id: int, *_: Any, **__: Any) -> torch.Tensor:
        """The layer's keys: the native tensor, or a logical view on packed pools.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMLATokenToKVPool
            >>> pool = kvcompat.compat(ReferenceMLATokenToKVPool(size=16, page_size=16))
            >>> pool.get_key_buffer(0).shape        # plain MLA rows: the native tensor
            torch.Size([32, 1, 576])
        """
        storage = self._kvcompat_adapter.get_key_buffer(layer_id)
        key = self._kvcompat_layer(layer_id, storage).key
        return storage if key is None else key

    def get_value_buffer(self, layer_id: int, *_: Any, **__: Any) -> torch.Tensor:
        """The layer's values: native, or a logical view whose last dim is the value dim.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
            >>> pool = kvcompat.compat(ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64))
            >>> pool.get_value_buffer(0).shape[-1]     # a v_head_dim probe: 512, not 37440
            512
        """
        adapter = self._kvcompat_adapter
        value = adapter.get_value_buffer(layer_id)
        storage = adapter.get_key_buffer(layer_id, wait=False)
        view = self._kvcompat_layer(layer_id, storage).value
        return value if view is None else view

    def get_kv_buffer(self, layer_id: int, *_: Any, **__: Any) -> KVPair:
        """The layer's ``(key, value)`` pair (a 2-tuple with ``shared``/``component``).

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> native = ReferenceMHATokenToKVPool(16, 16)
            >>> k, v = kvcompat.compat(native).get_kv_buffer(0)
            >>> k is native.k_buffer[0], v is native.v_buffer[0]
            (True, True)
        """
        adapter = self._kvcompat_adapter
        native_pair = adapter.get_kv_buffer(layer_id)
        storage = adapter.get_key_buffer(layer_id, wait=False)
        pair = self._kvcompat_layer(layer_id, storage).pair
        return native_pair if pair is None else pair

    def set_kv_buffer(
        self,
        layer: Any,
        loc: Any,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor | None = None,
        k_scale: float | None = None,
        v_scale: float | None = None,
        layer_id_override: int | None = None,
        swa_loc: torch.Tensor | None = None,
        **_: Any,
    ) -> None:
        """Store ``cache_k`` (and ``cache_v``) at ``loc`` through kvcompat's quantizing write.

        ``loc`` is a tensor or SGLang's ``KVWriteLoc``, and means the same token it means
        in this proxy's gathers (see ``docs/port-backend.md``, "One location space"): on a
        composite's sliding-window layers with logical views (every layer of
        ``DeepSeekV4TokenToKVPool``) a plain full-pool ``loc`` is translated with the pool's
        own ``translate_loc_from_full_to_swa``, as the views' gathers are; a ``swa_loc``
        (``KVWriteLoc.swa_loc``, or 0.5.13's keyword) is the caller's own translation and
        is used as given. Where the getters are native tensors indexed by SWA slot
        (``SWAKVPool``), a plain ``loc`` is refused unless SWA slots are full-pool slots
        (``swa_uses_full_indices``). On ``HiSparseC4DevicePool`` ``loc`` is a compressed
        location, translated to its device slot. Scales divide copies of the inputs; on
        pools whose value lives inside the key row (latent, single-KV) ``cache_v`` is
        ignored, as SGLang's MLA pool ignores it.

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
        adapter = self._kvcompat_adapter
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
        storage = adapter.get_key_buffer(layer_id, wait=False)
        space = self._kvcompat_layer(layer_id, storage).space
        token_loc = space.write_loc(loc, swa_loc, layer_id)
        key = cache_k if k_scale in (None, 1.0) else cache_k / k_scale
        value = None
        if _routes_to(adapter, layer_id, PoolKind.SPLIT):
            value = cache_v if v_scale in (None, 1.0) or cache_v is None else cache_v / v_scale
        adapter.write(layer_id, token_loc, key, value)

    def __repr__(self) -> str:
        return f"<kvcompat CompatPool over {type(self._kvcompat_adapter.native).__qualname__}>"


def _routes_to(adapter: KVPoolProtocol, layer_id: int, kind: PoolKind) -> bool:
    if adapter.kind is not PoolKind.COMPOSITE:
        return adapter.kind is kind
    part = adapter.component_for(layer_id)
    return part is not None and adapter.components[part].kind is kind


_types_lock = threading.Lock()
_proxy_types: dict[type, type] = {}


def _proxy_type(native_cls: type) -> type:
    found = _proxy_types.get(native_cls)
    if found is not None:
        return found
    namespace: dict[str, Any] = {
        "__slots__": ("_kvcompat_adapter", "_kvcompat_layers"),
        "__module__": __name__,
        "__qualname__": f"Compat{native_cls.__qualname__}",
        "__doc__": f"kvcompat's compat proxy over {native_cls.__qualname__} (see CompatPool).",
        PROXY_MARKER: True,
    }
    if hasattr(native_cls, "__del__"):
        namespace["__del__"] = _no_finalizer  # the native pool owns (and finalizes) its state
    made = types.new_class(
        f"Compat{native_cls.__name__}",
        (CompatPool, native_cls),
        exec_body=lambda ns: ns.update(namespace),
    )
    with _types_lock:
        return _proxy_types.setdefault(native_cls, made)


def _no_finalizer(self: Any) -> None:
    """A proxy's finalizer: nothing (the native pool's state is not the proxy's to free)."""


def _register_with_kv_canary(native_cls: type, proxy_cls: type) -> None:
    """Let SGLang's kv_canary (an exact-type registry) attach to the proxy as to the native pool.

    Only when SGLang's kv_canary module is already imported: kvcompat never imports it.
    """
    api = sys.modules.get(_KV_CANARY)
    if api is None:
        return
    attachers = getattr(api, "_POOL_ATTACHERS", None)
    register = getattr(api, "register_pool_attacher", None)
    if not isinstance(attachers, dict) or register is None or proxy_cls in attachers:
        return
    attacher = attachers.get(native_cls)
    if attacher is not None:
        register(proxy_cls, attacher)


def compat(pool: Any) -> Any:
    """Wrap a pool so code written against the native MHA interface runs on it, honestly.

    Returns an instance of the native pool's class (a generated subclass that shares the
    pool's state, see :class:`CompatPool`); calling it again on the proxy returns the proxy.
    Build it once per pool (it adapts the pool: about as costly as :func:`kvcompat.adapt`).

    Raises:
        UnsupportedPoolError: ``pool`` is not a pool kvcompat knows.

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
        >>> native = ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64)
        >>> pool = kvcompat.compat(native)
        >>> isinstance(pool, type(native)), kvcompat.is_single_kv_pool(pool)
        (True, True)
        >>> kvcompat.adapt(pool) is pool.kvcompat, kvcompat.compat(pool) is pool
        (True, True)
    """
    if isinstance(pool, CompatPool):
        return pool
    adapter = adapt(pool)
    native = adapter.native
    if isinstance(native, CompatPool):  # an adapter of a proxy's native pool
        return native
    state = getattr(native, "__dict__", None)
    if not isinstance(state, dict):
        msg = (
            f"kvcompat.compat() shares the pool's instance state, but "
            f"{type(native).__qualname__} has no instance __dict__ (it uses __slots__).\n"
            "Hint: use the key-first adapter instead: kvcompat.adapt(pool)."
        )
        raise UnsupportedPoolError(msg)
    native_cls = type(native)
    proxy_cls = _proxy_type(native_cls)
    proxy: Any = object.__new__(proxy_cls)
    object.__setattr__(proxy, "__dict__", state)
    object.__setattr__(proxy, "_kvcompat_adapter", adapter)
    object.__setattr__(proxy, "_kvcompat_layers", {})
    _register_with_kv_canary(native_cls, proxy_cls)
    return proxy
