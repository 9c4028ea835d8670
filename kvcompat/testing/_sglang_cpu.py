"""Import SGLang's pool modules on a CPU-only machine: :func:`sglang_cpu`.

SGLang's pool modules (``sglang.srt.mem_cache.memory_pool`` and friends) import
``sglang.srt.configs``, which imports ``torchvision.transforms`` at module level. Nothing in
a KV pool uses torchvision, but without a working one the import fails: either
``No module named 'torchvision'``, or, with the torchvision wheel PyPI serves next to the CPU
build of torch, ``operator torchvision::nms does not exist`` (that wheel is built against the
CUDA build). :func:`sglang_cpu` checks whether a real torchvision imports; only when it does
not, it installs a minimal import shim and says so in what it returns.

The shim serves exactly six modules, found through a finder at the front of
``sys.meta_path``: ``torchvision``, ``torchvision.io``, ``torchvision.transforms``,
``torchvision.transforms.functional``, ``torchvision.transforms.v2`` and
``torchvision.transforms.v2.functional`` (the ones SGLang 0.5.12-0.5.23 and transformers
import while SGLang's pool modules load). Each has ``__version__`` ``0.28.0+kvcompat.shim``
(a PEP 440 version, as transformers compares it), the ``InterpolationMode`` enum, and hands
out a placeholder class for any other name; calling a placeholder raises :class:`RuntimeError`
naming the shim. Any other ``torchvision.*`` module stays missing
(:class:`ModuleNotFoundError`). Nothing here does image work: use it to build and inspect KV
pools, not to serve a vision model.
"""

from __future__ import annotations

import enum
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NoReturn

__all__ = ["TORCHVISION_SHIM_VERSION", "SGLangCPU", "sglang_cpu"]

TORCHVISION_SHIM_VERSION = "0.28.0+kvcompat.shim"
"""``__version__`` of every shim module: a PEP 440 version (transformers compares it) whose
local label says what it is."""

_PACKAGES = ("torchvision", "torchvision.transforms", "torchvision.transforms.v2")
_MODULES = (
    *_PACKAGES,
    "torchvision.io",
    "torchvision.transforms.functional",
    "torchvision.transforms.v2.functional",
)
_ORIGIN = "kvcompat.testing.sglang_cpu (torchvision import shim)"
_LOCK = threading.Lock()


class InterpolationMode(enum.Enum):
    """The members of torchvision's ``InterpolationMode``, with its string values."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


class _Placeholder:
    """Base of the shim's stand-in classes: constructible, never callable."""

    _shim_qualname = "torchvision.<shim>"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        del args, kwargs

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        msg = (
            f"{self._shim_qualname} is a placeholder of kvcompat.testing.sglang_cpu()'s "
            "torchvision import shim, which only lets SGLang's modules import. "
            "Hint: install a torchvision build that matches your torch to do image work."
        )
        raise RuntimeError(msg)


def _module_getattr(module_name: str) -> Any:
    """A module ``__getattr__`` handing out one placeholder class per (non-dunder) name."""
    cache: dict[str, type] = {}

    def module_getattr(name: str) -> type:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # import machinery, inspect and pkgutil probes
        if name not in cache:
            namespace = {"_shim_qualname": f"{module_name}.{name}", "__module__": module_name}
            cache[name] = type(name, (_Placeholder,), namespace)
        return cache[name]

    return module_getattr


class _ShimFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and loads the six shim modules; every other name is left to the other finders."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        del path, target
        if fullname not in _MODULES:
            return None
        spec = importlib.machinery.ModuleSpec(
            fullname, self, origin=_ORIGIN, is_package=fullname in _PACKAGES
        )
        if fullname in _PACKAGES:
            spec.submodule_search_locations = []  # no file system: other submodules stay missing
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        del spec
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        module.__doc__ = (
            f"Import shim for {module.__name__} from kvcompat.testing.sglang_cpu(): "
            "placeholders only, no image work."
        )
        module.__version__ = TORCHVISION_SHIM_VERSION  # type: ignore[attr-defined]
        module.InterpolationMode = InterpolationMode  # type: ignore[attr-defined]
        module.__getattr__ = _module_getattr(module.__name__)  # type: ignore[method-assign]


