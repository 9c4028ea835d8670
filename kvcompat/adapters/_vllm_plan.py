"""What a vLLM KV connector holds, read without importing vLLM: layers, formats, placements.

A connector gets two objects: the ``dict[str, torch.Tensor]`` that
``KVConnectorBase_V1.register_kv_caches`` receives (one ``[B, H, N, C]`` view per layer
name, strided views of shared storage since vLLM 0.33, one storage per layer under 0.34's
extensible cache), and the ``KVCacheConfig`` its constructor receives (the groups, each
layer's spec, and the placements). This module turns the pair into a :class:`VLLMPlan`:
for every layer name its absolute layer id (vLLM's rule: the one integer among the
dot-separated parts of the name), its registered view, and the :class:`CacheFormat` its
spec says the view holds. Everything is recognised by class names along the MRO, each
confirmed in ``sys.modules`` (vLLM is never imported), and by plain dataclass fields read
with ``inspect.getattr_static`` (no property of vLLM's runs).

Addressing comes from the registered views themselves (their strides and storage offset),
never from ``offset + l * layer_stride``: under 0.34's extensible cache each layer-outer
view has its own storage and the config's placements are relative to it, so the 0.33 rule
would be wrong for every layer past the first. What the views cannot say (which format C
holds, how many tokens a state covers) comes from the spec.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch

from kvcompat._errors import LayoutError, UnsupportedPoolError
from kvcompat._families import _confirmed
from kvcompat._protocol import PoolKind
from kvcompat.layouts import LayoutSpec, dsa_fp8_layout, mha_layout, mla_layout
from kvcompat.layouts.dsa_fp8 import DSA_FP8
from kvcompat.layouts.dsv4_indexer_fp8 import DSV4_INDEXER_FP8
from kvcompat.layouts.dsv4_v4 import V4

__all__ = [
    "TESTED_RELEASES",
    "VLLM_INTERFACE",
    "CacheFormat",
    "VLLMKVCaches",
    "VLLMLayer",
    "VLLMPlan",
    "is_kv_cache_config",
    "parse_layer_id",
    "plan_vllm",
]

TESTED_RELEASES = ("0.33.0", "0.34.0")
"""The vLLM releases the vLLM tier runs under (``tests/vllm_matrix.py``): one line per release."""

VLLM_INTERFACE = "vllm.v1.kv_cache_interface"
"""The module holding vLLM's ``KVCacheConfig`` and spec classes (0.33 and 0.34)."""

_SERVED_SPECS = frozenset(
    {
        "FullAttentionSpec",
        "MLAAttentionSpec",
        "SlidingWindowSpec",
        "SlidingWindowMLASpec",
        "ChunkedLocalAttentionSpec",
    }
)
"""Spec classes whose pages kvcompat reads; any other class (a subclass included) is refused."""

_MLA_SPECS = frozenset({"MLAAttentionSpec", "SlidingWindowMLASpec"})

# KVQuantMode values (an IntEnum, identical in 0.33 and 0.34): which ones kvcompat serves.
_QUANT_NONE = 0
_QUANT_FP8_PER_TENSOR = 1
_QUANT_NAMES = {
    2: "INT8_PER_TOKEN_HEAD",
    3: "FP8_PER_TOKEN_HEAD",
    4: "INT4_PER_TOKEN_HEAD",
    5: "NVFP4",
    6: "TURBOQUANT_K8V4",
    7: "TURBOQUANT_4BIT_NC",
    8: "TURBOQUANT_K3V4_NC",
    9: "TURBOQUANT_3BIT_NC",
    10: "NVFP4_DS_MLA",
    11: "ULTRAQUANT_4BIT",
    12: "OCTAVE_K3V4 (alias CUSTOM)",
    13: "OCTAVE_K3V3",
    14: "OCTAVE_K3V3_COMPACT",
}

_FLOATS = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2)


# -- recognition -------------------------------------------------------------------------------


def _vllm_class(obj: Any, wanted: frozenset[str]) -> str | None:
    """The first of ``wanted`` among the classes of ``obj``'s MRO that are vLLM's own."""
    for cls in type(obj).__mro__:
        if (
            cls.__module__ == VLLM_INTERFACE
            and cls.__qualname__ in wanted
            and _confirmed(cls)  # a look-alike class of the same name is not vLLM's
        ):
            return cls.__qualname__
    return None


