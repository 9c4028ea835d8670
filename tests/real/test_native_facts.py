"""What SGLang 0.5.23's pool classes really do -- the facts kvcompat's adapters must cope with.

Each test pins one native behaviour (a return value's identity, dtype and memory, or an
exception's exact type and arguments), so a version bump that changes it fails here, loudly,
naming the class, the layer and what differed. Expected storage comes from
``_sglang.cases`` (native attributes read directly, never native getters).

Sections: case sanity; the four generic methods per class; unserved layer ids; the traps of
sglang-on-cpu.md (numbered as there); DSv4 page geometry; the DSv4 composite; storage facts.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
import torch
from _sglang import builders as b
from _sglang.builders import radix_layer
from _sglang.cases import (
    POOL_CASES,
    LayerStorage,
    PoolCase,
    Slot,
    case_params,
    cases_for,
    same_memory,
)
from _sglang.env import SGLangSession, prepare_sglang
from _sglang.features import (
    dsv4_index_pools,
    dsv4_kv_pools,
    dsv4_pages,
    dsv4_single_getter_is_raw,
    kv_write_loc,
    mha_fuses_k_and_v,
    release,
    require_k_only_writer,
)

FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16

# -- outcomes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Raises:
    """An exception of exactly this type with exactly these ``args``."""

    exc: type[BaseException]
    args: tuple[Any, ...] = ()

    def __str__(self) -> str:
        return f"{self.exc.__name__}{self.args!r}"


BARE = Raises(NotImplementedError)
USE_GET_KEY = Raises(NotImplementedError, ("Use get_key_buffer instead.",))
K_ONLY_NO_V = Raises(NotImplementedError, ("MHATokenToKOnlyPool does not allocate V",))
K_ONLY_SET = Raises(
    NotImplementedError,
    (
        (
            "MHATokenToKOnlyPool: use set_index_k_buffer on the parent MiniMaxSparseKVPool "
            "\u2014 this pool does not store V"
        ),
    ),
)
OUT_OF_RANGE = Raises(IndexError, ("list index out of range",))


def _call(fn: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    try:
        return fn(), None
    except Exception as exc:  # the exception is the observation
        return None, exc


def assert_raises(fn: Callable[[], Any], expected: Raises, what: str) -> None:
    result, exc = _call(fn)
    assert exc is not None, f"{what}: expected {expected}, but it returned {_describe(result)}"
    got = Raises(type(exc), exc.args)
    assert got == expected, f"{what}: expected {expected}, got {got}"


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)} {value.dtype} @ {value.data_ptr():#x}"
    if isinstance(value, tuple):
        return "(" + ", ".join(_describe(v) for v in value) + ")"
    return repr(value)


def assert_is(got: Any, expected: torch.Tensor, what: str, where: str) -> None:
    assert isinstance(got, torch.Tensor), f"{what}: expected {where} itself, got {_describe(got)}"
    same_object = got is expected
    assert same_object, (
        f"{what}: expected the very tensor {where} ({_describe(expected)}), "
        f"got another object {_describe(got)}"
    )


def assert_view(
    got: Any, expected: torch.Tensor, dtype: torch.dtype, what: str, where: str
) -> None:
    assert isinstance(got, torch.Tensor), (
        f"{what}: expected a view of {where}, got {_describe(got)}"
    )
    assert got.dtype == dtype, f"{what}: expected dtype {dtype}, got {got.dtype}"
    assert same_memory(got, expected), (
        f"{what}: expected a {dtype} view of {where} ({_describe(expected)}), "
        f"got {_describe(got)} (strides {got.stride()} vs {expected.stride()})"
    )


# -- case sanity ----------------------------------------------------------------------------


@pytest.mark.parametrize("case", case_params())
def test_case_facts_describe_the_native_pool(case: PoolCase) -> None:
    native = case.build()
    assert type(native).__name__ == case.cls_name
    assert native.start_layer == case.start_layer, (
        f"{case.id}: start_layer {native.start_layer}, case says {case.start_layer}"
    )
    storage = case.storage(native)
    assert tuple(storage) == case.layer_ids
    # Every entry of every per-layer list a plan names belongs to exactly one served layer
    # (so the case accounts for all of the pool's storage of that kind).
    used: dict[Slot, set[int]] = {}
    for plan in case.layers.values():
        for slot in (plan.key, *plan.extras.values()):
            used.setdefault(Slot(slot.attr, 0), set()).add(slot.index)
    for first, indices in used.items():
        listing = first.listing(native)
        attr = first.attr
        assert indices == set(range(len(listing))), (
            f"{case.id}: served layers use entries {sorted(indices)} of pool.{attr}, "
            f"which has {len(listing)}"
        )
    # Different layers never share key memory.
    ptrs = {layer: s.key.data_ptr() for layer, s in storage.items()}
    assert len(set(ptrs.values())) == len(ptrs), f"{case.id}: layers share key memory: {ptrs}"


# -- the four generic methods ---------------------------------------------------------------

_RAW_INDEX_KEY = {"DeepSeekV4UniformFP8KVPool", "LegacyDeepSeekV4SingleKVPool"}


def _raw_index_key(case: PoolCase) -> bool:
    """Whether the case's native ``get_key_buffer`` takes the raw id (trap 3): the uniform-fp8
    pool and the legacy double always; every DSv4 single pool on 0.5.12."""
    if case.cls_name in _RAW_INDEX_KEY:
        return True
    return case.family == "single" and dsv4_single_getter_is_raw()


def _expected_key(case: PoolCase, native: Any, layer: int, s: LayerStorage) -> Any:
    """What ``native.get_key_buffer(layer)`` does for a served layer."""
    if case.family in ("index", "dsv4_token"):
        return BARE
    if _raw_index_key(case):
        # Raw index: kv_buffer[layer_id], start_layer ignored (trap 3 / survey 4.2).
        if layer >= len(native.kv_buffer):
            return OUT_OF_RANGE
        return ("is", native.kv_buffer[layer], f"pool.kv_buffer[{layer}]")
    if case.family == "single":
        return ("view", s.key, FP8)
    return ("is", s.key, s.where["key"])


def _check(got_fn: Callable[[], Any], expected: Any, what: str, where: str = "") -> None:
    if isinstance(expected, Raises):
        assert_raises(got_fn, expected, what)
        return
    got, exc = _call(got_fn)
    assert exc is None, f"{what}: expected a tensor, got {type(exc).__name__}{exc.args!r}"
    kind, tensor, extra = expected
    if kind == "is":
        assert_is(got, tensor, what, extra)
    else:
        assert_view(got, tensor, extra, what, where)


@pytest.mark.parametrize("case", case_params())
def test_get_key_buffer(case: PoolCase) -> None:
    native = case.build()
    for layer, s in case.storage(native).items():
        expected = _expected_key(case, native, layer, s)
        _check(
            partial(native.get_key_buffer, layer),
            expected,
            f"{case.id}: get_key_buffer({layer})",
            s.where["key"],
        )


def _expected_value(case: PoolCase, s: LayerStorage) -> Any:
    family = case.family
    if family in ("index", "dsv4_token"):
        return BARE
    if family == "key_only":
        return K_ONLY_NO_V
    if family == "single":
        return USE_GET_KEY
    assert s.value is not None
    if family == "latent":
        # V is a non-contiguous column slice of the latent row (its first kv_lora_rank).
        return ("view", s.value, s.value.dtype)
    return ("is", s.value, s.where["value"])


@pytest.mark.parametrize("case", case_params())
def test_get_value_buffer(case: PoolCase) -> None:
    native = case.build()
    for layer, s in case.storage(native).items():
        _check(
            partial(native.get_value_buffer, layer),
            _expected_value(case, s),
            f"{case.id}: get_value_buffer({layer})",
            s.where.get("value", ""),
        )


@pytest.mark.parametrize("case", case_params())
def test_get_kv_buffer(case: PoolCase) -> None:
    native = case.build()
    for layer, s in case.storage(native).items():
        what = f"{case.id}: get_kv_buffer({layer})"
        value = _expected_value(case, s)
        if isinstance(value, Raises):
            assert_raises(partial(native.get_kv_buffer, layer), value, what)
            continue
        pair = native.get_kv_buffer(layer)
        assert isinstance(pair, tuple), f"{what}: expected a (K, V) tuple, got {_describe(pair)}"
        assert len(pair) == 2, f"{what}: expected a (K, V) tuple, got {_describe(pair)}"
        key = _expected_key(case, native, layer, s)
        _check(partial(operator.itemgetter(0), pair), key, f"{what}[0]", s.where["key"])
        _check(partial(operator.itemgetter(1), pair), value, f"{what}[1]", s.where["value"])


def _snapshot(case: PoolCase, native: Any) -> dict[tuple[int, str], torch.Tensor]:
    snap = {}
    for layer, s in case.storage(native).items():
        snap[layer, "key"] = s.key.clone()
        if s.value is not None:
            snap[layer, "value"] = s.value.clone()
        for role, tensor in s.extras.items():
            snap[layer, role] = tensor.clone()
    return snap


def _assert_only_changed(
    case: PoolCase,
    native: Any,
    before: dict[tuple[int, str], torch.Tensor],
    changed: dict[tuple[int, str], torch.Tensor],
    what: str,
) -> None:
    """``changed`` maps (layer, role) to a bool row mask of the rows allowed to differ."""
    for (layer, role), old in before.items():
        s = case.storage(native)[layer]
        new = {"key": s.key, "value": s.value}.get(role, s.extras.get(role))
        assert new is not None
        mask = changed.get((layer, role))
        keep = torch.ones(old.shape[0], dtype=torch.bool) if mask is None else ~mask
        assert torch.equal(new[keep], old[keep]), (
            f"{what}: rows of layer {layer}'s {role} ({s.where[role]}) outside the written "
            f"locations changed"
        )


_LOC = torch.tensor([3, 17])
_SWA_LOC = torch.tensor([5, 6])


def _rows(n: int, rows: torch.Tensor) -> torch.Tensor:
    mask = torch.zeros(n, dtype=torch.bool)
    mask[rows] = True
    return mask


@pytest.mark.parametrize("case", case_params())
def test_set_kv_buffer(case: PoolCase, sglang_session: SGLangSession) -> None:
    native = case.build()
    family = case.family
    refusal = {"key_only": K_ONLY_SET, "single": BARE, "index": BARE, "dsv4_token": BARE}
    for layer, s in case.storage(native).items():
        what = f"{case.id}: set_kv_buffer(layer {layer})"
        if family in refusal:
            k = torch.ones(2, 2, 8, dtype=BF16)
            assert_raises(
                partial(native.set_kv_buffer, radix_layer(layer), _LOC, k, k), refusal[family], what
            )
            continue
        gen = torch.Generator().manual_seed(layer)
        k = torch.randn((2, *s.key.shape[1:]), generator=gen).to(BF16)
        before = _snapshot(case, native)
        loc = _LOC
        loc_info: Any = _LOC
        if family == "swa":
            if case.layers[layer].key.attr.startswith("swa_kv_pool."):
                loc = _SWA_LOC
                # SWA layers need the pre-translated swa_loc: a bare assert otherwise.
                bare_loc = kv_write_loc()(_LOC)
                assert_raises(
                    partial(native.set_kv_buffer, radix_layer(layer), bare_loc, k, k),
                    Raises(AssertionError),
                    f"{what} without swa_loc",
                )
            loc_info = kv_write_loc()(_LOC, swa_loc=_SWA_LOC)
        if family == "latent":
            # MLA writes the whole latent row from K and ignores V entirely.
            v = torch.full((2, 1, b.KV_LORA_RANK), 7.0, dtype=BF16)
            native.set_kv_buffer(radix_layer(layer), loc_info, k, v)
            assert torch.equal(s.key[loc], k), f"{what}: latent rows differ from K"
            assert torch.equal(s.value[loc], k[..., : b.KV_LORA_RANK]), (
                f"{what}: V columns were not taken from K (V argument must be ignored)"
            )
            changed = {
                (layer, "key"): _rows(s.key.shape[0], loc),
                (layer, "value"): _rows(s.key.shape[0], loc),
            }
        else:
            v = torch.randn((2, *s.value.shape[1:]), generator=gen).to(BF16)
            native.set_kv_buffer(radix_layer(layer), loc_info, k, v)
            assert torch.equal(s.key[loc], k), f"{what}: {s.where['key']} rows {loc.tolist()}"
            assert torch.equal(s.value[loc], v), f"{what}: {s.where['value']} rows {loc.tolist()}"
            changed = {
                (layer, "key"): _rows(s.key.shape[0], loc),
                (layer, "value"): _rows(s.value.shape[0], loc),
            }
        _assert_only_changed(case, native, before, changed, what)


def test_helpful_message_only_on_dsv4_single_pools() -> None:
    """Trap 6: only the DSv4 single family explains itself; detect by class, not by message."""
    helpful = set()
    for case in POOL_CASES:
        native = case.build()
        _, exc = _call(partial(native.get_value_buffer, case.layer_ids[0]))
        if exc is not None and exc.args == USE_GET_KEY.args:
            helpful.add(case.cls_name)
    assert helpful == {
        "DeepSeekV4SingleKVPool",
        "DeepSeekV4UniformFP8KVPool",
        "HiSparseC4DevicePool",
        "LegacyDeepSeekV4SingleKVPool",
    }


# -- unserved layer ids ---------------------------------------------------------------------


def _expected_unserved_key(case: PoolCase, native: Any, layer: int) -> Any:
    family = case.family
    if family in ("index", "dsv4_token"):
        return BARE
    if family == "hybrid_linear":
        ids = list(case.layer_ids)
        keys = "dict_keys([" + ", ".join(map(str, ids)) + "])"
        return Raises(ValueError, (f"layer_id={layer} not in full attention layers: {keys}",))
    if family == "swa":
        return Raises(KeyError, (layer,))
    if _raw_index_key(case):
        listing = native.kv_buffer
        if layer < len(listing):
            return ("is", listing[layer], f"pool.kv_buffer[{layer}]")
        return OUT_OF_RANGE
    # abs-start leaves: buffer[layer - start_layer]; a negative index wraps (trap 1).
    storage = case.storage(native)
    local = layer - case.start_layer
    count = len(case.layer_ids)
    if local >= count or local < -count:
        return OUT_OF_RANGE
    wrapped = case.layer_ids[local]  # the served layer whose buffer comes back
    s = storage[wrapped]
    if family == "single":
        return ("view", s.key, FP8)
    return ("is", s.key, f"{s.where['key']} (layer {wrapped}'s buffer)")


@pytest.mark.parametrize("case", case_params())
def test_get_key_buffer_for_unserved_ids(case: PoolCase) -> None:
    native = case.build()
    for layer in case.unserved_ids:
        expected = _expected_unserved_key(case, native, layer)
        _check(
            partial(native.get_key_buffer, layer),
            expected,
            f"{case.id}: get_key_buffer({layer}) (unserved)",
            "",
        )


# -- the traps of sglang-on-cpu.md ----------------------------------------------------------

_ABS_START = b.OFFSET_KEY_BUILDERS


@pytest.mark.parametrize(("name", "build", "attr"), _ABS_START, ids=[c[0] for c in _ABS_START])
def test_trap1_id_below_start_layer_silently_reads_a_served_layer(
    name: str, build: Callable[..., Any], attr: str
) -> None:
    # start_layer=1, layer_num=1: the pool serves layer 1 only, yet get_key_buffer(0) is
    # buffer[0 - 1] == buffer[-1] == layer 1's buffer. No exception, no warning.
    native = build(start_layer=1, layer_num=1)
    got = native.get_key_buffer(0)
    layer1 = getattr(native, attr)[0]
    assert same_memory(got, layer1), f"{name}: get_key_buffer(0) is not layer 1's buffer"
    # With two layers, id 0 lands on the *last* served layer (buffer[-1] == layer 2).
    # (0.5.12's DSv4 single pools index raw ids: id 0 is buffer[0], layer 1's.)
    native = build(start_layer=1, layer_num=2)
    raw = name in ("DeepSeekV4SingleKVPool", "HiSparseC4DevicePool") and dsv4_single_getter_is_raw()
    assert same_memory(native.get_key_buffer(0), getattr(native, attr)[0 if raw else 1]), name
    assert_raises(lambda: native.get_key_buffer(3), OUT_OF_RANGE, f"{name}: get_key_buffer(3)")


_END_LAYER_BUILDERS = [(name, build) for name, build, _ in b.STAGED_BUILDERS]


@pytest.mark.parametrize(
    ("name", "build"), _END_LAYER_BUILDERS, ids=[c[0] for c in _END_LAYER_BUILDERS]
)
def test_trap2_end_layer_default_ignores_start_layer(name: str, build: Callable[..., Any]) -> None:
    native = build(start_layer=2, layer_num=2, end_layer=None)
    assert native.end_layer == 1, f"{name}: default end_layer {native.end_layer}, expected 1"
    assert native.end_layer < native.start_layer, name
    # `end_layer or layer_num - 1`: an explicit 0 is replaced too.
    assert build(start_layer=2, layer_num=2, end_layer=0).end_layer == 1, name
    # What SGLang's model set-up passes: the exclusive stage end, kept as given.
    assert build(start_layer=2, layer_num=2).end_layer == 4, name


def test_trap3_dsv4_single_get_key_buffer_has_two_branches() -> None:
    # fp8 dtype: store_dtype uint8 != dtype, so the getter subtracts start_layer and views.
    fp8 = b.build_dsv4_single_pool(start_layer=1, dtype=FP8)
    assert fp8.store_dtype == torch.uint8
    if dsv4_single_getter_is_raw():  # 0.5.12: one branch, the raw uint8 index for every dtype
        assert_is(
            fp8.get_key_buffer(1), fp8.kv_buffer[1], "fp8 get_key_buffer(1)", "pool.kv_buffer[1]"
        )
        assert_raises(lambda: fp8.get_key_buffer(2), OUT_OF_RANGE, "fp8 get_key_buffer(2)")
        return
    assert_view(
        fp8.get_key_buffer(1),
        fp8.kv_buffer[0],
        FP8,
        "fp8 pool get_key_buffer(1)",
        "pool.kv_buffer[0]",
    )
    # dtype uint8: store_dtype == dtype, so the getter takes the raw index and does not view.
    raw = b.build_dsv4_single_pool(start_layer=1, dtype=torch.uint8)
    assert raw.store_dtype == raw.dtype == torch.uint8
    assert_is(
        raw.get_key_buffer(1),
        raw.kv_buffer[1],
        "uint8 pool get_key_buffer(1)",
        "pool.kv_buffer[1] (layer 2's buffer)",
    )
    assert_raises(lambda: raw.get_key_buffer(2), OUT_OF_RANGE, "uint8 pool get_key_buffer(2)")
    # bf16 (NPU's dtype) does not construct on CPU: create_buffer's bare assert.
    assert_raises(
        lambda: b.build_dsv4_single_pool(dtype=BF16),
        Raises(AssertionError),
        "DeepSeekV4SingleKVPool(dtype=bf16)",
    )


def test_trap3_uniform_fp8_uses_raw_ids_for_getter_and_writer() -> None:
    native = b.build_dsv4_uniform_fp8_pool(start_layer=1, layer_num=2)
    # Served layers 1 and 2 live in kv_buffer[0] and [1]; the getter ignores start_layer.
    assert_is(
        native.get_key_buffer(1),
        native.kv_buffer[1],
        "get_key_buffer(1)",
        "pool.kv_buffer[1] (layer 2's buffer)",
    )
    assert_raises(lambda: native.get_key_buffer(2), OUT_OF_RANGE, "get_key_buffer(2)")
    assert native.kv_buffer[0].dtype == FP8
    # The pure-torch writer takes the local id too: id 0 writes kv_buffer[0] (layer 1).
    rows = torch.linspace(-2, 2, 1024).reshape(2, 512).to(BF16)
    native.set_key_buffer_fused(0, _LOC, rows)
    flat = native.kv_buffer[0].view(torch.uint8).view(-1, 512)
    assert torch.equal(flat[_LOC], rows.to(FP8).view(torch.uint8)), "token rows of kv_buffer[0]"
    assert int(native.kv_buffer[1].view(torch.uint8).count_nonzero()) == 0, "kv_buffer[1] touched"


def test_trap4_k_only_writer_takes_local_ids_getter_absolute_ids() -> None:
    native = b.build_k_only_pool(start_layer=1, layer_num=2)
    require_k_only_writer(native)
    k = torch.ones(2, b.HEAD_NUM, b.HEAD_DIM, dtype=BF16)
    native.set_k_buffer(1, _LOC, k)  # lands in k_buffer[1]: layer 2's buffer
    assert torch.equal(native.k_buffer[1][_LOC], k)
    assert int(native.k_buffer[0].count_nonzero()) == 0
    assert int(native.get_key_buffer(1).count_nonzero()) == 0, (
        "get_key_buffer(1) (absolute) should not see set_k_buffer(1, ...) (local)"
    )
    assert torch.equal(native.get_key_buffer(2)[_LOC], k)


def test_trap5_swa_start_layer_through_kwargs_shifts_both_sub_pools(
    sglang_session: SGLangSession,
) -> None:
    native = b.build_swa_pool(sub_pool_kwargs={"start_layer": 1})
    assert native.start_layer == 0
    assert native.full_kv_pool.start_layer == 1
    assert native.swa_kv_pool.start_layer == 1
    swa = native.swa_kv_pool.k_buffer
    full = native.full_kv_pool.k_buffer
    # The wrapper hands dense ids (0, 1) to sub-pools that subtract 1: every layer reads
    # its neighbour's buffer, silently.
    assert_is(
        native.get_key_buffer(0),
        swa[1],
        "get_key_buffer(0) (swa dense 0)",
        "swa_kv_pool.k_buffer[-1] == [1]",
    )
    assert_is(
        native.get_key_buffer(2),
        swa[0],
        "get_key_buffer(2) (swa dense 1)",
        "swa_kv_pool.k_buffer[0]",
    )
    assert_is(
        native.get_key_buffer(1),
        full[1],
        "get_key_buffer(1) (full dense 0)",
        "full_kv_pool.k_buffer[-1] == [1]",
    )
    # Writes go through the same shifted index.
    k = torch.ones(2, b.HEAD_NUM, b.HEAD_DIM, dtype=BF16)
    loc = kv_write_loc()(_LOC)
    native.set_kv_buffer(radix_layer(1), loc, k, k)
    assert torch.equal(full[1][_LOC], k), "layer 1's write landed elsewhere than k_buffer[1]"
    assert int(full[0].count_nonzero()) == 0


def test_indexer_pool_mixes_conventions() -> None:
    """DeepSeekV4IndexerPool: index-K readers use raw ids, the fp4 gather subtracts start."""
    native = b.build_dsv4_indexer_pool(use_fp4_indexer=True, start_layer=2, layer_num=2)
    assert_raises(
        lambda: native.get_index_k_with_scale_buffer(2),
        OUT_OF_RANGE,
        "get_index_k_with_scale_buffer(2)",
    )
    assert_is(
        native.get_index_k_with_scale_buffer(0),
        native.index_k_with_scale_buffer[0],
        "get_index_k_with_scale_buffer(0)",
        "pool.index_k_with_scale_buffer[0]",
    )
    # Put a recognisable payload byte for slot 3 into layer 2's storage (entry 0).
    native.index_k_with_scale_buffer[0][0, 3 * 64] = 0x5A
    payload, _ = native.get_index_k_fp4(2, torch.tensor([3]))
    assert int(payload.view(torch.uint8)[0, 0]) == 0x5A, "get_index_k_fp4(2) did not read entry 0"


# -- DSv4 page geometry ---------------------------------------------------------------------

# kv_layout -> (bytes per token, page bytes at P=64, quantize_block_size = tile size)
_LAYOUTS = {
    "v4": (584, 37440, 64),
    "v41": (528, 33792, 32),
    "v41_fp4": (288, 18432, 16),
    "uniform_fp8": (512, 32768, 512),
    "v41_new": (528, 33792, 32),
    "v41_fp4_new": (288, 18432, 16),
}


@pytest.mark.parametrize("layout", list(_LAYOUTS))
def test_dsv4_single_pool_page_geometry(layout: str, sglang_session: SGLangSession) -> None:
    per_token, page_bytes, block = _LAYOUTS[layout]
    native = b.build_dsv4_single_pool(kv_layout=layout)
    kv_layout = sglang_session.kv_layout.KVLayout
    assert native.kv_layout is kv_layout(layout)
    assert native.kv_cache_total_dim == per_token, layout
    assert native.bytes_per_page_padded == page_bytes, layout
    assert native.quantize_block_size == block, layout
    for i, buf in enumerate(native.kv_buffer):
        # size 64 + one reserved page of 64 -> 2 pages; uint8 whatever the layout says.
        assert buf.shape == (2, page_bytes), f"{layout}: kv_buffer[{i}] {tuple(buf.shape)}"
        assert buf.dtype == torch.uint8, f"{layout}: kv_buffer[{i}] {buf.dtype}"
        assert buf.is_contiguous()


def test_v4_page_is_584_bytes_per_token_padded_to_576() -> None:
    native = b.build_dsv4_single_pool()
    assert native.kv_cache_total_dim == 448 + 64 * 2 + 448 // 64 + 1 == 584
    assert native.bytes_per_page_padded == -(-64 * 584 // 576) * 576 == 37440
    assert 37440 - 64 * 584 == 64  # trailing pad bytes per page


def test_dsv4_page_count_is_ceil_of_size_plus_global_page() -> None:
    """0.5.21 on: ceil((size + global page) / page); before: (size + page + 1) // page."""
    assert len({buf.shape[0] for buf in b.build_dsv4_single_pool(size=100).kv_buffer}) == 1
    for size, new in ((100, 3), (63, 2), (64, 2)):  # ceil(164 / 64), ceil(127 / 64), 128 / 64
        pages = b.build_dsv4_single_pool(size=size).kv_buffer[0].shape[0]
        assert pages == dsv4_pages(size, 64), f"[sglang {release()}] size {size}: {pages} pages"
        if callable(getattr(prepare_sglang().deepseek_v4_memory_pool,
                            "_num_dsv4_physical_kv_pages", None)):  # fmt: skip
            assert pages == new


