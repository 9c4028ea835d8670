"""The command line's conventions (docs/cli.md), each run as a user runs it: in a subprocess.

Broken pipes end quietly; bad devices and bad arguments are one-line errors with exit 2
(every ``inspect --sglang`` failure too: a relative path, a module that fails to import,
a factory that returns no pool, a pool kvcompat recognises but does not support);
a bare ``kvcompat`` is a usage error with the help on stderr; ``--format json`` (and the
``--json`` alias) on every data command; ``scan``, ``--version`` and ``--help`` never
import torch; no command prints torch's NumPy warning; long scans on a terminal show a
progress line on stderr, and never in a pipe.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pty
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import kvcompat

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
KVCOMPAT = [sys.executable, "-m", "kvcompat"]
NUMPY_WARNING = "Failed to initialize NumPy"


def _run(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KVCOMPAT, *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=300,
        **kwargs,  # type: ignore[call-overload]
    )


# -- broken pipes ------------------------------------------------------------------------------

_DATA_COMMANDS = [
    pytest.param(["demo"], id="demo"),
    pytest.param(["inspect"], id="inspect"),
    pytest.param(["doctor"], id="doctor"),
    pytest.param(["scan", "kvcompat"], id="scan"),  # our own source calls native getters
]


@pytest.mark.parametrize("args", _DATA_COMMANDS)
def test_a_closed_pipe_ends_quietly(args: list[str]) -> None:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte: every write fails (EPIPE)
    try:
        result = subprocess.run(
            [*KVCOMPAT, *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
            cwd=ROOT,
            timeout=300,
        )
    finally:
        os.close(write)
    assert result.stderr == ""
    assert result.returncode == 141  # 128 + SIGPIPE, as for a process SIGPIPE ended


@pytest.mark.parametrize("args", _DATA_COMMANDS)
def test_piped_into_head_prints_no_traceback(args: list[str]) -> None:
    command = " ".join([*(f"'{a}'" for a in KVCOMPAT), *args])
    result = subprocess.run(
        ["sh", "-c", f"{command} | head -2"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0  # head's status
    assert len(result.stdout.splitlines()) == 2
    assert "Traceback" not in result.stderr
    assert "BrokenPipeError" not in result.stderr
    assert result.stderr == ""


# -- one-line errors and exit codes -------------------------------------------------------------


def _one_error_line(result: subprocess.CompletedProcess[str], command: str) -> str:
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if not line.startswith(("usage:", " "))]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"kvcompat {command}: error: ") or lines[0].startswith(
        "kvcompat: error: "
    ), lines[0]
    return lines[0]


@pytest.mark.skipif(
    subprocess.run(
        [sys.executable, "-c", "import torch, sys; sys.exit(torch.cuda.is_available())"],
        check=False,
    ).returncode
    != 0,
    reason="CUDA is available here: --device cuda is a good device",
)
def test_demo_on_cuda_without_cuda_is_one_line() -> None:
    line = _one_error_line(_run("demo", "--device", "cuda"), "demo")
    assert "--device cuda" in line
    assert "use --device cpu" in line


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "meta"])
def test_demo_on_a_bad_device_is_one_line(device: str) -> None:
    line = _one_error_line(_run("demo", "--device", device), "demo")
    assert device in line


@pytest.mark.parametrize(
    ("args", "command"),
    [
        (["doctor", "--format", "xml"], "doctor"),
        (["inspect", "--format", "yaml"], "inspect"),
        (["inspect", "--source", "nowhere"], "inspect"),
        (["scan", "--format", "xml", "kvcompat"], "scan"),
        (["scan"], "scan"),
        (["nosuchcommand"], ""),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(args: list[str], command: str) -> None:
    line = _one_error_line(_run(*args), command)
    if command:
        assert line.startswith(f"kvcompat {command}: error: ")


_USER_MODULES = {
    "kvc_conventions_pools": (
        "import collections\ndef ordered(**kw):\n    return collections.OrderedDict(kw)\n"
    ),
    "kvc_conventions_broken": "raise RuntimeError('fails at import')\n",
}


@pytest.fixture(scope="module")
def user_path(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a process whose PYTHONPATH has the user modules above."""
    folder = tmp_path_factory.mktemp("user_modules")
    for name, source in _USER_MODULES.items():
        (folder / f"{name}.py").write_text(source)
    paths = [str(folder), str(ROOT), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--sglang", ".kvc_conventions_pools:ordered"], "is a relative module path"),
        (["--sglang", "kvc_conventions_pools:ordered"], "built a collections.OrderedDict"),
        (["--json", "--sglang", "builtins.int"], "built a builtins.int (0)"),
        (["--sglang", "kvc_conventions_broken:Pool"], "RuntimeError: fails at import"),
        (["--sglang", "kvc_conventions_pools.nothing"], "no class or factory 'nothing'"),
        (["--sglang", "collections.OrderedDict", "size"], "expected KEY=VALUE, got 'size'"),
        (["size=3"], "KEY=VALUE arguments (size=3)"),
    ],
    ids=[
        "relative",
        "not-a-pool",
        "builtin-json",
        "import-fails",
        "no-name",
        "no-equals",
        "args-without-sglang",
    ],
)
def test_inspect_failures_are_one_line_with_a_hint_and_exit_2(
    user_path: dict[str, str], args: list[str], says: str
) -> None:
    line = _one_error_line(_run("inspect", *args, env=user_path), "inspect")
    assert says in line
    assert "Hint: " in line


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang is not installed")
def test_inspect_of_a_recognised_but_unsupported_sglang_pool_is_one_line() -> None:
    code = textwrap.dedent(
        """
        import sys
        from _sglang.env import prepare_sglang
        prepare_sglang()
        from kvcompat.cli import main
        sys.exit(main(sys.argv[1:]))
        """
    )
    args = ["size=64", "page_size=16", "dtype=bfloat16", "head_num=2", "head_dim=8",
            "layer_num=2"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(ROOT), str(ROOT / "tests")))}
    result = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code, "inspect", "--sglang",
         "NoOpMHATokenToKVPool", *args],
        capture_output=True, text=True, check=False, cwd=ROOT, timeout=300, env=env,
    )  # fmt: skip
    line = _one_error_line(result, "inspect")
    assert "built a sglang.srt.mem_cache.memory_pool.NoOpMHATokenToKVPool," in line
    assert "but does not support it" in line
    assert "Hint: " in line


