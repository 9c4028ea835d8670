"""One builder per SGLang pool class that constructs on CPU: a fresh native pool each call.

Builders work on every release from 0.5.12 to 0.5.23. Where a constructor differs between
releases the builder asks the installed class (its signature), never the version string:
``enable_kvcache_transpose`` (a required argument of ``SWAKVPool`` / ``HybridLinearKVPool``
until 0.5.14), one ``state_dtype`` or ``c4_state_dtype`` + ``c128_state_dtype`` (the DSv4
composite, split in 0.5.14), ``use_fp4_indexer`` (from 0.5.21), ``kv_layout`` (from 0.5.21).
A configuration the installed release cannot build (a class it does not have, an ``fp4``
indexer before 0.5.21, a ``kv_layout`` before it existed) raises :class:`ReleaseLacks`
(see :mod:`_sglang.features`), which the tests turn into a skip naming the missing feature.

Every builder calls :func:`~_sglang.env.prepare_sglang` first (idempotent), builds on
``device="cpu"`` with ``enable_memory_saver=False`` and the small sizes measured in
``shared/reference/sglang-on-cpu.md``, and returns the native object untouched.

``end_layer``: SGLang's model set-up passes the *exclusive* end of the pipeline stage
(``kv_cache_configurator``: ``start_layer <= i < end_layer``), while ``KVCache.__init__``
defaults it to ``layer_num - 1`` whatever ``start_layer`` is (trap 2). Builders taking a
``start_layer`` therefore take ``end_layer=STAGE_END`` (the default: pass
``start_layer + layer_num`` as production does), ``None`` (omit it: the native default), or
an ``int`` (passed through).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any, Final

import torch

from _sglang.features import ReleaseLacks, accepts, pool_class, require, require_kv_layout

__all__ = [
    "DSV4_LAYOUT_DIMS",
    "OFFSET_KEY_BUILDERS",
    "STAGED_BUILDERS",
    "STAGE_END",
    "EndLayer",
    "ReleaseLacks",
    "allocator_mapping",
    "build_dsa_pool",
    "build_dsv4_indexer_pool",
    "build_dsv4_single_pool",
    "build_dsv4_token_pool",
    "build_dsv4_unified_pool",
    "build_dsv4_uniform_fp8_pool",
    "build_hisparse_c4_pool",
    "build_hybrid_linear_pool",
    "build_k_only_pool",
    "build_mha_pool",
    "build_minimax_sparse_pool",
    "build_mla_pool",
    "build_nsa_pool",
    "build_swa_pool",
    "end_layer_kwargs",
    "radix_layer",
    "register_allocator_mapping",
]


class _StageEnd:
    """Sentinel type of :data:`STAGE_END`."""

    def __repr__(self) -> str:
        return "STAGE_END"


STAGE_END: Final = _StageEnd()
"""``end_layer`` value meaning "``start_layer + layer_num``", as SGLang's model set-up passes."""

EndLayer = int | None | _StageEnd

DEVICE: Final = "cpu"
SIZE: Final = 64
MHA_PAGE: Final = 16
HEAD_NUM: Final = 2
HEAD_DIM: Final = 8
KV_LORA_RANK: Final = 32
QK_ROPE: Final = 16
DSA_PAGE: Final = 64  # DSATokenToKVPool asserts 64-token physical pages off HIP/XPU.
DSA_INDEX_HEAD_DIM: Final = 128  # asserted by DSATokenToKVPool
DSA_KV_CACHE_DIM: Final = KV_LORA_RANK + QK_ROPE
DSV4_PAGE: Final = 64
DSV4_INDEX_HEAD_DIM: Final = 128

DSV4_LAYOUT_DIMS: Final[Mapping[str, tuple[int, int]]] = {
    # kv_layout -> (qk_nope_head_dim, qk_rope_head_dim) accepted on CPU. V4 asserts
    # 448 fp8 + 64 bf16 rope = 584 B/token; the V4.1 family (and "uniform_fp8" given as a
    # layout) only assert nope + rope == 512, so DeepSeek-V4's real 448 + 64 is used for all.
    "v4": (448, 64),
    "v41": (448, 64),
    "v41_fp4": (448, 64),
    "uniform_fp8": (448, 64),
    "v41_new": (448, 64),
    "v41_fp4_new": (448, 64),
}


