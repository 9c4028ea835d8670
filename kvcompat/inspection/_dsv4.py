"""Describing SGLang's ``DeepSeekV4TokenToKVPool`` and everything it owns.

Sub-pools by compress ratio, indexer pools, compress-state pools, the
``unified_kv`` rows and the DeepSeek-V4.1 request window — all read natively.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from kvcompat._families import qualified_name
from kvcompat._protocol import PoolKind
from kvcompat.adapters._dsv4_pools import dsv4_compressed_pools
from kvcompat.inspection._build import (
    Walk,
    _layout_name,
    details_of,
    entry,
    int_or_none,
    leaf_node,
    row_bytes,
)
from kvcompat.inspection._model import (
    PoolManifest,
    Role,
    TensorManifest,
    TransferGroup,
    TransferRegion,
)
from kvcompat.inspection._static import enum_value, join_path, static_attr

__all__ = ["dsv4_node"]

# The SWA pages (paged or in a request window) are PD "state", not "kv".
_AS_STATE = {TransferGroup.KV: TransferGroup.STATE}
_WINDOW_PARTS = frozenset({"state", "workspace"})


def dsv4_node(walk: Walk, native: Any, *, name: str, path: str) -> PoolManifest:
    """``DeepSeekV4TokenToKVPool``: every sub-pool, state pool and window it owns.

    Read natively (not through the adapter), so that ``unified_kv`` and
    request-window pools — which kvcompat cannot adapt yet — are described too.
    Transfer regions follow SGLang's registration order: ``kv`` is C4 KV, C4
    indexer, C128 KV (then ratios 1 and 2); ``state`` is the SWA pages then the
    page-scoped compress states by layer; ``request_state`` is the
    request-scoped compress states by layer (``get_request_state_buf_infos()``,
    or ``get_c128_state_buf_infos()`` on 0.5.15-0.5.19).

    Works on every release with the class: before 0.5.20 the compressed pools are
    the ``c4_kv_pool`` / ``c128_kv_pool`` / ``c4_indexer_kv_pool`` attributes (paths
    name them so), and before 0.5.21 which compress states are request-scoped is
    decided by :func:`_ships_c128_state_apart`.
    """
    ratios = [int(r) for r in static_attr(native, "compression_ratios", None) or ()]
    start = int_or_none(static_attr(native, "_stage_start", None)) or 0
    end = int_or_none(static_attr(native, "_stage_end", None))
    stage = range(start, len(ratios) if end is None else end)
    page = int_or_none(static_attr(native, "page_size", None)) or 0
    swa_page = int_or_none(static_attr(native, "swa_page_size", None)) or page
    mapping = static_attr(native, "layer_mapping", None) or ()
    by_ratio: dict[int, dict[int, int]] = {}
    for layer in stage:
        item = mapping[layer] if layer < len(mapping) else None
        if item is not None and int(item[0]):
            by_ratio.setdefault(int(item[0]), {})[layer] = int(item[1])

    children: list[PoolManifest] = []
    swa = static_attr(native, "swa_kv_pool", None)
    if swa is not None:
        children.append(
            _swa_state_leaf(
                walk,
                swa,
                name="swa",
                path=join_path(path, "swa_kv_pool"),
                stage=stage,
                swa_page=swa_page,
            )
        )
    kv_pools, index_pools = dsv4_compressed_pools(native, static_attr)
    position: dict[int, int] = {}
    for ratio, (where, pool) in [
        *kv_pools.items(),
        *((r, ("", None)) for r in index_pools if r not in kv_pools),
    ]:
        position[ratio] = pos = len(position)
        slots = by_ratio.get(int(ratio), {})
        if pool is not None:
            children.append(
                leaf_node(
                    walk,
                    pool,
                    name=f"c{ratio}",
                    path=join_path(path, where),
                    slots=slots,
                    order=3 * pos,
                    extra={"compress_ratio": int(ratio)},
                )
            )
        index_where, indexer = index_pools.get(ratio, ("", None))
        if indexer is not None:
            index_page = int_or_none(static_attr(indexer, "page_size", None)) or 1
            per_item = max(1, (page // int(ratio)) // index_page) if ratio in (1, 2) else 1
            children.append(
                leaf_node(
                    walk,
                    indexer,
                    name=f"c{ratio}_indexer",
                    path=join_path(path, index_where),
                    slots=slots,
                    pages_per_item=per_item,
                    order=3 * pos + 2,
                    extra={"compress_ratio": int(ratio)},
                )
            )
    children.extend(_state_nodes(walk, native, path, "compress_state_pools", "state", order_base=1))
    children.extend(
        _state_nodes(
            walk,
            native,
            path,
            "indexer_compress_state_pools",
            "indexer_state",
            order_base=1 + len(ratios),
        )
    )
    unified = static_attr(native, "unified_kv_pool", None)
    if unified is not None:
        children.append(
            _unified_node(walk, unified, path=path, stage=stage, ratios=ratios, position=position)
        )
    window = static_attr(native, "request_window", None)
    if window is not None:
        children.append(_window_node(walk, window, path=path, stage=stage, swa_page=swa_page))

    tensors: list[TensorManifest] = []
    valid_from = static_attr(native, "swa_valid_from", None)
    if isinstance(valid_from, torch.Tensor) and walk.claim(valid_from):
        region = TransferRegion(
            TransferGroup.REQUEST_ROW, 0, int(valid_from.nbytes), row_bytes(valid_from)
        )
        tensors.append(
            entry(
                valid_from,
                path=join_path(path, "swa_valid_from"),
                role=Role.OPAQUE,
                component=name,
                row_unit="slot",
                regions=(region,),
            )
        )
    tensors.extend(walk.opaque(native, path, name))
    return PoolManifest(
        name=name,
        path=path,
        role=Role.COMPOSITE,
        kind=PoolKind.COMPOSITE,
        native_class=qualified_name(type(native)),
        layer_ids=tuple(stage),
        page_size=page or None,
        token_capacity=int_or_none(static_attr(native, "size", None)),
        layout=_token_pool_layout(native),
        tensors=tuple(tensors),
        children=tuple(children),
        details=details_of(native),
    )


def _ships_c128_state_apart(native: Any) -> bool:
    """Whether the composite registers its c128 compress states apart from the page states.

    From 0.5.21 each ``CompressStatePool`` says so itself (``request_scoped``). Before,
    SGLang 0.5.15-0.5.19 ship the c128 states through ``get_c128_state_buf_infos()`` and
    0.5.20 through ``get_request_state_buf_infos()``, both leaving them out of
    ``get_state_buf_infos()``; 0.5.12-0.5.14 have neither method and keep them in
    ``get_state_buf_infos()``. The methods are looked up on the class, never called.
    """
    cls = type(native)
    return any(
        callable(getattr(cls, name, None))
        for name in ("get_c128_state_buf_infos", "get_request_state_buf_infos")
    )


def _token_pool_layout(native: Any) -> str:
    """``"v4,c4:v4,c128:v4"``: the main layout, then each compressed pool's."""
    if static_attr(native, "uniform_fp8", False):
        return "uniform_fp8"
    ratios = sorted({int(r) for r in static_attr(native, "compression_ratios", []) or []} - {0})
    found, _ = dsv4_compressed_pools(native, static_attr)  # kv_pools or c4_/c128_kv_pool
    pools = {ratio: pool for ratio, (_, pool) in found.items()}
    main = str(enum_value(static_attr(native, "kv_layout", None)) or "v4")
    extra = [f"c{r}:{_layout_name(pools[r]) if pools.get(r) is not None else main}" for r in ratios]
    return ",".join([main, *extra])


