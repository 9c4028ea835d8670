"""The pool facts ``kvcompat scan``'s class probes rest on, checked on SGLang's own classes.

``kvcompat/_scan/_probes.py`` treats ``getattr(pool, "kv_cache_layout", d) == c`` (and the
other attributes of ``MHA_ONLY_ATTRIBUTES``) as proof that ``pool`` is an MHA pool, and
``isinstance(pool, C)`` for ``POSITIVE_CLASSES`` as proof that the accesses of those
rules work on it. Both are facts about the installed release; a release that gives one of
those attributes to another pool class, or breaks a method on one of those classes, fails
here.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from _sglang.cases import POOL_CASES, PoolCase, case_params
from _sglang.features import require

from kvcompat._scan._probes import MHA_ONLY_ATTRIBUTES, POSITIVE_CLASSES


def _srt() -> Path:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None
    assert spec.origin is not None
    return Path(spec.origin).parent / "srt"


@functools.cache
def _pool_modules() -> tuple[ast.Module, ...]:
    """The modules of the installed ``sglang/srt`` that can define a pool class.

    A ``KVCache`` subclass names a base that is a pool class, and every pool class's
    name has ``Pool`` or ``KVCache`` in it (tests/core/test_pool_zoo.py lists them), so
    the other files are not parsed.
    """
    trees = []
    for path in _srt().rglob("*.py"):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if "class " not in text or not ("Pool" in text or "KVCache" in text):
            continue
        try:
            trees.append(ast.parse(text))
        except SyntaxError:
            continue
    return tuple(trees)


def _classes() -> Iterator[ast.ClassDef]:
    """Every class definition of those modules."""
    for tree in _pool_modules():
        yield from (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef))


def _classes_setting(attrs: frozenset[str]) -> dict[str, set[str]]:
    """class name -> the attributes of ``attrs`` its body or methods assign on ``self``."""
    setting: dict[str, set[str]] = {}
    for cls in _classes():
        for node in ast.walk(cls):
            target = node.target if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else None
            targets = node.targets if isinstance(node, ast.Assign) else [target]
            for t in targets:
                if (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                    and t.attr in attrs
                ):
                    setting.setdefault(cls.name, set()).add(t.attr)
    return setting


def _bases() -> dict[str, set[str]]:
    """class name -> the names of its direct bases, over every module of ``srt``."""
    bases: dict[str, set[str]] = {}
    for cls in _classes():
        names = {ast.unparse(base).rsplit(".", 1)[-1] for base in cls.bases}
        bases.setdefault(cls.name, set()).update(names)
    return bases


def _descends(name: str, ancestor: str, bases: dict[str, set[str]]) -> bool:
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        if current == ancestor:
            return True
        if current not in seen:
            seen.add(current)
            todo.extend(bases.get(current, ()))
    return False


def test_only_mha_pools_set_the_mha_only_attributes() -> None:
    bases = _bases()
    pools = {name for name in bases if _descends(name, "KVCache", bases)}
    setting = _classes_setting(MHA_ONLY_ATTRIBUTES)
    offenders = {
        name: sorted(attrs)
        for name, attrs in setting.items()
        if name in pools and not _descends(name, "MHATokenToKVPool", bases)
    }
    assert offenders == {}, f"pool classes outside MHATokenToKVPool set {offenders}"
    # Not vacuous where it matters: a release whose MHA pool sets none of them (0.5.12)
    # gives the probe nothing to name, and the scanner nothing to trust.
    require(
        any(_descends(name, "MHATokenToKVPool", bases) for name in setting),
        f"an MHA pool attribute among {sorted(MHA_ONLY_ATTRIBUTES)}",
    )


@pytest.mark.parametrize("case", case_params())
def test_the_attributes_appear_only_on_mha_pool_objects(case: PoolCase) -> None:
    pool = case.build()
    mha = any(klass.__name__ == "MHATokenToKVPool" for klass in type(pool).__mro__)
    present = sorted(attr for attr in MHA_ONLY_ATTRIBUTES if hasattr(pool, attr))
    assert mha or not present, f"{case.id}: a non-MHA pool has {present}"


def _positive_codes(cls_name: str) -> frozenset[str] | None:
    return POSITIVE_CLASSES.get(cls_name)


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
