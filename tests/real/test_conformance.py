"""kvcompat conforms to its contract on SGLang 0.5.23's own pool classes.

Parametrized over ``CONFORMANCE_CASES`` (every constructible class x start_layer of
``POOL_CASES``, plus fp8 / v_head_dim / uint8-DSv4 / DSv4-stage variants). Expected storage
comes from ``PoolCase.storage(native)``: native attributes read directly, never native
getters. Every failure names the case (class and variant), the layer and what differed.

Sections: detection; per-layer storage; unserved ids; composites; the traps of
sglang-on-cpu.md / docs/supported-pools.md (numbered as there; :data:`TRAP_TESTS` maps each
number to its tests, and tests/real/test_docs_traps.py keeps the page and the map in step);
layer-transfer waits.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from _sglang import builders as b
from _sglang.cases import (
    CONFORMANCE_CASES,
    LayerStorage,
    PoolCase,
    conformance_params,
    same_memory,
)
from _sglang.env import SGLangSession
from _sglang.features import (
    ReleaseLacks,
    dsv4_index_pools,
    dsv4_single_getter_is_raw,
    require_k_only_writer,
)

import kvcompat
from kvcompat import PoolKind
from kvcompat.testing import RecordingLayerCounter

from ._checks import at, check_raises, check_storage, describe, ids_text, record_imports

FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16

TRAP_TESTS: Mapping[int, tuple[str, ...]] = {
    1: ("test_trap1_ids_below_start_layer_raise",),
    2: ("test_trap2_end_layer_default_does_not_change_the_served_ids",),
    3: (
        "test_trap3_dsv4_single_both_dtype_branches",
        "test_trap3_uniform_fp8_raw_index_getter_and_writer",
        "test_trap3_dsv4_indexer_raw_index_reader",
    ),
    4: ("test_trap4_k_only_local_writer_absolute_getter",),
    5: ("test_trap5_swa_start_layer_through_kwargs",),
    6: ("test_trap6_detected_by_class_never_by_message",),
}
"""Trap number (sglang-on-cpu.md and docs/supported-pools.md) -> the tests that cover it."""

KIND = {
    "split": PoolKind.SPLIT,
    "key_only": PoolKind.KEY_ONLY,
    "latent": PoolKind.LATENT,
    "single": PoolKind.SINGLE_KV,
    "index": PoolKind.KEY_ONLY,
    "hybrid_linear": PoolKind.COMPOSITE,
    "swa": PoolKind.COMPOSITE,
    "dsv4_token": PoolKind.COMPOSITE,
}
DETECTORS: Mapping[Callable[[object], Any], PoolKind] = {
    kvcompat.is_split_kv_pool: PoolKind.SPLIT,
    kvcompat.is_latent_pool: PoolKind.LATENT,
    kvcompat.is_single_kv_pool: PoolKind.SINGLE_KV,
    kvcompat.is_key_only_pool: PoolKind.KEY_ONLY,
    kvcompat.is_composite_pool: PoolKind.COMPOSITE,
}
ALL_DETECTORS: tuple[Callable[[object], Any], ...] = (*DETECTORS, kvcompat.is_supported_pool)
DETECTORS_BY_NAME = {detector.__name__: kind for detector, kind in DETECTORS.items()}
SINGLE_KV_CLASSES = {
    "DeepSeekV4SingleKVPool",
    "DeepSeekV4UniformFP8KVPool",
    "HiSparseC4DevicePool",
    "LegacyDeepSeekV4SingleKVPool",
}
COMPOSITES = ("hybrid_linear", "swa", "dsv4_token")
NO_VALUES = ("key_only", "index")
# pair.shared: does the value alias key storage?
SHARED = {
    "split": False,
    "latent": True,
    "single": True,
    "hybrid_linear": False,
    "swa": False,
    "dsv4_token": True,
}
# Native getters that index buffer[layer_id] (start_layer ignored); right only at start 0.
RAW_INDEX_CLASSES = {"DeepSeekV4UniformFP8KVPool", "LegacyDeepSeekV4SingleKVPool"}
# The one dtype kvcompat returns on purpose differently from a native getter (the legacy
# getter returned the uint8 storage; kvcompat returns the pool's logical dtype).
DOCUMENTED_DTYPE_DIFFERENCES = {"LegacyDeepSeekV4SingleKVPool": (torch.uint8, FP8)}


# -- expectations ---------------------------------------------------------------------------


def expected_dtype(owner: Any, tensor: torch.Tensor, *, as_stored: bool = False) -> torch.dtype:
    """The dtype kvcompat returns: the owner pool's logical dtype when only the element type
    differs from the storage (fp8 stored as uint8), the stored dtype otherwise."""
    if as_stored:
        return tensor.dtype
    dtype: torch.dtype = owner.dtype
    return dtype if dtype.itemsize == tensor.element_size() else tensor.dtype


def key_dtype(case: PoolCase, native: Any, s: LayerStorage) -> torch.dtype:
    return expected_dtype(native, s.key, as_stored=case.family == "index")


def others_of(storage: Mapping[int, LayerStorage]) -> dict[str, torch.Tensor]:
    """Every layer's key and value storage, labelled, to name a wrong answer's owner."""
    out: dict[str, torch.Tensor] = {}
    for layer, s in storage.items():
        out[f"layer {layer}'s key storage {s.where['key']}"] = s.key
        if s.value is not None:
            out[f"layer {layer}'s value storage {s.where['value']}"] = s.value
    return out


def native_reads_raw_index(case: PoolCase, native: Any) -> bool:
    """Whether the native reader indexes ``buffer[layer_id]`` (ignoring start_layer)."""
    if case.cls_name in RAW_INDEX_CLASSES or case.family == "index":
        return True
    if case.family == "single" and dsv4_single_getter_is_raw():
        return True  # 0.5.12: every DSv4 single pool's getter takes the raw id
    return case.family == "single" and native.store_dtype == native.dtype


def native_key_reader(case: PoolCase, native: Any) -> Callable[[int], Any]:
    """The native getter that answers the key question for this class."""
    name = {"index": "get_index_k_with_scale_buffer", "dsv4_token": "get_swa_key_buffer_radix"}
    reader: Callable[[int], Any] = getattr(native, name.get(case.family, "get_key_buffer"))
    return reader


def _call(fn: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    try:
        return fn(), None
    except Exception as exc:  # the exception is the observation
        return None, exc


def _unserved_probe_ids(case: PoolCase) -> list[int]:
    served = case.layer_ids
    ids = set(case.unserved_ids) | {-1, -len(served) - 1, max(served) + 1, max(served) + 64}
    if min(served) > 0:
        ids.add(min(served) - 1)
    return sorted(ids - set(served))


# -- detection ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", conformance_params())
def test_detectors_answer_by_class_without_importing(case: PoolCase) -> None:
    native = case.build()
    pool = kvcompat.adapt(native)
    expected = KIND[case.family]
    assert pool.kind is expected, at(case.id, None, f"adapter.kind {pool.kind}, want {expected}")
    subjects = {"instance": native, "class": type(native), "adapter": pool}
    for detector in (*ALL_DETECTORS, kvcompat.pool_kind):  # kvcompat's own lazy imports, once
        detector(object())
    with record_imports() as log:
        answers = {
            (label, detector.__name__): detector(subject)
            for label, subject in subjects.items()
            for detector in ALL_DETECTORS
        }
        kinds = {label: kvcompat.pool_kind(subject) for label, subject in subjects.items()}
    assert log.statements == [], at(
        case.id, None, f"detectors executed import statements: {log.statements}"
    )
    assert log.new_modules == set(), at(case.id, None, f"detectors loaded {log.new_modules}")
    for label, kind in kinds.items():
        assert kind is expected, at(case.id, None, f"pool_kind({label}) is {kind}, want {expected}")
    for (label, name), answer in answers.items():
        want = True if name == "is_supported_pool" else DETECTORS_BY_NAME[name] is expected
        assert answer is want, at(case.id, None, f"{name}({label}) is {answer}, want {want}")


def test_single_kv_detection_is_exactly_the_dsv4_single_family() -> None:
    answered = {
        case.cls_name for case in CONFORMANCE_CASES if kvcompat.is_single_kv_pool(case.build())
    }
    assert answered == SINGLE_KV_CLASSES, (
        f"is_single_kv_pool is true for {sorted(answered)}, want {sorted(SINGLE_KV_CLASSES)}"
    )


_FRESH_PROCESS_SCRIPT = textwrap.dedent(
    """
    import builtins, json, sys
    sys.path.insert(0, TESTS_DIR)

    def engine(names):
        return sorted(m for m in names if m.split(".")[0] in ("sglang", "triton"))

    import kvcompat
    from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
    kvcompat.is_single_kv_pool(ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64))
    kvcompat.pool_kind(object())
    out = {"engine_before_sglang": engine(sys.modules)}

    from _sglang.cases import CONFORMANCE_CASES
    from _sglang.features import ReleaseLacks, dsv4_index_pools, dsv4_single_getter_is_raw
    natives = []
    for case in CONFORMANCE_CASES:
        try:
            natives.append(case.build())
        except ReleaseLacks:
            pass  # this release has no such class / configuration
    out["built"] = len(natives)
    out["layers_loaded"] = len([m for m in sys.modules if m.startswith("sglang.srt.layers.")])
    detectors = [getattr(kvcompat, n) for n in (
        "pool_kind", "is_split_kv_pool", "is_latent_pool", "is_single_kv_pool",
        "is_key_only_pool", "is_composite_pool", "is_supported_pool")]

    statements = []
    real_import = builtins.__import__
    def spy(name, *args, **kwargs):
        statements.append(name)
        return real_import(name, *args, **kwargs)

    snapshot = set(sys.modules)
    builtins.__import__ = spy
    try:
        answers = [str(d(s)) for n in natives for s in (n, type(n)) for d in detectors]
    finally:
        builtins.__import__ = real_import
    out["detector_import_statements"] = statements
    out["new_modules_after_detectors"] = sorted(set(sys.modules) - snapshot)

    pools = [kvcompat.adapt(n) for n in natives]
    for pool in pools:
        parts = [pool, *pool.components.values()]
        for part in parts:
            [d(part) for d in detectors]
            for layer in part.layer_ids:
                part.get_key_buffer(layer, wait=False)
                if part.kind.has_values:
                    part.get_kv_buffer(layer, wait=False)
    out["new_modules_after_adapt"] = sorted(set(sys.modules) - snapshot)
    out["answers"] = len(answers)
    from _sglang.env import release_sglang
    release_sglang()
    print("RESULT " + json.dumps(out))
    """
)


def buildable_cases() -> list[PoolCase]:
    """The conformance cases the installed release can build (the others lack a feature)."""
    found = []
    for case in CONFORMANCE_CASES:
        try:
            case.build()
        except ReleaseLacks:
            continue
        found.append(case)
    return found


def test_detectors_import_nothing_in_a_fresh_process() -> None:
    """A fresh interpreter: kvcompat alone loads no engine; after the pools are built,
    detectors execute no import statement and adapt()/getters load no module."""
    tests_dir = str(Path(__file__).resolve().parents[1])
    code = f"TESTS_DIR = {tests_dir!r}\n" + _FRESH_PROCESS_SCRIPT
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0, f"subprocess failed:\n{result.stderr[-3000:]}"
    assert lines, f"no RESULT line:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    out = json.loads(lines[-1].removeprefix("RESULT "))
    assert out["engine_before_sglang"] == [], (
        f"import kvcompat + detectors loaded engine modules: {out['engine_before_sglang']}"
    )
    assert out["layers_loaded"] > 0, "the pools' own imports should have loaded sglang layers"
    assert out["built"] == len(buildable_cases()), "the subprocess built other cases"
    assert out["answers"] == 2 * 7 * out["built"]
    assert out["detector_import_statements"] == [], (
        f"detectors executed imports: {out['detector_import_statements']}"
    )
    assert out["new_modules_after_detectors"] == [], (
        f"detectors loaded modules: {out['new_modules_after_detectors']}"
    )
    assert out["new_modules_after_adapt"] == [], (
        f"adapt()/getters loaded modules: {out['new_modules_after_adapt']}"
    )


# -- per-layer storage ----------------------------------------------------------------------


@pytest.mark.parametrize("case", conformance_params())
def test_layer_ids_are_the_served_layers(case: PoolCase) -> None:
    pool = kvcompat.adapt(case.build())
    assert pool.layer_ids == case.layer_ids, at(
        case.id, None, f"adapter.layer_ids {pool.layer_ids}, want {case.layer_ids}"
    )
    assert isinstance(pool, kvcompat.KVPoolProtocol), at(case.id, None, "not a KVPoolProtocol")


@pytest.mark.parametrize("case", conformance_params())
def test_getters_return_the_native_storage(case: PoolCase) -> None:
    native = case.build()
    pool = kvcompat.adapt(native)
    storage = case.storage(native)
    others = others_of(storage)
    has_values = case.family not in NO_VALUES
    for layer, s in storage.items():
        dtype = key_dtype(case, native, s)
        for wait in (True, False):
            where = f"wait={wait}"
            check_storage(
                pool.get_key_buffer(layer, wait=wait),
                s.key,
                dtype=dtype,
                what=at(case.id, layer, f"get_key_buffer({where})"),
                where=s.where["key"],
                others=others,
            )
            if not has_values:
                continue
            assert s.value is not None
            v_dtype = expected_dtype(native, s.value)
            value, exc = _call(partial(pool.get_value_buffer, layer, wait=wait))
            assert exc is None, at(
                case.id, layer, f"get_value_buffer({where}) raised {type(exc).__name__}: {exc}"
            )
            check_storage(
                value,
                s.value,
                dtype=v_dtype,
                what=at(case.id, layer, f"get_value_buffer({where})"),
                where=s.where["value"],
                others=others,
            )
            pair, exc = _call(partial(pool.get_kv_buffer, layer, wait=wait))
            assert exc is None, at(
                case.id, layer, f"get_kv_buffer({where}) raised {type(exc).__name__}: {exc}"
            )
            assert isinstance(pair, kvcompat.KVPair), at(
                case.id, layer, f"get_kv_buffer returned {describe(pair)}"
            )
            key, val = pair
            what = at(case.id, layer, f"get_kv_buffer({where})")
            check_storage(key, s.key, dtype=dtype, what=f"{what}[0]", where=s.where["key"])
            check_storage(val, s.value, dtype=v_dtype, what=f"{what}[1]", where=s.where["value"])
            assert pair.shared is SHARED[case.family], (
                f"{what}: pair.shared is {pair.shared}, want {SHARED[case.family]}"
            )
            if SHARED[case.family]:
                aliases = val.untyped_storage().data_ptr() == key.untyped_storage().data_ptr()
                assert aliases, f"{what}: shared=True but the value is another allocation"
                assert val.data_ptr() == key.data_ptr(), (
                    f"{what}: shared=True but the value does not start at the key's first byte"
                )
            expected_component = pool.component_for(layer) if case.family in COMPOSITES else None
            assert pair.component == expected_component, (
                f"{what}: pair.component {pair.component!r}, want {expected_component!r}"
            )


@pytest.mark.parametrize("case", conformance_params(families=NO_VALUES))
def test_key_only_pools_refuse_values_with_a_helpful_error(case: PoolCase) -> None:
    pool = kvcompat.adapt(case.build())
    for layer in case.layer_ids:
        for getter in ("get_value_buffer", "get_kv_buffer"):
            exc = check_raises(
                partial(getattr(pool, getter), layer),
                kvcompat.NoValueBufferError,
                what=at(case.id, layer, getter),
                contains=(case.cls_name, "get_key_buffer"),
            )
            assert isinstance(exc, NotImplementedError), at(case.id, layer, getter)


@pytest.mark.parametrize(
    "case", conformance_params(families=[f for f in KIND if f not in NO_VALUES])
)
def test_no_not_implemented_error_escapes_pools_with_values(case: PoolCase) -> None:
    """The native generic getters raise on DSv4 (single and composite); kvcompat's never do."""
    pool = kvcompat.adapt(case.build())
    parts = {"pool": pool, **{f"components[{n!r}]": p for n, p in pool.components.items()}}
    for label, part in parts.items():
        if not part.kind.has_values:
            continue
        for layer in part.layer_ids:
            for getter in ("get_key_buffer", "get_value_buffer", "get_kv_buffer"):
                _, exc = _call(partial(getattr(part, getter), layer))
                assert exc is None, at(
                    case.id, layer, f"{label}.{getter} raised {type(exc).__name__}: {exc}"
                )