def _state_nodes(
    walk: Walk, native: Any, path: str, attr: str, suffix: str, *, order_base: int
) -> list[PoolManifest]:
    """One node per compress ratio for a per-layer list of ``CompressStatePool`` objects."""
    pools = static_attr(native, attr, None) or ()
    c128_apart = _ships_c128_state_apart(native) and attr == "compress_state_pools"
    grouped: dict[int, list[tuple[int, Any]]] = {}
    model_ratios = static_attr(native, "compression_ratios", None) or ()
    for layer, pool in enumerate(pools):
        if pool is not None:
            ratio = int_or_none(static_attr(pool, "ratio", None))
            if ratio is None:  # 0.5.12-0.5.13: the state pool does not record its ratio
                ratio = int(model_ratios[layer]) if layer < len(model_ratios) else 0
            grouped.setdefault(ratio, []).append((layer, pool))
    nodes: list[PoolManifest] = []
    for ratio, members in grouped.items():
        name = f"c{ratio}_{suffix}"
        tensors: list[TensorManifest] = []
        for layer, pool in members:
            where = join_path(path, f"{attr}[{layer}]")
            holder = static_attr(pool, "kv_score_buffer", None)
            tensor = static_attr(holder, "kv_score", None)
            if isinstance(tensor, torch.Tensor) and walk.claim(tensor):
                row = row_bytes(tensor)
                ring = int_or_none(static_attr(pool, "ring_size", None)) or 1
                scoped = static_attr(pool, "request_scoped", None)
                if scoped is None:  # before 0.5.21: no flag; decided by the composite's class
                    scoped = c128_apart and ratio == 128
                if scoped:
                    group = TransferGroup.REQUEST_STATE
                    if ratio == 2:
                        item = row * ring
                    else:
                        item = row if static_attr(pool, "online", False) else row * ratio
                else:
                    group, item = TransferGroup.STATE, row * ring
                region = TransferRegion(group, 0, int(tensor.nbytes), item, order_base + layer)
                tensors.append(
                    entry(
                        tensor,
                        path=f"{where}.kv_score_buffer.kv_score",
                        role=Role.COMPRESS_STATE,
                        component=name,
                        layer_ids=(layer,),
                        row_unit="state",
                        regions=(region,),
                    )
                )
            tensors.extend(walk.opaque(pool, where, name, skip=frozenset({"kv_score_buffer"})))
        first = members[0][1]
        nodes.append(
            PoolManifest(
                name=name,
                path=join_path(path, attr),
                role=Role.COMPRESS_STATE,
                kind=None,
                native_class=qualified_name(type(first)),
                layer_ids=tuple(layer for layer, _ in members),
                page_size=int_or_none(static_attr(first, "page_size", None)),
                token_capacity=None,
                # A compress-state pool's rows are kv-score states, as its composite keeps them.
                layout="kv-score-online" if static_attr(first, "online", False) else "kv-score",
                tensors=tuple(tensors),
                details=details_of(first),
            )
        )
    return nodes


