"""``KVC100``: what ``--fix`` rewrote but cannot vouch for is listed, never called clean."""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path

import pytest

from kvcompat._scan._handcheck import hand_checks
from kvcompat.scan import fix_source, main, scan_paths

SMALL_BACKEND = textwrap.dedent(
    """\
    def v_head_dim(pool):
        return pool.get_value_buffer(0).shape[-1]


    def store(pool, layer, loc, k, v):
        pool.set_kv_buffer(layer, loc, k, v)


    def attend(pool, layer_id, q, loc):
        k_cache, v_cache = pool.get_kv_buffer(layer_id)
        return q @ k_cache[loc].T, v_cache.index_select(0, loc), v_cache.dtype
    """
)


def notes(body: str) -> list[tuple[int, str]]:
    """(line, what the note starts with) for the fixed text of ``body``."""
    body = textwrap.dedent(body)
    text, _ = fix_source(body)
    added = text.count("\n") - body.count("\n")  # the helper block; rewrites add no lines
    found = hand_checks(ast.parse(text), text, "x.py")
    return [(n.line - added, n.message.split(" — ")[0]) for n in found]


def test_the_small_backend_leaves_one_line_to_check() -> None:
    # Shapes, gathers by token and metadata are what compat views answer; set_kv_buffer's
    # cache_v is not stored where the value is the key row: that one is listed.
    assert notes(SMALL_BACKEND) == [
        (6, "check by hand: _kvcompat_set_kv_buffer(pool, layer, loc, k, v)")
    ]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("def f(p, i):\n    return p.get_value_buffer(i)\n", ["_kvcompat_get_value_buffer(p, i)"]),
        ("def f(p, i):\n    kernel(p.get_value_buffer(i))\n", ["kernel(_kvcompat_get_value_"]),
        ("def f(p, i):\n    k, v = p.get_kv_buffer(i)\n    kernel(k)\n", ["kernel(k)"]),
        ("def f(p, i):\n    k, v = p.get_kv_buffer(i)\n    return k.data_ptr()\n", ["k.data_ptr"]),
        ("def f(p, i):\n    v = p.get_value_buffer(i).to(x)\n    return v.dtype\n", ["v.dtype"]),
        ("def f(p, i, l, x):\n    k, v = p.get_kv_buffer(i)\n    v[l] = x\n", ["v[l]"]),
        (
            "def f(p, i):\n    self.k = p.get_value_buffer(i)\n",
            ["_kvcompat_get_value_buffer(p, i)"],
        ),
        ("def f(p, i, l):\n    k, v = p.get_kv_buffer(i)\n    return k[l], v.shape[-1]\n", []),
        ("def f(p, i):\n    return len(p.get_value_buffer(i)), p.get_value_buffer(i).dtype\n", []),
        ("def f(p, i):\n    p.get_value_buffer(i)\n", []),  # evaluated and dropped
    ],
)
def test_uses_that_need_a_check(body: str, expected: list[str]) -> None:
    found = [what.removeprefix("check by hand: ") for _, what in notes(body)]
    assert [f[: len(e)] for f, e in zip(found, expected, strict=False)] == expected
    assert len(found) == len(expected)


def test_a_store_note_says_it_replaces_the_key() -> None:
    text, _ = fix_source("def f(p, i, l, x):\n    k, v = p.get_kv_buffer(i)\n    v[l] = x\n")
    [note] = hand_checks(ast.parse(text), text, "x.py")
    assert "the value view is the key row, so a value stored here replaces the key" in (
        note.message
    )
    assert note.code == "KVC100"
    assert not note.fixable


def test_a_suppression_comment_silences_a_checked_line() -> None:
    text, _ = fix_source(SMALL_BACKEND)
    text = text.replace(
        "_kvcompat_set_kv_buffer(pool, layer, loc, k, v)\n",
        "_kvcompat_set_kv_buffer(pool, layer, loc, k, v)  # kvcompat: ignore[KVC100]\n",
    )
    assert hand_checks(ast.parse(text), text, "x.py") == []


def test_unfixed_code_has_no_notes() -> None:
    text = "def f(p, i):\n    return kernel(p.get_value_buffer(i))\n"
    assert hand_checks(ast.parse(text), text, "x.py") == []  # a finding (KVC001), not a note


def test_the_cli_never_calls_a_fixed_file_with_notes_clean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "backend.py"
    path.write_text(SMALL_BACKEND)
    assert main(["--fix", str(path)]) == 0  # notes do not change the exit status
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == (
        "kvcompat scan: fixed 3 findings; remaining: no unguarded pool accesses in 1 file;"
        " 1 line to check by hand (KVC100, listed above)."
    )
    assert out[0].startswith(f"{path}:")
    assert ": KVC100 check by hand: _kvcompat_set_kv_buffer(" in out[0]
    # The rescan lists it again, and so do the API and the JSON document.
    assert main([str(path)]) == 0
    summary = (
        "kvcompat scan: no unguarded pool accesses in 1 file; 1 line to check by hand"
        " (KVC100, listed above)."
    )
    assert capsys.readouterr().out.splitlines() == [out[0], summary]
    report = scan_paths([path])
    assert [n.code for n in report.hand_checks] == ["KVC100"]
    assert main(["--format", "json", str(path)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [n["code"] for n in document["hand_checks"]] == ["KVC100"]


def test_diff_lists_the_notes_of_the_file_it_would_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "backend.py"
    path.write_text(SMALL_BACKEND)
    assert main(["--diff", str(path)]) == 1  # nothing written: the findings are still there
    captured = capsys.readouterr()
    assert "KVC100 check by hand: _kvcompat_set_kv_buffer(" in captured.err
    assert path.read_text() == SMALL_BACKEND
