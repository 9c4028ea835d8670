"""Direct transfers on one node: the receiver maps the sender's CUDA buffers and pulls.

Where both pools are CUDA memory of one node, no engine and no staging are needed: the
sender exports its pool's storages once as CUDA IPC handles (torch's own, the ones
``torch.multiprocessing`` sends), the receiver opens them, and every batch of a packed
layout moves with one launch that copies the peer's pages straight into its own: each
byte is read and written once, with no staging (a packed transfer moves it three times).
The receiver drives it, so it knows when the pages arrived.
"""

from __future__ import annotations

import os
import pickle
import re
import socket
import weakref
from collections.abc import Mapping
from typing import Any

import torch
from torch.multiprocessing import reductions

from kvcompat._ops import RowMoves
from kvcompat.inspection import PoolManifest
from kvcompat.inspection._static import MISSING, static_attr
from kvcompat.transfer._errors import TransferError, TransferPlanError
from kvcompat.transfer._packed import Packer, layout_of
from kvcompat.transfer._plan import TransferPlan, regions_of
from kvcompat.transfer._spec import PoolSpec, pool_spec

__all__ = ["CudaIpcPeer", "export_cuda_ipc"]

_KIND = "kvcompat.cuda-ipc/1"
_TOKEN = re.compile(r"\.?([A-Za-z_]\w*)|\[(\d+)\]|\['([^']*)'\]")


def _resolve(pool: Any, path: str) -> Any:
    """The object at a manifest path (``kv_pools[4].kv_buffer[0]``), read without getters."""
    for root in (pool, static_attr(pool, "native", None)):
        value: Any = root
        at = 0
        while value is not None and value is not MISSING and at < len(path):
            match = _TOKEN.match(path, at)
            if match is None:
                value = MISSING
                break
            at = match.end()
            name, index, key = match.groups()
            if name is not None:
                fields = getattr(type(value), "_fields", None)
                if fields and name in fields:  # a NamedTuple field
                    value = value[fields.index(name)]
                else:
                    value = static_attr(value, name, MISSING)
            else:
                try:
                    value = value[int(index) if index is not None else key]
                except (LookupError, TypeError):
                    value = MISSING
        if isinstance(value, torch.Tensor):
            return value
    return None


def export_cuda_ipc(pool: Any) -> bytes:
    """Sender side of a direct transfer: the pool's CUDA storages as IPC handles (bytes).

    Send the result to a receiver on the same node, which opens it with
    :class:`CudaIpcPeer`. The pool must stay alive (and this process running) while
    the receiver uses it.

    Raises:
        TransferPlanError: a buffer is not CUDA memory, or cannot be found on ``pool``.

    Example:
        >>> from kvcompat.transfer import export_cuda_ipc
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool
        >>> try:
        ...     export_cuda_ipc(ReferenceMHATokenToKVPool(32, 16))
        ... except ValueError as exc:
        ...     print(str(exc).splitlines()[0][:60])
        direct transfers move CUDA memory; k_buffer[0] (layer 0) of
    """
    reduce_tensor: Any = reductions.reduce_tensor
    spec = pool_spec(pool)
    storages: dict[int, torch.Tensor] = {}
    for buf in spec.buffers:
        if buf.memory[0] != "VRAM":
            msg = (
                f"direct transfers move CUDA memory; {buf.label} of {spec.name} is on "
                f"{buf.device}.\nHint: use method='packed' or 'pages' with an engine."
            )
            raise TransferPlanError(msg)
        tensor = _resolve(pool, buf.path)
        if tensor is None or not tensor.is_cuda:
            msg = (
                f"cannot find the CUDA tensor {buf.path!r} on {spec.name} to export it.\n"
                "Hint: pass the live pool (native or adapter) whose spec the plan used."
            )
            raise TransferPlanError(msg)
        storage = tensor.untyped_storage()
        base = storage.data_ptr()
        if not (base <= buf.ptr and buf.ptr + buf.length <= base + storage.nbytes()):
            msg = f"{buf.label}: its bytes are not inside the storage of {buf.path!r}."
            raise TransferPlanError(msg)
        if base not in storages:
            flat = torch.empty(0, dtype=torch.uint8, device=tensor.device)
            storages[base] = flat.set_(storage)
    handles = [(base, reduce_tensor(flat)) for base, flat in storages.items()]
    facts = {"kind": _KIND, "host": socket.gethostname(), "pid": os.getpid(), "storages": handles}
    return pickle.dumps(facts)


