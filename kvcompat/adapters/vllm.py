"""vLLM's KV caches (0.33, 0.34) through the key-first API: ``adapt(kv_caches, config=cfg)``.

A vLLM KV connector holds the ``dict[str, torch.Tensor]`` that
``KVConnectorBase_V1.register_kv_caches`` receives and the ``KVCacheConfig`` its
constructor receives. :func:`adapt_vllm` reads the pair (``kvcompat/adapters/_vllm_plan.py``:
layer ids, formats, block placement, all from class names and plain fields, vllm never
imported) and builds one adapter per *component*: the layers of one KV-cache group that
hold one format. A config with a single component gives that adapter; several (DeepSeek-V4's
compressed KV, sliding-window KV and indexer keys; a hybrid model's full and sliding-window
groups) give a :class:`~kvcompat.adapters.CompositeAdapter` over them.

Token addressing is vLLM's slot mapping, in the units the group's kernels receive:
``slot = block_id * N + offset``, with ``N = block_size // tokens_per_state`` states per
block (64 for DeepSeek-V4's C4 cache at block size 256). ``page_size`` answers ``N``.

Every getter returns a view of the registered view's storage (never a copy):

* MHA (``FullAttentionSpec``, ``SlidingWindowSpec``): the registered ``[B, H, N, 2*D]``
  view holds K then V per head slot; ``get_key_buffer`` is ``view[..., :D]`` and
  ``get_value_buffer`` ``view[..., D:]``, both ``[B, H, N, D]``.
* MLA and ``fp8_ds_mla`` rows: ``view[:, 0]`` (``[B, N, C]``, H squeezed as vLLM's MLA
  layers bind it); the value is its ``kv_lora_rank`` prefix.
* DeepSeek-V4's 584-B pages and 132-B indexer pages: ``view[:, 0]`` as ``uint8``.

``read``/``write`` are bit-exact and all or nothing: plain rows are gathered and stored with
one indexing op on the registered view; packed pages (DeepSeek-V4's ``V4`` and
``DSV4_INDEXER_FP8``) go through kvcompat's codecs on a zero-copy ``[B, page]`` view of the
registered storage, strided by vLLM's block stride under block-outer layouts; ``fp8_ds_mla``
token rows (``DSA_FP8``) go through the codec in place too: in one call where the layer's
blocks are back to back (layer-outer layouts, vLLM's default), in one call per touched block
under block-outer ones, every block's part checked before the first store.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from types import MappingProxyType
from typing import Any, ClassVar

import torch

from kvcompat._errors import LayoutError, NoValueBufferError, UnsupportedPoolError, WriteError
from kvcompat._families import Family, _install
from kvcompat._ops import (
    LayersPlan,
    check_write,
    dequantize,
    plan_layers,
    quantize,
    read_layers,
    write_layers,
)
from kvcompat._protocol import Impl, KVPair, KVPoolProtocol, PoolKind
from kvcompat.adapters._base import AdapterBase
from kvcompat.adapters._composite import CompositeAdapter, CompositeParts
from kvcompat.adapters._io import LayerLayout
from kvcompat.adapters._layers import coerce_layer_id, describe_ids, raise_unserved
from kvcompat.adapters._multi import layer_tuple
from kvcompat.adapters._vllm_plan import (
    VLLMKVCaches,
    VLLMLayer,
    VLLMPlan,
    block_rows,
    plan_vllm,
    storage_extent,
)
from kvcompat.layouts import LayoutSpec
from kvcompat.layouts._validate import check_loc, check_values

__all__ = [
    "VLLM_NATIVE",
    "VLLMAdapter",
    "VLLMKVCaches",
    "adapt_vllm",
    "components_of",
]

VLLM_NATIVE = f"{VLLMKVCaches.__module__}.{VLLMKVCaches.__qualname__}"
"""Qualified name of the native object a vLLM adapter wraps (registered as a family)."""

_NO_COMPONENTS: Mapping[str, KVPoolProtocol] = MappingProxyType({})

# Which component answers a layer id that several components serve: the KV cache the
# attention reads (sliding window first, as on SGLang's DeepSeek-V4 pools), never the indexer.
_PRIMARY = {PoolKind.SPLIT: 0, PoolKind.LATENT: 0, PoolKind.SINGLE_KV: 0, PoolKind.KEY_ONLY: 2}


def components_of(plan: VLLMPlan) -> dict[str, tuple[VLLMLayer, ...]]:
    """Component name -> its layers: one component per (group, format), named by role.

    The name is the format's role (``"full"``, ``"swa"``, ``"mla"``, ``"c4"``,
    ``"indexer"``), suffixed with the group index when two components would share it.

    Example:
        >>> from types import MappingProxyType
        >>> components_of(VLLMPlan(MappingProxyType({}), 0, None, ()))
        {}
    """
    keyed: dict[tuple[int, str, str], list[VLLMLayer]] = {}
    for layer in plan.layers.values():
        keyed.setdefault((layer.group, layer.fmt.name, layer.fmt.role), []).append(layer)
    roles = [role for _, _, role in keyed]
    named: dict[str, tuple[VLLMLayer, ...]] = {}
    for (group, _, role), layers in keyed.items():
        name = role if roles.count(role) == 1 else f"{role}_g{group}"
        named[name] = tuple(sorted(layers, key=lambda item: (item.layer_id, item.name)))
    return named


class VLLMAdapter(AdapterBase):
    """The layers of one format of a vLLM worker's caches, through the key-first API.

    Built by :func:`adapt_vllm` (``kvcompat.adapt(kv_caches, config=cfg)``); one subclass
    per :class:`~kvcompat.PoolKind`. Layer ids are the model's, parsed from vLLM's layer
    names; ``layer_names`` maps each id to its names.

    Example:
        >>> VLLMAdapter.__name__
        'VLLMAdapter'
    """

    kind: ClassVar[PoolKind]
    __slots__ = ("_component", "_layers", "_name", "_native", "_pairs", "_plans")

    def __init__(
        self,
        native: VLLMKVCaches,
        layers: tuple[VLLMLayer, ...],
        *,
        component: str | None = None,
    ) -> None:
        self._native = native
        self._component = component
        self._name = component or "vllm"
        by_id: dict[int, VLLMLayer] = {}
        for layer in layers:  # an id's first name (by the dict's order) is its own cache
            by_id.setdefault(layer.layer_id, layer)
        self._layers = dict(sorted(by_id.items()))
        self._pairs = {lid: self._pair(layer) for lid, layer in self._layers.items()}
        self._plans: dict[int, LayerLayout | None] = {
            lid: self._layout_of(layer) for lid, layer in self._layers.items()
        }

    # -- buffers ----------------------------------------------------------------------

    def _pair(self, layer: VLLMLayer) -> KVPair:
        fmt, view = layer.fmt, layer.view
        if self.kind is PoolKind.SPLIT:
            typed = view if view.dtype == fmt.logical else view.view(fmt.logical)
            key = typed[..., : fmt.key_dim]
            value = typed[..., fmt.key_dim : fmt.key_dim + fmt.value_dim]
            return KVPair(key, value, shared=False, component=self._component)
        rows = view[:, 0]
        if not fmt.packed and rows.dtype != fmt.logical:
            rows = rows.view(fmt.logical)
        if self.kind is PoolKind.LATENT:
            return KVPair(rows, rows[..., : fmt.value_dim], shared=True, component=self._component)
        return KVPair(rows, rows, shared=True, component=self._component)

    def _layout_of(self, layer: VLLMLayer) -> LayerLayout | None:
        fmt = layer.fmt
        if fmt.spec is None:
            return None
        if self.kind is PoolKind.SPLIT:
            from kvcompat.layouts import mha_layout  # noqa: PLC0415 - one spec per layer

            return LayerLayout(fmt.spec, mha_layout(fmt.heads, fmt.value_dim, fmt.logical))
        if self.kind is PoolKind.LATENT:
            return LayerLayout(fmt.spec, value_dim=fmt.value_dim)
        return LayerLayout(fmt.spec)

    def _layer(self, layer_id: int) -> VLLMLayer:
        if type(layer_id) is not int:
            layer_id = coerce_layer_id(layer_id, self._name)
        found = self._layers.get(layer_id)
        if found is None:
            raise_unserved(layer_id, self._name, self._layers)
        return found

    def get_key_buffer(self, layer_id: int, /, *, wait: bool = True) -> torch.Tensor:
        """The layer's key storage: a view of the registered view's storage (no copy).

        ``wait`` is accepted for the protocol; vLLM's views need no layer-transfer wait.
        """
        if type(layer_id) is not int:
            layer_id = coerce_layer_id(layer_id, self._name)
        pair = self._pairs.get(layer_id)
        if pair is None:
            raise_unserved(layer_id, self._name, self._layers)
        return pair[0]

    def get_value_buffer(self, layer_id: int, /, *, wait: bool = True) -> torch.Tensor:
        """The layer's value storage (the key storage itself on single-KV caches)."""
        pair = self.get_kv_buffer(layer_id, wait=wait)
        if not self.kind.has_values:
            self._missing_value(layer_id)
        return pair[1]

    def get_kv_buffer(self, layer_id: int, /, *, wait: bool = True) -> KVPair:
        """The layer's ``(key, value)`` pair; ``pair.shared`` says if they alias."""
        if type(layer_id) is not int:
            layer_id = coerce_layer_id(layer_id, self._name)
        pair = self._pairs.get(layer_id)
        if pair is None:
            raise_unserved(layer_id, self._name, self._layers)
        if not self.kind.has_values:
            self._missing_value(layer_id)
        return pair

    def _missing_value(self, layer_id: int) -> None:
        msg = (
            f"{self._name} (vLLM {self._layers[layer_id].fmt.name}) stores keys only: it has "
            f"no value buffer for layer {layer_id}.\n"
            "Hint: call get_key_buffer(layer_id); check pool.kind.has_values first."
        )
        raise NoValueBufferError(msg)

    def layout(self, layer_id: int, /) -> LayerLayout:
        """The byte layouts of the layer's keys (and values).

        Example:
            >>> VLLMAdapter.layout.__name__
            'layout'
        """
        layer = self._layer(layer_id)
        found = self._plans[layer.layer_id]
        if found is None:
            raise self._no_codec(layer)
        return found

    def _no_codec(self, layer: VLLMLayer) -> LayoutError:
        msg = (
            f"{self._name}: layer {layer.layer_id} ({layer.name}) holds vLLM "
            f"{layer.fmt.name} bytes (fp32 rows of {layer.fmt.key_dim}), which have no token "
            "codec, so read() and write() refuse them.\n"
            "Hint: its storage is get_key_buffer(layer); describe() and "
            "transfer_descriptors() cover its bytes."
        )
        return LayoutError(msg)

    def _codec(self, layer: VLLMLayer) -> LayoutSpec:
        """The layer's byte layout, or the error saying it has none."""
        if layer.fmt.spec is None:
            raise self._no_codec(layer)
        return layer.fmt.spec

    # -- reads ------------------------------------------------------------------------

    def _capacity(self, layer: VLLMLayer) -> int:
        return layer.num_blocks * layer.fmt.states

    def _check_loc(self, layer: VLLMLayer, loc: Any, *, write: bool) -> torch.Tensor:
        error = WriteError if write else LayoutError
        try:
            return check_loc(
                loc,
                capacity=self._capacity(layer),
                device=layer.view.device,
                error=error,
                unique=write,
            )
        except (LayoutError, WriteError) as exc:
            what = "write" if write else "read"
            msg = (
                f"{self._name}: {what} of layer {layer.layer_id} ({layer.name}, "
                f"{layer.num_blocks} blocks of {layer.fmt.states} slots): {exc}"
            )
            raise error(msg) from None

    def _gather_plain(self, layer: VLLMLayer, loc: torch.Tensor) -> torch.Tensor:
        """``[n, H, C]`` rows of slots ``loc`` (int64, in range), in the logical dtype."""
        states = layer.fmt.states
        view = (
            layer.view
            if layer.view.dtype == layer.fmt.logical
            else layer.view.view(layer.fmt.logical)
        )
        return view[loc // states, :, loc % states]

    def _packed_buffer(self, layer: VLLMLayer) -> tuple[torch.Tensor, int]:
        """``(buffer, page_size)`` the codec reads: a zero-copy view of the layer's storage.

        Paged formats: ``[B, page]`` rows at vLLM's block stride (the codecs address pages
        further apart than their size). Token rows (``fp8_ds_mla``) of a layer whose blocks
        are back to back: ``[B * N, row]``. Token rows under a block-outer layout are not one
        strided run: :meth:`_block_buffer` gives one block's rows instead.
        """
        fmt, spec = layer.fmt, self._codec(layer)
        states = fmt.states
        row = spec.page_bytes(states) if fmt.paged else states * spec.bytes_per_token
        if not storage_extent(layer, row):
            msg = (
                f"{self._name}: layer {layer.layer_id} ({layer.name}) has {layer.block_bytes} "
                f"bytes per block; the {spec.name!r} page of {states} states needs {row} "
                "(vLLM pads it to the page alignment), and they do not fit in the view's "
                "storage.\nHint: pass the views vLLM allocated, not copies of them."
            )
            raise LayoutError(msg)
        rows = block_rows(layer, row)
        return (rows if fmt.paged else rows.view(-1, spec.bytes_per_token)), states

    def _block_buffer(self, layer: VLLMLayer, block: int) -> torch.Tensor:
        """One block's token rows ``[N, row]`` (contiguous inside the block), zero-copy."""
        return layer.view[block, 0].view(torch.uint8)

    def _direct(self, layer: VLLMLayer) -> bool:
        """Whether one codec call addresses the whole layer (else one call per block).

        Paged formats (DeepSeek-V4's pages, the indexer pages) always; token rows
        (``fp8_ds_mla``) when the layer's blocks are back to back.
        """
        return layer.fmt.paged or layer.contiguous

    def _by_block(self, layer: VLLMLayer, loc: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """``[(block, positions in loc)]`` of the distinct blocks ``loc`` touches."""
        states = layer.fmt.states
        blocks, inverse = torch.unique(loc // states, return_inverse=True)
        return [(int(block), (inverse == i).nonzero().flatten()) for i, block in enumerate(blocks)]

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
        """Dense keys of slots ``loc`` (``slot = block * N + offset``): ``[n, heads, dim]``.

        MHA returns ``[n, H, D]`` in the cache dtype; MLA ``[n, 1, 576]``; packed formats
        dequantize bit-exactly to bf16 (``[n, 1, 512]`` for DeepSeek-V4, ``[n, 1, 128]``
        raw fp8 index keys... as the codec's ``dim`` says).
        """
        layer = self._layer(layer_id)
        spec = self._codec(layer)
        loc64 = self._check_loc(layer, loc, write=False)
        fmt = layer.fmt
        if not fmt.packed:
            rows = self._gather_plain(layer, loc64)[..., : fmt.key_dim]
            dense = rows if self.kind is PoolKind.SPLIT else rows.reshape(len(loc64), 1, -1)
        else:
            if self._direct(layer):
                buffer, page = self._packed_buffer(layer)
                flat = dequantize(spec, buffer, loc64, page, validate=True, impl=impl)
            else:  # fp8_ds_mla rows under a block-outer layout: block by block, in place
                flat = torch.empty(
                    len(loc64), spec.dim, dtype=spec.output_dtype, device=layer.view.device
                )
                states = fmt.states
                for block, where in self._by_block(layer, loc64):
                    rows = self._block_buffer(layer, block)
                    local = loc64[where] % states
                    flat[where] = dequantize(spec, rows, local, states, validate=True, impl=impl)
            dense = flat.view(flat.shape[0], spec.heads, spec.dim // spec.heads)
        if out is not None:
            if tuple(out.shape) != tuple(dense.shape) or out.dtype != dense.dtype:
                msg = (
                    f"{self._name}: out is {list(out.shape)} {out.dtype}; the read of layer "
                    f"{layer.layer_id} gives {list(dense.shape)} {dense.dtype}.\n"
                    "Hint: allocate out with that shape and dtype."
                )
                raise LayoutError(msg)
            out.copy_(dense)
            return out
        return dense.contiguous()

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
        """Dense ``(keys, values)`` of slots ``loc``; ``shared`` says if values alias keys."""
        layer = self._layer(layer_id)
        if not self.kind.has_values:
            self._missing_value(layer.layer_id)
        if self.kind is PoolKind.SPLIT:
            loc64 = self._check_loc(layer, loc, write=False)
            rows = self._gather_plain(layer, loc64)
            fmt = layer.fmt
            keys = rows[..., : fmt.key_dim].contiguous()
            values = rows[..., fmt.key_dim : fmt.key_dim + fmt.value_dim].contiguous()
            return KVPair(keys, values, shared=False, component=self._component)
        keys = self.read(layer_id, loc, impl=impl)
        if self.kind is PoolKind.LATENT:
            width = layer.fmt.value_dim
            return KVPair(keys, keys[..., :width], shared=True, component=self._component)
        return KVPair(keys, keys, shared=True, component=self._component)

    # -- writes -----------------------------------------------------------------------

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
        """Store keys (and values) at slots ``loc`` — all or nothing.

        Everything (layer id, ``loc``: integer, 1-D, on the cache's device, in range,
        distinct; shapes, dtypes, finiteness) is checked before the first byte moves;
        only the written slots' bytes change (packed formats: their rows and scale bytes).
        MHA takes ``key`` and ``value`` ``[n, H, D]``; the other formats keep the value in
        the key row (pass ``value=None``).
        """
        self._prepare_write(layer_id, loc, key, value, check_finite=check_finite, impl=impl)()

    def _prepare_write(
        self,
        layer_id: int,
        loc: Any,
        key: Any,
        value: Any,
        *,
        check_finite: bool,
        impl: Impl,
    ) -> Callable[[], None]:
        """Check a write of one layer completely; return the store that performs it.

        Nothing is stored here, so a multi-layer write checks every layer before the first
        store runs.
        """
        layer = self._layer(layer_id)
        spec = self._codec(layer)
        loc64 = self._check_loc(layer, loc, write=True)
        fmt = layer.fmt
        n = int(loc64.numel())
        device = layer.view.device
        if self.kind is PoolKind.SPLIT:
            if value is None:
                msg = (
                    f"{self._name} stores keys and values in one vLLM page; write() got no "
                    f"value for layer {layer.layer_id}.\n"
                    "Hint: pass both: pool.write(layer, loc, k, v)."
                )
                raise WriteError(msg)
            value_spec = self.layout(layer.layer_id).value
            assert value_spec is not None  # every split layer has one
            keys = self._values(spec, key, n, device, check_finite, "key")
            values = self._values(value_spec, value, n, device, check_finite, "value")
            rows = torch.cat(
                (
                    keys.view(n, fmt.heads, fmt.key_dim).to(fmt.logical),
                    values.view(n, fmt.heads, fmt.value_dim).to(fmt.logical),
                ),
                dim=-1,
            )
            return partial(self._store_plain, layer, loc64, rows)
        if value is not None and not _aliases(value, key, fmt.value_dim):
            msg = (
                f"{self._name} (vLLM {fmt.name}) keeps the value inside the key row: write() "
                f"got a separate value tensor for layer {layer.layer_id}, which would be "
                "dropped.\nHint: pass value=None (or the key tensor / its prefix view)."
            )
            raise WriteError(msg)
        if not fmt.packed:
            keys = self._values(spec, key, n, device, check_finite, "key")
            rows = keys.view(n, 1, fmt.key_dim).to(fmt.logical)
            return partial(self._store_plain, layer, loc64, rows)
        if self._direct(layer):
            buffer, page = self._packed_buffer(layer)
            checked, _ = check_write(spec, buffer, loc64, key, page, check_finite=check_finite)
            return partial(
                quantize, spec, checked, buffer, loc64, page, check_finite=False,
                validate=False, impl=impl,
            )  # fmt: skip
        # fp8_ds_mla rows under a block-outer layout: every block's part checked first, then
        # each stored in place with one codec call per block.
        checked = self._values(spec, key, n, device, check_finite, "key")
        parts = []
        for block, where in self._by_block(layer, loc64):
            rows = self._block_buffer(layer, block)
            local = loc64[where] % fmt.states
            values, local = check_write(
                spec, rows, local, checked[where], fmt.states, check_finite=False
            )
            parts.append((rows, local, values))

        def store() -> None:
            for rows, local, values in parts:
                quantize(
                    spec, values, rows, local, fmt.states, check_finite=False, validate=False,
                    impl=impl,
                )  # fmt: skip

        return store

    def plan(self, layers: Sequence[int] | None = None, /) -> VLLMLayerPlan:
        """Several layers of this component, for ``read_layers`` / ``write_layers``.

        Every layer must hold the same format. Reads and writes check tokens and values
        for every layer before the first store, then move the layers one by one.

        Example:
            >>> VLLMAdapter.plan.__name__
            'plan'
        """
        found = layer_tuple(layers, self.layer_ids, self._name)
        formats = {self._layers[layer].fmt for layer in found}
        if len(formats) > 1:
            msg = (
                f"{self._name}: layers {list(found)} hold different vLLM formats "
                f"{sorted(f.name for f in formats)}; one plan moves one format.\n"
                "Hint: plan each component's layers separately."
            )
            raise LayoutError(msg)
        return VLLMLayerPlan(self, found)

    def _values(
        self,
        spec: Any,
        values: Any,
        n: int,
        device: torch.device,
        check_finite: bool,
        what: str,
    ) -> torch.Tensor:
        try:
            return check_values(spec, values, n, device, check_finite=check_finite)
        except WriteError as exc:
            msg = f"{self._name}: writing the {what}s: {exc}"
            raise WriteError(msg) from None

    def _store_plain(self, layer: VLLMLayer, loc: torch.Tensor, rows: torch.Tensor) -> None:
        """One indexed store of ``[n, H, C]`` rows at slots ``loc`` (checked, distinct)."""
        states = layer.fmt.states
        view = (
            layer.view
            if layer.view.dtype == layer.fmt.logical
            else layer.view.view(layer.fmt.logical)
        )
        rows = rows.clone() if _shares(rows, view) else rows
        view[loc // states, :, loc % states] = rows

    # -- metadata ---------------------------------------------------------------------

    @property
    def layer_ids(self) -> tuple[int, ...]:
        """The absolute layer ids served, ascending (parsed from vLLM's layer names)."""
        return tuple(self._layers)

    @property
    def layer_names(self) -> Mapping[int, tuple[str, ...]]:
        """Layer id -> vLLM layer names of this component (KV-sharing aliases included)."""
        names: dict[int, list[str]] = {}
        for layer in self._native.plan.layers.values():
            if layer.layer_id in self._layers:
                names.setdefault(layer.layer_id, []).append(layer.name)
        return MappingProxyType({lid: tuple(found) for lid, found in sorted(names.items())})

    @property
    def size(self) -> int:
        """Slot capacity: ``num_blocks * N``."""
        first = next(iter(self._layers.values()))
        return self._capacity(first)

    @property
    def page_size(self) -> int:
        """``N``: slots (states) per block, the unit of vLLM's slot mapping for this cache."""
        return next(iter(self._layers.values())).fmt.states

    @property
    def dtype(self) -> torch.dtype:
        """Logical dtype: the MHA/MLA element dtype, ``float8_e4m3fn`` for fp8 packed rows."""
        return next(iter(self._layers.values())).fmt.logical

    @property
    def device(self) -> torch.device:
        """Device of the registered views."""
        return next(iter(self._layers.values())).view.device

    @property
    def components(self) -> Mapping[str, KVPoolProtocol]:
        """Empty: a component has no parts of its own."""
        return _NO_COMPONENTS

    def component_for(self, layer_id: int, /) -> str | None:
        """This component's name (None for a standalone cache)."""
        self._layer(layer_id)
        return self._component

    @property
    def vllm_layers(self) -> Mapping[int, VLLMLayer]:
        """Layer id -> what kvcompat read about its registered view (name, format, layout)."""
        return MappingProxyType(self._layers)

    def __repr__(self) -> str:
        first = next(iter(self._layers.values()))
        return (
            f"<kvcompat {type(self).__name__} kind={self.kind.value} "
            f"format={first.fmt.name} layout={first.layout} layers={describe_ids(self._layers)}>"
        )


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    except RuntimeError:
        return False


def _aliases(value: object, key: object, value_dim: int) -> bool:
    if value is key:
        return True
    return (
        isinstance(value, torch.Tensor)
        and isinstance(key, torch.Tensor)
        and value.data_ptr() == key.data_ptr()
        and value.shape[:-1] == key.shape[:-1]
        and value.shape[-1] == value_dim
    )


class VLLMLayerPlan:
    """Several layers of one vLLM component (:meth:`VLLMAdapter.plan`).

    ``loc`` is one 1-D tensor of slots for every layer, or ``[layers, n]`` (each layer its
    own slots). Writes take ``key`` (and, for MHA, ``value``) ``[layers, n, heads, dim]``
    and check every layer before the first store.

    Packed formats whose layers are each one run of pages or rows (DeepSeek-V4's pages,
    its indexer pages, ``fp8_ds_mla`` under a layer-outer layout) are planned once over
    every layer's strided view: a read or write is one launch for all the layers, as on
    SGLang's pools. The others (MHA and MLA rows, indexed per head; ``fp8_ds_mla`` under a
    block-outer layout) move layer by layer.

    Attributes:
        layers: the layer ids, in call order (``out[i]`` is ``layers[i]``).
        layout: the layers' shared :class:`~kvcompat.adapters.LayerLayout`.
    """

    __slots__ = ("_adapter", "_fused", "layers", "layout")

    def __init__(self, adapter: VLLMAdapter, layers: tuple[int, ...]) -> None:
        self._adapter = adapter
        self.layers = layers
        self.layout = adapter.layout(layers[0])
        self._fused = self._fuse()

    def _fuse(self) -> LayersPlan | None:
        """One plan over every layer's packed pages, or None where the layers move one by one."""
        adapter = self._adapter
        found = [adapter._layers[layer] for layer in self.layers]
        if not all(layer.fmt.packed and adapter._direct(layer) for layer in found):
            return None
        buffers = [adapter._packed_buffer(layer) for layer in found]
        if len({page for _, page in buffers}) != 1:
            return None
        try:
            return plan_layers(adapter._codec(found[0]), [buf for buf, _ in buffers], buffers[0][1])
        except LayoutError:  # pitches differ between layers: one by one
            return None

    @property
    def fused(self) -> bool:
        """Whether a call moves every planned layer with one launch (one kernel call)."""
        return self._fused is not None

    def _locs(self, loc: Any, error: type[LayoutError | WriteError]) -> list[Any]:
        if isinstance(loc, torch.Tensor) and loc.dim() == 2:
            if loc.shape[0] != len(self.layers):
                msg = (
                    f"{self._adapter.name}: loc is {list(loc.shape)}, for {len(self.layers)} "
                    "layers.\nHint: pass one row of slots per layer, or a 1-D loc for all."
                )
                raise error(msg)
            return list(loc)
        return [loc] * len(self.layers)

    def _per_layer(self, values: Any, what: str) -> list[Any]:
        self._check_stacked(values, what)
        return list(values)

    def _check_stacked(self, values: Any, what: str) -> None:
        if (
            not isinstance(values, torch.Tensor)
            or values.dim() < 2
            or (values.shape[0] != len(self.layers))
        ):
            got = list(values.shape) if isinstance(values, torch.Tensor) else type(values)
            msg = (
                f"{self._adapter.name}: write_layers needs {what} [layers, n, ...] for "
                f"{len(self.layers)} layers; received {got}.\n"
                "Hint: stack the per-layer tensors: torch.stack(per_layer)."
            )
            raise WriteError(msg)

    def read(
        self,
        loc: torch.Tensor,
        *,
        out: torch.Tensor | None = None,
        wait: bool = True,
        validate: bool = True,
        impl: Impl = "auto",
    ) -> torch.Tensor:
        """Dense keys ``[layers, n, heads, dim]``."""
        if self._fused is not None:
            self._locs(loc, LayoutError)
            spec = self.layout.key
            n = int(loc.shape[-1]) if isinstance(loc, torch.Tensor) and loc.dim() else -1
            shape = (len(self.layers), n, spec.heads, spec.dim // spec.heads)
            if (
                out is not None
                and tuple(out.shape) == shape
                and out.dtype == spec.output_dtype
                and out.is_contiguous()
            ):  # straight into the caller's buffer: no copy, nothing allocated
                read_layers(self._fused, loc, out=out.view(*shape[:2], -1), validate=validate,
                            impl=impl)  # fmt: skip
                return out
            flat = read_layers(self._fused, loc, validate=validate, impl=impl)
            dense = flat.view(*flat.shape[:2], spec.heads, spec.dim // spec.heads)
            return dense if out is None else self._into(out, dense)
        locs = self._locs(loc, LayoutError)
        dense = torch.stack(
            [
                self._adapter.read(layer, at, impl=impl)
                for layer, at in zip(self.layers, locs, strict=True)
            ]
        )
        return dense if out is None else self._into(out, dense)

    def _into(self, out: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        if tuple(out.shape) != tuple(dense.shape) or out.dtype != dense.dtype:
            msg = (
                f"{self._adapter.name}: out is {list(out.shape)} {out.dtype}; the read gives "
                f"{list(dense.shape)} {dense.dtype}.\nHint: allocate out with that shape."
            )
            raise LayoutError(msg)
        return out.copy_(dense)

    def read_kv(
        self, loc: torch.Tensor, *, wait: bool = True, validate: bool = True, impl: Impl = "auto"
    ) -> KVPair:
        """Dense ``(keys, values)`` ``[layers, n, heads, dim]`` each."""
        locs = self._locs(loc, LayoutError)
        pairs = [
            self._adapter.read_kv(layer, at, impl=impl)
            for layer, at in zip(self.layers, locs, strict=True)
        ]
        keys = torch.stack([pair.key for pair in pairs])
        values = torch.stack([pair.value for pair in pairs])
        return KVPair(keys, values, shared=pairs[0].shared, component=pairs[0].component)

    def write(
        self,
        loc: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor | None = None,
        *,
        check_finite: bool = True,
        validate: bool = True,
        impl: Impl = "auto",
    ) -> None:
        """Store ``key[i]`` (and ``value[i]``) at layer ``layers[i]`` — all or nothing."""
        if self._fused is not None and value is None:
            self._locs(loc, WriteError)
            self._check_stacked(key, "key")
            write_layers(
                self._fused, loc, key, check_finite=check_finite, validate=validate, impl=impl
            )
            return
        locs = self._locs(loc, WriteError)
        keys = self._per_layer(key, "key")
        values = [None] * len(keys) if value is None else self._per_layer(value, "value")
        stores = [
            self._adapter._prepare_write(layer, at, k, v, check_finite=check_finite, impl=impl)
            for layer, at, k, v in zip(self.layers, locs, keys, values, strict=True)
        ]
        for store in stores:  # every layer checked (and encoded) before the first store
            store()


class VLLMSplitAdapter(VLLMAdapter):
    """vLLM MHA pages: K then V per head slot (``get_key_buffer`` is ``view[..., :D]``)."""

    kind = PoolKind.SPLIT
    __slots__ = ()


class VLLMLatentAdapter(VLLMAdapter):
    """vLLM MLA rows (bf16/fp16 or ``fp8_ds_mla``); the value is the latent prefix."""

    kind = PoolKind.LATENT
    __slots__ = ()


class VLLMSingleKVAdapter(VLLMAdapter):
    """vLLM DeepSeek-V4 584-B pages: one packed page per block; the value is the key."""

    kind = PoolKind.SINGLE_KV
    __slots__ = ()


class VLLMKeyOnlyAdapter(VLLMAdapter):
    """vLLM DeepSeek-V4 fp8 indexer keys (132 B per state, page-major)."""

    kind = PoolKind.KEY_ONLY
    __slots__ = ()


_BY_KIND: dict[PoolKind, type[VLLMAdapter]] = {
    PoolKind.SPLIT: VLLMSplitAdapter,
    PoolKind.LATENT: VLLMLatentAdapter,
    PoolKind.SINGLE_KV: VLLMSingleKVAdapter,
    PoolKind.KEY_ONLY: VLLMKeyOnlyAdapter,
}


class VLLMCompositeAdapter(CompositeAdapter):
    """Several components of one vLLM worker's caches (DeepSeek-V4, hybrid models).

    ``layer_names`` maps each id to every name registered for it (its KV cache, its
    indexer keys...).
    """

    __slots__ = ()

    @property
    def layer_names(self) -> Mapping[int, tuple[str, ...]]:
        """Layer id -> every vLLM layer name registered for it."""
        native: VLLMKVCaches = self._native
        return MappingProxyType(dict(native.plan.by_id()))


def adapt_vllm(kv_caches: Any, config: Any) -> KVPoolProtocol:
    """The kvcompat adapter of a vLLM connector's ``kv_caches`` and ``KVCacheConfig``.

    What ``kvcompat.adapt(kv_caches, config=kv_cache_config)`` returns: a leaf adapter
    for a single-format cache, a composite (``is_composite_pool`` True) for several.

    Raises:
        UnsupportedPoolError: ``config`` is not vLLM's ``KVCacheConfig``, or a layer's
            mode (NVFP4, TurboQuant, per-token-head, ``kv_head_major_slots``, Mamba ...)
            has no kvcompat codec; the message names it.
        LayoutError: the views and the config disagree.

    Example:
        >>> try:
        ...     adapt_vllm({}, config=object())
        ... except Exception as exc:
        ...     print(type(exc).__name__)
        UnsupportedPoolError
    """
    plan = plan_vllm(kv_caches, config)
    parts = components_of(plan)
    if len(parts) == 1:
        ((name, layers),) = parts.items()
        native = VLLMKVCaches(kv_caches, config, plan)
        return _BY_KIND[layers[0].fmt.kind](native, layers)
    native = VLLMKVCaches(kv_caches, config, plan)
    components: dict[str, VLLMAdapter] = {}
    for name, layers in parts.items():
        sub = VLLMKVCaches(kv_caches, config, _sub_plan(plan, {layer.name for layer in layers}))
        components[name] = _BY_KIND[layers[0].fmt.kind](sub, layers, component=name)
    route: dict[int, str] = {}
    for name, adapter in sorted(
        components.items(), key=lambda item: (_PRIMARY[item[1].kind], item[0] != "swa")
    ):
        for layer in adapter.layer_ids:
            route.setdefault(layer, name)
    return VLLMCompositeAdapter(native, components=components, route=route, name="vllm")


def _sub_plan(plan: VLLMPlan, names: set[str]) -> VLLMPlan:
    layers = {name: layer for name, layer in plan.layers.items() if name in names}
    return VLLMPlan(MappingProxyType(layers), plan.num_blocks, plan.layout, plan.groups)


def refuse_config(pool: Any, config: Any) -> UnsupportedPoolError:
    """The error for ``adapt(pool, config=...)`` where ``pool`` is not a vLLM cache dict."""
    msg = (
        f"adapt() takes config= only with vLLM's kv_caches dict; got a "
        f"{type(pool).__qualname__} and config={type(config).__qualname__}.\n"
        "Hint: SGLang pools carry their own geometry: call kvcompat.adapt(pool) without "
        "config; for vLLM pass kvcompat.adapt(kv_caches, config=kv_cache_config)."
    )
    return UnsupportedPoolError(msg)


def needs_config(pool: Any) -> UnsupportedPoolError:
    """The error for ``adapt(kv_caches)`` without the config."""
    msg = (
        f"adapt() got a dict of {len(pool)} tensor(s), which looks like vLLM's kv_caches: "
        "a dict alone does not say which format the views hold or how they are placed.\n"
        "Hint: pass the KVCacheConfig your connector received: "
        "kvcompat.adapt(kv_caches, config=kv_cache_config)."
    )
    return UnsupportedPoolError(msg)


def _describe(walk: Any, native: Any, *, name: str, path: str) -> Any:
    """Describe a vLLM worker's caches (every registered view, each block run once)."""
    from kvcompat.inspection._vllm import vllm_node  # noqa: PLC0415 (inspection imports us)

    return vllm_node(walk, native, components_of(native.plan), name=name, path=path)


_install(
    Family(
        VLLM_NATIVE,
        None,
        reason="it is what a vLLM adapter wraps; adapt the kv_caches dict with config=.",
        parts=CompositeParts(describe=_describe),
    )
)
