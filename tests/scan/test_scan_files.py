"""The scanner in CI never hangs and never passes by skipping (issue 14, item 6).

Only regular files are read, and at most ``--max-bytes`` of them; FIFOs, devices,
dangling links, unlistable directories and unreadable files are reported on stderr
and make the exit status 2 (never 0 "no findings", never 1 "findings"). The tests
run as root, so unreadability is simulated by making ``os.scandir``/``os.open`` raise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvcompat.scan import main, scan_paths

FINDING = "v = pool.get_value_buffer(0)\n"
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
needs_dev_zero = pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m kvcompat.scan ARGS`` in a child, so a hang fails the test, not the suite."""
    return subprocess.run(
        [sys.executable, "-m", "kvcompat.scan", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )


@needs_fifo
def test_a_fifo_named_py_in_a_directory_does_not_hang(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "x.py")  # nobody ever writes to it
    (tmp_path / "probe.py").write_text(FINDING)
    done = _cli(str(tmp_path), timeout=30)  # subprocess.TimeoutExpired would fail the test
    assert done.returncode == 2
    assert f"{tmp_path / 'x.py'}: KVC902 cannot read: a FIFO, not a regular file" in done.stderr
    assert "KVC001" in done.stdout  # the regular file is still scanned
    assert done.stdout.splitlines()[-1] == (
        "kvcompat scan: 1 finding in 1 of 1 file (1 fixable with --fix); "
        "1 path could not be checked (KVC9xx)."
    )


@needs_fifo
def test_a_fifo_named_explicitly_does_not_hang(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "x.py")
    done = _cli(str(tmp_path / "x.py"), timeout=30)
    assert done.returncode == 2
    assert "KVC902 cannot read: not a regular file or directory" in done.stderr


@needs_dev_zero
def test_a_link_to_dev_zero_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "zero.py").symlink_to("/dev/zero")
    done = _cli(str(tmp_path), timeout=30)
    assert done.returncode == 2
    assert "zero.py: KVC902 cannot read: a character device, not a regular file" in done.stderr
    report = scan_paths([tmp_path / "zero.py"])  # named explicitly, too
    assert [e.code for e in report.errors] == ["KVC902"]


def test_an_over_size_file_is_reported_not_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = tmp_path / "generated.py"
    big.write_text("x = 1\n" * 100)  # 600 bytes
    (tmp_path / "ok.py").write_text("import kvcompat\n")
    assert main(["--max-bytes", "599", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert err == (
        f"{big}: KVC903 too large: 600 bytes, over the limit of 599; "
        "exclude it, or raise the limit with --max-bytes\n"
    )
    assert out == (
        "kvcompat scan: no unguarded pool accesses in 1 file; 1 path could not be checked "
        "(KVC9xx).\n"
    )
    assert main(["--max-bytes", "600", str(tmp_path)]) == 0
    assert scan_paths([big], max_bytes=599).errors[0].code == "KVC903"


def test_the_default_limit_fits_real_source(tmp_path: Path) -> None:
    from kvcompat._scan._run import MAX_BYTES

    assert MAX_BYTES >= 8 * 1024 * 1024  # SGLang's largest module is well under 1 MiB


def test_an_unlistable_directory_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "hidden.py").write_text(FINDING)
    (tmp_path / "ok.py").write_text("import kvcompat\n")
    real_scandir = os.scandir

    def scandir(path: str | os.PathLike[str] = ".") -> object:
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    assert main([str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert err == (
        f"{locked}: KVC902 cannot read: cannot list directory: Permission denied; "
        "pass an existing Python file or directory\n"
    )
    assert out.endswith("in 1 file; 1 path could not be checked (KVC9xx).\n")


def test_an_unlistable_root_is_not_zero_files_and_exit_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "probe.py").write_text(FINDING)

    def scandir(path: str | os.PathLike[str] = ".") -> object:
        raise PermissionError(13, "Permission denied", os.fspath(path))

    monkeypatch.setattr(os, "scandir", scandir)
    assert main([str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert "KVC902 cannot read: cannot list directory: Permission denied" in err
    assert out == (
        "kvcompat scan: no unguarded pool accesses in 0 files; 1 path could not be checked "
        "(KVC9xx).\n"
    )


def test_an_unreadable_file_while_walking(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "secret.py"
    secret.write_text(FINDING)
    real_open = os.open

    def deny(path: str | os.PathLike[str], *args: int, **kwargs: int) -> int:
        if Path(path) == secret:
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", deny)
    assert main([str(tmp_path)]) == 2
    _, err = capsys.readouterr()
    assert err.startswith(f"{secret}: KVC902 cannot read: Permission denied")


def test_dangling_links(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "gone.py").symlink_to(tmp_path / "nowhere.py")
    assert main([str(tmp_path)]) == 2
    _, err = capsys.readouterr()
    assert err == (
        f"{tmp_path / 'gone.py'}: KVC902 cannot read: a dangling symbolic link; "
        "pass an existing Python file or directory\n"
    )
    assert main([str(tmp_path / "gone.py")]) == 2
    assert "a dangling symbolic link" in capsys.readouterr().err


def test_json_lists_what_could_not_be_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "gone.py").symlink_to(tmp_path / "nowhere.py")
    assert main(["--format", "json", str(tmp_path)]) == 2
    out, _ = capsys.readouterr()
    assert '"code": "KVC902"' in out
    assert '"exit_code": 2' in out
