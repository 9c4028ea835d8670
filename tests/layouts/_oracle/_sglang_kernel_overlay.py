"""Build a kernel-only SGLang tree for a GPU machine that has no SGLang (nor its deps).

The GPU tier (``tests/layouts/test_layouts_gpu.py``) compares kvcompat with SGLang's own
kernels: its CUDA JIT stores (compiled from ``sglang/kernels/jit``) and its Triton readers
and stores under ``sglang/kernels/ops``. A device without network cannot install SGLang's
dependency tree, so this script copies an installed sglang's ``kernels`` package and its
DeepSeek-V4 test references (``test/kernels/deepseek_v4``, from 0.5.17) **unmodified** and
writes explicit stand-ins for the few other ``sglang`` helpers that the kernels' import chain
needs (platform probes, ``envs``, decorators, a one-GPU parallel context), each answering
as a single NVIDIA CUDA GPU would (not HIP, XPU, NPU or MUSA; no Blackwell paths). The
stand-ins cover the names the releases of the matrix import. 0.5.12-0.5.15 have no
``kernels`` package: from them come the ``jit_kernel`` package and :data:`LEGACY_MODULES`;
0.5.16 has both packages (its JIT moved under ``kernels/jit`` in 0.5.17).
Any other ``sglang.srt`` module is absent, so code that needs more fails loudly instead
of running on a guess; an ``envs`` variable without a listed value raises
``LookupError``. A ``dist-info`` stamp carries the release's version, which the tests'
skips name.

``tests/gpu_matrix.py build`` builds one tree per release of the matrix, with the
wheels and headers the device needs. By hand (the tree is 3-19 MB; carry it, and the
wheels, with the device command)::

    python tests/layouts/_oracle/_sglang_kernel_overlay.py \\
        "$(python -c 'import sglang, os; print(os.path.dirname(sglang.__file__))')" .device/sgl
    # on the device (msgspec and apache-tvm-ffi as wheels, see docs/layouts/oracles.md):
    KVCOMPAT_SGLANG_DIR=$PWD/.device/sgl/sglang PYTHONPATH=$PWD/.device/sgl:$PWD \\
        python -m pytest tests/layouts/test_layouts_gpu.py
"""

from __future__ import annotations

import ast
import shutil
import sys
import textwrap
from pathlib import Path

STAND_INS = {
    "srt/__init__.py": "",
    "srt/environ.py": """
        _VALUES = {"SGLANG_USE_AITER": False, "SGLANG_JIT_KERNEL_RUN_FULL_TESTS": False,
                   "SGLANG_OPT_DSV41_BF16_INDEX_LOGITS": None,
                   "SGLANG_OPT_BF16_FP32_GEMM_ALGO": "cublas",
                   # the JIT compiler's (kernels/jit/utils), at their defaults
                   "SGLANG_CRASH_ON_JIT_COMPILE": False, "SGLANG_JIT_LOG_RESOURCE_USAGE": False,
                   "SGLANG_SAIL_GPU_ARCH": "native", "SGLANG_JIT_FORCE_RECOMPILE": False,
                   "SGLANG_JIT_CACHE_DIR": None, "SGLANG_JIT_CACHE_DEBUG": False,
                   "SGLANG_JIT_CACHE_KEEP": None}


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
        def is_cpu(): return False
        def is_gfx1250_supported(): return False
        def get_bool_env_var(name, default="false"):
            import os
            return os.environ.get(name, default).lower() in ("true", "1")
        def get_device_core_count(device_id=0):
            return torch.cuda.get_device_properties(device_id).multi_processor_count
        def get_device_name(device_id=0): return torch.cuda.get_device_name(device_id)
        def log_info_on_rank0(logger, msg): logger.info(msg)
    """,
    "utils.py": """
        def is_in_ci(): return False
    """,
    "srt/layers/deep_gemm_wrapper.py": """
        ENABLE_JIT_DEEPGEMM = False  # no DeepGEMM in the overlay: its GEMM paths are off
    """,
    "srt/utils/common.py": """
        import torch

        from sglang.srt.utils import is_cuda, is_gfx1250_supported, is_hip


        def get_cuda_version():  # 0.5.16's JIT architecture probe asks the toolkit torch has
            return tuple(map(int, torch.version.cuda.split("."))) if torch.version.cuda else (0, 0)
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
    "srt/layers/dcp/__init__.py": """
        # 0.5.15's MLA scatter asks for decode context parallelism: one GPU has none.
        def dcp_enabled(): return False
        def get_attention_dcp_rank(): return 0
        def get_attention_dcp_world_size(): return 1
    """,
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


        class _Parallel:  # one GPU: no decode context parallelism
            attn_dcp_size = 1
            attn_dcp_rank = 0
            dcp_enabled = False


        def get_parallel(): return _Parallel()
    """,
    "srt/platforms/__init__.py": """
        class _Capabilities:
            supports_triton = True


        class _Platform:  # read by 0.5.23's MLA scatter, which falls back without Triton
            capabilities = _Capabilities()


        current_platform = _Platform()
    """,
}


