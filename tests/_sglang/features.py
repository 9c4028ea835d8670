"""What the installed SGLang release has, asked of its classes (not of its version string).

The real tier runs on every SGLang release with DeepSeek-V4 pools (0.5.12 to 0.5.23; see
``shared/reference/sglang-releases.md`` for what differs). Each test that needs something a
release does not ship asks for it here; a missing class, constructor parameter, attribute or
method raises :class:`ReleaseLacks`, a pytest *skip* whose reason starts with
:data:`SKIP_PREFIX` and names the release and the missing feature. The release matrix
(``tests/release_matrix.py``) counts those skips per release.

Typical use::

    cls = pool_class("MHATokenToKOnlyPool")      # ReleaseLacks on 0.5.12-0.5.14
    if accepts(cls, "kv_layout"): ...            # constructor parameter probe
    require(has_method(pool, "get_c128_state_buf_infos"), "get_c128_state_buf_infos")

Nothing here imports sglang at import time; :func:`pool_class` goes through
:func:`~_sglang.env.prepare_sglang`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from _sglang import places as _places
from _sglang.env import prepare_sglang

__all__ = [
    "SKIP_PREFIX",
    "ReleaseLacks",
    "accepts",
    "declared_kv_layouts",
    "fp4_indexer_store",
    "has_class",
    "jit_dir",
    "pool_class",
    "release",
    "require",
    "require_k_only_writer",
    "require_kv_layout",
    "sglang_code",
    "sglang_place",
]

SKIP_PREFIX: Final = "release lacks:"
"""Every capability skip's reason starts with this (the matrix counts them by it)."""


@functools.cache
def release() -> str:
    """The installed ``sglang`` distribution's version, from its metadata (no import).

    With an overlay (``PYTHONPATH=.sglang-releases/X``) the overlay's ``dist-info`` comes
    first on ``sys.path``, so this names the release actually imported.
    """
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return "not-installed"


class ReleaseLacks(pytest.skip.Exception):  # type: ignore[name-defined, misc]
    """The installed SGLang release does not have ``feature``: skip, naming it.

    Attributes:
        feature: what is missing, e.g. ``"MHATokenToKOnlyPool"`` or
            ``"DeepSeekV4IndexerPool(use_fp4_indexer=...)"``.
    """

    def __init__(self, feature: str, wanted: str = "") -> None:  # wanted: what asked for it
        self.feature = feature
        detail = f" ({wanted})" if wanted else ""
        super().__init__(f"{SKIP_PREFIX} SGLang {release()} has no {feature}{detail}")


_CLASS_MODULES: Final = ("memory_pool", "swa_memory_pool", "deepseek_v4_memory_pool")


def has_class(name: str) -> bool:
    """Whether one of the pool modules defines a class ``name``."""
    session = prepare_sglang()
    return any(isinstance(getattr(getattr(session, m), name, None), type) for m in _CLASS_MODULES)


def pool_class(name: str) -> Any:
    """The installed release's pool class ``name``, or :class:`ReleaseLacks`."""
    session = prepare_sglang()
    for module in _CLASS_MODULES:
        cls = getattr(getattr(session, module), name, None)
        if isinstance(cls, type):
            return cls
    raise ReleaseLacks(name)


def accepts(cls: type, parameter: str) -> bool:
    """Whether ``cls(...)`` takes a parameter called ``parameter`` (by its signature)."""
    return parameter in inspect.signature(cls.__init__).parameters


def require(present: object, feature: str) -> None:
    """Raise :class:`ReleaseLacks` for ``feature`` unless ``present`` is truthy."""
    if not present:
        raise ReleaseLacks(feature)


def require_k_only_writer(native: Any) -> None:
    """Skip by capability where ``MHATokenToKOnlyPool`` has no ``set_k_buffer`` of its own.

    0.5.15 (the first release with the class) to 0.5.17 write its rows only through the
    parent's ``MiniMaxSparseKVPool.set_index_k_buffer`` (into ``k_buffer[local id]`` too),
    which ``test_k_only_write_equals_the_minimax_parents_writer`` compares on every release.
    """
    require(hasattr(type(native), "set_k_buffer"), "MHATokenToKOnlyPool.set_k_buffer")