def is_kv_cache_config(obj: object) -> bool:
    """Whether ``obj`` is vLLM's ``KVCacheConfig`` (or a subclass). Does not import vllm.

    Example:
        >>> is_kv_cache_config(object())
        False
    """
    return _vllm_class(obj, frozenset({"KVCacheConfig"})) is not None


def _field(obj: Any, name: str, default: Any = None) -> Any:
    """A plain attribute (dataclass field) of ``obj``; no property or getter runs."""
    try:
        found = inspect.getattr_static(obj, name)
    except AttributeError:
        return default
    if isinstance(found, (property, staticmethod, classmethod)) or callable(found):
        return default
    return found


def parse_layer_id(name: str) -> int:
    """The absolute layer id vLLM gives a layer name: its one integer part.

    ``model.layers.7.self_attn.attn`` is layer 7, as vLLM's ``extract_layer_index`` reads
    it for the model runner and connectors.

    Raises:
        LayoutError: the name has no integer part, or more than one.

    Example:
        >>> parse_layer_id("model.layers.7.self_attn.attn")
        7
        >>> parse_layer_id("model.layers.3.self_attn.attn.indexer.k_cache")
        3
    """
    numbers = [int(part) for part in str(name).split(".") if part.isdigit()]
    if len(numbers) != 1:
        msg = (
            f"cannot tell the layer id of the vLLM layer name {name!r}: it has "
            f"{len(numbers)} integer parts ({numbers}), and vLLM's rule reads exactly one.\n"
            "Hint: pass the kv_caches dict register_kv_caches received, whose keys are "
            "vLLM's own layer names (model.layers.<i>.<...>)."
        )
        raise LayoutError(msg)
    return numbers[0]


# -- formats ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheFormat:
    """What one layer's ``[B, H, N, C]`` view holds, in kvcompat's terms.

    Attributes:
        name: the format (``"mha"``, ``"mla"``, ``"dsa_fp8_656"``, ``"dsa_fp8_528"``,
            ``"dsv4_kv"``, ``"dsv4_indexer_fp8"``, ``"dsv4_state"``).
        kind: the pool kind a component of this format answers.
        role: the component's base name (``"full"``, ``"swa"``, ``"c4"``, ``"indexer"``...).
        heads: H of the view (KV heads; 1 for MLA and DeepSeek's caches).
        states: N, states per block (``block_size // tokens_per_state``).
        tokens_per_state: tokens one state covers (4 or 128 for DSv4's compressed caches).
        content_bytes: C in bytes.
        dtype: the view's element dtype (as registered).
        logical: the element dtype reads return for plain rows.
        key_dim: width of a key (per head for MHA; the whole row for MLA and packed rows).
        value_dim: width of a value (MHA: per head; MLA: the latent prefix), 0 if none.
        spec: kvcompat's byte layout of one key (plain rows) or of one page (packed pages);
            None for bytes with no token codec (DeepSeek-V4's compressor state).
        packed: the bytes go through a kvcompat codec (not plain rows).
        paged: ``spec`` addresses whole pages of ``states`` tokens (V4, indexer).
    """

    name: str
    kind: PoolKind
    role: str
    heads: int
    states: int
    tokens_per_state: int
    content_bytes: int
    dtype: torch.dtype
    logical: torch.dtype
    key_dim: int
    value_dim: int
    spec: LayoutSpec | None
    packed: bool
    paged: bool


def _refuse(name: str, spec: Any, what: str, hint: str) -> UnsupportedPoolError:
    msg = (
        f"kvcompat does not serve the vLLM cache of layer {name!r} ({type(spec).__name__}): "
        f"{what}. Reading or writing it as another format would be silently wrong.\n"
        f"Hint: {hint}"
    )
    return UnsupportedPoolError(msg)


_OTHER_MODES = (
    "kvcompat serves bf16/fp16/fp32 and per-tensor fp8 MHA and MLA rows, fp8_ds_mla "
    "(656 and 528 B rows), and DeepSeek-V4's 584-B KV and 132-B indexer pages; move "
    "this cache with vLLM's own connector code, or open an issue naming the mode"
)


