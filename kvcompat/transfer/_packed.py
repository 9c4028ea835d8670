"""Packed transfers, executed: gather into staging slots, move chunk by chunk, commit, scatter.

The layout (which page sits where in the stream) is planned in
``kvcompat/transfer/_layout.py``; this module runs it with an engine's post and poll:
the sender packs chunk *i + 1* into one staging slot while chunk *i* moves out of the
other, commits when every chunk arrived, and the receiver checks the commit against its
own plan before it scatters anything.
"""

from __future__ import annotations

import ctypes
import json
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from kvcompat._ops import gather_rows_layers, scatter_rows_layers
from kvcompat.transfer._engine import poll_until
from kvcompat.transfer._errors import TransferError, TransferPlanError
from kvcompat.transfer._layout import (
    DEFAULT_CHUNK_BYTES,
    PackLayout,
    Piece,
    StagingSpec,
    chunk_pieces,
    staging_of,
)

if TYPE_CHECKING:
    from kvcompat.transfer._plan import TransferPlan

__all__ = [
    "ACK_PREFIX",
    "COMMIT_PREFIX",
    "PackedRun",
    "Packer",
    "StagingAreas",
    "ack_message",
    "check_engine_plan",
    "device_bytes",
    "packed_error",
    "packed_run",
    "receive_area",
    "receive_packed",
    "run_of",
    "send_packed",
    "staging_spec",
]

COMMIT_PREFIX = b"kvcompat.packed/1 "
"""How a commit message starts (NIXL notifications carrying it are consumed by receive)."""

ACK_PREFIX = b"kvcompat.packed-ack/1 "
"""How the receiver's acknowledgement starts: its staging area may be written again."""


def device_bytes(ptr: int, length: int, device: str) -> torch.Tensor:
    """A writable uint8 tensor over ``length`` bytes of this process's memory at ``ptr``.

    The caller guarantees the memory lives (the engines check it lies in a region they
    registered from a live pool).
    """
    if device == "cpu":
        raw = (ctypes.c_uint8 * length).from_address(ptr)
        return torch.frombuffer(raw, dtype=torch.uint8)
    if device.startswith("cuda"):
        holder = _CudaBytes(ptr, length)
        return torch.as_tensor(holder, device=device)
    msg = f"packed transfers move cpu or cuda memory, not {device!r}."
    raise TransferPlanError(msg)


