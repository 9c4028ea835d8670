"""The GPU-only kernel paths (inline PTX) assemble for sm_90, checked on any machine.

Triton compiles for a named target without a GPU, with the ptxas it ships; the script
runs in its own process so that importing triton here cannot meet ``TRITON_INTERPRET``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def test_gpu_only_paths_assemble_for_sm90(tmp_path: Path) -> None:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (pip install triton)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(HERE / "_compile_sm90.py")],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600, check=False,
    )  # fmt: skip
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr.lower():
        pytest.skip("this triton build has no ptxas for CUDA targets")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    lines = proc.stdout.strip().splitlines()
    built = [line for line in lines if not line.startswith("widths ")]
    assert len(built) == 16, proc.stdout
    assert all(line.endswith("bytes of sm_90 code") for line in built), proc.stdout
    _layered_launches_move_as_many_bytes_at_a_time([line for line in lines if line not in built])


def _layered_launches_move_as_many_bytes_at_a_time(lines: list[str]) -> None:
    """A launch over many layers (or token spaces) loads and stores pool bytes as wide as a
    one-layer launch: as many 16-byte accesses, no more single-byte or 2-byte ones. (Its
    per-layer offsets are loaded, so the compiler must be told they are 16-byte multiples;
    without that the V4 read moved its e4m3 codes one byte at a time.)"""
    found: dict[tuple[str, str], dict[str, int]] = {}
    for line in lines:
        head, counts = line.removeprefix("widths ").split(": ")
        kernel, how = head.split(" ")
        found[kernel, how] = {k: int(v) for k, v in (c.split("=") for c in counts.split())}
    assert {kernel for kernel, _ in found} == {"read_fp8", "write_fp8", "gather_rows"}, lines
    assert {how for _, how in found} == {"one-layer", "layered", "segments"}, lines
    for (kernel, how), counts in found.items():
        one = found[kernel, "one-layer"]
        for access in {*one, *counts}:
            if ".v" in access:
                assert counts.get(access, 0) == one[access], (kernel, how, access, counts, one)
            elif access.endswith((".b8", ".b16")):
                assert counts.get(access, 0) <= one.get(access, 0), (kernel, how, counts, one)
