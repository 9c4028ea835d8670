"""Packed plans: where a request's pages of every layer sit in one contiguous stream.

A per-page plan is thousands of small ranges (a DeepSeek-V4 page is 37,440 B, x61
layers x components) and an engine pays for every one (UCX's ``cuda_ipc`` about 7.5 µs
of CPU per descriptor). A *packed* plan moves the same bytes as one stream instead:

1. the sender gathers the pages, per batch of buffers that share an item size and page
   ids (one multi-layer gather each, in the pool's own bytes: nothing is dequantized),
   into a staging slot it registered once;
2. the engine moves each staging chunk to the receiver's staging area — two sender
   slots, so that packing chunk *i + 1* overlaps moving chunk *i*;
3. when every chunk arrived, the sender commits (a small message naming the layout's
   digest, the byte count and a run id); the receiver checks it against its own plan
   and only then scatters, one multi-layer scatter per batch. A failed or partial
   transfer sends no commit, so nothing is written into the receiver's pool.

:func:`choose_method` is the rule :func:`~kvcompat.transfer.plan_transfer` applies with
``method="auto"``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from kvcompat.transfer._errors import TransferPlanError

if TYPE_CHECKING:
    from kvcompat.transfer._spec import BufferSpec

__all__ = [
    "COSTS",
    "DEFAULT_CHUNK_BYTES",
    "PACK_MIN_DESCRIPTORS",
    "Costs",
    "Method",
    "PackBatch",
    "PackLayout",
    "Piece",
    "StagingSpec",
    "choose_method",
    "chunk_pieces",
    "pack_layout",
]

Method = Literal["auto", "pages", "packed", "direct"]
"""How a plan moves: ``"pages"`` (a descriptor per contiguous run of pages), ``"packed"``
(gather, one stream, scatter), ``"direct"`` (the receiver gathers from the peer's CUDA
buffers through CUDA IPC, one node), or ``"auto"`` (the rule: pages or packed)."""

METHODS = ("auto", "pages", "packed", "direct")


@dataclass(frozen=True)
class Costs:
    """What the rule of ``method="auto"`` assumes about one memory type (seconds, bytes/s).

    Attributes:
        per_descriptor: what the engine spends per descriptor beyond moving its bytes.
        fixed: what a packed transfer adds once (the commit and acknowledgement round
            trip, the gather and scatter launches).
        copy_rate: bytes per second of one gather (or scatter) pass over the request.
    """

    per_descriptor: float
    fixed: float
    copy_rate: float


COSTS = {
    # UCX cuda_ipc: about 7.5 µs of CPU per descriptor whatever its size (H200, measured,
    # docs/transfer.md); one contiguous 64 MiB device copy takes 45-50 µs (~1.4 TB/s).
    "VRAM": Costs(per_descriptor=7.5e-6, fixed=100e-6, copy_rate=1.4e12),
    # UCX cma on the 2-core CI host (benchmarks/bench_transfer_packed.py, the JSON in
    # docs/_data): ~9 µs per descriptor beyond the copy; a gather pass at ~3 GB/s and the
    # all-or-nothing torch scatter at ~0.25 GB/s (0.45 GB/s per pass on average); ~10 ms
    # of commit round trip under load. Revisit when the CPU scatter is faster.
    "DRAM": Costs(per_descriptor=9e-6, fixed=10e-3, copy_rate=0.45e9),
}
"""The rule's cost model per memory type (the side's memory; VRAM if either side is)."""

PACK_MIN_DESCRIPTORS = 16
"""``method="auto"`` never packs a plan of fewer descriptors (small requests go by page)."""

DEFAULT_CHUNK_BYTES = 16 << 20
"""Bytes per staging chunk (the unit one engine request moves while the next is packed)."""


def choose_method(
    method: str, descriptors: int, nbytes: int, memory: str = "DRAM", *, same_node: bool = False
) -> Literal["pages", "packed", "direct"]:
    """The method a plan of ``descriptors`` (coalesced) ranges and ``nbytes`` bytes uses.

    ``memory`` is ``"DRAM"`` or ``"VRAM"`` when both sides are that, ``"MIXED"``
    otherwise (costed as VRAM).

    The rule (``method="auto"``): **packed** when the plan has at least
    :data:`PACK_MIN_DESCRIPTORS` descriptors *and* what the engine would spend on them
    exceeds what packing adds — ``descriptors x per_descriptor > fixed + 2 x nbytes /
    copy_rate`` with the :data:`COSTS` of the memory type (a gather and a scatter pass
    over the bytes, plus the commit round trip); **pages** otherwise. On a GPU a request
    of tens of small descriptors already packs; on a CPU host, where the extra passes
    cost more than the transfer, only thousands of sub-KiB descriptors do. **direct**
    instead when the caller says the peer shares this node (``same_node=True``) and both
    sides are CUDA memory: a direct pull reads and writes each byte once, where a packed
    transfer does so three times, and it needs no engine (measured faster than packed at
    every request size, ``docs/transfer.md``); the specs cannot tell the node, so
    ``"auto"`` never assumes it. ``"pages"``, ``"packed"`` and ``"direct"`` force one,
    except that a plan moving nothing is never packed.

    Raises:
        TransferPlanError: an unknown method, or ``"direct"`` where a side is not CUDA
            memory.

    Example:
        >>> from kvcompat.transfer._layout import choose_method
        >>> page = 37440  # a DeepSeek-V4 page
        >>> choose_method("auto", 61 * 16, 61 * 16 * page, "VRAM")  # 1k tokens, 61 layers
        'packed'
        >>> choose_method("auto", 8, 8 * page, "VRAM")  # too few descriptors
        'pages'
        >>> choose_method("auto", 61 * 16, 61 * 16 * page, "DRAM")  # the passes cost more
        'pages'
        >>> choose_method("auto", 4096, 4096 * 256, "DRAM")  # one-token MHA pages
        'packed'
        >>> choose_method("packed", 1, 100), choose_method("direct", 1, 100, "VRAM")
        ('packed', 'direct')
        >>> choose_method("auto", 8, 8 * page, "VRAM", same_node=True)  # one node, GPU memory
        'direct'
    """
    if method not in METHODS:
        msg = (
            f"method must be one of {', '.join(repr(m) for m in METHODS)}, got {method!r}.\n"
            "Hint: pass method='auto' to let the planner choose by request shape."
        )
        raise TransferPlanError(msg)
    given: object = same_node  # callers without a type checker pass 1, "yes" or None
    if not isinstance(given, bool):
        msg = (
            f"same_node must be True or False, got {same_node!r}.\nHint: pass same_node=True "
            "when the receiving process runs on this node (CUDA IPC reaches it)."
        )
        raise TransferPlanError(msg)
    if method == "direct" and memory != "VRAM":
        msg = (
            f"method='direct' maps the peer's CUDA buffers (CUDA IPC), but this plan moves "
            f"{memory} memory.\nHint: use method='packed' or 'auto' with an engine."
        )
        raise TransferPlanError(msg)
    if method == "pages" or nbytes == 0:
        return "pages"
    if method in ("packed", "direct"):
        return "packed" if method == "packed" else "direct"
    if same_node and memory == "VRAM":
        return "direct"
    costs = COSTS.get(memory, COSTS["VRAM"])
    engine = descriptors * costs.per_descriptor
    packing = costs.fixed + 2 * nbytes / costs.copy_rate
    return "packed" if descriptors >= PACK_MIN_DESCRIPTORS and engine > packing else "pages"


# -- the layout of the packed stream -------------------------------------------------------


@dataclass(frozen=True)
class PackBatch:
    """Buffers moved by one multi-layer gather: one item size, the same page ids.

    The batch occupies ``nbytes`` bytes of the stream from ``offset``, laid out
    ``[len(pairs), len(src_pages), item_length]`` (buffer-major, then page).

    Attributes:
        pairs: indices into :attr:`TransferPlan.pairs <kvcompat.transfer.TransferPlan.pairs>`.
        src_pages: source page ids (the same for every buffer of the batch).
        dst_pages: destination page ids, one per source page.
        item_length: bytes of one page.
        offset: where the batch starts in the stream.

    Example:
        >>> from kvcompat.transfer import PackBatch
        >>> PackBatch((0, 1), (3, 4), (7, 8), 100, 0).nbytes
        400
    """

    pairs: tuple[int, ...]
    src_pages: tuple[int, ...]
    dst_pages: tuple[int, ...]
    item_length: int
    offset: int

    @property
    def nbytes(self) -> int:
        """Bytes of the batch in the stream."""
        return len(self.pairs) * len(self.src_pages) * self.item_length


@dataclass(frozen=True)
class PackLayout:
    """Where every moved page sits in the packed stream, and a digest both sides compare.

    Attributes:
        batches: the gathers, in stream order.
        nbytes: bytes of the stream (the plan's bytes).
        digest: a hash of the batches and of the source buffers they read; the
            receiver's plan (built from the sender's spec) has the same digest, and a
            commit with another one is refused.

    Example:
        >>> from kvcompat.transfer import plan_transfer
        >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
        >>> a = ReferenceDeepSeekV4SingleKVPool(256, 64, layer_num=3)
        >>> plan = plan_transfer(a, a, pages={"kv": [0, 2]}, dst_pages={"kv": [1, 3]},
        ...                      method="packed")
        >>> [(b.pairs, b.src_pages, b.offset) for b in plan.packing.batches]  # one gather
        [((0, 1, 2), (0, 2), 0)]
        >>> plan.packing.nbytes == plan.nbytes
        True
    """

    batches: tuple[PackBatch, ...]
    nbytes: int
    digest: str


def pack_layout(
    pairs: Sequence[tuple[BufferSpec, BufferSpec]],
    ids: Sequence[tuple[tuple[int, ...], tuple[int, ...]]],
) -> PackLayout:
    """Batch the plan's buffers by (item size, source ids, destination ids), in pair order.

    ``ids[i]`` is ``(source ids, destination ids)`` of ``pairs[i]``.
    """
    grouped: dict[tuple[int, tuple[int, ...], tuple[int, ...]], list[int]] = {}
    for index, ((src, _dst), (mine, theirs)) in enumerate(zip(pairs, ids, strict=True)):
        if mine:
            grouped.setdefault((src.item_length, mine, theirs), []).append(index)
    batches, offset = [], 0
    for (size, mine, theirs), members in grouped.items():
        batch = PackBatch(tuple(members), mine, theirs, size, offset)
        batches.append(batch)
        offset += batch.nbytes
    facts = [
        (
            [[str(k) for k in pairs[i][0].key] for i in b.pairs],
            b.src_pages,
            b.dst_pages,
            b.item_length,
        )
        for b in batches
    ]
    sizes = [b.item_length for b in batches]
    digest = hashlib.sha256(json.dumps([facts, sizes]).encode()).hexdigest()[:32]
    return PackLayout(tuple(batches), offset, digest)


@dataclass(frozen=True)
class Piece:
    """One gather (or scatter) call of a chunk: some buffers of a batch, some of its pages.

    Attributes:
        batch: index into :attr:`PackLayout.batches`.
        layers: positions in the batch's ``pairs``.
        rows: positions in the batch's page ids (all of them unless one buffer's pages
            exceed a chunk).
        offset: where the piece starts in the stream.
        nbytes: its bytes.
    """

    batch: int
    layers: range
    rows: range
    offset: int
    nbytes: int


def chunk_pieces(layout: PackLayout, chunk_bytes: int) -> tuple[tuple[Piece, ...], ...]:
    """Cut the stream into chunks of at most ``chunk_bytes`` (at least one page each).

    A chunk holds whole buffers of a batch where they fit, else runs of pages of one
    buffer; every piece is contiguous in the stream, and the chunks cover it in order.

    Example:
        >>> from kvcompat.transfer._layout import PackBatch, PackLayout, chunk_pieces
        >>> layout = PackLayout((PackBatch((0, 1, 2), (5, 6), (0, 1), 10, 0),), 60, "x")
        >>> [[(p.layers, p.rows) for p in c] for c in chunk_pieces(layout, 40)]
        [[(range(0, 2), range(0, 2))], [(range(2, 3), range(0, 2))]]
        >>> [[(p.layers, p.rows) for p in c] for c in chunk_pieces(layout, 10)][:2]
        [[(range(0, 1), range(0, 1))], [(range(0, 1), range(1, 2))]]
    """
    if chunk_bytes < 1:
        msg = f"chunk_bytes must be a positive int, got {chunk_bytes!r}."
        raise TransferPlanError(msg)
    atoms: list[Piece] = []
    for index, batch in enumerate(layout.batches):
        n, size = len(batch.src_pages), batch.item_length
        per_layer = n * size
        for layer in range(len(batch.pairs)):
            start = batch.offset + layer * per_layer
            if per_layer <= chunk_bytes:
                atoms.append(Piece(index, range(layer, layer + 1), range(n), start, per_layer))
                continue
            step = max(1, chunk_bytes // size)
            for row in range(0, n, step):
                rows = range(row, min(n, row + step))
                where = start + row * size
                atoms.append(Piece(index, range(layer, layer + 1), rows, where, len(rows) * size))
    chunks: list[list[Piece]] = []
    used = chunk_bytes + 1
    for atom in atoms:
        if used + atom.nbytes > chunk_bytes:
            chunks.append([atom])
            used = atom.nbytes
            continue
        last = chunks[-1][-1]
        whole = len(atom.rows) == len(layout.batches[atom.batch].src_pages)
        if last.batch == atom.batch and whole and last.rows == atom.rows:
            layers = range(last.layers.start, atom.layers.stop)
            grown = last.nbytes + atom.nbytes
            chunks[-1][-1] = Piece(last.batch, layers, last.rows, last.offset, grown)
        elif last.batch == atom.batch and last.layers == atom.layers:
            rows = range(last.rows.start, atom.rows.stop)
            grown = last.nbytes + atom.nbytes
            chunks[-1][-1] = Piece(last.batch, last.layers, rows, last.offset, grown)
        else:
            chunks[-1].append(atom)
        used += atom.nbytes
    return tuple(tuple(c) for c in chunks)


# -- staging areas -----------------------------------------------------------------------


@dataclass(frozen=True)
class StagingSpec:
    """A receiver's registered staging area, as the sender needs it (JSON for the peer).

    Attributes:
        ptr: address of its first byte.
        length: bytes.
        device: ``"cpu"`` or ``"cuda:N"``.

    Example:
        >>> from kvcompat.transfer import StagingSpec
        >>> spec = StagingSpec(4096, 1 << 20, "cpu")
        >>> StagingSpec.from_json(spec.to_json()) == spec, spec.memory
        (True, ('DRAM', 0))
    """

    ptr: int
    length: int
    device: str

    @property
    def memory(self) -> tuple[str, int]:
        """``(mem_type, device_id)`` as NIXL names them."""
        if self.device.startswith("cuda"):
            _, _, index = self.device.partition(":")
            return ("VRAM", int(index or 0))
        return ("DRAM", 0)

    def to_json(self) -> str:
        """The spec as JSON."""
        return json.dumps({"kind": "kvcompat.staging/1", **self.__dict__}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes | Mapping[str, Any]) -> StagingSpec:
        """Inverse of :meth:`to_json` (a dict is accepted too).

        Raises:
            TransferPlanError: not a staging spec.
        """
        data = text if isinstance(text, Mapping) else json.loads(text)
        if not isinstance(data, Mapping) or data.get("kind") != "kvcompat.staging/1":
            msg = (
                f"not a kvcompat staging spec: got {str(text)[:80]!r}.\n"
                "Hint: send engine.staging(...).to_json() from the receiving process."
            )
            raise TransferPlanError(msg)
        return cls(int(data["ptr"]), int(data["length"]), str(data["device"]))


def staging_of(staging: StagingSpec | str | bytes | Mapping[str, Any]) -> StagingSpec:
    """``staging`` as a :class:`StagingSpec`."""
    return staging if isinstance(staging, StagingSpec) else StagingSpec.from_json(staging)
