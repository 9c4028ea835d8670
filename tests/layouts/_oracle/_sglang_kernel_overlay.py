"""Build a kernel-only SGLang tree for a GPU machine that has no SGLang (nor its deps).

The GPU tier (``tests/layouts/test_layouts_gpu.py``) compares kvcompat with SGLang's own
kernels: its CUDA JIT stores (compiled from ``sglang/kernels/jit``) and its Triton readers
and stores under ``sglang/kernels/ops``. A device without network cannot install SGLang's
dependency tree, so this script copies the installed sglang's ``kernels`` package and its
DeepSeek-V4 test references (``test/kernels/deepseek_v4``: the V4 Triton quantizer)
**unmodified** and writes explicit stand-ins for the few ``sglang.srt`` helpers that the
kernels' import chain needs (platform probes, ``envs``, decorators), each answering as an
NVIDIA CUDA GPU would (not HIP, XPU, NPU or MUSA; no Blackwell paths). Any other
``sglang.srt`` module is absent, so an import that needs more fails (the tests then skip
and say why) instead of running on a guess. An ``envs`` variable without a listed value
raises ``LookupError``.

Usage (the tree is about 19 MB; carry it with the device command)::

    python tests/layouts/_oracle/_sglang_kernel_overlay.py \\
        "$(python -c 'import sglang, os; print(os.path.dirname(sglang.__file__))')" .device/sgl
    # on the device (msgspec carried as a wheel, see docs/layouts/oracles.md):
    KVCOMPAT_SGLANG_DIR=$PWD/.device/sgl/sglang PYTHONPATH=$PWD/.device/sgl:$PWD \\
        python -m pytest tests/layouts/test_layouts_gpu.py
"""

from __future__ import annotations

import shutil
import sys
import textwrap
from pathlib import Path

STAND_INS = {
    "srt/__init__.py": "",
    "srt/environ.py": """
        _VALUES = {"SGLANG_USE_AITER": False, "SGLANG_JIT_KERNEL_RUN_FULL_TESTS": False,
                   "SGLANG_OPT_DSV41_BF16_INDEX_LOGITS": None}


        class _Env:
            def __init__(self, name):
                self.name = name

            def get(self):
                if self.name not in _VALUES:
                    raise LookupError(f"the kernel overlay's envs has no value for {self.name}")
                return _VALUES[self.name]


        class _Envs:
            def __getattr__(self, name):
                if not name.startswith("SGLANG_"):
                    raise AttributeError(name)
                return _Env(name)


        envs = _Envs()
    """,
    "srt/utils/__init__.py": """
        import torch

        IS_CUDA = torch.cuda.is_available()


        def is_cuda(): return IS_CUDA
        def is_hip(): return False
        def is_xpu(): return False
        def is_npu(): return False
        def is_musa(): return False
        def is_gfx95_supported(): return False
        def is_sm100_supported(device=None): return False
        def is_sm120_supported(device=None): return False
        def get_device_capability(device_id=0): return torch.cuda.get_device_capability(device_id)
        def ceil_align(x, a): return (x + a - 1) // a * a
    """,
    "srt/utils/common.py": """
        from sglang.srt.utils import is_cuda, is_hip


        def is_gfx1250_supported(): return False
    """,
    "srt/utils/custom_op.py": """
        def register_custom_op(fn=None, **options):
            # The tests call the kernels eagerly: no torch.library registration.
            return fn if fn is not None else (lambda f: f)
    """,
    "srt/utils/patch_torch.py": """
        def register_fake_if_exists(op_name):
            return lambda func: func  # nothing here is compiled
    """,
    "srt/layers/__init__.py": "",
    "srt/layers/attention/__init__.py": "",
    "srt/layers/attention/dsa/__init__.py": "",
    "srt/layers/attention/dsa/utils.py": """
        INDEXER_K_CACHE_PRESHUFFLE_TILE = 16  # read only on the aiter (ROCm) preshuffle path


        def aiter_can_use_preshuffle_paged_mqa(*args, **kwargs): return False
    """,
    "srt/runtime_context.py": """
        class _Platform:
            is_blackwell = False
            is_hopper = True


        def get_platform(): return _Platform()
    """,
}


def build(sglang_dir: Path, out: Path) -> Path:
    """Write ``out/sglang`` (replacing it) and return its path."""
    package = out / "sglang"
    if package.exists():
        shutil.rmtree(package)
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(sglang_dir / "kernels", package / "kernels", ignore=skip)
    references = Path("test") / "kernels" / "deepseek_v4"
    shutil.copytree(sglang_dir / references, package / references, ignore=skip)
    (package / "__init__.py").write_text("")
    for parent in (Path("test"), Path("test") / "kernels"):  # SGLang's are empty too
        (package / parent / "__init__.py").write_text("")
    for relative, text in STAND_INS.items():
        path = package / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    return package


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit("usage: _sglang_kernel_overlay.py SGLANG_PACKAGE_DIR OUT_DIR")
    print(build(Path(sys.argv[1]), Path(sys.argv[2])))


if __name__ == "__main__":
    main()
