"""The ``kvcompat`` logger and the two environment switches read with it.

kvcompat logs nothing unless asked: the ``"kvcompat"`` logger has only a
:class:`logging.NullHandler`. It says which implementation served a read or a write (the
Triton kernel or the pure-torch twin) and why a CUDA call fell back to the twin, once per
distinct (operation, layout, implementation, reason) so that the hot path formats no
string after the first call. Getters never log.

* ``KVCOMPAT_LOG=info`` attaches a stderr handler showing the fallbacks of CUDA calls;
  ``debug`` also shows every first choice (CPU calls, kernels taken). ``off`` (or unset)
  attaches nothing; configuring the ``"kvcompat"`` logger yourself works as with any
  library.
* ``KVCOMPAT_IMPL=auto|torch|triton`` is the process default for ``impl="auto"``
  (every ``impl=`` parameter's default); an explicit ``impl="torch"`` or ``"triton"``
  argument still wins for that call.

Both are read once, at the first read or write, and validated: a bad value raises a
:class:`ValueError` naming the accepted ones.

Example:
    >>> import logging
    >>> from kvcompat._log import LOGGER
    >>> LOGGER.name, any(isinstance(h, logging.NullHandler) for h in LOGGER.handlers)
    ('kvcompat', True)
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from typing import Final, Literal

__all__ = [
    "IMPL_ENV",
    "LOGGER",
    "LOG_ENV",
    "SEEN",
    "env_impl",
    "log_once",
    "reset",
    "setup_from_env",
]

LOGGER: Final = logging.getLogger("kvcompat")
LOGGER.addHandler(logging.NullHandler())

LOG_ENV: Final = "KVCOMPAT_LOG"
IMPL_ENV: Final = "KVCOMPAT_IMPL"

_LEVELS: Final = {"off": None, "info": logging.INFO, "debug": logging.DEBUG}
_IMPLS: Final = ("auto", "torch", "triton")
_FORMAT: Final = "kvcompat %(levelname)s: %(message)s"

SEEN: set[tuple[str, str, str, str]] = set()
"""The (operation, layout, impl, reason) keys already logged."""


def _read(name: str, accepted: tuple[str, ...], default: str) -> str:
    raw = os.environ.get(name, "")
    value = raw.strip().lower() or default
    if value not in accepted:
        names = ", ".join(repr(a) for a in accepted)
        msg = (
            f"environment variable {name}={raw!r} is not one of {names}. "
            f"Hint: unset {name} or set it to one of those values."
        )
        raise ValueError(msg)
    return value


@functools.cache
def env_impl() -> Literal["auto", "torch", "triton"]:
    """``KVCOMPAT_IMPL``, read once: what ``impl="auto"`` means in this process.

    Raises:
        ValueError: the variable holds something other than auto, torch or triton.

    Example:
        >>> from kvcompat._log import env_impl
        >>> env_impl() in ("auto", "torch", "triton")
        True
    """
    value = _read(IMPL_ENV, _IMPLS, "auto")
    return "torch" if value == "torch" else "triton" if value == "triton" else "auto"


@functools.cache
def setup_from_env() -> logging.Handler | None:
    """Attach a stderr handler when ``KVCOMPAT_LOG`` asks for one (once); return it.

    Raises:
        ValueError: the variable holds something other than off, info or debug.

    Example:
        >>> from kvcompat._log import setup_from_env
        >>> setup_from_env() is setup_from_env()  # read once
        True
    """
    level = _LEVELS[_read(LOG_ENV, tuple(_LEVELS), "off")]
    if level is None:
        return None
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT))
    LOGGER.addHandler(handler)
    LOGGER.setLevel(level)
    return handler


def log_once(level: int, key: tuple[str, str, str, str], fmt: str, /, *args: object) -> None:
    """Log ``fmt % args`` the first time ``key`` (op, layout, impl, reason) is seen.

    Later calls with the same key cost one set lookup; nothing is formatted.

    Example:
        >>> import logging
        >>> from kvcompat._log import log_once
        >>> log_once(logging.DEBUG, ("read", "v4", "torch", "doc"), "shown %s", "once")
    """
    if key in SEEN:
        return
    SEEN.add(key)
    LOGGER.log(level, fmt, *args)


def reset() -> None:
    """Forget the messages already logged and the environment read (tests use this).

    Example:
        >>> from kvcompat._log import reset
        >>> reset()
    """
    SEEN.clear()
    handler = setup_from_env() if setup_from_env.cache_info().currsize else None
    if handler is not None:
        LOGGER.removeHandler(handler)
        LOGGER.setLevel(logging.NOTSET)
    setup_from_env.cache_clear()
    env_impl.cache_clear()