def classify(name: str, spec: Any) -> CacheFormat:
    """The :class:`CacheFormat` of a layer from its vLLM spec; refuses every other mode.

    Raises:
        UnsupportedPoolError: a spec class, quantization mode or page variant kvcompat
            has no codec for (named in the message).
    """
    cls = _vllm_class(spec, _SERVED_SPECS)
    if cls is None or type(spec).__qualname__ not in _SERVED_SPECS:
        raise _refuse(
            name,
            spec,
            f"kvcompat reads only {sorted(_SERVED_SPECS)} pages; a "
            f"{type(spec).__module__}.{type(spec).__qualname__} has other contents "
            "(Mamba states, cross/encoder caches, HiSparse pools, sink tokens ...)",
            _OTHER_MODES,
        )
    mode, heads, states, tokens_per_state = _modes(name, spec)
    dtype = _field(spec, "dtype", None)
    if not isinstance(dtype, torch.dtype):
        raise _refuse(name, spec, f"its dtype is {dtype!r}, not a torch.dtype", _OTHER_MODES)
    common = {"heads": heads, "states": states, "tokens_per_state": tokens_per_state}
    sliding = cls in ("SlidingWindowSpec", "SlidingWindowMLASpec")
    if cls in _MLA_SPECS:
        return _mla_format(name, spec, dtype, sliding=sliding, common=common)
    return _mha_format(name, spec, dtype, mode, sliding=sliding, common=common)


def _modes(name: str, spec: Any) -> tuple[int, int, int, int]:
    """``(kv_quant_mode, heads, states, tokens_per_state)``; refuses the unserved modes."""
    if _field(spec, "kv_head_major_slots", False):
        raise _refuse(
            name, spec, "its pages use kv_head_major_slots (H2ND, MiniMax-M3 NVFP4)", _OTHER_MODES
        )
    mode = _field(spec, "kv_quant_mode", 0)
    mode_value = int(mode) if mode is not None else 0
    if mode_value not in (_QUANT_NONE, _QUANT_FP8_PER_TENSOR):
        label = getattr(mode, "name", None) or _QUANT_NAMES.get(mode_value, str(mode_value))
        raise _refuse(name, spec, f"its kv_quant_mode is {label}", _OTHER_MODES)
    heads = int(_field(spec, "num_kv_heads", 0) or 0)
    slots = _field(spec, "num_head_slots", None)
    if slots is not None and int(slots) != heads:
        raise _refuse(
            name,
            spec,
            f"its pages hold {slots} head slots for {heads} KV heads (a packed variant)",
            _OTHER_MODES,
        )
    block_size = int(_field(spec, "block_size", 0) or 0)
    tokens_per_state = _field(spec, "tokens_per_state", 1)
    if isinstance(tokens_per_state, bool) or not isinstance(tokens_per_state, int):
        raise _refuse(
            name,
            spec,
            f"tokens_per_state is {tokens_per_state!r} (several states per token)",
            _OTHER_MODES,
        )
    if tokens_per_state < 1 or block_size % tokens_per_state:
        raise _refuse(
            name,
            spec,
            f"tokens_per_state={tokens_per_state} does not divide block_size={block_size}",
            _OTHER_MODES,
        )
    states = block_size // tokens_per_state
    return mode_value, heads, states, tokens_per_state