def test_dsv4_single_key_buffer_is_fp8_view_of_uint8_storage() -> None:
    native = b.build_dsv4_single_pool()
    key = native.get_key_buffer(0)
    raw = native.kv_buffer[0]
    if dsv4_single_getter_is_raw():  # 0.5.12: the uint8 storage itself, no view
        assert key is raw
        return
    assert raw.dtype == torch.uint8
    assert key.dtype == FP8
    assert key.shape == raw.shape == (2, 37440)
    assert key.data_ptr() == raw.data_ptr()
    assert key.untyped_storage().data_ptr() == raw.untyped_storage().data_ptr()
    assert key is not raw, "a fresh view on every call"
    assert native.get_key_buffer(0) is not key


def test_uniform_fp8_pool_geometry() -> None:
    native = b.build_dsv4_uniform_fp8_pool()
    assert native.kv_cache_total_dim == 512
    assert native.bytes_per_page_padded == 64 * 512
    assert [tuple(t.shape) for t in native.kv_buffer] == [(2, 32768)] * 2
    assert {t.dtype for t in native.kv_buffer} == {FP8}
    if hasattr(native, "kv_layout"):  # 0.5.21 on
        assert native.kv_layout.value == "v4", "the class attribute still says V4"


@pytest.mark.parametrize(("fp4", "row"), [(False, 64 * 132), (True, 64 * 68)])
def test_dsv4_indexer_geometry(fp4: bool, row: int) -> None:
    native = b.build_dsv4_indexer_pool(use_fp4_indexer=fp4)
    assert getattr(native, "use_fp4_indexer", False) is fp4  # no such attribute before 0.5.21
    assert [tuple(t.shape) for t in native.index_k_with_scale_buffer] == [(2, row)] * 2
    assert {t.dtype for t in native.index_k_with_scale_buffer} == {torch.uint8}


