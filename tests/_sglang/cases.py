"""Parametrization cases: every constructible SGLang pool class x start_layer, with expected facts.

A :class:`PoolCase` says how to build a fresh native pool (``builder(**kwargs)``) and what
must be true of it *by the KVCache convention* -- absolute layer id ``l`` of a stage that
starts at ``start_layer`` lives in slot ``l - start_layer`` of the per-layer buffer list --
independently of what SGLang's getters happen to return. Storage is declared as
:class:`Slot` paths (``"k_buffer"[0]``, ``"kv_pools[4].kv_buffer"[1]``) and resolved by
reading native attributes only; no native getter is ever called here (getters wait on
layer-transfer events, and several of them get the layer id wrong -- which is the point).

Typical use::

    @pytest.mark.parametrize("case", case_params())
    def test_x(case):
        native = case.build()
        for layer, storage in case.storage(native).items():
            ...  # storage.key, storage.value, storage.extras, storage.where
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import pytest
import torch

from _sglang import builders as b
from _sglang.env import prepare_sglang
from _sglang.features import dsv4_index_pools, dsv4_kv_pools
from _sglang.legacy import build_legacy_dsv4_single_pool

__all__ = [
    "CONFORMANCE_CASES",
    "POOL_CASES",
    "VARIANT_CASES",
    "LayerPlan",
    "LayerStorage",
    "PoolCase",
    "Slot",
    "case_params",
    "cases_for",
    "conformance_params",
    "same_memory",
]

_POOL_TABLES: Mapping[str, Callable[[Any], dict[int, Any]]] = {
    "kv_pools": dsv4_kv_pools,
    "index_pools": dsv4_index_pools,
}
_PART = re.compile(r"^(?P<name>[A-Za-z_]\w*)(?P<subs>(?:\[-?\d+\])*)$")
_SUB = re.compile(r"\[(-?\d+)\]")


@dataclass(frozen=True)
class Slot:
    """One entry of a per-layer buffer list on the native pool.

    ``attr`` is a dotted path from the pool to the list, with integer subscripts for dicts
    and lists on the way (``"kv_pools[4].kv_buffer"``); ``index`` picks the layer's entry.
    """

    attr: str
    index: int

    def listing(self, native: Any) -> Any:
        """The per-layer list (or tuple) ``attr`` names, by attribute access and subscripts."""
        obj = native
        for part in self.attr.split("."):
            match = _PART.match(part)
            if match is None:
                msg = f"bad slot path segment {part!r} in {self.attr!r}"
                raise ValueError(msg)
            name = match["name"]
            # kv_pools / index_pools read through the pre-0.5.20 attributes where needed
            obj = _POOL_TABLES[name](obj) if name in _POOL_TABLES else getattr(obj, name)
            for sub in _SUB.findall(match["subs"]):
                obj = obj[int(sub)]
        return obj

    def resolve(self, native: Any) -> torch.Tensor:
        """Read the layer's tensor by attribute access and subscripts only."""
        tensor = self.listing(native)[self.index]
        if not isinstance(tensor, torch.Tensor):
            msg = f"{self} on {type(native).__name__} is a {type(tensor).__name__}, not a tensor"
            raise TypeError(msg)
        return tensor

    def __str__(self) -> str:
        return f"pool.{self.attr}[{self.index}]"


@dataclass(frozen=True)
class LayerPlan:
    """Where one served layer's data lives.

    Attributes:
        key: the tensor holding the layer's keys (for single-KV/latent pools, the latent).
        value: the tensor holding its values; the same slot as ``key`` when K and V are one
            latent (DSv4 single pools), None when the pool stores no values.
        value_cols: when set, V is ``value[..., :value_cols]`` (the MLA latent's first
            ``kv_lora_rank`` columns).
        extras: other per-layer storage by role: ``"index_k"`` (DSA / DSv4 indexer keys
            with scales), ``"extra"`` (a DSv4 compressed c4/c128 cache).
    """

    key: Slot
    value: Slot | None
    value_cols: int | None = None
    extras: Mapping[str, Slot] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class LayerStorage:
    """A :class:`LayerPlan` resolved against one native pool.

    ``where`` maps each role (``"key"``, ``"value"``, extras' roles) to the native expression
    it came from, for failure messages.
    """

    layer_id: int
    key: torch.Tensor
    value: torch.Tensor | None
    extras: Mapping[str, torch.Tensor]
    where: Mapping[str, str]


