"""kvcompat's layouts against SGLang's own code: one oracle module per layout module.

Every module of this package (but the runner, ``sglang_oracles.py``, and the shared
``_common.py``) is imported here, and its ``@check`` functions register themselves in
:data:`CHECKS` (with their docs-table row in :data:`ROWS` and the layouts they cover in
:data:`COVERS`): a new layout's oracle module is picked up by existing. Importing the
package imports neither sglang nor triton.
"""

from __future__ import annotations

import importlib
import pkgutil

from _oracle._common import CHECKS, COVERS, ROWS

__all__ = ["CHECKS", "COVERS", "ORACLE_MODULES", "ROWS"]

ORACLE_MODULES: tuple[str, ...] = tuple(
    info.name
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name)
    if not info.name.startswith("_") and info.name != "sglang_oracles"
)
"""The oracle modules, by name (each named after the layout module it checks)."""

for _name in ORACLE_MODULES:
    importlib.import_module(f"{__name__}.{_name}")