@pytest.mark.parametrize("case", conformance_params())
def test_agrees_with_the_native_getter_where_it_is_right(case: PoolCase) -> None:
    """Where the native reader returns the layer's storage, kvcompat returns the same view;
    where it does not (raw-index readers on a later stage), kvcompat still does."""
    native = case.build()
    pool = kvcompat.adapt(native)
    reader = native_key_reader(case, native)
    raw = native_reads_raw_index(case, native)
    storage = case.storage(native)
    for layer, s in storage.items():
        what = at(case.id, layer, f"native {reader.__name__} vs kvcompat get_key_buffer")
        got = pool.get_key_buffer(layer, wait=False)
        native_result, exc = _call(partial(reader, layer))
        native_right = (
            exc is None
            and isinstance(native_result, torch.Tensor)
            and same_memory(native_result, s.key)
        )
        assert native_right is (not raw or case.start_layer == 0), (
            f"{what}: expected the native reader to be "
            f"{'right' if not raw or case.start_layer == 0 else 'wrong'} here, it returned "
            f"{describe(native_result) if exc is None else repr(exc)}"
        )
        if not native_right:
            continue
        want_dtype = native_result.dtype
        documented = DOCUMENTED_DTYPE_DIFFERENCES.get(case.cls_name)
        if (
            documented is None
            and case.family in ("single", "dsv4_token")
            and native_result.dtype != got.dtype
            and dsv4_single_getter_is_raw()
            and native.dtype == FP8
        ):
            # 0.5.12's real class (also the composite's SWA pool): the legacy double's.
            documented = DOCUMENTED_DTYPE_DIFFERENCES["LegacyDeepSeekV4SingleKVPool"]
        if documented is not None:
            assert (native_result.dtype, got.dtype) == documented, (
                f"{what}: dtypes (native, kvcompat) = {(native_result.dtype, got.dtype)}, "
                f"documented {documented}"
            )
            want_dtype = got.dtype
        check_storage(got, native_result, dtype=want_dtype, what=what, where="the native result")
        if case.family in ("split", "latent", "hybrid_linear", "swa"):
            native_value = native.get_value_buffer(layer)
            check_storage(
                pool.get_value_buffer(layer),
                native_value,
                dtype=native_value.dtype,
                what=at(case.id, layer, "native vs kvcompat get_value_buffer"),
                where="the native get_value_buffer result",
            )


