"""Every KVCache class of SGLang 0.5.23 has an explicit answer: served, or refused (and why).

The table below is the wheel's transitive ``KVCache`` subclasses (an AST walk of
``sglang/srt``: module, class, direct bases). Each class is rebuilt here by *name* — a
``type()`` with the real module name, registered in ``sys.modules`` as a stand-in module —
so the registry's answer is checked without SGLang (and for NPU/MLX classes that cannot be
imported on this machine). ``test_table_is_the_installed_wheel`` proves the table is the
installed wheel's, so a class added by a new release fails here until it is classified.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import kvcompat
from kvcompat import PoolKind, _registry

_M = "sglang.srt.mem_cache."
_NPU = "sglang.srt.hardware_backend.npu."
S, L, K, C, V = (
    PoolKind.SPLIT,
    PoolKind.LATENT,
    PoolKind.KEY_ONLY,
    PoolKind.COMPOSITE,
    PoolKind.SINGLE_KV,
)

# (module, class, bases, status, detected kind)
#   status "ok": adapt() serves it under its own registration; "via": served by its direct
#   base's family, which lists it as a checked subclass; "no": refused with a reason;
#   "base": not a pool of its own (refused, with a reason).
ZOO: tuple[tuple[str, str, tuple[str, ...], str, PoolKind | None], ...] = (
    (_M + "memory_pool", "KVCache", (), "base", None),
    (_M + "base_swa_memory_pool", "BaseSWAKVPool", ("KVCache",), "base", None),
    (_M + "memory_pool", "MHATokenToKVPool", ("KVCache",), "ok", S),
    (_M + "memory_pool", "NoOpMHATokenToKVPool", ("MHATokenToKVPool",), "no", S),
    (_M + "memory_pool", "MHATokenToKVPoolFP4", ("MHATokenToKVPool",), "no", S),
    (_M + "memory_pool", "PageMajorMHATokenToKVPool", ("MHATokenToKVPool",), "no", S),
    (_M + "memory_pool", "MHATokenToKVPoolMXFP8", ("MHATokenToKVPool",), "no", S),
    (_M + "memory_pool", "MHATokenToKOnlyPool", ("KVCache",), "ok", K),
    (_M + "memory_pool", "MLATokenToKVPool", ("KVCache",), "ok", L),
    (_M + "memory_pool", "MLATokenToKVPoolFP4", ("MLATokenToKVPool",), "no", L),
    (_M + "memory_pool", "DSATokenToKVPool", ("MLATokenToKVPool",), "ok", L),
    (_M + "memory_pool", "HybridLinearKVPool", ("KVCache",), "ok", C),
    (_M + "memory_pool", "MiniMaxSparseKVPool", ("KVCache",), "no", C),
    (_M + "deepseek_v4_memory_pool", "DeepSeekV4SingleKVPool", ("KVCache",), "ok", V),
    (
        _M + "deepseek_v4_memory_pool",
        "DeepSeekV4UniformFP8KVPool",
        ("DeepSeekV4SingleKVPool",),
        "ok",
        V,
    ),
    (_M + "deepseek_v4_memory_pool", "HiSparseC4DevicePool", ("DeepSeekV4SingleKVPool",), "ok", V),
    (_M + "deepseek_v4_memory_pool", "DeepSeekV4IndexerPool", ("KVCache",), "ok", K),
    (_M + "deepseek_v4_memory_pool", "DeepSeekV4TokenToKVPool", ("BaseSWAKVPool",), "ok", C),
    (_M + "swa_memory_pool", "SWAKVPool", ("BaseSWAKVPool",), "ok", C),
    (_M + "hisparse_memory_pool", "HiSparseDSATokenToKVPool", ("DSATokenToKVPool",), "via", L),
    (_M + "hisparse_memory_pool", "HiSparseMHAMainPool", ("MHATokenToKVPool",), "via", S),
    (
        _M + "dsa_cache_layer_split",
        "LayerSplitDSATokenToKVPool",
        ("DSATokenToKVPool",),
        "no",
        L,
    ),
    (_M + "minimax_m3_nvfp4_pool", "MiniMaxM3Nvfp4IndexKPool", ("KVCache",), "no", K),
    (_M + "minimax_m3_nvfp4_pool", "MiniMaxM3Nvfp4MainKVPool", ("KVCache",), "no", S),
    (_M + "minimax_m3_nvfp4_pool", "MiniMaxM3Nvfp4KVPool", ("MiniMaxSparseKVPool",), "no", C),
    (
        _M + "page_interleave_pool",
        "PageInterleaveMHATokenToKVPool",
        ("PageInterleaveKVPoolMixin", "MHATokenToKVPool"),
        "no",
        S,
    ),
    (
        _M + "page_interleave_pool",
        "PageInterleaveMLATokenToKVPool",
        ("PageInterleaveKVPoolMixin", "MLATokenToKVPool"),
        "no",
        L,
    ),
    (
        _M + "page_interleave_pool",
        "PageInterleaveDSATokenToKVPool",
        ("PageInterleaveMLATokenToKVPool", "DSATokenToKVPool"),
        "no",
        L,
    ),
    (_M + "qsa_kv_pool", "QSATokenToKVPool", ("HybridLinearKVPool",), "via", C),
    (_M + "unified_draft_pool", "UnifiedDraftKVPool", ("MHATokenToKVPool",), "via", S),
    (_M + "unified_draft_pool", "UnifiedDraftSWAKVPool", ("SWAKVPool",), "via", C),
    (_M + "unified_memory_pool", "UnifiedHybridLinearKVPool", ("HybridLinearKVPool",), "via", C),
    (_M + "unified_memory_pool", "UnifiedMHATokenToKVPool", ("MHATokenToKVPool",), "via", S),
    (_M + "unified_memory_pool", "UnifiedMLATokenToKVPool", ("MLATokenToKVPool",), "via", L),
    (_M + "unified_memory_pool", "UnifiedSWAKVPool", ("SWAKVPool",), "via", C),
    (_NPU + "memory_pool_npu", "NPUMHATokenToKVPool", ("MHATokenToKVPool",), "no", S),
    (_NPU + "memory_pool_npu", "NPUMHATokenToKOnlyPool", ("MHATokenToKOnlyPool",), "no", K),
    (_NPU + "memory_pool_npu", "NPUMLATokenToKVPool", ("MLATokenToKVPool",), "no", S),
    (_NPU + "memory_pool_npu", "NPUMiniMaxSparseKVPool", ("MiniMaxSparseKVPool",), "no", C),
    (
        _NPU + "dsv4.dsv4_memory_pool",
        "NPUDeepSeekV4SingleKVPool",
        ("DeepSeekV4SingleKVPool",),
        "no",
        V,
    ),
    (
        _NPU + "dsv4.dsv4_memory_pool",
        "NPUDeepSeekV4IndexerPool",
        ("DeepSeekV4IndexerPool",),
        "no",
        K,
    ),
    (
        _NPU + "dsv4.dsv4_memory_pool",
        "DSV4NPUTokenToKVPool",
        ("DeepSeekV4TokenToKVPool",),
        "no",
        C,
    ),
    (
        "sglang.srt.hardware_backend.mlx.model_runner_stub",
        "_DummyKVCache",
        ("KVCache",),
        "no",
        None,
    ),
)

_MIXINS = {"PageInterleaveKVPoolMixin": _M + "page_interleave_pool"}


@pytest.fixture(scope="module")
def zoo() -> Iterator[dict[str, type]]:
    """The zoo rebuilt by name: classes whose modules are stand-ins named like SGLang's."""
    modules: dict[str, types.ModuleType] = {}
    classes: dict[str, type] = {}

    def make(module: str, name: str, bases: tuple[str, ...]) -> type:
        cls = types.new_class(name, tuple(classes[b] for b in bases))
        cls.__module__ = module
        mod = modules.setdefault(module, types.ModuleType(module))
        setattr(mod, name, cls)
        classes[name] = cls
        return cls

    for name, module in _MIXINS.items():
        make(module, name, ())
    for module, name, bases, _, _ in ZOO:
        make(module, name, bases)
    # Stand-in modules only where the real one is not imported (then the doubles are
    # recognised by class name, as a moved module would be).
    added = [name for name in modules if name not in sys.modules]
    sys.modules.update({name: modules[name] for name in added})
    _registry._cache.clear()
    try:
        yield classes
    finally:
        for name in added:
            sys.modules.pop(name, None)
        _registry._cache.clear()