def require_kv_layout(cls: type, kv_layout: str) -> None:
    """Skip by capability unless ``cls(kv_layout=kv_layout)`` can be built: the parameter
    exists from 0.5.21, and 0.5.21's ``KVLayout`` has V4, V41 and V41_FP4 only (0.5.22 adds
    UNIFORM_FP8, 0.5.23 the ``_NEW`` page formats)."""
    lacks = ReleaseLacks(f"{cls.__name__}(kv_layout=...)", f"kv_layout={kv_layout!r}")
    if not accepts(cls, "kv_layout"):
        raise lacks
    module = prepare_sglang().kv_layout
    if module is not None and kv_layout not in {member.value for member in module.KVLayout}:
        raise lacks


_NAMED_KV = {4: "c4_kv_pool", 128: "c128_kv_pool"}
_NAMED_INDEX = {4: "c4_indexer_kv_pool"}


def dsv4_kv_pools(native: Any) -> dict[int, Any]:
    """A DSv4 composite's compressed KV pools by ratio, as the release keeps them.

    ``kv_pools`` from 0.5.20; before, the ``c4_kv_pool`` / ``c128_kv_pool`` attributes.
    """
    if isinstance(getattr(native, "kv_pools", None), dict):
        return dict(native.kv_pools)
    return {ratio: getattr(native, name) for ratio, name in _NAMED_KV.items()}


def dsv4_index_pools(native: Any) -> dict[int, Any]:
    """A DSv4 composite's indexer pools by ratio (``index_pools`` or ``c4_indexer_kv_pool``)."""
    if isinstance(getattr(native, "index_pools", None), dict):
        return dict(native.index_pools)
    return {ratio: getattr(native, name) for ratio, name in _NAMED_INDEX.items()}