@pytest.mark.parametrize("case", conformance_params())
def test_unserved_ids_raise_layer_out_of_range(case: PoolCase) -> None:
    native = case.build()
    counter = RecordingLayerCounter()
    native.register_layer_transfer_counter(counter)
    pool = kvcompat.adapt(native)
    valid = ids_text(case.layer_ids)
    for layer in _unserved_probe_ids(case):
        for getter in ("get_key_buffer", "get_value_buffer", "get_kv_buffer", "component_for"):
            exc = check_raises(
                partial(getattr(pool, getter), layer),
                kvcompat.LayerOutOfRangeError,
                what=at(case.id, layer, f"{getter} (unserved)"),
                contains=(f"layer id {layer} ", f"valid layer ids are {valid}"),
            )
            assert isinstance(exc, IndexError), at(case.id, layer, getter)
    assert counter.waits == [], at(case.id, None, f"unserved ids waited: {counter.waits}")


@pytest.mark.parametrize("case", conformance_params())
def test_adapting_never_mutates_the_native_pool(case: PoolCase) -> None:
    native = case.build()
    before = {name: id(value) for name, value in vars(native).items()}
    pool = kvcompat.adapt(native)
    for part in (pool, *pool.components.values()):
        for layer in part.layer_ids:
            part.get_key_buffer(layer)
            if part.kind.has_values:
                part.get_kv_buffer(layer)
    after = {name: id(value) for name, value in vars(native).items()}
    assert after == before, at(
        case.id,
        None,
        f"native attributes changed: {sorted(set(after.items()) ^ set(before.items()))}",
    )
    assert pool.native is native, at(case.id, None, "adapter.native is not the native pool")


