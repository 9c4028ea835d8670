"""Compare kvcompat.layouts with the installed SGLang release's own layout code, on CPU.

The checks live in one oracle module per layout module (``_oracle/<module>.py``,
discovered by the ``_oracle`` package); this script runs them. Run it in a fresh process
with ``TRITON_INTERPRET=1`` (set before triton is imported) and SGLang's caches pointed
at a temporary folder; ``test_layouts_oracles.py`` does that. Each check prints one
JSON line ``{"check", "status", "detail"}`` with status ``pass``, ``fail`` or ``skip``;
the exit code is 0 unless the script itself breaks. Each check finds its SGLang code where
the installed release keeps it (``_sglang.places``); code a release does not have is a
``skip`` whose detail starts with "release lacks:".
Importing this module (or the ``_oracle`` package, to read ``CHECKS``) imports neither
sglang nor triton.

What is compared byte for byte, and what cannot be (see also docs/layouts/oracles.md):

* Pure-torch SGLang code is compared exactly: the V4.1 reference quantizers and
  dequantizers (``dsv41_kv_quant_reference``, non-finite inputs included), the V4 torch
  reader (``k_cache_reference``; it flushes scale byte 0 to zero where the kernel uses
  ``2**-127``), ``DeepSeekV4UniformFP8KVPool.set_key_buffer_fused``, and the MHA and MLA
  pools' ``set_kv_buffer`` / ``set_mla_kv_buffer`` writes.
* Triton kernels run under the CPU interpreter, which differs from a GPU in three known
  ways: it rounds fp32 -> fp8 half away from zero instead of to even, it converts fp32 ->
  bf16 by truncation and mishandles fp32 subnormal inputs there, and it decodes the e4m3
  NaN codes 0x7F/0xFF as +-480. So: stores that only move bytes (``SetKAndS``) compare
  exactly; quantizing stores compare their scales exactly and their codes against the
  interpreter's own rounding of kvcompat's fp32 pre-rounding values (and kvcompat's
  codes against true round-to-nearest-even of the same values); readers compare exactly
  wherever none of those three cases applies, and the excluded positions are counted.
* Not runnable on CPU: the CUDA JIT stores (V4 ``fused_store_flashmla_cache`` and the
  V4.1 ``store_row_fp8`` / ``store_row_fp4``), which need nvcc and a GPU; their math is
  covered by the torch references and the HIP Triton store above.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: make the repository and the tests importable
    _ROOT = Path(__file__).resolve().parents[3]
    for _path in (_ROOT, _ROOT / "tests", _ROOT / "tests" / "layouts"):
        if str(_path) not in sys.path:
            sys.path.insert(0, str(_path))
    sys.path.remove(str(Path(__file__).resolve().parent))  # only ever import _oracle.<name>

from _sglang.env import install_torchvision_stub
from _sglang.features import ReleaseLacks

from _oracle import CHECKS

__all__ = ["CHECKS", "main"]


def main(argv: list[str]) -> int:
    names = argv or list(CHECKS)
    install_torchvision_stub()
    for name in names:
        try:
            status, detail = CHECKS[name]()
        except ReleaseLacks as exc:  # a class or parameter the installed release lacks
            status, detail = "skip", str(exc)
        except ModuleNotFoundError as exc:
            if (exc.name or "").startswith("sglang."):  # an older release: not there yet
                status, detail = "skip", str(ReleaseLacks(f"module {exc.name}"))
            else:
                status, detail = "skip", f"{exc}"
        except Exception:
            status, detail = "fail", traceback.format_exc(limit=8)
        record: dict[str, Any] = {"check": name, "status": status, "detail": detail}
        print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
