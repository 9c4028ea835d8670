"""Process set-up for running SGLang's own KV-pool classes (0.5.12 to 0.5.23) on a CPU-only machine.

Follows ``shared/reference/sglang-on-cpu.md`` (measured there):

* ``sglang.srt.configs`` imports ``torchvision.transforms``; the registry's torchvision wheel
  cannot load beside the CPU build of torch. When no working torchvision is importable, the
  public :func:`kvcompat.testing.sglang_cpu` serves its import-only shim (docs/real-sglang.md).
* ``SGLANG_CACHE_DIR`` and ``SGLANG_JIT_CACHE_DIR`` point at a temporary folder (SGLang would
  otherwise write under ``~/.cache/sglang``); ``SGLANG_USE_CPU_ENGINE`` stays unset (it routes
  writes to ``sgl_kernel`` CPU ops that are not installed).
* Several classes read the published runtime config, so a dummy one is installed the way
  SGLang's own tests do: ``get_context().override_server_args(device="cpu")`` plus
  ``get_parallel().override_permanently(attn_dcp_rank=0)``. Releases differ here (decided by
  what the installed modules have, see ``shared/reference/sglang-releases.md``): without
  ``override_permanently`` (0.5.14-0.5.19) the scoped ``get_parallel().override(...)`` is
  entered for the session; a parallel context without ``attn_dcp_rank`` is left alone; and
  where the runtime context has no ``override_server_args`` (0.5.12-0.5.13 have no
  ``srt/runtime_context``, 0.5.14-0.5.15 one for the parallel state only) a dummy
  ``ServerArgs`` is published with ``server_args.set_global_server_args_for_scheduler``.
* ``kernels/ops/attention/dsv4/kv_layout`` exists from 0.5.21 only; ``session.kv_layout`` is
  None before.
* Importing the pool modules loads ~4,400 modules and takes 4-11 s, so it happens once per
  process; :func:`prepare_sglang` is idempotent and :func:`release_sglang` undoes everything
  that can be undone (the imported modules stay).

Nothing in this module imports sglang at import time.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "IMPORT_WARNING_FILTERS",
    "SGLangSession",
    "current_session",
    "install_torchvision_stub",
    "prepare_sglang",
    "release_sglang",
    "sglang_installed",
]

# Warnings SGLang's pool modules emit on import on a CPU-only machine (every release of the
# matrix). Each is ignored narrowly (message, category, emitting module), and only for the
# tests that build SGLang objects (tests/real, the sglang cases of tests/adversarial).
IMPORT_WARNING_FILTERS = (
    # sglang.srt.layers.quantization imports every quantization method; two of them warn at
    # import time that the platform lacks their kernels. Nothing here quantizes.
    (
        r"ignore:Only CUDA, HIP and XPU support AWQ currently\.:UserWarning:"
        r"sglang\.srt\.layers\.quantization\.awq\.awq"
    ),
    (
        r"ignore:Only CUDA, MUSA and NPU support GGUF quantization currently\.:UserWarning:"
        r"sglang\.srt\.layers\.quantization\.gguf"
    ),
    # torch.fx.experimental.optimization (pulled in by SGLang) imports torch.utils.mkldnn,
    # whose ScriptModules use the deprecated torch.jit.script_method decorator: torch's own.
    r"ignore:`torch\.jit\.script_method` is deprecated:DeprecationWarning:torch\.jit\._script",
    # transformers imports sentencepiece, a SWIG extension whose builtin types lack
    # __module__; CPython reports that from the import machinery.
    r"ignore:builtin type Swig\w+ has no __module__ attribute:DeprecationWarning",
    # Up to 0.5.17 the FLA utilities (srt/layers/attention/fla, from 0.5.16 under kernels/ops)
    # warn at import that Triton has no GPU driver here.
    (
        r"ignore:Triton is not supported on current platform, roll back to CPU\.:UserWarning:"
        r"sglang\.(srt\.layers|kernels\.ops)\.attention\.fla\.utils"
    ),
)

_POOL_MODULES = {
    "memory_pool": "sglang.srt.mem_cache.memory_pool",
    "swa_memory_pool": "sglang.srt.mem_cache.swa_memory_pool",
    "deepseek_v4_memory_pool": "sglang.srt.mem_cache.deepseek_v4_memory_pool",
}
# Modules that only some releases ship: None on the session when the release lacks them.
_OPTIONAL_MODULES = {
    "kv_layout": "sglang.kernels.ops.attention.dsv4.kv_layout",  # from 0.5.21
    "runtime_context": "sglang.srt.runtime_context",  # from 0.5.14
}
_CACHE_VARS = ("SGLANG_CACHE_DIR", "SGLANG_JIT_CACHE_DIR")
_CPU_ENGINE_VAR = "SGLANG_USE_CPU_ENGINE"


def sglang_installed() -> bool:
    """Whether the ``sglang`` distribution can be found (without importing it)."""
    return importlib.util.find_spec("sglang") is not None


@dataclass
class SGLangSession:
    """What :func:`prepare_sglang` did, so that :func:`release_sglang` can undo it.

    Attributes:
        memory_pool, swa_memory_pool, deepseek_v4_memory_pool, kv_layout, runtime_context:
            the imported SGLang modules (read classes from them, e.g.
            ``session.memory_pool.MHATokenToKVPool``); ``kv_layout`` and
            ``runtime_context`` are None on releases that do not ship them.
        torchvision_stubbed: True when kvcompat's import shim stands in for torchvision.
        cache_dir: the temporary folder SGLang's caches point at.
        import_seconds: wall time of the one-off module import.
        sglang_version: ``sglang.__version__``.
    """

    memory_pool: ModuleType
    swa_memory_pool: ModuleType
    deepseek_v4_memory_pool: ModuleType
    kv_layout: ModuleType | None
    runtime_context: ModuleType | None
    torchvision_stubbed: bool
    cache_dir: Path
    import_seconds: float
    sglang_version: str
    _saved_env: dict[str, str | None] = field(default_factory=dict, repr=False)
    _server_args_handle: Any = field(default=None, repr=False)
    _parallel_override: Any = field(default=None, repr=False)
    _saved_global_args: Any = field(default=None, repr=False)
    _parallel_stamped: bool = field(default=False, repr=False)
    _config_installed: bool = field(default=False, repr=False)

    @property
    def config_installed(self) -> bool:
        """Whether the dummy published runtime config is currently installed."""
        return self._config_installed


_SESSION: SGLangSession | None = None


def current_session() -> SGLangSession | None:
    """The live session, or None before :func:`prepare_sglang` / after :func:`release_sglang`."""
    return _SESSION


def install_torchvision_stub() -> bool:
    """Let SGLang's modules import torchvision: :func:`kvcompat.testing.sglang_cpu`'s shim.

    Returns whether the shim is in use (only where no working torchvision imports).
    :func:`prepare_sglang` calls it; so does the layout oracle runner, whose checks import
    SGLang modules without a session (0.5.12-0.5.20 import torchvision from
    ``sglang.srt.utils``).
    """
    from kvcompat.testing import sglang_cpu

    return sglang_cpu().shimmed


def _set_env(saved: dict[str, str | None], cache_dir: Path) -> None:
    for name in (*_CACHE_VARS, _CPU_ENGINE_VAR):
        saved[name] = os.environ.get(name)
    for name in _CACHE_VARS:
        os.environ[name] = str(cache_dir)
    os.environ.pop(_CPU_ENGINE_VAR, None)


def _restore_env(saved: dict[str, str | None]) -> None:
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    saved.clear()


def _install_config(session: SGLangSession) -> None:
    context = session.runtime_context
    published = context is not None and hasattr(context.get_context(), "override_server_args")
    if published:
        handle = context.get_context().override_server_args(device="cpu")
        handle.install()
        session._server_args_handle = handle
    else:  # 0.5.12-0.5.15: no runtime context, or one that holds only the parallel state
        _install_global_server_args(session)
    try:
        parallel = None if context is None else context.get_parallel()
        # Releases whose parallel context has no attn_dcp_rank read none of it.
        if parallel is not None and hasattr(type(parallel), "attn_dcp_rank"):
            _override_dcp_rank(session, parallel)
    except BaseException:
        _restore_server_args(session)
        raise
    session._config_installed = True


def _override_dcp_rank(session: SGLangSession, parallel: Any) -> None:
    # attn_dcp_rank alone makes the published parallel config complete enough for
    # DSATokenToKVPool, DeepSeekV4TokenToKVPool and DeepSeekV4IndexerPool(None).
    if hasattr(parallel, "clear_stamp"):
        parallel.override_permanently(attn_dcp_rank=0)
        session._parallel_stamped = True
        return
    # Before 0.5.21 there is no way to undo a permanent override (0.5.14-0.5.19 lack
    # override_permanently altogether): the scoped override is held for the session.
    scoped = parallel.override(attn_dcp_rank=0)
    scoped.__enter__()
    session._parallel_override = scoped


def _install_global_server_args(session: SGLangSession) -> None:
    """Before ``override_server_args`` (0.5.12-0.5.15): publish a dummy ``ServerArgs`` globally."""
    server_args = importlib.import_module("sglang.srt.server_args")
    session._saved_global_args = getattr(server_args, "_global_server_args", None)
    cls = server_args.ServerArgs
    # ServerArgs.__post_init__ resolves the model's config (a download): the dummy carries
    # the dataclass defaults only, as a published ServerArgs that never served a model.
    dummy = object.__new__(cls)
    for item in dataclasses.fields(cls):
        if item.default is not dataclasses.MISSING:
            value = item.default
        elif item.default_factory is not dataclasses.MISSING:
            value = item.default_factory()
        else:
            value = None
        object.__setattr__(dummy, item.name, value)
    dummy.device = "cpu"
    server_args.set_global_server_args_for_scheduler(dummy)


def _restore_server_args(session: SGLangSession) -> None:
    if session._server_args_handle is not None:
        handle, session._server_args_handle = session._server_args_handle, None
        handle.restore()
        return
    server_args = importlib.import_module("sglang.srt.server_args")
    server_args.set_global_server_args_for_scheduler(session._saved_global_args)
    session._saved_global_args = None


def _uninstall_config(session: SGLangSession) -> None:
    if not session._config_installed:
        return
    session._config_installed = False
    if session._parallel_override is not None:
        scoped, session._parallel_override = session._parallel_override, None
        scoped.__exit__(None, None, None)
    elif session._parallel_stamped and session.runtime_context is not None:
        session._parallel_stamped = False
        session.runtime_context.get_parallel().clear_stamp()
    _restore_server_args(session)


def _optional_module(name: str) -> ModuleType | None:
    """Import ``name`` if this release ships it, else None (a missing parent counts too)."""
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        return None
    return None if spec is None else importlib.import_module(name)


def prepare_sglang() -> SGLangSession:
    """Make SGLang's pool classes constructible on this CPU-only process; idempotent.

    The first call (per process) installs the torchvision import shim if needed, points
    SGLang's caches at a temporary folder, unsets ``SGLANG_USE_CPU_ENGINE``, imports the pool
    modules and installs the dummy runtime config. Later calls return the same session.

    Raises:
        ModuleNotFoundError: sglang is not installed (callers skip before getting here).
    """
    global _SESSION  # noqa: PLW0603 -- one process-wide session, by design
    if _SESSION is not None:
        return _SESSION
    if not sglang_installed():
        msg = "sglang is not installed; see tests/real/README.md for the test environment"
        raise ModuleNotFoundError(msg, name="sglang")

    stubbed = install_torchvision_stub()
    cache_dir = Path(tempfile.mkdtemp(prefix="kvcompat-sglang-cache-"))
    saved: dict[str, str | None] = {}
    _set_env(saved, cache_dir)
    try:
        started = time.perf_counter()
        modules: dict[str, ModuleType | None] = {
            key: importlib.import_module(name) for key, name in _POOL_MODULES.items()
        }
        modules.update({key: _optional_module(name) for key, name in _OPTIONAL_MODULES.items()})
        import_seconds = time.perf_counter() - started
        session = SGLangSession(
            **modules,
            torchvision_stubbed=stubbed,
            cache_dir=cache_dir,
            import_seconds=import_seconds,
            sglang_version=importlib.import_module("sglang").__version__,
            _saved_env=saved,
        )
        _install_config(session)
    except BaseException:
        _restore_env(saved)
        shutil.rmtree(cache_dir, ignore_errors=True)
        raise
    _SESSION = session
    return session


def release_sglang() -> None:
    """Undo :func:`prepare_sglang`: runtime config, environment variables, cache folder.

    The imported modules (and the torchvision shim they were imported through) stay:
    un-importing 4,400 modules is neither possible nor useful. A later
    :func:`prepare_sglang` installs the config again and returns a fresh session.
    """
    global _SESSION
    session, _SESSION = _SESSION, None
    if session is None:
        return
    try:
        _uninstall_config(session)
    finally:
        _restore_env(session._saved_env)
        shutil.rmtree(session.cache_dir, ignore_errors=True)
