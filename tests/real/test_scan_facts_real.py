"""The pool facts ``kvcompat scan``'s class probes rest on, checked on SGLang's own classes.

``kvcompat/_scan/_probes.py`` treats ``getattr(pool, "kv_cache_layout", d) == c`` (and the
other attributes of ``MHA_ONLY_ATTRIBUTES``) as proof that ``pool`` is an MHA pool, and
``isinstance(pool, C)`` for ``POSITIVE_CLASSES`` as proof that the accesses of those
rules work on it. ``kvcompat/_scan/_families.py`` takes a constructor that refuses every
configuration but one family's config class as proof that no DeepSeek-V4 model gets
there, and a key-only pool for a sub-pool no model code is handed. All are facts about
the installed release; a release that gives one of those attributes to another pool
class, breaks a method on one of those classes, registers a DeepSeek-V4 configuration
class that a family check could name, or hands out a key-only pool, fails here.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from _sglang.cases import POOL_CASES, PoolCase, case_params
from _sglang.features import require

from kvcompat._scan._families import CONFIG_BASES, admits_deepseek_v4
from kvcompat._scan._probes import MHA_ONLY_ATTRIBUTES, POSITIVE_CLASSES
from kvcompat.inspection._cli import find_kvcache_classes

if TYPE_CHECKING:
    from collections.abc import Iterator


def _sglang_root() -> Path:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None
    assert spec.origin is not None
    return Path(spec.origin).parent


def _parse(text: str) -> ast.Module:
    """``ast.parse`` without the warnings SGLang's own invalid escapes raise."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(text)


@functools.cache
def _module(module: str) -> ast.Module | None:
    """The parsed source of an installed ``sglang...`` module, or None if it has none."""
    base = _sglang_root().parent.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return _parse(path.read_text(encoding="utf-8"))
    return None


def _assigned_on_self(qualname: str, attrs: frozenset[str]) -> set[str]:
    """The attributes of ``attrs`` that class ``qualname`` assigns.

    Both ``self.<a> = …`` in its methods and ``<a> = …`` in its body count.
    """
    module, _, name = qualname.rpartition(".")
    tree = _module(module)
    found: set[str] = set()
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)] if tree else []
    for cls in (c for c in classes if c.name == name):
        for stmt in cls.body:
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                found.update(t.id for t in targets if isinstance(t, ast.Name) and t.id in attrs)
        for node in ast.walk(cls):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [node.target]
            found.update(
                t.attr
                for t in targets
                if isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
                and t.attr in attrs
            )
    return found


def test_only_mha_pools_set_the_mha_only_attributes() -> None:
    # The pool classes and their bases come from kvcompat's own finder (kvcompat doctor's);
    # a base that is no pool class (a mixin) counts as part of the class it is mixed into.
    pools = {c.qualname: c.bases for c in find_kvcache_classes(_sglang_root())}

    def ancestry(qualname: str) -> set[str]:
        seen: set[str] = set()
        todo = [qualname]
        while todo:
            current = todo.pop()
            if current not in seen:
                seen.add(current)
                todo.extend(pools.get(current, ()))
        return seen

    def is_mha(qualname: str) -> bool:
        return any(q.rsplit(".", 1)[-1] == "MHATokenToKVPool" for q in ancestry(qualname))

    setting = {
        qualname: sorted(
            attr
            for part in (qualname, *(b for b in ancestry(qualname) if b not in pools))
            for attr in _assigned_on_self(part, MHA_ONLY_ATTRIBUTES)
        )
        for qualname in pools
    }
    setting = {qualname: attrs for qualname, attrs in setting.items() if attrs}
    offenders = {q: attrs for q, attrs in setting.items() if not is_mha(q)}
    assert offenders == {}, f"pool classes outside MHATokenToKVPool set {offenders}"
    # Not vacuous where it matters: a release whose MHA pool sets none of them (0.5.12)
    # gives the probe nothing to name, and the scanner nothing to trust.
    require(setting, f"an MHA pool attribute among {sorted(MHA_ONLY_ATTRIBUTES)}")


@pytest.mark.parametrize("case", case_params())
def test_the_attributes_appear_only_on_mha_pool_objects(case: PoolCase) -> None:
    pool = case.build()
    mha = any(klass.__name__ == "MHATokenToKVPool" for klass in type(pool).__mro__)
    present = sorted(attr for attr in MHA_ONLY_ATTRIBUTES if hasattr(pool, attr))
    assert mha or not present, f"{case.id}: a non-MHA pool has {present}"


_POSITIVE_CASES = [case for case in POOL_CASES if case.cls_name in POSITIVE_CLASSES]


def test_every_positive_class_has_cases() -> None:
    assert {case.cls_name for case in _POSITIVE_CASES} == set(POSITIVE_CLASSES)


