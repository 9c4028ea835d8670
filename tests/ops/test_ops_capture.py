"""The CUDA-graph declarations (kvcompat._capture): complete, consistent, documented."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from _capture_cases import CASES

import kvcompat
from kvcompat._capture import CAPTURE, capturability, markdown_table
from kvcompat.adapters._leaf import LeafAdapter

ROOT = Path(__file__).resolve().parents[2]


def test_every_capturable_declaration_has_a_gpu_case() -> None:
    declared = {c.operation for c in CAPTURE if c.capturable}
    assert declared == set(CASES)


def test_every_public_operation_is_declared() -> None:
    names = {c.operation for c in CAPTURE}
    assert len(names) == len(CAPTURE)  # one declaration each
    methods = {
        f"KVPool.{name}"
        for name, member in inspect.getmembers(LeafAdapter, inspect.isfunction)
        if name
        in ("get_key_buffer", "get_value_buffer", "get_kv_buffer", "read", "read_kv", "write")
    }
    functions = {f"kvcompat.{name}" for name in ("adapt", "describe", "memory_report",
                                                 "transfer_descriptors")}  # fmt: skip
    assert methods | functions <= names
    for name in functions:
        assert callable(getattr(kvcompat, name.removeprefix("kvcompat.")))


def test_declared_arguments_are_real_parameters() -> None:
    for entry in CAPTURE:
        if not entry.kwargs or not entry.operation.startswith("KVPool."):
            continue
        method = getattr(LeafAdapter, entry.operation.removeprefix("KVPool."))
        assert set(entry.kwargs) <= set(inspect.signature(method).parameters), entry


def test_the_write_declaration_is_what_is_true() -> None:
    """check_finite=False alone does not make a write capturable: the loc check syncs."""
    write = capturability("KVPool.write")
    assert dict(write.kwargs) == {"validate": False}
    assert "check_finite=False` alone is not enough" in write.why
    with pytest.raises(KeyError, match="no capturability"):
        capturability("KVPool.nope")


def test_the_docs_table_is_generated_from_the_declarations() -> None:
    table = markdown_table()
    assert len(table.splitlines()) == 2 + len(CAPTURE)
    page = (ROOT / "docs" / "compile-and-graphs.md").read_text()
    assert "_generated/capture_table.md" in page