def test_dsv4_indexer_none_reads_the_published_config() -> None:
    assert b.build_dsv4_indexer_pool(use_fp4_indexer=None).use_fp4_indexer is False


# -- the DSv4 composite ---------------------------------------------------------------------


@pytest.mark.parametrize("case", case_params(cases_for(family="dsv4_token")))
def test_dsv4_token_pool_routing(case: PoolCase) -> None:
    native = case.build()
    view = torch.uint8 if dsv4_single_getter_is_raw() else FP8  # 0.5.12: the raw storage
    ratios = case.kwargs["compression_ratios"]
    start = case.start_layer
    assert (native._stage_start, native._stage_end) == (start, len(ratios))
    # Sub-pools are built without start_layer: they take stage-local / compress-local ids.
    subs = [native.swa_kv_pool, *dsv4_kv_pools(native).values(), *dsv4_index_pools(native).values()]
    assert [p.start_layer for p in subs] == [0] * len(subs)
    assert sorted(dsv4_kv_pools(native)) == [4, 128]
    assert sorted(dsv4_index_pools(native)) == [4]
    assert native.layer_mapping[:start] == [None] * start
    for layer, s in case.storage(native).items():
        what = f"{case.id} layer {layer}"
        item = native.layer_mapping[layer]
        assert item.compress_ratio == ratios[layer], what
        assert_view(
            native.get_swa_key_buffer_radix(layer),
            s.key,
            view,
            f"{what}: get_swa_key_buffer_radix",
            s.where["key"],
        )
        if "extra" in s.extras:
            assert item.compress_kv_pool is dsv4_kv_pools(native)[ratios[layer]], what
            assert_view(
                native.get_extra_key_buffer(layer),
                s.extras["extra"],
                view,
                f"{what}: get_extra_key_buffer",
                s.where["extra"],
            )
        else:
            assert item.compress_kv_pool is None, what
            assert_raises(
                partial(native.get_extra_key_buffer, layer),
                Raises(AssertionError),
                f"{what}: get_extra_key_buffer",
            )
        if "index_k" in s.extras:
            assert_is(
                native.get_index_k_with_scale_buffer(layer),
                s.extras["index_k"],
                f"{what}: get_index_k_with_scale_buffer",
                s.where["index_k"],
            )
        else:
            # 0.5.20 on (index_pools): SGLang's message names the ratio; before, c4 only.
            if isinstance(getattr(native, "index_pools", None), dict):
                msg = f"No indexer pool for compression ratio {ratios[layer]}"
            else:
                msg = f"only c4 has indexer, got compress_ratio = {ratios[layer]}"
            assert_raises(
                partial(native.get_index_k_with_scale_buffer, layer),
                Raises(AssertionError, (msg,)),
                f"{what}: get_index_k_with_scale_buffer",
            )