# -- composites -----------------------------------------------------------------------------


def component_plan(case: PoolCase, native: Any) -> dict[str, dict[int, tuple[str, str]]]:
    """component -> {layer: (role in LayerStorage, kind)} from the *native* routing tables."""
    plan: dict[str, dict[int, tuple[str, str]]] = {}
    if case.family == "hybrid_linear":
        plan["full"] = {
            int(layer): ("key", "split") for layer in native.full_attention_layer_id_mapping
        }
    elif case.family == "swa":
        for layer, (_, is_swa) in native.layers_mapping.items():
            plan.setdefault("swa" if is_swa else "full", {})[int(layer)] = ("key", "split")
    else:
        for layer, item in enumerate(native.layer_mapping):
            if item is None:
                continue
            plan.setdefault("swa", {})[layer] = ("key", "single")
            ratio = int(item.compress_ratio)
            if ratio:
                plan.setdefault(f"c{ratio}", {})[layer] = ("extra", "single")
                if dsv4_index_pools(native).get(ratio) is not None:
                    plan.setdefault(f"c{ratio}_indexer", {})[layer] = ("index_k", "index")
    return plan


def _primary(case: PoolCase, native: Any, layer: int) -> str:
    if case.family == "swa":
        return "swa" if native.layers_mapping[layer][1] else "full"
    return "full" if case.family == "hybrid_linear" else "swa"


