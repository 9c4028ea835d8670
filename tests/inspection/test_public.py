"""The inspection package's public surface is pinned and every public object has an example."""

from __future__ import annotations

import inspect

import kvcompat.inspection
from kvcompat.inspection import _cli

PUBLIC = [
    "ComponentMemory",
    "MemoryReport",
    "PoolManifest",
    "Role",
    "StorageBlock",
    "TensorManifest",
    "TransferDescriptor",
    "TransferGroup",
    "TransferRegion",
    "as_buf_infos",
    "describe",
    "memory_report",
    "transfer_descriptors",
]


def test_all_is_pinned_and_sorted() -> None:
    assert kvcompat.inspection.__all__ == PUBLIC
    assert sorted(PUBLIC) == PUBLIC
    assert all(hasattr(kvcompat.inspection, name) for name in PUBLIC)


def _public_callables() -> list[tuple[str, object]]:
    found: list[tuple[str, object]] = []
    for module, names in ((kvcompat.inspection, PUBLIC), (_cli, _cli.__all__)):
        for name in names:
            obj = getattr(module, name)
            found.append((f"{module.__name__}.{name}", obj))
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if attr.startswith("_"):
                        continue
                    if inspect.isfunction(member) or isinstance(member, property):
                        found.append((f"{module.__name__}.{name}.{attr}", member))
    return found


def test_every_public_object_has_an_example() -> None:
    missing = [
        name
        for name, obj in _public_callables()
        if "Example:" not in (inspect.getdoc(obj) or "") or ">>>" not in (inspect.getdoc(obj) or "")
    ]
    assert not missing, f"no Example: section with a doctest: {missing}"
