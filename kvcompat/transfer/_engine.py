"""What every engine binding shares: prepared transfers, bounded waits, page-exact errors.

A binding registers a pool's buffers, exchanges metadata with its peer,
prepares a :class:`~kvcompat.transfer.TransferPlan` once (descriptor lists and
engine handles, split into ``chunks``) and then runs it as often as needed.
When the engine fails or the wait times out, the
:class:`~kvcompat.transfer.TransferError` names the destination pages of the
chunks that completed (arrived) and of the others (not arrived, or unknown).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from kvcompat.transfer._errors import TransferError, TransferPlanError
from kvcompat.transfer._plan import TransferPlan

__all__ = ["Operation", "PreparedTransfer", "chunk_ranges", "poll_until", "transfer_error"]

Operation = Literal["WRITE", "READ"]
"""``"WRITE"``: this process holds the source and pushes; ``"READ"``: it holds the destination."""


@dataclass
class PreparedTransfer:
    """A plan bound to one engine and peer: descriptor lists and handles made once, reusable.

    Attributes:
        plan: the plan it runs.
        peer: the peer's name (NIXL agent name, Mooncake session id).
        op: ``"WRITE"`` (push from the local source) or ``"READ"`` (pull into the local
            destination).
        chunks: descriptor index ranges, one engine request each (a packed plan: one
            range per staging chunk, over chunk numbers).
        handles: the engine's request handles, one per chunk.
        lists: the engine's prepared descriptor lists (released with the transfer).
        runs: how many times it was run.
        packed: for a packed plan, its staging chunks and slots (and the last commit).

    Example:
        >>> from kvcompat.transfer import PreparedTransfer
        >>> PreparedTransfer.__dataclass_fields__["op"].type
        'Operation'
    """

    plan: TransferPlan
    peer: str
    op: Operation
    chunks: tuple[range, ...]
    handles: list[Any] = field(default_factory=list)
    lists: list[Any] = field(default_factory=list)
    runs: int = 0
    released: bool = False
    packed: Any = None

    @property
    def nbytes(self) -> int:
        """Bytes one run moves."""
        return self.plan.nbytes


def chunk_ranges(count: int, chunks: int) -> tuple[range, ...]:
    """Split ``count`` descriptors into at most ``chunks`` nearly equal, non-empty ranges.

    Example:
        >>> from kvcompat.transfer._engine import chunk_ranges
        >>> chunk_ranges(5, 2)
        (range(0, 3), range(3, 5))
        >>> chunk_ranges(0, 4)
        ()
    """
    if chunks < 1:
        msg = f"chunks must be a positive int, got {chunks!r}."
        raise TransferPlanError(msg)
    parts = min(chunks, count)
    if parts == 0:
        return ()
    base, extra = divmod(count, parts)
    out, start = [], 0
    for index in range(parts):
        stop = start + base + (1 if index < extra else 0)
        out.append(range(start, stop))
        start = stop
    return tuple(out)


def check_op(op: str) -> Operation:
    """``op`` if it is ``"WRITE"`` or ``"READ"``; raise otherwise."""
    if op == "WRITE":
        return "WRITE"
    if op == "READ":
        return "READ"
    msg = f"op must be 'WRITE' or 'READ', got {op!r}."
    raise TransferPlanError(msg)


def transfer_error(
    prepared: PreparedTransfer,
    done: Sequence[int],
    reason: str,
    *,
    engine: str,
) -> TransferError:
    """A :class:`TransferError` naming the pages of completed chunks and of the others.

    Example:
        >>> from kvcompat.transfer import PreparedTransfer, plan_transfer
        >>> from kvcompat.transfer._engine import chunk_ranges, transfer_error
        >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
        >>> a = ReferenceDeepSeekV4SingleKVPool(256, 64)
        >>> plan = plan_transfer(a, a, pages={"kv": [0, 2]}, dst_pages={"kv": [1, 3]})
        >>> prepared = PreparedTransfer(plan, "peer", "WRITE", chunk_ranges(2, 2))
        >>> err = transfer_error(prepared, [0], "timed out", engine="NIXL")
        >>> err.arrived, err.not_arrived
        ({'kv_buffer[0] (layer 0)': (1,)}, {'kv_buffer[0] (layer 0)': (3,)})
    """
    plan = prepared.plan
    finished = set(done)
    arrived = [i for c, r in enumerate(prepared.chunks) if c in finished for i in r]
    missing = [i for c, r in enumerate(prepared.chunks) if c not in finished for i in r]
    got, lost = plan.dst_pages(arrived), plan.dst_pages(missing)

    def shown(pages: dict[str, tuple[int, ...]]) -> str:
        if not pages:
            return "none"
        return "; ".join(f"{label}: {_ids(ids)}" for label, ids in pages.items())

    msg = (
        f"{engine} transfer to {prepared.peer!r} failed: {reason}.\n"
        f"Arrived ({len(finished)} of {len(prepared.chunks)} chunks): {shown(got)}.\n"
        f"Not arrived or unknown: {shown(lost)}.\n"
        "Hint: treat the not-arrived pages as missing on the destination and send them "
        "again (pass chunks=... to prepare() to narrow what a failure loses)."
    )
    return TransferError(msg, arrived=got, not_arrived=lost)


def _ids(ids: tuple[int, ...]) -> str:
    if len(ids) > 8:
        head = ", ".join(map(str, ids[:8]))
        return f"[{head}, ...] ({len(ids)} pages)"
    return str(list(ids))


def poll_until(
    check: Callable[[int], str],
    pending: list[int],
    *,
    timeout: float,
    spin: float = 0.002,
    nap: float = 0.001,
) -> tuple[list[int], list[int], str | None]:
    """Poll ``check(chunk)`` until every chunk is ``"DONE"``, one is ``"ERR"``, or time is up.

    Returns ``(done, failed, reason)``; ``reason`` is None when all finished.
    The loop is bounded by ``timeout`` seconds. For the first ``spin`` seconds it
    polls without pause (a GPU transfer of a few MiB completes in tens of
    microseconds, and a sleep would cost more than the transfer); after that it
    sleeps between polls, 50 µs doubling up to ``nap`` seconds, so that a long
    transfer leaves the engine's own threads a core.

    Example:
        >>> from kvcompat.transfer._engine import poll_until
        >>> poll_until(lambda c: "DONE", [0, 1], timeout=1.0)
        ([0, 1], [], None)
        >>> poll_until(lambda c: "ERR" if c else "DONE", [0, 1], timeout=1.0)[2]
        'the engine reported an error for chunk 1'
        >>> poll_until(lambda c: "PROC", [0], timeout=0.01)[2]
        'timed out after 0.01 s'
    """
    start = time.monotonic()
    deadline = start + timeout
    busy_until = start + spin
    done: list[int] = []
    waiting = list(pending)
    pause = 5e-5
    while waiting:
        still = []
        for chunk in waiting:
            state = check(chunk)
            if state == "DONE":
                done.append(chunk)
            elif state == "ERR":
                others = [c for c in waiting if c != chunk and c not in done]
                reason = f"the engine reported an error for chunk {chunk}"
                return sorted(done), [chunk, *others], reason
            else:
                still.append(chunk)
        waiting = still
        if not waiting:
            break
        now = time.monotonic()
        if now > deadline:
            return sorted(done), waiting, f"timed out after {timeout:g} s"
        if now > busy_until:
            time.sleep(pause)
            pause = min(nap, 2 * pause)
    return sorted(done), [], None


class EngineBase:
    """What both engine bindings share: the closed state and the context-manager protocol.

    Subclasses set ``engine`` (``"NIXL"``, ``"Mooncake"``) and ``_closed``, and implement
    :meth:`close`; ``with Engine(...) as e:`` closes the engine on exit.
    """

    engine = "transfer"
    _closed: bool

    def close(self) -> None:
        """Release everything the engine registered and prepared (idempotent)."""
        raise NotImplementedError

    def _name(self) -> str:
        raise NotImplementedError

    def _check_open(self) -> None:
        if self._closed:
            msg = f"{self.engine} engine {self._name()!r} is closed."
            raise TransferError(msg)

    def __enter__(self) -> Any:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
