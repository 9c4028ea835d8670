"""kvcompat.transfer's public surface: pinned, documented, with examples on the entry points."""

from __future__ import annotations

import inspect

import kvcompat.transfer

PUBLIC = [
    "BufferSpec",
    "ComponentSpec",
    "CudaIpcPeer",
    "Descriptor",
    "MooncakeEngine",
    "NixlEngine",
    "Operation",
    "PackBatch",
    "PackLayout",
    "PoolSpec",
    "PreparedTransfer",
    "Request",
    "Run",
    "StagingSpec",
    "TransferError",
    "TransferPlan",
    "TransferPlanError",
    "export_cuda_ipc",
    "import_mooncake",
    "import_nixl",
    "merge_pages",
    "plan_transfer",
    "pool_spec",
    "request_pages",
]


def test_all_is_pinned_and_sorted() -> None:
    assert kvcompat.transfer.__all__ == PUBLIC
    assert all(hasattr(kvcompat.transfer, name) for name in PUBLIC)


def test_entry_points_have_examples_and_members_have_docstrings() -> None:
    no_example, no_doc = [], []
    for name in PUBLIC:
        obj = getattr(kvcompat.transfer, name)
        if name == "Operation":
            continue  # a Literal alias, documented where it is defined
        if ">>>" not in (inspect.getdoc(obj) or ""):
            no_example.append(name)
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_"):
                    continue
                routine = inspect.isfunction(member) or isinstance(member, (property, classmethod))
                if routine and not inspect.getdoc(getattr(obj, attr)):
                    no_doc.append(f"{name}.{attr}")
    assert no_example == []
    assert no_doc == []
