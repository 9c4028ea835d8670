"""The manifest of a vLLM worker's caches: one entry per registered view, its blocks as runs.

Reads what ``kvcompat/adapters/_vllm_plan.py`` recorded (the registered views and their
formats); no vLLM code runs. Each registered view is one tensor entry of its component;
a KV-sharing alias (a name viewing another layer's cache) is listed as a view of it and
owns no bytes. Transfer regions cover every byte of every registered view exactly once, as plain
``(ptr, length, item_length)`` ranges a transfer engine takes: a layer whose blocks are back
to back (vLLM's layer-outer layouts, ``LBNHC``/``LBHNC``) is one run of ``B`` items of one
block; under block-outer layouts (``BLHNC``/``BLNHC``: DeepSeek-V4) the storage's blocks
are one run whose item is a whole block, every layer's page of it (:func:`block_runs`), so
item ``b`` is block ``b``; strided layers that fit neither are one run per block.
vLLM's KV-cache groups alias one another (:func:`owned_runs`): a byte two views cover is
described once, under the first of them.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from kvcompat._families import qualified_name
from kvcompat._protocol import PoolKind
from kvcompat.adapters._vllm_plan import VLLMKVCaches, VLLMLayer, VLLMPlan
from kvcompat.inspection._build import Walk, entry
from kvcompat.inspection._model import (
    PoolManifest,
    Role,
    TensorManifest,
    TransferGroup,
    TransferRegion,
)

__all__ = ["block_runs", "owned_runs", "vllm_node"]

_TENSOR_ROLE = {
    "mha": Role.PACKED_KV,
    "mla": Role.LATENT,
    "dsa_fp8_656": Role.LATENT,
    "dsa_fp8_528": Role.LATENT,
    "dsv4_kv": Role.PACKED_KV,
    "dsv4_indexer_fp8": Role.INDEX_KEYS,
    "dsv4_state": Role.COMPRESS_STATE,
}
_NODE_ROLE = {
    PoolKind.SPLIT: Role.KEY_VALUE,
    PoolKind.LATENT: Role.LATENT,
    PoolKind.SINGLE_KV: Role.PACKED_KV,
    PoolKind.KEY_ONLY: Role.INDEX_KEYS,
}
_GROUP = {"dsv4_state": TransferGroup.STATE}
"""Transfer groups other than ``kv``: DeepSeek-V4's compressor state is state, as on SGLang."""


def _path(layer: VLLMLayer) -> str:
    return f"kv_caches[{layer.name!r}]"


def _chunks(layer: VLLMLayer) -> list[tuple[int, int]]:
    """The layer's bytes as absolute ``[start, end)`` runs: one, or one per block."""
    base, size = layer.view.data_ptr(), layer.block_bytes
    if layer.contiguous:
        return [(base, base + layer.num_blocks * size)]
    return [
        (base + block * layer.block_stride, base + block * layer.block_stride + size)
        for block in range(layer.num_blocks)
    ]


def owned_runs(layers: Sequence[VLLMLayer]) -> dict[str, list[tuple[int, int]]]:
    """Layer name -> the absolute runs it owns: each byte goes to the first layer viewing it.

    vLLM's KV-cache groups alias one another from byte 0 (a block id belongs to one group
    at a time), so two registered views may cover the same bytes; the first in the dict's
    order owns them, and a view every byte of which an earlier one owns owns nothing.
    """
    chunks = [
        (start, end, rank) for rank, layer in enumerate(layers) for start, end in _chunks(layer)
    ]
    chunks.sort()
    owned: dict[str, list[tuple[int, int]]] = {layer.name: [] for layer in layers}
    reach, overlap = -1, False
    for start, end, _ in chunks:
        overlap = overlap or start < reach
        reach = max(reach, end)
    if not overlap:
        for start, end, rank in chunks:
            owned[layers[rank].name].append((start, end))
        return owned
    bounds = sorted({edge for start, end, _ in chunks for edge in (start, end)})
    active: list[tuple[int, int]] = []  # (rank, end): a heap of the chunks open at a bound
    index = 0
    for left, right in itertools.pairwise(bounds):
        while index < len(chunks) and chunks[index][0] <= left:
            heapq.heappush(active, (chunks[index][2], chunks[index][1]))
            index += 1
        while active and active[0][1] <= left:
            heapq.heappop(active)
        live = [rank for rank, end in active if end > left]
        if not live:
            continue
        runs = owned[layers[min(live)].name]
        if runs and runs[-1][1] == left:
            runs[-1] = (runs[-1][0], right)
        else:
            runs.append((left, right))
    return owned


def block_runs(layers: Sequence[VLLMLayer]) -> tuple[dict[str, int], set[str]]:
    """Block-outer storages as one run of whole blocks: owner name -> block stride.

    Under vLLM's block-outer layouts (``BLHNC``, ``BLNHC``) every layer of a block sits
    inside that block's ``block_stride`` bytes, so the storage's blocks are one run whose
    item is one block (every layer's page of it, page padding included): page ``b`` of
    the run is block ``b``, as a transfer engine addresses it. Returns the layer whose
    view starts the run (it carries the region) with the stride, and every layer the run
    covers (they carry none). Layers on storages where that does not hold are left out.
    """
    by_storage: dict[int, list[VLLMLayer]] = {}
    for layer in layers:
        by_storage.setdefault(layer.view.untyped_storage().data_ptr(), []).append(layer)
    owners: dict[str, int] = {}
    covered: set[str] = set()
    for storage, group in by_storage.items():
        strides = {layer.block_stride for layer in group}
        blocks = {layer.num_blocks for layer in group}
        if len(strides) != 1 or len(blocks) != 1 or any(layer.contiguous for layer in group):
            continue
        stride, count = strides.pop(), blocks.pop()
        first = min(group, key=lambda layer: layer.view.data_ptr())
        base = first.view.data_ptr()
        end = storage + first.view.untyped_storage().nbytes()
        inside = all(layer.view.data_ptr() - base + layer.block_bytes <= stride for layer in group)
        if not inside or base + count * stride > end:
            continue
        owners[first.name] = stride
        covered.update(layer.name for layer in group)
    return owners, covered


