"""vLLM's own planner and allocator, run on the CPU: the caches a connector really receives.

``build(case)`` makes the specs a model's layers would declare, plans them with vLLM's
``get_kv_cache_config_from_groups`` under the case's layout, allocates with vLLM's
``allocate_kv_cache`` (CPU), and returns ``(kv_caches, kv_cache_config)`` exactly as
``register_kv_caches`` and the connector's constructor get them. ``extensible=True``
(0.34) runs 0.34's own segment functions (``pad_kv_cache_segments``,
``ExtensibleKVCache._segments``, ``committed_kv_cache_tensors``, ``committed_views``) over
a host reservation, faking only ``segment_view`` (CUDA VMM there): each segment view has
its own storage aliasing the reservation, as vLLM's dlpack view does.

Only imported by tests that run with vLLM importable (``tests/vllm``).
"""

from __future__ import annotations

import copy
import ctypes
import importlib
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import vllm
from vllm.v1.core.kv_cache_planning import (
    get_kv_cache_config_from_groups,
    get_kv_cache_groups,
)
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVQuantMode,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.worker.utils import allocate_kv_cache

VERSION = vllm.__version__

LAYOUTS = ("LBNHC", "LBHNC", "BLHNC", "BLNHC")


@dataclass
class Built:
    """What a connector holds, plus what the test needs to know about how it was made."""

    kv_caches: dict[str, torch.Tensor]
    config: Any
    layout: str
    keep: list[Any] = field(default_factory=list)  # host reservations the views alias


def _stub(layout: str, blocks: int | None) -> Any:
    cache = SimpleNamespace(
        prefix_cache_retention_interval=None,
        num_gpu_blocks_override=blocks,
        kv_cache_layout=layout,
        get_resolved_kv_cache_layout=lambda: KVCacheLayout[layout],
    )
    return SimpleNamespace(
        cache_config=cache,
        attention_config=SimpleNamespace(hisparse_config=None),
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
    )


def plan(groups: list[tuple[list[str], Any]], layout: str, blocks: int) -> Any:
    """vLLM's grouping and planner over the layers' specs, with ``blocks`` blocks.

    ``groups`` lists (names, spec); vLLM's own ``get_kv_cache_groups`` decides the KV-cache
    groups from the per-layer specs (DeepSeek-V4's compressed KV and indexer pages become
    one ``UniformTypeKVCacheSpecs`` group; a hybrid model's groups alias one another).
    """
    stub = _stub(layout, blocks)
    specs = get_kv_cache_groups(stub, {name: spec for names, spec in groups for name in names})
    per_block = 1 << 40  # num_gpu_blocks_override decides the count
    config = get_kv_cache_config_from_groups(stub, specs, per_block)
    config.kv_cache_layout = layout
    return config


def allocate(groups: list[tuple[list[str], Any]], layout: str, blocks: int) -> Built:
    """Plan and allocate on the CPU: the dict and config a connector gets (no extensible)."""
    config = plan(groups, layout, blocks)
    caches = allocate_kv_cache(config, torch.device("cpu"), KVCacheLayout[layout])
    return Built(caches, config, layout)


class _HostSegments:
    """``segment_view(i)``: a uint8 tensor with its own storage over a host reservation."""

    def __init__(self, size: int, offsets: list[int], strides: list[int], blocks: int):
        self.reservation = torch.zeros(size, dtype=torch.uint8)
        self.offsets, self.strides, self.blocks = offsets, strides, blocks

    def segment_view(self, index: int) -> torch.Tensor:
        nbytes = self.blocks * self.strides[index]
        address = self.reservation.data_ptr() + self.offsets[index]
        array = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))
        return torch.from_numpy(array)  # a storage of its own, aliasing the reservation


