"""The ``kvcompat`` command line: ``demo``, ``inspect``, ``doctor`` and ``scan``.

Heavy modules are imported only by the subcommand that needs them: ``--version``,
``--help`` and ``scan`` never import torch.

Conventions (``docs/cli.md``):

- Exit status: 0 success; 1 the command found something (``scan`` findings, a demo
  check that failed) or a runtime error; 2 a usage error (bad arguments, a device
  torch cannot use, no command) or, for ``scan``, a file it could not check;
  130 interrupted; 141 stdout was closed early (``kvcompat demo | head``), as for a
  process ended by SIGPIPE.
- Results go to stdout, errors and progress to stderr; an error is one line,
  ``kvcompat COMMAND: error: ...``.
- ``--format {text,json}`` on every command that prints data (``--json`` is an
  alias of ``--format json``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from kvcompat._version import __version__

__all__ = ["EXIT_BROKEN_PIPE", "EXIT_FOUND", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "main"]

EXIT_OK = 0
"""The command succeeded (``scan``: no findings)."""
EXIT_FOUND = 1
"""``scan`` found unguarded accesses, a demo check failed, or a runtime error."""
EXIT_USAGE = 2
"""Bad arguments, a device torch cannot use, no command; ``scan``: a file it could not check."""
EXIT_INTERRUPTED = 130
"""Interrupted (Ctrl-C): 128 + SIGINT."""
EXIT_BROKEN_PIPE = 141
"""Whoever read stdout stopped reading (``| head``): 128 + SIGPIPE, printed quietly."""

_TORCH_HINT = "pip install torch (the quick start shows how to get its CPU build)"


def _error(command: str, message: str) -> None:
    print(f"kvcompat {command}: error: {message}", file=sys.stderr)


def _needs_torch(command: str) -> bool:
    """Print a one-line error and return False when torch is not installed."""
    if importlib.util.find_spec("torch") is not None:
        return True
    _error(command, f"needs torch, which is not installed; {_TORCH_HINT}")
    return False


def _demo(args: argparse.Namespace) -> int:
    if not _needs_torch("demo"):
        return EXIT_FOUND
    from kvcompat._demo import device_problem, run_demo

    problem = device_problem(args.device)
    if problem is not None:
        _error("demo", problem)
        return EXIT_USAGE
    return run_demo(sys.stdout, device=args.device, json=args.format == "json")


def _inspect(args: argparse.Namespace) -> int:
    if not _needs_torch("inspect"):
        return EXIT_FOUND
    from kvcompat.inspection._cli import run_inspect

    return run_inspect(
        sys.stdout,
        source=args.source,
        json=args.format == "json",
        sglang_class=args.sglang,
        pool_args=args.pool_args,
        err=sys.stderr,
    )


def _doctor(args: argparse.Namespace) -> int:
    if not _needs_torch("doctor"):
        return EXIT_FOUND
    from kvcompat.inspection._cli import run_doctor

    return run_doctor(sys.stdout, json=args.format == "json")


class _Progress:
    """``kvcompat scan: 120/4000 files`` on a terminal's stderr, for scans longer than ``after`` s.

    Redrawn at most every 0.1 s on one line (carriage return), erased when the scan ends.
    """

    def __init__(self, stream: TextIO, after: float = 0.5) -> None:
        self._stream = stream
        self._start = time.monotonic()
        self._after = after
        self._last = 0.0
        self._shown = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done >= total:
            if self._shown:
                self._stream.write("\r\033[K")
                self._stream.flush()
            return
        if now - self._start < self._after or now - self._last < 0.1:
            return
        self._last = now
        self._shown = True
        self._stream.write(f"\rkvcompat scan: {done}/{total} files")
        self._stream.flush()


def _scan(argv: list[str]) -> int:
    # scan owns its argument parser (it is usable on its own: python -m kvcompat.scan).
    from kvcompat.scan import main as scan_main

    if "--json" in argv:  # the alias every data command takes (not after "--": a path)
        end = argv.index("--") if "--" in argv else len(argv)
        argv = [
            "--format=json" if arg == "--json" and i < end else arg for i, arg in enumerate(argv)
        ]
    progress = _Progress(sys.stderr) if _isatty(sys.stderr) else None
    return scan_main(argv, progress=progress)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def _add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="output format (default: text)",
    )
    parser.add_argument(
        "--json",
        dest="format",
        action="store_const",
        const="json",
        help="alias of --format json",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvcompat",
        description="One key-first API over LLM-serving KV-cache pools.",
        epilog=(
            "exit status: 0 success, 1 findings (scan) or a failed check, 2 usage error.\n"
            "docs: the 'Command line' page of the kvcompat documentation."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kvcompat {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser(
        "demo", help="run the generic key-first loop over the reference MHA, MLA and DSv4 pools"
    )
    demo.add_argument("--device", default="cpu", help="torch device for the pools (default: cpu)")
    _add_format(demo)
    demo.set_defaults(run=_demo)
    inspect = commands.add_parser(
        "inspect",
        help="manifest tree and memory report of the demo pools, or of an SGLang pool (--sglang)",
    )
    inspect.add_argument("--source", default="demo", help="what to inspect (default: demo)")
    _add_format(inspect)
    inspect.add_argument(
        "--sglang",
        metavar="CLASS",
        help=(
            "build this pool and inspect it: an SGLang pool class (e.g. MHATokenToKVPool), "
            "or any class or factory as package.module.Name or package.module:factory"
        ),
    )
    inspect.add_argument(
        "pool_args",
        nargs="*",
        metavar="KEY=VALUE",
        help="constructor arguments for --sglang (size=64 dtype=bfloat16 ...)",
    )
    inspect.set_defaults(run=_inspect)
    doctor = commands.add_parser(
        "doctor", help="environment: torch, triton, GPU, engines and the pool classes they define"
    )
    _add_format(doctor)
    doctor.set_defaults(run=_doctor)
    commands.add_parser(
        "scan", help="find calls that break on single-KV pools (kvcompat scan --help)"
    )
    return parser


def _dispatch(argv: list[str]) -> int:
    if argv[:1] == ["scan"]:
        return _scan(argv[1:])
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version (0) or a usage error (2): return, never exit
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if args.command is None:  # like ruff and clap: no command is a usage error, help on stderr
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    status: int = args.run(args)
    return status


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real file descriptor (a test's buffer)
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``kvcompat`` command line; returns the exit status instead of exiting.

    Args:
        argv: the arguments after ``kvcompat`` (``sys.argv[1:]`` when None).

    Returns:
        The exit status: 0 success, 1 findings or a failed check, 2 usage error,
        130 interrupted, 141 stdout closed early (see ``docs/cli.md``).

    Example:
        >>> from kvcompat.cli import main
        >>> main(["--version"])  # doctest: +ELLIPSIS
        kvcompat 0...
        0
    """
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        status = _dispatch(args)
        sys.stdout.flush()  # a closed pipe shows up here, not at interpreter exit
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print("kvcompat: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return status