@pytest.mark.parametrize("case", conformance_params(families=COMPOSITES))
def test_composite_components_are_conformant(case: PoolCase) -> None:
    native = case.build()
    pool = kvcompat.adapt(native)
    storage = case.storage(native)
    plan = component_plan(case, native)
    assert sorted(pool.components) == sorted(plan), at(
        case.id, None, f"components {sorted(pool.components)}, want {sorted(plan)}"
    )
    for name, layers in plan.items():
        part = pool.components[name]
        label = f"components[{name!r}]"
        assert isinstance(part, kvcompat.KVPoolProtocol), at(case.id, None, f"{label} type")
        assert kvcompat.pool_kind(part) is part.kind, at(case.id, None, f"pool_kind({label})")
        assert part.layer_ids == tuple(sorted(layers)), at(
            case.id, None, f"{label}.layer_ids {part.layer_ids}, want {tuple(sorted(layers))}"
        )
        kinds = {kind for _, kind in layers.values()}
        assert {part.kind} == {KIND[k] for k in kinds}, at(
            case.id, None, f"{label}.kind {part.kind}"
        )
        for layer, (role, kind) in layers.items():
            s = storage[layer]
            tensor = s.key if role == "key" else s.extras[role]
            owner = native if kind != "index" else None
            dtype = expected_dtype(owner, tensor, as_stored=kind == "index")
            check_storage(
                part.get_key_buffer(layer, wait=False),
                tensor,
                dtype=dtype,
                what=at(case.id, layer, f"{label}.get_key_buffer"),
                where=s.where[role],
            )
            assert part.component_for(layer) == name, at(case.id, layer, f"{label}.component_for")
            if part.kind.has_values:
                pair = part.get_kv_buffer(layer, wait=False)
                assert pair.component == name, at(
                    case.id, layer, f"{label}.get_kv_buffer.component {pair.component!r}"
                )
        for layer in sorted(set(pool.layer_ids) - set(layers))[:3]:
            check_raises(
                partial(part.get_key_buffer, layer),
                kvcompat.LayerOutOfRangeError,
                what=at(case.id, layer, f"{label}.get_key_buffer (not its layer)"),
                contains=(f"valid layer ids are {ids_text(layers)}",),
            )
    for layer in case.layer_ids:
        primary = _primary(case, native, layer)
        assert pool.component_for(layer) == primary, at(
            case.id, layer, f"component_for {pool.component_for(layer)!r}, want {primary!r}"
        )
        assert pool.get_kv_buffer(layer).component == primary, at(
            case.id, layer, "get_kv_buffer().component"
        )
        assert pool.get_key_buffer(layer) is pool.components[primary].get_key_buffer(layer), at(
            case.id, layer, f"composite key is not components[{primary!r}]'s"
        )


@pytest.mark.parametrize("case", conformance_params(family="dsv4_token"))
def test_dsv4_components_agree_with_the_native_layer_routed_getters(case: PoolCase) -> None:
    """swa ~ get_swa_key_buffer_radix, c{ratio} ~ get_extra_key_buffer,
    c{ratio}_indexer ~ get_index_k_with_scale_buffer (the composite's own layer routing)."""
    native = case.build()
    pool = kvcompat.adapt(native)
    ratios = case.kwargs["compression_ratios"]
    expected = {"swa"} | {f"c{r}" for r in set(ratios) if r} | {"c4_indexer"}
    assert set(pool.components) == expected, at(case.id, None, f"{sorted(pool.components)}")
    native_getters = {
        "swa": native.get_swa_key_buffer_radix,
        "c4": native.get_extra_key_buffer,
        "c128": native.get_extra_key_buffer,
        "c4_indexer": native.get_index_k_with_scale_buffer,
    }
    for name, part in pool.components.items():
        getter = native_getters[name]
        for layer in part.layer_ids:
            want = getter(layer)
            dtype = want.dtype
            if name != "c4_indexer" and dsv4_single_getter_is_raw():
                dtype = FP8  # 0.5.12: the native getters return the uint8 storage itself
            check_storage(
                part.get_key_buffer(layer, wait=False),
                want,
                dtype=dtype,
                what=at(case.id, layer, f"components[{name!r}] vs native {getter.__name__}"),
                where=f"native {getter.__name__}({layer})",
            )


# -- the traps (numbered as in sglang-on-cpu.md and docs/supported-pools.md) ---------------

_ABS_START = b.OFFSET_KEY_BUILDERS


@pytest.mark.parametrize(("name", "build", "attr"), _ABS_START, ids=[c[0] for c in _ABS_START])
def test_trap1_ids_below_start_layer_raise(name: str, build: Callable[..., Any], attr: str) -> None:
    """Trap 1: an id below start_layer silently reads another layer natively; kvcompat raises."""
    for layer_num in (1, 2):
        native = build(start_layer=1, layer_num=layer_num)
        buffers = getattr(native, attr)
        served = {f"layer {1 + i}'s storage pool.{attr}[{i}]": t for i, t in enumerate(buffers)}
        # The trap is live: the native getter hands back a served layer's buffer for id 0.
        leaked = native.get_key_buffer(0)
        assert any(same_memory(leaked, t) for t in served.values()), (
            f"{name}: native get_key_buffer(0) no longer aliases a served layer"
        )
        pool = kvcompat.adapt(native)
        for getter in ("get_key_buffer", "get_value_buffer", "get_kv_buffer", "component_for"):
            what = at(f"{name}(start_layer=1, layer_num={layer_num})", 0, getter)
            result, exc = _call(partial(getattr(pool, getter), 0))
            if isinstance(result, tuple):
                result = result[0]
            whose = next(
                (
                    label
                    for label, t in served.items()
                    if isinstance(result, torch.Tensor) and same_memory(result, t)
                ),
                None,
            )
            assert whose is None, f"{what}: returned {whose} instead of raising"
            got = describe(result) if exc is None else repr(exc)
            assert isinstance(exc, kvcompat.LayerOutOfRangeError), (
                f"{what}: expected LayerOutOfRangeError, got {got}"
            )
            assert f"valid layer ids are {ids_text(range(1, 1 + layer_num))}" in str(exc), what


_STAGE_BUILDERS = b.STAGED_BUILDERS