def _mla_format(
    name: str, spec: Any, dtype: torch.dtype, *, sliding: bool, common: dict[str, int]
) -> CacheFormat:
    """An MLA-family page: plain latent rows, fp8_ds_mla rows, or DeepSeek-V4's pages."""
    heads, tokens_per_state = common["heads"], common["tokens_per_state"]
    head_size = int(_field(spec, "head_size", 0) or 0)
    content = _field(spec, "state_content_bytes", None)
    version = _field(spec, "model_version", None)
    cache_dtype = _field(spec, "cache_dtype_str", None)
    if heads != 1:
        raise _refuse(name, spec, f"an MLA cache with {heads} heads", _OTHER_MODES)
    if content is not None:
        content = int(content)
        if dtype != torch.uint8:
            raise _refuse(name, spec, f"packed {content}-B states of dtype {dtype}", _OTHER_MODES)
        if content == 584 and version == "deepseek_v4":
            role = "swa" if sliding else f"c{tokens_per_state}"
            return CacheFormat(
                "dsv4_kv", PoolKind.SINGLE_KV, role, content_bytes=584, dtype=dtype,
                logical=torch.float8_e4m3fn, key_dim=V4.dim, value_dim=V4.dim, spec=V4,
                packed=True, paged=True, **common,
            )  # fmt: skip
        if content in (656, 528) and version is None and tokens_per_state == 1:
            row = DSA_FP8 if content == 656 else dsa_fp8_layout(512, 0)
            return CacheFormat(
                f"dsa_fp8_{content}", PoolKind.LATENT, "swa" if sliding else "mla",
                content_bytes=content, dtype=dtype, logical=torch.float8_e4m3fn,
                key_dim=row.dim, value_dim=512, spec=row, packed=True, paged=False,
                **common,
            )  # fmt: skip
        raise _refuse(
            name,
            spec,
            f"packed {content}-B states (cache_dtype {cache_dtype!r}, model_version "
            f"{version!r}, tokens_per_state {tokens_per_state}): no kvcompat codec "
            "(DeepSeek-V4.1 and nvfp4_ds_mla pages are not served yet)",
            _OTHER_MODES,
        )
    if dtype == torch.uint8 and head_size == 132 and not sliding:
        # DeepSeek-V4's (and V3.2's) fp8 indexer keys: 128 e4m3 + one fp32 scale per
        # state, page-major (every state's values, then every state's scales).
        return CacheFormat(
            "dsv4_indexer_fp8", PoolKind.KEY_ONLY, "indexer", content_bytes=132,
            dtype=dtype, logical=torch.uint8, key_dim=DSV4_INDEXER_FP8.dim, value_dim=0,
            spec=DSV4_INDEXER_FP8, packed=True, paged=True, **common,
        )  # fmt: skip
    if dtype == torch.uint8 and head_size == 68:
        raise _refuse(name, spec, "MXFP4 indexer keys (68 B per state)", _OTHER_MODES)
    if dtype == torch.float32 and sliding and head_size > 0:
        # DeepSeek-V4's compressor state: fp32 rows kvcompat describes and transfers, and
        # whose storage the getters return; it has no token codec (read/write refuse it).
        return CacheFormat(
            "dsv4_state", PoolKind.KEY_ONLY, "state", content_bytes=head_size * 4,
            dtype=dtype, logical=dtype, key_dim=head_size, value_dim=0, spec=None,
            packed=False, paged=False, **common,
        )  # fmt: skip
    if dtype not in _FLOATS or head_size <= 0:
        raise _refuse(name, spec, f"MLA rows of dtype {dtype}", _OTHER_MODES)
    rank = 512 if head_size == 576 else head_size
    row = mla_layout(rank, head_size - rank, dtype)
    return CacheFormat(
        "mla", PoolKind.LATENT, "swa" if sliding else "mla", content_bytes=head_size *
        dtype.itemsize, dtype=dtype, logical=dtype, key_dim=head_size, value_dim=rank,
        spec=row, packed=False, paged=False, **common,
    )  # fmt: skip


def _mha_format(
    name: str, spec: Any, dtype: torch.dtype, mode: int, *, sliding: bool, common: dict[str, int]
) -> CacheFormat:
    """An MHA page: K then V per head slot."""
    heads = common["heads"]
    head_size = int(_field(spec, "head_size", 0) or 0)
    head_size_v = _field(spec, "head_size_v", None)
    head_size_v = head_size if head_size_v is None else int(head_size_v)
    content = _field(spec, "state_content_bytes", None)
    if content is not None:
        raise _refuse(name, spec, f"packed {content}-B states on an MHA cache", _OTHER_MODES)
    if dtype not in _FLOATS and dtype != torch.uint8:
        raise _refuse(name, spec, f"MHA rows of dtype {dtype}", _OTHER_MODES)
    logical = dtype
    if dtype == torch.uint8:
        if mode != _QUANT_FP8_PER_TENSOR:
            raise _refuse(name, spec, "uint8 MHA rows that are not fp8", _OTHER_MODES)
        logical = torch.float8_e4m3fn
    if heads <= 0 or head_size <= 0 or head_size_v <= 0:
        raise _refuse(name, spec, "an MHA cache without heads", _OTHER_MODES)
    return CacheFormat(
        "mha", PoolKind.SPLIT, "swa" if sliding else "full",
        content_bytes=(head_size + head_size_v) * dtype.itemsize, dtype=dtype, logical=logical,
        key_dim=head_size, value_dim=head_size_v, spec=mha_layout(heads, head_size, logical),
        packed=False, paged=False, **common,
    )  # fmt: skip


