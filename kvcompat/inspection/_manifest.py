"""``describe(pool)``: a manifest tree of a KV pool and every part it owns.

The manifest is built from attribute reads only (see :mod:`._static`): no
native getter, no property, no layer-transfer wait, no allocation and no
collective runs, so it is safe to call from a profiler thread on a live
server. Each node is one part of the pool (the pool itself, a sub-pool, a
group of compress-state pools, a request window...); each tensor entry says
where the buffer lives (its attribute path), what it holds (its role), which
absolute layers it serves, its geometry and the identity of the storage it
views, so that views can be de-duplicated (:func:`kvcompat.inspection.memory_report`)
and transferred (:func:`kvcompat.inspection.transfer_descriptors`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvcompat._compat._marker import unwrap_proxy
from kvcompat._errors import KVCompatError, UnsupportedPoolError
from kvcompat._protocol import KVPoolProtocol, PoolKind
from kvcompat._registry import Family, adapt, family_of, qualified_name
from kvcompat.adapters import CompositeAdapter, CompositeParts, LeafAdapter
from kvcompat.inspection._build import (
    Walk,
    _layout_name,
    details_of,
    entry,
    int_or_none,
    leaf_node,
    opaque_node,
    row_bytes,
)
from kvcompat.inspection._model import (
    PoolManifest,
    Role,
    TensorManifest,
    TransferGroup,
    TransferRegion,
)
from kvcompat.inspection._static import find_attr_path, join_path, static_attr, tensors_in, vars_of

__all__ = ["describe"]

# -- composites --------------------------------------------------------------------------------

_Regroup = Mapping[TransferGroup, TransferGroup | None]


def _regroups(parts: CompositeParts | None, family: Family) -> Mapping[str, _Regroup]:
    """The transfer regrouping a composite family declares (``CompositeParts.regroup``)."""
    if parts is None:
        return {}
    try:
        return {
            component: {
                TransferGroup(group): None if new is None else TransferGroup(new)
                for group, new in groups.items()
            }
            for component, groups in parts.regroup.items()
        }
    except ValueError:
        msg = (
            f"{family.qualname}: CompositeParts.regroup is {dict(parts.regroup)!r}; groups must "
            f"be among {[g.value for g in TransferGroup]} (or None)."
        )
        raise KVCompatError(msg) from None


def _native_describer(family: Family | None) -> Any:
    """The family's own describer (``CompositeParts.describe``), or None."""
    parts = None if family is None else family.parts
    return None if parts is None else parts.describe


def _node(
    walk: Walk, native: Any, adapter: KVPoolProtocol | None, *, name: str, path: str
) -> PoolManifest:
    family = family_of(native)
    describer = _native_describer(family)
    if describer is not None:
        manifest: PoolManifest = describer(walk, native, name=name, path=path)
        return manifest
    if family is not None and family.kind is PoolKind.COMPOSITE:
        composite = adapter if adapter is not None else adapt(native)
        return _composite_node(walk, native, composite, family, name=name, path=path)
    if isinstance(adapter, LeafAdapter) and adapter.native is native:  # its own declarations
        return leaf_node(
            walk, native, name=name, path=path, slots=adapter.storage_slots, leaf=type(adapter)
        )
    if family is not None and family.leaf is not None:
        return leaf_node(walk, native, name=name, path=path)
    return opaque_node(walk, native, name=name, path=path, adapter=adapter)


def _composite_node(
    walk: Walk,
    native: Any,
    adapter: KVPoolProtocol,
    family: Family,
    *,
    name: str,
    path: str,
) -> PoolManifest:
    """Any composite kvcompat adapts: one child per adapter component, plus known extras."""
    regroups = _regroups(family.parts, family)
    children: list[PoolManifest] = []
    for part_name, part in adapter.components.items():
        part_native = part.native
        where = join_path(path, find_attr_path(native, part_native) or f"<{part_name}>")
        if isinstance(part, LeafAdapter):
            children.append(
                leaf_node(
                    walk,
                    part_native,
                    name=part_name,
                    path=where,
                    slots=part.storage_slots,
                    regroup=regroups.get(part_name),
                    leaf=type(part),
                )
            )
        else:
            children.append(_node(walk, part_native, part, name=part_name, path=where))
    linear_state = {} if family.parts is None else family.parts.linear_state
    for state_name, attr in linear_state.items():
        mamba = static_attr(native, attr, None)
        if mamba is not None:
            children.append(_mamba_node(walk, mamba, name=state_name, path=join_path(path, attr)))
    return PoolManifest(
        name=name,
        path=path,
        role=Role.COMPOSITE,
        kind=PoolKind.COMPOSITE,
        native_class=qualified_name(type(native)),
        layer_ids=tuple(adapter.layer_ids),
        page_size=int_or_none(static_attr(native, "page_size", None)),
        token_capacity=int_or_none(static_attr(native, "size", None)),
        layout=_layout_name(native),
        tensors=tuple(walk.opaque(native, path, name)),
        children=tuple(children),
        details=details_of(native),
    )


