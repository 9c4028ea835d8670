"""Code written for one model family: which rules cannot fire in it.

SGLang builds a model's pool from the model's configuration, so code that only one
model family can reach only ever sees that family's pools. :func:`module_rules` reads one
static signal that says so: a module written for one family's pool, which imports a pool
class only one family builds (:data:`FAMILY_POOLS`) and none of the classes the rules
break on.
"""

from __future__ import annotations

import ast

from kvcompat._scan._rules import RULES

__all__ = ["FAMILY_POOLS", "module_rules"]

_METHODS_WORK = frozenset({"KVC001", "KVC002", "KVC003"})

FAMILY_POOLS: dict[str, frozenset[str]] = {
    "QSATokenToKVPool": _METHODS_WORK | {"KVC006"},
    "MiniMaxSparseKVPool": _METHODS_WORK | {"KVC006"},
    "MiniMaxM3Nvfp4KVPool": _METHODS_WORK,
    "NPUMiniMaxSparseKVPool": _METHODS_WORK,
}
"""Pool classes one model family builds -> the rules whose accesses work on them.

Qwen's QSA pool (a ``HybridLinearKVPool`` over token-major MHA storage) and MiniMax's
sparse pools (they forward ``get_value_buffer``, ``get_kv_buffer`` and ``set_kv_buffer``
to their main pool; only the bf16/fp8 one keeps token rows, the NVFP4 main pool is packed
page-major and the NPU one paged). SGLang 0.5.23.
"""

_BREAKING_POOLS = frozenset(
    name for code in (*_METHODS_WORK, "KVC006") for name in RULES[code].classes
)


def module_rules(tree: ast.Module) -> frozenset[str]:
    """The rules that cannot fire in a module written for one model family's pool.

    Empty unless the module imports a family's pool class (:data:`FAMILY_POOLS`) and
    none of the classes the rules break on.
    """
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    families = [FAMILY_POOLS[name] for name in sorted(imported & FAMILY_POOLS.keys())]
    if not families or imported & _BREAKING_POOLS:
        return frozenset()
    return frozenset.intersection(*families)