class CudaIpcPeer:
    """Receiver side of a direct transfer: the sender's CUDA storages, mapped here.

    Args:
        exported: what :func:`export_cuda_ipc` returned in the sender process (same
            node; torch opens each storage with CUDA IPC).

    Raises:
        TransferPlanError: not an export, or one from another host.

    Example:
        >>> from kvcompat.transfer import CudaIpcPeer
        >>> try:
        ...     CudaIpcPeer(b"not an export")
        ... except ValueError as exc:
        ...     print(str(exc).splitlines()[0])
        not a kvcompat CUDA IPC export (from export_cuda_ipc).
    """

    def __init__(self, exported: bytes) -> None:
        try:
            facts = pickle.loads(exported)  # noqa: S301 - the peer process of one node, by design
        except Exception:  # noqa: BLE001 - any unpickling failure means "not an export"
            facts = None
        if not isinstance(facts, dict) or facts.get("kind") != _KIND:
            msg = (
                "not a kvcompat CUDA IPC export (from export_cuda_ipc).\nHint: send the bytes "
                "export_cuda_ipc(pool) returned in the sending process, unchanged."
            )
            raise TransferPlanError(msg)
        if facts["host"] != socket.gethostname():
            msg = (
                f"the export comes from host {facts['host']!r}, this is "
                f"{socket.gethostname()!r}: CUDA IPC works within one node.\nHint: use "
                "method='packed' with an engine across nodes."
            )
            raise TransferPlanError(msg)
        self.pid = int(facts["pid"])
        self._mapped: list[tuple[int, torch.Tensor]] = []
        try:
            for base, (rebuild, args) in facts["storages"]:
                self._mapped.append((int(base), rebuild(*args)))
        except Exception as exc:
            msg = f"could not open the sender's CUDA IPC handles: {exc}"
            raise TransferError(msg) from exc
        self._packers: dict[Any, Any] = {}  # views per layout and destination pool

    def _view(self, ptr: int, length: int) -> torch.Tensor:
        for base, flat in self._mapped:
            if base <= ptr and ptr + length <= base + flat.numel():
                return flat[ptr - base : ptr - base + length]
        msg = (
            f"the sender's export has no storage holding {length} B at {ptr:#x}.\nHint: the "
            "plan's source must be the pool the sender exported."
        )
        raise TransferPlanError(msg)

    def pull(self, plan: TransferPlan, pool: Any) -> None:
        """Move ``plan``'s pages from the sender's pool into ``pool`` (this process's).

        ``plan`` is a ``method="direct"`` plan from the sender's spec to ``pool``; each
        batch is one launch copying the mapped pages into ``pool``'s. It returns when
        the pages are in place (the current stream is synchronized).

        Raises:
            TransferPlanError: a plan that is not direct, or whose destination is not
                ``pool``.
        """
        if plan.method != "direct":
            msg = f"pull() takes a method='direct' plan; this one moves {plan.method!r}."
            raise TransferPlanError(msg)
        if isinstance(pool, (PoolSpec, PoolManifest, str, bytes, Mapping)):
            msg = (
                f"pull() writes into a live pool of this process, not a {type(pool).__name__}."
                "\nHint: pass the pool object (native or adapter) the plan's destination is."
            )
            raise TransferPlanError(msg)
        layout = layout_of(plan)
        key = (layout.digest, tuple(pair[1].ptr for pair in plan.pairs), id(pool))
        cached = self._packers.get(key)
        if cached is not None and cached[3]() is not pool:  # another pool at a reused id
            cached = None
        if cached is None:
            regions = [(p, n) for p, n, _ in regions_of(pool_spec(pool).buffers)]
            mine = Packer(plan, 1, regions, "direct pull")
            srcs = [
                [
                    self._view(b.ptr, b.items * b.item_length).view(b.items, b.item_length)
                    for b in (plan.pairs[i][0] for i in batch.pairs)
                ]
                for batch in layout.batches
            ]
            rows = [
                torch.tensor(batch.src_pages, dtype=torch.int64, device=mine.device)
                for batch in layout.batches
            ]
            moves = [
                RowMoves(srcs[index], [mine.views[i] for i in batch.pairs])
                for index, batch in enumerate(layout.batches)
            ]
            # Every batch's rows checked before the first moves (all or nothing); they are
            # the plan's, so later pulls of it reuse them unchecked.
            checked = [
                move.check(rows[index], mine.rows[index]) for index, move in enumerate(moves)
            ]
            cached = (moves, mine, checked, weakref.ref(pool))
            self._packers[key] = cached
        moves, mine, checked, _ = cached
        for move, (take, put) in zip(moves, checked, strict=True):
            move.run(take, put, validate=False)
        if mine.device.startswith("cuda"):
            torch.cuda.current_stream(mine.device).synchronize()

    def close(self) -> None:
        """Forget the mapped storages (torch closes the IPC mappings with them)."""
        self._mapped.clear()
        self._packers.clear()