@pytest.mark.parametrize("case", case_params(_POSITIVE_CASES))
def test_the_accesses_a_positive_class_promises_work(case: PoolCase) -> None:
    # set_kv_buffer (KVC003) on these classes is tests/real/test_native_facts.py's
    # test_set_kv_buffer; the reads are checked here, on every served layer.
    pool = case.build()
    codes = POSITIVE_CLASSES[case.cls_name]
    assert "KVC003" in codes
    for layer in case.layers:
        if "KVC001" in codes:
            assert isinstance(pool.get_value_buffer(layer), torch.Tensor)
        if "KVC002" in codes:
            k, v = pool.get_kv_buffer(layer)
            assert isinstance(k, torch.Tensor)
            assert isinstance(v, torch.Tensor)
        if "KVC006" in codes:  # token rows [slots, heads, dim], not packed uint8 pages
            key = pool.get_key_buffer(layer)
            assert key.dim() == 3, (case.id, layer, key.shape)
            assert key.dtype != torch.uint8, (case.id, layer, key.dtype)
        if "KVC004" in codes:
            assert isinstance(pool.k_buffer, list)
            assert isinstance(pool.v_buffer, list)
    if "KVC007" in codes:
        require(hasattr(pool, "get_kv_buffer_shape"), "get_kv_buffer_shape")
        pool.get_kv_buffer_shape()


def test_swa_pools_past_layer_zero_break_get_kv_buffer_shape() -> None:
    # Why SWAKVPool does not promise KVC007: its shape helper asks for layer
    # start_layer, which its layer mapping does not hold when the pool starts later.
    cases = [c for c in POOL_CASES if c.cls_name == "SWAKVPool" and min(c.layers) > 0]
    assert cases, "no SWAKVPool case starts past layer 0"
    pool = cases[0].build()
    require(hasattr(pool, "get_kv_buffer_shape"), "get_kv_buffer_shape")
    with pytest.raises(KeyError):
        pool.get_kv_buffer_shape()


def _deepseek_v4_config_classes() -> dict[str, list[str]]:
    """SGLang's configuration classes for DeepSeek-V4's model types, with their bases.

    A class counts when its body sets ``model_type`` to ``"deepseek_v4..."`` (V4, V4.1,
    V4.1 text); its bases are the names it is written with, import aliases undone
    (``from transformers import DeepseekV3Config as _HFDeepseekV3Config``).
    """
    root = _sglang_root() / "srt"
    found: dict[str, list[str]] = {}
    for path in (*root.joinpath("configs").glob("*.py"), *root.joinpath("utils").rglob("*.py")):
        tree = _parse(path.read_text(encoding="utf-8"))
        imported_as = {
            alias.asname: alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
            if alias.asname
        }
        for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
            for stmt in cls.body:
                target = stmt.targets[0] if isinstance(stmt, ast.Assign) else None
                if isinstance(stmt, ast.AnnAssign):
                    target = stmt.target
                value = getattr(stmt, "value", None)
                if (
                    isinstance(target, ast.Name)
                    and target.id == "model_type"
                    and isinstance(value, ast.Constant)
                    and str(value.value).startswith("deepseek_v4")
                ):
                    written = (ast.unparse(base).rpartition(".")[2] for base in cls.bases)
                    found[cls.name] = [imported_as.get(name, name) for name in written]
    return found


def test_no_family_check_admits_a_deepseek_v4_configuration() -> None:
    transformers = pytest.importorskip("transformers")
    classes = _deepseek_v4_config_classes()
    require(classes, "a DeepSeek-V4 configuration class")
    names = set(classes)
    for bases in classes.values():
        for base in bases:
            upstream = getattr(transformers, base, None)
            mro = upstream.__mro__ if isinstance(upstream, type) else ()
            names.update([base, *(cls.__name__ for cls in mro)])
    # Every class a DeepSeek-V4 configuration is an instance of must read as admitting
    # it, or a constructor checking for that class would be taken for a family's.
    assert sorted(name for name in names if not admits_deepseek_v4(name)) == []
    assert names & CONFIG_BASES, sorted(names)  # the bases were followed to the generic one


def _k_only_constructions(tree: ast.AST) -> Iterator[tuple[ast.Call, bool]]:
    """Each ``MHATokenToKOnlyPool(...)`` call, and whether a pool class's own code makes it."""
    in_pool: set[ast.AST] = set()
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef) and cls.name.endswith("Pool"):
            in_pool.update(ast.walk(cls))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("MHATokenToKOnlyPool"):
            yield node, node in in_pool


def test_key_only_pools_are_only_built_as_sub_pools() -> None:
    # MHATokenToKOnlyPool is built by the pool that holds it: passed as a class
    # (index_k_pool_cls=...) from 0.5.18, constructed in MiniMaxSparseKVPool's own
    # __init__ in 0.5.15-0.5.17. Nothing outside SGLang's tests and its pool classes
    # constructs one to hand to model code.
    root = _sglang_root()
    calls = []
    for path in root.rglob("*.py"):
        relative = path.relative_to(root).as_posix()
        if relative.startswith("test/") or path.name.startswith("test_"):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if "MHATokenToKOnlyPool(" not in text:
            continue
        pool_module = relative.startswith("srt/mem_cache/")
        calls.extend(
            f"{relative}:{node.lineno}"
            for node, by_a_pool in _k_only_constructions(_parse(text))
            if not (pool_module and by_a_pool)
        )
    assert calls == []
