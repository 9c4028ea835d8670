"""The zoo table of ``tests/core/test_pool_zoo.py``, checked on SGLang's own classes.

Every module of the table that imports on this machine is imported; each real class must
get the table's answer under its own registration. NPU and MLX modules need their
hardware stacks and do not import here: the core test checks them by name.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from _sglang.features import pool_class, require

import kvcompat
from kvcompat import _registry


def _zoo_table() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "core" / "test_pool_zoo.py"
    spec = importlib.util.spec_from_file_location("_kvcompat_zoo_table", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ZOO = _zoo_table().ZOO


def _importable(module: str) -> ModuleType | None:
    try:
        return importlib.import_module(module)
    except Exception:
        return None


def _module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def test_real_classes_get_the_tables_answer() -> None:
    # The table is 0.5.23's class list; an older release is checked on the classes it has,
    # and the rows it lacks end the test as a capability skip that names them.
    checked = 0
    lacking: list[str] = []
    for module, name, _, status, kind in ZOO:
        loaded = _importable(module)
        if loaded is None and not _module_exists(module):
            lacking.append(module)  # a module this release does not ship
            continue
        if loaded is None:
            assert module.startswith(("sglang.srt.hardware_backend.",)), module
            continue
        cls = getattr(loaded, name, None)
        if not isinstance(cls, type):
            lacking.append(f"{module}.{name}")
            continue
        family = _registry.family_of(cls)
        assert family is not None, name
        if status == "via":
            assert name in family.subclasses, name
        else:
            assert family.qualname == f"{module}.{name}", name
        assert kvcompat.pool_kind(cls) is kind, name
        assert kvcompat.is_supported_pool(cls) is (status in ("ok", "via")), name
        checked += 1
    assert checked + len(lacking) >= 30
    assert checked >= 10, lacking
    require(not lacking, ", ".join(dict.fromkeys(lacking)))


@pytest.mark.parametrize("name", ["MHATokenToKVPoolMXFP8", "MHATokenToKVPoolFP4"])
def test_quantized_mha_pools_are_refused_not_read_as_plain_fp8(name: str) -> None:
    cls = pool_class(name)  # ReleaseLacks where the release has no such class
    with pytest.raises(kvcompat.UnsupportedPoolError, match="does not support it"):
        kvcompat.adapt(object.__new__(cls))
