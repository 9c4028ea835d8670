"""Adapter for composite pools: pools that route each layer to a sub-pool."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from kvcompat._errors import LayoutError
from kvcompat._protocol import Impl, KVPair, KVPoolProtocol, PoolKind
from kvcompat.adapters._base import AdapterBase
from kvcompat.adapters._components import ComponentsPlan
from kvcompat.adapters._layers import coerce_layer_id, describe_ids, raise_unserved
from kvcompat.adapters._leaf import LeafAdapter
from kvcompat.adapters._multi import LayerPlan, layer_tuple

__all__ = ["CompositeAdapter", "CompositeParts"]


def _as_component(adapter: KVPoolProtocol, name: str) -> KVPoolProtocol:
    """A leaf adapter re-labelled so its pairs and ``component_for`` carry ``name``."""
    if isinstance(adapter, LeafAdapter) and adapter.component_name != name:
        owner, index = adapter.wait_plan
        return type(adapter)(
            adapter.native,
            slots=adapter.storage_slots,
            component=name,
            waits=adapter.waits,
            wait_owner=owner,
            wait_index=index,
        )
    return adapter


class CompositeAdapter(AdapterBase):
    """A pool made of named component pools, each itself a :class:`KVPoolProtocol`.

    ``route`` maps every served absolute layer id to the component holding that
    layer's *primary* buffer; the composite's getters answer from it, and
    :meth:`component_for` (or ``get_kv_buffer(l).component``) names it. The
    components keep their own layer ids (absolute ids too), so a compressed
    sub-pool serving only some layers is reached as ``pool.components["c4"]``.

    Args:
        native: the native composite pool.
        components: component name -> adapter.
        route: absolute layer id -> name of the component serving it.
        wait_offset: when set, the composite itself calls
            ``layer_transfer_counter.wait_until(layer_id - wait_offset)`` and asks
            the part not to wait; when None (the built-in composites), each part
            performs the wait itself (each part's adapter is built with its own
            wait), so a part used directly waits too.
        name: display name (defaults to the native class name).

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool
        >>> from kvcompat.adapters import CompositeAdapter
        >>> full = kvcompat.adapt(ReferenceMHATokenToKVPool(size=16, page_size=16, layer_num=1))
        >>> pool = CompositeAdapter(object(), components={"full": full}, route={0: "full"})
        >>> pool.component_for(0), pool.get_key_buffer(0) is full.get_key_buffer(0)
        ('full', True)
    """

    kind: PoolKind = PoolKind.COMPOSITE
    """Always :attr:`PoolKind.COMPOSITE`."""

    __slots__ = (
        "_components",
        "_layer_plans",
        "_name",
        "_native",
        "_route",
        "_route_names",
        "_wait_offset",
    )

    def __init__(
        self,
        native: Any,
        *,
        components: Mapping[str, KVPoolProtocol],
        route: Mapping[int, str],
        wait_offset: int | None = None,
        name: str | None = None,
    ) -> None:
        self._native = native
        self._name = name or type(native).__name__
        self._components = MappingProxyType(
            {part: _as_component(adapter, part) for part, adapter in components.items()}
        )
        unknown = sorted({part for part in route.values() if part not in self._components})
        if unknown:
            msg = (
                f"{self._name}: route names components {unknown} that are not among "
                f"{sorted(self._components)}."
            )
            raise LayoutError(msg)
        missing = sorted(
            layer for layer, part in route.items() if layer not in self._components[part].layer_ids
        )
        if missing:
            msg = f"{self._name}: layers {missing} are routed to components that do not serve them."
            raise LayoutError(msg)
        self._route: dict[int, KVPoolProtocol] = {
            layer: self._components[part] for layer, part in sorted(route.items())
        }
        self._route_names: dict[int, str] = dict(sorted(route.items()))
        self._wait_offset = wait_offset
        self._layer_plans: dict[tuple[Any, ...], LayerPlan | ComponentsPlan] = {}

    # -- the hot path -----------------------------------------------------------

    def get_key_buffer(self, layer_id: int, /, *, wait: bool = True) -> torch.Tensor:
        """The primary key storage of ``layer_id``, from the component that owns it.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import reference_swa_pool
            >>> pool = kvcompat.adapt(reference_swa_pool())
            >>> pool.get_key_buffer(0) is pool.components["swa"].get_key_buffer(0)
            True
        """
        if type(layer_id) is not int:
            layer_id = coerce_layer_id(layer_id, self._name)
        try:
            part = self._route[layer_id]
        except KeyError:
            raise_unserved(layer_id, self._name, self._route)
        if wait and self._wait_offset is not None:
            counter = getattr(self._native, "layer_transfer_counter", None)
            if counter is not None:
                counter.wait_until(layer_id - self._wait_offset)
            wait = False  # the composite's wait stands for the part's
        return part.get_key_buffer(layer_id, wait=wait)

    def get_value_buffer(self, layer_id: int, /, *, wait: bool = True) -> torch.Tensor:
        """The primary value storage of ``layer_id`` (shared storage on single-KV parts).

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import reference_swa_pool
            >>> pool = kvcompat.adapt(reference_swa_pool())
            >>> pool.get_value_buffer(1) is pool.components["full"].get_value_buffer(1)
            True
        """
        if type(layer_id) is not int:
            layer_id = coerce_layer_id(layer_id, self._name)
        try:
            part = self._route[layer_id]
        except KeyError:
            raise_unserved(layer_id, self._name, self._route)
        if wait and self._wait_offset is not None:
            counter = getattr(self._native, "layer_transfer_counter", None)
            if counter is not None:
                counter.wait_until(layer_id - self._wait_offset)
            wait = False  # the composite's wait stands for the part's
        return part.get_value_buffer(layer_id, wait=wait)

    def get_kv_buffer(self, layer_id: int, /, *, wait: bool = True) -> KVPair:
        """The primary ``(key, value)`` pair; ``pair.component`` names who answered.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import reference_swa_pool
            >>> pool = kvcompat.adapt(reference_swa_pool())
            >>> pool.get_kv_buffer(1).component
            'full'
        """
        if type(layer_id) is not int:
            layer_id = coerce_layer_id(layer_id, self._name)
        try:
            part = self._route[layer_id]
        except KeyError:
            raise_unserved(layer_id, self._name, self._route)
        if wait and self._wait_offset is not None:
            counter = getattr(self._native, "layer_transfer_counter", None)
            if counter is not None:
                counter.wait_until(layer_id - self._wait_offset)
            wait = False  # the composite's wait stands for the part's
        return part.get_kv_buffer(layer_id, wait=wait)

    def component_for(self, layer_id: int, /) -> str | None:
        """Name of the component serving the primary buffer of ``layer_id``.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import reference_swa_pool
            >>> pool = kvcompat.adapt(reference_swa_pool())
            >>> [pool.component_for(layer) for layer in pool.layer_ids]
            ['swa', 'full', 'swa', 'full']
        """
        if type(layer_id) is not int:
            layer_id = coerce_layer_id(layer_id, self._name)
        try:
            return self._route_names[layer_id]
        except KeyError:
            raise_unserved(layer_id, self._name, self._route)

    # -- values by token index (the primary component's) --------------------------

    def _part(self, layer_id: int) -> KVPoolProtocol:
        if type(layer_id) is not int:
            layer_id = coerce_layer_id(layer_id, self._name)
        try:
            return self._route[layer_id]
        except KeyError:
            raise_unserved(layer_id, self._name, self._route)

    def layout(self, layer_id: int, /) -> Any:
        """The byte layouts of the primary component's buffers for ``layer_id``.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import reference_swa_pool
            >>> kvcompat.adapt(reference_swa_pool()).layout(1).key.name
            'mha_2x8_bf16'
        """
        return self._part(layer_id).layout(layer_id)

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
        """Dense keys of tokens ``loc`` from the primary component (see ``LeafAdapter.read``).

        ``loc`` addresses the component's own token space (for SGLang's SWA layers, the
        sliding-window pool's locations, i.e. the already-translated ``swa_loc``).

        Example:
            >>> import torch, kvcompat
            >>> from kvcompat.testing import reference_swa_pool
            >>> pool = kvcompat.adapt(reference_swa_pool())
            >>> pool.read(0, torch.tensor([3])).shape
            torch.Size([1, 2, 8])
        """
        part = self._part(layer_id)
        wait = self._composite_wait(layer_id) if wait else False
        return part.read(layer_id, loc, out=out, wait=wait, validate=validate, impl=impl)

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
        """Dense ``(keys, values)`` of tokens ``loc`` from the primary component.

        Example:
            >>> import torch, kvcompat
            >>> from kvcompat.testing import reference_swa_pool
            >>> pool = kvcompat.adapt(reference_swa_pool())
            >>> pool.read_kv(1, torch.tensor([3])).component
            'full'
        """
        part = self._part(layer_id)
        wait = self._composite_wait(layer_id) if wait else False
        return part.read_kv(layer_id, loc, wait=wait, validate=validate, impl=impl)

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
        """Write keys (and values) of the primary component at ``loc`` — all or nothing.

        ``loc`` addresses the component's own token space (see :meth:`read`).

        Example:
            >>> import torch, kvcompat
            >>> from kvcompat.testing import reference_swa_pool
            >>> pool = kvcompat.adapt(reference_swa_pool())
            >>> k = torch.ones(1, 2, 8, dtype=torch.bfloat16)
            >>> pool.write(1, torch.tensor([4]), k, 2 * k)
            >>> pool.read_kv(1, torch.tensor([4])).value[0, 0, 0].item()
            2.0
        """
        self._part(layer_id).write(
            layer_id, loc, key, value, check_finite=check_finite, validate=validate, impl=impl
        )

    def plan(self, layers: Sequence[int] | None = None, /) -> Any:
        """Plan several layers at once (``LeafAdapter.plan``), across components if need be.

        Layers served by one component get that component's plan. Layers spanning
        components of one byte layout and page size get one plan over all of them (one
        launch), whose calls take ``loc`` as ``[layers, n]``: each component has its own
        token space, so row ``i`` addresses layer ``layers[i]``'s component.

        Raises:
            LayoutError: the layers' components differ in layout or page size, or one
                is itself a composite (plan ``pool.components[name]`` per component).

        Example:
            >>> import torch, kvcompat
            >>> from kvcompat.testing import reference_swa_pool
            >>> pool = kvcompat.adapt(reference_swa_pool())
            >>> step = pool.plan()                    # full and sliding-window layers
            >>> loc = torch.tensor([[1, 2]] * len(step.layers))  # one row per layer
            >>> step.read(loc).shape[:2], step.spans_components
            (torch.Size([4, 2]), True)
        """
        found = layer_tuple(layers, self.layer_ids, self._name)
        parts = {self._route_names[layer] for layer in found}
        if len(parts) == 1:
            return self._route[found[0]].plan(found)
        owners = {layer: self._route[layer] for layer in found}
        nested = sorted(
            {self._route_names[layer] for layer, part in owners.items()
             if not hasattr(part, "_layer_entries")}
        )  # fmt: skip
        if nested:
            groups = {
                part: [layer for layer in found if self._route_names[layer] == part]
                for part in sorted(parts)
            }
            msg = (
                f"{self._name}: layers {list(found)} are served by components "
                f"{', '.join(f'{p!r} (layers {ids})' for p, ids in groups.items())}, and "
                f"{nested} are composites themselves.\n"
                "Hint: plan each component's layers with its own locations: "
                "pool.components[name].plan(layer_ids)."
            )
            raise LayoutError(msg)
        hit = self._layer_plans.get(found)
        if hit is None:
            hit = LayerPlan(self, found, owners)
            if len(self._layer_plans) >= 64:
                self._layer_plans.clear()
            self._layer_plans[found] = hit
        return hit

    def plan_components(self, names: Sequence[str] | None = None, /) -> ComponentsPlan:
        """Plan every layer of several components at once (every component when None).

        Each component keeps its own layer ids, page size and token space (DeepSeek-V4's
        sliding-window, c4 and c128 pages and its indexer keys); the plan's ``read`` and
        ``write`` take one location tensor per component, in its own space, and move
        the components that share a byte layout with one launch (on CUDA, for the
        e4m3-tile layouts), all or nothing across every component.

        Raises:
            LayoutError: an unknown or repeated name, a component that is itself a
                composite, or a component whose layers differ in layout.

        Example:
            >>> import torch, kvcompat
            >>> from kvcompat.testing import reference_swa_pool
            >>> step = kvcompat.adapt(reference_swa_pool()).plan_components()
            >>> step.components, step.layers["swa"], step.layouts
            (('full', 'swa'), (0, 2), ('mha_2x8_bf16', 'mha_2x8_bf16'))
        """
        found = tuple(self._components) if names is None else names
        if isinstance(found, (str, bytes)) or not all(isinstance(n, str) for n in found):
            msg = (
                f"{self._name}: names must be a sequence of component names (or None for "
                f"every component); received {found!r}. Hint: pool.plan_components(['c4'])."
            )
            raise LayoutError(msg)
        picked = tuple(found)
        unknown = [name for name in picked if name not in self._components]
        if unknown or not picked or len(set(picked)) != len(picked):
            msg = (
                f"{self._name}: plan_components takes distinct names of its components "
                f"{list(self._components)}; received {list(picked)}."
            )
            raise LayoutError(msg)
        nested = [n for n in picked if not hasattr(self._components[n], "_layer_entries")]
        if nested:
            msg = (
                f"{self._name}: components {nested} are composites themselves.\nHint: plan "
                "their components: pool.components[name].plan_components()."
            )
            raise LayoutError(msg)
        key = ("components", picked)
        hit = self._layer_plans.get(key)
        if not isinstance(hit, ComponentsPlan):
            hit = ComponentsPlan(self, picked)
            if len(self._layer_plans) >= 64:
                self._layer_plans.clear()
            self._layer_plans[key] = hit
        return hit

    def _composite_wait(self, layer_id: int) -> bool:
        """Perform the composite's own wait if it has one; returns whether the part must."""
        if self._wait_offset is None:
            return True
        counter = getattr(self._native, "layer_transfer_counter", None)
        if counter is not None:
            counter.wait_until(layer_id - self._wait_offset)
        return False

    # -- metadata ---------------------------------------------------------------

    @property
    def components(self) -> Mapping[str, KVPoolProtocol]:
        """Component name -> adapter, in the native pool's order.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import reference_swa_pool
            >>> list(kvcompat.adapt(reference_swa_pool()).components)
            ['full', 'swa']
        """
        return self._components

    @property
    def layer_ids(self) -> tuple[int, ...]:
        """The absolute layer ids with a primary buffer, ascending.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import reference_swa_pool
            >>> kvcompat.adapt(reference_swa_pool()).layer_ids
            (0, 1, 2, 3)
        """
        return tuple(self._route)

    @property
    def device(self) -> torch.device:
        """Device of the first component's storage.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import reference_swa_pool
            >>> kvcompat.adapt(reference_swa_pool()).device
            device(type='cpu')
        """
        for part in self._components.values():
            return part.device
        return torch.device(self._native.device)

    def __repr__(self) -> str:
        parts = ", ".join(
            f"{name}: {describe_ids(part.layer_ids)}" for name, part in self._components.items()
        )
        return (
            f"<kvcompat CompositeAdapter native={type(self._native).__qualname__} "
            f"components={{{parts}}}>"
        )


