"""Files and the command line: ``kvcompat scan [--fix | --diff] [--format json] PATH...``."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import fnmatch
import io
import json
import os
import stat
import sys
import tokenize
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, TextIO

from kvcompat._scan._analysis import analyze
from kvcompat._scan._fix import fix_module, parse
from kvcompat._scan._handcheck import hand_checks
from kvcompat._scan._models import ModelScope, ModuleFacts, module_facts
from kvcompat._scan._rules import RULES, Finding
from kvcompat._scan._source import split_lines

__all__ = ["ScanReport", "main", "scan_paths"]

_SKIPPED_DIRS = frozenset({"__pycache__", "site-packages", ".venv"})
MAX_BYTES = 16 * 1024 * 1024
"""Files larger than this (16 MiB) are reported (``KVC903``), not read."""
# Opening a FIFO for reading blocks until a writer appears; O_NONBLOCK makes the
# open return at once, and the fstat after it refuses anything but a regular file.
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
_Mode = Literal["check", "fix", "diff"]
_JSON_VERSION = 1


@dataclasses.dataclass(frozen=True)
class ScanReport:
    r"""The result of scanning some paths.

    Attributes:
        findings: Unguarded pool accesses (``KVC001`` … ``KVC005``), by path and line.
        errors: Paths and files that could not be checked (``KVC900`` … ``KVC903``).
        files: How many Python files were checked (read and parsed).
        fixed: How many findings ``--fix`` rewrote (0 when not fixing).
        model_code: How many accesses were not reported because they are in model
            definitions, which run only on their own architecture's pool (see
            ``docs/scan.md``); ``include_models=True`` / ``--include-models`` reports them.
        hand_checks: ``KVC100`` notes: uses of the calls ``--fix`` rewrote that the
            scanner cannot vouch for on DeepSeek-V4 and key-only pools (a buffer passed
            on whole, stored into, or a ``set_kv_buffer`` whose ``cache_v`` those pools
            do not store). They do not change :attr:`exit_code`.

    Example:
        >>> import pathlib, tempfile
        >>> from kvcompat.scan import scan_paths
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     _ = (pathlib.Path(tmp) / "probe.py").write_text("pool.kv_buffer[0][loc]\n")
        ...     report = scan_paths([tmp])
        >>> [finding.code for finding in report.findings], report.files, report.exit_code
        (['KVC005'], 1, 1)
    """

    findings: tuple[Finding, ...]
    errors: tuple[Finding, ...] = ()
    files: int = 0
    fixed: int = 0
    model_code: int = 0
    hand_checks: tuple[Finding, ...] = ()

    @property
    def exit_code(self) -> int:
        """2 if anything could not be checked, else 1 if findings remain, else 0.

        Example:
            >>> from kvcompat.scan import ScanReport
            >>> ScanReport(findings=()).exit_code
            0
        """
        if self.errors:
            return 2
        return 1 if self.findings else 0

    @property
    def fixable(self) -> int:
        """How many of :attr:`findings` ``--fix`` would rewrite.

        Example:
            >>> from kvcompat.scan import scan_paths
            >>> scan_paths([]).fixable
            0
        """
        return sum(finding.fixable for finding in self.findings)

    def summary(self) -> str:
        """The last line the CLI prints.

        Example:
            >>> from kvcompat.scan import ScanReport
            >>> ScanReport(findings=(), files=3).summary()
            'kvcompat scan: no unguarded pool accesses in 3 files.'
        """
        files = _plural(self.files, "file")
        if self.findings:
            flagged = len({finding.path for finding in self.findings})
            found = f"{_plural(len(self.findings), 'finding')} in {flagged} of {files}"
            if self.fixable:
                found += f" ({self.fixable} fixable with --fix)"
        else:
            found = f"no unguarded pool accesses in {files}"
        if self.fixed:
            found = f"fixed {_plural(self.fixed, 'finding')}; remaining: {found}"
        if self.hand_checks:
            found += (
                f"; {_plural(len(self.hand_checks), 'line')} to check by hand (KVC100, listed"
                " above)"
            )
        if len(self.findings) > self.fixable:
            found += (
                "; for code --fix cannot rewrite, kvcompat.compat(pool) gives the pool's own"
                " methods with getters that never lie (docs/port-backend.md)"
            )
        if self.model_code:
            accesses = "access" if self.model_code == 1 else "accesses"
            found += (
                f"; {self.model_code} {accesses} in model definitions not reported"
                " (--include-models shows them)"
            )
        if self.errors:
            found += f"; {_plural(len(self.errors), 'path')} could not be checked (KVC9xx)"
        return f"kvcompat scan: {found}."

    def to_json(self) -> dict[str, Any]:
        """The ``--format json`` document (``version`` 1).

        Example:
            >>> from kvcompat.scan import ScanReport
            >>> sorted(ScanReport(findings=()).to_json())  # doctest: +NORMALIZE_WHITESPACE
            ['errors', 'exit_code', 'files', 'findings', 'fixed', 'hand_checks', 'model_code',
             'rules', 'summary', 'version']
        """
        return {
            "version": _JSON_VERSION,
            "files": self.files,
            "fixed": self.fixed,
            "model_code": self.model_code,
            "exit_code": self.exit_code,
            "summary": self.summary(),
            "findings": [dataclasses.asdict(finding) for finding in self.findings],
            "errors": [dataclasses.asdict(error) for error in self.errors],
            "hand_checks": [dataclasses.asdict(note) for note in self.hand_checks],
            "rules": {
                code: {
                    "name": rule.name,
                    "breaks_on": rule.breaks_on,
                    "classes": list(rule.classes),
                    "replacement": rule.replacement.format(recv="pool"),
                }
                for code, rule in RULES.items()
            },
        }


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


# -- files ----------------------------------------------------------------------


def _excluded(path: str, patterns: Sequence[str]) -> bool:
    """Whether a glob matches the path, a trailing part of it, or its name."""
    posix = Path(path).as_posix()
    name = Path(path).name
    return any(
        fnmatch.fnmatch(posix, p) or fnmatch.fnmatch(posix, f"*/{p}") or fnmatch.fnmatch(name, p)
        for p in patterns
    )


def _walk(
    root: str, patterns: Sequence[str], errors: list[Finding], excluded: list[str]
) -> Iterator[str]:
    """The ``.py`` files under ``root``, sorted, skipping hidden and tool directories.

    A directory that cannot be listed is reported in ``errors`` (``KVC902``), never
    skipped silently. What an ``exclude`` pattern skips is added to ``excluded``.
    """

    def unlisted(exc: OSError) -> None:
        where = os.path.normpath(exc.filename) if exc.filename else root
        errors.append(_missing(where, f"cannot list directory: {exc.strerror or exc}"))

    for directory, subdirs, files in os.walk(root, onerror=unlisted):
        kept = []
        for name in sorted(subdirs):
            if name.startswith(".") or name in _SKIPPED_DIRS:
                continue
            path = os.path.normpath(os.path.join(directory, name))
            if _excluded(path, patterns):
                excluded.append(path)
            else:
                kept.append(name)
        subdirs[:] = kept
        for name in sorted(files):
            path = os.path.normpath(os.path.join(directory, name))
            if not name.endswith(".py"):
                continue
            if _excluded(path, patterns):
                excluded.append(path)
            else:
                yield path


def _missing(path: str, why: str) -> Finding:
    message = f"cannot read: {why}; pass an existing Python file or directory"
    return Finding(path, 0, 0, "KVC902", message, fixable=False)


def _files(
    paths: Iterable[str], patterns: Sequence[str], excluded: list[str]
) -> tuple[list[str], list[Finding]]:
    files: list[str] = []
    errors: list[Finding] = []
    seen: set[str] = set()
    for path in paths:
        if os.path.isdir(path):
            found: Iterable[str] = _walk(path, patterns, errors, excluded)
        elif os.path.isfile(path):
            found = [path]
        elif os.path.islink(path) and not os.path.exists(path):
            errors.append(_missing(path, "a dangling symbolic link"))
            continue
        elif os.path.lexists(path):
            errors.append(_missing(path, "not a regular file or directory"))
            continue
        else:
            errors.append(_missing(path, "no such file or directory"))
            continue
        for file in found:
            key = os.path.realpath(file)
            if key not in seen:
                seen.add(key)
                files.append(file)
    return files, errors


def _where(data: bytes, offset: int) -> tuple[int, int]:
    """1-based line and byte column of ``offset`` in ``data``."""
    line_start = max(data.rfind(b"\n", 0, offset), data.rfind(b"\r", 0, offset)) + 1
    return data.count(b"\n", 0, offset) + 1, offset - line_start + 1


def _decode(path: str, data: bytes) -> tuple[str, str] | Finding:
    """``(text, encoding)``, honouring a BOM or a PEP 263 coding line; or a KVC901 finding."""
    hint = "save the file as UTF-8 or declare its encoding (PEP 263)"
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding), encoding
    except UnicodeDecodeError as exc:
        line, col = _where(data, exc.start)
        byte = data[exc.start : exc.start + 1].hex()
        message = f"cannot decode: byte 0x{byte} is not valid {exc.encoding}; {hint}"
        return Finding(path, line, col, "KVC901", message, fixable=False)
    except SyntaxError as exc:  # detect_encoding: bad bytes in lines 1-2, or an unknown codec
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as bad:
            line, col = _where(data, bad.start)
            byte = data[bad.start : bad.start + 1].hex()
            message = f"cannot decode: byte 0x{byte} is not valid utf-8; {hint}"
            return Finding(path, line, col, "KVC901", message, fixable=False)
        message = f"cannot decode: {exc.msg}; {hint}"
        return Finding(path, 0, 0, "KVC901", message, fixable=False)


@dataclasses.dataclass(frozen=True)
class _FileResult:
    findings: list[Finding]
    errors: list[Finding]
    fixed: int = 0
    diff: str = ""
    checks: list[Finding] | None = None  # None: the file's own (unchanged) notes


def _diff(path: str, before: str, after: str) -> str:
    r"""A unified diff of ``before`` -> ``after``, with no whitespace at the end of a line.

    An empty line of context prints as an empty line, not as one space (what
    ``diff -u --suppress-blank-empty`` prints; ``patch`` and ``git apply`` read both);
    whitespace the file's own lines end with stays: it is the file's text.

    Example:
        >>> from kvcompat._scan._run import _diff
        >>> print(_diff("a.py", "x = 1\n\ny = 2\n", "x = 1\n\ny = 3\n"), end="")
        --- a.py
        +++ a.py
        @@ -1,3 +1,3 @@
         x = 1
        <BLANKLINE>
        -y = 2
        +y = 3
    """
    lines = difflib.unified_diff(
        split_lines(before), split_lines(after), fromfile=path, tofile=path
    )
    out: list[str] = []
    for diff_line in lines:
        # An empty context line: no lone space at the end of the line.
        empty = diff_line[:1] == " " and diff_line[1:] in ("\n", "\r\n", "\r")
        line = diff_line[1:] if empty else diff_line
        out.append(line)
        if not line.endswith(("\n", "\r")):
            out.append("\n\\ No newline at end of file\n")
    return "".join(out)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _read_bytes(path: str, max_bytes: int) -> bytes | Finding:  # noqa: PLR0911 -- one per refusal
    """The bytes of a regular file of at most ``max_bytes``, or the finding that says why not.

    Never blocks (a FIFO is refused, not opened for a writer to appear) and never
    reads more than ``max_bytes + 1`` bytes (a link to ``/dev/zero`` is refused by
    type; a file that grows while it is read is cut off and reported).
    """
    if os.path.islink(path) and not os.path.exists(path):
        return _missing(path, "a dangling symbolic link")
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        return _missing(path, exc.strerror or str(exc))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return _missing(path, f"{_kind(info.st_mode)}, not a regular file")
        if info.st_size > max_bytes:
            return _too_large(path, info.st_size, max_bytes)
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        return _missing(path, exc.strerror or str(exc))
    finally:
        os.close(fd)
    if size > max_bytes:
        return _too_large(path, size, max_bytes)
    return b"".join(chunks)


def _too_large(path: str, size: int, max_bytes: int) -> Finding:
    message = (
        f"too large: {size} bytes, over the limit of {max_bytes}; "
        "exclude it, or raise the limit with --max-bytes"
    )
    return Finding(path, 0, 0, "KVC903", message, fixable=False)


def _read(path: str, max_bytes: int = MAX_BYTES) -> tuple[str, str] | Finding:
    """``(text, encoding)`` of a file, or the KVC901-KVC903 finding that says why not."""
    data = _read_bytes(path, max_bytes)
    if isinstance(data, Finding):
        return data
    return _decode(path, data)


@dataclasses.dataclass(frozen=True)
class _Checked:
    """One file read, parsed and checked: what the fix pass needs of it afterwards."""

    path: str
    real: str  # os.path.realpath(path): how the model-code pass names the module
    text: str  # kept only when there are findings, for --fix and --diff
    encoding: str
    findings: list[Finding]
    facts: ModuleFacts
    checks: list[Finding] = dataclasses.field(default_factory=list)  # KVC100 notes


def _check(path: str, max_bytes: int) -> _Checked | Finding:
    decoded = _read(path, max_bytes)
    if isinstance(decoded, Finding):
        return decoded
    text, encoding = decoded
    tree = parse(text, path)
    if isinstance(tree, Finding):
        return tree
    findings = [hit.finding for hit in analyze(tree, text, path)]
    real = os.path.realpath(path)
    facts = module_facts(tree, text, real)
    checks = hand_checks(tree, text, path)
    return _Checked(path, real, text if findings else "", encoding, findings, facts, checks)


def _fix_file(checked: _Checked, mode: _Mode, exempt: frozenset[str]) -> _FileResult:
    path, text, before = checked.path, checked.text, checked.findings
    fixed, remaining = fix_module(text, path, exempt=exempt)
    if fixed == text:
        return _FileResult(remaining, [])
    tree = parse(fixed, path)
    checks = [] if isinstance(tree, Finding) else hand_checks(tree, fixed, path)
    if mode == "diff":  # nothing is written: the findings are still in the file, and the
        # notes are those of the file --fix would write
        return _FileResult(before, [], diff=_diff(path, text, fixed), checks=checks)
    try:
        Path(path).write_bytes(fixed.encode(checked.encoding))
    except OSError as exc:
        message = f"cannot write the fix: {exc.strerror or exc}; check the file's permissions"
        return _FileResult(before, [Finding(path, 0, 0, "KVC902", message, fixable=False)])
    return _FileResult(remaining, [], fixed=len(before) - len(remaining), checks=checks)


def _without_model_code(file: _Checked, scope: ModelScope) -> tuple[_Checked, frozenset[str]]:
    """The file less its findings in model code, and its top-level defs that are model code."""
    if scope.is_model_code(file.real):  # the whole module
        return dataclasses.replace(file, findings=[]), frozenset()
    names = {file.facts.def_at(finding.line) for finding in file.findings}
    exempt = frozenset(name for name in names if name and scope.is_model_code(file.real, name))
    if not exempt:
        return file, exempt
    left = [finding for finding in file.findings if file.facts.def_at(finding.line) not in exempt]
    return dataclasses.replace(file, findings=left), exempt


def _run(
    paths: Iterable[str | os.PathLike[str]],
    mode: _Mode,
    exclude: Sequence[str],
    max_bytes: int = MAX_BYTES,
    progress: Callable[[int, int], None] | None = None,
    *,
    include_models: bool = False,
) -> tuple[ScanReport, list[str]]:
    given = [os.fspath(path) for path in paths]
    excluded: list[str] = []
    files, errors = _files(given, exclude, excluded)
    checked: list[_Checked] = []
    facts: dict[str, ModuleFacts] = {}
    for index, path in enumerate(files):
        if progress is not None:  # (files done, files in all), before each file and at the end
            progress(index, len(files))
        result = _check(path, max_bytes)
        if isinstance(result, Finding):
            errors.append(result)
            continue
        checked.append(result)
        facts.setdefault(result.real, result.facts)
    if progress is not None:
        progress(len(files), len(files))
    # Model code through importers needs every module of a package read: a directory
    # scanned whole, less what was excluded or could not be read, holds them.
    roots = [os.path.realpath(path) for path in given if os.path.isdir(path)]
    holes = [os.path.realpath(path) for path in (*excluded, *(e.path for e in errors))]
    scope = None if include_models else ModelScope(facts, roots, holes)
    findings: list[Finding] = []
    notes: list[Finding] = []
    diffs: list[str] = []
    fixed = model_code = unwritten = 0
    for file in checked:
        if not file.findings:
            notes.extend(file.checks)
            continue
        kept, exempt = (file, frozenset()) if scope is None else _without_model_code(file, scope)
        model_code += len(file.findings) - len(kept.findings)
        if mode == "check" or not any(f.fixable for f in kept.findings):
            findings.extend(kept.findings)
            notes.extend(file.checks)
            continue
        outcome = _fix_file(kept, mode, exempt)
        findings.extend(outcome.findings)
        notes.extend(file.checks if outcome.checks is None else outcome.checks)
        errors.extend(outcome.errors)
        fixed += outcome.fixed
        unwritten += bool(outcome.errors)
        if outcome.diff:
            diffs.append(outcome.diff)
    report = ScanReport(
        findings=tuple(findings),
        errors=tuple(errors),
        files=len(checked) - unwritten,
        fixed=fixed,
        model_code=model_code,
        hand_checks=tuple(notes),
    )
    return report, diffs


def scan_paths(
    paths: Iterable[str | os.PathLike[str]],
    *,
    exclude: Sequence[str] = (),
    max_bytes: int = MAX_BYTES,
    include_models: bool = False,
) -> ScanReport:
    r"""Scan Python files and directories (recursively) without changing them.

    Directories are searched for ``*.py`` files; hidden directories, ``.venv``,
    ``site-packages`` and ``__pycache__`` are skipped, as is anything matching an
    ``exclude`` glob (matched against the path, any trailing part of it such as
    ``tests/fixtures``, and the name). A path named explicitly is always scanned,
    whatever its suffix.

    Args:
        paths: Files and directories.
        exclude: Glob patterns of paths to skip while walking directories.
        max_bytes: Larger files are reported as ``KVC903``, not read.
        include_models: Also report accesses in model definitions: modules that
            register model classes (``EntryClass``) and code only they import, among
            the scanned files. They run only on their own architecture's pool, so by
            default they are counted in :attr:`ScanReport.model_code`, not reported.

    Returns:
        The report. Missing paths, unreadable files, files that are not valid
        UTF-8 (or their declared encoding) and files with syntax errors are in
        :attr:`ScanReport.errors`; the other files are still scanned.

    Example:
        >>> import pathlib, tempfile
        >>> from kvcompat.scan import scan_paths
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     _ = (pathlib.Path(tmp) / "ok.py").write_text("import kvcompat\n")
        ...     report = scan_paths([tmp, pathlib.Path(tmp) / "missing.py"])
        >>> report.files, report.exit_code, report.errors[0].code
        (1, 2, 'KVC902')
    """
    return _run(paths, "check", exclude, max_bytes, include_models=include_models)[0]


# -- command line ---------------------------------------------------------------

_EPILOG = """\
codes:
  KVC001  .get_value_buffer(...)           KVC004  .k_buffer / .v_buffer on a pool
  KVC002  .get_kv_buffer(...)              KVC005  .kv_buffer on a pool
  KVC003  .set_kv_buffer(...)              KVC006  get_key_buffer(i) indexed by token
  KVC007  .get_kv_buffer_shape()           KVC008  head-dim probe of an adapter's buffer
  KVC009  an adapter's get_kv_buffer / get_value_buffer result indexed by token
  KVC100  a note, not a finding: a use of a call --fix rewrote, to check by hand
  KVC900-903  path or file could not be checked