def allocate_extensible(
    groups: list[tuple[list[str], Any]], layout: str, capacity: int, committed: int
) -> Built:
    """0.34's extensible cache after ``extend_kv_cache``, on a host reservation."""
    ext_module = importlib.import_module("vllm.v1.worker.extensible_kv_cache")
    kv_layout = KVCacheLayout[layout]
    engine = ext_module.pad_kv_cache_segments(plan(groups, layout, capacity), kv_layout, 1 << 21)
    cache = object.__new__(ext_module.ExtensibleKVCache)
    tensors = list(engine.kv_cache_tensors)
    cache.size = tensors[0].size
    cache.capacity_blocks = capacity
    cache._is_block_outermost = kv_layout.is_block_outermost
    cache.segment_offsets, cache.segment_strides = cache._segments(tensors, kv_layout)
    cache.bytes_per_block = sum(cache.segment_strides)
    cache.num_committed_blocks = committed
    cache.buffer = _HostSegments(
        cache.size, cache.segment_offsets, cache.segment_strides, committed
    )
    runner = copy.copy(engine)
    runner.num_blocks = committed
    views = cache.committed_views(runner, kv_layout)
    connector = copy.copy(engine)
    connector.num_blocks = committed
    connector.kv_cache_tensors = cache.committed_kv_cache_tensors(connector, kv_layout, committed)
    return Built(views, connector, layout, keep=[cache.buffer])


# -- the model's layers ---------------------------------------------------------------------------


def names(ids: list[int], suffix: str = "self_attn.attn") -> list[str]:
    return [f"model.layers.{i}.{suffix}" for i in ids]


def mha_spec(*, heads: int = 4, head_size: int = 64, block: int = 16, **extra: Any) -> Any:
    return FullAttentionSpec(
        block_size=block, num_kv_heads=heads, head_size=head_size, dtype=torch.bfloat16, **extra
    )


def mla_spec(*, block: int = 64, dtype: torch.dtype = torch.bfloat16, **extra: Any) -> Any:
    return MLAAttentionSpec(block_size=block, num_kv_heads=1, head_size=576, dtype=dtype, **extra)


def fp8_ds_mla_spec(row: int) -> Any:
    return MLAAttentionSpec(
        block_size=64,
        num_kv_heads=1,
        head_size=576,
        dtype=torch.uint8,
        cache_dtype_str="fp8_ds_mla",
        state_content_bytes=row,
    )


def dsv4_kv_spec(ratio: int) -> Any:
    """DeepSeek-V4's compressed KV (``DeepseekV4MLAAttention.get_kv_cache_spec``'s fields)."""
    return MLAAttentionSpec(
        block_size=256,
        num_kv_heads=1,
        max_tp_shards=1,
        head_size=512,
        dtype=torch.uint8,
        tokens_per_state=ratio,
        cache_dtype_str="fp8_ds_mla",
        alignment=576,
        model_version="deepseek_v4",
        state_content_bytes=584,
    )


def dsv4_swa_spec() -> Any:
    """DeepSeek-V4's sliding-window KV (``DeepseekV4SWACache``'s fields, fp8_ds_mla)."""
    return SlidingWindowMLASpec(
        block_size=64,
        num_kv_heads=1,
        max_tp_shards=1,
        head_size=512,
        dtype=torch.uint8,
        sliding_window=128,
        cache_dtype_str="fp8_ds_mla",
        state_content_bytes=584,
        alignment=576,
        model_version="deepseek_v4",
    )


def dsv4_indexer_spec(ratio: int) -> Any:
    """DeepSeek-V4's fp8 indexer keys (``DeepseekV4IndexerCache.get_kv_cache_spec``)."""
    return MLAAttentionSpec(
        block_size=256,
        num_kv_heads=1,
        max_tp_shards=1,
        head_size=132,
        dtype=torch.uint8,
        tokens_per_state=ratio,
        alignment=576,
    )


def dsv4_compressor_spec() -> Any:
    """DeepSeek-V4's C4 compressor state (``DeepseekCompressor.get_kv_cache_spec``'s fields)."""
    return SlidingWindowMLASpec(
        block_size=4,
        num_kv_heads=1,
        max_tp_shards=1,
        head_size=2048,  # 2 * coff * head_dim with coff = 2 (C4), head_dim = 512
        dtype=torch.float32,
        sliding_window=8,
        alignment=576,
    )


def swa_mla_spec() -> Any:
    """A plain bf16 sliding-window MLA cache."""
    return SlidingWindowMLASpec(
        block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16, sliding_window=256
    )


# -- the cases -----------------------------------------------------------------------------------