def _unified_node(
    walk: Walk,
    unified: Any,
    *,
    path: str,
    stage: range,
    ratios: list[int],
    position: Mapping[int, int],
) -> PoolManifest:
    """``DeepSeekV4UnifiedKVPool``: per layer, the SWA ring rows then the compressed rows."""
    where = join_path(path, "unified_kv_pool")
    swa_pages = int_or_none(static_attr(unified, "swa_pages", None)) or 0
    page = int_or_none(static_attr(unified, "page_size", None)) or 0
    tensors: list[TensorManifest] = []
    for attr, role, sub in (
        ("kv_buffer", Role.UNIFIED, 0),
        ("kv_buffer_rope", Role.UNIFIED_ROPE, 1),
    ):
        for index, tensor in enumerate(static_attr(unified, attr, None) or ()):
            if not isinstance(tensor, torch.Tensor) or not walk.claim(tensor):
                continue
            layer = stage.start + index
            ratio = ratios[layer] if layer < len(ratios) else 0
            row = row_bytes(tensor)
            regions = [TransferRegion(TransferGroup.SWA_RING, 0, swa_pages * row, row)]
            if ratio and ratio in position and page:
                compressed = max(0, tensor.shape[0] - swa_pages) * row
                regions.append(
                    TransferRegion(
                        TransferGroup.KV,
                        swa_pages * row,
                        compressed,
                        (page // ratio) * row,
                        3 * position[ratio] + sub,
                    )
                )
            tensors.append(
                entry(
                    tensor,
                    path=f"{where}.{attr}[{index}]",
                    role=role,
                    component="unified",
                    layer_ids=(layer,),
                    row_unit="token",
                    regions=tuple(regions),
                )
            )
    skip = frozenset({"kv_buffer", "kv_buffer_rope"})
    tensors.extend(walk.opaque(unified, where, "unified", skip=skip))
    return PoolManifest(
        name="unified",
        path=where,
        role=Role.UNIFIED,
        kind=None,
        native_class=qualified_name(type(unified)),
        layer_ids=tuple(stage),
        page_size=page or None,
        token_capacity=None,
        layout="dsv4-unified-fp8" if static_attr(unified, "fp8", False) else "dsv4-unified-bf16",
        tensors=tuple(tensors),
        details=details_of(unified),
    )


def _swa_state_leaf(
    walk: Walk, pool: Any, *, name: str, path: str, stage: range, swa_page: int
) -> PoolManifest:
    """A pool of SWA pages (the paged SWA pool or a request window's history), as ``state``.

    Its slots are the stage's layers from 0; one transfer item spans ``swa_page`` tokens,
    that is ``swa_page // (its own page size)`` of its pages.
    """
    own_page = int_or_none(static_attr(pool, "page_size", None)) or swa_page
    return leaf_node(
        walk,
        pool,
        name=name,
        path=path,
        slots={layer: layer - stage.start for layer in stage},
        regroup=_AS_STATE,
        pages_per_item=max(1, swa_page // own_page) if swa_page else 1,
    )


def _window_node(
    walk: Walk, window: Any, *, path: str, stage: range, swa_page: int
) -> PoolManifest:
    """``RequestWindow``: the per-request SWA history pool and the workspace it copies into."""
    where = join_path(path, "request_window")
    children: list[PoolManifest] = []
    state = static_attr(window, "state", None)
    if state is not None:
        children.append(
            _swa_state_leaf(
                walk,
                state,
                name="window",
                path=join_path(where, "state"),
                stage=stage,
                swa_page=swa_page,
            )
        )
    workspace = static_attr(window, "workspace", None)
    if workspace is not None:
        children.append(
            leaf_node(
                walk,
                workspace,
                name="window_workspace",
                path=join_path(where, "workspace"),
                slots={},
                regroup={TransferGroup.KV: None},
                role=Role.WORKSPACE,
            )
        )
    return PoolManifest(
        name="request_window",
        path=where,
        role=Role.REQUEST_WINDOW,
        kind=None,
        native_class=qualified_name(type(window)),
        layer_ids=tuple(stage),
        page_size=int_or_none(static_attr(window, "page_size", None)),
        token_capacity=int_or_none(static_attr(window, "rows", None)),
        layout=None,
        tensors=tuple(walk.opaque(window, where, "request_window", skip=_WINDOW_PARTS)),
        children=tuple(children),
        details=details_of(window),
    )
