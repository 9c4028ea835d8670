"""The ``kvcompat inspect`` and ``kvcompat doctor`` commands, as plain functions.

``kvcompat.cli`` wires them into the command line; each takes the stream to
print to and returns the process exit status.

``doctor`` never imports sglang or triton into its own process: versions come
from package metadata, SGLang's ``KVCache`` subclasses are found by reading the
installed source with :mod:`ast`, and whether SGLang's pool modules import is
tried in a child process.
"""

from __future__ import annotations

import ast
import copy
import difflib
import functools
import importlib.metadata
import importlib.util
import inspect
import json as _json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

import kvcompat
from kvcompat import _families  # the tables; importing kvcompat._registry fills them
from kvcompat._demo import build_demo_pools
from kvcompat._errors import KVCompatError, UnsupportedPoolError
from kvcompat._registry import Family, qualified_name
from kvcompat.adapters._vllm_plan import TESTED_RELEASES
from kvcompat.inspection._manifest import describe
from kvcompat.inspection._memory import MemoryReport, memory_report
from kvcompat.inspection._model import PoolManifest

__all__ = [
    "KVCacheClass",
    "build_sglang_pool",
    "find_kvcache_classes",
    "parse_pool_args",
    "run_doctor",
    "run_inspect",
]

# The engines kvcompat supports (vLLM is planned: its pools are not adapted yet).
_ENGINES = ("sglang", "vllm")
_SOURCES = ("demo",)


_REAL_SGLANG_PAGE = "the docs page 'Real SGLang pools on a CPU' (docs/real-sglang.md)"
_SGLANG_POOL_MODULES = (
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.swa_memory_pool",
    "sglang.srt.mem_cache.deepseek_v4_memory_pool",
)


def _parse_value(text: str) -> Any:
    lowered = text.strip().lower()
    if lowered in ("none", "null"):
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    dtype = getattr(torch, lowered.removeprefix("torch."), None)
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _json.loads(text)
    except ValueError:
        return text


def parse_pool_args(items: Sequence[str]) -> dict[str, Any]:
    """Constructor arguments from ``KEY=VALUE`` strings (ints, floats, bools, dtypes, JSON).

    Raises:
        ValueError: an item without ``=`` or without a key, or a key given twice.

    Example:
        >>> from kvcompat.inspection._cli import parse_pool_args
        >>> parse_pool_args(["size=64", "dtype=bfloat16", "ids=[0, 2]", "device=cpu"])
        {'size': 64, 'dtype': torch.bfloat16, 'ids': [0, 2], 'device': 'cpu'}
    """
    parsed: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            msg = (
                f"expected KEY=VALUE, got {item!r}.\n"
                "Hint: write constructor arguments as e.g. size=64 dtype=bfloat16 "
                "layer_num=2 (no spaces around '=')."
            )
            raise ValueError(msg)
        if key in parsed:
            msg = (
                f"the constructor argument {key} is given twice ({parsed[key]!r} and "
                f"{_parse_value(value)!r}).\nHint: give each KEY=VALUE once."
            )
            raise ValueError(msg)
        parsed[key] = _parse_value(value)
    return parsed


_SGLANG_DEFAULTS: Mapping[str, Any] = {"device": "cpu", "enable_memory_saver": False}
_TARGET_FORMS = "Name, package.module.Name or package.module:factory"


def _one_line(text: str) -> str:
    """A message as the one line the command line prints (``docs/cli.md``)."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _split_target(text: str) -> tuple[str | None, str]:
    """``(module or None, attribute path)`` of ``--sglang``'s ``Name``, ``a.b.Name``, ``a.b:f``."""
    if ":" in text:
        module, _, attr = text.partition(":")
    elif "." in text:
        module, _, attr = text.rpartition(".")
    else:
        return None, _checked_name(text, text)
    if module.startswith("."):
        msg = (
            f"--sglang {text!r} is a relative module path; kvcompat imports absolute paths "
            "only (there is no package to resolve it against).\n"
            "Hint: write the path from its top-level package, e.g. "
            "--sglang mypackage.pools:make_pool, with the package importable (installed, or "
            "its folder on PYTHONPATH)."
        )
        raise ValueError(msg)
    if not all(piece.isidentifier() for piece in module.split(".")):
        msg = (
            f"--sglang {text!r}: {module!r} is not a module path.\n"
            f"Hint: give {_TARGET_FORMS} (e.g. MHATokenToKVPool)."
        )
        raise ValueError(msg)
    return module, _checked_name(attr, text)


def _checked_name(attr: str, text: str) -> str:
    if not attr or not all(piece.isidentifier() for piece in attr.split(".")):
        what = f"{attr!r} is not a name" if attr else "names no class"
        msg = f"--sglang {text!r}: {what}.\nHint: give {_TARGET_FORMS} (e.g. MHATokenToKVPool)."
        raise ValueError(msg)
    return attr


