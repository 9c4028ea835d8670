"""NIXL binding: move a :class:`~kvcompat.transfer.TransferPlan` with an NVIDIA NIXL agent.

NIXL is an optional dependency (``pip install nixl-cu12==1.5.1`` on CPU or
CUDA 12, ``nixl-cu13`` on CUDA 13 — not the ``nixl`` meta-package, which pulls
both); it is imported when an engine is created, never by ``import kvcompat``.
On one host UCX moves DRAM with ``cma`` and VRAM with ``cuda_ipc``; set
``UCX_NET_DEVICES=lo`` to keep a test on loopback.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

from kvcompat.transfer._engine import (
    EngineBase,
    PreparedTransfer,
    check_op,
    chunk_ranges,
    poll_until,
    transfer_error,
)
from kvcompat.transfer._errors import TransferError, TransferPlanError
from kvcompat.transfer._layout import StagingSpec
from kvcompat.transfer._packed import (
    ACK_PREFIX,
    COMMIT_PREFIX,
    StagingAreas,
    ack_message,
    check_engine_plan,
    packed_error,
    packed_run,
    receive_area,
    receive_packed,
    run_of,
    send_packed,
    staging_spec,
)
from kvcompat.transfer._plan import TransferPlan, regions_of
from kvcompat.transfer._spec import pool_spec

__all__ = ["NixlEngine", "import_nixl"]

_MODULES = ("nixl_cu12", "nixl_cu13", "nixl")


def import_nixl() -> ModuleType:
    """The installed NIXL Python module (``nixl_cu12``, ``nixl_cu13`` or ``nixl``).

    Raises:
        ImportError: none is installed; the message names the pip line.

    Example:
        >>> from kvcompat.transfer import import_nixl
        >>> import_nixl.__name__
        'import_nixl'
    """
    errors = []
    for name in _MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
            continue
        if hasattr(module, "nixl_agent"):
            return module
        errors.append(f"{name}: has no nixl_agent")
    msg = (
        "kvcompat.transfer.NixlEngine needs NIXL, which is not importable here ("
        + "; ".join(errors)
        + ").\nHint: pip install nixl-cu12==1.5.1 (CPU or CUDA 12) or nixl-cu13==1.5.1 "
        "(CUDA 13) after installing torch; not the 'nixl' meta-package, which pulls both."
    )
    raise ImportError(msg)


def _np() -> Any:
    return importlib.import_module("numpy")


class NixlEngine(EngineBase):
    """One NIXL agent: register pools, exchange metadata, prepare plans once, transfer, release.

    Args:
        name: the agent's name, unique among the peers.
        backends: NIXL backends to create (``("UCX",)``).
        backend_params: initialization parameters per backend, passed to NIXL's
            ``create_backend`` as strings, e.g. ``{"UCX": {"num_threads": "4"}}`` (UCX
            then posts a request's descriptors from a pool of 4 threads; NIXL lists a
            plugin's parameters with ``nixl_agent.get_plugin_params``).
        progress_thread: run NIXL's progress thread (the default). The thread polls
            the UCX worker without pause (about half a core while the agent lives)
            and contends with the caller's own polling. An agent that only
            *initiates* (the side calling :meth:`transfer`) may pass False: its worker
            then progresses inside :meth:`transfer` and :meth:`notifications`. Measured:
            medians of 8 MiB DRAM transfers 1.6-5 times higher on a 2-core host, and
            VRAM transfers on an H200 from 54-100 % to 92-134 % of an in-process copy
            of the same ranges (``docs/transfer.md``). A *passive* peer (one that only
            registers memory and waits) needs its thread: without it nobody answers
            the initiator's connection and the transfer times out.

    Example:
        >>> from kvcompat.transfer import NixlEngine
        >>> [m for m in ("register", "metadata", "connect", "prepare", "transfer", "close")
        ...  if not hasattr(NixlEngine, m)]
        []

    A whole round trip, two agents in one process (``examples/pd_transfer.py`` does
    it across two processes)::

        src, dst = NixlEngine("a"), NixlEngine("b")
        src.register(pool_a); dst.register(pool_b)
        peer = src.connect(dst.metadata()); dst.connect(src.metadata())
        prepared = src.prepare(plan_transfer(pool_a, pool_b, pages=...), peer)
        src.transfer(prepared, timeout=10.0)
        src.close(); dst.close()
    """

    engine = "NIXL"

    def __init__(
        self,
        name: str,
        *,
        backends: Iterable[str] = ("UCX",),
        progress_thread: bool = True,
        backend_params: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self._nixl = import_nixl()
        names = list(backends)
        params = {
            k: {str(a): str(b) for a, b in v.items()} for k, v in (backend_params or {}).items()
        }
        unknown = sorted(set(params) - set(names))
        if unknown:
            msg = (
                f"backend_params names backends {unknown} that are not in backends={names}.\n"
                "Hint: key backend_params by the backend's name, e.g. "
                "{'UCX': {'num_threads': '4'}}."
            )
            raise TransferPlanError(msg)
        config = self._nixl.nixl_agent_config(enable_prog_thread=bool(progress_thread), backends=[])
        try:
            self._agent = self._nixl.nixl_agent(name, config)
            for backend in names:
                self._agent.create_backend(backend, params.get(backend, {}))
        except Exception as exc:
            msg = f"could not create the NIXL agent {name!r}: {exc}"
            raise TransferError(msg) from exc
        self.name = name
        self.progress_thread = bool(progress_thread)
        self._registered: list[Any] = []
        self._regions: set[tuple[str, int, int, int]] = set()
        self._peers: list[str] = []
        self._prepared: list[PreparedTransfer] = []
        self._staging = StagingAreas(self._register_area, self._deregister_area)
        self._unpackers: dict[Any, Any] = {}  # receive(): views per layout, made once
        self._backlog: dict[str, list[bytes]] = {}
        self._commits: list[tuple[str, bytes]] = []
        self._acks: set[str] = set()
        self._unacked: dict[tuple[str, int], str] = {}
        self._closed = False

    # -- set-up --------------------------------------------------------------------------

    def register(self, pool: Any) -> list[tuple[int, int, int]]:
        """Register every transferable buffer of ``pool`` (merged into regions); idempotent.

        ``pool`` is anything :func:`~kvcompat.transfer.pool_spec` takes, but it must
        live in this process. Register before :meth:`metadata` is sent, so the peer
        sees the regions.

        Returns:
            The newly registered ``(address, length, device_id)`` regions.
        """
        self._check_open()
        spec = pool_spec(pool)
        added = []
        for mem in ("DRAM", "VRAM"):
            regions = [
                r
                for r in regions_of(b for b in spec.buffers if b.memory[0] == mem)
                if (mem, *r) not in self._regions
            ]
            if not regions:
                continue
            try:
                descs = self._agent.register_memory([(*r, "") for r in regions], mem)
            except Exception as exc:
                what = f"{len(regions)} {mem} region(s) of {spec.name}"
                msg = f"NIXL could not register {what}: {exc}"
                raise TransferError(msg) from exc
            self._registered.append(descs)
            self._regions.update((mem, *r) for r in regions)
            added.extend(regions)
        return added

    def metadata(self) -> bytes:
        """This agent's metadata, to send to the peer (with the registered regions)."""
        self._check_open()
        return bytes(self._agent.get_agent_metadata())

    def connect(self, metadata: bytes) -> str:
        """Load a peer's :meth:`metadata`; returns the peer's name for :meth:`prepare`."""
        self._check_open()
        try:
            peer = self._agent.add_remote_agent(metadata)
        except Exception as exc:
            msg = f"NIXL could not load the peer's metadata: {exc}"
            raise TransferError(msg) from exc
        name = peer.decode() if isinstance(peer, bytes) else str(peer)
        self._peers.append(name)
        return name

    def staging(self, nbytes: int, *, device: str = "cpu") -> StagingSpec:
        """The receive staging area of ``device`` (at least ``nbytes``), registered once.

        The receiving side of a packed plan calls it and sends the result's
        ``to_json()`` to the sender, which passes it to :meth:`prepare`
        (``staging=``). The area is reused by every later packed transfer and grows
        (a new registration) when a request needs more. Make it before sending
        :meth:`metadata`, so the peer's view of this agent includes it.
        """
        self._check_open()
        return staging_spec(self._staging.area("receive", device, nbytes))

    def _register_area(self, tensor: Any) -> Any:
        mem = "VRAM" if tensor.device.type == "cuda" else "DRAM"
        device = tensor.device.index or 0
        region = (tensor.data_ptr(), tensor.numel(), device)
        try:
            descs = self._agent.register_memory([(*region, "")], mem)
        except Exception as exc:
            msg = f"NIXL could not register a {tensor.numel()} B {mem} staging area: {exc}"
            raise TransferError(msg) from exc
        self._regions.add((mem, *region))
        return (descs, (mem, *region))

    def _deregister_area(self, handle: Any) -> None:
        descs, region = handle
        self._regions.discard(region)
        with contextlib.suppress(Exception):  # best effort: the agent may be closing
            self._agent.deregister_memory(descs)

    def _spans(self) -> list[tuple[int, int]]:
        return [(ptr, length) for _mem, ptr, length, _dev in self._regions]

    # -- transfers -----------------------------------------------------------------------

    def prepare(
        self,
        plan: TransferPlan,
        peer: str,
        *,
        op: str = "WRITE",
        chunks: int = 1,
        staging: StagingSpec | str | bytes | Mapping[str, Any] | None = None,
        chunk_bytes: int | None = None,
    ) -> PreparedTransfer:
        """Prepare both descriptor lists and ``chunks`` transfer requests once; reuse them.

        Args:
            plan: from :func:`~kvcompat.transfer.plan_transfer`.
            peer: the name :meth:`connect` returned.
            op: ``"WRITE"`` when this process holds ``plan.src`` (push), ``"READ"``
                when it holds ``plan.dst`` (pull). A packed plan is always pushed.
            chunks: engine requests to split the descriptors into; a failure then
                loses only the chunks that did not complete (a per-page plan).
            staging: a packed plan only: the receiver's :meth:`staging` spec (or its
                JSON).
            chunk_bytes: a packed plan only: bytes per staging chunk (default 16 MiB);
                packing chunk *i + 1* overlaps moving chunk *i*.

        Raises:
            TransferError: NIXL refused the lists (a region not registered, an
                unknown peer); nothing moved.
            TransferPlanError: a packed plan without the receiver's staging area, or
                one too small for it.
        """
        self._check_open()
        operation = check_op(op)
        check_engine_plan(plan, self.engine)
        if plan.method == "packed":
            return self._prepare_packed(plan, peer, operation, staging, chunk_bytes)
        np = _np()
        pushing = operation == "WRITE"
        local = plan.src_descs() if pushing else plan.dst_descs()
        remote = plan.dst_descs() if pushing else plan.src_descs()
        local_mem = plan.src_mem if pushing else plan.dst_mem
        remote_mem = plan.dst_mem if pushing else plan.src_mem
        prepared = PreparedTransfer(plan, peer, operation, chunk_ranges(len(local), chunks))
        try:
            mine = self._agent.prep_xfer_dlist(
                "NIXL_INIT_AGENT", np.array(local, dtype=np.uint64).reshape(-1, 3), local_mem
            )
            prepared.lists.append(mine)
            theirs = self._agent.prep_xfer_dlist(
                peer, np.array(remote, dtype=np.uint64).reshape(-1, 3), remote_mem
            )
            prepared.lists.append(theirs)
            for part in prepared.chunks:
                index = np.arange(part.start, part.stop, dtype=np.int32)
                prepared.handles.append(
                    self._agent.make_prepped_xfer(operation, mine, index, theirs, index)
                )
        except Exception as exc:
            self.release(prepared)
            msg = (
                f"NIXL could not prepare {len(local)} descriptors towards {peer!r}: {exc}\n"
                "Hint: both sides must register() their pool before exchanging metadata(), "
                "and connect() must have loaded the peer's metadata."
            )
            raise TransferError(msg) from exc
        self._prepared.append(prepared)
        return prepared

    def _prepare_packed(
        self,
        plan: TransferPlan,
        peer: str,
        op: str,
        staging: StagingSpec | str | bytes | Mapping[str, Any] | None,
        chunk_bytes: int | None,
    ) -> PreparedTransfer:
        if op != "WRITE":
            msg = (
                "a packed plan is pushed by its sender (op='WRITE'): the receiver cannot "
                "pull pages the sender has not packed.\nHint: prepare it on the source side, "
                "or plan with method='pages' to READ."
            )
            raise TransferPlanError(msg)
        run = packed_run(
            plan,
            staging,
            chunk_bytes,
            self._spans(),
            lambda device, n: self._staging.area("send", device, n),
            engine=self.engine,
        )
        np = _np()
        width = run.slots[0].numel()
        device = run.slots[0].device.index or 0
        mem = plan.src_mem
        local = [(run.slots[i % 2].data_ptr(), n, device) for i, n in enumerate(run.sizes)]
        remote_dev = run.remote.memory[1]
        remote = [
            (run.remote.ptr + off, n, remote_dev)
            for off, n in zip(run.offsets, run.sizes, strict=True)
        ]
        prepared = PreparedTransfer(
            plan, peer, "WRITE", tuple(range(i, i + 1) for i in range(len(run.sizes))), packed=run
        )
        try:
            mine = self._agent.prep_xfer_dlist(
                "NIXL_INIT_AGENT", np.array(local, dtype=np.uint64).reshape(-1, 3), mem
            )
            prepared.lists.append(mine)
            theirs = self._agent.prep_xfer_dlist(
                peer, np.array(remote, dtype=np.uint64).reshape(-1, 3), run.remote.memory[0]
            )
            prepared.lists.append(theirs)
            for chunk in range(len(run.sizes)):
                index = np.array([chunk], dtype=np.int32)
                prepared.handles.append(
                    self._agent.make_prepped_xfer("WRITE", mine, index, theirs, index)
                )
        except Exception as exc:
            self.release(prepared)
            msg = (
                f"NIXL could not prepare {len(local)} packed chunks of up to {width} B towards "
                f"{peer!r}: {exc}\nHint: the receiver must make its staging area "
                "(engine.staging) before sending metadata(), and connect() must have loaded it."
            )
            raise TransferError(msg) from exc
        self._prepared.append(prepared)
        return prepared

    def _transfer_packed(self, prepared: PreparedTransfer, timeout: float, notify: bytes) -> None:
        run, peer, handles = prepared.packed, prepared.peer, prepared.handles
        key = (peer, run.remote.ptr)
        previous = self._unacked.get(key)
        if previous is not None:  # the receiver may still be scattering the last request
            deadline = time.monotonic() + timeout
            while previous not in self._acks:  # bounded by the deadline
                self._drain()
                if previous in self._acks:
                    break
                if time.monotonic() > deadline:
                    why = (
                        f"the receiver did not acknowledge the previous packed transfer (run "
                        f"{previous}) into this staging area within {timeout:g} s, so it may "
                        "still be scattering it (call receive() there)"
                    )
                    raise packed_error(prepared.plan, why, engine=self.engine, peer=peer)
                time.sleep(0.0005)
            self._acks.discard(previous)
            del self._unacked[key]
        message = send_packed(
            prepared.plan,
            run,
            lambda chunk, _slot: str(self._agent.transfer(handles[chunk])),
            lambda chunk: str(self._agent.check_xfer_state(handles[chunk])),
            timeout=timeout,
            engine=self.engine,
            peer=peer,
        )
        prepared.runs += 1
        try:
            self._agent.send_notif(peer, message)
            if notify:
                self._agent.send_notif(peer, notify)
        except Exception as exc:
            why = f"every chunk arrived, but the commit could not be sent: {exc}"
            raise packed_error(prepared.plan, why, engine=self.engine, peer=peer) from exc
        self._unacked[key] = run_of(message)

    def receive(
        self, plan: TransferPlan, *, commit: bytes | None = None, timeout: float = 30.0
    ) -> str:
        """Receiving side of a packed plan: wait for the sender's commit, check it, scatter.

        Waits (at most ``timeout`` seconds) for the commit the sender's
        :meth:`transfer` sends when every chunk arrived in this engine's
        :meth:`staging` area, checks it against ``plan`` (built here from the sender's
        spec and the same page ids), then scatters the pages into the pool, one
        multi-layer scatter per batch, and acknowledges (the sender may then write
        the staging area again). Until the commit, nothing is written into the pool.

        Returns:
            The run id of the commit.

        Raises:
            TransferError: no commit in time, or one for another layout; the pool is
                unchanged.
        """
        self._check_open()
        staging = receive_area(plan, self._staging)
        sender = ""
        if commit is None:
            deadline = time.monotonic() + timeout
            pause = 5e-5
            while not self._commits:  # bounded by the deadline
                self._drain()
                if self._commits:
                    break
                if time.monotonic() > deadline:
                    why = f"no commit arrived within {timeout:g} s"
                    raise packed_error(plan, why, engine=self.engine, peer="any peer")
                time.sleep(pause)
                pause = min(1e-3, 2 * pause)
            sender, commit = self._commits.pop(0)
        try:
            return receive_packed(
                plan, self._spans(), staging, commit, engine=self.engine, cache=self._unpackers
            )
        finally:
            if sender:
                with contextlib.suppress(Exception):  # the sender may have gone
                    self._agent.send_notif(sender, ack_message(run_of(commit)))

    def _drain(self) -> None:
        for name, messages in self._agent.get_new_notifs().items():
            for raw in messages:
                message = bytes(raw)
                if message.startswith(COMMIT_PREFIX):
                    self._commits.append((str(name), message))
                elif message.startswith(ACK_PREFIX):
                    self._acks.add(run_of(message))
                else:
                    self._backlog.setdefault(str(name), []).append(message)

    def transfer(
        self, prepared: PreparedTransfer, *, timeout: float = 30.0, notify: bytes = b""
    ) -> None:
        """Run a prepared transfer and wait (at most ``timeout`` seconds) until it completes.

        ``notify`` is delivered to the peer (see :meth:`notifications`) when the last
        chunk completes. A packed plan is packed chunk by chunk into two staging slots
        (packing the next while the engine moves the last) and then committed: the
        peer's :meth:`receive` scatters it.

        Raises:
            TransferError: the engine failed or the wait timed out; it names the pages
                that arrived and those that did not (for a packed plan: none arrived in
                the destination pool, which is unchanged).
        """
        self._check_open()
        if prepared.released:
            msg = "this prepared transfer was released; prepare() the plan again."
            raise TransferError(msg)
        if prepared.packed is not None:
            self._transfer_packed(prepared, timeout, notify)
            return
        handles = list(prepared.handles)
        once = None
        if notify:
            # NIXL keeps a handle's notification for every later post of it: the prepared
            # handles never carry one, and a notifying run posts its last chunk through a
            # one-off handle (released below), so a later run without notify sends none.
            np, last = _np(), prepared.chunks[-1]
            index = np.arange(last.start, last.stop, dtype=np.int32)
            mine, theirs = prepared.lists
            once = self._agent.make_prepped_xfer(prepared.op, mine, index, theirs, index, notify)
            handles[-1] = once
        try:
            self._run(prepared, handles, timeout)
        finally:
            if once is not None:
                with contextlib.suppress(Exception):  # best effort: the agent may be failing
                    self._agent.release_xfer_handle(once)

    def _run(self, prepared: PreparedTransfer, handles: list[Any], timeout: float) -> None:
        posted: list[int] = []
        done: list[int] = []
        for chunk, handle in enumerate(handles):
            try:
                state = self._agent.transfer(handle)
            except Exception as exc:
                why = f"posting chunk {chunk} raised {exc}"
                raise self._failed(prepared, done, posted, why) from exc
            if state == "ERR":
                raise self._failed(prepared, done, posted, f"NIXL refused to post chunk {chunk}")
            if state == "DONE":
                done.append(chunk)
            else:
                posted.append(chunk)
        finished, failed, reason = poll_until(
            lambda c: str(self._agent.check_xfer_state(handles[c])), posted, timeout=timeout
        )
        done.extend(finished)
        prepared.runs += 1
        if reason is not None:
            raise self._failed(prepared, done, failed, reason)

    def _failed(
        self, prepared: PreparedTransfer, done: list[int], _pending: list[int], reason: str
    ) -> TransferError:
        return transfer_error(prepared, done, reason, engine=self.engine)

    def notifications(self) -> dict[str, list[bytes]]:
        """Notifications received since the last call, per peer name."""
        self._check_open()
        self._drain()
        found, self._backlog = self._backlog, {}
        return found

    def release(self, prepared: PreparedTransfer) -> None:
        """Release a prepared transfer's handles and lists (idempotent)."""
        if prepared.released:
            return
        prepared.released = True
        for handle in prepared.handles:
            self._agent.release_xfer_handle(handle)
        for dlist in prepared.lists:
            self._agent.release_dlist_handle(dlist)
        prepared.handles.clear()
        prepared.lists.clear()
        if prepared in self._prepared:
            self._prepared.remove(prepared)

    def close(self) -> None:
        """Release every prepared transfer, forget the peers, deregister memory (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for prepared in list(self._prepared):
            self.release(prepared)
        self._staging.close()
        self._unpackers.clear()
        for peer in self._peers:
            with contextlib.suppress(Exception):  # the peer may have gone first
                self._agent.remove_remote_agent(peer)
        for descs in self._registered:
            self._agent.deregister_memory(descs)
        self._registered.clear()
        self._regions.clear()
        self._agent = None  # the last reference: the agent and its spinning progress thread end

    def _name(self) -> str:
        return str(self.name)

    def __enter__(self) -> NixlEngine:
        return self

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._regions)} regions"
        return f"NixlEngine({self.name!r}, {state}, peers={self._peers})"
