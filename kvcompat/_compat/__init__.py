"""The compat proxy's implementation (public names live in :mod:`kvcompat.compat`).

This package's ``__init__`` imports nothing, so the registry and the inspection entry
points can use :func:`kvcompat._compat._marker.unwrap_proxy` without an import cycle.
"""