# -- layers -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class VLLMLayer:
    """One registered layer: its name, id, view, format and where its blocks sit.

    Attributes:
        name: vLLM's layer name (the ``kv_caches`` key).
        layer_id: the absolute layer id (:func:`parse_layer_id`).
        group: index of its KV-cache group in the config.
        view: the registered ``[B, H, N, C]`` view itself.
        fmt: what the view holds.
        layout: vLLM's layout name read from the strides (``"LBNHC"``, ``"LBHNC"``,
            ``"BLHNC"``, ``"BLNHC"``; one-block caches read as layer-outer).
        block_bytes: bytes of one block of this layer (``H * N * C``), one contiguous run.
        block_stride: bytes from one block of this layer to the next.
        alias_of: the name whose view this one shares (vLLM's KV-sharing layers), or None.
    """

    name: str
    layer_id: int
    group: int
    view: torch.Tensor
    fmt: CacheFormat
    layout: str
    block_bytes: int
    block_stride: int
    alias_of: str | None = None

    @property
    def num_blocks(self) -> int:
        """Blocks of the view (B)."""
        return int(self.view.shape[0])

    @property
    def contiguous(self) -> bool:
        """Whether the layer's blocks are one contiguous run (layer-outer layouts)."""
        return self.num_blocks <= 1 or self.block_stride == self.block_bytes


def _view_geometry(name: str, view: torch.Tensor, fmt: CacheFormat) -> tuple[str, int, int]:
    """``(layout, block_bytes, block_stride)`` of a registered view, checked against ``fmt``."""
    got = f"shape {tuple(view.shape)}, strides {tuple(view.stride())}, dtype {view.dtype}"
    if view.dim() != 4:
        msg = (
            f"kv_caches[{name!r}] is not a [B, H, N, C] view ({got}).\n"
            "Hint: pass the dict register_kv_caches received, not the layers' squeezed "
            "kv_cache attributes or kernel-block views."
        )
        raise LayoutError(msg)
    size = view.element_size()
    want = (fmt.heads, fmt.states, fmt.content_bytes)
    have = (int(view.shape[1]), int(view.shape[2]), int(view.shape[3]) * size)
    if have != want:
        msg = (
            f"kv_caches[{name!r}] ({got}) does not hold what its spec says: [H, N, C bytes] "
            f"is {list(have)}, the spec's is {list(want)}.\n"
            "Hint: pass the kv_caches dict and the KVCacheConfig of the same worker (a "
            "scheduler-side config, or views by kernel block, do not match)."
        )
        raise LayoutError(msg)
    if view.dtype.itemsize != fmt.dtype.itemsize:
        msg = (
            f"kv_caches[{name!r}] has dtype {view.dtype}; its spec's dtype is {fmt.dtype}.\n"
            "Hint: pass the views as vLLM registered them."
        )
        raise LayoutError(msg)
    strides = view.stride()
    inner = sorted((strides[d], int(view.shape[d])) for d in (1, 2, 3) if view.shape[d] > 1)
    expected = 1
    for stride, extent in inner:
        if stride != expected:
            msg = (
                f"kv_caches[{name!r}] ({got}): a block's [H, N, C] is not one contiguous run, "
                "as it is under vLLM's LBNHC, LBHNC, BLHNC and BLNHC layouts (LHBNC and BHLNC "
                "put the head outside the block).\n"
                "Hint: run vLLM with a block-compact layout (VLLM_KV_CACHE_LAYOUT=LBNHC, the "
                "default)."
            )
            raise LayoutError(msg)
        expected = stride * extent
    head_major = fmt.heads > 1 and strides[1] > strides[2]
    block_bytes = fmt.heads * fmt.states * fmt.content_bytes
    block_stride = int(strides[0]) * size
    layer_outer = view.shape[0] <= 1 or block_stride == block_bytes
    layout = ("L" if layer_outer else "") + "B" + ("" if layer_outer else "L")
    layout += "HN" if head_major else "NH"
    return layout + "C", block_bytes, block_stride