def radix_layer(layer_id: int) -> SimpleNamespace:
    """The part of a RadixAttention layer that ``set_kv_buffer`` and friends read."""
    return SimpleNamespace(layer_id=layer_id)


def end_layer_kwargs(start_layer: int, layer_num: int, end_layer: EndLayer) -> dict[str, int]:
    """The ``end_layer`` keyword argument (or none) for a builder's ``end_layer`` value."""
    if isinstance(end_layer, _StageEnd):
        return {"end_layer": start_layer + layer_num}
    if end_layer is None:
        return {}
    return {"end_layer": end_layer}


def _stage(start_layer: int, layer_num: int, end_layer: EndLayer) -> dict[str, int]:
    """``start_layer`` / ``end_layer`` keyword arguments for a stage-aware constructor."""
    return {"start_layer": start_layer, **end_layer_kwargs(start_layer, layer_num, end_layer)}


def _no_transpose(cls: type) -> dict[str, bool]:
    """``enable_kvcache_transpose=False`` where the constructor requires it (until 0.5.14)."""
    return {"enable_kvcache_transpose": False} if accepts(cls, "enable_kvcache_transpose") else {}


def _layout_kwargs(cls: type, kv_layout: str | None) -> dict[str, str]:
    """``kv_layout=`` for a DSv4 pool, or :class:`ReleaseLacks` where the release has no
    such parameter (before 0.5.21) or no such layout in its ``KVLayout`` (0.5.21 has V4,
    V41 and V41_FP4; the ``_new`` page formats and UNIFORM_FP8 come later)."""
    if kv_layout is None:
        return {}
    require_kv_layout(cls, kv_layout)
    return {"kv_layout": kv_layout}


def build_mha_pool(
    *,
    start_layer: int = 0,
    layer_num: int = 2,
    end_layer: EndLayer = STAGE_END,
    dtype: torch.dtype = torch.bfloat16,
    size: int = SIZE,
    page_size: int = MHA_PAGE,
    k_only: bool = False,
) -> Any:
    """``MHATokenToKVPool``: K and V ``[size + page, heads, dim]`` per layer; with
    ``k_only``, ``MHATokenToKOnlyPool`` (MiniMax sparse index keys): K only."""
    cls = pool_class("MHATokenToKOnlyPool" if k_only else "MHATokenToKVPool")
    return cls(
        size=size,
        page_size=page_size,
        dtype=dtype,
        head_num=HEAD_NUM,
        head_dim=HEAD_DIM,
        layer_num=layer_num,
        device=DEVICE,
        enable_memory_saver=False,
        **_stage(start_layer, layer_num, end_layer),
    )


def build_k_only_pool(
    *,
    start_layer: int = 0,
    layer_num: int = 2,
    end_layer: EndLayer = STAGE_END,
    dtype: torch.dtype = torch.bfloat16,
) -> Any:
    """``MHATokenToKOnlyPool`` (MiniMax sparse index keys): K only."""
    return build_mha_pool(
        start_layer=start_layer, layer_num=layer_num, end_layer=end_layer, dtype=dtype,
        k_only=True,
    )  # fmt: skip


def build_minimax_sparse_pool() -> Any:
    """``MiniMaxSparseKVPool`` (0.5.15 on) over layers 0-3: layer 0 dense, 1-3 sparse, and
    of those 1 and 3 K-only, so its ``index_k_pool`` is an ``MHATokenToKOnlyPool`` serving
    them as local ids 0 and 1."""
    return pool_class("MiniMaxSparseKVPool")(
        size=SIZE,
        page_size=MHA_PAGE,
        dtype=torch.bfloat16,
        head_num=HEAD_NUM,
        head_dim=HEAD_DIM,
        idx_head_dim=HEAD_DIM,
        dense_layer_ids=[0],
        sparse_layer_ids=[1, 2, 3],
        disable_value_sparse_layer_ids=[1, 3],
        device=DEVICE,
        enable_memory_saver=False,
        start_layer=0,
        end_layer=4,
    )


