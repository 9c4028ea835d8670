"""Move KV between pools with a real transfer engine (prefill → decode, offload, export).

Three steps, each usable alone:

1. :func:`pool_spec` — a pool's registered buffers and configuration,
   serialisable as JSON for the peer process.
2. :func:`plan_transfer` — pair a source and a destination pool (live or from a
   spec), refuse mismatches, and list coalesced per-page descriptors for both
   sides; :func:`request_pages` gives the page ids SGLang's PD path sends per
   component.
3. An engine binding — :class:`NixlEngine` (NIXL) or :class:`MooncakeEngine`
   (Mooncake Transfer Engine) — registers, exchanges metadata, prepares a plan
   once and runs it with a bounded wait. Engines are optional dependencies,
   imported only when an engine is created.

Example:
    >>> from kvcompat.transfer import plan_transfer, pool_spec
    >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
    >>> prefill = ReferenceDeepSeekV4SingleKVPool(size=256, page_size=64, layer_num=2)
    >>> decode = ReferenceDeepSeekV4SingleKVPool(size=512, page_size=64, layer_num=2)
    >>> remote = pool_spec(decode).to_json()  # what the decode process sends
    >>> plan = plan_transfer(prefill, remote, pages={"kv": [0, 1]}, dst_pages={"kv": [5, 6]})
    >>> facts = plan.summary()
    >>> facts["pages"], facts["descriptors"], facts["bytes"]  # 2 layers x 2 pages, merged per layer
    (4, 2, 149760)
"""

from __future__ import annotations

from kvcompat.transfer._direct import CudaIpcPeer, export_cuda_ipc
from kvcompat.transfer._engine import Operation, PreparedTransfer
from kvcompat.transfer._errors import TransferError, TransferPlanError
from kvcompat.transfer._layout import PackBatch, PackLayout, StagingSpec
from kvcompat.transfer._mooncake import MooncakeEngine, import_mooncake
from kvcompat.transfer._nixl import NixlEngine, import_nixl
from kvcompat.transfer._plan import (
    Descriptor,
    Request,
    Run,
    TransferPlan,
    merge_pages,
    plan_transfer,
    request_pages,
)
from kvcompat.transfer._spec import BufferSpec, ComponentSpec, PoolSpec, pool_spec

__all__ = [
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