def case_groups(case: str) -> tuple[list[tuple[list[str], Any]], str]:
    """``(groups, layout)`` of a served case."""
    kind, _, layout = case.partition("@")
    if kind == "mha":
        return [(names([5, 6, 7]), mha_spec())], layout
    if kind == "mha-swa":  # a hybrid model: full and sliding-window groups
        return [
            (names([4, 6]), mha_spec()),
            (names([5, 7]), SlidingWindowSpec(
                block_size=16, num_kv_heads=4, head_size=64, dtype=torch.bfloat16,
                sliding_window=64,
            )),
        ], layout  # fmt: skip
    if kind == "mla":
        return [(names([3, 4]), mla_spec())], layout
    if kind == "swa-mla":
        return [(names([3, 4]), swa_mla_spec())], layout
    if kind in ("fp8_ds_mla-656", "fp8_ds_mla-528"):
        return [(names([3, 4]), fp8_ds_mla_spec(int(kind[-3:])))], layout
    if kind == "dsv4":
        return [
            (names([2, 3], "self_attn.swa_cache"), dsv4_swa_spec()),
            (names([2, 3]), dsv4_kv_spec(4)),
            (names([2, 3], "self_attn.attn.indexer.k_cache"), dsv4_indexer_spec(4)),
            (names([2, 3], "self_attn.attn.compressor"), dsv4_compressor_spec()),
        ], layout
    msg = f"unknown case {case!r}"
    raise KeyError(msg)


SERVED = (
    *(f"mha@{layout}" for layout in LAYOUTS),
    "mha-swa@LBNHC",
    "mla@LBNHC",
    "mla@BLHNC",
    "swa-mla@LBNHC",
    "fp8_ds_mla-656@LBNHC",
    "fp8_ds_mla-656@BLHNC",
    "fp8_ds_mla-528@LBNHC",
    "dsv4@BLHNC",
    "dsv4@BLNHC",
)
"""Every served case: ``format@layout``."""

BLOCKS = 6


def build(case: str, *, blocks: int = BLOCKS) -> Built:
    """The caches of a served case, from vLLM's planner and allocator."""
    groups, layout = case_groups(case)
    return allocate(groups, layout, blocks)


def has_extensible() -> bool:
    try:
        importlib.import_module("vllm.v1.worker.extensible_kv_cache")
    except ImportError:
        return False
    return True


EXTENSIBLE = ("mha@LBNHC", "mha@LBHNC", "mla@LBNHC", "dsv4@BLHNC")


def build_extensible(case: str) -> Built:
    groups, layout = case_groups(case)
    return allocate_extensible(groups, layout, capacity=8, committed=BLOCKS)


# -- refused modes -------------------------------------------------------------------------------


def refused_specs() -> dict[str, tuple[Any, str]]:
    """Mode -> (a spec of that mode, the word the refusal must name)."""
    found: dict[str, tuple[Any, str]] = {
        "nvfp4": (mha_spec(kv_quant_mode=KVQuantMode.NVFP4), "NVFP4"),
        "turboquant": (mha_spec(kv_quant_mode=KVQuantMode.TURBOQUANT_K8V4), "TURBOQUANT"),
        "fp8_per_token_head": (
            mha_spec(kv_quant_mode=KVQuantMode.FP8_PER_TOKEN_HEAD),
            "FP8_PER_TOKEN_HEAD",
        ),
        "int8_per_token_head": (
            mha_spec(kv_quant_mode=KVQuantMode.INT8_PER_TOKEN_HEAD),
            "INT8_PER_TOKEN_HEAD",
        ),
        "nvfp4_ds_mla": (
            MLAAttentionSpec(
                block_size=64,
                num_kv_heads=1,
                head_size=576,
                dtype=torch.uint8,
                cache_dtype_str="nvfp4_ds_mla",
                state_content_bytes=352,
                kv_quant_mode=KVQuantMode.NVFP4_DS_MLA,
            ),
            "NVFP4_DS_MLA",
        ),
        "mamba": (
            MambaSpec(block_size=16, shapes=((4, 8),), dtypes=(torch.float32,)),
            "MambaSpec",
        ),
        "mxfp4_indexer": (
            MLAAttentionSpec(
                block_size=256,
                num_kv_heads=1,
                head_size=68,
                dtype=torch.uint8,
                tokens_per_state=4,
                alignment=576,
            ),
            "MXFP4",
        ),
    }
    spec_fields = set(FullAttentionSpec.__dataclass_fields__)
    if "kv_head_major_slots" in spec_fields:  # 0.34 on
        found["kv_head_major_slots"] = (
            FullAttentionSpec(
                block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16,
                num_head_slots=4, kv_head_major_slots=True,
            ),
            "kv_head_major_slots",
        )  # fmt: skip
    return found
