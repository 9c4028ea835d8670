"""Shared machinery of the import-only torchvision stub (test-only; see tests/real/README.md).

SGLang 0.5.23 imports ``torchvision.transforms`` while importing ``sglang.srt.configs``, and
transformers imports ``torchvision.io`` once ``find_spec("torchvision")`` succeeds.  The wheel the
package registry serves for torchvision links ``libc10_cuda.so`` and cannot load beside the CPU
build of torch, so the test tier puts this package first on ``sys.path`` instead.  Nothing here
does image work: every name resolves to a placeholder class that refuses to be called.
"""

from __future__ import annotations

import enum
from typing import Any, NoReturn

__all__ = ["STUB_VERSION", "InterpolationMode", "make_module_getattr"]

# Parses as a PEP 440 version (transformers compares it); the local label says what it is.
STUB_VERSION = "0.28.0+kvcompat.stub"


class InterpolationMode(enum.Enum):
    """The members torchvision 0.2x defines, with torchvision's string values."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


class _Placeholder:
    """Base of every stand-in class: constructible (import-time code may make one), not callable."""

    _stub_qualname = "torchvision.<stub>"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        del args, kwargs

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        msg = (
            f"{self._stub_qualname} is a placeholder from kvcompat's test-only torchvision stub; "
            "install a torchvision build that matches torch to use it"
        )
        raise RuntimeError(msg)


def make_module_getattr(module_name: str) -> Any:
    """Return a module-level ``__getattr__`` that hands out one placeholder class per name.

    Dunder names raise AttributeError so that import machinery, ``inspect`` and ``pkgutil``
    probes (``__path__``, ``__all__``, ``__wrapped__`` ...) see an ordinary module.
    """
    cache: dict[str, type] = {}

    def module_getattr(name: str) -> type:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if name not in cache:
            qualname = f"{module_name}.{name}"
            namespace = {"_stub_qualname": qualname, "__module__": module_name}
            cache[name] = type(name, (_Placeholder,), namespace)
        return cache[name]

    return module_getattr
