"""The uniform, key-first API every kvcompat adapter implements.

This module holds only small value types and the protocol; it imports nothing
heavier than torch and never imports an engine.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from kvcompat.adapters._io import LayerLayout

__all__ = ["Impl", "KVPair", "KVPoolProtocol", "PoolKind", "SupportsGetKeyBuffer"]

Impl = Literal["auto", "torch", "triton"]
"""Codec implementation: ``"auto"`` (Triton for CUDA tensors when importable), or forced."""


class PoolKind(str, enum.Enum):
    """How a pool stores keys and values.

    ``SPLIT``
        Separate key and value tensors per layer (SGLang ``MHATokenToKVPool``).
    ``LATENT``
        One latent row per token; the value is a prefix view of the key row
        (``MLATokenToKVPool``, ``DSATokenToKVPool``).
    ``SINGLE_KV``
        One packed buffer holds key and value; the value *is* the key storage
        (``DeepSeekV4SingleKVPool`` and subclasses).
    ``KEY_ONLY``
        Keys only, no values (``MHATokenToKOnlyPool``, ``DeepSeekV4IndexerPool``).
    ``COMPOSITE``
        Routes layers to sub-pools (``SWAKVPool``, ``HybridLinearKVPool``,
        ``DeepSeekV4TokenToKVPool``); each part is a pool of its own.

    Example:
        >>> from kvcompat import PoolKind
        >>> PoolKind("single_kv") is PoolKind.SINGLE_KV
        True
        >>> PoolKind.SINGLE_KV.has_values, PoolKind.KEY_ONLY.has_values
        (True, False)
    """

    SPLIT = "split"
    LATENT = "latent"
    SINGLE_KV = "single_kv"
    KEY_ONLY = "key_only"
    COMPOSITE = "composite"

    @property
    def has_values(self) -> bool:
        """Whether ``get_value_buffer`` returns storage (False only for key-only pools).

        Example:
            >>> from kvcompat import PoolKind
            >>> [k.value for k in PoolKind if not k.has_values]
            ['key_only']
        """
        return self is not PoolKind.KEY_ONLY

    @property
    def value_aliases_key(self) -> bool:
        """Whether writing a value writes key storage too (latent and single-KV pools).

        Example:
            >>> from kvcompat import PoolKind
            >>> PoolKind.LATENT.value_aliases_key, PoolKind.SPLIT.value_aliases_key
            (True, False)
        """
        return self in (PoolKind.LATENT, PoolKind.SINGLE_KV)

    def __str__(self) -> str:
        return self.value


class KVPair(tuple[torch.Tensor, torch.Tensor]):
    """The ``(key, value)`` pair of one layer; unpacks like the native API.

    ``k, v = pair`` works exactly as with SGLang's ``get_kv_buffer``. On top of
    that the pair says whether the value storage is the key storage
    (``shared``) and, for composite pools, which component answered
    (``component``).

    Adapters build one pair per layer when a pool is adapted, so fetching one
    on the hot path allocates nothing.

    Example:
        >>> import torch
        >>> from kvcompat import KVPair
        >>> buf = torch.zeros(4, 1, 8)
        >>> pair = KVPair(buf, buf[..., :6], shared=True)
        >>> k, v = pair
        >>> (k is buf, v.shape[-1], pair.shared, pair.component)
        (True, 6, True, None)
    """

    shared: bool
    """True when the value aliases key storage: writing one writes the other."""

    component: str | None
    """Name of the composite's component that answered, or None for a leaf pool."""

    def __new__(
        cls,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        shared: bool,
        component: str | None = None,
    ) -> KVPair:
        self = super().__new__(cls, (key, value))
        self.shared = bool(shared)
        self.component = component
        return self

    def __repr__(self) -> str:
        key, value = self
        return (
            f"KVPair(key={_describe(key)}, value={_describe(value)}, "
            f"shared={self.shared}, component={self.component!r})"
        )

    @property
    def key(self) -> torch.Tensor:
        """The key storage of the layer.

        Example:
            >>> import torch
            >>> from kvcompat import KVPair
            >>> buf = torch.zeros(2, 3)
            >>> KVPair(buf, buf, shared=True).key is buf
            True
        """
        return self[0]

    @property
    def value(self) -> torch.Tensor:
        """The value storage of the layer (the key storage itself on single-KV pools).

        Example:
            >>> import torch
            >>> from kvcompat import KVPair
            >>> k, v = torch.zeros(2, 3), torch.ones(2, 3)
            >>> KVPair(k, v, shared=False).value is v
            True
        """
        return self[1]


def _describe(tensor: Any) -> str:
    shape = getattr(tensor, "shape", None)
    dtype = getattr(tensor, "dtype", None)
    if shape is None:
        return repr(tensor)
    return f"Tensor(shape={tuple(shape)}, dtype={dtype})"


