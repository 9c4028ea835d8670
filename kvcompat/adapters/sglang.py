"""SGLang's KV pool classes, as kvcompat knows them (by name; sglang is never imported).

Each entry maps a qualified class name to a family: the pool kind plus the
adapter that builds the uniform API for it. Subclasses match their nearest
registered base, so variants such as ``HiSparseMHAMainPool`` or
``UnifiedMHATokenToKVPool`` reuse the MHA adapter. Classes whose getters do
something a uniform view cannot honestly reproduce are registered as
*unsupported*, with the reason, so they fail loudly instead of half-working.

Layer ids: every adapter takes absolute model layer ids and maps them to the
buffer index the *storage* really uses — not to whatever the native getter
happens to compute (see the "traps" on the supported-pools page).
"""

from __future__ import annotations

from typing import Any

from kvcompat._errors import UnsupportedPoolError
from kvcompat._families import Family, _install, adapt_part
from kvcompat._protocol import KVPoolProtocol, PoolKind
from kvcompat.adapters._composite import CompositeAdapter, CompositeParts
from kvcompat.adapters._dsv4_pools import dsv4_compressed_pools
from kvcompat.adapters._leaf import (
    IndexKeyAdapter,
    KeyOnlyAdapter,
    LatentAdapter,
    SingleKVAdapter,
    SplitAdapter,
)

__all__ = [
    "DSV4_TOKEN_POOL_PARTS",
    "HYBRID_LINEAR_PARTS",
    "SGLANG_CLASSES",
    "SWA_PARTS",
    "adapt_dsv4_token_pool",
    "adapt_hybrid_linear",
    "adapt_swa",
    "dsv4_compressed_pools",
]

_MEM = "sglang.srt.mem_cache.memory_pool"
_DSV4 = "sglang.srt.mem_cache.deepseek_v4_memory_pool"
_SWA = "sglang.srt.mem_cache.swa_memory_pool"
_NPU = "sglang.srt.hardware_backend.npu"
_HIS = "sglang.srt.mem_cache.hisparse_memory_pool"
_UNI = "sglang.srt.mem_cache.unified_memory_pool"
_DRAFT = "sglang.srt.mem_cache.unified_draft_pool"
_PI = "sglang.srt.mem_cache.page_interleave_pool"


def adapt_swa(native: Any) -> KVPoolProtocol:
    """Adapt ``SWAKVPool``: components ``full`` and ``swa``, routed by ``layers_mapping``.

    SGLang hands the sub-pools dense ids (their position in the sub-pool); the
    components map absolute ids straight to those buffers. A ``start_layer``
    leaked into the sub-pools through ``**kwargs`` is refused: SGLang's
    attention getters and writers then shift every dense id (a rotation of the
    buffers) while its transfer metadata (``model_layer_ids``) does not, so no
    answer would be right for every consumer.

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import reference_swa_pool
        >>> pool = kvcompat.adapt(reference_swa_pool())
        >>> pool.components["swa"].layer_ids, pool.components["full"].layer_ids
        ((0, 2), (1, 3))
    """
    owner = type(native).__name__
    shifted = {
        side: start
        for side in ("full_kv_pool", "swa_kv_pool")
        if (start := getattr(getattr(native, side), "start_layer", 0) or 0)
    }
    if shifted:
        msg = (
            f"{owner}'s sub-pools carry start_layer {shifted} (passed through **kwargs). "
            "SGLang then reads and writes dense layer i at buffer i - start_layer for attention, "
            "but describes buffer i as dense layer i for transfers; kvcompat refuses to guess "
            "which buffer holds a layer.\n"
            "Hint: build SWAKVPool without start_layer (it always serves layer ids from 0)."
        )
        raise UnsupportedPoolError(msg)
    waits = {"wait_owner": native, "wait_offset": int(getattr(native, "start_layer", 0) or 0)}
    full: dict[int, int] = {}
    swa: dict[int, int] = {}
    for layer, (dense, is_swa) in native.layers_mapping.items():
        (swa if is_swa else full)[int(layer)] = int(dense)
    components = {
        "full": adapt_part(native.full_kv_pool, owner=owner, component="full", slots=full, **waits),
        "swa": adapt_part(native.swa_kv_pool, owner=owner, component="swa", slots=swa, **waits),
    }
    route = dict.fromkeys(full, "full") | dict.fromkeys(swa, "swa")
    return CompositeAdapter(native, components=components, route=route)


