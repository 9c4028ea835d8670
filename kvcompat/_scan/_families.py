"""Code written for one model family: which rules cannot fire in it.

SGLang builds a model's pool from the model's configuration, so code that only one
model family can reach only ever sees that family's pools. Two static signals say so:

* **A module written for one family's pool** (:func:`module_rules`): it imports a pool
  class that only one family builds (:data:`FAMILY_POOLS`) and none of the classes the
  rules break on.
* **A class its constructor builds for one family's configuration**
  (:func:`class_rules`): ``__init__`` leaves, on every path, unless the model's
  configuration is an instance of a named config class::

      hf_config = model_runner.model_config.hf_config
      if not isinstance(hf_config, MiniCPMHybridConfig) or not hf_config.has_sparse:
          raise ValueError("MiniCPM model must have sparse attention enabled.")

  No DeepSeek-V4 model gets there, so no instance method of the class is handed a
  DeepSeek-V4 pool (the class body, static and class methods run without the
  constructor, and stay checked). Rules that also break on other pools (``KVC004`` on
  MLA pools, ``KVC005`` on MHA pools) still fire: the scanner does not know which pools
  the family gets.

What DeepSeek-V4's configurations are is a fact about SGLang 0.5.23
(``tests/real/test_scan_facts_real.py`` checks the installed wheel). SGLang tells a
DeepSeek-V4 model by its architecture name (``DeepseekV4ForCausalLM``); the configuration
classes it registers for DeepSeek-V4's model types are DeepSeek's own
(``_DeepseekV4ConfigAlias`` and the V4.1 classes, subclasses of transformers'
``DeepseekV3Config``, and ``DeepSeekV4Config``), and a checkpoint without a registered
class loads as the generic ``PretrainedConfig``, with that base's mixins. A check naming
one of those, any class whose name says DeepSeek, or a class not named ``...Config``,
admits DeepSeek-V4 and is no signal.
"""

from __future__ import annotations

import ast

from kvcompat._scan._rules import DSV4_POOLS, KEY_ONLY_POOLS, RULES
from kvcompat._scan._syntax import (
    FUNCTIONS,
    last_name,
    operands,
    single_assignments,
    statements,
)

__all__ = [
    "CONFIG_BASES",
    "FAMILY_POOLS",
    "admits_deepseek_v4",
    "class_rules",
    "module_rules",
    "refuses_other_families",
]

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

CONFIG_BASES = frozenset({"PretrainedConfig", "PreTrainedConfig"})
"""Generic configuration classes every model's configuration is an instance of."""

# The rules that break only on DeepSeek-V4 pools and on key-only pools. SGLang builds a
# key-only pool (MHATokenToKOnlyPool) only as the index-key sub-pool of another pool,
# never as the pool a model's code is handed.
_DSV4_ONLY = frozenset(
    code for code, rule in RULES.items() if set(rule.classes) <= DSV4_POOLS | KEY_ONLY_POOLS
)
_CONFIG_WORD = "config"
_CONFIG_SUFFIX = "Config"
_DEEPSEEK_WORD = "deepseek"


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


def class_rules(cls: ast.ClassDef) -> frozenset[str]:
    """The rules that cannot fire in a class whose ``__init__`` refuses other families.

    Example:
        >>> import ast
        >>> source = '''
        ... class Backend:
        ...     def __init__(self, runner):
        ...         config = runner.model_config.hf_config
        ...         assert isinstance(config, MiniCPMHybridConfig)
        ... '''
        >>> sorted(class_rules(ast.parse(source).body[0]))
        ['KVC001', 'KVC002', 'KVC003', 'KVC006', 'KVC007', 'KVC008', 'KVC009']
    """
    return _DSV4_ONLY if refuses_other_families(cls) else frozenset()


def refuses_other_families(cls: ast.ClassDef) -> bool:
    """Whether ``__init__`` leaves unless the model's configuration is one family's.

    Only a statement of the constructor's own body counts, before anything in it can
    return: ``assert isinstance(C, K)`` (``and`` other conditions), or
    ``if not isinstance(C, K) (or ...): raise ...``. ``C`` is a configuration (its name,
    or the name of what the one assignment of it stores, says ``config``); every class
    ``K`` names is a family's (:func:`admits_deepseek_v4` is false).
    """
    init = next(
        (stmt for stmt in cls.body if isinstance(stmt, FUNCTIONS) and stmt.name == "__init__"),
        None,
    )
    if init is None:
        return False
    stored = single_assignments(init)
    for stmt in init.body:
        if isinstance(stmt, ast.Assert) and any(
            _requires_family(operand, stored) for operand in operands(stmt.test, ast.And)
        ):
            return True
        if (
            isinstance(stmt, ast.If)
            and _raises(stmt)
            and any(
                isinstance(operand, ast.UnaryOp)
                and isinstance(operand.op, ast.Not)
                and _requires_family(operand.operand, stored)
                for operand in operands(stmt.test, ast.Or)
            )
        ):
            return True
        if any(isinstance(node, ast.Return) for node in statements([stmt])):
            return False  # a path that leaves before any check
    return False


def _raises(stmt: ast.If) -> bool:
    return bool(stmt.body) and isinstance(stmt.body[-1], ast.Raise) and not stmt.orelse


def _requires_family(expr: ast.expr, stored: dict[str, ast.expr]) -> bool:
    """Whether ``expr`` is ``isinstance(config, K)`` with only family classes in ``K``."""
    if not (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Name)
        and expr.func.id == "isinstance"
        and len(expr.args) == 2
        and not expr.keywords
    ):
        return False
    subject, classes = expr.args
    names = [last_name(k) for k in (classes.elts if isinstance(classes, ast.Tuple) else [classes])]
    return (
        _is_config(subject, stored)
        and bool(names)
        and not any(admits_deepseek_v4(name) for name in names)
    )


def _is_config(subject: ast.expr, stored: dict[str, ast.expr]) -> bool:
    names = [last_name(subject)]
    if isinstance(subject, ast.Name) and subject.id in stored:
        names.append(last_name(stored[subject.id]))
    return any(_CONFIG_WORD in name.lower() for name in names if name)


def admits_deepseek_v4(name: str) -> bool:
    """Whether ``isinstance(config, <name>)`` can be true of a DeepSeek-V4 configuration.

    Only a class named ``...Config`` names a family: mixins (``PushToHubMixin``) and
    anything else may be a base of every configuration.

    Example:
        >>> [admits_deepseek_v4(n) for n in ("MiniCPMHybridConfig", "DeepseekV3Config")]
        [False, True]
    """
    return (
        not name.endswith(_CONFIG_SUFFIX) or name in CONFIG_BASES or _DEEPSEEK_WORD in name.lower()
    )