@runtime_checkable
class KVPoolProtocol(Protocol):
    """The uniform, key-first API over a KV-cache pool.

    Every object :func:`kvcompat.adapt` returns implements it. Layer ids are
    always *absolute model layer ids*; an id the pool does not serve raises
    :class:`kvcompat.LayerOutOfRangeError` (an ``IndexError``).

    The getters return the very storage the native pool holds (same
    ``data_ptr``, shape, strides and dtype), never a copy. With ``wait=True``
    (the default, for attention backends) they perform the same layer-transfer
    wait the native getter performs; with ``wait=False`` (for profilers and
    inspection) they wait on nothing. They never allocate and never run a
    collective.

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
        >>> pool = kvcompat.adapt(ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64))
        >>> isinstance(pool, kvcompat.KVPoolProtocol)
        True
        >>> k, v = pool.get_kv_buffer(0)
        >>> k is v, pool.kind
        (True, <PoolKind.SINGLE_KV: 'single_kv'>)
    """

    @property
    def kind(self) -> PoolKind:
        """How the pool stores keys and values."""
        ...

    @property
    def name(self) -> str:
        """The native class name, or the component name inside a composite."""
        ...

    @property
    def layer_ids(self) -> tuple[int, ...]:
        """The absolute model layer ids this pool serves, ascending."""
        ...

    @property
    def size(self) -> int:
        """Token capacity as the native pool reports it (``pool.size``)."""
        ...

    @property
    def page_size(self) -> int:
        """Tokens per page."""
        ...

    @property
    def dtype(self) -> torch.dtype:
        """Logical element dtype (e.g. ``float8_e4m3fn`` even when stored as uint8)."""
        ...

    @property
    def device(self) -> torch.device:
        """Device holding the storage."""
        ...

    @property
    def native(self) -> Any:
        """The wrapped native pool object, unchanged."""
        ...

    @property
    def components(self) -> Mapping[str, KVPoolProtocol]:
        """Named parts: a composite's sub-pools, or a leaf's own stores (DSA's ``indexer``)."""
        ...

    def get_key_buffer(self, layer_id: int, /, *, wait: bool = True) -> torch.Tensor:
        """The layer's key storage."""
        ...

    def get_value_buffer(self, layer_id: int, /, *, wait: bool = True) -> torch.Tensor:
        """The layer's value storage (the key storage on single-KV pools)."""
        ...

    def get_kv_buffer(self, layer_id: int, /, *, wait: bool = True) -> KVPair:
        """The layer's ``(key, value)`` pair with its ``shared`` flag."""
        ...

    def component_for(self, layer_id: int, /) -> str | None:
        """Which component serves the layer's primary buffer (None for a leaf pool)."""
        ...

    def layout(self, layer_id: int, /) -> LayerLayout:
        """The byte layouts of the layer's buffers (:class:`kvcompat.adapters.LayerLayout`)."""
        ...

    def read(
        self,
        layer_id: int,
        loc: torch.Tensor,
        /,
        *,
        out: torch.Tensor | None = None,
        wait: bool = True,
        validate: bool = True,
        impl: Impl = "auto",
    ) -> torch.Tensor:
        """Dense keys ``[n, heads, head_dim]`` of tokens ``loc``."""
        ...

    def read_kv(
        self,
        layer_id: int,
        loc: torch.Tensor,
        /,
        *,
        wait: bool = True,
        validate: bool = True,
        impl: Impl = "auto",
    ) -> KVPair:
        """Dense ``(keys, values)`` of tokens ``loc``."""
        ...

    def write(
        self,
        layer_id: int,
        loc: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor | None = None,
        /,
        *,
        check_finite: bool = True,
        validate: bool = True,
        impl: Impl = "auto",
    ) -> None:
        """Quantize and store keys (and values) at tokens ``loc``, all or nothing."""
        ...

    def plan(self, layers: Sequence[int] | None = None, /) -> Any:
        """Several layers planned once (``LayerPlan``): read/write them in one launch."""
        ...

    def read_layers(
        self,
        layers: Sequence[int] | None,
        loc: torch.Tensor,
        /,
        *,
        out: torch.Tensor | None = None,
        wait: bool = True,
        validate: bool = True,
        impl: Impl = "auto",
    ) -> torch.Tensor:
        """Dense keys ``[layers, n, heads, head_dim]`` of tokens ``loc`` on several layers."""
        ...

    def write_layers(
        self,
        layers: Sequence[int] | None,
        loc: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor | None = None,
        /,
        *,
        check_finite: bool = True,
        validate: bool = True,
        impl: Impl = "auto",
    ) -> None:
        """Store ``key[i]`` (and ``value[i]``) at ``loc`` of layer ``layers[i]``, all or nothing."""
        ...


class SupportsGetKeyBuffer(Protocol):
    """Anything with a ``get_key_buffer(layer_id)``: native pools and kvcompat adapters.

    The detectors narrow to this type (or to a class of it).

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool
        >>> pool: kvcompat.SupportsGetKeyBuffer = ReferenceMHATokenToKVPool(
        ...     size=16, page_size=16, layer_num=1
        ... )
        >>> pool.get_key_buffer(0).shape
        torch.Size([32, 1, 128])
    """

    def get_key_buffer(self, layer_id: int, /) -> torch.Tensor:
        """The layer's key storage."""
        ...
