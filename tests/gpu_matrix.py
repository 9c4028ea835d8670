"""Run the GPU tiers under every SGLang release of the matrix, each against its own kernels.

Two steps, because the GPU machine has neither SGLang nor a network:

``build`` (here, with network)
    For each release of ``tests/release_matrix.py`` (or those named): its overlay (installed
    if needed), then
    a kernel-only tree of it (``tests/layouts/_oracle/_sglang_kernel_overlay.py``) in
    ``DIR/sgl-<release>``; the ``tvm_ffi`` headers (``DIR/tvm_ffi_include``); and the wheels
    the kernels import that a bare device lacks (``msgspec``, and ``apache-tvm-ffi``, SGLang's
    JIT compiler front end), downloaded for the device's Python into ``DIR/wheels``. About
    52 MB for 0.5.12, 0.5.18, 0.5.20 and 0.5.23 (a tree is 3-19 MB): where a device takes
    less at a time, build the releases in groups, one ``DIR`` each.

``run`` (on the GPU machine, ``DIR`` carried)
    Unpacks the wheels into a temporary folder and runs the tests marked ``sglang`` of
    ``tests/layouts/test_layouts_gpu.py`` and ``tests/kernels/test_kernels_gpu.py`` once per
    tree, with ``KVCOMPAT_SGLANG_DIR``, ``KVCOMPAT_TVM_FFI_INCLUDE`` and ``PYTHONPATH`` set for
    it. Prints one summary line per release; exits non-zero if any release fails.

Usage::

    python tests/gpu_matrix.py build .device
    python tests/gpu_matrix.py build .device-a 0.5.12 0.5.13 0.5.14   # some releases
    python tests/gpu_matrix.py run .device [--junit-dir OUT]   # on the GPU machine

Results of the last run are in ``docs/layouts/oracles.md`` ("GPU tier per release").
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIERS = ("tests/layouts/test_layouts_gpu.py", "tests/kernels/test_kernels_gpu.py")
WHEELS = ("msgspec", "apache-tvm-ffi==0.1.11")
"""What the kernels import beyond torch and triton (``apache-tvm-ffi``: the version of the
test environment's, whose headers the store harness compiles against)."""
DEVICE_PYTHON = "3.12"
"""The Python of the lent GPU machines (torch 2.11, triton 3.6)."""


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{name} is not installed here: run `make .venv/.test-stamp` first")
    return Path(next(iter(spec.submodule_search_locations)))


def build(out: Path, releases: list[str]) -> None:
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "layouts" / "_oracle")]
    import _sglang_kernel_overlay as overlay
    import release_matrix

    unknown = sorted(set(releases) - set(release_matrix.RELEASES))
    if unknown:
        known = ", ".join(release_matrix.RELEASES)
        raise SystemExit(f"not releases of the matrix: {', '.join(unknown)} (it has {known})")
    out.mkdir(parents=True, exist_ok=True)
    for release in releases or release_matrix.RELEASES:
        target, _ = release_matrix.install(release)
        source = _package_dir("sglang") if target is None else target / "sglang"
        overlay.build(source, out / f"sgl-{release}")
        print(f"SGLang {release}: {out / f'sgl-{release}'}")
    headers = out / "tvm_ffi_include"
    shutil.rmtree(headers, ignore_errors=True)
    shutil.copytree(_package_dir("tvm_ffi") / "include", headers)
    wheels = out / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
        "--no-deps", "--only-binary", ":all:", "--python-version", DEVICE_PYTHON,
        "-d", str(wheels), *WHEELS,
    ]  # fmt: skip
    subprocess.run(command, check=True)
    for cache in out.rglob("__pycache__"):
        shutil.rmtree(cache)
    print(f"carry {out} to the GPU machine, then: python tests/gpu_matrix.py run {out}")


def run(trees: Path, junit_dir: Path | None) -> int:
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device here: every GPU test would skip; run this on the GPU machine")
        return 2
    trees = trees.resolve()
    import release_matrix

    releases = sorted(
        (path.name.removeprefix("sgl-") for path in trees.glob("sgl-*")),
        key=release_matrix.release_key,
    )
    if not releases:
        print(f"no sgl-<release> trees in {trees}: run `tests/gpu_matrix.py build` first")
        return 2
    failed = []
    with tempfile.TemporaryDirectory() as site:
        for wheel in sorted((trees / "wheels").glob("*.whl")):
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(site)
        for release in releases:
            tree = trees / f"sgl-{release}"
            env = {
                **os.environ,
                "KVCOMPAT_SGLANG_DIR": str(tree / "sglang"),
                "KVCOMPAT_TVM_FFI_INCLUDE": str(trees / "tvm_ffi_include"),
                "PYTHONPATH": os.pathsep.join((site, str(tree), str(ROOT))),
            }
            command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                       "-k", "sglang", *TIERS]  # fmt: skip
            if junit_dir is not None:
                junit_dir.mkdir(parents=True, exist_ok=True)
                command.append(f"--junitxml={junit_dir / f'gpu-{release}.xml'}")
            done = subprocess.run(
                command, cwd=ROOT, env=env, capture_output=True, text=True, check=False
            )
            lines = done.stdout.strip().splitlines()
            summary = lines[-1] if lines else done.stderr.strip()[-300:]
            if done.returncode != 0:
                failed.append(release)
                print(_first_failures(done.stdout), done.stderr[-3000:], sep="\n")
            print(f"== SGLang {release}: exit {done.returncode}, {re.sub('=+', '', summary)}")
    if failed:
        print(f"failed under SGLang {', '.join(failed)}")
    return 1 if failed else 0


def _first_failures(output: str, size: int = 6000) -> str:
    """The start of pytest's first ERRORS or FAILURES section (where the cause is), and the
    summary line; the whole output's tail would be only the per-test summary lines."""
    starts = [m.start() for m in re.finditer(r"^=+ (ERRORS|FAILURES) =+$", output, re.M)]
    head = output[min(starts) : min(starts) + size] if starts else ""
    return f"{head}\n...\n{output[-1500:]}" if head else output[-size:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    steps = parser.add_subparsers(dest="step", required=True)
    build_step = steps.add_parser("build", help="build the trees and fetch the wheels (here)")
    build_step.add_argument("dir", type=Path)
    build_step.add_argument("releases", nargs="*", help="releases of the matrix (default: all)")
    run_step = steps.add_parser("run", help="run the GPU tiers per tree (on the GPU machine)")
    run_step.add_argument("dir", type=Path)
    run_step.add_argument("--junit-dir", type=Path, default=None)
    args = parser.parse_args()
    if args.step == "build":
        build(args.dir, args.releases)
        return 0
    return run(args.dir, args.junit_dir)


if __name__ == "__main__":
    sys.exit(main())