LEGACY_MODULES = (
    ("srt/layers/attention/dsv4/quant_k_cache.py",),  # the V4 quantizer
    ("srt/layers/attention/dsv4/index_buf_accessor.py",),  # the V4 pack store
    ("srt/layers/attention/dsv4/dequant_k_cache.py",),  # the V4 reader (0.5.13-0.5.15)
    # the DSA quantizer and reader: ``dsa`` from 0.5.13, ``nsa`` in 0.5.12
    ("srt/layers/attention/dsa/quant_k_cache.py", "srt/layers/attention/nsa/quant_k_cache.py"),
    (
        "srt/layers/attention/dsa/dequant_k_cache.py",
        "srt/layers/attention/nsa/dequant_k_cache.py",
    ),
    ("srt/layers/quantization/fp8_kernel.py",),  # is_fp8_fnuz, imported by the V4 code
    ("srt/layers/quantization/fp8_utils.py",),
    # the MLA row write: its own module from 0.5.13 (0.5.13's utils.py imports the eviction
    # policies, which the tree has not), in the cache utilities in 0.5.12
    ("srt/mem_cache/triton_ops/mla_buffer.py", "srt/mem_cache/utils.py"),
    ("kernel_api_logging.py",),  # imported by jit_kernel (the standard library only)
)
"""0.5.12-0.5.15's layout code, copied unmodified (from 0.5.16 on it lives under
``kernels``): of each entry, the first file the release has (none: it lacks that code)."""
SGL_KERNEL = """
    # Stand-in for sgl_kernel (SGLang's compiled ops), which the overlay has not. Up to 0.5.16
    # (while the JIT is the jit_kernel package) fp8_kernel imports GEMM quantizers from it at
    # import time on CUDA, later releases only on other platforms; layout code never calls them.
    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)

        def missing(*args, **kwargs):
            raise NotImplementedError(f"sgl_kernel.{name} is not in the kernel overlay")

        return missing
"""


def _version(sglang_dir: Path) -> str:
    """The release's version, from the ``_version.py`` its wheel carries."""
    tree = ast.parse((sglang_dir / "_version.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__version__" for target in node.targets
        ):
            return str(ast.literal_eval(node.value))
    raise SystemExit(f"{sglang_dir / '_version.py'} assigns no __version__")


def build(sglang_dir: Path, out: Path) -> Path:
    """Write ``out/sglang`` (replacing it) and return its path."""
    package = out / "sglang"
    for previous in (package, out / "sgl_kernel"):  # the stand-in only a 0.5.12-0.5.16 tree has
        if previous.exists():
            shutil.rmtree(previous)
    skip = shutil.ignore_patterns("__pycache__")
    jit_package = (sglang_dir / "jit_kernel").is_dir()  # up to 0.5.16 (then kernels/jit)
    if jit_package:
        shutil.copytree(sglang_dir / "jit_kernel", package / "jit_kernel", ignore=skip)
    if (sglang_dir / "kernels").is_dir():  # 0.5.16 on
        shutil.copytree(sglang_dir / "kernels", package / "kernels", ignore=skip)
        if (sglang_dir / "kernel_api_logging.py").is_file():  # 0.5.16-0.5.17's JIT imports it
            shutil.copy2(sglang_dir / "kernel_api_logging.py", package / "kernel_api_logging.py")
        references = Path("test") / "kernels" / "deepseek_v4"
        if (sglang_dir / references).is_dir():  # from 0.5.17
            shutil.copytree(sglang_dir / references, package / references, ignore=skip)
            for parent in (Path("test"), Path("test") / "kernels"):  # SGLang's are empty too
                (package / parent / "__init__.py").write_text("")
    else:  # 0.5.12-0.5.15: the srt modules that hold the layout code
        for choices in LEGACY_MODULES:
            relative = next((name for name in choices if (sglang_dir / name).is_file()), None)
            if relative is None:
                continue
            target = package / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(sglang_dir / relative, target)
            for parent in target.relative_to(package).parents:  # empty: nothing else loads
                init = package / parent / "__init__.py"
                if not init.exists():
                    init.write_text("")
    if jit_package:  # see SGL_KERNEL
        (out / "sgl_kernel").mkdir(exist_ok=True)
        (out / "sgl_kernel" / "__init__.py").write_text(textwrap.dedent(SGL_KERNEL).lstrip("\n"))
    (package / "__init__.py").write_text("")
    for relative, text in STAND_INS.items():
        path = package / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    # The version the tests name in their skips (importlib.metadata reads this).
    version = _version(sglang_dir)
    for old in out.glob("sglang-*.dist-info"):
        shutil.rmtree(old)
    info = out / f"sglang-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    return package


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit("usage: _sglang_kernel_overlay.py SGLANG_PACKAGE_DIR OUT_DIR")
    print(build(Path(sys.argv[1]), Path(sys.argv[2])))


if __name__ == "__main__":
    main()