# -- the plan -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class VLLMPlan:
    """Every registered layer of a vLLM worker, and the config it was read from.

    Attributes:
        layers: name -> :class:`VLLMLayer`, in the dict's order.
        num_blocks: the config's ``num_blocks``.
        layout: the config's ``kv_cache_layout`` (None when the config does not carry it).
        groups: per KV-cache group, its layer names.
    """

    layers: Mapping[str, VLLMLayer]
    num_blocks: int
    layout: str | None
    groups: tuple[tuple[str, ...], ...]

    def by_id(self) -> dict[int, tuple[str, ...]]:
        """Layer id -> its layer names, ids ascending."""
        ids: dict[int, list[str]] = {}
        for layer in self.layers.values():
            ids.setdefault(layer.layer_id, []).append(layer.name)
        return {layer: tuple(names) for layer, names in sorted(ids.items())}


class VLLMKVCaches:
    """The native object of a vLLM adapter: the connector's ``kv_caches`` and ``KVCacheConfig``.

    Never changes either; keeps them as handed over (``kv_caches``, ``config``) beside
    what kvcompat read from them (``plan``).

    Example:
        >>> VLLMKVCaches.__name__
        'VLLMKVCaches'
    """

    # No __slots__: tools that look for the storage a getter returns walk ``__dict__``
    # (``kvcompat.testing.check_pool`` finds the registered views in ``kv_caches``).

    def __init__(self, kv_caches: Mapping[str, torch.Tensor], config: Any, plan: VLLMPlan) -> None:
        self.kv_caches = kv_caches
        self.config = config
        self.plan = plan
        # What a composite adapter answers for the whole cache: its first layer's block
        # size in tokens, the token capacity at that block size, and the logical dtype.
        first = next(iter(plan.layers.values()))
        self.page_size = first.fmt.states * first.fmt.tokens_per_state
        self.size = plan.num_blocks * self.page_size
        self.dtype = first.fmt.logical
        self.device = first.view.device

    def __repr__(self) -> str:
        return f"<VLLMKVCaches layers={len(self.plan.layers)} num_blocks={self.plan.num_blocks}>"


def _layer_specs(config: Any) -> tuple[dict[str, tuple[int, Any]], tuple[tuple[str, ...], ...]]:
    """Layer name -> (group index, its spec), and each group's layer names."""
    groups = _field(config, "kv_cache_groups", None)
    if not isinstance(groups, (list, tuple)):
        msg = (
            f"the KVCacheConfig has no kv_cache_groups list (got {type(groups).__name__}).\n"
            "Hint: pass the KVCacheConfig the connector's constructor received."
        )
        raise LayoutError(msg)
    found: dict[str, tuple[int, Any]] = {}
    names_by_group: list[tuple[str, ...]] = []
    for index, group in enumerate(groups):
        spec = _field(group, "kv_cache_spec", None)
        names = tuple(str(n) for n in (_field(group, "layer_names", None) or ()))
        names_by_group.append(names)
        per_layer = None
        if _vllm_class(spec, frozenset({"UniformTypeKVCacheSpecs"})) is not None:
            per_layer = _field(spec, "kv_cache_specs", None)
        for layer in names:
            found[layer] = (index, spec if per_layer is None else per_layer[layer])
    return found, tuple(names_by_group)


