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

import inspect
import sys
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import torch

from kvcompat._errors import LayoutError, UnsupportedPoolError
from kvcompat._families import Family, _install, adapt_part
from kvcompat._protocol import KVPoolProtocol, PoolKind
from kvcompat.adapters._base import Buffer, require_attrs
from kvcompat.adapters._composite import CompositeAdapter, CompositeParts
from kvcompat.adapters._dsv4_pools import dsv4_compressed_pools
from kvcompat.adapters._io import LayerLayout
from kvcompat.adapters._leaf import (
    IndexKeyAdapter,
    KeyOnlyAdapter,
    LatentAdapter,
    LeafAdapter,
    SingleKVAdapter,
    SplitAdapter,
)
from kvcompat.layouts.dsv4_indexer_fp8 import DSV4_INDEXER_FP8

__all__ = [
    "DSA_INDEXER",
    "DSV4_TOKEN_POOL_PARTS",
    "HYBRID_LINEAR_PARTS",
    "SGLANG_CLASSES",
    "SWA_PARTS",
    "DSAAdapter",
    "DSAIndexKeyAdapter",
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
_DSV4_TOKEN_POOL_ATTRS = ("swa_kv_pool", "_stage_start", "_stage_end", "layer_mapping")
"""What :func:`adapt_dsv4_token_pool` reads besides the compressed pools (every release)."""


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
    # Absent (caught mid-construction) and None (unified_kv / request-window mode) differ.
    require_attrs(native, _DSV4_TOKEN_POOL_ATTRS, reader=f"kvcompat's {owner} adapter")
    swa_pool = native.swa_kv_pool
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


# -- DSA: the latent rows, and the index keys as the ``indexer`` component -----------------------

DSA_INDEXER = "indexer"
"""Component name of a DSA pool's index keys: ``kvcompat.adapt(dsa_pool).components["indexer"]``.

DeepSeek-V4 names its index-key parts ``c{ratio}_indexer``, after the compressed cache whose
layers they index; a DSA pool has one index-key store and no compression ratio, so its part is
the bare ``indexer``."""

# The module of SGLang's IndexKeyCache (recent releases); its _use_aiter_preshuffle flag says the
# key bytes of a page are tiled for AITER's paged MQA (HIP): not the layout kvcompat reads.
_INDEX_KEY_CACHE_MODULE = "sglang.srt.mem_cache.index_key_cache"


def dsa_index_slots(
    native: Any, slots: Mapping[int, int], read: Callable[[Any, str, Any], Any] = getattr
) -> dict[int, int]:
    """The layers of ``slots`` (layer id -> buffer slot) whose index keys a DSA pool stores.

    A layer marked in ``skip_topk_layers`` reuses the previous layer's top-k and keeps a
    0-row placeholder instead of index keys (SGLang 0.5.2x); it is left out. ``read`` is
    ``getattr`` or a static reader that runs no code.

    Example:
        >>> from types import SimpleNamespace
        >>> dsa_index_slots(SimpleNamespace(skip_topk_layers=[False, True]), {4: 0, 5: 1})
        {4: 0}
        >>> dsa_index_slots(SimpleNamespace(), {4: 0, 5: 1})  # releases without the flag
        {4: 0, 5: 1}
    """
    skip = read(native, "skip_topk_layers", None)
    flags = tuple(bool(flag) for flag in skip) if isinstance(skip, (list, tuple)) else ()
    return {
        layer: slot
        for layer, slot in sorted(slots.items())
        if not (0 <= slot < len(flags) and flags[slot])
    }


class DSAIndexKeyAdapter(IndexKeyAdapter):
    """A DSA pool's index keys: the ``indexer`` component of its :class:`DSAAdapter`.

    The store is ``index_k_with_scale_buffer`` (``IndexKeyCache.buffer`` in recent releases,
    a plain list on the pool in 0.5.12's ``NSATokenToKVPool`` and in 0.5.13): one ``uint8`` row of
    ``index_page_size * 132`` bytes per page, the page's 128-byte e4m3 keys followed by one
    fp32 scale per token, byte for byte the DeepSeek-V4 fp8 indexer layout
    (:data:`kvcompat.layouts.DSV4_INDEXER_FP8`), paged at ``index_page_size``. A token
    ``loc`` is the index cache's own location: on ``HiSparseDSATokenToKVPool`` the logical
    location SGLang's ``set_index_k_scale_buffer`` takes, not the device slot its latent
    rows use. Pools that pool ``index_kpool`` tokens per index key, or page the keys apart
    from their row (context-parallel ``dcp_replicated``, HIP's preshuffled tiles), are
    served as raw bytes only: ``read`` and ``write`` raise :class:`~kvcompat.LayoutError`.

    Example:
        >>> DSAIndexKeyAdapter.source_attr, DSAIndexKeyAdapter.kind.value
        ('index_k_with_scale_buffer', 'key_only')
    """

    native_waits = True
    page_size_attr = "index_page_size"
    """The pool attribute holding tokens per index page (``describe`` reads it too)."""
    size_attr = "index_buf_size"
    """The pool attribute holding the index cache's token capacity."""
    buffers: ClassVar[tuple[Buffer, ...]] = (
        Buffer("index_key_cache.buffer", "index_keys", group="state", rows="page"),
        # SGLang 0.5.12 (NSATokenToKVPool) and 0.5.13 keep the per-layer list on the pool.
        Buffer("index_k_with_scale_buffer", "index_keys", group="state", rows="page"),
    )
    returns = (
        "the packed ``uint8`` ``index_k_with_scale_buffer[slot]`` (keys, then scales)",
        "raises ``NoValueBufferError`` (a ``NotImplementedError``)",
    )
    __slots__ = ()

    @property
    def page_size(self) -> int:
        """Tokens per index-key page (``index_page_size``; the pool's ``page_size`` before 0.5.21).

        Example:
            >>> DSAIndexKeyAdapter.page_size.__doc__.split()[0]
            'Tokens'
        """
        native = self._native
        return int(getattr(native, self.page_size_attr, None) or native.page_size)

    @property
    def size(self) -> int:
        """Token capacity of the index cache (``index_buf_size``; twice ``size`` on HiSparse).

        Example:
            >>> DSAIndexKeyAdapter.size.__doc__.split()[0]
            'Token'
        """
        native = self._native
        return int(getattr(native, self.size_attr, None) or native.size)

    @property
    def dtype(self) -> torch.dtype:
        """``float8_e4m3fn``: the keys' element type (the buffer is returned as ``uint8``).

        Example:
            >>> DSAIndexKeyAdapter.dtype.__doc__.split("``")[1]
            'float8_e4m3fn'
        """
        return torch.float8_e4m3fn

    def detect_layout(
        self, layer_id: int, key: torch.Tensor, value: torch.Tensor | None
    ) -> LayerLayout:
        """The DeepSeek-V4 fp8 indexer layout at ``index_page_size``, or a refusal.

        Example:
            >>> DSAIndexKeyAdapter.detect_layout.__name__
            'detect_layout'
        """
        native = self._native
        pooled = int(getattr(native, "index_kpool", 1) or 1)
        module = sys.modules.get(_INDEX_KEY_CACHE_MODULE)
        reason = None
        if pooled != 1:
            reason = (
                f"it pools index_kpool={pooled} tokens into each index key, so a token location "
                "does not address one index key"
            )
        elif module is not None and getattr(module, "_use_aiter_preshuffle", False) is True:
            reason = "its key bytes are tiled for AITER's preshuffled paged MQA (HIP)"
        elif key.dtype != torch.uint8:
            reason = (
                f"its index keys are stored as {key.dtype}, not as packed uint8 e4m3 keys and "
                "fp32 scales"
            )
        page = self.page_size
        if reason is None and (
            key.dim() != 2
            or key.shape[-1] * key.element_size() != DSV4_INDEXER_FP8.page_bytes(page)
        ):
            reason = (
                f"its index pages are {tuple(key.shape)} {key.dtype} while index_page_size={page} "
                f"needs {DSV4_INDEXER_FP8.page_bytes(page)}-byte rows (context-parallel "
                "dcp_replicated pools page the keys apart from their rows)"
            )
        if reason is not None:
            msg = (
                f"{self._name}: kvcompat has no codec for the index keys of "
                f"{type(native).__qualname__} layer {layer_id}: {reason}. The buffer is "
                "reachable as raw bytes through get_key_buffer(); nothing was read or written.\n"
                "Hint: read and write these index keys with SGLang's own "
                "get_index_k_scale_buffer / set_index_k_scale_buffer."
            )
            raise LayoutError(msg)
        return LayerLayout(DSV4_INDEXER_FP8)

    @classmethod
    def layout_name(cls, native: Any) -> str | None:
        """``"dsv4_indexer_fp8"``, the layout of DSA's index keys (None with ``index_kpool > 1``).

        Read statically, for ``describe``: no property or getter of the pool runs.

        Example:
            >>> from types import SimpleNamespace
            >>> DSAIndexKeyAdapter.layout_name(SimpleNamespace(index_kpool=1))
            'dsv4_indexer_fp8'
            >>> print(DSAIndexKeyAdapter.layout_name(SimpleNamespace(index_kpool=2)))
            None
        """
        pooled = inspect.getattr_static(native, "index_kpool", 1)
        bf16 = inspect.getattr_static(native, "index_cache_is_bf16", False) is True
        return DSV4_INDEXER_FP8.name if pooled in (1, None) and not bf16 else None


class DSAAdapter(LatentAdapter):
    """``DSATokenToKVPool``: the latent rows (a latent pool), plus its index keys as a part.

    The getters, ``read`` and ``write`` serve the latent rows exactly as
    :class:`~kvcompat.adapters.LatentAdapter` does (the pool stays a ``latent`` pool);
    :attr:`components` holds the index-key store as ``"indexer"``, a
    :class:`DSAIndexKeyAdapter` serving the same layer ids (less skip-topk layers) with the
    same layer-transfer wait. Inside a composite (``HybridLinearKVPool``, ``SWAKVPool``),
    the DSA part carries its indexer the same way: ``pool.components["full"].components
    ["indexer"]``, with the composite's absolute layer ids.

    Example:
        >>> DSAAdapter.kind.value, [b.attr for b in DSAAdapter.buffers]
        ('latent', ['kv_buffer', 'kv_scale_buffer'])
    """

    buffers: ClassVar[tuple[Buffer, ...]] = tuple(
        b for b in LatentAdapter.buffers if b.role != "index_keys"
    )
    __slots__ = ("_parts",)
    _parts: Mapping[str, KVPoolProtocol]

    @classmethod
    def attached_parts(
        cls,
        native: Any,
        slots: Mapping[int, int],
        read: Callable[[Any, str, Any], Any] = getattr,
    ) -> dict[str, tuple[type[LeafAdapter], dict[int, int]]]:
        """The stores this pool keeps beside its latent rows: name -> (adapter class, slots).

        ``slots`` are the latent's (absolute layer id -> buffer slot); ``describe`` calls
        this with a static ``read`` (no property, no getter runs).

        Example:
            >>> from types import SimpleNamespace
            >>> found = DSAAdapter.attached_parts(SimpleNamespace(), {2: 0, 3: 1})
            >>> {name: (leaf.__name__, slots) for name, (leaf, slots) in found.items()}
            {'indexer': ('DSAIndexKeyAdapter', {2: 0, 3: 1})}
        """
        served = dsa_index_slots(native, slots, read)
        return {DSA_INDEXER: (DSAIndexKeyAdapter, served)} if served else {}

    @property
    def components(self) -> Mapping[str, KVPoolProtocol]:
        """``{"indexer": ...}``: the pool's index keys (empty when every layer skips top-k).

        Example:
            >>> DSAAdapter.components.__doc__.split("``")[1]
            '{"indexer": ...}'
        """
        try:
            return self._parts
        except AttributeError:  # first use: built here, so describe() never reads the store
            pass
        native = self._native
        owner, index = self.wait_plan
        parts: dict[str, KVPoolProtocol] = {}
        for part, (leaf, served) in self.attached_parts(native, self.storage_slots).items():
            parts[part] = leaf(
                native,
                slots=served,
                component=part,
                waits=self.waits,
                wait_owner=owner,
                wait_index={layer: index[layer] for layer in served},
            )
        self._parts = MappingProxyType(parts)
        return self._parts


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
    f"{_MEM}.MLATokenToKVPool": ("UnifiedMLATokenToKVPool",),
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
    _leaf(f"{_MEM}.DSATokenToKVPool", PoolKind.LATENT, DSAAdapter),
    # SGLang 0.5.12's name for the DSA pool: an MLA pool with an index_k_with_scale_buffer list.
    _leaf(f"{_MEM}.NSATokenToKVPool", PoolKind.LATENT, DSAAdapter),
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
