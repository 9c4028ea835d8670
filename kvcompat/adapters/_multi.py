"""Many layers of one pool in one call: a plan made once, run per step.

:meth:`LeafAdapter.plan` returns a :class:`LayerPlan`: the layers' buffers, their byte
layout and every check that does not depend on the tokens, resolved once. Its
``read`` / ``read_kv`` / ``write`` then check the locations and values once for all the
layers and move them with one Triton launch per buffer role (keys, values), or the
torch twin layer by layer with the same bytes. ``pool.read_layers`` /
``pool.write_layers`` are the same calls through a plan the adapter keeps.

The shape is FlashInfer's paged-KV wrappers': ``plan`` once (per model, or per step
when the layer set changes), ``run`` every step; with ``validate=False`` and a
pre-allocated ``out`` a Triton read allocates nothing and can be captured in a CUDA
graph.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch

from kvcompat._errors import LayerOutOfRangeError, LayoutError, WriteError
from kvcompat._ops import (
    LayersPlan,
    check_impl,
    plan_layers,
    read_layers,
    write_layer_parts,
)
from kvcompat._protocol import Impl, KVPair

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kvcompat.adapters._io import LayerLayout

__all__ = ["LayerPlan", "aliases_key", "layer_tuple"]


def layer_tuple(layers: object, served: Sequence[int], owner: str) -> tuple[int, ...]:
    """``layers`` as a tuple of distinct served layer ids (None: every served layer).

    Example:
        >>> layer_tuple([3, 1], (0, 1, 2, 3), "pool")
        (3, 1)
    """
    if layers is None:
        return tuple(served)
    if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
        msg = (
            f"{owner}: layers must be a sequence of layer ids (or None for every layer); "
            f"received {type(layers).__name__}. Hint: pool.plan([0, 1, 2]) or pool.plan()."
        )
        raise LayoutError(msg)
    found = tuple(layers)
    bad = [layer for layer in found if type(layer) is not int]
    if bad or not found:
        what = f"non-integer ids {bad[:4]!r}" if bad else "no layer ids"
        msg = f"{owner}: layers must be integer layer ids; received {what}."
        raise LayoutError(msg)
    if len(set(found)) != len(found):
        repeated = sorted({layer for layer in found if found.count(layer) > 1})
        msg = (
            f"{owner}: layers must be distinct; received {repeated} more than once. "
            "Hint: a multi-layer call moves each layer once."
        )
        raise LayoutError(msg)
    unserved = [layer for layer in found if layer not in served]
    if unserved:
        msg = (
            f"{owner}: layers {unserved} are not served by this pool (it serves "
            f"{list(served)}). Hint: pass ids from pool.layer_ids."
        )
        raise LayerOutOfRangeError(msg)
    return found


class LayerPlan:
    """Several layers of one leaf pool, planned once for reads and writes of all of them.

    Made by :meth:`~kvcompat.adapters.LeafAdapter.plan`. Every layer must have the same
    byte layout (one launch reads them all); a pool whose buffers are replaced (SGLang
    rebuilds them on resize) is re-planned on the next call by itself.

    Attributes:
        layers: the absolute layer ids, in call order (``out[i]`` is ``layers[i]``).
        layout: the layers' shared :class:`~kvcompat.adapters.LayerLayout`.

    Example:
        >>> import torch, kvcompat
        >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
        >>> pool = kvcompat.adapt(ReferenceDeepSeekV4SingleKVPool(size=128, page_size=64,
        ...                                                       layer_num=4))
        >>> step = pool.plan()                      # every layer, checked once
        >>> loc = torch.tensor([3, 70])
        >>> step.write(loc, torch.ones(4, 2, 1, 512))  # [layers, n, heads, head_dim]
        >>> step.read(loc).shape
        torch.Size([4, 2, 1, 512])
    """

    __slots__ = ("_adapter", "_key", "_raws", "_value", "layers", "layout")

    def __init__(self, adapter: Any, layers: tuple[int, ...]) -> None:
        self._adapter = adapter
        self.layers = layers
        self._build()

    def _build(self) -> None:
        adapter, layers = self._adapter, self.layers
        keys = [adapter.get_key_buffer(layer, wait=False) for layer in layers]
        layouts = [adapter.layout(layer) for layer in layers]
        first = layouts[0]
        odd = [layer for layer, lay in zip(layers, layouts, strict=True) if lay != first]
        if odd:
            msg = (
                f"{adapter.name}: layers {odd} have another byte layout than layer "
                f"{layers[0]} ({first.key.name}); one multi-layer call moves one layout.\n"
                "Hint: plan each group of layers with the same pool.layout(l) separately."
            )
            raise LayoutError(msg)
        page_size = adapter.page_size
        self.layout: LayerLayout = first
        self._key: LayersPlan = plan_layers(first.key, keys, page_size, fnuz=first.fnuz)
        self._value: LayersPlan | None = None
        if first.value is not None and adapter.value_attr is not None:
            values = [adapter.get_value_buffer(layer, wait=False) for layer in layers]
            self._value = plan_layers(first.value, values, page_size, fnuz=first.fnuz)
        self._raws = adapter._layer_entries(layers)
        if keys[0].is_cuda:  # the launch table now, so that a captured call allocates nothing
            for part in (self._key, self._value):
                if part is not None:
                    with contextlib.suppress(ImportError):  # no triton: the twin serves
                        part.bases()

    def _fresh(self) -> None:
        """Re-plan when the pool's buffers changed since the plan was made."""
        if not self._adapter._entries_unchanged(self._raws):
            self._build()

    def _wait(self, wait: bool) -> None:
        if wait:
            # Layers arrive in order: waiting for the last one planned waits for all.
            self._adapter.get_key_buffer(max(self.layers), wait=True)

    def read(
        self,
        loc: torch.Tensor,
        /,
        *,
        out: torch.Tensor | None = None,
        wait: bool = True,
        validate: bool = True,
        impl: Impl = "auto",
    ) -> torch.Tensor:
        """Dense keys of tokens ``loc`` on every planned layer: ``[layers, n, heads, head_dim]``.

        The same values as ``torch.stack([pool.read(l, loc) for l in plan.layers])``, in
        one launch. ``loc`` is checked once (one host sync); ``out`` may be given
        (``[layers, n, heads, head_dim]``, contiguous), and with ``validate=False`` the
        Triton read can be captured in a CUDA graph.

        Example:
            >>> import torch, kvcompat
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> pool = kvcompat.adapt(ReferenceMHATokenToKVPool(size=16, page_size=1,
            ...                                                 layer_num=3))
            >>> pool.plan([2, 0]).read(torch.tensor([5])).shape
            torch.Size([2, 1, 1, 128])
        """
        check_impl(impl)
        self._fresh()
        self._wait(wait)
        spec = self._key.spec
        flat = None if out is None else _flat_out(out, len(self.layers), spec.dim)
        dense = read_layers(self._key, loc, out=flat, validate=validate, impl=impl)
        if out is not None:
            return out
        return dense.view(dense.shape[0], dense.shape[1], spec.heads, spec.dim // spec.heads)

    def read_kv(
        self,
        loc: torch.Tensor,
        /,
        *,
        wait: bool = True,
        validate: bool = True,
        impl: Impl = "auto",
    ) -> KVPair:
        """Dense ``(keys, values)`` of tokens ``loc`` on every planned layer, stacked.

        As ``LeafAdapter.read_kv`` per layer: split pools read both buffers, latent
        pools' values are the keys' leading ``value_dim`` columns (a view), single-KV
        pools' values are the keys.

        Example:
            >>> import torch, kvcompat
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> pool = kvcompat.adapt(ReferenceMHATokenToKVPool(size=16, page_size=1,
            ...                                                 layer_num=2))
            >>> k, v = pool.plan().read_kv(torch.tensor([1, 2]))
            >>> k.shape, v.shape
            (torch.Size([2, 2, 1, 128]), torch.Size([2, 2, 1, 128]))
        """
        keys = self.read(loc, wait=wait, validate=validate, impl=impl)
        adapter, layout = self._adapter, self.layout
        component = adapter._component
        if self._value is not None:
            spec = self._value.spec
            dense = read_layers(self._value, loc, validate=validate, impl=impl)
            values = dense.view(dense.shape[0], dense.shape[1], spec.heads, spec.dim // spec.heads)
            return KVPair(keys, values, shared=False, component=component)
        if not adapter.kind.has_values:
            adapter._missing_value(self.layers[0])
        if layout.value_dim is not None:
            return KVPair(keys, keys[..., : layout.value_dim], shared=True, component=component)
        return KVPair(keys, keys, shared=True, component=component)

    def write(
        self,
        loc: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor | None = None,
        /,
        *,
        check_finite: bool = True,
        validate: bool = True,
        impl: Impl = "auto",
    ) -> None:
        """Store ``key[i]`` (and ``value[i]``) at ``loc`` of layer ``layers[i]``, all or nothing.

        ``key`` is ``[layers, n, heads, head_dim]`` (or ``[layers, n, dim]``). Every
        layer's part is checked before any byte moves and the write is all or nothing,
        as ``LeafAdapter.write`` is for one layer; ``loc`` is checked once.

        Raises:
            WriteError: bad locations, shapes, dtypes, values, or a value where the pool
                keeps none; nothing is written.

        Example:
            >>> import torch, kvcompat
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> pool = kvcompat.adapt(ReferenceMHATokenToKVPool(size=16, page_size=1,
            ...                                                 layer_num=2))
            >>> k = torch.ones(2, 1, 1, 128, dtype=torch.bfloat16)
            >>> pool.plan().write(torch.tensor([4]), k, 2 * k)
            >>> pool.read_kv(1, torch.tensor([4])).value[0, 0, 0].item()
            2.0
        """
        check_impl(impl)
        self._fresh()
        parts: list[tuple[LayersPlan, object]] = [(self._key, key)]
        adapter, layout = self._adapter, self.layout
        if self._value is not None:
            if value is None:
                msg = (
                    f"{adapter.name} stores keys and values separately; write() got no "
                    f"values for layers {list(self.layers)}.\n"
                    "Hint: pass the values: plan.write(loc, keys, values)."
                )
                raise WriteError(msg)
            parts.append((self._value, value))
        elif value is not None and not aliases_key(value, key, layout.value_dim):
            where = (
                "stores keys only"
                if not adapter.kind.has_values
                else "keeps the value inside the key row"
            )
            msg = (
                f"{adapter.name} ({adapter.kind.value}) {where}: write() got a separate "
                "value tensor, which would be dropped.\n"
                "Hint: pass value=None (or the key tensor / its prefix view)."
            )
            raise WriteError(msg)
        try:
            write_layer_parts(parts, loc, check_finite=check_finite, validate=validate, impl=impl)
        except WriteError as exc:
            msg = f"{adapter.name}: {exc}"
            raise WriteError(msg) from None

    def __repr__(self) -> str:
        roles = "key, value" if self._value is not None else "key"
        return (
            f"LayerPlan({self._adapter.name}, layers={list(self.layers)}, "
            f"layout={self._key.spec.name!r}, buffers=({roles}))"
        )


def _flat_out(out: object, layers: int, dim: int) -> torch.Tensor:
    if not isinstance(out, torch.Tensor) or out.dim() < 2 or not out.is_contiguous():
        got = (
            f"shape {list(out.shape)}, contiguous={out.is_contiguous()}"
            if isinstance(out, torch.Tensor)
            else type(out).__name__
        )
        msg = f"out must be a contiguous [layers, n, heads, head_dim] tensor; received {got}."
        raise LayoutError(msg)
    if out.numel() % (layers * dim):
        msg = (
            f"out must be a [{layers}, n, heads, head_dim] tensor of {dim} values per token "
            f"and layer; received shape {list(out.shape)}."
        )
        raise LayoutError(msg)
    return out.view(layers, out.numel() // (layers * dim), dim)


def aliases_key(value: object, key: object, value_dim: int | None) -> bool:
    """Whether ``value`` is the key itself or (latent pools) its leading-columns view."""
    if value is key:
        return True
    if not isinstance(value, torch.Tensor) or not isinstance(key, torch.Tensor):
        return False
    return (
        value_dim is not None
        and value.data_ptr() == key.data_ptr()
        and value.shape[:-1] == key.shape[:-1]
        and value.shape[-1] == value_dim
        and value.stride() == key.stride()
    )
