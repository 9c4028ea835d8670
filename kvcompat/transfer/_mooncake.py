"""Mooncake Transfer Engine binding: move a :class:`~kvcompat.transfer.TransferPlan` (TCP, RDMA).

Mooncake is an optional dependency (``pip install
mooncake-transfer-engine-non-cuda==0.3.13.post1`` on CPU; its library links
``libibverbs.so.1`` even without an RDMA device: ``apt-get install
libibverbs1``). It is imported when an engine is created, never by
``import kvcompat``. Peers find each other with ``P2PHANDSHAKE`` (no metadata
server): the "metadata" is the session id ``"host:port"``. Note that the engine
listens on every interface, whatever ``hostname`` says.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from kvcompat.transfer._engine import (
    EngineBase,
    PreparedTransfer,
    check_op,
    chunk_ranges,
    transfer_error,
)
from kvcompat.transfer._errors import TransferError, TransferPlanError
from kvcompat.transfer._layout import StagingSpec
from kvcompat.transfer._packed import (
    StagingAreas,
    check_engine_plan,
    packed_run,
    receive_area,
    receive_packed,
    send_packed,
    staging_spec,
)
from kvcompat.transfer._plan import TransferPlan, regions_of
from kvcompat.transfer._spec import pool_spec

__all__ = ["MooncakeEngine", "import_mooncake"]


def import_mooncake() -> ModuleType:
    """``mooncake.engine``, or an ImportError that says what to install.

    Example:
        >>> from kvcompat.transfer import import_mooncake
        >>> import_mooncake.__name__
        'import_mooncake'
    """
    try:
        return importlib.import_module("mooncake.engine")
    except ImportError as exc:
        lib = "libibverbs" in str(exc)
        msg = f"kvcompat.transfer.MooncakeEngine needs the Mooncake Transfer Engine: {exc}.\n" + (
            "Hint: its library links libibverbs even without RDMA: apt-get install -y libibverbs1."
            if lib
            else "Hint: pip install mooncake-transfer-engine-non-cuda==0.3.13.post1 (CPU) "
            "or mooncake-transfer-engine (CUDA)."
        )
        raise ImportError(msg) from exc


class MooncakeEngine(EngineBase):
    """One Mooncake ``TransferEngine``: register pools, prepare plans, batch-write or -read.

    Args:
        hostname: this process's address (``"127.0.0.1"`` for loopback).
        protocol: ``"tcp"`` (everywhere) or ``"rdma"`` (needs RDMA NICs).
        device_name: RDMA device filter (``""``: all).

    Example:
        >>> from kvcompat.transfer import MooncakeEngine
        >>> [m for m in ("register", "metadata", "connect", "prepare", "transfer", "close")
        ...  if not hasattr(MooncakeEngine, m)]
        []
    """

    engine = "Mooncake"

    def __init__(
        self, hostname: str = "127.0.0.1", *, protocol: str = "tcp", device_name: str = ""
    ) -> None:
        module = import_mooncake()
        self._engine = module.TransferEngine()
        code = self._engine.initialize(hostname, "P2PHANDSHAKE", protocol, device_name)
        if code != 0:
            msg = (
                f"Mooncake TransferEngine.initialize({hostname!r}, 'P2PHANDSHAKE', "
                f"{protocol!r}) returned {code}."
            )
            raise TransferError(msg)
        self.hostname = hostname
        self.session_id = f"{hostname}:{int(self._engine.get_rpc_port())}"
        self.name = self.session_id
        self._regions: list[tuple[int, int, int]] = []
        self._prepared: list[PreparedTransfer] = []
        self._staging = StagingAreas(self._register_area, self._deregister_area)
        self._unpackers: dict[Any, Any] = {}  # receive(): views per layout, made once
        self._closed = False

    def register(self, pool: Any) -> list[tuple[int, int, int]]:
        """Register every transferable buffer of ``pool`` (a pool of this process); idempotent.

        Returns:
            The newly registered ``(address, length, device_id)`` regions.
        """
        self._check_open()
        spec = pool_spec(pool)
        regions = [r for r in regions_of(spec.buffers) if r not in self._regions]
        if not regions:
            return []
        addresses, lengths = [r[0] for r in regions], [r[1] for r in regions]
        code = self._engine.batch_register_memory(addresses, lengths)
        if code != 0:
            what = f"{len(regions)} region(s) of {spec.name}"
            msg = f"Mooncake could not register {what}: code {code}."
            raise TransferError(msg)
        self._regions.extend(regions)
        return regions

    def metadata(self) -> bytes:
        """The session id (``b"host:port"``) the peer passes to :meth:`connect`."""
        self._check_open()
        return self.session_id.encode()

    def connect(self, metadata: bytes) -> str:
        """The peer's session id from its :meth:`metadata` (the handshake happens on first use)."""
        self._check_open()
        return metadata.decode() if isinstance(metadata, bytes) else str(metadata)

    def staging(self, nbytes: int, *, device: str = "cpu") -> StagingSpec:
        """The receive staging area of ``device`` (at least ``nbytes``), registered once.

        As :meth:`NixlEngine.staging <kvcompat.transfer.NixlEngine.staging>`; send its
        ``to_json()`` to the sender, which passes it to :meth:`prepare` (``staging=``).
        """
        self._check_open()
        return staging_spec(self._staging.area("receive", device, nbytes))

    def _register_area(self, tensor: Any) -> Any:
        region = (tensor.data_ptr(), tensor.numel(), 0)
        code = self._engine.batch_register_memory([region[0]], [region[1]])
        if code != 0:
            msg = f"Mooncake could not register a {region[1]} B staging area: code {code}."
            raise TransferError(msg)
        self._regions.append(region)
        return region

    def _deregister_area(self, region: Any) -> None:
        if region in self._regions:
            self._regions.remove(region)
            self._engine.batch_unregister_memory([region[0]])

    def _spans(self) -> list[tuple[int, int]]:
        return [(ptr, length) for ptr, length, _dev in self._regions]

    def prepare(
        self,
        plan: TransferPlan,
        peer: str,
        *,
        op: str = "WRITE",
        chunks: int = 1,
        max_batch: int = 512,
        staging: StagingSpec | str | bytes | Mapping[str, Any] | None = None,
        chunk_bytes: int | None = None,
    ) -> PreparedTransfer:
        """Split the plan's address lists into ``chunks`` batches once; reuse them.

        Args:
            plan: from :func:`~kvcompat.transfer.plan_transfer`.
            peer: the session id :meth:`connect` returned.
            op: ``"WRITE"`` (this process holds ``plan.src``) or ``"READ"`` (``plan.dst``).
            chunks: batches; a failure then loses only the batches that did not complete.
            max_batch: at most this many descriptors per batch (more batches when the
                plan has more): over TCP, one batch of 4,096 descriptors overflows the
                engine's lane queue ("queue-full rejection") and fails as a whole.
            staging: a packed plan only: the receiver's :meth:`staging` spec (or its JSON).
            chunk_bytes: a packed plan only: bytes per staging chunk (default 16 MiB).
        """
        self._check_open()
        operation = check_op(op)
        check_engine_plan(plan, self.engine)
        if "VRAM" in (plan.src_mem, plan.dst_mem):
            msg = (
                "MooncakeEngine over the non-CUDA wheel moves host memory only; this plan "
                f"moves {plan.src_mem} to {plan.dst_mem}.\nHint: use NixlEngine for GPU memory."
            )
            raise TransferError(msg)
        if plan.method == "packed":
            if operation != "WRITE":
                msg = "a packed plan is pushed by its sender (op='WRITE'); READ needs 'pages'."
                raise TransferPlanError(msg)
            run = packed_run(
                plan,
                staging,
                chunk_bytes,
                self._spans(),
                lambda device, n: self._staging.area("send", device, n),
                engine=self.engine,
            )
            ranges = tuple(range(i, i + 1) for i in range(len(run.sizes)))
            packed = PreparedTransfer(plan, peer, "WRITE", ranges, packed=run)
            self._prepared.append(packed)
            return packed
        pushing = operation == "WRITE"
        local = [d.src if pushing else d.dst for d in plan.descriptors]
        remote = [d.dst if pushing else d.src for d in plan.descriptors]
        lengths = [d.length for d in plan.descriptors]
        if max_batch < 1:
            msg = f"max_batch must be a positive int, got {max_batch!r}."
            raise TransferError(msg)
        batches = max(chunks, -(-len(local) // max_batch))
        prepared = PreparedTransfer(plan, peer, operation, chunk_ranges(len(local), batches))
        for part in prepared.chunks:
            prepared.handles.append(
                (
                    local[part.start : part.stop],
                    remote[part.start : part.stop],
                    lengths[part.start : part.stop],
                )
            )
        self._prepared.append(prepared)
        return prepared

    def transfer(self, prepared: PreparedTransfer, *, timeout: float = 30.0) -> None:
        """Run a prepared transfer, batch by batch, synchronously.

        Each batch is one ``batch_transfer_sync_write`` (or ``_read``), which the
        engine itself bounds by its own transport timeouts; between batches the
        ``timeout`` (seconds) is checked.

        Raises:
            TransferError: a batch failed or the time ran out; it names the pages
                that arrived and those that did not.
        """
        self._check_open()
        if prepared.released:
            msg = "this prepared transfer was released; prepare() the plan again."
            raise TransferError(msg)
        run = (
            self._engine.batch_transfer_sync_write
            if prepared.op == "WRITE"
            else self._engine.batch_transfer_sync_read
        )
        if prepared.packed is not None:
            run = prepared.packed

            def post(chunk: int, slot: int) -> str:
                local = [run.slots[slot].data_ptr()]
                remote = [run.remote.ptr + run.offsets[chunk]]
                code = self._engine.batch_transfer_sync_write(
                    prepared.peer, local, remote, [run.sizes[chunk]]
                )
                return "DONE" if code == 0 else "ERR"

            send_packed(
                prepared.plan,
                run,
                post,
                lambda _chunk: "DONE",
                timeout=timeout,
                engine=self.engine,
                peer=prepared.peer,
            )
            prepared.runs += 1
            return
        deadline = time.monotonic() + timeout
        done: list[int] = []
        for chunk, (local, remote, lengths) in enumerate(prepared.handles):
            if time.monotonic() > deadline:
                reason = f"timed out after {timeout:g} s"
                raise transfer_error(prepared, done, reason, engine=self.engine)
            code = run(prepared.peer, local, remote, lengths)
            if code != 0:
                reason = f"batch {chunk} returned {code}"
                raise transfer_error(prepared, done, reason, engine=self.engine)
            done.append(chunk)
        prepared.runs += 1

    def receive(self, plan: TransferPlan, *, commit: bytes) -> str:
        """Receiving side of a packed plan: check the sender's commit, then scatter.

        Mooncake has no notifications: the sender's :meth:`transfer` leaves the commit
        in ``prepared.packed.commit``; send it here over your own channel, after the
        sender's transfer returned. The sender must not run another packed transfer
        into this staging area before this returns.

        Returns:
            The run id of the commit.

        Raises:
            TransferError: a commit for another layout; the pool is unchanged.
        """
        self._check_open()
        staging = receive_area(plan, self._staging)
        return receive_packed(
            plan, self._spans(), staging, commit, engine=self.engine, cache=self._unpackers
        )

    def release(self, prepared: PreparedTransfer) -> None:
        """Forget a prepared transfer (idempotent)."""
        prepared.released = True
        prepared.handles.clear()
        if prepared in self._prepared:
            self._prepared.remove(prepared)

    def close(self) -> None:
        """Release prepared transfers and deregister memory (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for prepared in list(self._prepared):
            self.release(prepared)
        self._staging.close()
        self._unpackers.clear()
        if self._regions:
            self._engine.batch_unregister_memory([r[0] for r in self._regions])
            self._regions.clear()
        self._engine = None  # the last reference: the engine's threads and sockets end

    def _name(self) -> str:
        return str(self.session_id)

    def __enter__(self) -> MooncakeEngine:
        return self

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._regions)} regions"
        return f"MooncakeEngine({self.session_id!r}, {state})"