def test_dsv4_token_pool_sub_pool_geometry() -> None:
    native = b.build_dsv4_token_pool(start_layer=0)
    # SWA: 256 tokens, page 256 -> ceil((256 + 256) / 256) = 2 pages of 256 * 584 -> 149760 B.
    assert [tuple(t.shape) for t in native.swa_kv_pool.kv_buffer] == [(2, 149760)] * 3
    # c4: page 256 / 4 = 64, 64 slots + the 256-token global page -> 5 pages of 37440 B
    # (before 0.5.21: (64 + 64 + 1) // 64 = 2 pages).
    c4_pages = dsv4_pages(64, 64, 256)
    assert [tuple(t.shape) for t in dsv4_kv_pools(native)[4].kv_buffer] == [(c4_pages, 37440)]
    # c128: page 2, 4 slots -> ceil(260 / 2) = 130 pages of ceil(2 * 584 / 576) * 576 = 1728 B.
    c128_pages = dsv4_pages(4, 2, 256)
    assert [tuple(t.shape) for t in dsv4_kv_pools(native)[128].kv_buffer] == [(c128_pages, 1728)]
    # c4 indexer: c128_size * 32 = 128 slots, page 64 -> 6 pages of 64 * 132 B (0.5.22 on:
    # plus the global page; before: (128 + 64 + 1) // 64 = 3).
    index = dsv4_index_pools(native)[4].index_k_with_scale_buffer
    assert [tuple(t.shape)[1] for t in index] == [8448]
    if callable(getattr(native, "pd_kv_layout", None)):  # 0.5.23 only
        assert native.pd_kv_layout() == "v4,c4:v4,c128:v4"