@pytest.mark.parametrize(("module", "name", "status", "kind"), [z[:2] + z[3:] for z in ZOO])
def test_every_class_has_an_explicit_answer(
    zoo: dict[str, type], module: str, name: str, status: str, kind: PoolKind | None
) -> None:
    cls = zoo[name]
    family = _registry.family_of(cls)
    assert family is not None, name
    if status == "via":  # listed by its base's family as keeping the base's storage
        assert name in family.subclasses, (name, family.qualname)
        assert family.qualname.rsplit(".", 1)[1] == cls.__bases__[0].__name__
    else:  # registered under its own name: not answered only through a base class
        assert family.qualname == f"{module}.{name}", (name, family.qualname)
    assert kvcompat.pool_kind(cls) is kind
    assert kvcompat.is_supported_pool(cls) is (status in ("ok", "via"))
    if status not in ("ok", "via"):
        assert family.reason, name
        instance = object.__new__(cls)
        with pytest.raises(kvcompat.UnsupportedPoolError, match="does not support it") as info:
            kvcompat.adapt(instance)
        assert family.reason in str(info.value)


def test_npu_detectors_answer_from_names(zoo: dict[str, type]) -> None:
    single = zoo["NPUDeepSeekV4SingleKVPool"]
    assert kvcompat.is_single_kv_pool(single)
    assert kvcompat.pool_kind(single) is PoolKind.SINGLE_KV
    assert kvcompat.is_key_only_pool(zoo["NPUDeepSeekV4IndexerPool"])
    assert kvcompat.is_composite_pool(zoo["DSV4NPUTokenToKVPool"])
    assert not kvcompat.is_supported_pool(single)