def adapt_hybrid_linear(native: Any) -> KVPoolProtocol:
    """Adapt ``HybridLinearKVPool``: one ``full`` component serving the attention layers.

    Linear-attention (mamba) layers have no KV buffers and are not served.

    Example:
        >>> from kvcompat.adapters.sglang import adapt_hybrid_linear
        >>> adapt_hybrid_linear.__name__
        'adapt_hybrid_linear'
    """
    owner = type(native).__name__
    slots = {
        int(layer): int(dense) for layer, dense in native.full_attention_layer_id_mapping.items()
    }
    full = adapt_part(
        native.full_kv_pool,
        owner=owner,
        component="full",
        slots=slots,
        wait_owner=native,
        wait_offset=int(getattr(native, "start_layer", 0) or 0),
    )
    return CompositeAdapter(native, components={"full": full}, route=dict.fromkeys(slots, "full"))


# Before 0.5.20 the DSv4 composite has no ``kv_pools`` / ``index_pools`` dicts: one attribute
# per compressed pool (0.5.12-0.5.19). From 0.5.20 these names are aliases of the dict entries.
def adapt_dsv4_token_pool(native: Any) -> KVPoolProtocol:
    """Adapt ``DeepSeekV4TokenToKVPool``: sliding-window, compressed and indexer parts.

    Components: ``swa`` (every layer of the stage; the primary buffer),
    ``c{ratio}`` for each compressed pool (``c4``, ``c128``, and ``c1``/``c2``
    on V4.1) serving the layers with that compression ratio, and
    ``c{ratio}_indexer`` for each indexer-key pool. Compressed layer ids come
    from the pool's own ``layer_mapping`` (layers sharing a kv-source share
    its buffer). Works on every SGLang release with the class (0.5.12 on): the
    compressed pools are found by :func:`dsv4_compressed_pools`.

    Example:
        >>> from kvcompat.adapters.sglang import adapt_dsv4_token_pool
        >>> adapt_dsv4_token_pool.__name__
        'adapt_dsv4_token_pool'
    """
    owner = type(native).__name__
    swa_pool = getattr(native, "swa_kv_pool", None)
    if swa_pool is None:
        msg = (
            f"{owner} keeps its sliding-window KV outside a paged pool (unified_kv or "
            "request-window mode); kvcompat does not support those modes yet.\n"
            "Hint: the compressed pools are reachable natively through pool.kv_pools[ratio]."
        )
        raise UnsupportedPoolError(msg)
    start = int(native._stage_start)
    end = int(native._stage_end)
    stage = range(start, end)
    # SGLang waits at the composite, with layer_id - start_layer, for every layer-routed getter.
    waits = {"wait_owner": native, "wait_offset": int(getattr(native, "start_layer", 0) or 0)}
    components: dict[str, KVPoolProtocol] = {
        "swa": adapt_part(
            swa_pool,
            owner=owner,
            component="swa",
            slots={layer: layer - start for layer in stage},
            **waits,
        )
    }
    by_ratio: dict[int, dict[int, int]] = {}
    for layer in stage:
        item = native.layer_mapping[layer]
        if item is not None and item.compress_ratio:
            by_ratio.setdefault(int(item.compress_ratio), {})[layer] = int(item.compress_layer_id)
    kv_pools, index_pools = dsv4_compressed_pools(native)
    for ratio, (_, pool) in kv_pools.items():
        if pool is not None and ratio in by_ratio:
            name = f"c{ratio}"
            components[name] = adapt_part(
                pool, owner=owner, component=name, slots=by_ratio[ratio], **waits
            )
    for ratio, (_, pool) in index_pools.items():
        if pool is not None and ratio in by_ratio:
            name = f"c{ratio}_indexer"
            components[name] = adapt_part(
                pool, owner=owner, component=name, slots=by_ratio[ratio], **waits
            )
    return CompositeAdapter(native, components=components, route=dict.fromkeys(stage, "swa"))


def _describe_dsv4(walk: Any, native: Any, *, name: str, path: str) -> Any:
    """Describe a ``DeepSeekV4TokenToKVPool`` natively (every mode, adaptable or not)."""
    from kvcompat.inspection._dsv4 import dsv4_node  # noqa: PLC0415 (inspection imports us)

    return dsv4_node(walk, native, name=name, path=path)


# What describe() and the transfer descriptors need beyond each composite's components.
SWA_PARTS = CompositeParts(regroup={"swa": {"kv": "state"}})
"""SGLang registers ``SWAKVPool``'s full pool as PD ``kv`` and its sliding-window pool as
``state``."""
HYBRID_LINEAR_PARTS = CompositeParts(linear_state={"mamba": "mamba_pool"})
"""``HybridLinearKVPool`` owns the linear-attention state in ``mamba_pool``."""
DSV4_TOKEN_POOL_PARTS = CompositeParts(describe=_describe_dsv4)
"""``DeepSeekV4TokenToKVPool`` is described from its attributes, in every mode (its
``unified_kv`` and request-window modes are not adapted)."""


