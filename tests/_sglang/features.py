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

import functools
import importlib.metadata
import inspect
from typing import Any, Final

import pytest

from _sglang.env import prepare_sglang

__all__ = [
    "SKIP_PREFIX",
    "ReleaseLacks",
    "accepts",
    "has_class",
    "pool_class",
    "release",
    "require",
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

    def __init__(self, feature: str, wanted: str = "") -> None:
        self.feature = feature
        detail = f" (wanted: {wanted})" if wanted else ""
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