def plan_vllm(kv_caches: Any, config: Any) -> VLLMPlan:
    """Read a connector's ``kv_caches`` and ``KVCacheConfig`` into a :class:`VLLMPlan`.

    Raises:
        UnsupportedPoolError: ``config`` is not vLLM's ``KVCacheConfig``, ``kv_caches``
            is not a dict of tensors, or a layer's mode has no kvcompat codec.
        LayoutError: a view disagrees with its spec, a name has no layer id, or the dict
            and the config name different layers.
    """
    if not is_kv_cache_config(config):
        msg = (
            f"config must be vLLM's KVCacheConfig (vllm.v1.kv_cache_interface), got "
            f"{type(config).__module__}.{type(config).__qualname__}.\n"
            "Hint: pass the kv_cache_config your connector's __init__ received: "
            "kvcompat.adapt(kv_caches, config=kv_cache_config)."
        )
        raise UnsupportedPoolError(msg)
    if not isinstance(kv_caches, Mapping) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in kv_caches.items()
    ):
        msg = (
            f"kv_caches must be the dict[str, torch.Tensor] register_kv_caches receives, got "
            f"{type(kv_caches).__qualname__}.\n"
            "Hint: kvcompat.adapt(kv_caches, config=kv_cache_config) inside "
            "register_kv_caches(self, kv_caches)."
        )
        raise UnsupportedPoolError(msg)
    specs, groups = _layer_specs(config)
    formats = {name: classify(name, spec) for name, (_, spec) in specs.items()}
    missing = [name for name in specs if name not in kv_caches]
    if missing or not kv_caches:
        msg = (
            f"kv_caches lacks {len(missing)} layer(s) the KVCacheConfig lists: "
            f"{missing[:5]}{' ...' if len(missing) > 5 else ''} (it has {len(kv_caches)}).\n"
            "Hint: pass the dict register_kv_caches received and the config of the same "
            "worker, after vLLM allocated the cache."
        )
        raise LayoutError(msg)
    named = _field(config, "kv_cache_layout", None)
    named = getattr(named, "name", named)
    layers: dict[str, VLLMLayer] = {}
    for name, (group, _) in specs.items():
        view = kv_caches[name]
        fmt = formats[name]
        layout, block_bytes, block_stride = _view_geometry(name, view, fmt)
        if isinstance(named, str) and _agrees(named, layout, fmt, view):
            layout = named  # one head (or one block) cannot tell HN from NH: the config can
        layers[name] = VLLMLayer(
            name, parse_layer_id(name), group, view, fmt, layout, block_bytes, block_stride
        )
    # Names the config does not list: vLLM's KV-sharing layers, which alias their target.
    for name, view in kv_caches.items():
        if name in layers:
            continue
        target = next(
            (
                layer
                for layer in layers.values()
                if layer.alias_of is None
                and view.data_ptr() == layer.view.data_ptr()
                and view.shape == layer.view.shape
                and view.stride() == layer.view.stride()
            ),
            None,
        )
        if target is None:
            msg = (
                f"kv_caches[{name!r}] is in no KV-cache group of the config and views no "
                "listed layer's cache.\n"
                "Hint: pass the dict and the config of the same worker."
            )
            raise LayoutError(msg)
        layers[name] = VLLMLayer(
            name,
            parse_layer_id(name),
            target.group,
            view,
            target.fmt,
            target.layout,
            target.block_bytes,
            target.block_stride,
            alias_of=target.name,
        )
    blocks = {layer.num_blocks for layer in layers.values()}
    num_blocks = int(_field(config, "num_blocks", 0) or 0)
    if len(blocks) != 1:
        msg = (
            f"the registered views hold different block counts {sorted(blocks)}.\n"
            "Hint: pass the views by scheduler block (the dict register_kv_caches receives)."
        )
        raise LayoutError(msg)
    return VLLMPlan(
        MappingProxyType(layers),
        num_blocks or blocks.pop(),
        None if named is None else str(named),
        groups,
    )


def _agrees(named: str, read: str, fmt: CacheFormat, view: torch.Tensor) -> bool:
    """Whether the config's layout name fits what the strides show (ambiguous parts aside)."""
    if named not in ("LBNHC", "LBHNC", "BLHNC", "BLNHC"):
        return False
    same_order = view.shape[0] <= 1 or named[:2] == read[:2]
    same_heads = fmt.heads <= 1 or named[2:] == read[2:]
    return same_order and same_heads


def storage_extent(layer: VLLMLayer, row_bytes: int) -> bool:
    """Whether ``row_bytes`` from each block start stay inside the view's storage."""
    view = layer.view
    start = view.storage_offset() * view.element_size()
    last = start + (layer.num_blocks - 1) * layer.block_stride + row_bytes
    return last <= view.untyped_storage().nbytes()


def block_rows(layer: VLLMLayer, row_bytes: int) -> torch.Tensor:
    """``[B, row_bytes]`` uint8 view of the layer: row ``b`` starts at block ``b``'s first byte.

    Zero-copy (the view's own storage). Rows longer than a block's bytes take the page
    padding vLLM allocates after it (``page_size_padded``); the caller checks the extent.
    """
    raw = layer.view.view(torch.uint8)
    stride = layer.block_stride if layer.num_blocks > 1 else max(row_bytes, 1)
    return raw.as_strided((layer.num_blocks, row_bytes), (stride, 1), raw.storage_offset())


def flat_rows(layer: VLLMLayer) -> torch.Tensor | None:
    """The layer's tokens as ``[B * N, C]`` rows of its own dtype, when one view can say so."""
    if layer.fmt.heads != 1 or not layer.contiguous:
        return None
    view = layer.view
    count = layer.num_blocks * layer.fmt.states
    width = int(view.shape[3])
    return view.as_strided((count, width), (width, 1), view.storage_offset())
