"""Model definitions: code that only ever runs on the pool its architecture selects.

SGLang builds a model's KV pool from the model's configuration: a Qwen3 checkpoint gets an
MHA pool, a DeepSeek V3 checkpoint an MLA pool, and only a DeepSeek-V4 checkpoint a
DeepSeek-V4 pool. A module that registers model classes with the engine (a module-level
``EntryClass = ...``, the name SGLang's model registry and its external-model packages read)
is written and tested against the pool of its own architecture, so a native pool access in
it is not a finding: nothing else can reach it. Two things widen that to helper modules and
narrow it for wrappers:

* a module, or one top-level function or class of a module, that only model definitions
  import is model code too (``models/inkling_common/attn.py``, imported by
  ``models/inkling.py`` alone; ``create_fused_set_kv_buffer_arg`` of ``models/utils.py``,
  imported by name only by model modules). Importers count only when the scan read the
  module's whole package (:meth:`ModelScope._covered`), so a partial scan reports more,
  never less;
* a module that reads ``.architectures`` (``config.architectures``) picks among several
  architectures at run time, a wrapper such as SGLang's MindSpore model, and is not model
  code: it can be handed any of their pools.

Imports are read statically (``import a.b``, ``from a.b import c``, relative imports,
also inside functions); ``importlib.import_module`` is not, so a module loaded only that
way has no importers and is not model code unless it registers classes itself.
"""

from __future__ import annotations

import ast
import dataclasses
import os
from collections.abc import Iterable, Iterator, Mapping

from kvcompat._scan._syntax import assigned_names, statements, top_level_defs

__all__ = ["ModelScope", "ModuleFacts", "module_facts"]

_REGISTRY_NAME = "EntryClass"
_DISPATCH_ATTRIBUTE = "architectures"


@dataclasses.dataclass(frozen=True)
class _Reference:
    """One imported module or name: ``module`` is dotted parts, or path parts if ``exact``."""

    module: tuple[str, ...]
    exact: bool
    name: str | None  # None: the module itself; "*": every public name


@dataclasses.dataclass(frozen=True)
class ModuleFacts:
    """What the model-code pass needs of one scanned module.

    Attributes:
        key: The module's real path as parts, without ``.py`` (a package: its directory).
        registers: It assigns ``EntryClass`` at module level and reads no ``.architectures``.
        references: What it imports, resolved as far as the source allows.
        defs: Its top-level functions and classes: (name, first line, last line).
    """

    key: tuple[str, ...]
    registers: bool
    references: tuple[_Reference, ...]
    defs: tuple[tuple[str, int, int], ...]

    def def_at(self, line: int) -> str | None:
        """The top-level function or class whose lines (decorators included) hold ``line``."""
        for name, first, last in self.defs:
            if first <= line <= last:
                return name
        return None


def _parts(real_path: str) -> tuple[str, ...]:
    return tuple(part for part in real_path.replace("\\", "/").split("/") if part)


def _key(real_path: str) -> tuple[str, ...]:
    parts = _parts(os.path.splitext(real_path)[0])
    return parts[:-1] if parts and parts[-1] == "__init__" else parts


def _references(
    stmt: ast.Import | ast.ImportFrom, directory: tuple[str, ...]
) -> Iterator[_Reference]:
    if isinstance(stmt, ast.Import):
        for alias in stmt.names:
            yield _Reference(tuple(alias.name.split(".")), exact=False, name=None)
        return
    named = tuple(stmt.module.split(".")) if stmt.module else ()
    if stmt.level:
        if stmt.level - 1 > len(directory):
            return  # beyond the file system's root: nothing it could name
        module = directory[: len(directory) - (stmt.level - 1)] + named
        exact = True
    else:
        module, exact = named, False
    for alias in stmt.names:
        yield _Reference(module, exact, alias.name)
        if alias.name != "*":  # ``from package import submodule``
            yield _Reference((*module, alias.name), exact, None)


def _registers(tree: ast.Module, text: str) -> bool:
    if _REGISTRY_NAME not in text or _REGISTRY_NAME not in assigned_names(tree.body):
        return False
    return _DISPATCH_ATTRIBUTE not in text or not any(
        isinstance(node, ast.Attribute) and node.attr == _DISPATCH_ATTRIBUTE
        for node in ast.walk(tree)
    )


def module_facts(tree: ast.Module, text: str, real_path: str) -> ModuleFacts:
    r"""The facts of one parsed module found at ``real_path`` (``os.path.realpath``).

    Example:
        >>> import ast
        >>> text = "from .common import attention\nEntryClass = [Model]\n"
        >>> facts = module_facts(ast.parse(text), text, "/src/models/llama.py")
        >>> facts.registers, facts.key
        (True, ('src', 'models', 'llama'))
    """
    key = _key(real_path)
    directory = key if os.path.basename(real_path) == "__init__.py" else key[:-1]
    references = tuple(
        reference
        for stmt in statements(tree.body, into_defs=True)
        if isinstance(stmt, (ast.Import, ast.ImportFrom))
        for reference in _references(stmt, directory)
    )
    return ModuleFacts(key, _registers(tree, text), references, tuple(top_level_defs(tree)))


