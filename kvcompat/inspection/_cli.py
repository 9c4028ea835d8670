"""The ``kvcompat inspect`` and ``kvcompat doctor`` commands, as plain functions.

``kvcompat.cli`` wires them into the command line; each takes the stream to
print to and returns the process exit status.

``doctor`` never imports sglang or triton: versions come from package
metadata, and SGLang's ``KVCache`` subclasses are found by reading the
installed source with :mod:`ast`.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import inspect
import json as _json
import platform
import re
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

import kvcompat
from kvcompat import _families  # the tables; importing kvcompat._registry fills them
from kvcompat._demo import build_demo_pools
from kvcompat._registry import Family
from kvcompat.inspection._manifest import describe
from kvcompat.inspection._memory import memory_report

__all__ = [
    "KVCacheClass",
    "build_sglang_pool",
    "find_kvcache_classes",
    "parse_pool_args",
    "run_doctor",
    "run_inspect",
]

_ENGINES = ("sglang", "vllm", "tensorrt-llm")
_SOURCES = ("demo",)


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
        ValueError: an item without ``=``.

    Example:
        >>> from kvcompat.inspection._cli import parse_pool_args
        >>> parse_pool_args(["size=64", "dtype=bfloat16", "ids=[0, 2]", "device=cpu"])
        {'size': 64, 'dtype': torch.bfloat16, 'ids': [0, 2], 'device': 'cpu'}
    """
    parsed: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            msg = f"expected KEY=VALUE, got {item!r}; e.g. size=64 dtype=bfloat16 layer_num=2."
            raise ValueError(msg)
        parsed[key.strip()] = _parse_value(value)
    return parsed


def build_sglang_pool(class_name: str, kwargs: Mapping[str, Any]) -> Any:
    """Import SGLang's pool class (by name or ``module.Class``) and construct it.

    ``device="cpu"`` and ``enable_memory_saver=False`` are defaults. This imports
    sglang, on purpose: the user asked for one of its pools.

    Raises:
        ValueError: the class cannot be found, or the constructor rejects the arguments.

    Example:
        >>> from kvcompat.inspection._cli import build_sglang_pool
        >>> try:
        ...     build_sglang_pool("nosuchpackage.Pool", {})
        ... except ValueError as exc:
        ...     print(str(exc).split(";")[0])
        cannot import nosuchpackage (No module named 'nosuchpackage')
    """
    if "." in class_name:
        module_names: tuple[str, ...] = (class_name.rsplit(".", 1)[0],)
        name = class_name.rsplit(".", 1)[1]
    else:
        module_names, name = _SGLANG_POOL_MODULES, class_name
    cls = None
    for module_name in module_names:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            msg = f"cannot import {module_name} ({exc}); is SGLang installed?"
            raise ValueError(msg) from None
        cls = getattr(module, name, None)
        if cls is not None:
            break
    if not isinstance(cls, type):
        msg = f"no pool class {class_name!r} in {', '.join(module_names)}."
        raise ValueError(msg)
    arguments = {"device": "cpu", "enable_memory_saver": False, **kwargs}
    try:
        return cls(**arguments)
    except Exception as exc:  # noqa: BLE001 - reported with the constructor's signature
        msg = (
            f"{cls.__name__}({', '.join(f'{k}={v!r}' for k, v in arguments.items())}) failed: "
            f"{type(exc).__name__}: {exc}\nits parameters: {inspect.signature(cls)}"
        )
        raise ValueError(msg) from None


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

    Args:
        out: where to print.
        source: which pools to inspect; ``"demo"`` (the reference MHA, MLA and
            DeepSeek-V4 pools of ``kvcompat demo``) unless ``sglang_class`` is given.
        json: print one JSON document instead of text.
        sglang_class: an SGLang pool class (``MHATokenToKVPool`` or a dotted path)
            to build from ``pool_args`` (``KEY=VALUE`` strings) and inspect.
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
    """
    err = out if err is None else err
    if sglang_class is not None:
        try:
            pools = {sglang_class: build_sglang_pool(sglang_class, parse_pool_args(pool_args))}
        except ValueError as exc:
            print(f"kvcompat inspect: error: {exc}", file=err)
            return 2
        source = "sglang"
    elif source not in _SOURCES:
        print(
            f"kvcompat inspect: error: unknown source {source!r}; "
            f"choose one of: {', '.join(_SOURCES)}.",
            file=err,
        )
        return 2
    else:
        pools = build_demo_pools()
    if json:
        document = {
            "source": source,
            "pools": {
                name: {
                    "manifest": describe(native).to_dict(),
                    "memory": memory_report(native).to_dict(),
                }
                for name, native in pools.items()
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
    for name, native in pools.items():
        manifest = describe(native)
        print("", file=out)
        print(f"== {name} ==", file=out)
        print(manifest, file=out)
        print("", file=out)
        print(memory_report(manifest), file=out)
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

    Reports Python, torch (version, CUDA, device), triton and the installed
    engines; when SGLang is installed, every ``KVCache`` subclass in its
    source with the kind kvcompat assigns it, or ``unsupported`` and why.
    Neither sglang nor triton is imported.

    Args:
        out: where to print.
        json: print one JSON document instead of text.

    Example:
        >>> import io, json
        >>> from kvcompat.inspection._cli import run_doctor
        >>> buf = io.StringIO()
        >>> run_doctor(buf, json=True)
        0
        >>> sorted(json.loads(buf.getvalue()))
        ['engines', 'kvcompat', 'python', 'seconds', 'sglang_classes', 'torch', 'triton']
    """
    started = time.perf_counter()
    env = _environment()
    sglang_dir = _package_dir("sglang") if env["engines"]["sglang"] is not None else None
    classes = find_kvcache_classes(sglang_dir) if sglang_dir is not None else ()
    env["sglang_classes"] = [entry.to_dict() for entry in classes] if sglang_dir else None
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
    print("engines", file=out)
    for name, version in env["engines"].items():
        print(f"  {name:<12} {version or 'not installed'}", file=out)
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
    print(f"({env['seconds']:.2f} s)", file=out)
    return 0