@pytest.mark.parametrize(
    ("name", "build", "attr"), _STAGE_BUILDERS, ids=[c[0] for c in _STAGE_BUILDERS]
)
def test_trap2_end_layer_default_does_not_change_the_served_ids(
    name: str, build: Callable[..., Any], attr: str
) -> None:
    """Trap 2: end_layer defaults to layer_num - 1 whatever start_layer is; kvcompat serves
    start_layer .. start_layer + len(buffers) - 1 regardless."""
    for end_layer in (None, 0, b.STAGE_END):
        native = build(start_layer=2, layer_num=2, end_layer=end_layer)
        label = f"{name}(start_layer=2, layer_num=2, end_layer={end_layer!r})"
        if end_layer is not b.STAGE_END:
            assert native.end_layer == 1, f"{label}: native end_layer {native.end_layer}"
        pool = kvcompat.adapt(native)
        assert pool.layer_ids == (2, 3), f"{label}: layer_ids {pool.layer_ids}, want (2, 3)"
        for layer in (2, 3):
            raw = getattr(native, attr)[layer - 2]
            check_storage(
                pool.get_key_buffer(layer),
                raw,
                dtype=expected_dtype(native, raw, as_stored=name == "DeepSeekV4IndexerPool"),
                what=at(label, layer, "get_key_buffer"),
                where=f"pool.{attr}[{layer - 2}]",
            )
        for layer in (0, 1, 4):
            check_raises(
                partial(pool.get_key_buffer, layer),
                kvcompat.LayerOutOfRangeError,
                what=at(label, layer, "get_key_buffer"),
                contains=("valid layer ids are 2..3",),
            )


@pytest.mark.parametrize(
    ("build", "dtype"),
    [
        (b.build_dsv4_single_pool, FP8),
        (b.build_dsv4_single_pool, torch.uint8),
        (b.build_hisparse_c4_pool, FP8),
    ],
    ids=["DeepSeekV4SingleKVPool-fp8", "DeepSeekV4SingleKVPool-uint8", "HiSparseC4DevicePool-fp8"],
)
@pytest.mark.parametrize("start", [1, 2])
def test_trap3_dsv4_single_both_dtype_branches(
    build: Callable[..., Any], dtype: torch.dtype, start: int
) -> None:
    """Trap 3: the native getter subtracts start_layer only when store dtype != dtype;
    kvcompat maps layer l to kv_buffer[l - start_layer] in both branches."""
    kwargs: dict[str, Any] = {"start_layer": start, "layer_num": 2}
    if dtype is not FP8:
        kwargs["dtype"] = dtype
    native = build(**kwargs)
    label = f"{type(native).__name__}(dtype={dtype}, start_layer={start})"
    pool = kvcompat.adapt(native)
    others = {f"layer {start + i}'s pool.kv_buffer[{i}]": t for i, t in enumerate(native.kv_buffer)}
    for i, raw in enumerate(native.kv_buffer):
        layer = start + i
        what = at(label, layer, "get_key_buffer")
        got = pool.get_key_buffer(layer)
        check_storage(got, raw, dtype=dtype, what=what, where=f"pool.kv_buffer[{i}]", others=others)
        assert pool.get_value_buffer(layer) is got, f"{what}: value is not the key storage"
        native_result, exc = _call(partial(native.get_key_buffer, layer))
        if dtype is FP8 and not dsv4_single_getter_is_raw():
            check_storage(
                native_result,
                raw,
                dtype=FP8,
                what=f"{what} (native, fp8 branch)",
                where=f"pool.kv_buffer[{i}]",
            )
        else:
            # The raw-index branch (every dtype on 0.5.12): the native getter reads
            # kv_buffer[layer] -- another
            # layer's buffer, or off the end of the list.
            wrong = exc is not None or not same_memory(native_result, raw)
            assert wrong, f"{what}: the native uint8 branch now subtracts start_layer"
    # Below the stage: kvcompat raises; the native fp8 branch wraps to a served layer.
    check_raises(
        partial(pool.get_key_buffer, start - 1),
        kvcompat.LayerOutOfRangeError,
        what=at(label, start - 1, "get_key_buffer"),
    )


def test_trap3_uniform_fp8_raw_index_getter_and_writer() -> None:
    """Trap 3: DeepSeekV4UniformFP8KVPool's getter and writer take local ids; kvcompat's
    absolute id start + i sees what the native writer wrote with local id i."""
    start = 2
    native = b.build_dsv4_uniform_fp8_pool(start_layer=start, layer_num=2)
    pool = kvcompat.adapt(native)
    label = f"DeepSeekV4UniformFP8KVPool(start_layer={start})"
    check_raises(
        partial(native.get_key_buffer, start),
        IndexError,
        what=at(label, start, "native get_key_buffer (trap live)"),
    )
    rows = torch.linspace(-2, 2, 2 * 512).reshape(2, 512).to(BF16)
    loc = torch.tensor([3, 70])
    for local in (0, 1):
        native.set_key_buffer_fused(local, loc, rows * (local + 1))
    for local in (0, 1):
        layer = start + local
        got = pool.get_key_buffer(layer)
        check_storage(
            got,
            native.kv_buffer[local],
            dtype=FP8,
            what=at(label, layer, "get_key_buffer"),
            where=f"pool.kv_buffer[{local}]",
        )
        tokens = got.view(torch.uint8).view(-1, 512)[loc]
        want = (rows * (local + 1)).to(FP8).view(torch.uint8)
        assert torch.equal(tokens, want), at(
            label, layer, f"does not see set_key_buffer_fused({local}, ...) (local id {local})"
        )