def dsv4_pages(size: int, page_size: int, global_page_size: int | None = None) -> int:
    """Pages a DSv4 single pool of the installed release allocates for ``size`` tokens.

    From 0.5.21 (the module has ``_num_dsv4_physical_kv_pages``): ``ceil((size + global) /
    page)``; before: ``(size + page + 1) // page`` (0.5.12's formula, also the legacy double's).
    """
    module = prepare_sglang().deepseek_v4_memory_pool
    if callable(getattr(module, "_num_dsv4_physical_kv_pages", None)):
        extra = page_size if global_page_size is None else global_page_size
        return -(-(size + extra) // page_size)
    return (size + page_size + 1) // page_size


def mha_fuses_k_and_v(native: Any) -> bool:
    """Whether an MHA pool of this release allocates K and V as halves of one tensor.

    0.5.23 does; 0.5.12-0.5.20 allocate them separately (shared/reference/sglang-releases.md,
    "MHA storage facts"). No attribute names the allocation itself, so this asks for
    ``model_layer_ids``, which the same release added to every MHA pool.
    """
    return "model_layer_ids" in vars(native)


def sglang_code(*places: tuple[str, str]) -> Any:
    """The code at the first ``(module, name)`` of ``places`` that the importable SGLang
    release has (``name`` an attribute or a submodule), or :class:`ReleaseLacks` (a skip).

    The places of each piece of code, newest release first, are in :mod:`_sglang.places`.
    Any import failure other than "this release has no such module" propagates.
    """
    return _resolve(places)[1]


def fp4_indexer_store(*, rne: bool) -> Any:
    """SGLang's ``store_fp4_index_k_cache(input, cache, loc, *, page_size)`` rounding as
    asked, or :class:`ReleaseLacks`: 0.5.16-0.5.20's rounds by threshold only (no ``rne``)."""
    store = sglang_code(*_places.FP4_INDEXER_STORE)
    if "rne" in inspect.signature(store).parameters:
        return functools.partial(store, rne=rne)
    require(not rne, "store_fp4_index_k_cache(rne=True)")
    return store


def sglang_place(*places: tuple[str, str]) -> tuple[str, str]:
    """Which of ``places`` :func:`sglang_code` resolves."""
    return _resolve(places)[0]


def _resolve(places: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], Any]:
    for module_name, name in places:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and (module_name + ".").startswith(exc.name + "."):
                continue  # this release has no such module
            raise
        if hasattr(module, name):
            return (module_name, name), getattr(module, name)
        try:  # ``name`` may be a submodule not imported yet
            return (module_name, name), importlib.import_module(f"{module_name}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{module_name}.{name}":
                raise
    wanted = " or ".join(f"{module}.{name}" for module, name in places)
    raise ReleaseLacks(wanted)


@contextlib.contextmanager
def cpu_kernel(feature: str) -> Iterator[None]:
    """Turn "this native call needs a GPU kernel on this release" into :class:`ReleaseLacks`.

    Older releases run some writers through a Triton kernel (``set_mla_kv_buffer`` before
    0.5.21), which fails on a CPU-only machine: while Triton looks for a GPU driver
    (``0 active drivers``), or, under ``TRITON_INTERPRET=1`` (the layout oracles), where
    the interpreter rejects the kernel's masks (``mask has unsupported dtype``). Only those
    two failures become a skip; anything else propagates.
    """
    try:
        yield
    except Exception as exc:  # RuntimeError, or triton's InterpreterError
        if not any(sign in str(exc) for sign in _NO_CPU_KERNEL):
            raise
        raise ReleaseLacks(feature, "a CPU implementation") from exc


_NO_CPU_KERNEL: Final = ("active drivers", "mask has unsupported dtype")


@functools.cache
def dsv4_single_getter_is_raw() -> bool:
    """Whether ``DeepSeekV4SingleKVPool.get_key_buffer`` is 0.5.12's raw form.

    0.5.12 returns ``kv_buffer[layer_id]`` (uint8, raw index) for every dtype; from 0.5.13
    an fp8 pool's getter subtracts ``start_layer`` and returns a float8 view (trap 3). No
    attribute tells the two apart, so this asks the getter itself once, on a fresh fp8 pool
    at ``start_layer`` 0 (where both forms pick the same buffer).
    """
    import torch

    cls = pool_class("DeepSeekV4SingleKVPool")
    pool = cls(64, 64, torch.float8_e4m3fn, 448, 64, 1, "cpu", False)
    return bool(pool.get_key_buffer(0).dtype == torch.uint8)


def kv_write_loc() -> Any:
    """SGLang's ``KVWriteLoc`` (``memory_pool``, from 0.5.14), or :class:`ReleaseLacks`.

    ``SWAKVPool.set_kv_buffer`` takes the SWA-translated location through it; 0.5.12-0.5.13
    have no such class.
    """
    cls = getattr(prepare_sglang().memory_pool, "KVWriteLoc", None)
    if not isinstance(cls, type):
        raise ReleaseLacks("KVWriteLoc")
    return cls


@functools.cache
def swa_writes_take_swa_loc() -> bool:
    """Whether ``SWAKVPool.set_kv_buffer`` takes the caller's SWA location.

    0.5.13 takes a ``swa_loc=`` keyword and 0.5.14 on a ``KVWriteLoc`` (``loc_info``), so
    SGLang's backends hand it the translated slots; 0.5.12 takes a plain ``loc`` and
    translates it inside the pool. Asked of the method's signature.
    """
    params = inspect.signature(pool_class("SWAKVPool").set_kv_buffer).parameters
    return "swa_loc" in params or "loc_info" in params


@functools.cache
def torch_native_sliding_window() -> bool:
    """Whether SGLang's ``TorchNativeAttnBackend`` applies a layer's sliding window.

    0.5.12's backend attends the whole causal prefix of every layer (its SDPA helpers take
    no ``sliding_window_size``); later releases mask to the window. Asked of the helper's
    signature.
    """
    prepare_sglang()
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    helper = TorchNativeAttnBackend._run_sdpa_forward_extend
    return "sliding_window_size" in inspect.signature(helper).parameters


def jit_dir(sglang_dir: Path) -> Path:
    """A release's CUDA JIT kernel folder: ``sglang/kernels/jit`` from 0.5.17,
    ``sglang/jit_kernel`` up to 0.5.16."""
    jit = sglang_dir / "kernels" / "jit"
    return jit if jit.is_dir() else sglang_dir / "jit_kernel"


def declared_kv_layouts(jit: Path) -> frozenset[str]:
    """The members of the release's C++ ``KVLayout`` enum (``kv_layout.cuh``), lower case.

    ``jit`` is the release's JIT kernel folder (:func:`jit_dir`): the CUDA stores take these
    layouts, as its V4.1 reader takes the members of the Python enum (``places.KV_LAYOUT``).

    0.5.21 declares V4, V41 and V41_FP4; 0.5.22 adds UNIFORM_FP8, 0.5.23 V41_NEW and
    V41_FP4_NEW. Empty for a release without the header (before 0.5.21).
    """
    header = jit / "include" / "sgl_kernel" / "deepseek_v4" / "kv_layout.cuh"
    if not header.is_file():
        return frozenset()
    found = re.search(r"enum class KVLayout\b[^{]*\{([^}]*)\}", header.read_text())
    if found is None:
        raise AssertionError(f"{header} declares no `enum class KVLayout`: read it again")
    return frozenset(
        member.split("=")[0].strip().lower()
        for member in found.group(1).split(",")
        if member.strip()
    )
