"""Import stub for ``torchvision.transforms.v2`` (test-only; see ``_stub.py``)."""

from torchvision._stub import STUB_VERSION, InterpolationMode, make_module_getattr

__all__ = ["InterpolationMode"]

__version__ = STUB_VERSION

__getattr__ = make_module_getattr(__name__)