def test_trap3_dsv4_indexer_raw_index_reader() -> None:
    """Trap 3 (indexer): get_index_k_with_scale_buffer takes local ids while the writers and
    the fp4 readers subtract start_layer; kvcompat's absolute ids agree with the latter."""
    start = 2
    native = b.build_dsv4_indexer_pool(use_fp4_indexer=True, start_layer=start, layer_num=2)
    pool = kvcompat.adapt(native)
    label = f"DeepSeekV4IndexerPool-fp4(start_layer={start})"
    for local in (0, 1):
        layer = start + local
        got = pool.get_key_buffer(layer)
        raw = native.index_k_with_scale_buffer[local]
        check_storage(
            got,
            raw,
            dtype=torch.uint8,
            what=at(label, layer, "get_key_buffer"),
            where=f"pool.index_k_with_scale_buffer[{local}]",
        )
        # The native raw-index reader, given the absolute id, misses (off the end).
        _, exc = _call(partial(native.get_index_k_with_scale_buffer, layer))
        assert isinstance(exc, IndexError), at(label, layer, "native raw reader (trap live)")
        # A payload byte written through kvcompat's buffer for `layer` is what the native
        # start-subtracting reader returns for the same absolute id.
        marker = 0x30 + local
        got[0, 5 * 64] = marker
        payload, _ = native.get_index_k_fp4(layer, torch.tensor([5]))
        assert int(payload.view(torch.uint8)[0, 0]) == marker, at(
            label, layer, "native get_index_k_fp4 does not read kvcompat's buffer for this id"
        )


def test_trap4_k_only_local_writer_absolute_getter() -> None:
    """Trap 4: MHATokenToKOnlyPool.set_k_buffer takes local ids, its getter absolute ids;
    kvcompat's key for absolute id start + i sees set_k_buffer(i, ...)."""
    start = 2
    native = b.build_k_only_pool(start_layer=start, layer_num=2)
    require_k_only_writer(native)
    pool = kvcompat.adapt(native)
    label = f"MHATokenToKOnlyPool(start_layer={start})"
    loc = torch.tensor([3, 17])
    for local in (0, 1):
        k = torch.full((2, b.HEAD_NUM, b.HEAD_DIM), float(local + 1), dtype=BF16)
        native.set_k_buffer(local, loc, k)
    for local in (0, 1):
        layer = start + local
        got = pool.get_key_buffer(layer)
        check_storage(
            got,
            native.k_buffer[local],
            dtype=BF16,
            what=at(label, layer, "get_key_buffer"),
            where=f"pool.k_buffer[{local}]",
        )
        assert torch.all(got[loc] == local + 1), at(
            label, layer, f"does not see set_k_buffer({local}, ...) (local id {local})"
        )
    for local in (0, 1):  # the local ids themselves are not layers of this stage
        check_raises(
            partial(pool.get_key_buffer, local),
            kvcompat.LayerOutOfRangeError,
            what=at(label, local, "get_key_buffer (a local id)"),
        )


def test_trap5_swa_start_layer_through_kwargs() -> None:
    """Trap 5: a start_layer leaked through SWAKVPool's **kwargs shifts both sub-pools'
    getters and writers, while the sub-pools' own metadata (``model_layer_ids``, used by HiCache
    and PD transfer descriptors) keeps the dense order: SGLang itself has no single right
    buffer per layer, so kvcompat refuses the pool instead of returning one of them.
    """
    native = b.build_swa_pool(sub_pool_kwargs={"start_layer": 1})
    assert (native.full_kv_pool.start_layer, native.swa_kv_pool.start_layer) == (1, 1)
    label = "SWAKVPool(sub-pool start_layer=1)"
    for layer, (dense, is_swa) in sorted(native.layers_mapping.items()):
        sub = native.swa_kv_pool if is_swa else native.full_kv_pool
        if "model_layer_ids" in vars(sub):  # 0.5.23 only: the transfer metadata
            assert sub.model_layer_ids[dense] == layer, (label, layer, sub.model_layer_ids)
        assert not same_memory(native.get_key_buffer(layer), sub.k_buffer[dense]), at(
            label, layer, "native getter no longer shifted: revisit the refusal"
        )
    with pytest.raises(kvcompat.UnsupportedPoolError) as info:
        kvcompat.adapt(native)
    message = str(info.value)
    assert "start_layer" in message, at(label, None, f"refusal does not say why: {message}")
    assert "Hint:" in message, at(label, None, f"refusal gives no hint: {message}")
    assert kvcompat.adapt(b.build_swa_pool()).layer_ids == (0, 1, 2, 3)


class _RenamedRefusal:
    """A foreign pool that raises SGLang's helpful message -- but is no SGLang class."""

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return torch.zeros(1)

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        msg = "Use get_key_buffer instead."
        raise NotImplementedError(msg)

    get_kv_buffer = get_value_buffer