def test_bare_kvcompat_is_a_usage_error_with_help_on_stderr() -> None:
    result = _run()
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("usage: kvcompat")
    for command in ("demo", "inspect", "doctor", "scan"):
        assert command in result.stderr


def test_help_and_version_succeed_on_stdout() -> None:
    for args in (["--help"], ["--version"], ["scan", "--help"], ["doctor", "--help"]):
        result = _run(*args)
        assert result.returncode == 0, args
        assert result.stderr == "", args
        assert result.stdout
    assert _run("--version").stdout == f"kvcompat {kvcompat.__version__}\n"


def test_exit_codes_are_documented() -> None:
    from kvcompat import cli

    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    for code in (
        cli.EXIT_OK,
        cli.EXIT_FOUND,
        cli.EXIT_USAGE,
        cli.EXIT_INTERRUPTED,
        cli.EXIT_BROKEN_PIPE,
    ):
        assert f"| `{code}` |" in page
    assert "cli" in (ROOT / "docs" / "index.md").read_text(encoding="utf-8")


# -- --format json -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "keys"),
    [
        (["demo"], {"native", "detection", "layers", "values", "ok"}),
        (["doctor"], {"kvcompat", "python", "torch", "triton", "engines"}),
        (["inspect"], {"source", "pools"}),
        (["scan", "examples"], {"version", "findings", "summary"}),
    ],
)
def test_every_data_command_takes_format_json_and_the_json_alias(
    args: list[str], keys: set[str]
) -> None:
    documents = []
    for flag in (["--format", "json"], ["--json"]):
        result = _run(*args[:1], *flag, *args[1:])
        assert result.returncode in (0, 1), result.stderr  # scan: 1 = findings
        assert result.stderr == ""
        documents.append(json.loads(result.stdout))
    assert keys <= set(documents[0])
    assert set(documents[0]) == set(documents[1])