exit status: 0 no findings, 1 findings remain, 2 usage error or a file could not be checked.
silence a line with "# kvcompat: ignore" (or "# kvcompat: ignore[KVC004]"),
a whole file with "# kvcompat: ignore-file".
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvcompat scan",
        description=(
            "Find uses of SGLang KV-pool methods and attributes that break on "
            "single-KV (DeepSeek-V4) and key-only pools, and are not guarded by a "
            "kvcompat detector, a try/except or kvcompat.adapt()."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="Python files or directories")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--fix", action="store_true", help="rewrite the mechanical cases in place")
    action.add_argument(
        "--diff",
        action="store_true",
        help="print what --fix would change as a unified diff; change nothing",
    )
    parser.add_argument(
        "--format", choices=("text", "json"), default="text", help="output format (default text)"
    )
    parser.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="skip files and directories matching GLOB while walking (repeatable)",
    )
    parser.add_argument(
        "--include-models",
        action="store_true",
        help="also report accesses in model definitions (modules that set EntryClass, "
        "and code only they import), which by default are counted, not reported",
    )
    parser.add_argument(
        "--max-bytes",
        type=int,
        default=MAX_BYTES,
        metavar="N",
        help=f"report files larger than N bytes (KVC903) instead of reading them "
        f"(default {MAX_BYTES})",
    )
    return parser


