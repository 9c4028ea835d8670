"""The tier's process set-up does what sglang-on-cpu.md prescribes, and only that."""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import release_matrix
from _sglang.env import SGLangSession, prepare_sglang
from _sglang.features import release

SURVEYED_RELEASES = release_matrix.RELEASES
"""Releases whose pool API this tier was surveyed against (shared/reference/sglang-releases.md):
the release matrix's, which runs the tier under each."""


def test_sglang_version_is_the_surveyed_one(sglang_session: SGLangSession) -> None:
    # Every native fact in this tier was read from (and measured on) these releases; where they
    # differ the tests ask the installed classes. Another version must fail here first, with
    # the instruction, before the facts fail one by one.
    assert sglang_session.sglang_version in SURVEYED_RELEASES, (
        f"installed sglang is {sglang_session.sglang_version}, the tier was surveyed on "
        f"{SURVEYED_RELEASES}: re-survey shared/reference/sglang-releases.md and update "
        "tests/real/test_native_facts.py"
    )
    assert sglang_session.sglang_version == release(), "the metadata names another release"


def test_prepare_is_idempotent(sglang_session: SGLangSession) -> None:
    assert prepare_sglang() is sglang_session
    shims = [f for f in sys.meta_path if type(f).__module__ == "kvcompat.testing._sglang_cpu"]
    assert len(shims) <= 1, "the torchvision shim was put on sys.meta_path twice"


def test_caches_point_at_a_private_temp_folder(sglang_session: SGLangSession) -> None:
    assert sglang_session.cache_dir.is_dir()
    for name in ("SGLANG_CACHE_DIR", "SGLANG_JIT_CACHE_DIR"):
        assert os.environ.get(name) == str(sglang_session.cache_dir), name
    assert "SGLANG_USE_CPU_ENGINE" not in os.environ


def test_runtime_config_is_published(sglang_session: SGLangSession) -> None:
    context = sglang_session.runtime_context
    assert sglang_session.config_installed
    if context is not None and hasattr(type(context.get_parallel()), "attn_dcp_rank"):
        assert context.get_parallel().attn_dcp_rank == 0
    if context is None or not hasattr(context.get_context(), "override_server_args"):
        # 0.5.12-0.5.15: a dummy ServerArgs published globally
        server_args = importlib.import_module("sglang.srt.server_args")
        assert server_args.get_global_server_args().device == "cpu"
        return
    if not hasattr(context, "get_device"):  # the published ServerArgs carries the field
        assert context.get_server_args().device == "cpu"
        return
    # The override is declared, then projected into the config bags at publish time; the
    # raw ServerArgs field keeps its None.
    assert context.get_device().device == "cpu"
    assert context.get_context().resolved_server_args_dict()["device"] == "cpu"


def test_pool_modules_were_imported_from_the_wheel(sglang_session: SGLangSession) -> None:
    for module in (
        sglang_session.memory_pool,
        sglang_session.swa_memory_pool,
        sglang_session.deepseek_v4_memory_pool,
    ):
        # The test venv's wheel, or a release matrix overlay (pip --target) on top of it.
        where = str(module.__file__)
        assert "site-packages" in where or ".sglang-releases" in where, where
    # The measured one-off import (README quotes it); a cached second prepare is free.
    assert sglang_session.import_seconds > 0


def test_torchvision_is_the_shim_only_when_no_real_one_works(
    sglang_session: SGLangSession,
) -> None:
    tv = sys.modules["torchvision"]
    from_shim = tv.__version__.endswith("+kvcompat.shim")
    assert from_shim == sglang_session.torchvision_stubbed
    if not from_shim:
        pytest.skip("a real torchvision is installed; the shim is not in use")
    assert "kvcompat.testing.sglang_cpu" in str(tv.__spec__.origin)


@pytest.mark.parametrize(
    "module_name",
    [
        "torchvision",
        "torchvision.io",
        "torchvision.transforms",
        "torchvision.transforms.functional",
        "torchvision.transforms.v2",
        "torchvision.transforms.v2.functional",
    ],
)
def test_shim_modules(sglang_session: SGLangSession, module_name: str) -> None:
    if not sglang_session.torchvision_stubbed:
        pytest.skip("a real torchvision is installed; the shim is not in use")
    module = importlib.import_module(module_name)
    assert module.__version__ == "0.28.0+kvcompat.shim"
    modes = {m.name for m in module.InterpolationMode}
    assert modes == {
        "NEAREST",
        "NEAREST_EXACT",
        "BILINEAR",
        "BICUBIC",
        "BOX",
        "HAMMING",
        "LANCZOS",
    }
    placeholder = module.AnyNameAtAll
    assert isinstance(placeholder, type)
    assert module.AnyNameAtAll is placeholder, "one placeholder class per name"
    with pytest.raises(RuntimeError, match=rf"{module_name}\.AnyNameAtAll is a placeholder"):
        placeholder(1, key="value")()
    # Dunder probes (import machinery, inspect, pkgutil) must see an ordinary module.
    assert not hasattr(module, "__wrapped__")
    if module_name in ("torchvision.io", "torchvision.transforms.functional"):
        assert not hasattr(module, "__path__"), f"{module_name} must not look like a package"
