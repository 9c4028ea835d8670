"""Inspection for profilers and transfer tools: manifests, memory, transfer descriptors.

Everything here reads attributes only — it never calls a native getter, so it
never waits on a layer transfer, allocates a dequantized copy or joins a
collective (see the "guard profiler" page) — and it never imports sglang or
triton.

* :func:`describe` — the manifest tree of a pool and every part it owns.
* :func:`memory_report` — bytes per component, role, layer and device, each
  allocation counted once.
* :func:`transfer_descriptors` — ``(ptr, length, item_length)`` per buffer,
  in SGLang's registration order; :func:`as_buf_infos` turns them into
  SGLang's ``(data_ptrs, data_lens, item_lens)`` triple.

Example:
    >>> from kvcompat.inspection import describe, memory_report, transfer_descriptors
    >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
    >>> native = ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64, layer_num=2)
    >>> describe(native).layout, memory_report(native).total_bytes
    ('v4', 149760)
    >>> [(d.path, d.item_length) for d in transfer_descriptors(native)]
    [('kv_buffer[0]', 37440), ('kv_buffer[1]', 37440)]
"""

from __future__ import annotations

from kvcompat.inspection._descriptors import TransferDescriptor, as_buf_infos, transfer_descriptors
from kvcompat.inspection._manifest import describe
from kvcompat.inspection._memory import ComponentMemory, MemoryReport, StorageBlock, memory_report
from kvcompat.inspection._model import (
    PoolManifest,
    Role,
    TensorManifest,
    TransferGroup,
    TransferRegion,
)

__all__ = [
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