def _import_failed(module_name: str, exc: BaseException) -> str:
    return (
        f"importing {module_name} failed: {type(exc).__name__}: {exc}.\n"
        f'Hint: fix that error (python -c "import {module_name}" shows its traceback), or '
        "install what the module imports."
    )


def _import_user_module(module_name: str) -> Any:
    """A module of the user's (not SGLang's), or ValueError saying why it cannot be imported."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if not missing or not (module_name + ".").startswith(missing + "."):
            raise ValueError(_import_failed(module_name, exc)) from None  # a dependency
        msg = (
            f"cannot import {module_name}: there is no module {missing!r} on this Python's "
            "path.\n"
            "Hint: check the spelling; a module of your own must be importable: install it, "
            "or put its folder on PYTHONPATH (the kvcompat command does not look in the "
            "current directory; python -m kvcompat does)."
        )
        raise ValueError(msg) from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a SyntaxError, a RuntimeError...
        raise ValueError(_import_failed(module_name, exc)) from None


def _lookup(module: Any, attr: str) -> Any:
    target = module
    for piece in attr.split("."):
        target = getattr(target, piece, None)
        if target is None:
            return None
    return target


def _not_found(attr: str, modules: Sequence[Any], *, sglang: bool) -> str:
    names = sorted(
        {
            name
            for module in modules
            for name, value in vars(module).items()
            if not name.startswith("_") and (isinstance(value, type) or not sglang)
            if callable(value)
        }
    )
    close = difflib.get_close_matches(attr.rsplit(".", 1)[-1], names, n=3)
    where = ", ".join(module.__name__ for module in modules)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    if sglang:
        hint += (
            "kvcompat doctor lists the KVCache classes of the installed SGLang; give one "
            "elsewhere by its path (e.g. --sglang sglang.srt.mem_cache.memory_pool.Name)."
        )
    else:
        hint += f'python -c "import {where}; print(dir({where}))" lists what it defines.'
    kind = "pool class" if sglang else "class or factory"
    return f"no {kind} {attr!r} in {where}.\nHint: {hint}"


def _resolve_target(class_name: str) -> tuple[Any, str]:
    """The class or factory ``--sglang`` names, and how to call it in messages."""
    module_name, attr = _split_target(class_name)
    sglang = module_name is None or module_name.partition(".")[0] == "sglang"
    if sglang:
        module_names = _SGLANG_POOL_MODULES if module_name is None else (str(module_name),)
        modules: list[Any] = []
        target = None
        for name in module_names:
            try:
                module = importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001 - a broken dependency raises anything
                raise ValueError(_import_error(name, exc)) from None  # names it and the fix
            modules.append(module)
            target = _lookup(module, attr)
            if target is not None:
                break
    else:
        modules = [_import_user_module(str(module_name))]
        target = _lookup(modules[0], attr)
    if target is None:
        raise ValueError(_not_found(attr, modules, sglang=sglang))
    display = attr if module_name is None else class_name
    if not callable(target):
        msg = (
            f"--sglang {class_name}: {display} is {_received(target)}, not a class or a "
            "factory function.\n"
            "Hint: give a pool class (e.g. MHATokenToKVPool) or a function that returns a "
            "pool (package.module:factory)."
        )
        raise ValueError(msg)
    return target, display


def _parameters(signature: inspect.Signature | None) -> str:
    if signature is None:
        return "its parameters are unknown (no signature)"
    shown = [str(p.replace(annotation=p.empty)) for p in signature.parameters.values()]
    return f"its parameters: {', '.join(shown) or 'none'}"


def _check_arguments(
    display: str, signature: inspect.Signature, arguments: Mapping[str, Any]
) -> None:
    """Refuse arguments the callable cannot take before calling it, naming each one."""
    params = signature.parameters
    by_keyword = {
        name: p for name, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    any_keyword = any(p.kind is p.VAR_KEYWORD for p in params.values())
    unexpected = [key for key in arguments if key not in by_keyword and not any_keyword]
    if unexpected:
        guesses = [
            f"{key} (did you mean {close[0]}?)"
            if (close := difflib.get_close_matches(key, list(by_keyword), n=1))
            else key
            for key in unexpected
        ]
        msg = (
            f"{display} takes no argument {', '.join(guesses)}.\n"
            f"Hint: pass only its parameters as KEY=VALUE; {_parameters(signature)}."
        )
        raise ValueError(msg)
    positional = [
        name for name, p in params.items() if p.kind is p.POSITIONAL_ONLY and p.default is p.empty
    ]
    if positional:
        msg = (
            f"{display} needs positional-only arguments ({', '.join(positional)}), which "
            "KEY=VALUE cannot give.\n"
            "Hint: wrap it in a factory function that takes keyword arguments and give "
            "--sglang package.module:factory."
        )
        raise ValueError(msg)
    missing = [name for name, p in by_keyword.items() if p.default is p.empty]
    missing = [name for name in missing if name not in arguments]
    if missing:
        msg = (
            f"{display} needs {', '.join(missing)}, which {'was' if len(missing) == 1 else 'were'}"
            " not given.\n"
            f"Hint: pass {'it' if len(missing) == 1 else 'them'} as KEY=VALUE, e.g. "
            f"{' '.join(f'{name}=...' for name in missing)}; {_parameters(signature)}."
        )
        raise ValueError(msg)


def build_sglang_pool(class_name: str, kwargs: Mapping[str, Any]) -> Any:
    """Import SGLang's pool class (or any class or factory, by path) and call it.

    ``class_name`` is a class of SGLang's pool modules (``MHATokenToKVPool``), a
    dotted path (``package.module.Name``) or ``package.module:factory``.
    ``device="cpu"`` and ``enable_memory_saver=False`` are defaults where the
    callable takes them. This imports sglang, on purpose: the user asked for one of
    its pools.

    Raises:
        ValueError: the name is malformed or not found, its module cannot be imported,
            the arguments do not fit, or the call fails; the message says what was
            received and ends with a ``Hint:``.

    Example:
        >>> from kvcompat.inspection._cli import build_sglang_pool
        >>> try:
        ...     build_sglang_pool(".pools:make_pool", {})
        ... except ValueError as exc:
        ...     print(str(exc).split(";")[0])
        --sglang '.pools:make_pool' is a relative module path
    """
    target, display = _resolve_target(class_name)
    try:
        signature: inspect.Signature | None = inspect.signature(target)
    except (TypeError, ValueError):  # builtins and C types may have none
        signature = None
    defaults: dict[str, Any] = {}
    if signature is not None:
        params = signature.parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        defaults = {
            key: value
            for key, value in _SGLANG_DEFAULTS.items()
            if takes_any or (key in params and params[key].kind is not params[key].POSITIONAL_ONLY)
        }
    arguments = {**defaults, **kwargs}
    if inspect.isclass(target) and inspect.isabstract(target):
        msg = (
            f"{display} is an abstract class; it cannot be built.\n"
            "Hint: give one of its concrete subclasses (kvcompat doctor lists SGLang's)."
        )
        raise ValueError(msg)
    if signature is not None:
        _check_arguments(display, signature, arguments)
    call = f"{display}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"
    try:
        return target(**arguments)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported with the call made
        msg = (
            f"{call} raised {type(exc).__name__}: {exc}.\n"
            f"Hint: check the values against {_parameters(signature).removeprefix('its ')}."
        )
        raise ValueError(msg) from None


def _received(value: Any, limit: int = 60) -> str:
    """``a module.Type`` and, when it says more than the type, a short repr: ``(0)``."""
    got = f"a {qualified_name(type(value))}"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a failing repr: the type still names it
        return got
    if text.startswith("<"):  # object.__repr__: nothing the type does not say
        return got
    return f"{got} ({text if len(text) <= limit else text[: limit - 3] + '...'})"


def _inspect_one(native: Any, what: str) -> tuple[PoolManifest, MemoryReport]:
    """``describe`` and ``memory_report`` of what ``what`` built, or ValueError saying why not."""
    try:
        manifest = describe(native)
        return manifest, memory_report(manifest)
    except UnsupportedPoolError as exc:
        text = str(exc)
        if text.startswith("describe() needs"):  # the first line repeats what we say
            text = text.partition("\n")[2] or text
        reason = text
    except KVCompatError as exc:
        reason = str(exc)
    except Exception as exc:  # noqa: BLE001 - a kvcompat bug must still be one line
        reason = (
            f"{type(exc).__name__}: {exc}.\nHint: if it is a supported pool, this is a "
            "kvcompat bug: please report it with the output of kvcompat doctor."
        )
    msg = f"{what} built {_received(native)}, which kvcompat cannot inspect: {reason}"
    raise ValueError(msg)


def _pools(
    source: str, sglang_class: str | None, pool_args: Sequence[str]
) -> tuple[str, dict[str, Any]]:
    """``(source, {name: pool})`` the arguments ask for, or ValueError."""
    if sglang_class is None:
        if pool_args:
            msg = (
                f"KEY=VALUE arguments ({' '.join(pool_args)}) are constructor arguments for "
                "--sglang CLASS, and no --sglang was given.\n"
                "Hint: add --sglang CLASS (e.g. --sglang MHATokenToKVPool), or drop them to "
                "inspect the demo pools."
            )
            raise ValueError(msg)
        if source not in _SOURCES:
            msg = (
                f"unknown source {source!r}; choose one of: {', '.join(_SOURCES)}.\n"
                "Hint: --source demo inspects the reference pools; --sglang CLASS "
                "KEY=VALUE... builds an SGLang pool and inspects it."
            )
            raise ValueError(msg)
        return source, build_demo_pools()
    if source != "demo":
        msg = (
            f"--source {source!r} and --sglang {sglang_class!r} were both given.\n"
            "Hint: give one: --sglang builds the pool it inspects."
        )
        raise ValueError(msg)
    kwargs = parse_pool_args(pool_args)
    return "sglang", {sglang_class: build_sglang_pool(sglang_class, kwargs)}


def run_inspect(
    out: TextIO,
    *,
    source: str = "demo",
    json: bool = False,
    sglang_class: str | None = None,
    pool_args: Sequence[str] = (),
    err: TextIO | None = None,
) -> int:
    """Print the manifest tree and memory report of each demo pool; returns the exit status.

    Every failure (a bad argument, a class that cannot be imported or built, an object
    kvcompat cannot inspect) prints one line, ``kvcompat inspect: error: ...`` with what
    was received and a ``Hint:``, to ``err`` and returns 2; nothing goes to ``out``.

    Args:
        out: where to print.
        source: which pools to inspect; ``"demo"`` (the reference MHA, MLA and
            DeepSeek-V4 pools of ``kvcompat demo``) unless ``sglang_class`` is given.
        json: print one JSON document instead of text.
        sglang_class: an SGLang pool class (``MHATokenToKVPool``), a dotted path or
            ``package.module:factory``, to build from ``pool_args`` (``KEY=VALUE``
            strings) and inspect.
        pool_args: the constructor arguments of ``sglang_class``.
        err: where to print an error (the command line passes stderr); ``out``
            when None. Errors return 2.

    Example:
        >>> import io, json
        >>> from kvcompat.inspection._cli import run_inspect
        >>> buf = io.StringIO()
        >>> run_inspect(buf, json=True)
        0
        >>> sorted(json.loads(buf.getvalue())["pools"])
        ['DeepSeek-V4 single-KV', 'MHA', 'MLA']
        >>> run_inspect(buf, sglang_class="builtins.int", err=sys.stdout)  # doctest: +ELLIPSIS
        kvcompat inspect: error: --sglang builtins.int built a builtins.int (0), which ...
        2
    """
    err = out if err is None else err
    try:
        source, pools = _pools(source, sglang_class, pool_args)
        what = f"--sglang {sglang_class}"
        reports = {name: _inspect_one(native, what) for name, native in pools.items()}
    except ValueError as exc:
        print(f"kvcompat inspect: error: {_one_line(str(exc))}", file=err)
        return 2
    if json:
        document = {
            "source": source,
            "pools": {
                name: {"manifest": manifest.to_dict(), "memory": memory.to_dict()}
                for name, (manifest, memory) in reports.items()
            },
        }
        print(_json.dumps(document, indent=2), file=out)
        return 0
    if source == "sglang":
        print(f"kvcompat inspect: an SGLang {sglang_class}", file=out)
    else:
        print(
            f"kvcompat inspect: the {len(pools)} demo pools (reference pools, pure torch)",
            file=out,
        )
    for name, (manifest, memory) in reports.items():
        print("", file=out)
        print(f"== {name} ==", file=out)
        print(manifest, file=out)
        print("", file=out)
        print(memory, file=out)
    return 0


# -- doctor ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVCacheClass:
    """One ``KVCache`` subclass found in the installed SGLang source, and kvcompat's answer.

    Attributes:
        qualname: ``"sglang.module.ClassName"``.
        bases: qualified names of its direct bases, as written in the source.
        kind: the pool kind kvcompat assigns (``"split"``, ``"single_kv"``...),
            or ``"unsupported"``.
        via: the registered class the answer comes from (the class itself,
            or its nearest registered base).
        reason: why kvcompat does not support it, when it does not.

    Example:
        >>> from kvcompat.inspection._cli import KVCacheClass
        >>> KVCacheClass("sglang.m.P", ("sglang.m.KVCache",), "unsupported", None, None).supported
        False
    """

    qualname: str
    bases: tuple[str, ...]
    kind: str
    via: str | None
    reason: str | None

    @property
    def supported(self) -> bool:
        """Whether kvcompat adapts the class.

        Example:
            >>> from kvcompat.inspection._cli import KVCacheClass
            >>> KVCacheClass("sglang.m.P", (), "split", "sglang.m.P", None).supported
            True
        """
        return self.kind != "unsupported"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form.

        Example:
            >>> from kvcompat.inspection._cli import KVCacheClass
            >>> KVCacheClass("sglang.m.P", (), "split", "sglang.m.P", None).to_dict()["kind"]
            'split'
        """
        return {
            "qualname": self.qualname,
            "bases": list(self.bases),
            "kind": self.kind,
            "via": self.via,
            "reason": self.reason,
        }