def build_mla_pool(
    *,
    start_layer: int = 0,
    layer_num: int = 2,
    end_layer: EndLayer = STAGE_END,
    dtype: torch.dtype = torch.bfloat16,
) -> Any:
    """``MLATokenToKVPool``: one latent row ``[size + page, 1, kv_lora_rank + rope]`` per layer."""
    return pool_class("MLATokenToKVPool")(
        size=SIZE,
        page_size=MHA_PAGE,
        dtype=dtype,
        kv_lora_rank=KV_LORA_RANK,
        qk_rope_head_dim=QK_ROPE,
        layer_num=layer_num,
        device=DEVICE,
        enable_memory_saver=False,
        **_stage(start_layer, layer_num, end_layer),
    )


def build_dsa_pool(
    *,
    start_layer: int = 0,
    layer_num: int = 2,
    end_layer: EndLayer = STAGE_END,
) -> Any:
    """``DSATokenToKVPool`` (bf16 latent, so not the packed 656-byte fp8 row) + index-K cache."""
    return _dsa_like("DSATokenToKVPool", start_layer, layer_num, end_layer)


def build_nsa_pool(
    *,
    start_layer: int = 0,
    layer_num: int = 2,
    end_layer: EndLayer = STAGE_END,
) -> Any:
    """``NSATokenToKVPool``: SGLang 0.5.12's name for the DSA pool (bf16 latent + index keys
    in an ``index_k_with_scale_buffer`` list); ReleaseLacks on 0.5.13 on."""
    return _dsa_like("NSATokenToKVPool", start_layer, layer_num, end_layer)


def _dsa_like(name: str, start_layer: int, layer_num: int, end_layer: EndLayer) -> Any:
    """A bf16 DSA-family pool (``DSATokenToKVPool`` or 0.5.12's ``NSATokenToKVPool``)."""
    return pool_class(name)(
        size=SIZE,
        page_size=DSA_PAGE,
        kv_lora_rank=KV_LORA_RANK,
        dtype=torch.bfloat16,
        qk_rope_head_dim=QK_ROPE,
        layer_num=layer_num,
        device=DEVICE,
        index_head_dim=DSA_INDEX_HEAD_DIM,
        enable_memory_saver=False,
        kv_cache_dim=DSA_KV_CACHE_DIM,
        **_stage(start_layer, layer_num, end_layer),
    )


def build_hybrid_linear_pool(
    *,
    full_attention_layer_ids: Sequence[int] = (1, 3),
    start_layer: int = 0,
    mamba_pool: Any = None,
) -> Any:
    """``HybridLinearKVPool`` over an MHA sub-pool; no ``mamba_pool`` unless one is given.

    The wrapper takes global ids of the full-attention layers and maps them to dense
    sub-pool ids; ``start_layer`` only shifts its layer-transfer wait. It has no ``end_layer``.
    """
    cls = pool_class("HybridLinearKVPool")
    return cls(
        size=SIZE,
        dtype=torch.bfloat16,
        page_size=MHA_PAGE,
        head_num=HEAD_NUM,
        head_dim=HEAD_DIM,
        full_attention_layer_ids=list(full_attention_layer_ids),
        device=DEVICE,
        mamba_pool=mamba_pool,
        enable_memory_saver=False,
        start_layer=start_layer,
        **_no_transpose(cls),
    )


def build_swa_pool(
    *,
    swa_attention_layer_ids: Sequence[int] = (0, 2),
    full_attention_layer_ids: Sequence[int] = (1, 3),
    size_swa: int = 32,
    sub_pool_kwargs: Mapping[str, Any] | None = None,
) -> Any:
    """``SWAKVPool`` over two MHA sub-pools.

    The wrapper has no ``start_layer`` parameter (it hard-codes 0); a pipeline stage is
    expressed by its global layer ids. ``sub_pool_kwargs`` go through the wrapper's
    ``**kwargs`` to *both* sub-pools -- that is how trap 5 (``start_layer`` via kwargs) is built.
    """
    cls = pool_class("SWAKVPool")
    return cls(
        size=SIZE,
        size_swa=size_swa,
        page_size=MHA_PAGE,
        dtype=torch.bfloat16,
        head_num=HEAD_NUM,
        head_dim=HEAD_DIM,
        swa_attention_layer_ids=list(swa_attention_layer_ids),
        full_attention_layer_ids=list(full_attention_layer_ids),
        device=DEVICE,
        enable_memory_saver=False,
        **_no_transpose(cls),
        **dict(sub_pool_kwargs or {}),
    )


