"""Adapters for leaf pools: pools that own one tensor (or a K/V pair) per layer.

A leaf adapter resolves everything it can when it is built: for every served
layer it keeps the key tensor, the value tensor and the :class:`KVPair`,
already viewed as the logical dtype. The getter's per-call work is an ``int``
check, a dict lookup, an identity check that the native buffer list was not
replaced, and the native pool's layer-transfer wait when one is registered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar

import torch

from kvcompat._errors import LayoutError, NoValueBufferError
from kvcompat._protocol import KVPair, KVPoolProtocol, PoolKind
from kvcompat.adapters._layers import coerce_layer_id, describe_ids, raise_unserved

__all__ = [
    "IndexKeyAdapter",
    "KeyOnlyAdapter",
    "LatentAdapter",
    "LeafAdapter",
    "SingleKVAdapter",
    "SplitAdapter",
    "as_logical",
    "default_slots",
]

_NO_COMPONENTS: Mapping[str, KVPoolProtocol] = MappingProxyType({})


def as_logical(buffer: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """View ``buffer`` as the pool's logical dtype when only the element type differs.

    SGLang stores fp8 pools as ``uint8`` and views them back on every get; the
    view is free (no copy). Buffers whose element size differs from the logical
    dtype (packed layouts) are returned unchanged.

    Example:
        >>> import torch
        >>> raw = torch.zeros(4, 8, dtype=torch.uint8)
        >>> as_logical(raw, torch.float8_e4m3fn).dtype
        torch.float8_e4m3fn
        >>> as_logical(raw, torch.bfloat16).dtype  # 1 byte vs 2 bytes: left alone
        torch.uint8
    """
    if buffer.dtype == dtype or buffer.dtype.itemsize != dtype.itemsize:
        return buffer
    return buffer.view(dtype)


def default_slots(native: Any, buffers: Sequence[Any]) -> dict[int, int]:
    """Absolute layer id -> index into the per-layer buffer list, for a standalone pool.

    A pool built for a pipeline stage serves layers ``start_layer ..
    start_layer + len(buffers) - 1``. (SGLang's ``end_layer`` defaults to
    ``layer_num - 1`` whatever ``start_layer`` is, so it is not trusted.)

    Example:
        >>> from types import SimpleNamespace
        >>> default_slots(SimpleNamespace(start_layer=4), [None, None])
        {4: 0, 5: 1}
    """
    start = getattr(native, "start_layer", 0) or 0
    return {start + index: index for index in range(len(buffers))}


class LeafAdapter:
    """Base of every leaf adapter; subclasses say where the buffers live.

    Subclasses set :attr:`kind`, :attr:`source_attr` (the native attribute
    holding the per-layer buffer list) and implement :meth:`_build`.

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool
        >>> pool = kvcompat.adapt(ReferenceMHATokenToKVPool(size=16, page_size=16, layer_num=2))
        >>> isinstance(pool, kvcompat.adapters.LeafAdapter), pool.layer_ids
        (True, (0, 1))
    """

    kind: PoolKind
    """How the pool stores keys and values (fixed per adapter class)."""
    source_attr: ClassVar[str]
    """The native attribute holding the per-layer buffer list."""
    native_waits: ClassVar[bool] = True
    """Whether the native getters wait on ``layer_transfer_counter``."""
    returns: ClassVar[tuple[str, str]] = ("", "")
    """What ``get_key_buffer`` and ``get_value_buffer`` return, in words (for the docs)."""

    __slots__ = (
        "_component",
        "_keys",
        "_name",
        "_native",
        "_pairs",
        "_slots",
        "_source",
        "_values",
        "_wait_index",
        "_wait_owner",
        "_waits",
    )

    def __init__(
        self,
        native: Any,
        *,
        slots: Mapping[int, int] | None = None,
        name: str | None = None,
        component: str | None = None,
        waits: bool | None = None,
        wait_owner: Any = None,
        wait_index: Mapping[int, int] | None = None,
    ) -> None:
        self._native = native
        self._name = name or component or type(native).__name__
        self._component = component
        # Whose layer_transfer_counter the getters wait on, and with which index per layer:
        # the pool itself with the storage slot (what SGLang's leaf getters do), or - for a
        # composite's part - the composite, which is where SGLang registers the counter.
        self._wait_owner = native if wait_owner is None else wait_owner
        if waits is None:
            waits = self.native_waits if wait_owner is None else True
        self._waits = waits
        source = getattr(native, self.source_attr, None)
        if source is None:
            msg = (
                f"{type(native).__qualname__} has no {self.source_attr!r} buffer list; "
                f"kvcompat's {type(self).__name__} reads the layer buffers from it.\n"
                "Hint: adapt the pool after its buffers are allocated."
            )
            raise LayoutError(msg)
        self._slots: dict[int, int] = dict(
            default_slots(native, source) if slots is None else slots
        )
        self._wait_index: dict[int, int] = self._slots if wait_index is None else dict(wait_index)
        self._source: Any = None
        self._keys: dict[int, torch.Tensor] = {}
        self._values: dict[int, torch.Tensor] = {}
        self._pairs: dict[int, KVPair] = {}
        self._refresh()

    # -- table building ---------------------------------------------------------

    def _build(self, source: Sequence[torch.Tensor], slot: int) -> tuple[torch.Tensor, Any]:
        """Return ``(key, value)`` for one storage slot; value None for key-only pools."""
        raise NotImplementedError

    def _refresh(self) -> None:
        source = getattr(self._native, self.source_attr)
        count = len(source)
        bad = sorted(layer for layer, slot in self._slots.items() if not 0 <= slot < count)
        if bad:
            msg = (
                f"{self._name}: layers {bad} map to buffer slots outside the "
                f"{count} buffers of {type(self._native).__qualname__}.{self.source_attr}."
            )
            raise LayoutError(msg)
        keys: dict[int, torch.Tensor] = {}
        values: dict[int, torch.Tensor] = {}
        pairs: dict[int, KVPair] = {}
        shared = self.kind.value_aliases_key
        for layer in sorted(self._slots):
            key, value = self._build(source, self._slots[layer])
            keys[layer] = key
            if value is not None:
                values[layer] = value
                pairs[layer] = KVPair(key, value, shared=shared, component=self._component)
        self._keys, self._values, self._pairs = keys, values, pairs
        self._source = source

    def _stale(self) -> bool:
        return getattr(self._native, self.source_attr) is not self._source

    # -- the hot path -----------------------------------------------------------

    def get_key_buffer(self, layer_id: int, /, *, wait: bool = True) -> torch.Tensor:
        """The layer's key storage (the very tensor the native pool holds).

        Args:
            layer_id: absolute model layer id.
            wait: perform the native getter's layer-transfer wait (attention
                backends); pass False to inspect without waiting (profilers).

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMLATokenToKVPool
            >>> native = ReferenceMLATokenToKVPool(size=16, page_size=16, layer_num=2)
            >>> kvcompat.adapt(native).get_key_buffer(1) is not None
            True
        """
        if type(layer_id) is not int:
            layer_id = coerce_layer_id(layer_id, self._name)
        if getattr(self._native, self.source_attr) is not self._source:
            self._refresh()
        try:
            key = self._keys[layer_id]
        except KeyError:
            raise_unserved(layer_id, self._name, self._slots)
        if wait and self._waits:
            counter = getattr(self._wait_owner, "layer_transfer_counter", None)
            if counter is not None:
                counter.wait_until(self._wait_index[layer_id])
        return key

    def get_value_buffer(self, layer_id: int, /, *, wait: bool = True) -> torch.Tensor:
        """The layer's value storage; on single-KV pools, the key storage itself.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
            >>> pool = kvcompat.adapt(ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64))
            >>> pool.get_value_buffer(0) is pool.get_key_buffer(0)
            True
        """
        if type(layer_id) is not int:
            layer_id = coerce_layer_id(layer_id, self._name)
        if getattr(self._native, self.source_attr) is not self._source:
            self._refresh()
        try:
            value = self._values[layer_id]
        except KeyError:
            self._missing_value(layer_id)
        if wait and self._waits:
            counter = getattr(self._wait_owner, "layer_transfer_counter", None)
            if counter is not None:
                counter.wait_until(self._wait_index[layer_id])
        return value

    def get_kv_buffer(self, layer_id: int, /, *, wait: bool = True) -> KVPair:
        """The layer's ``(key, value)`` pair; ``pair.shared`` says if they alias.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> pool = kvcompat.adapt(ReferenceMHATokenToKVPool(size=16, page_size=16, layer_num=1))
            >>> k, v = pool.get_kv_buffer(0)
            >>> pool.get_kv_buffer(0).shared
            False
        """
        if type(layer_id) is not int:
            layer_id = coerce_layer_id(layer_id, self._name)
        if getattr(self._native, self.source_attr) is not self._source:
            self._refresh()
        try:
            pair = self._pairs[layer_id]
        except KeyError:
            self._missing_value(layer_id)
        if wait and self._waits:
            counter = getattr(self._wait_owner, "layer_transfer_counter", None)
            if counter is not None:
                counter.wait_until(self._wait_index[layer_id])
        return pair

    def _missing_value(self, layer_id: int) -> None:
        if layer_id not in self._slots:
            raise_unserved(layer_id, self._name, self._slots)
        msg = (
            f"{self._name} ({type(self._native).__qualname__}) stores keys only: it has no "
            f"value buffer for layer {layer_id}.\n"
            "Hint: call get_key_buffer(layer_id); check kvcompat.pool_kind(pool).has_values "
            "before asking for values."
        )
        raise NoValueBufferError(msg)

    # -- metadata ---------------------------------------------------------------

    @property
    def name(self) -> str:
        """The native class name, or the component name inside a composite.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> kvcompat.adapt(ReferenceMHATokenToKVPool(size=16, page_size=16, layer_num=1)).name
            'ReferenceMHATokenToKVPool'
        """
        return self._name

    @property
    def layer_ids(self) -> tuple[int, ...]:
        """The absolute model layer ids this pool serves, ascending.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> native = ReferenceMHATokenToKVPool(16, 16, layer_num=2, start_layer=4)
            >>> kvcompat.adapt(native).layer_ids
            (4, 5)
        """
        return tuple(sorted(self._slots))

    @property
    def storage_slots(self) -> Mapping[int, int]:
        """Absolute layer id -> index into the native per-layer buffer list.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> native = ReferenceMHATokenToKVPool(16, 16, layer_num=2, start_layer=4)
            >>> dict(kvcompat.adapt(native).storage_slots)
            {4: 0, 5: 1}
        """
        return MappingProxyType(self._slots)

    @property
    def size(self) -> int:
        """Token capacity as the native pool reports it (``pool.size``).

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> kvcompat.adapt(ReferenceMHATokenToKVPool(size=16, page_size=16, layer_num=1)).size
            16
        """
        return int(self._native.size)

    @property
    def page_size(self) -> int:
        """Tokens per page.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> kvcompat.adapt(ReferenceMHATokenToKVPool(size=16, page_size=8)).page_size
            8
        """
        return int(self._native.page_size)

    @property
    def dtype(self) -> torch.dtype:
        """Logical element dtype (``float8_e4m3fn`` even when stored as ``uint8``).

        Example:
            >>> import torch, kvcompat
            >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
            >>> kvcompat.adapt(ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64)).dtype
            torch.float8_e4m3fn
        """
        dtype: torch.dtype = self._native.dtype
        return dtype

    @property
    def device(self) -> torch.device:
        """Device holding the storage.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> kvcompat.adapt(ReferenceMHATokenToKVPool(size=16, page_size=16, layer_num=1)).device
            device(type='cpu')
        """
        for key in self._keys.values():
            return key.device
        return torch.device(self._native.device)

    @property
    def native(self) -> Any:
        """The wrapped native pool object, unchanged.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> native = ReferenceMHATokenToKVPool(size=16, page_size=16, layer_num=1)
            >>> kvcompat.adapt(native).native is native
            True
        """
        return self._native

    @property
    def components(self) -> Mapping[str, KVPoolProtocol]:
        """Empty: a leaf pool has no parts.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> len(kvcompat.adapt(ReferenceMHATokenToKVPool(size=16, page_size=16)).components)
            0
        """
        return _NO_COMPONENTS

    def component_for(self, layer_id: int, /) -> str | None:
        """The component serving ``layer_id``: this pool's component name, or None.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> pool = kvcompat.adapt(ReferenceMHATokenToKVPool(size=16, page_size=16))
            >>> print(pool.component_for(0))
            None
        """
        if type(layer_id) is not int:
            layer_id = coerce_layer_id(layer_id, self._name)
        if layer_id not in self._slots:
            raise_unserved(layer_id, self._name, self._slots)
        return self._component

    @property
    def component_name(self) -> str | None:
        """The component name this adapter carries (None for a standalone pool).

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import reference_swa_pool
            >>> kvcompat.adapt(reference_swa_pool()).components["full"].component_name
            'full'
        """
        return self._component

    @property
    def wait_plan(self) -> tuple[Any, Mapping[int, int]]:
        """``(owner, index by layer)``: getters call ``owner.layer_transfer_counter.wait_until``.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> native = ReferenceMHATokenToKVPool(16, 16, layer_num=2, start_layer=4)
            >>> owner, index = kvcompat.adapt(native).wait_plan
            >>> owner is native, dict(index)
            (True, {4: 0, 5: 1})
        """
        return self._wait_owner, MappingProxyType(self._wait_index)

    @property
    def waits(self) -> bool:
        """Whether the getters perform the native layer-transfer wait (when asked to).

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
            >>> kvcompat.adapt(ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64)).waits
            False
        """
        return self._waits

    def __repr__(self) -> str:
        return (
            f"<kvcompat {type(self).__name__} kind={self.kind.value} "
            f"native={type(self._native).__qualname__} layers={describe_ids(self._slots)}>"
        )


class SplitAdapter(LeafAdapter):
    """Separate K and V tensors per layer (``k_buffer`` / ``v_buffer``), e.g. MHA.

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool
        >>> pool = kvcompat.adapt(ReferenceMHATokenToKVPool(size=16, page_size=16, layer_num=1))
        >>> type(pool).__name__, pool.kind.value
        ('SplitAdapter', 'split')
    """

    kind = PoolKind.SPLIT
    source_attr = "k_buffer"
    returns = (
        "``k_buffer[slot]`` viewed as the logical dtype",
        "``v_buffer[slot]`` viewed as the logical dtype",
    )
    __slots__ = ()

    def _build(self, source: Sequence[torch.Tensor], slot: int) -> tuple[torch.Tensor, Any]:
        dtype = self._native.dtype
        values = self._native.v_buffer
        return as_logical(source[slot], dtype), as_logical(values[slot], dtype)


class LatentAdapter(LeafAdapter):
    """One latent row per token; V is the first ``kv_lora_rank`` columns (MLA, DSA).

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import ReferenceMLATokenToKVPool
        >>> pool = kvcompat.adapt(ReferenceMLATokenToKVPool(size=16, page_size=16, layer_num=1))
        >>> k, v = pool.get_kv_buffer(0)
        >>> (k.shape[-1], v.shape[-1], v.data_ptr() == k.data_ptr())
        (576, 512, True)
    """

    kind = PoolKind.LATENT
    source_attr = "kv_buffer"
    returns = (
        "the full latent row ``kv_buffer[slot]`` (logical dtype)",
        "its first ``kv_lora_rank`` columns, a view of the same storage",
    )
    __slots__ = ()

    def _build(self, source: Sequence[torch.Tensor], slot: int) -> tuple[torch.Tensor, Any]:
        dtype = self._native.dtype
        rank = int(self._native.kv_lora_rank)
        raw = source[slot]
        # Same expressions as SGLang's getters: slice the stored row, then view.
        return as_logical(raw, dtype), as_logical(raw[..., :rank], dtype)


class SingleKVAdapter(LeafAdapter):
    """One packed page-major buffer per layer; the value is the key storage (DSv4).

    The key is the ``[num_pages, page_bytes]`` buffer typed as the pool's logical
    dtype, as SGLang 0.5.23's getter returns it (older releases returned the
    ``uint8`` tensor itself: same storage, shape and strides).

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
        >>> pool = kvcompat.adapt(ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64))
        >>> pool.get_key_buffer(0).shape
        torch.Size([2, 37440])
    """

    kind = PoolKind.SINGLE_KV
    source_attr = "kv_buffer"
    native_waits = False
    returns = (
        "the packed page-major ``kv_buffer[slot]`` typed as the logical dtype",
        "the same tensor as the key (the storage is shared)",
    )
    __slots__ = ()

    def _build(self, source: Sequence[torch.Tensor], slot: int) -> tuple[torch.Tensor, Any]:
        key = as_logical(source[slot], self._native.dtype)
        return key, key


class KeyOnlyAdapter(LeafAdapter):
    """Keys only: ``get_value_buffer`` raises :class:`kvcompat.NoValueBufferError`.

    Subclasses choose the buffer attribute (``k_buffer`` for SGLang's
    ``MHATokenToKOnlyPool``, ``index_k_with_scale_buffer`` for the DSv4 indexer).

    Example:
        >>> import kvcompat
        >>> kvcompat.PoolKind.KEY_ONLY.has_values
        False
    """

    kind = PoolKind.KEY_ONLY
    source_attr = "k_buffer"
    returns = (
        "``k_buffer[slot]`` viewed as the logical dtype",
        "raises ``NoValueBufferError`` (a ``NotImplementedError``)",
    )
    __slots__ = ()

    def _build(self, source: Sequence[torch.Tensor], slot: int) -> tuple[torch.Tensor, Any]:
        return as_logical(source[slot], self._native.dtype), None


class IndexKeyAdapter(KeyOnlyAdapter):
    """DeepSeek-V4 indexer keys: packed ``uint8`` pages of e4m3/e2m1 keys and scales.

    The buffer is returned as stored (``uint8``): its bytes mix payload and
    scales, so no element dtype describes it.

    Example:
        >>> from kvcompat.adapters import IndexKeyAdapter
        >>> IndexKeyAdapter.source_attr
        'index_k_with_scale_buffer'
    """

    source_attr = "index_k_with_scale_buffer"
    native_waits = False
    returns = (
        "the packed ``uint8`` ``index_k_with_scale_buffer[slot]`` (keys, then scales)",
        "raises ``NoValueBufferError`` (a ``NotImplementedError``)",
    )
    __slots__ = ()

    def _build(self, source: Sequence[torch.Tensor], slot: int) -> tuple[torch.Tensor, Any]:
        return source[slot], None