def test_trap6_detected_by_class_never_by_message(sglang_session: SGLangSession) -> None:
    """Trap 6: only the DSv4 single family says "Use get_key_buffer instead."; kvcompat
    recognises pools by class (MRO), and never lets NotImplementedError escape a getter of a
    pool that has the storage."""
    d4 = sglang_session.deepseek_v4_memory_pool

    class QuietSingle(d4.DeepSeekV4SingleKVPool):  # type: ignore[misc, name-defined]
        """A subclass whose refusals say something else entirely."""

        def get_value_buffer(self, layer_id: int) -> torch.Tensor:
            raise NotImplementedError

        def get_kv_buffer(self, layer_id: int) -> Any:
            msg = "no"
            raise NotImplementedError(msg)

    native = QuietSingle(64, 64, FP8, 448, 64, 2, "cpu", False, start_layer=1, end_layer=3)
    assert kvcompat.is_single_kv_pool(native), "QuietSingle instance not single-KV"
    assert kvcompat.is_single_kv_pool(QuietSingle), "QuietSingle class not single-KV"
    pool = kvcompat.adapt(native)
    for i, raw in enumerate(native.kv_buffer):
        layer = 1 + i
        pair = pool.get_kv_buffer(layer)
        check_storage(
            pair.value,
            raw,
            dtype=FP8,
            what=at("QuietSingle", layer, "get_kv_buffer"),
            where=f"pool.kv_buffer[{i}]",
        )
        assert pair.shared, at("QuietSingle", layer, "pair.shared")
    # The message alone never makes a pool: a foreign class quoting it is not recognised.
    renamed: Any = _RenamedRefusal
    assert kvcompat.pool_kind(renamed()) is None
    assert not kvcompat.is_single_kv_pool(renamed)
    check_raises(
        partial(kvcompat.adapt, _RenamedRefusal()),
        kvcompat.UnsupportedPoolError,
        what="adapt(_RenamedRefusal())",
        contains=("_RenamedRefusal",),
    )
    # Bare NotImplementedError() natively (indexer, composite); kvcompat answers or explains.
    for case_id in ("DeepSeekV4IndexerPool-fp8-start2", "DeepSeekV4TokenToKVPool-start3"):
        case = next(c for c in CONFORMANCE_CASES if c.id == case_id)
        native = case.build()
        pool = kvcompat.adapt(native)
        for layer in case.layer_ids:
            _, native_exc = _call(partial(native.get_value_buffer, layer))
            assert type(native_exc) is NotImplementedError, at(case_id, layer, "native refusal")
            assert native_exc.args == (), at(case_id, layer, "native message appeared")
            key, exc = _call(partial(pool.get_key_buffer, layer))
            assert exc is None, at(case_id, layer, f"kvcompat get_key_buffer raised {exc!r}")
            assert isinstance(key, torch.Tensor), at(case_id, layer, "kvcompat get_key_buffer")
            value, exc = _call(partial(pool.get_value_buffer, layer))
            if pool.kind.has_values:
                assert exc is None, at(case_id, layer, f"kvcompat get_value_buffer raised {exc!r}")
                assert isinstance(value, torch.Tensor), at(case_id, layer, "get_value_buffer")
            else:
                assert isinstance(exc, kvcompat.NoValueBufferError), at(
                    case_id, layer, f"kvcompat get_value_buffer raised {exc!r}"
                )
                assert "get_key_buffer" in str(exc), at(case_id, layer, f"message {exc}")


# -- layer-transfer waits -------------------------------------------------------------------

_WAIT_FAMILIES = (
    "split",
    "key_only",
    "latent",
    "single",
    "index",
    "hybrid_linear",
    "swa",
    "dsv4_token",
)


def _native_waits(
    case: PoolCase, native: Any, getter: str, layer: int, counter: RecordingLayerCounter
) -> list[int]:
    counter.waits.clear()
    if case.family == "dsv4_token":
        fn: Callable[[int], Any] = native.get_swa_key_buffer_radix
    elif case.family == "index" and getter == "get_key_buffer":
        fn = native.get_index_k_with_scale_buffer
    else:
        fn = getattr(native, getter)
    _call(partial(fn, layer))
    return list(counter.waits)


def _kvcompat_waits(
    pool: Any, getter: str, layer: int, counter: RecordingLayerCounter, *, wait: bool = True
) -> list[int]:
    counter.waits.clear()
    _call(partial(getattr(pool, getter), layer, wait=wait))
    return list(counter.waits)


@pytest.mark.parametrize("case", conformance_params(families=_WAIT_FAMILIES))
def test_key_and_value_getters_wait_like_native(case: PoolCase) -> None:
    """Same wait indices, same count per call (the DSv4 composite: like
    get_swa_key_buffer_radix); get_kv_buffer at least on the same indices."""
    native = case.build()
    counter = RecordingLayerCounter()
    native.register_layer_transfer_counter(counter)
    pool = kvcompat.adapt(native)
    for layer in case.layer_ids:
        for getter in ("get_key_buffer", "get_value_buffer"):
            want = _native_waits(case, native, getter, layer, counter)
            got = _kvcompat_waits(pool, getter, layer, counter)
            assert got == want, at(case.id, layer, f"{getter} waited {got}, native waits {want}")
        want = _native_waits(case, native, "get_kv_buffer", layer, counter)
        got = _kvcompat_waits(pool, "get_kv_buffer", layer, counter)
        assert set(got) == set(want), at(
            case.id, layer, f"get_kv_buffer waited on {got}, native waits on {want}"
        )


@pytest.mark.parametrize("case", conformance_params())
def test_wait_false_never_waits(case: PoolCase) -> None:
    native = case.build()
    counter = RecordingLayerCounter()
    native.register_layer_transfer_counter(counter)
    pool = kvcompat.adapt(native)
    for part in (pool, *pool.components.values()):
        for layer in part.layer_ids:
            for getter in ("get_key_buffer", "get_value_buffer", "get_kv_buffer"):
                got = _kvcompat_waits(part, getter, layer, counter, wait=False)
                assert got == [], at(
                    case.id, layer, f"{part.name}.{getter}(wait=False) waited {got}"
                )


@pytest.mark.parametrize("case", conformance_params(family="dsv4_token"))
def test_dsv4_components_wait_like_the_native_layer_routed_getters(case: PoolCase) -> None:
    native = case.build()
    counter = RecordingLayerCounter()
    native.register_layer_transfer_counter(counter)
    pool = kvcompat.adapt(native)
    getters = {
        "swa": native.get_swa_key_buffer_radix,
        "c4": native.get_extra_key_buffer,
        "c128": native.get_extra_key_buffer,
        "c4_indexer": native.get_index_k_with_scale_buffer,
    }
    mismatches = []
    for name, part in pool.components.items():
        for layer in part.layer_ids:
            counter.waits.clear()
            getters[name](layer)
            want = list(counter.waits)
            got = _kvcompat_waits(part, "get_key_buffer", layer, counter)
            if got != want:
                mismatches.append(f"components[{name!r}] layer {layer}: {got} vs native {want}")
    assert not mismatches, at(case.id, None, "; ".join(mismatches))


def test_every_conformance_case_builds_a_distinct_configuration() -> None:
    ids = [case.id for case in CONFORMANCE_CASES]
    assert len(ids) == len(set(ids)), f"duplicate case ids: {sorted(ids)}"
    assert {case.family for case in CONFORMANCE_CASES} == set(KIND)