@dataclass(frozen=True)
class PoolCase:
    """One native pool configuration and the facts it must satisfy.

    Attributes:
        id: pytest id, ``<Class>-<variant>``.
        cls_name: the native class's ``__name__``.
        family: ``split`` (K and V tensors), ``key_only``, ``latent`` (MLA/DSA),
            ``single`` (DSv4 packed pages), ``index`` (DSv4 indexer), ``hybrid_linear``,
            ``swa``, ``dsv4_token`` (the DSv4 composite).
        builder, kwargs: ``builder(**kwargs)`` returns a fresh native pool.
        start_layer: the value the native pool's ``start_layer`` attribute must have.
        layers: absolute layer id -> :class:`LayerPlan`, for every layer the pool serves.
        note: what the case exercises, for humans.
    """

    id: str
    cls_name: str
    family: str
    builder: Callable[..., Any]
    kwargs: Mapping[str, Any]
    start_layer: int
    layers: Mapping[int, LayerPlan]
    note: str = ""

    def build(self) -> Any:
        """A fresh native pool."""
        return self.builder(**self.kwargs)

    @property
    def layer_ids(self) -> tuple[int, ...]:
        """The absolute layer ids the pool serves, ascending."""
        return tuple(sorted(self.layers))

    @property
    def unserved_ids(self) -> tuple[int, ...]:
        """Non-negative ids around the served ones that the pool does not serve."""
        served = set(self.layers)
        return tuple(i for i in range(max(served) + 2) if i not in served)

    def storage(self, native: Any) -> dict[int, LayerStorage]:
        """Resolve every layer's plan against ``native`` (attribute reads only)."""
        out: dict[int, LayerStorage] = {}
        for layer, plan in sorted(self.layers.items()):
            where = {"key": str(plan.key)}
            value = None
            if plan.value is not None:
                value = plan.value.resolve(native)
                where["value"] = str(plan.value)
                if plan.value_cols is not None:
                    value = value[..., : plan.value_cols]
                    where["value"] += f"[..., :{plan.value_cols}]"
            extras = {role: slot.resolve(native) for role, slot in plan.extras.items()}
            where.update({role: str(slot) for role, slot in plan.extras.items()})
            out[layer] = LayerStorage(
                layer_id=layer,
                key=plan.key.resolve(native),
                value=value,
                extras=MappingProxyType(extras),
                where=MappingProxyType(where),
            )
        return out