def _names(reference: _Reference, target: tuple[str, ...]) -> bool:
    """Whether ``reference`` names the module whose key is ``target``."""
    module = reference.module
    if reference.exact:
        return module == target
    return 0 < len(module) <= len(target) and target[-len(module) :] == module


class ModelScope:
    r"""Which scanned modules, and which of their top-level defs, are model code.

    ``modules`` maps real paths to their facts; ``roots`` are the real paths of the
    directories scanned whole and ``holes`` those of what was left out in them (excluded,
    unreadable, not parsed). A module is model code through its importers only when a
    root holds its whole package and no hole is in it (:meth:`_covered`), so scanning a
    list of files, part of a package or a package with holes never hides an access that
    scanning the whole package reports.

    Example:
        >>> import ast
        >>> def facts(path, text):
        ...     return module_facts(ast.parse(text), text, path)
        >>> scope = ModelScope(roots=["/p"], modules={
        ...     "/p/models/llama.py": facts("/p/models/llama.py",
        ...         "from p.models.common import rope\nEntryClass = [Llama]\n"),
        ...     "/p/models/common.py": facts("/p/models/common.py",
        ...         "def rope(): ...\ndef other(): ...\n"),
        ...     "/p/layers/attn.py": facts("/p/layers/attn.py",
        ...         "from p.models.common import other\n"),
        ... })
        >>> scope.is_model_code("/p/models/common.py", "rope")
        True
        >>> scope.is_model_code("/p/models/common.py", "other")
        False
    """

    def __init__(
        self,
        modules: Mapping[str, ModuleFacts],
        roots: Iterable[str] = (),
        holes: Iterable[str] = (),
    ) -> None:
        self._modules = dict(modules)
        self._roots = tuple(_parts(root) for root in roots)
        self._holes = tuple(_parts(hole) for hole in holes)
        by_last: dict[str, list[tuple[str, _Reference]]] = {}
        for path, facts in self._modules.items():
            for reference in facts.references:
                if reference.module:
                    by_last.setdefault(reference.module[-1], []).append((path, reference))
        # path -> (importer, reference) for every import of it by another scanned module
        self._referrers: dict[str, list[tuple[str, _Reference]]] = {}
        for path, facts in self._modules.items():
            if facts.key:
                self._referrers[path] = [
                    (importer, reference)
                    for importer, reference in by_last.get(facts.key[-1], ())
                    if importer != path and _names(reference, facts.key)
                ]
        self._bound = self._least_fixpoint()

    def _covered(self, path: str) -> bool:
        """Whether a scanned directory holds the whole package ``path`` is in.

        Only then are all the importers within that package among the scanned files. The
        package is the one absolute imports of the module start with (``sglang`` in
        ``from sglang.srt.models.utils import x``; the highest, if they differ), or, with
        only relative imports, the top of the chain of ``__init__.py`` directories above it.
        """
        key = self._modules[path].key
        tops = [
            key[: len(key) - len(reference.module) + 1]
            for _, reference in self._referrers.get(path, ())
            if not reference.exact
        ]
        if tops:
            top = min(tops, key=len)
        else:
            directory = os.path.dirname(path)
            if not os.path.isfile(os.path.join(directory, "__init__.py")):
                return False
            while os.path.isfile(os.path.join(os.path.dirname(directory), "__init__.py")):
                directory = os.path.dirname(directory)
            top = _parts(directory)
        if any(hole[: len(top)] == top for hole in self._holes):
            return False  # a file of the package was excluded or could not be read
        return any(top[: len(root)] == root for root in self._roots)

    def _least_fixpoint(self) -> frozenset[str]:
        """The model definitions, then every module all of whose importers are model code.

        A module joins only once all its importers have, so an import cycle without a
        model definition in it never does.
        """
        bound = {path for path, facts in self._modules.items() if facts.registers}
        importers = {
            path: {importer for importer, _ in referrers}
            for path, referrers in self._referrers.items()
            if referrers and path not in bound and self._covered(path)
        }
        changed = True
        while changed:
            joined = {path for path, by in importers.items() if path not in bound and by <= bound}
            bound |= joined
            changed = bool(joined)
        return frozenset(bound)

    def is_model_code(self, path: str, name: str | None = None) -> bool:
        """Whether the module at ``path`` (a key of the mapping), or its def ``name``, is.

        A def is model code when its module is, or when the modules that import it (by
        name, with ``*``, or the whole module) are all model code and there is one.
        """
        if path in self._bound:
            return True
        if name is None or not self._covered(path):
            return False
        users = {
            importer
            for importer, reference in self._referrers.get(path, ())
            if reference.name in (None, "*", name)
        }
        return bool(users) and users <= self._bound