def _dsv4_single_like(
    cls_name: str,
    *,
    start_layer: int,
    layer_num: int,
    end_layer: EndLayer,
    dtype: torch.dtype,
    kv_layout: str | None,
    size: int,
    page_size: int,
) -> Any:
    cls = pool_class(cls_name)
    nope, rope = DSV4_LAYOUT_DIMS[kv_layout or "v4"]
    layout = _layout_kwargs(cls, kv_layout)
    return cls(
        size,
        page_size,
        dtype,
        nope,
        rope,
        layer_num,
        DEVICE,
        False,  # enable_memory_saver
        **_stage(start_layer, layer_num, end_layer),
        **layout,
    )


def build_dsv4_single_pool(
    *,
    start_layer: int = 0,
    layer_num: int = 2,
    end_layer: EndLayer = STAGE_END,
    kv_layout: str | None = None,
    dtype: torch.dtype = torch.float8_e4m3fn,
    size: int = SIZE,
    page_size: int = DSV4_PAGE,
) -> Any:
    """``DeepSeekV4SingleKVPool``: one ``[pages, page_bytes]`` uint8 buffer per layer.

    ``kv_layout=None`` leaves the constructor default (V4); any key of
    :data:`DSV4_LAYOUT_DIMS` is passed as the ``kv_layout`` string. ``dtype`` must store as
    uint8 (an fp8 dtype, or ``torch.uint8`` itself); bf16 fails a bare AssertionError.
    """
    return _dsv4_single_like(
        "DeepSeekV4SingleKVPool",
        start_layer=start_layer,
        layer_num=layer_num,
        end_layer=end_layer,
        dtype=dtype,
        kv_layout=kv_layout,
        size=size,
        page_size=page_size,
    )


def build_dsv4_uniform_fp8_pool(
    *,
    start_layer: int = 0,
    layer_num: int = 2,
    end_layer: EndLayer = STAGE_END,
) -> Any:
    """``DeepSeekV4UniformFP8KVPool`` (TRT-LLM): ``[pages, page * 512]`` float8_e4m3fn."""
    return _dsv4_single_like(
        "DeepSeekV4UniformFP8KVPool",
        start_layer=start_layer,
        layer_num=layer_num,
        end_layer=end_layer,
        dtype=torch.float8_e4m3fn,
        kv_layout=None,
        size=SIZE,
        page_size=DSV4_PAGE,
    )


def build_hisparse_c4_pool(
    *,
    start_layer: int = 0,
    layer_num: int = 2,
    end_layer: EndLayer = STAGE_END,
) -> Any:
    """``HiSparseC4DevicePool``: a V4 single pool whose rows are HiSparse device slots."""
    return _dsv4_single_like(
        "HiSparseC4DevicePool",
        start_layer=start_layer,
        layer_num=layer_num,
        end_layer=end_layer,
        dtype=torch.float8_e4m3fn,
        kv_layout=None,
        size=SIZE,
        page_size=DSV4_PAGE,
    )


def build_dsv4_indexer_pool(
    *,
    use_fp4_indexer: bool | None = False,
    start_layer: int = 0,
    layer_num: int = 2,
    end_layer: EndLayer = STAGE_END,
) -> Any:
    """``DeepSeekV4IndexerPool``: ``[pages, page * 132]`` (fp8) or ``[pages, page * 68]`` (fp4).

    ``use_fp4_indexer=None`` reads ``enable_deepseek_v4_fp4_indexer`` from the published
    runtime config (False under the dummy config).
    """
    cls = pool_class("DeepSeekV4IndexerPool")
    if accepts(cls, "use_fp4_indexer"):
        fp4: dict[str, Any] = {"use_fp4_indexer": use_fp4_indexer}
    elif use_fp4_indexer is False:
        fp4 = {}  # the only indexer these releases have is the fp8 one
    else:
        feature = "DeepSeekV4IndexerPool(use_fp4_indexer=...)"
        raise ReleaseLacks(feature, f"use_fp4_indexer={use_fp4_indexer!r}")
    return cls(
        SIZE,
        DSV4_PAGE,
        torch.float8_e4m3fn,
        DSV4_INDEX_HEAD_DIM,
        layer_num,
        DEVICE,
        False,  # enable_memory_saver
        **fp4,
        **_stage(start_layer, layer_num, end_layer),
    )