@dataclass(frozen=True, eq=False)
class CompositeParts:
    """Public hook: what a composite family declares beyond its components.

    ``describe``, ``memory_report`` and ``transfer_descriptors`` describe a composite
    as one child per adapter component; a family declares here what that alone
    does not say. Give it to :func:`kvcompat.register_adapter` (``parts=``) with the
    family's factory.

    Attributes:
        regroup: component name -> ``{declared transfer group: group reported}``;
            e.g. SGLang registers ``SWAKVPool``'s sliding-window pages as PD
            ``"state"``, not ``"kv"``. A group mapped to None is not transferred.
        linear_state: node name -> native attribute holding a linear-attention
            (mamba) state pool the composite owns besides its KV components; each
            state tensor leads with the mamba-layer axis.
        describe: ``describe(walk, native, *, name, path)`` describing the whole
            native pool from its attributes instead (for pools that also have
            modes kvcompat cannot adapt); such a pool is described without being
            adapted.

    Example:
        >>> from kvcompat.adapters import CompositeParts
        >>> CompositeParts(regroup={"swa": {"kv": "state"}}).regroup["swa"]
        {'kv': 'state'}
    """

    regroup: Mapping[str, Mapping[str, str | None]] = field(default_factory=dict)
    linear_state: Mapping[str, str] = field(default_factory=dict)
    describe: Callable[..., Any] | None = None
