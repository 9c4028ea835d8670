"""Every layer of a composite's components in one call: one launch per byte layout.

A DeepSeek-V4 pool keeps its sliding-window pages, its c4 and c128 compressed pages and
its indexer keys in separate components, each with its own layer ids, page size and token
space. :meth:`CompositeAdapter.plan_components` plans all of them at once: the components
that share a byte layout (the three V4 ones) become one
:class:`~kvcompat._ops.SpacesPlan`, read or written by one launch on CUDA, and each call
takes one location tensor per component, in that component's own space.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch

from kvcompat._errors import LayoutError, WriteError
from kvcompat._ops import SpacesPlan, check_impl, plan_spaces, read_spaces, write_spaces
from kvcompat.adapters._multi import aliases_key

if TYPE_CHECKING:
    from kvcompat._protocol import Impl
    from kvcompat.adapters._io import LayerLayout

__all__ = ["ComponentsPlan"]


class ComponentsPlan:
    """Every layer of some components of a composite pool, planned once for all their calls.

    Made by :meth:`~kvcompat.adapters.CompositeAdapter.plan_components`. The components'
    buffers are grouped by byte layout and buffer role (keys, values): each group is one
    launch on CUDA where the kernel takes several token spaces (the e4m3-tile layouts:
    V4, V4.1, DSA, the DeepSeek-V4 indexer; up to four spaces a launch), one launch per
    component otherwise; the torch twin gives the same bytes. A pool whose buffers are
    replaced is re-planned on the next call by itself.

    ``components`` are the planned component names, in call order; ``layers`` maps each
    to its layer ids (``out[name][i]`` is layer ``layers[name][i]``); ``layouts`` names
    the byte layout of each launch group (one per layout and buffer role), in launch order.

    Example:
        >>> import torch, kvcompat
        >>> from kvcompat.testing import reference_swa_pool
        >>> pool = kvcompat.adapt(reference_swa_pool())
        >>> step = pool.plan_components()
        >>> locs = {"full": torch.tensor([1, 2]), "swa": torch.tensor([0])}
        >>> {name: tuple(k.shape) for name, k in step.read(locs).items()}
        {'full': (2, 2, 2, 8), 'swa': (2, 1, 2, 8)}
    """

    __slots__ = (
        "_adapter", "_groups", "_labels", "_layouts", "_raws", "_separate", "components",
        "layers", "layouts",
    )  # fmt: skip

    def __init__(self, adapter: Any, names: tuple[str, ...]) -> None:
        self._adapter = adapter
        self.components = names
        parts = adapter.components
        self.layers: Mapping[str, tuple[int, ...]] = MappingProxyType(
            {name: tuple(parts[name].layer_ids) for name in names}
        )
        self._build()

    def _build(self) -> None:
        parts = self._adapter.components
        grouped: dict[tuple[Any, bool, str], list[tuple[str, str, list[torch.Tensor], int]]] = {}
        layouts: dict[str, LayerLayout] = {}
        raws = []
        for name in self.components:
            part, ids = parts[name], self.layers[name]
            found = [part.layout(layer) for layer in ids]
            odd = [layer for layer, lay in zip(ids, found, strict=True) if lay != found[0]]
            if odd:
                msg = (
                    f"{self._adapter.name}: component {name!r} holds layers {odd} in another "
                    f"byte layout than layer {ids[0]} ({found[0].key.name}); one call moves "
                    "each component's layers with one layout.\nHint: plan those layers with "
                    f"pool.components[{name!r}].plan(layer_ids)."
                )
                raise LayoutError(msg)
            layout = layouts[name] = found[0]
            keys = [part.get_key_buffer(layer, wait=False) for layer in ids]
            roles = [("key", layout.key, keys)]
            if layout.value is not None and part.value_attr is not None:
                values = [part.get_value_buffer(layer, wait=False) for layer in ids]
                roles.append(("value", layout.value, values))
            for role, spec, bufs in roles:
                entry = (name, role, bufs, part.page_size)
                grouped.setdefault((spec, layout.fnuz, role), []).append(entry)
            raws.append((part, part._layer_entries(ids)))
        self._layouts = layouts
        self._raws = raws
        self._groups: list[tuple[SpacesPlan, list[tuple[str, str]]]] = [
            (
                plan_spaces(spec, [(bufs, page) for _, _, bufs, page in entries], fnuz=fnuz),
                [(name, role) for name, role, _, _ in entries],
            )
            for (spec, fnuz, _), entries in grouped.items()
        ]
        self.layouts = tuple(plan.spec.name for plan, _ in self._groups)
        self._separate = frozenset(n for _, m in self._groups for n, role in m if role == "value")
        self._labels = [
            [f"{name!r} component's {role}" for name, role in m] for _, m in self._groups
        ]
        first = self._groups[0][0].spaces[0].bufs[0]
        if first.is_cuda:  # the launch tables now, so that a captured call builds none
            for plan, _ in self._groups:
                with contextlib.suppress(ImportError):  # no triton: the twin serves
                    if len(plan.spaces) > 1:
                        plan.table()

    def _fresh(self) -> None:
        """Re-plan when a component's buffers changed since the plan was made."""
        if not all(part._entries_unchanged(entries) for part, entries in self._raws):
            self._build()

    def _wait(self, wait: bool) -> None:
        if wait:  # layers arrive in order: the last one of each component waits for all
            parts = self._adapter.components
            for name in self.components:
                parts[name].get_key_buffer(max(self.layers[name]), wait=True)

    def _mapping(
        self, given: object, what: str, error: type[LayoutError] | type[WriteError]
    ) -> Mapping[str, Any]:
        names = set(self.components)
        if not isinstance(given, Mapping) or set(given) != names:
            got = sorted(map(str, given)) if isinstance(given, Mapping) else type(given).__name__
            msg = (
                f"{self._adapter.name}: {what} must map every planned component to its "
                f"tensor: {sorted(names)}; received {got}.\nHint: pass "
                f"{{name: tensor}} for each of plan.components, each in its own space."
            )
            raise error(msg)
        return given

    def read(
        self,
        locs: Mapping[str, torch.Tensor],
        /,
        *,
        wait: bool = True,
        validate: bool = True,
        impl: Impl = "auto",
    ) -> dict[str, torch.Tensor]:
        """Dense keys of every planned component: name -> ``[layers, n, heads, head_dim]``.

        ``locs[name]`` is a 1-D tensor of locations in that component's own token space
        (the same on each of its layers), or ``[layers, n]`` with a row per layer. The
        same values as ``pool.components[name].plan().read(locs[name])`` for each
        component; each component's locations are checked against it (one host sync
        each); the components sharing a layout are read by one launch.

        Raises:
            LayoutError: not one location tensor per planned component, or a bad one;
                nothing is read.

        Example:
            >>> import torch, kvcompat
            >>> from kvcompat.testing import reference_swa_pool
            >>> step = kvcompat.adapt(reference_swa_pool()).plan_components(["swa"])
            >>> step.read({"swa": torch.tensor([3])})["swa"].shape
            torch.Size([2, 1, 2, 8])
        """
        check_impl(impl)
        locs = self._mapping(locs, "locs", LayoutError)
        self._fresh()
        self._wait(wait)
        found: dict[str, torch.Tensor] = {}
        for (plan, members), labels in zip(self._groups, self._labels, strict=True):
            if members[0][1] != "key":  # a group of value buffers
                continue
            dense = read_spaces(
                plan, [locs[name] for name, _ in members], validate=validate, impl=impl,
                names=labels,
            )  # fmt: skip
            spec = plan.spec
            for (name, _), rows in zip(members, dense, strict=True):
                found[name] = rows.view(*rows.shape[:2], spec.heads, spec.dim // spec.heads)
        return {name: found[name] for name in self.components}

    def write(
        self,
        locs: Mapping[str, torch.Tensor],
        keys: Mapping[str, torch.Tensor],
        values: Mapping[str, torch.Tensor] | None = None,
        /,
        *,
        check_finite: bool = True,
        validate: bool = True,
        impl: Impl = "auto",
    ) -> None:
        """Store ``keys[name]`` (and ``values[name]``) at ``locs[name]`` of every component.

        All or nothing across every component and layer: each is checked (locations in
        its own space, shapes ``[layers, n, heads, head_dim]`` or ``[layers, n, dim]``,
        dtypes, finiteness) before any byte moves, and the torch twin stores everything
        with one commit that puts the old bytes back if a store raises. ``values`` names
        the components that keep separate value buffers (and only those).

        Raises:
            WriteError: bad locations, shapes, dtypes or values of any component, or
                values missing or given where a component keeps none; nothing is written.

        Example:
            >>> import torch, kvcompat
            >>> from kvcompat.testing import reference_swa_pool
            >>> pool = kvcompat.adapt(reference_swa_pool())
            >>> step = pool.plan_components(["swa"])
            >>> k = torch.ones(2, 1, 2, 8, dtype=torch.bfloat16)
            >>> step.write({"swa": torch.tensor([3])}, {"swa": k}, {"swa": 2 * k})
            >>> pool.components["swa"].read_kv(2, torch.tensor([3])).value[0, 0, 0].item()
            2.0
        """
        check_impl(impl)
        locs = self._mapping(locs, "locs", WriteError)
        keys = self._mapping(keys, "keys", WriteError)
        separate = self._separate
        given = dict(values or {})
        for name in self.components:
            layout = self._layouts[name]
            if name in separate and name not in given:
                msg = (
                    f"{self._adapter.name}: component {name!r} stores keys and values "
                    "separately; write() got no values for it.\nHint: pass "
                    f"values={{{name!r}: ...}}."
                )
                raise WriteError(msg)
            if (
                name not in separate
                and name in given
                and not aliases_key(given[name], keys[name], layout.value_dim)
            ):
                msg = (
                    f"{self._adapter.name}: component {name!r} keeps no separate values: "
                    "write() got a values tensor for it, which would be dropped.\nHint: "
                    "leave it out of values (or pass its key tensor)."
                )
                raise WriteError(msg)
        unknown = sorted(set(given) - set(self.components))
        if unknown:
            msg = (
                f"{self._adapter.name}: values name components {unknown} that are not "
                f"planned ({list(self.components)}). Hint: plan them, or leave them out."
            )
            raise WriteError(msg)
        self._fresh()
        parts = []
        for plan, members in self._groups:
            sources = [keys[name] if role == "key" else given[name] for name, role in members]
            parts.append((plan, [locs[name] for name, _ in members], sources))
        try:
            write_spaces(
                parts, check_finite=check_finite, validate=validate, impl=impl, names=self._labels
            )
        except WriteError as exc:
            msg = f"{self._adapter.name}: {exc}"
            raise WriteError(msg) from None

    def __repr__(self) -> str:
        return (
            f"ComponentsPlan({self._adapter.name}, components={list(self.components)}, "
            f"launch groups={list(self.layouts)})"
        )