def _mamba_node(walk: Walk, mamba: Any, *, name: str, path: str) -> PoolManifest:
    """A hybrid pool's linear-attention state: one view per mamba layer of each state tensor.

    Each state tensor leads with the mamba-layer axis; its per-layer view is
    transferred one request slot per item, as SGLang registers it. The views carry the
    model's layer ids where the pool keeps them (``mamba_layer_ids``); SGLang 0.5.12's pool
    keeps only ``num_mamba_layers`` (the ids live in its request pool), so there the views
    are transferable all the same, with no layer id.
    """
    ids = static_attr(mamba, "mamba_layer_ids", None)
    layers: list[tuple[int, ...]]
    if ids is not None:
        layers = [(int(layer),) for layer in ids]
    else:
        layers = [()] * (int_or_none(static_attr(mamba, "num_mamba_layers", None)) or 0)
    tensors: list[TensorManifest] = []
    for attr, value in vars_of(mamba).items():
        for where, tensor in tensors_in(value, join_path(path, attr)):
            if not walk.claim(tensor):
                continue
            if layers and tensor.ndim >= 2 and tensor.shape[0] == len(layers):
                for index, layer in enumerate(layers):
                    view = tensor[index]
                    region = TransferRegion(
                        TransferGroup.STATE, 0, int(view.nbytes), row_bytes(view)
                    )
                    tensors.append(
                        entry(
                            view,
                            path=f"{where}[{index}]",
                            role=Role.MAMBA_STATE,
                            component=name,
                            layer_ids=layer,
                            row_unit="slot",
                            regions=(region,),
                        )
                    )
            else:
                tensors.append(entry(tensor, path=where, role=Role.OPAQUE, component=name))
    return PoolManifest(
        name=name,
        path=path,
        role=Role.MAMBA_STATE,
        kind=None,
        native_class=qualified_name(type(mamba)),
        layer_ids=tuple(sorted(layer for ids_ in layers for layer in ids_)),
        page_size=None,
        token_capacity=int_or_none(static_attr(mamba, "size", None)),
        layout=None,
        tensors=tuple(tensors),
        details=details_of(mamba),
    )


# -- entry point -------------------------------------------------------------------------------


def _resolve(pool: Any) -> tuple[Any, KVPoolProtocol | None, str]:
    """``(native, adapter or None, display name)`` for a pool or an adapter."""
    if isinstance(pool, (LeafAdapter, CompositeAdapter)):
        return pool.native, pool, pool.name
    family = family_of(pool)
    if isinstance(pool, type) or family is None or family.kind is None:
        try:
            adapt(pool)  # raises the registry's own, explanatory error
        except UnsupportedPoolError as exc:
            got = pool if isinstance(pool, type) else type(pool).__qualname__
            msg = (
                f"describe() needs a KV pool kvcompat knows, or a kvcompat adapter; "
                f"got {got}.\n{exc}"
            )
            raise UnsupportedPoolError(msg) from None
    if family is not None and family.build is None and family.leaf is None:
        # A third-party adapter (recognised structurally): describe what it wraps.
        native = static_attr(pool, "native", None)
        if native is None:
            native = getattr(pool, "native", pool)
        return native, pool, str(getattr(pool, "name", type(native).__name__))
    if _native_describer(family) is not None:
        return pool, None, type(pool).__name__  # described natively, adaptable or not
    return pool, adapt(pool), type(pool).__name__


def describe(pool: Any) -> PoolManifest:
    r"""The manifest tree of a KV pool and of every part it owns.

    Accepts a native pool (SGLang's, a reference pool) or a kvcompat adapter.
    Only attributes are read — no native getter, property, layer-transfer wait,
    allocation or collective runs — so a profiler may call it at any time.
    Tensors kvcompat does not recognise (pointer tables, index maps, attributes
    added by a newer SGLang) appear as ``opaque`` entries instead of failing.

    Args:
        pool: the pool to describe, or an adapter from :func:`kvcompat.adapt`
            (a composite's component describes just that component).

    Returns:
        The root :class:`PoolManifest`; ``str()`` of it is a readable tree and
        ``to_dict()`` a JSON-ready form.

    Raises:
        UnsupportedPoolError: ``pool`` is not a pool kvcompat knows (a ``TypeError``).

    Example:
        >>> from kvcompat.inspection import describe
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool
        >>> manifest = describe(ReferenceMHATokenToKVPool(size=16, page_size=16, layer_num=2))
        >>> manifest.role.value, manifest.kind.value, manifest.layer_ids, manifest.layout
        ('key_value', 'split', (0, 1), 'mha_1x128_bf16')
        >>> print(*str(manifest).splitlines()[1:], sep="\n")
           k_buffer[0]  key  layer 0  bfloat16[32, 1, 128]  8.0 KiB  cpu
           k_buffer[1]  key  layer 1  bfloat16[32, 1, 128]  8.0 KiB  cpu
           v_buffer[0]  value  layer 0  bfloat16[32, 1, 128]  8.0 KiB  cpu
           v_buffer[1]  value  layer 1  bfloat16[32, 1, 128]  8.0 KiB  cpu
    """
    native, adapter, name = _resolve(unwrap_proxy(pool))
    return _node(Walk(), native, adapter, name=name, path="")