def same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors view exactly the same bytes (same start, same extent, same strides).

    Dtype views (uint8 storage seen as float8_e4m3fn) count as the same memory.
    """
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    if a.data_ptr() != b.data_ptr() or a.element_size() != b.element_size():
        return False
    return a.shape == b.shape and a.stride() == b.stride()


# -- plan helpers ---------------------------------------------------------------------------


def _contiguous(
    start: int,
    count: int,
    make: Callable[[int], LayerPlan],
) -> Mapping[int, LayerPlan]:
    return MappingProxyType({start + i: make(i) for i in range(count)})


def _split(attr_k: str, attr_v: str) -> Callable[[int], LayerPlan]:
    return lambda i: LayerPlan(key=Slot(attr_k, i), value=Slot(attr_v, i))


def _key_only(attr: str) -> Callable[[int], LayerPlan]:
    return lambda i: LayerPlan(key=Slot(attr, i), value=None)


def _latent(index_attr: str | None = None) -> Callable[[int], LayerPlan]:
    def make(i: int) -> LayerPlan:
        extras = {} if index_attr is None else {"index_k": Slot(index_attr, i)}
        return LayerPlan(
            key=Slot("kv_buffer", i),
            value=Slot("kv_buffer", i),
            value_cols=b.KV_LORA_RANK,
            extras=MappingProxyType(extras),
        )

    return make


def _single(i: int) -> LayerPlan:
    return LayerPlan(key=Slot("kv_buffer", i), value=Slot("kv_buffer", i))


def _dense(ids: Sequence[int], make: Callable[[int], LayerPlan]) -> Mapping[int, LayerPlan]:
    return MappingProxyType({layer: make(dense) for dense, layer in enumerate(ids)})


def _swa_layers(swa_ids: Sequence[int], full_ids: Sequence[int]) -> Mapping[int, LayerPlan]:
    plans = dict(_dense(full_ids, _split("full_kv_pool.k_buffer", "full_kv_pool.v_buffer")))
    plans.update(_dense(swa_ids, _split("swa_kv_pool.k_buffer", "swa_kv_pool.v_buffer")))
    return MappingProxyType(plans)


def _dsv4_token_layers(ratios: Sequence[int], start: int, end: int) -> Mapping[int, LayerPlan]:
    """Composite plan computed from the ratio list alone (not from SGLang's layer_mapping)."""
    plans: dict[int, LayerPlan] = {}
    seen = {4: 0, 128: 0}
    for layer in range(start, end):
        ratio = ratios[layer]
        swa = Slot("swa_kv_pool.kv_buffer", layer - start)
        extras: dict[str, Slot] = {}
        if ratio in seen:
            cid = seen[ratio]
            seen[ratio] += 1
            extras["extra"] = Slot(f"kv_pools[{ratio}].kv_buffer", cid)
            if ratio == 4:
                extras["index_k"] = Slot("index_pools[4].index_k_with_scale_buffer", cid)
        plans[layer] = LayerPlan(key=swa, value=swa, extras=MappingProxyType(extras))
    return MappingProxyType(plans)


# -- the cases ------------------------------------------------------------------------------

_S = 2  # start_layer of the pipeline-stage variants (layer_num 2: serves layers 2 and 3)
_N = 2


def _stage_variants(
    cls_name: str,
    family: str,
    builder: Callable[..., Any],
    make: Callable[[int], LayerPlan],
    extra_kwargs: Mapping[str, Any] | None = None,
    tag: str = "",
) -> list[PoolCase]:
    cases = []
    for start in (0, _S):
        kwargs = {"start_layer": start, "layer_num": _N, **(extra_kwargs or {})}
        cases.append(
            PoolCase(
                id=f"{cls_name}{tag}-start{start}",
                cls_name=cls_name,
                family=family,
                builder=builder,
                kwargs=MappingProxyType(kwargs),
                start_layer=start,
                layers=_contiguous(start, _N, make),
            )
        )
    return cases


def _all_cases() -> tuple[PoolCase, ...]:
    cases: list[PoolCase] = []
    cases += _stage_variants(
        "MHATokenToKVPool", "split", b.build_mha_pool, _split("k_buffer", "v_buffer")
    )
    cases += _stage_variants(
        "MHATokenToKOnlyPool", "key_only", b.build_k_only_pool, _key_only("k_buffer")
    )
    cases += _stage_variants("MLATokenToKVPool", "latent", b.build_mla_pool, _latent())
    cases += _stage_variants(
        "DSATokenToKVPool", "latent", b.build_dsa_pool, _latent("index_k_with_scale_buffer")
    )
    cases += _stage_variants(  # 0.5.12's DSA pool (a skip on every later release)
        "NSATokenToKVPool", "latent", b.build_nsa_pool, _latent("index_k_with_scale_buffer")
    )
    for start, full_ids in ((0, (1, 3)), (4, (5, 7))):
        cases.append(
            PoolCase(
                id=f"HybridLinearKVPool-start{start}",
                cls_name="HybridLinearKVPool",
                family="hybrid_linear",
                builder=b.build_hybrid_linear_pool,
                kwargs=MappingProxyType(
                    {"full_attention_layer_ids": full_ids, "start_layer": start}
                ),
                start_layer=start,
                layers=_dense(full_ids, _split("full_kv_pool.k_buffer", "full_kv_pool.v_buffer")),
                note="global ids of full-attention layers map to dense sub-pool ids",
            )
        )
    for first, swa_ids, full_ids in ((0, (0, 2), (1, 3)), (4, (4, 6), (5, 7))):
        cases.append(
            PoolCase(
                id=f"SWAKVPool-layers{first}to{first + 3}",
                cls_name="SWAKVPool",
                family="swa",
                builder=b.build_swa_pool,
                kwargs=MappingProxyType(
                    {"swa_attention_layer_ids": swa_ids, "full_attention_layer_ids": full_ids}
                ),
                start_layer=0,  # hard-coded by SWAKVPool; a stage is expressed by its ids
                layers=_swa_layers(swa_ids, full_ids),
                note="no start_layer parameter: a later pipeline stage is given by global ids",
            )
        )
    cases += _stage_variants("DeepSeekV4SingleKVPool", "single", b.build_dsv4_single_pool, _single)
    for layout in ("v41", "v41_fp4", "uniform_fp8", "v41_new", "v41_fp4_new"):
        cases.append(
            PoolCase(
                id=f"DeepSeekV4SingleKVPool-{layout}-start0",
                cls_name="DeepSeekV4SingleKVPool",
                family="single",
                builder=b.build_dsv4_single_pool,
                kwargs=MappingProxyType({"kv_layout": layout, "layer_num": _N}),
                start_layer=0,
                layers=_contiguous(0, _N, _single),
                note=f"kv_layout={layout!r}",
            )
        )
    cases += _stage_variants(
        "DeepSeekV4UniformFP8KVPool", "single", b.build_dsv4_uniform_fp8_pool, _single
    )
    cases += _stage_variants("HiSparseC4DevicePool", "single", b.build_hisparse_c4_pool, _single)
    cases += _stage_variants(
        "LegacyDeepSeekV4SingleKVPool", "single", build_legacy_dsv4_single_pool, _single
    )
    for fp4 in (False, True):
        cases += _stage_variants(
            "DeepSeekV4IndexerPool",
            "index",
            b.build_dsv4_indexer_pool,
            _key_only("index_k_with_scale_buffer"),
            extra_kwargs={"use_fp4_indexer": fp4},
            tag="-fp4" if fp4 else "-fp8",
        )
    for variant, ratios, start, layout in (
        ("start0", (0, 4, 128), 0, None),
        ("start3", (0, 4, 128, 0, 4, 128), 3, None),
        ("v41-start0", (0, 4, 128), 0, "v41"),
    ):
        kwargs: dict[str, Any] = {"compression_ratios": ratios, "start_layer": start}
        if layout is not None:
            kwargs["kv_layout"] = layout
        cases.append(
            PoolCase(
                id=f"DeepSeekV4TokenToKVPool-{variant}",
                cls_name="DeepSeekV4TokenToKVPool",
                family="dsv4_token",
                builder=b.build_dsv4_token_pool,
                kwargs=MappingProxyType(kwargs),
                start_layer=start,
                layers=_dsv4_token_layers(ratios, start, len(ratios)),
                note="key/value = the SWA main cache; extras: compressed cache, c4 index keys",
            )
        )
    return tuple(cases)


POOL_CASES: tuple[PoolCase, ...] = _all_cases()
"""Every case, in a stable order. Building one imports SGLang (once per process)."""


def cases_for(*, family: str | None = None, cls_name: str | None = None) -> list[PoolCase]:
    """The cases of one family and/or one class."""
    return [
        case
        for case in POOL_CASES
        if (family is None or case.family == family)
        and (cls_name is None or case.cls_name == cls_name)
    ]


def case_params(cases: Sequence[PoolCase] | None = None) -> list[Any]:
    """``pytest.param`` objects (id = ``case.id``) for ``@pytest.mark.parametrize``."""
    return [pytest.param(case, id=case.id) for case in (POOL_CASES if cases is None else cases)]


# -- variants for the conformance tests -----------------------------------------------------
#
# Kept out of POOL_CASES on purpose: tests/real/test_native_facts.py pins, for every case there,
# that the native getter returns the very (bf16) tensor it stores, which fp8 pools (uint8
# storage, typed view on every get) and the raw-index DSv4 branch do not. The conformance
# tests run over POOL_CASES + VARIANT_CASES.

_FP8 = torch.float8_e4m3fn


def _build_mha_pool_v_head_dim(*, start_layer: int, layer_num: int, v_head_dim: int) -> Any:
    """``MHATokenToKVPool`` with ``v_head_dim != head_dim``: K and V are separate allocations."""
    mp = prepare_sglang().memory_pool
    return mp.MHATokenToKVPool(
        size=b.SIZE,
        page_size=b.MHA_PAGE,
        dtype=torch.bfloat16,
        head_num=b.HEAD_NUM,
        head_dim=b.HEAD_DIM,
        layer_num=layer_num,
        device=b.DEVICE,
        enable_memory_saver=False,
        v_head_dim=v_head_dim,
        start_layer=start_layer,
        end_layer=start_layer + layer_num,
    )


def _variant(
    case_id: str,
    cls_name: str,
    family: str,
    builder: Callable[..., Any],
    make: Callable[[int], LayerPlan],
    note: str,
    **kwargs: Any,
) -> PoolCase:
    start = int(kwargs.get("start_layer", 0))
    return PoolCase(
        id=case_id,
        cls_name=cls_name,
        family=family,
        builder=builder,
        kwargs=MappingProxyType({"layer_num": _N, **kwargs}),
        start_layer=start,
        layers=_contiguous(start, _N, make),
        note=note,
    )


def _variant_cases() -> tuple[PoolCase, ...]:
    fp8_note = "fp8 pool: uint8 storage, getters return a float8_e4m3fn view"
    cases = [
        _variant(
            f"MHATokenToKVPool-fp8-start{start}",
            "MHATokenToKVPool",
            "split",
            b.build_mha_pool,
            _split("k_buffer", "v_buffer"),
            fp8_note,
            start_layer=start,
            dtype=_FP8,
        )
        for start in (0, _S)
    ]
    cases += [
        _variant(
            f"MHATokenToKVPool-vdim4-start{_S}",
            "MHATokenToKVPool",
            "split",
            _build_mha_pool_v_head_dim,
            _split("k_buffer", "v_buffer"),
            "v_head_dim 4 != head_dim 8: K and V are separate allocations",
            start_layer=_S,
            v_head_dim=4,
        ),
        _variant(
            f"MHATokenToKOnlyPool-fp8-start{_S}",
            "MHATokenToKOnlyPool",
            "key_only",
            b.build_k_only_pool,
            _key_only("k_buffer"),
            fp8_note,
            start_layer=_S,
            dtype=_FP8,
        ),
        _variant(
            f"MLATokenToKVPool-fp8-start{_S}",
            "MLATokenToKVPool",
            "latent",
            b.build_mla_pool,
            _latent(),
            fp8_note,
            start_layer=_S,
            dtype=_FP8,
        ),
    ]
    cases += [
        _variant(
            f"DeepSeekV4SingleKVPool-uint8-start{start}",
            "DeepSeekV4SingleKVPool",
            "single",
            b.build_dsv4_single_pool,
            _single,
            "dtype uint8 == store dtype: the native getter's raw-index branch (trap 3)",
            start_layer=start,
            dtype=torch.uint8,
        )
        for start in (0, _S)
    ]
    ratios = (0, 4, 128, 0, 4, 128)
    cases.append(
        PoolCase(
            id="DeepSeekV4TokenToKVPool-start3-noend",
            cls_name="DeepSeekV4TokenToKVPool",
            family="dsv4_token",
            builder=b.build_dsv4_token_pool,
            kwargs=MappingProxyType(
                {"compression_ratios": ratios, "start_layer": 3, "end_layer": None}
            ),
            start_layer=3,
            # Without end_layer the pool builds the whole model (_stage_start 0) while its
            # start_layer (which only shifts the layer-transfer wait) stays 3.
            layers=_dsv4_token_layers(ratios, 0, len(ratios)),
            note="start_layer without end_layer: every model layer allocated, waits shifted",
        )
    )
    return tuple(cases)


VARIANT_CASES: tuple[PoolCase, ...] = _variant_cases()
"""Extra configurations for the conformance tests only (fp8 storage, v_head_dim != head_dim,
the uint8 DSv4 branch, a DSv4 stage without end_layer)."""

CONFORMANCE_CASES: tuple[PoolCase, ...] = POOL_CASES + VARIANT_CASES
"""What the kvcompat conformance tests run over."""


def conformance_params(
    *, family: str | None = None, families: Sequence[str] | None = None
) -> list[Any]:
    """``pytest.param`` objects over :data:`CONFORMANCE_CASES`, optionally by family."""
    wanted = None if families is None else set(families)
    return [
        pytest.param(case, id=case.id)
        for case in CONFORMANCE_CASES
        if (family is None or case.family == family) and (wanted is None or case.family in wanted)
    ]