# -- torch stays unimported ----------------------------------------------------------------------


def _imported_modules(stderr: str) -> set[str]:
    """Module names from ``-X importtime`` output."""
    names = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["--help"],
        ["scan", "--help"],
        ["scan", "examples"],
        ["scan", "--json", "kvcompat"],
    ],
    ids=["version", "help", "scan-help", "scan-examples", "scan-json"],
)
def test_scan_version_and_help_never_import_torch(args: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "kvcompat", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode in (0, 1)
    modules = _imported_modules(result.stderr)
    assert "kvcompat" in modules
    heavy = sorted(m for m in modules if m.split(".")[0] in {"torch", "numpy", "sglang", "triton"})
    assert heavy == []


def test_every_public_name_is_served_lazily() -> None:
    lazy = set(kvcompat._LAZY) | {"adapters", "__version__"}
    assert lazy == set(kvcompat.__all__), "add the new name to _LAZY in kvcompat/__init__.py"


def test_importing_the_scanner_leaves_torch_unimported() -> None:
    code = textwrap.dedent(
        """
        import sys
        import kvcompat, kvcompat.scan, kvcompat.cli
        from kvcompat.scan import scan_source
        scan_source("pool.get_kv_buffer(0)\\n")
        assert sorted(dir(kvcompat)) == dir(kvcompat) and "adapt" in dir(kvcompat)
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "numpy")))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert result.stdout.strip() == "[]"


# -- torch's NumPy warning -------------------------------------------------------------------------

_WITHOUT_NUMPY = textwrap.dedent(
    """
    import importlib.abc, runpy, sys

    class NoNumpy(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "numpy":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoNumpy())
    sys.argv = ["kvcompat", *sys.argv[1:]]
    runpy.run_module("kvcompat", run_name="__main__")
    """
)


@pytest.mark.parametrize(
    "args", [["--version"], ["--help"], ["scan", "examples"]], ids=["version", "help", "scan"]
)
def test_torch_free_commands_never_warn_about_numpy_even_without_it(args: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_NUMPY, *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode in (0, 1), result.stderr
    assert NUMPY_WARNING not in result.stderr


def test_numpy_is_a_declared_dependency_and_pinned_with_torch() -> None:
    # torch's CPU wheel does not require numpy, and `import torch` warns without it: the
    # warning's cause is an environment without numpy, so kvcompat declares it.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert any(dep.split(">")[0].split("=")[0] == "numpy" for dep in project["dependencies"])
    pins = (ROOT / "requirements" / "torch-cpu.txt").read_text(encoding="utf-8")
    assert "\nnumpy==" in pins


def test_demo_prints_no_numpy_warning() -> None:
    # doctor, inspect and scan: the --format json test asserts their stderr is empty
    result = _run("demo")
    assert result.returncode == 0, result.stderr
    assert NUMPY_WARNING not in result.stderr
    assert result.stderr == ""


# -- progress on a terminal ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("big-tree")
    source = (ROOT / "kvcompat" / "_scan" / "_run.py").read_text(encoding="utf-8")
    for i in range(150):  # about 1.5 s of scanning: long enough for the progress line
        (root / f"module_{i:03d}.py").write_text(source, encoding="utf-8")
    return root


def test_a_long_scan_shows_progress_on_a_terminal(big_tree: Path) -> None:
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen(
            [*KVCOMPAT, "scan", str(big_tree)],
            stdout=subprocess.PIPE,
            stderr=terminal,
            cwd=ROOT,
        )
        os.close(terminal)
        seen = b""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(controller, 4096)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                seen += chunk
            elif process.poll() is not None:
                break
        stdout, _ = process.communicate(timeout=300)
    finally:
        os.close(controller)
    assert process.returncode == 0
    text = seen.decode()
    assert "kvcompat scan: " in text
    assert "/150 files" in text
    assert text.endswith("\r\x1b[K")  # erased at the end
    assert b"files" in stdout  # the summary, on stdout
    assert b"/150 files" not in stdout


def test_no_progress_when_stderr_is_not_a_terminal(big_tree: Path) -> None:
    result = _run("scan", str(big_tree))
    assert result.returncode == 0
    assert result.stderr == ""