_CLASS_HEAD = re.compile(r"^[ \t]*class[ \t]+(\w+)[ \t]*\(", re.MULTILINE)
_NAME = re.compile(r"[A-Za-z_][\w.]*")


def _header_bases(source: str, start: int) -> list[str]:
    """Bare names inside the parentheses of a class header (a cheap pre-filter)."""
    depth, end = 1, start
    while end < len(source) and depth:
        depth += {"(": 1, ")": -1}.get(source[end], 0)
        end += 1
    return [name.rsplit(".", 1)[-1] for name in _NAME.findall(source[start : end - 1])]


def _candidate_files(root: Path, base: str) -> list[Path]:
    """Files defining a class that may (by name) derive from ``base``, found without parsing."""
    defined: dict[str, list[tuple[Path, set[str]]]] = {}
    for path in sorted(root.rglob("*.py")):
        try:
            source = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for match in _CLASS_HEAD.finditer(source):
            bases = set(_header_bases(source, match.end()))
            defined.setdefault(match.group(1), []).append((path, bases))
    closure = {base}
    grew = True
    while grew:
        grew = False
        for name, entries in defined.items():
            if name not in closure and any(closure & bases for _, bases in entries):
                closure.add(name)
                grew = True
    return sorted({path for name in closure for path, _ in defined.get(name, ())})


