"""The kernel-only SGLang tree the GPU tiers run on offers exactly the release's layout code.

``tests/layouts/_oracle/_sglang_kernel_overlay.py`` copies a release's kernels unmodified
and stands in for the few other ``sglang`` modules they import. A stand-in that misses a
name a release imports, or a module the copy leaves out, would only show on the GPU
machine (as an import error, or as a kernel silently missing). This builds the tree from
the installed release and resolves every entry of ``_sglang.places`` in it, with
``torch.cuda`` reporting a device (the import branches a GPU machine takes), and in the
full release: the two must agree entry for entry. The release matrix runs it under every
release it covers.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _sglang import places
from _sglang.env import install_torchvision_stub
from _sglang.features import ReleaseLacks, declared_kv_layouts, jit_dir, sglang_code

pytestmark = [pytest.mark.sglang, pytest.mark.interpret]

ROOT = Path(__file__).resolve().parents[2]
ORACLE = Path(__file__).resolve().parent / "_oracle"


def _resolve(pythonpath: list[Path], tmp: Path, *flags: str) -> dict[str, str]:
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "SGLANG_CACHE_DIR": str(tmp),
        "SGLANG_JIT_CACHE_DIR": str(tmp),
        "PYTHONPATH": os.pathsep.join(str(path) for path in pythonpath),
    }
    done = subprocess.run(
        [sys.executable, "-W", "ignore", str(ORACLE / "resolve_places.py"), *flags],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _installed_sglang() -> Path:
    """The ``sglang`` package first on ``sys.path`` (the release under test), not imported."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("sglang is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def test_the_kernel_tree_resolves_every_place_as_the_release_does(tmp_path: Path) -> None:
    source = _installed_sglang()
    sys.path.insert(0, str(ORACLE))
    try:
        import _sglang_kernel_overlay as overlay
    finally:
        sys.path.remove(str(ORACLE))
    tree = tmp_path / "tree"
    overlay.build(source, tree)

    inherited = [Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    full = _resolve([ROOT, ROOT / "tests", *inherited], tmp_path)
    kernels_only = _resolve([tree, ROOT, ROOT / "tests"], tmp_path, "--as-gpu")
    assert kernels_only == full
    assert any(value != "lacks" for value in full.values()), full


def test_the_cuda_stores_and_the_v41_reader_take_the_same_layouts() -> None:
    """The GPU tier builds SGLang's CUDA stores for the layouts of the C++ ``KVLayout`` enum
    and asks its V4.1 reader for those of the Python one: per release, the two must agree
    (0.5.21 V4, V41, V41_FP4; 0.5.22 adds UNIFORM_FP8; 0.5.23 V41_NEW, V41_FP4_NEW)."""
    declared = declared_kv_layouts(jit_dir(_installed_sglang()))
    install_torchvision_stub()  # the Python enum's package imports sglang.srt.utils
    try:
        python = {member.value for member in sglang_code(*places.KV_LAYOUT)}
    except ReleaseLacks:
        assert declared == frozenset()  # no V4.1 before 0.5.21, in either language
        raise
    assert declared == python
    assert {"v4", "v41", "v41_fp4"} <= declared
