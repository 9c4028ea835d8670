"""Print, as one JSON object, where the importable SGLang keeps each entry of ``_sglang.places``.

Run as a script by ``tests/layouts/test_kernel_overlay.py``, once over the installed
release and once over the kernel-only tree built from it (``--as-gpu``: ``torch.cuda``
reports a device, so the import branches a GPU machine takes are the ones walked). Each
entry maps to the place (``module.name``) that :func:`_sglang.features.sglang_code`
resolves, or to ``"lacks"`` when the release has none of them. Any other import failure is
printed, with its traceback, and the exit status is 1.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[3]
for _path in (_ROOT, _ROOT / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
if str(Path(__file__).resolve().parent) in sys.path:  # only ever import _oracle.<name>
    sys.path.remove(str(Path(__file__).resolve().parent))

from _sglang import places  # noqa: E402 - after the path set-up above
from _sglang.env import install_torchvision_stub  # noqa: E402
from _sglang.features import ReleaseLacks, sglang_place  # noqa: E402


def _where(wanted: places.Places) -> str:
    try:
        return ".".join(sglang_place(*wanted))
    except ReleaseLacks:
        return "lacks"
    except Exception:  # a stand-in or a module the tree misses: the point of the test
        traceback.print_exc()
        return "error"


def main(argv: list[str]) -> int:
    if "--as-gpu" in argv:
        import torch

        torch.cuda.is_available = lambda: True  # type: ignore[assignment]
    else:
        install_torchvision_stub()
    resolved: dict[str, str] = {}
    for name, wanted in sorted(places.every().items()):
        resolved[name] = _where(wanted)
    status = int(any(where == "error" for where in resolved.values()))
    print(json.dumps(resolved, sort_keys=True))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