_FINDER = _ShimFinder()


@dataclass(frozen=True)
class SGLangCPU:
    """What :func:`sglang_cpu` found and did.

    Attributes:
        torchvision: ``"real"`` (a working torchvision imports: nothing was changed) or
            ``"shim"`` (kvcompat's import shim serves ``torchvision``).
        reason: why the shim is in use: torchvision is not installed, or the error its
            import raised; None with a real torchvision.
        shimmed: (a property) whether the shim serves ``torchvision``.

    Example:
        >>> from kvcompat.testing import SGLangCPU
        >>> print(SGLangCPU("shim", "torchvision is not installed"))
        torchvision: kvcompat's import-only shim (torchvision is not installed)
    """

    torchvision: str
    reason: str | None = None

    @property
    def shimmed(self) -> bool:
        """Whether the shim serves ``torchvision``.

        Example:
            >>> from kvcompat.testing import SGLangCPU
            >>> SGLangCPU("real").shimmed
            False
        """
        return self.torchvision == "shim"

    def __str__(self) -> str:
        if not self.shimmed:
            return "torchvision: the installed one imports; no shim"
        return f"torchvision: kvcompat's import-only shim ({self.reason})"


def _drop_torchvision_modules() -> None:
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]


def _shim_installed() -> bool:
    return any(finder is _FINDER for finder in sys.meta_path)


_RESULT: SGLangCPU | None = None


def _probe_torchvision() -> str | None:
    """None when a real torchvision imports here, else why it does not."""
    loaded = sys.modules.get("torchvision")
    if loaded is not None:
        return None
    try:
        found = importlib.util.find_spec("torchvision") is not None
    except Exception as exc:  # noqa: BLE001 -- a finder that raises is as broken as an import
        return f"torchvision cannot be found: {type(exc).__name__}: {exc}"
    if not found:
        return "torchvision is not installed"
    try:
        importlib.import_module("torchvision")
    except Exception as exc:  # noqa: BLE001 -- any failure means "broken"; reported verbatim
        # PyPI's wheel for a CUDA torch fails with RuntimeError ("operator torchvision::nms
        # does not exist"), an OSError (a missing libc10_cuda.so) or an ImportError.
        _drop_torchvision_modules()  # whatever it left half-imported
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"the installed torchvision fails to import: {type(exc).__name__}: {first_line}"
    return None


def sglang_cpu() -> SGLangCPU:
    """Let SGLang's pool modules import on a CPU-only machine; idempotent; says what it did.

    If a real ``torchvision`` imports, nothing changes. Otherwise (not installed, or the
    installed one fails to import beside the CPU build of torch) kvcompat's minimal import
    shim serves ``torchvision`` from then on in this process: six modules with
    ``__version__``, ``InterpolationMode`` and placeholder classes that refuse to be called
    (see the module docstring and the "Real SGLang pools on a CPU" docs page). Call it
    before the first ``import sglang...``. It never imports sglang and does not touch
    SGLang's runtime configuration.

    Returns:
        :class:`SGLangCPU`: whether the shim is in use and why; ``print`` it to say so.

    Example:
        >>> from kvcompat.testing import sglang_cpu
        >>> setup = sglang_cpu()
        >>> setup.torchvision in ("real", "shim")
        True
        >>> import torchvision.transforms
        >>> setup.shimmed == torchvision.transforms.__version__.endswith("+kvcompat.shim")
        True
    """
    global _RESULT  # noqa: PLW0603 -- one answer per process: the shim is process-wide
    with _LOCK:
        if _RESULT is not None and (not _RESULT.shimmed or _shim_installed()):
            return _RESULT
        reason = _probe_torchvision()
        if reason is None:
            _RESULT = SGLangCPU("real")
            return _RESULT
        _drop_torchvision_modules()
        if not _shim_installed():
            sys.meta_path.insert(0, _FINDER)
        importlib.invalidate_caches()
        _RESULT = SGLangCPU("shim", reason)
        return _RESULT