def build_dsv4_token_pool(
    *,
    compression_ratios: Sequence[int] = (0, 4, 128),
    start_layer: int | None = None,
    end_layer: EndLayer = STAGE_END,
    kv_layout: str | None = None,
    page_size: int = 256,
    allow_short_swa: bool = False,
    **newer: Any,
) -> Any:
    """``DeepSeekV4TokenToKVPool``: SWA main cache + c4/c128 compressed caches + c4 indexer.

    ``newer`` are constructor arguments only some releases take (``kv_source_layers``,
    ``full_size``): :class:`ReleaseLacks` where the installed class does not take one.

    ``start_layer`` without ``end_layer`` builds the whole model's stage; 0.5.12 then still
    gives the SWA pool only ``layer_num`` buffers (fewer than the stage's layers, an
    inconsistent pool kvcompat refuses), which raises :class:`ReleaseLacks` unless
    ``allow_short_swa``.

    ``compression_ratios`` is the whole model's list (one entry per model layer), as in
    production. ``start_layer=None`` builds the whole model; an int builds the pipeline stage
    ``[start_layer, end_layer)`` (``end_layer=STAGE_END`` means ``len(compression_ratios)``).
    ``layer_num`` is the stage's layer count. ``page_size`` must be a multiple of 128 (the
    c128 page is ``page_size // 128``; 64 fails ZeroDivisionError).
    """
    cls = pool_class("DeepSeekV4TokenToKVPool")
    ratios = list(compression_ratios)
    if start_layer is None:
        stage: dict[str, int] = {}
        layer_num = len(ratios)
    else:
        end = len(ratios) if isinstance(end_layer, _StageEnd) else end_layer
        stage = {"start_layer": start_layer, **({} if end is None else {"end_layer": end})}
        layer_num = (len(ratios) if end is None else end) - start_layer
    layout = _layout_kwargs(cls, kv_layout)
    for name in newer:
        require(accepts(cls, name), f"DeepSeekV4TokenToKVPool({name}=...)")
    if accepts(cls, "c4_state_dtype"):
        states = {"c4_state_dtype": torch.float32, "c128_state_dtype": torch.float32}
    else:  # 0.5.12-0.5.13: one state dtype for both compress-state pools
        states = {"state_dtype": torch.float32}
    pool = cls(
        max_num_reqs=4,
        swa_size=256,
        c4_size=64,
        c128_size=4,
        c4_state_pool_size=4,
        c128_state_pool_size=4,
        page_size=page_size,
        swa_page_size=page_size,
        dtype=torch.float8_e4m3fn,
        **states,
        qk_nope_head_dim=448,
        qk_rope_head_dim=64,
        indexer_head_dim=DSV4_INDEX_HEAD_DIM,
        layer_num=layer_num,
        device=DEVICE,
        enable_memory_saver=False,
        compression_ratios=ratios,
        **stage,
        **layout,
        **newer,
    )
    swa = getattr(pool, "swa_kv_pool", None)
    stage_layers = pool._stage_end - pool._stage_start
    if not allow_short_swa and swa is not None and len(swa.kv_buffer) < stage_layers:
        feature = "DeepSeekV4TokenToKVPool sizing its SWA pool to the stage without end_layer"
        raise ReleaseLacks(feature, f"{len(swa.kv_buffer)} SWA buffers for {stage_layers} layers")
    return pool


def build_dsv4_unified_pool() -> Any:
    """``DeepSeekV4TokenToKVPool`` in ATOM's ``unified_kv`` mode (from 0.5.21).

    SGLang builds it only on HIP; its gate (``unified_kv_gate.is_unified_kv_triton``) is
    forced on for the construction and restored after. :class:`ReleaseLacks` where the
    release has no such gate.
    """
    try:
        gate = importlib.import_module("sglang.srt.layers.attention.dsv4.unified_kv_gate")
    except ModuleNotFoundError as exc:
        raise ReleaseLacks("DeepSeek-V4 unified_kv pools (unified_kv_gate)") from exc
    original = gate.is_unified_kv_triton
    gate.is_unified_kv_triton = lambda: True
    try:
        return build_dsv4_token_pool()
    finally:
        gate.is_unified_kv_triton = original