def test_mxfp8_is_refused_with_the_scales_named(zoo: dict[str, type]) -> None:
    with pytest.raises(kvcompat.UnsupportedPoolError, match="UE8M0 scale per 32") as info:
        kvcompat.adapt(object.__new__(zoo["MHATokenToKVPoolMXFP8"]))
    assert "MHATokenToKVPoolMXFP8" in str(info.value)


def test_an_unlisted_engine_subclass_of_a_supported_class_is_refused(
    zoo: dict[str, type],
) -> None:
    # A future release adds a quantized variant: it must not be served as its base.
    where = _M + "kvcompat_future_pool"  # a stand-in module of a release not yet seen
    holder = types.ModuleType(where)
    future = types.new_class("MHATokenToKVPoolNVFP8", (zoo["MHATokenToKVPool"],))
    future.__module__ = where
    holder.MHATokenToKVPoolNVFP8 = future  # type: ignore[attr-defined]
    sys.modules[where] = holder
    try:
        family = _registry.family_of(future)
        assert family is not None
        assert family.kind is None
        assert kvcompat.pool_kind(future) is PoolKind.SPLIT  # detectors still say what it is
        with pytest.raises(kvcompat.UnsupportedPoolError, match="has not checked this subclass"):
            kvcompat.adapt(object.__new__(future))
        # A user's own subclass (a test double, an instrumented pool) inherits the family.
        mine = types.new_class("InstrumentedMHA", (zoo["MHATokenToKVPool"],))
        assert kvcompat.is_supported_pool(mine)
        # Registering the engine subclass as one that keeps its base's storage serves it.
        kvcompat.register_adapter(
            f"{where}.MHATokenToKVPoolNVFP8", f"{_M}memory_pool.MHATokenToKVPool"
        )
        try:
            assert kvcompat.is_supported_pool(future)
        finally:
            kvcompat.unregister_adapter(f"{where}.MHATokenToKVPoolNVFP8")
    finally:
        sys.modules.pop(where, None)
        _registry._cache.clear()


def test_every_refusal_reason_is_on_the_supported_pools_page() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs"))
    try:
        import _gen
    finally:
        sys.path.pop(0)
    table = _gen.supported_table()
    from kvcompat.adapters.sglang import SGLANG_CLASSES

    for family in SGLANG_CLASSES:
        assert family.qualname.rsplit(".", 1)[1] in table
        if family.reason:
            assert family.reason.replace("|", "\\|") in table, family.qualname


def _wheel_root() -> Path | None:
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def _kvcache_classes(root: Path) -> set[tuple[str, str]]:
    """(module, class) of every transitive KVCache subclass, by an AST walk of ``srt/``."""
    found: dict[str, list[tuple[str, list[str]]]] = {}
    for path in (root / "srt").rglob("*.py"):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        module = "sglang." + ".".join(path.relative_to(root).with_suffix("").parts)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
                found.setdefault(node.name, []).append((module, bases))
    names = {"KVCache"}
    grew = True
    while grew:
        grew = False
        for name, defs in found.items():
            if name not in names and any(b in names for _, bases in defs for b in bases):
                names.add(name)
                grew = True
    return {(module, name) for name in names for module, _ in found.get(name, [])}


@pytest.mark.sglang
def test_table_is_the_installed_wheel() -> None:
    root = _wheel_root()
    if root is None:
        pytest.skip("sglang is not installed")
    assert _kvcache_classes(root) == {(module, name) for module, name, *_ in ZOO}
