"""Adapters for leaf pools: pools that own one tensor (or a K/V pair) per layer.

A leaf adapter resolves everything it can when it is built: for every served
layer it keeps the key tensor, the value tensor and the :class:`KVPair`,
already viewed as the logical dtype, together with the native list entry each
was made from. The getter's per-call work is an ``int`` check, a dict lookup,
one identity check that the native list still holds that very tensor (which
catches a replaced list, ``pool.k_buffer[i] = new_tensor``, and a replaced
``v_buffer``), and the native pool's layer-transfer wait when one is
registered. When the check fails the tables are rebuilt from the pool; when the
buffers are gone (SGLang's ``_clear_buffers()``) the getter raises
:class:`~kvcompat.PoolStateError`.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar

import torch

from kvcompat._errors import (
    KVCompatError,
    LayoutError,
    NoValueBufferError,
    PoolStateError,
    WriteError,
)
from kvcompat._protocol import KVPair, KVPoolProtocol, PoolKind
from kvcompat.adapters._base import AdapterBase, Buffer, require_attrs
from kvcompat.adapters._io import (
    Impl,
    LayerLayout,
    latent_layer_layout,
    mha_layer_layout,
    packed_layer_layout,
    plan_write,
    read_rows,
    write_rows,
)
from kvcompat.adapters._layers import coerce_layer_id, describe_ids, raise_unserved
from kvcompat.adapters._multi import LayerPlan, aliases_key, layer_tuple
from kvcompat.layouts import (
    DSV4_INDEXER_FP4,
    DSV4_INDEXER_FP4_RNE,
    DSV4_INDEXER_FP8,
    LayoutSpec,
    get_layout,
)
from kvcompat.layouts._registry import KV_LAYOUT_NAMES

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


def _static(native: Any, name: str, default: Any = None) -> Any:
    """A plain attribute of ``native`` (instance or class), running no property or getter."""
    try:
        found = inspect.getattr_static(native, name)
    except AttributeError:
        return default
    return default if isinstance(found, (property, staticmethod, classmethod)) else found


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


class LeafAdapter(AdapterBase):
    """Base of every leaf adapter; subclasses say where the buffers live.

    Subclasses set :attr:`kind`, :attr:`source_attr` (the native attribute
    holding the per-layer buffer list) and :attr:`buffers` (what ``describe`` and the
    transfer descriptors report), and implement the public hooks
    :meth:`layer_buffers` (one layer's key and value storage) and, for
    ``read``/``write``, :meth:`detect_layout` (one layer's byte layouts).

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
    value_attr: ClassVar[str | None] = None
    """The native attribute holding a *separate* per-layer value list (``v_buffer``), if any."""
    native_waits: ClassVar[bool] = True
    """Whether the native getters wait on ``layer_transfer_counter``."""
    returns: ClassVar[tuple[str, str]] = ("", "")
    """What ``get_key_buffer`` and ``get_value_buffer`` return, in words (for the docs)."""
    native_attrs: ClassVar[tuple[str, ...]] = ("dtype", "page_size")
    """Plain attributes the adapter reads from the pool besides its buffer lists; a pool
    without one of them (or of :attr:`source_attr` / :attr:`value_attr`) is refused
    with :class:`~kvcompat.PoolStateError` naming every missing one."""

    __slots__ = (
        "_component",
        "_keys",
        "_layer_plans",
        "_layouts",
        "_name",
        "_native",
        "_pairs",
        "_slots",
        "_source",
        "_value_source",
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
        self._require()
        source = self._buffer_list(self.source_attr)
        self._slots: dict[int, int] = dict(
            default_slots(native, source) if slots is None else slots
        )
        self._wait_index: dict[int, int] = self._slots if wait_index is None else dict(wait_index)
        self._source: Any = None
        self._value_source: Any = None
        # layer -> (tensor, slot, native entry it was made from); pairs carry both entries.
        self._keys: dict[int, tuple[torch.Tensor, int, Any]] = {}
        self._values: dict[int, tuple[torch.Tensor, int, Any]] = {}
        self._pairs: dict[int, tuple[KVPair, int, Any, Any]] = {}
        self._layouts: dict[int, LayerLayout] = {}
        self._layer_plans: dict[tuple[int, ...], LayerPlan] = {}
        self._refresh()

    # -- table building ---------------------------------------------------------

    def layer_buffers(
        self, source: Sequence[torch.Tensor], slot: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Public hook: ``(key, value)`` storage of one slot; value None for key-only pools.

        ``source`` is the native ``source_attr`` list. Return the native tensors
        themselves (or views of them), never copies. Called when the adapter is built
        and whenever the native list is replaced.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> native = ReferenceMHATokenToKVPool(size=16, page_size=16, layer_num=1)
            >>> key, value = kvcompat.adapt(native).layer_buffers(native.k_buffer, 0)
            >>> key is native.k_buffer[0]
            True
        """
        return self._build(source, slot)

    def _build(self, source: Sequence[torch.Tensor], slot: int) -> tuple[torch.Tensor, Any]:
        msg = f"{type(self).__name__} must implement layer_buffers(source, slot)."
        raise NotImplementedError(msg)

    def detect_layout(
        self, layer_id: int, key: torch.Tensor, value: torch.Tensor | None
    ) -> LayerLayout:
        """Public hook: the byte layouts of one layer's buffers (``read``/``write`` use them).

        The built-in adapters detect them from the pool's attributes and geometry; a new
        storage scheme returns its :class:`~kvcompat.adapters.LayerLayout` of
        :mod:`kvcompat.layouts` specs. Raise :class:`~kvcompat.LayoutError` when there
        is no codec for the layer. Called once per layer (the answer is cached).

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMLATokenToKVPool
            >>> pool = kvcompat.adapt(ReferenceMLATokenToKVPool(size=16, page_size=16))
            >>> pool.detect_layout(0, pool.get_key_buffer(0), None).value_dim
            512
        """
        msg = (
            f"{self._name}: {type(self).__name__} declares no byte layout for its buffers, so "
            "read() and write() have no codec.\n"
            "Hint: override detect_layout(layer_id, key, value) to return a "
            "kvcompat.adapters.LayerLayout of kvcompat.layouts specs (docs/extending.md)."
        )
        raise LayoutError(msg)

    @classmethod
    def layout_name(cls, native: Any) -> str | None:
        """Public hook: the layout name ``describe`` shows when no layer layout can be had.

        ``describe`` names a pool's layout by its first layer's
        ``layout(l).key.name``; when the adapter cannot be built (buffers not allocated)
        or the layer has no codec, it asks this hook instead. Implementations read plain
        attributes only (``inspect.getattr_static``: no property, no getter runs). The
        default is None (unknown).

        Example:
            >>> from kvcompat.adapters import LeafAdapter
            >>> LeafAdapter.layout_name(object()) is None
            True
        """
        return None

    def _require(self) -> None:
        attrs = (self.source_attr, *((self.value_attr,) if self.value_attr else ()))
        reader = f"kvcompat's {type(self).__name__} ({self._name})"
        require_attrs(self._native, (*attrs, *self.native_attrs), reader=reader)

    def _buffer_list(self, attr: str) -> Any:
        """The native per-layer list ``attr``, or :class:`~kvcompat.PoolStateError`."""
        try:
            found = getattr(self._native, attr)
        except AttributeError:
            found = None
        if found is None:
            msg = (
                f"{type(self._native).__qualname__} has no {attr!r} buffer list (released or "
                f"not allocated); kvcompat's {type(self).__name__} ({self._name}) reads the "
                "layer buffers from it.\n"
                "Hint: adapt the pool after its buffers are allocated, and do not use the "
                "adapter after the pool's _clear_buffers(); adapt the pool again once it "
                "has buffers."
            )
            raise PoolStateError(msg)
        if not hasattr(found, "__getitem__") or not hasattr(found, "__len__"):
            msg = (
                f"{type(self._native).__qualname__}.{attr} is a {type(found).__name__}, not a "
                "list of per-layer tensors.\nHint: keep one tensor per layer in it."
            )
            raise PoolStateError(msg)
        return found

    def _entry(self, listing: Any, attr: str, slot: int) -> torch.Tensor:
        try:
            entry = listing[slot]
        except (IndexError, KeyError, TypeError):
            entry = None
        if not isinstance(entry, torch.Tensor):
            msg = (
                f"{self._name}: {type(self._native).__qualname__}.{attr}[{slot}] is "
                f"{type(entry).__name__}, not a tensor (list of {len(listing)} entries).\n"
                "Hint: replace a layer's buffer with a tensor of the same layout, or adapt "
                "the pool again after rebuilding its buffers."
            )
            raise PoolStateError(msg)
        return entry

    def _refresh(self) -> None:
        self._require()
        source = self._buffer_list(self.source_attr)
        values = None if self.value_attr is None else self._buffer_list(self.value_attr)
        for attr, listing in ((self.source_attr, source), (self.value_attr, values)):
            if listing is not None:
                self._check_slots(str(attr), len(listing))
        keys: dict[int, tuple[torch.Tensor, int, Any]] = {}
        value_table: dict[int, tuple[torch.Tensor, int, Any]] = {}
        pairs: dict[int, tuple[KVPair, int, Any, Any]] = {}
        shared = self.kind.value_aliases_key
        for layer in sorted(self._slots):
            slot = self._slots[layer]
            raw_key = self._entry(source, self.source_attr, slot)
            raw_value = (
                raw_key if values is None else self._entry(values, str(self.value_attr), slot)
            )
            try:
                key, value = self.layer_buffers(source, slot)
            except KVCompatError:
                raise
            except (AttributeError, TypeError, ValueError, RuntimeError) as exc:
                msg = (
                    f"{self._name}: cannot read layer {layer}'s buffers from "
                    f"{type(self._native).__qualname__} ({type(exc).__name__}: {exc}).\n"
                    "Hint: is the pool fully built? Adapt it after its constructor returns."
                )
                raise PoolStateError(msg) from exc
            keys[layer] = (key, slot, raw_key)
            if value is not None:
                value_table[layer] = (value, slot, raw_value)
                pair = KVPair(key, value, shared=shared, component=self._component)
                pairs[layer] = (pair, slot, raw_key, raw_value)
        self._keys, self._values, self._pairs = keys, value_table, pairs
        self._layouts = {}
        self._source, self._value_source = source, values

    def _check_slots(self, attr: str, count: int) -> None:
        bad = {layer: slot for layer, slot in self._slots.items() if not 0 <= slot < count}
        if not bad:
            return
        where = f"{type(self._native).__qualname__}.{attr}"
        outside = (
            f"layers {sorted(bad)} map to slots {sorted(set(bad.values()))}, outside the "
            f"{count} buffer{'' if count == 1 else 's'} of {where}"
        )
        if self._source is None:  # building the adapter: the pool disagrees with itself
            msg = (
                f"{self._name}: {outside}: the pool's layer mapping and its buffer list "
                "disagree, so those layers have no buffer of their own.\n"
                "Hint: build the pool with one buffer per layer it serves (for a pipeline "
                "stage, pass its start_layer and end_layer); describe() still shows the "
                "pool as it is."
            )
        else:
            msg = (
                f"{self._name}: {outside}: the native pool's buffer list changed after "
                "kvcompat.adapt (it was rebuilt or resized), and this adapter keeps the "
                "layer -> slot map it was built with.\n"
                "Hint: adapt the pool again after it is rebuilt or resized "
                "(pool = kvcompat.adapt(native))."
            )
        raise PoolStateError(msg)

    def _fresh(self, layer_id: int) -> None:
        """The getters' slow path: an unserved layer id, or storage that changed."""
        if layer_id not in self._slots:
            raise_unserved(layer_id, self._name, self._slots)
        self._refresh()

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
        try:
            key, slot, raw = self._keys[layer_id]
            stale = getattr(self._native, self.source_attr)[slot] is not raw
        except Exception:  # noqa: BLE001 - unserved id, or the buffers went away: slow path
            stale = True
        if stale:
            self._fresh(layer_id)
            key = self._keys[layer_id][0]
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
        try:
            value, slot, raw = self._values[layer_id]
            stale = getattr(self._native, self.value_attr or self.source_attr)[slot] is not raw
        except Exception:  # noqa: BLE001 - unserved id, no values, or the buffers went away
            stale = True
        if stale:
            if not self.kind.has_values:
                self._missing_value(layer_id)
            self._fresh(layer_id)
            value = self._values[layer_id][0]
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
        try:
            pair, slot, raw_key, raw_value = self._pairs[layer_id]
            native = self._native
            stale = getattr(native, self.source_attr)[slot] is not raw_key or (
                raw_value is not raw_key and getattr(native, self.value_attr)[slot] is not raw_value  # type: ignore[arg-type]
            )
        except Exception:  # noqa: BLE001 - unserved id, no values, or the buffers went away
            stale = True
        if stale:
            if not self.kind.has_values:
                self._missing_value(layer_id)
            self._fresh(layer_id)
            pair = self._pairs[layer_id][0]
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

    # -- values by token index ----------------------------------------------------

    def layout(self, layer_id: int, /) -> LayerLayout:
        """The byte layouts of the layer's buffers, detected from the pool.

        Raises:
            LayoutError: kvcompat cannot tell (or has no codec for) the layout.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
            >>> pool = kvcompat.adapt(ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64))
            >>> spec = pool.layout(0).key
            >>> spec.name, spec.bytes_per_token, spec.page_bytes(64)
            ('v4', 584, 37440)
        """
        key = self.get_key_buffer(layer_id, wait=False)
        layer = layer_id if type(layer_id) is int else coerce_layer_id(layer_id, self._name)
        found = self._layouts.get(layer)
        if found is None:
            self._require()  # the layout is read from plain attributes of the pool
            entry = self._values.get(layer)
            value = None if entry is None else entry[0]
            found = self.detect_layout(layer, key, value)
            self._layouts[layer] = found
        return found

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
        """Dense keys of tokens ``loc``: ``[n, heads, head_dim]``.

        Packed layouts (DeepSeek-V4, DSA fp8) dequantize to bf16 bit-exactly as
        SGLang's readers do; plain rows come back in the pool's logical dtype.
        A token ``loc`` lives in page ``loc // page_size``, slot ``loc % page_size``.

        Args:
            layer_id: absolute model layer id.
            loc: 1-D integer tensor of token locations (may repeat) on the pool's device.
            out: optional pre-allocated ``[n, heads, head_dim]`` output (with
                ``validate=False``, the read is capturable in a CUDA graph).
            wait: perform the native layer-transfer wait first (as ``get_key_buffer``).
            validate: check ``loc`` (dtype, device, range) first; a check syncs the host.
            impl: ``"auto"`` (Triton on CUDA when available), ``"torch"`` or ``"triton"``.

        Example:
            >>> import torch, kvcompat
            >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
            >>> pool = kvcompat.adapt(ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64))
            >>> pool.write(0, torch.tensor([5]), torch.ones(1, 1, 512))
            >>> pool.read(0, torch.tensor([5])).shape
            torch.Size([1, 1, 512])
        """
        key = self.get_key_buffer(layer_id, wait=wait)
        spec = self.layout(layer_id)
        return read_rows(
            spec.key,
            key,
            loc,
            self.page_size,
            heads=spec.key.heads,
            fnuz=spec.fnuz,
            validate=validate,
            impl=impl,
            out=out,
            layout=spec,
        )

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
        """Dense ``(keys, values)`` of tokens ``loc``; ``shared`` says if values alias keys.

        Split pools read both buffers; on latent pools the values are the first
        ``kv_lora_rank`` columns of the dense keys (a view); on single-KV pools
        the values are the dense keys themselves.

        Raises:
            NoValueBufferError: the pool stores keys only.

        Example:
            >>> import torch, kvcompat
            >>> from kvcompat.testing import ReferenceMLATokenToKVPool
            >>> pool = kvcompat.adapt(ReferenceMLATokenToKVPool(size=16, page_size=16))
            >>> k, v = pool.read_kv(0, torch.tensor([1, 2]))
            >>> k.shape, v.shape
            (torch.Size([2, 1, 576]), torch.Size([2, 1, 512]))
        """
        key_buffer = self.get_key_buffer(layer_id, wait=wait)
        value_buffer = None
        if self.value_attr is not None:  # checked before the layout: it may rebuild the tables
            value_buffer = self.get_value_buffer(layer_id, wait=False)
        spec = self.layout(layer_id)
        keys = read_rows(
            spec.key, key_buffer, loc, self.page_size, heads=spec.key.heads,
            fnuz=spec.fnuz, validate=validate, impl=impl, layout=spec,
        )  # fmt: skip
        if spec.value is not None and value_buffer is not None:
            values = read_rows(
                spec.value, value_buffer, loc, self.page_size, heads=spec.value.heads,
                fnuz=spec.fnuz, validate=validate, impl=impl, layout=spec, role="value",
            )  # fmt: skip
            return KVPair(keys, values, shared=False, component=self._component)
        if not self.kind.has_values:
            self._missing_value(coerce_layer_id(layer_id, self._name))
        if spec.value_dim is not None:
            return KVPair(keys, keys[..., : spec.value_dim], shared=True, component=self._component)
        return KVPair(keys, keys, shared=True, component=self._component)

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
        """Quantize and store keys (and values) at tokens ``loc`` — all or nothing.

        On the DeepSeek-V4 single-KV family this is the working replacement for
        the native ``set_kv_buffer``, which raises. Everything is checked before
        the first byte moves: layer id, ``loc`` (integer, 1-D, on the pool's
        device, in range, no duplicates), shapes, dtypes and — with
        ``check_finite`` — NaN/Inf and overflow. Every part is encoded before the
        first scatter, and a fault while storing puts the old bytes back; on any
        error nothing is written, and the caller's tensors are never modified.
        Values that alias the pool's storage (a "move tokens" call) are copied
        first. See ``docs/atomic-writes.md``.

        Args:
            layer_id: absolute model layer id.
            loc: 1-D integer tensor of distinct token locations.
            key: ``[n, heads, head_dim]`` (or ``[n, dim]``) keys.
            value: split pools: the values (required). Latent and single-KV pools
                store the value inside the key row: pass None (or the key itself /
                its prefix view). Key-only pools: None.
            check_finite: reject NaN/Inf and values beyond what their segment can
                represent (a bf16 rope tail, fp4 tiles, unscaled e4m3, the fp32 compute
                range) with :class:`~kvcompat.WriteError` (one host sync per part);
                False stores them exactly as SGLang's store would, with no sync.
            validate: run the checks (False skips them, for CUDA-graph capture).
            impl: ``"auto"``, ``"torch"`` or ``"triton"``.

        Raises:
            WriteError: bad locations, shapes, dtypes, values, or a value where the
                pool has no separate value storage.

        Example:
            >>> import torch, kvcompat
            >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
            >>> native = ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64)
            >>> pool = kvcompat.adapt(native)
            >>> keys = torch.randn(3, 1, 512, dtype=torch.bfloat16)
            >>> pool.write(0, torch.tensor([1, 2, 3]), keys)     # native set_kv_buffer raises
            >>> back = pool.read(0, torch.tensor([1, 2, 3])).float()
            >>> bool(((back - keys.float()).abs() <= keys.float().abs().max() / 16).all())
            True
        """
        key_buffer = self.get_key_buffer(layer_id, wait=False)
        layer = layer_id if type(layer_id) is int else coerce_layer_id(layer_id, self._name)
        value_buffer = None
        if self.value_attr is not None:  # checked before the layout: it may rebuild the tables
            value_buffer = self.get_value_buffer(layer, wait=False)
        spec = self.layout(layer)
        page_size = self.page_size
        plans = [
            plan_write(
                spec.key, key_buffer, loc, key, page_size, what="key", owner=self._name,
                check_finite=check_finite, validate=validate, layout=spec,
            )
        ]  # fmt: skip
        if spec.value is not None and value_buffer is not None:
            if value is None:
                msg = (
                    f"{self._name} stores keys and values separately; write() got no value "
                    f"for layer {layer}.\nHint: pass the values: pool.write(layer, loc, k, v)."
                )
                raise WriteError(msg)
            plans.append(
                plan_write(
                    spec.value, value_buffer, loc, value, page_size, what="value",
                    owner=self._name, check_finite=check_finite, validate=validate,
                    layout=spec, role="value", checked=plans[0],
                )
            )  # fmt: skip
        elif value is not None and not aliases_key(value, key, spec.value_dim):
            where = (
                "stores keys only"
                if not self.kind.has_values
                else "keeps the value inside the key row"
            )
            msg = (
                f"{self._name} ({self.kind.value}) {where}: write() got a separate value tensor "
                f"for layer {layer}, which would be dropped.\n"
                "Hint: pass value=None (or the key tensor / its prefix view)."
            )
            raise WriteError(msg)
        write_rows(plans, page_size, fnuz=spec.fnuz, check_finite=check_finite, impl=impl)

    # -- many layers ------------------------------------------------------------

    def plan(self, layers: Sequence[int] | None = None, /) -> LayerPlan:
        """Plan reads and writes of several layers at once (every layer when None).

        The layers' buffers, byte layout and geometry are checked here, once; the plan's
        ``read`` / ``read_kv`` / ``write`` then check only tokens and values, once for
        all the layers, and move them with one launch per buffer (see
        ``docs/multi-layer.md``). Keep the plan: it re-plans by itself if the pool's
        buffers are replaced.

        Raises:
            LayerOutOfRangeError: a layer the pool does not serve.
            LayoutError: repeated or non-integer ids, or layers of different layouts.

        Example:
            >>> import torch, kvcompat
            >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
            >>> native = ReferenceDeepSeekV4SingleKVPool(size=128, page_size=64, layer_num=3)
            >>> step = kvcompat.adapt(native).plan()
            >>> step.layers, step.layout.key.name
            ((0, 1, 2), 'v4')
        """
        found = layer_tuple(layers, self.layer_ids, self._name)
        hit = self._layer_plans.get(found)
        if hit is None:
            hit = LayerPlan(self, found)
            if len(self._layer_plans) >= 64:
                self._layer_plans.clear()
            self._layer_plans[found] = hit
        return hit

    def _layer_entries(self, layers: Sequence[int]) -> tuple[Any, ...]:
        """What :meth:`_entries_unchanged` compares: the native entries behind ``layers``."""
        keys = tuple((self._keys[layer][1], self._keys[layer][2]) for layer in layers)
        values = tuple(
            (self._values[layer][1], self._values[layer][2])
            for layer in layers
            if layer in self._values and self.value_attr is not None
        )
        return keys, values

    def _entries_unchanged(self, entries: tuple[Any, ...]) -> bool:
        """Whether the native buffer lists still hold the entries a plan was made from."""
        keys, values = entries
        try:
            listing = getattr(self._native, self.source_attr)
            if any(listing[slot] is not raw for slot, raw in keys):
                return False
            if values:
                listing = getattr(self._native, str(self.value_attr))
                if any(listing[slot] is not raw for slot, raw in values):
                    return False
        except Exception:  # noqa: BLE001 - buffers gone or resized: re-plan (which explains)
            return False
        return True

    # -- metadata ---------------------------------------------------------------

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
    def device(self) -> torch.device:
        """Device holding the storage.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> kvcompat.adapt(ReferenceMHATokenToKVPool(size=16, page_size=16, layer_num=1)).device
            device(type='cpu')
        """
        for key, _, _ in self._keys.values():
            return key.device
        return torch.device(self._native.device)

    @property
    def components(self) -> Mapping[str, KVPoolProtocol]:
        """Empty: a leaf pool has no parts (a family may add its own, e.g. DSA's ``indexer``).

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
    value_attr = "v_buffer"
    buffers = (
        Buffer("k_buffer", "key"),
        Buffer("v_buffer", "value"),
        Buffer("k_scale_buffer", "key_scales", group="kv_scale"),
        Buffer("v_scale_buffer", "value_scales", group="kv_scale"),
    )
    returns = (
        "``k_buffer[slot]`` viewed as the logical dtype",
        "``v_buffer[slot]`` viewed as the logical dtype",
    )
    __slots__ = ()

    def _build(self, source: Sequence[torch.Tensor], slot: int) -> tuple[torch.Tensor, Any]:
        dtype = self._native.dtype
        values = self._native.v_buffer
        return as_logical(source[slot], dtype), as_logical(values[slot], dtype)

    def detect_layout(
        self, layer_id: int, key: torch.Tensor, value: torch.Tensor | None
    ) -> LayerLayout:
        """Token-major MHA rows for the keys and the values (:func:`mha_layer_layout`).

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> native = ReferenceMHATokenToKVPool(16, 16, head_num=2, head_dim=8, layer_num=1)
            >>> kvcompat.adapt(native).layout(0).value.name
            'mha_2x8_bf16'
        """
        return mha_layer_layout(self._native, key, value, self._name)

    @classmethod
    def layout_name(cls, native: Any) -> str | None:
        """``"mha-nhd"`` / ``"mha-hnd"``: the pool's ``kv_cache_layout``, for ``describe``.

        Example:
            >>> from types import SimpleNamespace
            >>> SplitAdapter.layout_name(SimpleNamespace(kv_cache_layout="HND"))
            'mha-HND'
        """
        return f"mha-{_static(native, 'kv_cache_layout') or 'nhd'}"


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
    native_attrs = ("dtype", "page_size", "kv_lora_rank")
    buffers: ClassVar[tuple[Buffer, ...]] = (
        Buffer("kv_buffer", "latent", rows="token", value_prefix="kv_lora_rank"),
        Buffer("kv_scale_buffer", "key_scales", group="kv_scale"),
        Buffer("index_key_cache.buffer", "index_keys", group="state", rows="page"),
        # SGLang 0.5.12's NSATokenToKVPool (DSA's predecessor) keeps them as a list.
        Buffer("index_k_with_scale_buffer", "index_keys", group="state", rows="page"),
    )
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

    def detect_layout(
        self, layer_id: int, key: torch.Tensor, value: torch.Tensor | None
    ) -> LayerLayout:
        """MLA latent rows, or DSA's packed fp8 rows (:func:`latent_layer_layout`).

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMLATokenToKVPool
            >>> kvcompat.adapt(ReferenceMLATokenToKVPool(16, 16)).layout(0).value_dim
            512
        """
        return latent_layer_layout(self._native, key, self._name)

    @classmethod
    def layout_name(cls, native: Any) -> str | None:
        """``"dsa-fp8-656"`` for DSA's packed rows, else ``"mla-latent"``, for ``describe``.

        Example:
            >>> from types import SimpleNamespace
            >>> LatentAdapter.layout_name(SimpleNamespace(dsa_kv_cache_store_fp8=True))
            'dsa-fp8-656'
        """
        return "dsa-fp8-656" if _static(native, "dsa_kv_cache_store_fp8") else "mla-latent"


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
    buffers = (Buffer("kv_buffer", "packed_kv", rows="page"),)
    native_waits = False
    returns = (
        "the packed page-major ``kv_buffer[slot]`` typed as the logical dtype",
        "the same tensor as the key (the storage is shared)",
    )
    __slots__ = ()

    def _build(self, source: Sequence[torch.Tensor], slot: int) -> tuple[torch.Tensor, Any]:
        key = as_logical(source[slot], self._native.dtype)
        return key, key

    def detect_layout(
        self, layer_id: int, key: torch.Tensor, value: torch.Tensor | None
    ) -> LayerLayout:
        """The ``KVLayout`` the pool names, checked against its pages (:func:`packed_layer_layout`).

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
            >>> kvcompat.adapt(ReferenceDeepSeekV4SingleKVPool(64, 64)).layout(0).key.name
            'v4'
        """
        return packed_layer_layout(self._native, key, self._name)

    @classmethod
    def layout_name(cls, native: Any) -> str | None:
        """The layout the pool's ``kv_layout`` and ``kv_cache_total_dim`` name, for ``describe``.

        A pool whose bytes per token (``kv_cache_total_dim``) match exactly one
        ``KVLayout`` value is named by it (SGLang's uniform-fp8 pool keeps
        ``kv_layout = V4`` over 512-byte rows); otherwise its ``kv_layout``, else ``"v4"``.

        Example:
            >>> from types import SimpleNamespace
            >>> SingleKVAdapter.layout_name(SimpleNamespace(kv_layout="v4", kv_cache_total_dim=512))
            'uniform_fp8'
        """
        named = _static(native, "kv_layout")
        named = getattr(named, "value", named)  # an enum member: its plain value
        per_token = _static(native, "kv_cache_total_dim")
        matching = [
            name for name in KV_LAYOUT_NAMES if get_layout(name).bytes_per_token == per_token
        ]
        if isinstance(named, str) and named.lower() in matching:
            return named.lower()
        if len(matching) == 1:
            return matching[0]
        return named.lower() if isinstance(named, str) else "v4"


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
    buffers: ClassVar[tuple[Buffer, ...]] = (Buffer("k_buffer", "key"),)
    returns = (
        "``k_buffer[slot]`` viewed as the logical dtype",
        "raises ``NoValueBufferError`` (a ``NotImplementedError``)",
    )
    __slots__ = ()

    def _build(self, source: Sequence[torch.Tensor], slot: int) -> tuple[torch.Tensor, Any]:
        return as_logical(source[slot], self._native.dtype), None

    def detect_layout(
        self, layer_id: int, key: torch.Tensor, value: torch.Tensor | None
    ) -> LayerLayout:
        """Token-major MHA key rows (:func:`mha_layer_layout`).

        Example:
            >>> KeyOnlyAdapter.detect_layout.__name__
            'detect_layout'
        """
        return mha_layer_layout(self._native, key, None, self._name)

    @classmethod
    def layout_name(cls, native: Any) -> str | None:
        """``"mha-nhd"`` / ``"mha-hnd"``, as :meth:`SplitAdapter.layout_name`.

        Example:
            >>> from types import SimpleNamespace
            >>> KeyOnlyAdapter.layout_name(SimpleNamespace())
            'mha-nhd'
        """
        return SplitAdapter.layout_name(native)


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
    native_attrs = ("page_size",)
    native_waits = False
    buffers: ClassVar[tuple[Buffer, ...]] = (
        Buffer("index_k_with_scale_buffer", "index_keys", rows="page"),
        Buffer("index_k_payload_buffer", "index_keys", rows="page"),
        Buffer("index_k_scale_buffer", "index_scales", rows="page"),
    )
    returns = (
        "the packed ``uint8`` ``index_k_with_scale_buffer[slot]`` (keys, then scales)",
        "raises ``NoValueBufferError`` (a ``NotImplementedError``)",
    )
    __slots__ = ()

    def _build(self, source: Sequence[torch.Tensor], slot: int) -> tuple[torch.Tensor, Any]:
        return source[slot], None

    def detect_layout(
        self, layer_id: int, key: torch.Tensor, value: torch.Tensor | None
    ) -> LayerLayout:
        """The indexer layout: fp8 (132 B/token), or fp4 (68 B/token) with ``use_fp4_indexer``.

        The fp4 bytes are written with ties to even when the pool sets ``index_k_rne``.

        Example:
            >>> from kvcompat.adapters import IndexKeyAdapter
            >>> IndexKeyAdapter.detect_layout.__name__
            'detect_layout'
        """
        spec = self._indexer_spec(self._native)
        if spec is None:
            msg = (
                f"{self._name}: kvcompat has no codec for the DeepSeek-V4 indexer-key layout "
                "of a pool whose use_fp4_indexer is None; its buffer is reachable as raw "
                "bytes through get_key_buffer().\n"
                "Hint: read the index keys with SGLang's own indexer readers for now."
            )
            raise LayoutError(msg)
        page = int(self._native.page_size)
        if key.dim() != 2 or key.shape[-1] * key.element_size() != spec.page_bytes(page):
            msg = (
                f"{self._name}: its indexer pages are {tuple(key.shape)} at "
                f"page_size={page}; the {spec.name!r} layout has {spec.page_bytes(page)} "
                "bytes per page (page_size must be a multiple of 32).\n"
                "Hint: read the index keys with SGLang's get_index_k_dequant."
            )
            raise LayoutError(msg)
        return LayerLayout(spec)

    @staticmethod
    def _indexer_spec(native: Any, read: Any = getattr) -> LayoutSpec | None:
        """fp8, or fp4 (ties to even with ``index_k_rne``); None when the pool says neither.

        ``read(native, name, default)`` is ``getattr`` or a reader that runs no code.
        """
        # A class without ``use_fp4_indexer`` (SGLang 0.5.12) has only the fp8 indexer: same
        # P * 132-byte pages; the page-size check refuses any other geometry.
        fp4 = read(native, "use_fp4_indexer", False)
        if fp4 is None:
            return None
        if not fp4:
            return DSV4_INDEXER_FP8
        return DSV4_INDEXER_FP4_RNE if read(native, "index_k_rne", False) else DSV4_INDEXER_FP4

    @classmethod
    def layout_name(cls, native: Any) -> str | None:
        """The indexer layout's name; ``"dsv4-indexer-fp4-split"`` for HIP's split buffers.

        Example:
            >>> from types import SimpleNamespace
            >>> IndexKeyAdapter.layout_name(SimpleNamespace(use_fp4_indexer=True))
            'dsv4_indexer_fp4'
        """
        if _static(native, "index_k_with_scale_buffer", ()) is None:
            return "dsv4-indexer-fp4-split"  # HIP: payload and scales in two buffers
        spec = cls._indexer_spec(native, _static)
        return None if spec is None else spec.name
