"""Import stub for ``torchvision.transforms.functional`` (test-only; see ``_stub.py``)."""

from torchvision._stub import STUB_VERSION, InterpolationMode, make_module_getattr

__all__ = ["InterpolationMode"]

__version__ = STUB_VERSION

__getattr__ = make_module_getattr(__name__)
