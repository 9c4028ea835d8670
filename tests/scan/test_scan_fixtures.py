"""The committed fixture files: exact findings, the committed --fix result, no-finding files."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcompat.scan import Finding, fix_source, scan_paths, scan_source

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "scan"

BACKEND = [
    # (line, col, code, fixable)
    (19, 49, "KVC001", True),  # shape probe self.token_to_kv_pool.get_value_buffer(start_layer)
    (23, 44, "KVC003", True),  # set_kv_buffer(layer, loc, k, v)
    (24, 59, "KVC002", True),  # k_cache, v_cache = ...get_kv_buffer(layer.layer_id)
    (29, 14, "KVC003", False),  # six positional arguments (scales)
    (40, 14, "KVC001", True),  # receiver and name on different lines
    (45, 14, "KVC003", True),  # layer is a conditional expression: parenthesised
    (46, 14, "KVC003", False),  # keyword arguments
    (47, 14, "KVC003", True),  # KVWriteLoc location: compat's set_kv_buffer takes it
]

PROFILER = [
    (9, 35, "KVC004"),  # token_to_kv_pool.k_buffer[i]
    (10, 35, "KVC004"),  # token_to_kv_pool.v_buffer[i]
    # 15: pool.kv_buffer only summed for its bytes: any layout
    (23, 30, "KVC004"),  # self.kv_cache.k_buffer
    # 25: under hasattr(self.kv_cache, "v_buffer"), a check on the receiver
    # 31: getattr(self.kv_cache, "kv_buffer") returned whole, not indexed by token
    (40, 48, "KVC004"),  # model_runner.token_to_kv_pool.k_buffer
    (41, 48, "KVC004"),
    # 53: inside a *Pool class: its own implementation
    (61, 17, "KVC005"),  # pool.kv_buffer[0][loc]: token rows
    (65, 20, "KVC006"),  # k_cache = pool.get_key_buffer(i); k_cache[loc]
    (66, 31, "KVC007"),  # pool.get_kv_buffer_shape()
]


def _read(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def _positions(findings: list[Finding]) -> list[tuple[int, int, str]]:
    return [(f.line, f.col, f.code) for f in findings]


def test_attention_backend_findings_are_exact() -> None:
    findings = scan_source(_read("attention_backend.py"), "attention_backend.py")
    assert [(f.line, f.col, f.code, f.fixable) for f in findings] == BACKEND
    assert all(f.path == "attention_backend.py" for f in findings)


def test_profiler_findings_are_exact() -> None:
    findings = scan_source(_read("kv_profiler.py"), "kv_profiler.py")
    assert _positions(findings) == PROFILER
    assert not any(f.fixable for f in findings)


@pytest.mark.parametrize("name", ["attention_backend.py", "kv_profiler.py", "suppressed.py"])
def test_columns_point_at_the_name(name: str) -> None:
    lines = _read(name).splitlines()
    for finding in scan_source(_read(name), name):
        text = lines[finding.line - 1][finding.col - 1 :]
        expected = (
            ("getattr(",)
            if "getattr" in finding.message.split()[0]
            else (
                "get_value_buffer(",
                "get_kv_buffer(",
                "get_kv_buffer_shape(",
                "get_key_buffer(",
                "set_kv_buffer(",
                "k_buffer",
                "v_buffer",
                "kv_buffer",
            )
        )
        assert text.startswith(expected), (finding, text)


def test_messages_name_the_receiver_the_classes_and_the_replacement() -> None:
    first = scan_source(_read("attention_backend.py"))[0]
    assert first.message.startswith("self.token_to_kv_pool.get_value_buffer() — breaks on ")
    assert "NotImplementedError" in first.message
    assert first.message.endswith(
        "use kvcompat.compat(self.token_to_kv_pool).get_value_buffer(layer_id) instead"
    )
    not_fixable = scan_source(_read("attention_backend.py"))[3]
    assert not_fixable.message.endswith(
        "; not auto-fixable: it passes 6 positional arguments, not 4"
    )


@pytest.mark.parametrize("name", ["guarded.py", "ignored_file.py"])
def test_files_without_findings(name: str) -> None:
    assert scan_source(_read(name), name) == []


def test_suppression_fixture() -> None:
    findings = scan_source(_read("suppressed.py"))
    # Line 7 silences KVC004 but has a KVC005; line 8's marker is inside a string.
    assert _positions(findings) == [(7, 15, "KVC005"), (8, 36, "KVC002")]


def test_fix_matches_the_committed_expected_file() -> None:
    fixed, remaining = fix_source(_read("attention_backend.py"), "attention_backend.py")
    assert fixed == _read("expected/attention_backend.py")
    # Only the two set_kv_buffer calls kvcompat cannot port mechanically (scales, keyword
    # arguments) remain, further down by the added import line and helpers.
    # The rewrite of the two-line call on lines 39-40 takes one line.
    added = fixed.count("\n") - _read("attention_backend.py").count("\n") + 1
    assert [(f.line, f.col, f.code, f.fixable) for f in remaining] == [
        (29 + added, 14, "KVC003", False),
        (46 + added - 1, 14, "KVC003", False),
    ]


def test_rescanning_the_fixed_file_finds_only_the_non_fixable_ones() -> None:
    fixed = _read("expected/attention_backend.py")
    before = [f for f in scan_source(_read("attention_backend.py")) if not f.fixable]
    after = scan_source(fixed)
    assert [f.code for f in after] == [f.code for f in before]
    added = fixed.count("\n") - _read("attention_backend.py").count("\n") + 1
    assert [f.line for f in after] == [f.line + added - (f.line > 40) for f in before]
    assert fix_source(fixed) == (fixed, after)  # idempotent


def test_fix_keeps_everything_else_byte_for_byte() -> None:
    original = _read("attention_backend.py")
    fixed = _read("expected/attention_backend.py")
    start = fixed.index("import kvcompat\n")
    end = fixed.index("\n\n\n", fixed.rindex("\ndef _kvcompat_")) + 3
    undone = (
        (fixed[:start] + fixed[end:])
        .replace(
            "_kvcompat_get_value_buffer(self.token_to_kv_pool, ",
            "self.token_to_kv_pool.get_value_buffer(",
        )
        .replace(
            "_kvcompat_set_kv_buffer(forward_batch.token_to_kv_pool, ",
            "forward_batch.token_to_kv_pool.set_kv_buffer(",
        )
        .replace(
            "_kvcompat_get_kv_buffer(forward_batch.token_to_kv_pool, ",
            "forward_batch.token_to_kv_pool.get_kv_buffer(",
        )
        .replace("_kvcompat_set_kv_buffer(pool, ", "pool.set_kv_buffer(")
    )
    multi_line = "pool\n            .get_value_buffer(layer.layer_id)"  # one span, rewritten
    undone = undone.replace("_kvcompat_get_value_buffer(pool, layer.layer_id)", multi_line)
    assert undone == original


def test_fixture_directory_scan() -> None:
    report = scan_paths([FIXTURES], exclude=["expected", "conftest.py"])
    assert report.files == 5
    assert report.errors == ()
    per_file = {Path(f.path).name for f in report.findings}
    assert per_file == {"attention_backend.py", "kv_profiler.py", "suppressed.py"}
    assert len(report.findings) == len(BACKEND) + len(PROFILER) + 2
    assert report.fixable == 7
    assert report.exit_code == 1
