"""The one place kvcompat's version is written (read by ``pyproject.toml`` and ``kvcompat``)."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