STAGED_BUILDERS: Final[tuple[tuple[str, Callable[..., Any], str], ...]] = (
    ("MHATokenToKVPool", build_mha_pool, "k_buffer"),
    ("MHATokenToKOnlyPool", build_k_only_pool, "k_buffer"),
    ("MLATokenToKVPool", build_mla_pool, "kv_buffer"),
    ("DSATokenToKVPool", build_dsa_pool, "kv_buffer"),
    ("DeepSeekV4SingleKVPool", build_dsv4_single_pool, "kv_buffer"),
    ("DeepSeekV4UniformFP8KVPool", build_dsv4_uniform_fp8_pool, "kv_buffer"),
    ("HiSparseC4DevicePool", build_hisparse_c4_pool, "kv_buffer"),
    ("DeepSeekV4IndexerPool", build_dsv4_indexer_pool, "index_k_with_scale_buffer"),
)
"""The single (non-composite) pools that take a pipeline stage: class name, builder, and
the attribute holding the per-layer buffers ``get_key_buffer`` indexes."""

OFFSET_KEY_BUILDERS: Final = tuple(
    case
    for case in STAGED_BUILDERS
    if case[0] not in ("DeepSeekV4UniformFP8KVPool", "DeepSeekV4IndexerPool")
)
"""Those whose ``get_key_buffer`` subtracts ``start_layer`` (the uniform-fp8 and indexer
pools index their key buffers by raw id: trap 3)."""


def allocator_mapping(full_rows: int, slot_rows: int, *, seed: int) -> tuple[Any, Any]:
    """A full->slot mapping shaped like SGLang's allocators make it, and the locations it maps.

    SGLang's SWA and HiSparse allocators start from zeros of ``full_rows`` entries plus a
    trailing ``-1`` sentinel, and hand each allocated full location a slot of the smaller
    pool, in whatever order pages come back (slot 0 is the padding slot, never handed out).
    This maps a random ``3/4`` of the slots to a random subset of full locations (never 0),
    so the mapping is neither the identity nor a permutation: most locations have no slot.
    Returns ``(mapping, allocated)``: the int64 mapping and the mapped full locations.
    """
    gen = torch.Generator().manual_seed(seed)
    slots = (torch.randperm(slot_rows - 1, generator=gen) + 1)[: max(1, 3 * (slot_rows - 1) // 4)]
    allocated = (torch.randperm(full_rows - 1, generator=gen) + 1)[: slots.numel()]
    mapping = torch.zeros(full_rows + 1, dtype=torch.int64)
    mapping[allocated] = slots
    mapping[-1] = -1
    return mapping, allocated


def register_allocator_mapping(native: Any, *, seed: int = 0) -> Any:
    """Register an allocator-shaped mapping on ``native``; returns the mapped locations.

    The sliding-window composites (``SWAKVPool``, ``DeepSeekV4TokenToKVPool``) map full-pool
    locations (``size + page_size`` of them) to SWA slots; ``HiSparseC4DevicePool`` maps
    compressed locations (twice its device rows here, as HiSparse keeps fewer on the device)
    to device slots. Returns None for pools without a mapping.
    """
    if not hasattr(native, "register_mapping"):
        return None
    swa = getattr(native, "swa_kv_pool", None)
    if swa is not None:
        buffer = swa.k_buffer[0] if hasattr(swa, "k_buffer") else swa.kv_buffer[0]
        slot_rows = int(buffer.shape[0]) * (int(swa.page_size) if buffer.dim() == 2 else 1)
        full_rows = int(native.size) + int(native.page_size)
    else:  # HiSparse: device rows are pages x page_size
        slot_rows = int(native.kv_buffer[0].shape[0]) * int(native.page_size)
        full_rows = 2 * slot_rows
    mapping, allocated = allocator_mapping(full_rows, slot_rows, seed=seed)
    native.register_mapping(mapping)
    return allocated