def _regions(
    layer: VLLMLayer, runs: list[tuple[int, int]], item: int | None = None
) -> tuple[TransferRegion, ...]:
    """The runs a layer owns, relative to its view; items of one block where they fit."""
    base, size = layer.view.data_ptr(), item or layer.block_bytes
    group = _GROUP.get(layer.fmt.name, TransferGroup.KV)
    found = []
    for start, end in runs:
        length = end - start
        whole = length % size == 0 and (start - base) % max(layer.block_stride, 1) == 0
        found.append(TransferRegion(group, start - base, length, size if whole else length))
    return tuple(found)


def _tensors(
    walk: Walk,
    layers: tuple[VLLMLayer, ...],
    component: str,
    owned: Mapping[str, list[tuple[int, int]]],
    blocks: tuple[dict[str, int], set[str]],
) -> list[TensorManifest]:
    found: list[TensorManifest] = []
    owners, covered = blocks
    for layer in layers:
        if not walk.claim(layer.view) and layer.alias_of is None:
            continue
        alias = layer.alias_of
        item: int | None = None
        if layer.name in owners:  # the run of whole blocks of its storage starts here
            item = owners[layer.name]
            start = layer.view.data_ptr()
            runs = [(start, start + layer.num_blocks * item)]
        elif layer.name in covered:
            runs = []
        else:
            runs = owned.get(layer.name, [])
            if alias is None and not runs:
                alias = _owner_of(layer, owned)
        found.append(
            entry(
                layer.view,
                path=_path(layer),
                role=_TENSOR_ROLE.get(layer.fmt.name, Role.OPAQUE),
                component=component,
                layer_ids=(layer.layer_id,),
                row_unit="page",
                alias_of=None if alias is None else f"kv_caches[{alias!r}]",
                regions=_regions(layer, runs, item),
            )
        )
    return found


def _owner_of(layer: VLLMLayer, owned: Mapping[str, list[tuple[int, int]]]) -> str | None:
    """The layer owning this (wholly aliased) view's first byte."""
    first = layer.view.data_ptr()
    for name, runs in owned.items():
        if any(start <= first < end for start, end in runs):
            return name
    return None


def _leaf(
    walk: Walk,
    native: VLLMKVCaches,
    layers: tuple[VLLMLayer, ...],
    owned: Mapping[str, list[tuple[int, int]]],
    blocks: tuple[dict[str, int], set[str]],
    *,
    name: str,
    path: str,
) -> PoolManifest:
    first = layers[0]
    return PoolManifest(
        name=name,
        path=path,
        role=Role.COMPRESS_STATE if first.fmt.spec is None else _NODE_ROLE[first.fmt.kind],
        kind=first.fmt.kind,
        native_class=qualified_name(type(native)),
        layer_ids=tuple(sorted({layer.layer_id for layer in layers})),
        page_size=first.fmt.states,
        token_capacity=first.num_blocks * first.fmt.states,
        layout="dsv4-compressor-state" if first.fmt.spec is None else first.fmt.spec.name,
        tensors=tuple(_tensors(walk, layers, name, owned, blocks)),
        details={
            "engine": "vllm",
            "format": first.fmt.name,
            "vllm_layout": first.layout,
            "dtype": str(first.fmt.logical).removeprefix("torch."),
            "tokens_per_state": first.fmt.tokens_per_state,
        },
    )


def vllm_node(
    walk: Walk,
    native: Any,
    parts: Mapping[str, tuple[VLLMLayer, ...]],
    *,
    name: str,
    path: str,
) -> PoolManifest:
    """The manifest of a vLLM adapter's native object (a leaf, or one child per component).

    Example:
        >>> vllm_node.__name__
        'vllm_node'
    """
    plan: VLLMPlan = native.plan
    own = [layer for layer in plan.layers.values() if layer.alias_of is None]
    blocks = block_runs(own)
    owned = owned_runs([layer for layer in own if layer.name not in blocks[1]])
    if len(parts) == 1:
        ((_, layers),) = parts.items()
        return _leaf(walk, native, layers, owned, blocks, name=name, path=path)
    children = tuple(
        _leaf(walk, native, layers, owned, blocks, name=part, path=f"{path}<{part}>")
        for part, layers in parts.items()
    )
    return PoolManifest(
        name=name,
        path=path,
        role=Role.COMPOSITE,
        kind=PoolKind.COMPOSITE,
        native_class=qualified_name(type(native)),
        layer_ids=tuple(sorted({lid for child in children for lid in child.layer_ids})),
        page_size=None,
        token_capacity=None,
        layout=None,
        children=children,
        details={"engine": "vllm", "num_blocks": native.plan.num_blocks},
    )