def _write(stream: TextIO, text: str) -> None:
    try:
        stream.write(text)
    except UnicodeEncodeError:  # a console that cannot show "—" or a path's characters
        encoding = stream.encoding or "ascii"
        stream.write(text.encode(encoding, "backslashreplace").decode(encoding))


def main(
    argv: Sequence[str] | None = None, *, progress: Callable[[int, int], None] | None = None
) -> int:
    r"""Run ``kvcompat scan``; return the exit status instead of exiting.

    Args:
        argv: The arguments after ``scan`` (``sys.argv[1:]`` when None).
        progress: Called with (files done, files in all) before each file and once at
            the end (``kvcompat scan`` passes a progress line when stderr is a terminal).

    Returns:
        0 when no findings remain, 1 when findings remain (after ``--fix``, the
        ones it could not rewrite), 2 for a usage error or a path or file that
        could not be checked (other files are still scanned).

    Example:
        >>> import pathlib, tempfile
        >>> from kvcompat.scan import main
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     probe = pathlib.Path(tmp) / "probe.py"
        ...     _ = probe.write_text("v = pool.get_value_buffer(0)\n")
        ...     status = main([str(probe)])  # doctest: +ELLIPSIS
        /.../probe.py:1:10: KVC001 pool.get_value_buffer() — breaks on ... instead
        kvcompat scan: 1 finding in 1 of 1 file (1 fixable with --fix).
        >>> status
        1
    """
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2): return, never exit
        return exc.code if isinstance(exc.code, int) else 2
    if args.diff and args.format == "json":
        parser.print_usage(sys.stderr)
        message = "kvcompat scan: error: --diff prints a unified diff; drop --format json\n"
        _write(sys.stderr, message)
        return 2
    mode: _Mode = "fix" if args.fix else "diff" if args.diff else "check"
    report, diffs = _run(
        args.paths,
        mode,
        args.exclude,
        args.max_bytes,
        progress,
        include_models=args.include_models,
    )
    if args.format == "json":
        _write(sys.stdout, json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n")
        return report.exit_code
    messages = sys.stderr if mode == "diff" else sys.stdout
    for diff in diffs:
        _write(sys.stdout, diff)
    for error in sorted(report.errors, key=_order):  # what was not checked: always stderr
        _write(sys.stderr, error.format() + "\n")
    for finding in sorted(report.findings, key=_order):
        _write(messages, finding.format() + "\n")
    for note in sorted(report.hand_checks, key=_order):
        _write(messages, note.format() + "\n")
    _write(messages, report.summary() + "\n")
    return report.exit_code


def _order(finding: Finding) -> tuple[str, int, int, str]:
    return finding.path, finding.line, finding.col, finding.code