def _module_name(path: Path, package_root: Path) -> str:
    parts = list(path.relative_to(package_root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.Module, module: str) -> dict[str, str]:
    """Local name -> qualified name, from a module's import statements."""
    names: dict[str, str] = {}
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                origin = f"{base}.{node.module}" if node.module else base
            else:
                origin = node.module or ""
            for alias in node.names:
                names[alias.asname or alias.name] = f"{origin}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".", 1)[0]
                names[local] = alias.name if alias.asname else local
    return names


def _base_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Subscript):  # Generic[T], Protocol[...]
        node = node.value
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _base_name(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def _parse_classes(files: Iterable[Path], package_root: Path) -> dict[str, tuple[str, ...]]:
    """Qualified class name -> qualified names of its bases, from the AST of ``files``."""
    raw: dict[str, tuple[str, ...]] = {}
    for path in files:
        module = _module_name(path, package_root)
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"), str(path))
        except (OSError, SyntaxError):
            continue
        imported = _imports(tree, module)
        local = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            bases: list[str] = []
            for expr in node.bases:
                name = _base_name(expr)
                if name is None:
                    continue
                head, _, rest = name.partition(".")
                if head in local and not rest:
                    bases.append(f"{module}.{head}")
                elif head in imported:
                    bases.append(imported[head] + (f".{rest}" if rest else ""))
                else:
                    bases.append(name)
            raw[f"{module}.{node.name}"] = tuple(bases)
    # Re-exported names (imported from a package that does not define them): resolve by
    # the bare class name when exactly one parsed class has it.
    by_short: dict[str, list[str]] = {}
    for qualname in raw:
        by_short.setdefault(qualname.rsplit(".", 1)[-1], []).append(qualname)
    resolved: dict[str, tuple[str, ...]] = {}
    for qualname, written in raw.items():
        fixed: list[str] = []
        for base in written:
            matches = by_short.get(base.rsplit(".", 1)[-1], [])
            fixed.append(matches[0] if base not in raw and len(matches) == 1 else base)
        resolved[qualname] = tuple(fixed)
    return resolved


def _linearize(
    cls: str, bases: Mapping[str, tuple[str, ...]], _stack: tuple[str, ...] = ()
) -> list[str]:
    """The class's MRO from its AST bases (C3; depth-first when C3 has no solution)."""
    if cls in _stack:
        return [cls]
    parents = bases.get(cls, ())
    sequences = [_linearize(parent, bases, (*_stack, cls)) for parent in parents]
    sequences.append(list(parents))
    result = [cls]
    pending = [list(seq) for seq in sequences if seq]
    while pending:
        for seq in pending:
            head = seq[0]
            if not any(head in other[1:] for other in pending):
                break
        else:  # inconsistent hierarchy: fall back to depth-first, left to right
            for seq in pending:
                result.extend(name for name in seq if name not in result)
            return result
        result.append(head)
        pending = [[n for n in seq if n != head] for seq in pending]
        pending = [seq for seq in pending if seq]
    return result


def _registered_families() -> tuple[Mapping[str, Family], Mapping[tuple[str, str], Family]]:
    """The registrations: by qualified name, and the class-name fallback for engines."""
    # Read-only use of the registry's tables: the same ones family_of() consults.
    return _families._families, _families._by_class_name


def _answer(mro: Sequence[str]) -> tuple[str, str | None, str | None]:
    """``(kind or "unsupported", registered class answering, reason)`` for an AST-derived MRO."""
    families, by_class_name = _registered_families()
    found: Family | None = None
    via: str | None = None
    for qualname in mro:
        if qualname in families:
            found, via = families[qualname], qualname
            break
    if found is None:
        for qualname in mro:
            short = qualname.rsplit(".", 1)[-1]
            for (prefix, name), family in by_class_name.items():
                if name == short and qualname.startswith(prefix):
                    found, via = family, family.qualname
                    break
            if found is not None:
                break
    if found is None:
        return "unsupported", None, "kvcompat knows no class along its bases."
    if found.kind is None:
        return "unsupported", via, found.reason
    return found.kind.value, via, None


def find_kvcache_classes(package_root: Path) -> tuple[KVCacheClass, ...]:
    """Every transitive ``KVCache`` subclass in an SGLang source tree, with kvcompat's answer.

    Reads ``package_root/srt/**/*.py`` with :mod:`ast` (a regular-expression
    pass first picks the few files worth parsing); nothing is imported.

    Args:
        package_root: the ``sglang`` package directory.

    Returns:
        The classes, sorted by qualified name (``KVCache`` itself excluded).

    Example:
        >>> from pathlib import Path
        >>> from kvcompat.inspection._cli import find_kvcache_classes
        >>> find_kvcache_classes(Path("/nonexistent/sglang"))
        ()
    """
    srt = package_root / "srt"
    if not srt.is_dir():
        return ()
    bases = _parse_classes(_candidate_files(srt, "KVCache"), package_root)
    roots = {name for name in bases if name.rsplit(".", 1)[-1] == "KVCache"}
    found: list[KVCacheClass] = []
    for qualname in sorted(bases):
        if qualname in roots:
            continue
        mro = _linearize(qualname, bases)
        if not roots & set(mro[1:]):
            continue
        kind, via, reason = _answer(mro)
        found.append(KVCacheClass(qualname, bases[qualname], kind, via, reason))
    return tuple(found)


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _package_dir(name: str) -> Path | None:
    """Where a top-level package is installed, without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


# Run by ``python -c`` in a child process (argv[1]: JSON of the module names and, for the
# second try, the file of kvcompat's torchvision shim, loaded from its file so that the child
# needs nothing but this interpreter): imports SGLang's pool modules, prints one JSON line.
_IMPORT_PROBE = """
import importlib, importlib.util, json, sys, traceback, warnings
warnings.simplefilter("ignore")
modules, shim_file = json.loads(sys.argv[1])
result = {"ok": True, "module": None, "error": None, "missing": None, "torchvision": False}
if shim_file:
    spec = importlib.util.spec_from_file_location("_kvcompat_sglang_cpu", shim_file)
    shim = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = shim
    spec.loader.exec_module(shim)
    result["said"] = str(shim.sglang_cpu())
for name in modules:
    try:
        importlib.import_module(name)
    except BaseException as exc:
        files = [frame.filename for frame in traceback.extract_tb(exc.__traceback__)]
        missing = getattr(exc, "name", None) if isinstance(exc, ImportError) else None
        text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        torchvision = (missing or "").split(".")[0] == "torchvision" or any(
            "torchvision" in where for where in files) or "torchvision" in text
        result.update(ok=False, module=name, error=text, missing=missing, torchvision=torchvision)
        break
print(json.dumps(result))
"""


def _sglang_import_fix(missing: str | None, torchvision: bool, shim_ok: bool) -> str:
    """The hint for a failed import of SGLang's pool modules."""
    if torchvision:
        fix = (
            "SGLang's pool modules import torchvision (sglang.srt.configs), and no working "
            f"one imports here. Hint: install a torchvision built for torch {torch.__version__}, "
            "or call kvcompat.testing.sglang_cpu() before importing sglang (an import-only "
            "torchvision shim for CPU machines"
        )
        fix += ", which makes them import here)" if shim_ok else ")"
        return f"{fix}; see {_REAL_SGLANG_PAGE}."
    if missing:
        return (
            f"SGLang's pool modules need the module {missing!r}, which is not installed. "
            f"Hint: install the distribution that provides it; with sglang installed "
            "--no-deps on a CPU machine, the light packages those modules import are pinned "
            "in requirements/sglang-cpu.txt of a kvcompat checkout "
            f"(pip install --no-deps -r requirements/sglang-cpu.txt); see {_REAL_SGLANG_PAGE}."
        )
    return f"The error comes from SGLang's own import; see {_REAL_SGLANG_PAGE}."


def _import_error(module_name: str, exc: Exception) -> str:
    """``cannot import M (error); `` and what is missing, with the fix."""
    missing = exc.name if isinstance(exc, ImportError) else None
    head = f"cannot import {module_name} ({type(exc).__name__}: {exc})"
    if isinstance(exc, ModuleNotFoundError):
        head = f"cannot import {module_name} ({exc})"
    top = module_name.split(".", maxsplit=1)[0]
    if missing == top:
        where = f"; see {_REAL_SGLANG_PAGE} for a CPU machine" if top == "sglang" else ""
        return f"{head}; {top} is not installed. Hint: pip install {top}{where}."
    frames = traceback.extract_tb(exc.__traceback__)
    torchvision = (missing or "").split(".")[0] == "torchvision" or any(
        "torchvision" in frame.filename for frame in frames
    )
    torchvision = torchvision or "torchvision" in str(exc)
    return f"{head}; {_sglang_import_fix(missing, torchvision, shim_ok=False)}"


class _ImportChild:
    """One child process's try at importing SGLang's pool modules (see ``_IMPORT_PROBE``).

    The child gets this interpreter and environment, with SGLang's cache folders pointed at
    a temporary folder (deleted by :meth:`report`) so that the probe writes nothing of its own.
    """

    def __init__(self, shim_file: Path | None) -> None:
        self._cache = tempfile.mkdtemp(prefix="kvcompat-doctor-")
        env = {**os.environ, "SGLANG_CACHE_DIR": self._cache, "SGLANG_JIT_CACHE_DIR": self._cache}
        argument = _json.dumps([list(_SGLANG_POOL_MODULES), shim_file and str(shim_file)])
        self._child = subprocess.Popen(  # noqa: S603 -- this interpreter, our own probe
            [sys.executable, "-c", _IMPORT_PROBE, argument],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def cancel(self) -> None:
        """Stop the child (its answer is not needed) and delete its cache folder."""
        self._child.kill()
        self._child.communicate()
        shutil.rmtree(self._cache, ignore_errors=True)

    def report(self, timeout: float) -> dict[str, Any]:
        """Wait for the child; its JSON line, or what went wrong."""
        try:
            stdout, stderr = self._child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.communicate()
            error = f"the import took longer than {timeout:.0f} s"
        else:
            lines = stdout.strip().splitlines()
            try:
                report: dict[str, Any] = _json.loads(lines[-1])
            except (IndexError, ValueError):
                tail = (stderr.strip().splitlines() or ["(no output)"])[-1]
                error = f"the child process exited {self._child.returncode}: {tail}"
            else:
                return report
        finally:
            shutil.rmtree(self._cache, ignore_errors=True)
        return {"ok": False, "module": None, "error": error, "missing": None, "torchvision": False}


@functools.cache
def _sglang_import_check(timeout: float = 600.0) -> Mapping[str, Any]:
    """Import SGLang's pool modules in a child process: what fails, why, and the fix.

    When torchvision is the culprit, a second child tries again with
    :func:`kvcompat.testing.sglang_cpu` (started alongside the first where torchvision is
    not installed at all, so the two imports overlap). Asked once per process (each import
    takes seconds); callers copy the answer.
    """
    started = time.perf_counter()
    shim_file = Path(__file__).resolve().parents[1] / "testing" / "_sglang_cpu.py"
    plain = _ImportChild(None)
    early = _ImportChild(shim_file) if _package_dir("torchvision") is None else None
    report = plain.report(timeout)
    shim: dict[str, Any] | None = None
    if report["torchvision"]:
        shim = (early or _ImportChild(shim_file)).report(timeout)
    elif early is not None:
        early.cancel()
    shim_ok = bool(shim and shim["ok"])
    if shim is not None and not shim_ok:
        shim["fix"] = _sglang_import_fix(shim["missing"], shim["torchvision"], shim_ok=False)
    report["shim"] = shim
    report["fix"] = (
        None
        if report["ok"]
        else _sglang_import_fix(report["missing"], report["torchvision"], shim_ok)
    )
    report["modules"] = list(_SGLANG_POOL_MODULES)
    report["seconds"] = round(time.perf_counter() - started, 3)
    return report


def _environment() -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    device_name = torch.cuda.get_device_name(0) if cuda else None
    triton_dir = _package_dir("triton")
    engines: dict[str, str | None] = {name: _version(name) for name in _ENGINES}
    return {
        "kvcompat": kvcompat.__version__,
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
        },
        "torch": {
            "version": torch.__version__,
            "cuda_available": cuda,
            "cuda_version": torch.version.cuda,
            "device_name": device_name,
        },
        "triton": {
            "version": _version("triton") if triton_dir is not None else None,
            "installed": triton_dir is not None,
        },
        "engines": engines,
    }


def run_doctor(out: TextIO, *, json: bool = False) -> int:
    """Print the environment kvcompat runs in, and how it sees the installed SGLang.

    Reports Python, torch (version, CUDA, device), triton, SGLang and vLLM (with
    whether its release is one the vLLM tier runs under); when SGLang is installed, every
    ``KVCache`` subclass in its source with the kind kvcompat assigns it, or
    ``unsupported`` and why, and whether SGLang's pool modules import: tried in
    a child process, so that neither sglang nor triton is imported here. If
    they do not import, it names the failing module and missing dependency and
    the fix (for torchvision on a CPU machine: :func:`kvcompat.testing.sglang_cpu`,
    retried with it).

    Args:
        out: where to print.
        json: print one JSON document instead of text.

    Example:
        >>> import io, json
        >>> from kvcompat.inspection._cli import run_doctor
        >>> buf = io.StringIO()
        >>> run_doctor(buf, json=True)
        0
        >>> sorted(json.loads(buf.getvalue()))  # doctest: +NORMALIZE_WHITESPACE
        ['engines', 'kvcompat', 'python', 'seconds', 'sglang_classes', 'sglang_import',
         'torch', 'triton', 'vllm']
    """
    started = time.perf_counter()
    env = _environment()
    sglang_dir = _package_dir("sglang") if env["engines"]["sglang"] is not None else None
    classes = find_kvcache_classes(sglang_dir) if sglang_dir is not None else ()
    env["sglang_classes"] = [entry.to_dict() for entry in classes] if sglang_dir else None
    env["sglang_import"] = (
        copy.deepcopy(dict(_sglang_import_check())) if sglang_dir is not None else None
    )
    vllm_version = env["engines"]["vllm"]
    env["vllm"] = {
        "version": vllm_version,
        "tested_releases": list(TESTED_RELEASES),
        "tested": vllm_version in TESTED_RELEASES,
    }
    env["seconds"] = round(time.perf_counter() - started, 3)
    if json:
        print(_json.dumps(env, indent=2), file=out)
        return 0
    torch_info, triton_info = env["torch"], env["triton"]
    print(f"kvcompat {env['kvcompat']} doctor", file=out)
    print(
        f"  python   {env['python']['version']} ({env['python']['implementation']}) "
        f"{env['python']['executable']}",
        file=out,
    )
    cuda = (
        f"CUDA {torch_info['cuda_version']}, device {torch_info['device_name']}"
        if torch_info["cuda_available"]
        else "CUDA not available"
    )
    print(f"  torch    {torch_info['version']} ({cuda})", file=out)
    triton = triton_info["version"] or ("installed" if triton_info["installed"] else None)
    print(f"  triton   {triton or 'not installed'}", file=out)
    print("engines (kvcompat supports SGLang and vLLM)", file=out)
    for name, version in env["engines"].items():
        print(f"  {name:<12} {version or 'not installed'}", file=out)
    tested = ", ".join(TESTED_RELEASES)
    if vllm_version is not None:
        verdict = (
            "a tested release"
            if env["vllm"]["tested"]
            else "not a tested release: adapt() may refuse or misread its caches"
        )
        print(
            f"vLLM {vllm_version}: {verdict} (tested: {tested}); adapt the connector's "
            "caches with kvcompat.adapt(kv_caches, config=kv_cache_config).",
            file=out,
        )
    if sglang_dir is None:
        print("SGLang is not installed: no KVCache classes to check.", file=out)
        return 0
    supported = sum(entry.supported for entry in classes)
    print(
        f"SGLang KVCache subclasses ({len(classes)} found by reading {sglang_dir / 'srt'}; "
        f"{supported} supported; sglang not imported):",
        file=out,
    )
    width = max((len(entry.qualname) for entry in classes), default=0)
    for entry in classes:
        answer = entry.kind
        if entry.via is not None and entry.via != entry.qualname:
            answer += f" (as {entry.via.rsplit('.', 1)[-1]})"
        if entry.reason and entry.via == entry.qualname:
            answer += f": {entry.reason}"
        print(f"  {entry.qualname:<{width}}  {answer}", file=out)
    _print_import_check(out, env["sglang_import"])
    print(f"({env['seconds']:.2f} s)", file=out)
    return 0


def _print_import_check(out: TextIO, report: Mapping[str, Any]) -> None:
    modules = len(report["modules"])
    print(
        f"SGLang's pool modules (imported in a child process, {report['seconds']:.1f} s):",
        file=out,
    )
    if report["ok"]:
        print(f"  all {modules} import: {', '.join(report['modules'])}", file=out)
        return
    where = f"{report['module']}: " if report["module"] else ""
    print(f"  FAILED: {where}{report['error']}", file=out)
    shim = report.get("shim")
    if shim is not None:
        said = "with kvcompat.testing.sglang_cpu()"
        if shim["ok"]:
            print(f"  {said}: all {modules} import ({shim.get('said')})", file=out)
        else:
            print(f"  {said}: FAILED: {shim['module']}: {shim['error']}", file=out)
    print(f"  {report['fix']}", file=out)
    if shim is not None and not shim["ok"]:
        print(f"  then: {shim['fix']}", file=out)