def test_dsv4_token_pool_v41_layouts() -> None:
    native = b.build_dsv4_token_pool(start_layer=0, kv_layout="v41")
    if callable(getattr(native, "pd_kv_layout", None)):  # 0.5.23 on
        assert native.pd_kv_layout() == "v41,c4:v41,c128:v41"
    assert native.swa_kv_pool.kv_cache_total_dim == 528


def test_dsv4_token_pool_start_layer_without_end_layer_builds_the_whole_model() -> None:
    # _stage_start honours start_layer only when end_layer is given too: otherwise the pool
    # allocates every model layer while start_layer (used by its waits) stays 3.
    native = b.build_dsv4_token_pool(
        compression_ratios=(0, 4, 128, 0, 4, 128), start_layer=3, end_layer=None
    )
    assert (native._stage_start, native._stage_end) == (0, 6)
    assert native.start_layer == 3
    assert native.end_layer == 2  # layer_num (3) - 1
    assert native.swa_kv_pool.layer_num == 6
    assert all(item is not None for item in native.layer_mapping)


def test_dsv4_token_pool_refuses_page_size_64() -> None:
    assert_raises(
        lambda: b.build_dsv4_token_pool(page_size=64),
        Raises(ZeroDivisionError, ("integer division or modulo by zero",)),
        "DeepSeekV4TokenToKVPool(page_size=64)",
    )


