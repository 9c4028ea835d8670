"""The ``kvcompat`` command line: ``demo``, ``inspect``, ``doctor`` and ``scan``.

Heavy modules are imported only by the subcommand that needs them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    from kvcompat._demo import run_demo

    return run_demo(sys.stdout, device=args.device)


def _inspect(args: argparse.Namespace) -> int:
    from kvcompat.inspection._cli import run_inspect

    return run_inspect(
        sys.stdout,
        source=args.source,
        json=args.json,
        sglang_class=args.sglang,
        pool_args=args.pool_args,
    )


def _doctor(args: argparse.Namespace) -> int:
    from kvcompat.inspection._cli import run_doctor

    return run_doctor(sys.stdout, json=args.json)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``kvcompat`` command line; returns the exit status.

    Example:
        >>> from kvcompat.cli import main
        >>> main(["--version"])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        SystemExit: 0
    """
    from kvcompat import __version__

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["scan"]:
        # scan owns its own argument parser (it is usable on its own in CI).
        from kvcompat.scan import main as scan_main

        return scan_main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="kvcompat",
        description="One key-first API over LLM-serving KV-cache pools.",
    )
    parser.add_argument("--version", action="version", version=f"kvcompat {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser(
        "demo", help="run the generic key-first loop over the reference MHA, MLA and DSv4 pools"
    )
    demo.add_argument("--device", default="cpu", help="torch device for the pools (default: cpu)")
    demo.set_defaults(run=_demo)
    inspect = commands.add_parser(
        "inspect", help="manifest, memory report and transfer descriptors of the demo pools"
    )
    inspect.add_argument("--source", default="demo", help="what to inspect (default: demo)")
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    inspect.add_argument(
        "--sglang",
        metavar="CLASS",
        help="build this SGLang pool class (e.g. MHATokenToKVPool) from KEY=VALUE arguments",
    )
    inspect.add_argument(
        "pool_args", nargs="*", metavar="KEY=VALUE", help="constructor arguments for --sglang"
    )
    inspect.set_defaults(run=_inspect)
    doctor = commands.add_parser(
        "doctor", help="environment: torch, triton, GPU, engines and the pool classes they define"
    )
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.set_defaults(run=_doctor)
    commands.add_parser(
        "scan", help="find calls that break on single-KV pools (kvcompat scan --help)"
    )
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    status: int = args.run(args)
    return status