# Engine subclasses served by their base's adapter, by class name: they keep the base's
# buffers (HiSparse pools index the same lists by device slot; Unified pools hold strided
# views of one shared allocation). Any other sglang subclass of a supported class is
# refused until it is listed here or registered itself.
_CHECKED_SUBCLASSES: dict[str, tuple[str, ...]] = {
    f"{_MEM}.MHATokenToKVPool": (
        "HiSparseMHAMainPool",
        "UnifiedMHATokenToKVPool",
        "UnifiedDraftKVPool",
    ),
    # NSATokenToKVPool: SGLang 0.5.12's DSA predecessor; its index-key list is declared by
    # the latent adapter (index_k_with_scale_buffer) and matches SGLang's own buffer infos.
    f"{_MEM}.MLATokenToKVPool": ("UnifiedMLATokenToKVPool", "NSATokenToKVPool"),
    f"{_MEM}.DSATokenToKVPool": ("HiSparseDSATokenToKVPool",),
    f"{_SWA}.SWAKVPool": ("UnifiedSWAKVPool", "UnifiedDraftSWAKVPool"),
    f"{_MEM}.HybridLinearKVPool": ("UnifiedHybridLinearKVPool", "QSATokenToKVPool"),
}


def _leaf(qualname: str, kind: PoolKind, leaf: type[Any]) -> Family:
    return Family(qualname, kind, leaf=leaf, subclasses=_CHECKED_SUBCLASSES.get(qualname, ()))


def _composite(qualname: str, build: Any, parts: CompositeParts) -> Family:
    return Family(
        qualname,
        PoolKind.COMPOSITE,
        build=build,
        subclasses=_CHECKED_SUBCLASSES.get(qualname, ()),
        parts=parts,
    )


def _no(qualname: str, reason: str, native: PoolKind | None = None) -> Family:
    return Family(qualname, None, reason=reason, native_kind=native)