class _CudaBytes:
    """Exposes a device range through ``__cuda_array_interface__`` (no copy, no ownership)."""

    def __init__(self, ptr: int, length: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (length,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
        }


def inside(ptr: int, length: int, regions: Iterable[tuple[int, int]]) -> bool:
    """Whether ``[ptr, ptr + length)`` lies inside one of ``regions`` (``(start, length)``)."""
    return any(start <= ptr and ptr + length <= start + size for start, size in regions)


# -- the two ends --------------------------------------------------------------------------


class Packer:
    """One side's views of a packed plan: uint8 ``[pages, item]`` rows per buffer, page ids.

    ``side`` 0 gathers from the source buffers, 1 scatters into the destination's.
    Every buffer must lie in ``regions`` (the registered memory of a live pool of this
    process), so a plan built from a peer's spec never addresses foreign memory.
    """

    def __init__(
        self, plan: TransferPlan, side: int, regions: Iterable[tuple[int, int]], what: str
    ) -> None:
        layout = layout_of(plan)
        spans = sorted(set(regions))
        self.layout = layout
        self.views: dict[int, torch.Tensor] = {}
        self.device = "cpu"
        bases: dict[tuple[int, int], torch.Tensor] = {}  # one tensor per registered region
        for batch in layout.batches:
            for index in batch.pairs:
                buf = plan.pairs[index][side]
                size = buf.items * buf.item_length
                region = next((r for r in spans if inside(buf.ptr, size, [r])), None)
                if region is None:
                    msg = (
                        f"{what}: {buf.component}/{buf.label} at {buf.ptr:#x} is not memory "
                        "this engine registered.\nHint: register(pool) the live pool of this "
                        "process on its side of the plan before preparing or receiving."
                    )
                    raise TransferError(msg)
                if region not in bases:
                    bases[region] = device_bytes(region[0], region[1], buf.device)
                start = buf.ptr - region[0]
                flat = bases[region][start : start + size]
                self.views[index] = flat.view(buf.items, buf.item_length)
                self.device = buf.device
        pages = [b.src_pages if side == 0 else b.dst_pages for b in layout.batches]
        self.rows = [torch.tensor(p, dtype=torch.int64, device=self.device) for p in pages]

    def gather(self, piece: Piece, out: torch.Tensor) -> None:
        """Pack one piece into ``out`` (``piece.nbytes`` uint8, contiguous)."""
        batch = self.layout.batches[piece.batch]
        srcs = [self.views[batch.pairs[i]] for i in piece.layers]
        rows = self.rows[piece.batch][piece.rows.start : piece.rows.stop]
        shape = (len(srcs), len(piece.rows), batch.item_length)
        gather_rows_layers(srcs, rows, out.view(shape))

    def scatter_all(self, stream: torch.Tensor) -> None:
        """Scatter every batch of the whole stream (``layout.nbytes`` uint8) into the pool."""
        for index, batch in enumerate(self.layout.batches):
            dsts = [self.views[i] for i in batch.pairs]
            part = stream[batch.offset : batch.offset + batch.nbytes]
            src = part.view(len(dsts), len(batch.dst_pages), batch.item_length)
            scatter_rows_layers(dsts, self.rows[index], src)


def commit_message(layout: PackLayout, chunks: int) -> tuple[bytes, str]:
    """The commit a sender sends when every chunk arrived, and its run id."""
    run = secrets.token_hex(8)
    facts = {"digest": layout.digest, "bytes": layout.nbytes, "chunks": chunks, "run": run}
    return COMMIT_PREFIX + json.dumps(facts, sort_keys=True).encode(), run


def check_commit(message: bytes, layout: PackLayout) -> str:
    """The run id of a commit that matches ``layout``; raise otherwise (nothing scattered)."""
    try:
        facts = json.loads(message[len(COMMIT_PREFIX) :])
        digest, nbytes, run = str(facts["digest"]), int(facts["bytes"]), str(facts["run"])
    except (ValueError, KeyError, TypeError) as exc:
        msg = f"not a kvcompat packed-transfer commit: {message[:80]!r} ({exc})."
        raise TransferError(msg) from None
    if not message.startswith(COMMIT_PREFIX) or digest != layout.digest or nbytes != layout.nbytes:
        msg = (
            f"the sender committed another layout (digest {digest}, {nbytes} B) than this "
            f"plan's (digest {layout.digest}, {layout.nbytes} B); nothing was written.\n"
            "Hint: build the receiving plan from the sender's pool_spec with the same page "
            "ids (pages=..., dst_pages=...) and method as the sender's."
        )
        raise TransferError(msg)
    return run


def layout_of(plan: TransferPlan) -> PackLayout:
    """The packed layout of ``plan``; raise if it is not a packed plan."""
    if plan.packing is None:
        msg = (
            f"this plan moves {plan.method!r}, not 'packed'.\nHint: plan with "
            "method='packed' (or 'auto') on both sides."
        )
        raise TransferPlanError(msg)
    return plan.packing


def packed_error(plan: TransferPlan, reason: str, *, engine: str, peer: str) -> TransferError:
    """A packed transfer failed: nothing reached the destination pool."""
    lost = plan.dst_pages()
    shown = "; ".join(f"{label}: {len(ids)} pages" for label, ids in list(lost.items())[:4])
    more = f" (and {len(lost) - 4} more buffers)" if len(lost) > 4 else ""
    msg = (
        f"{engine} packed transfer with {peer!r} failed: {reason}.\n"
        f"Arrived in the destination pool: none (a packed transfer is scattered only after "
        f"it arrived whole). Not arrived: {shown or 'none'}{more}.\n"
        "Hint: send the request again; the destination pool is unchanged."
    )
    return TransferError(msg, arrived={}, not_arrived=lost)


# -- the pipeline both engines run ---------------------------------------------------------


@dataclass
class PackedRun:
    """What a prepared packed transfer holds: the packer, its chunks and the staging slots.

    Attributes:
        packer: the sender's views and page ids.
        pieces: the gathers of each chunk.
        offsets: where each chunk starts in the stream (and in the receiver's staging).
        sizes: each chunk's bytes.
        slots: the sender's two staging slots (uint8, ``max(sizes)`` bytes each).
        remote: the receiver's staging area.
        commit: the last run's commit message (hand it to the receiver yourself where
            the engine has no notifications: Mooncake).
    """

    packer: Packer
    pieces: tuple[tuple[Piece, ...], ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    slots: tuple[torch.Tensor, ...]
    remote: StagingSpec
    commit: bytes = b""


def check_engine_plan(plan: TransferPlan, engine: str) -> None:
    """Refuse a direct plan at an engine: it moves through CUDA IPC, not the engine."""
    if plan.method == "direct":
        msg = (
            f"a method='direct' plan moves without {engine}: the receiver pulls it with "
            "CudaIpcPeer(export_cuda_ipc(pool) from the sender).pull(plan, pool).\nHint: "
            "plan with method='packed' or 'auto' to move it through the engine."
        )
        raise TransferPlanError(msg)


def packed_run(
    plan: TransferPlan,
    staging: StagingSpec | str | bytes | Mapping[str, Any] | None,
    chunk_bytes: int | None,
    regions: Iterable[tuple[int, int]],
    slot_area: Callable[[str, int], torch.Tensor],
    *,
    engine: str,
) -> PackedRun:
    """Check a packed plan against the receiver's staging area and cut it into chunks."""
    if staging is None:
        msg = (
            f"this plan moves {plan.nbytes} B packed (method={plan.method!r}), which needs the "
            "receiver's staging area.\nHint: on the receiving side call "
            "engine.staging(nbytes, device=...) and send its to_json() here, then pass "
            "prepare(plan, peer, staging=that); or plan with method='pages'."
        )
        raise TransferPlanError(msg)
    remote = staging_of(staging)
    layout = layout_of(plan)
    if remote.length < layout.nbytes:
        msg = (
            f"the receiver's staging area holds {remote.length} B but this packed plan moves "
            f"{layout.nbytes} B.\nHint: on the receiving side call engine.staging({layout.nbytes},"
            f" device={remote.device!r}) (staging areas grow; one serves every smaller request)."
        )
        raise TransferPlanError(msg)
    if remote.memory[0] != plan.dst_mem:
        msg = (
            f"the receiver's staging area is {remote.device} ({remote.memory[0]}) but its pool "
            f"is {plan.dst_mem}.\nHint: create the staging area on the pool's device."
        )
        raise TransferPlanError(msg)
    packer = Packer(plan, 0, regions, f"{engine} prepare")
    pieces = chunk_pieces(layout, DEFAULT_CHUNK_BYTES if chunk_bytes is None else chunk_bytes)
    offsets = tuple(c[0].offset for c in pieces)
    sizes = tuple(sum(p.nbytes for p in c) for c in pieces)
    width = max(sizes, default=0)
    area = slot_area(packer.device, 2 * width)
    slots = (area[:width], area[width : 2 * width])
    return PackedRun(packer, pieces, offsets, sizes, slots, remote)


def send_packed(
    plan: TransferPlan,
    run: PackedRun,
    post: Callable[[int, int], str],
    state: Callable[[int], str],
    *,
    timeout: float,
    engine: str,
    peer: str,
) -> bytes:
    """Pack chunk by chunk into alternating slots and post each; wait; return the commit.

    ``post(chunk, slot)`` starts moving ``chunk`` out of ``run.slots[slot]`` and returns
    ``"DONE"``, ``"PROC"`` or ``"ERR"``; ``state(chunk)`` polls a posted chunk. A slot is
    packed again only after the chunk it held completed.
    """
    run.commit = b""  # a failed run must not leave the last run's commit to hand over
    deadline = time.monotonic() + timeout
    cuda = run.packer.device.startswith("cuda")
    busy: dict[int, int] = {}  # slot -> chunk in flight from it

    def settle(chunk: int) -> None:
        left = max(0.0, deadline - time.monotonic())
        _done, _failed, reason = poll_until(state, [chunk], timeout=left)
        if reason is not None:
            raise packed_error(plan, f"chunk {chunk}: {reason}", engine=engine, peer=peer)

    for chunk, pieces in enumerate(run.pieces):
        slot = chunk % 2
        if slot in busy:
            settle(busy.pop(slot))
        out, base = run.slots[slot], run.offsets[chunk]
        for piece in pieces:
            start = piece.offset - base
            run.packer.gather(piece, out[start : start + piece.nbytes])
        if cuda:  # the engine reads the slot on its own streams
            torch.cuda.current_stream(run.packer.device).synchronize()
        try:
            posted = post(chunk, slot)
        except Exception as exc:
            why = f"posting chunk {chunk} raised {exc}"
            raise packed_error(plan, why, engine=engine, peer=peer) from exc
        if posted == "ERR":
            why = f"the engine refused chunk {chunk}"
            raise packed_error(plan, why, engine=engine, peer=peer)
        if posted != "DONE":
            busy[slot] = chunk
    for chunk in sorted(busy.values()):
        settle(chunk)
    message, _run = commit_message(layout_of(plan), len(run.pieces))
    run.commit = message
    return message


def receive_packed(
    plan: TransferPlan,
    regions: Iterable[tuple[int, int]],
    staging: torch.Tensor,
    commit: bytes,
    *,
    engine: str,
    cache: dict[tuple[str, tuple[int, ...]], Packer] | None = None,
) -> str:
    """Check ``commit`` against ``plan``, then scatter the staging area into the pool.

    ``cache`` keeps the receiving side's views per layout and destination buffers, so a
    plan received again does not rebuild them.
    """
    layout = layout_of(plan)
    if staging.numel() < layout.nbytes:
        msg = (
            f"this engine's staging area holds {staging.numel()} B, the plan moves "
            f"{layout.nbytes} B.\nHint: engine.staging({layout.nbytes}) before the sender "
            "prepares (and send the sender the new spec)."
        )
        raise TransferPlanError(msg)
    key = (layout.digest, tuple(pair[1].ptr for pair in plan.pairs))
    unpacker = None if cache is None else cache.get(key)
    if unpacker is None:
        unpacker = Packer(plan, 1, regions, f"{engine} receive")
        if cache is not None:
            if len(cache) >= 64:  # bounded: forget the oldest layout
                del cache[next(iter(cache))]
            cache[key] = unpacker
    run = check_commit(commit, layout)
    unpacker.scatter_all(staging[: layout.nbytes])
    if unpacker.device.startswith("cuda"):  # the staging area may be written again after this
        torch.cuda.current_stream(unpacker.device).synchronize()
    return run


def run_of(message: bytes) -> str:
    """The run id a commit or acknowledgement names ('' if none)."""
    for prefix in (COMMIT_PREFIX, ACK_PREFIX):
        if message.startswith(prefix):
            try:
                return str(json.loads(message[len(prefix) :])["run"])
            except (ValueError, KeyError, TypeError):
                return ""
    return ""


def ack_message(run: str) -> bytes:
    """The receiver's acknowledgement of run ``run``."""
    return ACK_PREFIX + json.dumps({"run": run}).encode()


class StagingAreas:
    """An engine's staging memory: registered once, reused, grown when a request needs more.

    One *receive* area per device (what :meth:`staging` hands the peer) and one *send*
    area per device (the sender's two slots). ``register(tensor)`` registers a new area
    with the engine and returns a handle for ``deregister``.
    """

    def __init__(
        self, register: Callable[[torch.Tensor], Any], deregister: Callable[[Any], None]
    ) -> None:
        self._register, self._deregister = register, deregister
        self._areas: dict[tuple[str, str], tuple[torch.Tensor, Any]] = {}

    def area(self, purpose: str, device: str, nbytes: int) -> torch.Tensor:
        """The ``purpose`` area of ``device``, of at least ``nbytes`` bytes."""
        if nbytes < 1:
            msg = f"a staging area needs a positive size, got {nbytes!r} bytes."
            raise TransferPlanError(msg)
        key = (purpose, _device_name(device))
        found = self._areas.get(key)
        if found is not None and found[0].numel() >= nbytes:
            return found[0]
        tensor = torch.empty(nbytes, dtype=torch.uint8, device=device)
        handle = self._register(tensor)
        if found is not None:
            self._deregister(found[1])
        self._areas[key] = (tensor, handle)
        return tensor

    def current(self, device: str) -> torch.Tensor | None:
        """The receive area of ``device``, if one was made."""
        found = self._areas.get(("receive", _device_name(device)))
        return None if found is None else found[0]

    def spans(self) -> list[tuple[int, int]]:
        """``(address, length)`` of every area."""
        return [(t.data_ptr(), t.numel()) for t, _ in self._areas.values()]

    def close(self) -> None:
        """Deregister every area."""
        for _tensor, handle in self._areas.values():
            self._deregister(handle)
        self._areas.clear()


def receive_area(plan: TransferPlan, areas: StagingAreas) -> torch.Tensor:
    """The receive area a packed ``plan``'s destination device uses; raise if none."""
    if plan.method != "packed" or plan.packing is None or not plan.packing.batches:
        msg = (
            f"receive() takes a packed plan; this one moves {plan.method!r} (its pages land "
            "without the receiver's help).\nHint: build the receiving plan with the sender's "
            "method (plan.method on the sender's side)."
        )
        raise TransferPlanError(msg)
    device = plan.pairs[plan.packing.batches[0].pairs[0]][1].device
    found = areas.current(device)
    if found is None:
        msg = (
            f"this engine has no staging area on {device}.\nHint: call "
            f"engine.staging({plan.nbytes}, device={device!r}) and send it to the sender "
            "before it prepares."
        )
        raise TransferPlanError(msg)
    return found


def _device_name(device: str) -> str:
    where = str(torch.device(device))
    if where == "cuda":
        return f"cuda:{torch.cuda.current_device()}"
    return where


def staging_spec(tensor: torch.Tensor) -> StagingSpec:
    """The :class:`StagingSpec` of a receive area."""
    return StagingSpec(tensor.data_ptr(), tensor.numel(), str(tensor.device))