# -- storage facts --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    case_params(
        [*cases_for(family="split"), *cases_for(family="hybrid_linear"), *cases_for(family="swa")]
    ),
)
def test_mha_k_and_v_are_halves_of_one_allocation(case: PoolCase) -> None:
    native = case.build()
    leaf = getattr(native, "full_kv_pool", native)
    for layer, s in case.storage(native).items():
        assert s.value is not None
        if not mha_fuses_k_and_v(leaf):  # 0.5.12-0.5.20: two allocations per layer
            assert s.key.untyped_storage().data_ptr() != s.value.untyped_storage().data_ptr(), (
                f"[sglang {release()}] {case.id} layer {layer}: K and V share one allocation"
            )
            continue
        assert s.key.untyped_storage().data_ptr() == s.value.untyped_storage().data_ptr(), (
            f"[sglang {release()}] {case.id} layer {layer}: K and V no longer share one allocation"
        )
        rows = s.key.shape[0]
        padded = -(-rows // b.MHA_PAGE) * b.MHA_PAGE
        gap = s.value.data_ptr() - s.key.data_ptr()
        assert gap == padded * s.key[0].numel() * s.key.element_size(), (
            f"{case.id} layer {layer}: V starts {gap} B after K"
        )


@pytest.mark.parametrize("case", case_params(cases_for(family="latent")))
def test_latent_value_is_a_strided_column_slice(case: PoolCase) -> None:
    native = case.build()
    for layer, s in case.storage(native).items():
        value = native.get_value_buffer(layer)
        assert not value.is_contiguous(), f"{case.id} layer {layer}"
        assert value.stride() == s.key.stride()
        assert value.shape[-1] == b.KV_LORA_RANK


@pytest.mark.parametrize("case", case_params(cases_for(cls_name="DSATokenToKVPool")))
def test_dsa_index_k_getter_subtracts_start_layer(case: PoolCase) -> None:
    native = case.build()
    for layer, s in case.storage(native).items():
        assert_view(
            native.get_index_k_with_scale_buffer(layer),
            s.extras["index_k"],
            torch.uint8,
            f"{case.id}: get_index_k_with_scale_buffer({layer})",
            s.where["index_k"],
        )


def test_layer_transfer_counter_is_none_by_default() -> None:
    for case in POOL_CASES:
        assert case.build().layer_transfer_counter is None, case.id