SGLANG_CLASSES: tuple[Family, ...] = (
    _leaf(f"{_MEM}.MHATokenToKVPool", PoolKind.SPLIT, SplitAdapter),
    _leaf(f"{_MEM}.MHATokenToKOnlyPool", PoolKind.KEY_ONLY, KeyOnlyAdapter),
    _leaf(f"{_MEM}.MLATokenToKVPool", PoolKind.LATENT, LatentAdapter),
    _leaf(f"{_MEM}.DSATokenToKVPool", PoolKind.LATENT, LatentAdapter),
    _leaf(f"{_DSV4}.DeepSeekV4SingleKVPool", PoolKind.SINGLE_KV, SingleKVAdapter),
    _leaf(f"{_DSV4}.DeepSeekV4UniformFP8KVPool", PoolKind.SINGLE_KV, SingleKVAdapter),
    _leaf(f"{_DSV4}.HiSparseC4DevicePool", PoolKind.SINGLE_KV, SingleKVAdapter),
    _leaf(f"{_DSV4}.DeepSeekV4IndexerPool", PoolKind.KEY_ONLY, IndexKeyAdapter),
    _composite(f"{_SWA}.SWAKVPool", adapt_swa, SWA_PARTS),
    _composite(f"{_MEM}.HybridLinearKVPool", adapt_hybrid_linear, HYBRID_LINEAR_PARTS),
    _composite(f"{_DSV4}.DeepSeekV4TokenToKVPool", adapt_dsv4_token_pool, DSV4_TOKEN_POOL_PARTS),
    _no(
        f"{_MEM}.NoOpMHATokenToKVPool",
        "it holds placeholder buffers only and stores nothing.",
        PoolKind.SPLIT,
    ),
    _no(
        f"{_MEM}.PageMajorMHATokenToKVPool",
        "SGLang 0.5.23 cannot construct it (its buffer views were removed).",
        PoolKind.SPLIT,
    ),
    _no(
        f"{_MEM}.MHATokenToKVPoolFP4",
        "it stores packed e2m1 payloads with separate scales and its getters return "
        "dequantized copies; kvcompat has no codec for that layout yet.",
        PoolKind.SPLIT,
    ),
    _no(
        f"{_MEM}.MLATokenToKVPoolFP4",
        "its latent rows are packed fp4, so the value prefix view SGLang returns is not "
        "meaningful; kvcompat has no codec for that layout yet.",
        PoolKind.LATENT,
    ),
    _no(
        "sglang.srt.mem_cache.page_interleave_pool.PageInterleaveKVPoolMixin",
        "during a sharded extend its getters return a scratch slot and start an NCCL "
        "all-gather; a uniform view would either lie or trigger the collective.",
    ),
    _no(
        "sglang.srt.mem_cache.dsa_cache_layer_split.LayerSplitDSATokenToKVPool",
        "its getters broadcast non-owned layers over the context-parallel group "
        "(a collective); a uniform view would trigger it.",
        PoolKind.LATENT,
    ),
    _no(
        f"{_NPU}.memory_pool_npu.NPUMLATokenToKVPool",
        "on NPU the MLA key is the nope part and the value the rope part (two separate "
        "tensors, so the detectors answer split), unlike CUDA MLA.",
        PoolKind.SPLIT,
    ),
    _no(
        f"{_NPU}.memory_pool_npu.NPUMHATokenToKVPool",
        "NPU pools (5-D buffers, FIA views) have not been checked against kvcompat.",
        PoolKind.SPLIT,
    ),
    _no(
        f"{_NPU}.memory_pool_npu.NPUMHATokenToKOnlyPool",
        "NPU pools have not been checked against kvcompat.",
        PoolKind.KEY_ONLY,
    ),
    _no(
        f"{_NPU}.dsv4.dsv4_memory_pool.NPUDeepSeekV4SingleKVPool",
        "NPU DSv4 pools store bf16 PA_ND rows while reporting the V4 layout.",
        PoolKind.SINGLE_KV,
    ),
    _no(
        f"{_NPU}.dsv4.dsv4_memory_pool.NPUDeepSeekV4IndexerPool",
        "NPU DSv4 pools have not been checked against kvcompat.",
        PoolKind.KEY_ONLY,
    ),
    _no(
        f"{_NPU}.dsv4.dsv4_memory_pool.DSV4NPUTokenToKVPool",
        "NPU DSv4 pools have not been checked against kvcompat.",
        PoolKind.COMPOSITE,
    ),
    _no(
        f"{_MEM}.MiniMaxSparseKVPool",
        "MiniMax sparse pools (dense/main/index routing) are not supported yet.",
        PoolKind.COMPOSITE,
    ),
    _no(
        "sglang.srt.mem_cache.minimax_m3_nvfp4_pool.MiniMaxM3Nvfp4MainKVPool",
        "packed NVFP4 slab rows are not supported yet.",
        PoolKind.SPLIT,
    ),
    _no(
        "sglang.srt.mem_cache.minimax_m3_nvfp4_pool.MiniMaxM3Nvfp4IndexKPool",
        "packed NVFP4 slab rows are not supported yet.",
        PoolKind.KEY_ONLY,
    ),
    _no(
        "sglang.srt.hardware_backend.mlx.model_runner_stub._DummyKVCache",
        "MLX manages its own cache; this class holds no buffers.",
    ),
    _no(
        f"{_MEM}.MHATokenToKVPoolMXFP8",
        "its float8_e4m3fn K/V rows carry one UE8M0 scale per 32 elements in separate "
        "scale buffers (interleaved per page when page_size is 128); kvcompat has no codec "
        "for that layout yet, and treating it as a plain fp8 pool would read unscaled "
        "values and leave the scales stale on write.",
        PoolKind.SPLIT,
    ),
    *(
        _no(
            f"{_PI}.PageInterleave{name}TokenToKVPool",
            "during a sharded extend its getters return a scratch slot and start an NCCL "
            "all-gather; a uniform view would either lie or trigger the collective.",
            kind,
        )
        for name, kind in (
            ("MHA", PoolKind.SPLIT),
            ("MLA", PoolKind.LATENT),
            ("DSA", PoolKind.LATENT),
        )
    ),
    _no(
        "sglang.srt.mem_cache.minimax_m3_nvfp4_pool.MiniMaxM3Nvfp4KVPool",
        "MiniMax sparse pools (dense/main/index routing, NVFP4 slab rows) are not supported yet.",
        PoolKind.COMPOSITE,
    ),
    _no(
        f"{_NPU}.memory_pool_npu.NPUMiniMaxSparseKVPool",
        "MiniMax sparse pools are not supported yet, and NPU pools have not been checked.",
        PoolKind.COMPOSITE,
    ),
    _no(
        f"{_DSV4}.DeepSeekV4UnifiedKVPool",
        "the AMD unified_kv store keeps the sliding-window ring and the compressed rows in "
        "one [rows, 512] buffer per layer (bf16, or fp8 with a separate rope buffer); "
        "kvcompat has no adapter for that row addressing yet.",
    ),
    _no(
        "sglang.srt.mem_cache.base_swa_memory_pool.BaseSWAKVPool",
        "it is an abstract base of the sliding-window pools and holds no buffers itself.",
    ),
    _no(
        f"{_MEM}.KVCache",
        "this KVCache subclass is not one kvcompat knows.",
    ),
)

for _family in SGLANG_CLASSES:
    _install(_family, name_fallback="sglang.")
