"""Page-level transfer plans: which bytes of one pool go where in another.

:func:`plan_transfer` pairs the buffers of a source and a destination pool
(live objects or the :class:`~kvcompat.transfer.PoolSpec` a peer sent as JSON),
refuses any mismatch before anything moves, and lists one descriptor per
contiguous run of pages — coalesced on both sides at once — plus the regions
each side registers. :func:`request_pages` computes the page ids SGLang's own
PD path sends for a request, per transfer group.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvcompat.inspection import TransferGroup
from kvcompat.transfer._errors import TransferPlanError
from kvcompat.transfer._layout import PackLayout, choose_method, pack_layout
from kvcompat.transfer._spec import BufferSpec, ComponentSpec, PoolSpec, pool_spec

__all__ = [
    "Descriptor",
    "Request",
    "Run",
    "TransferPlan",
    "merge_pages",
    "plan_transfer",
    "request_pages",
]

PageIds = Mapping[Any, Sequence[int]]
"""Page (item) ids per transfer group, keyed by name or TransferGroup: ``{"kv": [3, 4]}``."""

_GROUPS = tuple(g.value for g in TransferGroup)


@dataclass(frozen=True)
class Run:
    """A run of consecutive pages of one buffer pair that a descriptor carries.

    Attributes:
        buffer: index into :attr:`TransferPlan.pairs`.
        src_page: first source page id.
        dst_page: first destination page id.
        count: pages in the run.

    Example:
        >>> from kvcompat.transfer import Run
        >>> list(Run(0, 3, 7, 2).dst_pages())
        [7, 8]
    """

    buffer: int
    src_page: int
    dst_page: int
    count: int

    def dst_pages(self) -> range:
        """Destination page ids of the run.

        Example:
            >>> from kvcompat.transfer import Run
            >>> Run(0, 0, 5, 3).dst_pages()
            range(5, 8)
        """
        return range(self.dst_page, self.dst_page + self.count)


@dataclass(frozen=True)
class Descriptor:
    """One contiguous byte range on both sides: ``length`` bytes from ``src`` to ``dst``.

    Attributes:
        src: source address.
        dst: destination address.
        length: bytes.
        runs: the pages it carries (several runs when coalescing crossed buffers).

    Example:
        >>> from kvcompat.transfer import Descriptor, Run
        >>> Descriptor(0x1000, 0x2000, 64, (Run(0, 0, 0, 1),)).pages
        1
    """

    src: int
    dst: int
    length: int
    runs: tuple[Run, ...]

    @property
    def pages(self) -> int:
        """Pages carried.

        Example:
            >>> from kvcompat.transfer import Descriptor, Run
            >>> Descriptor(0, 0, 96, (Run(0, 0, 0, 2), Run(1, 0, 0, 1))).pages
            3
        """
        return sum(run.count for run in self.runs)


@dataclass(frozen=True)
class TransferPlan:
    """What moves from a source pool to a destination pool, descriptor by descriptor.

    Attributes:
        src, dst: the two pools' specs.
        pairs: the paired buffers ``(source, destination)`` the plan touches.
        descriptors: the byte ranges to move, in order (a packed plan moves the same
            bytes, but as one stream).
        coalesced: whether contiguous runs were merged.
        method: ``"pages"`` (the descriptors go to the engine), ``"packed"`` (gathered
            into one stream, moved, scattered; see ``packing``) or ``"direct"`` (pulled
            by the receiver through CUDA IPC, batch by batch of ``packing``).
        packing: where every page sits in the packed stream (None for ``"pages"``).

    Example:
        >>> from kvcompat.transfer import plan_transfer
        >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
        >>> a = ReferenceDeepSeekV4SingleKVPool(256, 64, layer_num=2)
        >>> b = ReferenceDeepSeekV4SingleKVPool(256, 64, layer_num=2)
        >>> plan = plan_transfer(a, b, pages={"kv": [1, 2, 4]}, dst_pages={"kv": [0, 1, 3]})
        >>> [(d.length // 37440, d.pages) for d in plan.descriptors]
        [(2, 2), (1, 1), (2, 2), (1, 1)]
        >>> plan.nbytes == 6 * 37440, plan.src_mem, plan.dst_mem
        (True, 'DRAM', 'DRAM')
    """

    src: PoolSpec
    dst: PoolSpec
    pairs: tuple[tuple[BufferSpec, BufferSpec], ...]
    descriptors: tuple[Descriptor, ...]
    coalesced: bool
    method: str = "pages"
    packing: PackLayout | None = None

    @property
    def nbytes(self) -> int:
        """Bytes moved.

        Example:
            >>> from kvcompat.transfer import plan_transfer
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> a, b = ReferenceMHATokenToKVPool(32, 16), ReferenceMHATokenToKVPool(32, 16)
            >>> plan_transfer(a, b, pages={"kv": [1]}).nbytes
            8192
        """
        return sum(d.length for d in self.descriptors)

    @property
    def pages(self) -> int:
        """Pages moved, counted once per buffer.

        Example:
            >>> from kvcompat.transfer import plan_transfer
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> a, b = ReferenceMHATokenToKVPool(32, 16), ReferenceMHATokenToKVPool(32, 16)
            >>> plan_transfer(a, b, pages={"kv": [1, 2]}).pages  # 2 pages x (K and V)
            4
        """
        return sum(d.pages for d in self.descriptors)

    @property
    def src_mem(self) -> str:
        """The source side's memory type (``"DRAM"`` or ``"VRAM"``)."""
        return _mem_of(self.pairs, 0)[0]

    @property
    def dst_mem(self) -> str:
        """The destination side's memory type (``"DRAM"`` or ``"VRAM"``)."""
        return _mem_of(self.pairs, 1)[0]

    def src_descs(self) -> list[tuple[int, int, int]]:
        """``(address, length, device_id)`` per descriptor on the source side.

        Example:
            >>> from kvcompat.transfer import plan_transfer
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> a, b = ReferenceMHATokenToKVPool(32, 16), ReferenceMHATokenToKVPool(32, 16)
            >>> [length for _, length, _ in plan_transfer(a, b, pages={"kv": [0, 1]}).src_descs()]
            [8192, 8192]
        """
        device = _mem_of(self.pairs, 0)[1]
        return [(d.src, d.length, device) for d in self.descriptors]

    def dst_descs(self) -> list[tuple[int, int, int]]:
        """``(address, length, device_id)`` per descriptor on the destination side."""
        device = _mem_of(self.pairs, 1)[1]
        return [(d.dst, d.length, device) for d in self.descriptors]

    def src_regions(self) -> list[tuple[int, int, int]]:
        """What the source registers: ``(address, length, device_id)``, whole buffers merged.

        Whole buffers (not just the planned pages) are registered, so that one
        registration serves every later plan over the same pools.

        Example:
            >>> from kvcompat.transfer import plan_transfer
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> a, b = ReferenceMHATokenToKVPool(32, 16), ReferenceMHATokenToKVPool(32, 16)
            >>> len(plan_transfer(a, b, pages={"kv": [0]}).src_regions())  # K and V: one allocation
            1
        """
        return regions_of(pair[0] for pair in self.pairs)

    def dst_regions(self) -> list[tuple[int, int, int]]:
        """What the destination registers (see :meth:`src_regions`)."""
        return regions_of(pair[1] for pair in self.pairs)

    def dst_pages(self, descriptors: Iterable[int] | None = None) -> dict[str, tuple[int, ...]]:
        """Destination page ids per buffer label, of some descriptors (default: all).

        Example:
            >>> from kvcompat.transfer import plan_transfer
            >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
            >>> a = ReferenceDeepSeekV4SingleKVPool(128, 64)
            >>> b = ReferenceDeepSeekV4SingleKVPool(128, 64)
            >>> plan_transfer(a, b, pages={"kv": [0]}, dst_pages={"kv": [2]}).dst_pages()
            {'kv_buffer[0] (layer 0)': (2,)}
        """
        chosen = range(len(self.descriptors)) if descriptors is None else descriptors
        found: dict[str, list[int]] = {}
        for index in chosen:
            for run in self.descriptors[index].runs:
                label = self.pairs[run.buffer][1].label
                found.setdefault(label, []).extend(run.dst_pages())
        return {label: tuple(sorted(ids)) for label, ids in found.items()}

    def summary(self) -> dict[str, Any]:
        """JSON-ready facts about the plan (sizes and counts, no addresses).

        Example:
            >>> from kvcompat.transfer import plan_transfer
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> a, b = ReferenceMHATokenToKVPool(32, 16), ReferenceMHATokenToKVPool(32, 16)
            >>> plan_transfer(a, b, pages={"kv": [0, 1]}).summary()["descriptors"]
            2
        """
        return {
            "src": self.src.name,
            "dst": self.dst.name,
            "buffers": len(self.pairs),
            "pages": self.pages,
            "descriptors": len(self.descriptors),
            "bytes": self.nbytes,
            "coalesced": self.coalesced,
            "method": self.method,
            "gathers": 0 if self.packing is None else len(self.packing.batches),
        }


def _mem_of(pairs: Sequence[tuple[BufferSpec, BufferSpec]], side: int) -> tuple[str, int]:
    return pairs[0][side].memory if pairs else ("DRAM", 0)


def regions_of(buffers: Iterable[BufferSpec]) -> list[tuple[int, int, int]]:
    """Merge buffer ranges into registration regions ``(address, length, device_id)``.

    Overlapping or touching ranges on one device become one region.

    Example:
        >>> from kvcompat.transfer import pool_spec
        >>> from kvcompat.transfer._plan import regions_of
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool
        >>> spec = pool_spec(ReferenceMHATokenToKVPool(16, 16, layer_num=2))
        >>> [length for _, length, _ in regions_of(spec.buffers)]
        [16384, 16384]
    """
    spans = sorted({(b.memory, b.ptr, b.ptr + b.length) for b in buffers})
    merged: list[list[Any]] = []
    for memory, start, end in spans:
        if merged and merged[-1][0] == memory and start <= merged[-1][2]:
            merged[-1][2] = max(merged[-1][2], end)
        else:
            merged.append([memory, start, end])
    return [(start, end - start, memory[1]) for memory, start, end in merged]


# -- building a plan -------------------------------------------------------------------------


def _group_name(group: Any) -> str:
    try:
        return TransferGroup(group).value
    except ValueError:
        valid = ", ".join(repr(g) for g in _GROUPS)
        msg = f"unknown transfer group {group!r}.\nHint: use one of {valid}."
        raise TransferPlanError(msg) from None


def _normalise(pages: PageIds | None, what: str) -> dict[str, tuple[int, ...]] | None:
    if pages is None:
        return None
    found: dict[str, tuple[int, ...]] = {}
    for group, ids in pages.items():
        name = _group_name(group)
        try:
            values = tuple(int(i) for i in ids)
        except (TypeError, ValueError):
            msg = (
                f"{what}[{name!r}] must be a sequence of integer page ids, got {ids!r}.\n"
                "Hint: pass a list, a tuple, a numpy array or a 1-D tensor of ints."
            )
            raise TransferPlanError(msg) from None
        found[name] = found.get(name, ()) + values
    return found


def _pair(
    src: PoolSpec, dst: PoolSpec, groups: set[str], layers: set[int] | None
) -> list[tuple[BufferSpec, BufferSpec]]:
    chosen = [
        b for b in src.buffers if b.group in groups and (layers is None or b.layer_id in layers)
    ]
    if layers is not None:
        served = {b.layer_id for b in src.buffers if b.group in groups}
        missing = sorted(layers - served)
        if missing:
            valid = sorted(i for i in served if i is not None)
            msg = (
                f"layer ids {missing} are not served by {src.name} in groups {sorted(groups)}: "
                f"its layers are {valid}.\nHint: pass layers=None for every layer."
            )
            raise TransferPlanError(msg)
    by_key: dict[Any, list[BufferSpec]] = {}
    for b in dst.buffers:
        by_key.setdefault(b.key, []).append(b)
    taken: dict[Any, int] = {}
    pairs = []
    for b in chosen:
        index = taken.get(b.key, 0)
        partners = by_key.get(b.key, [])
        if index >= len(partners):
            msg = (
                f"the destination {dst.name} has no buffer matching the source's "
                f"{b.group!r} buffer {b.component}/{b.label}.\n"
                "Hint: both pools must be built from one model configuration (same "
                "components, layer ids and transfer groups); pass layers=... to move "
                "only the layers both serve."
            )
            raise TransferPlanError(msg)
        taken[b.key] = index + 1
        pairs.append((b, partners[index]))
    if layers is None:
        paired = {id(pair[1]) for pair in pairs}
        extra = [b for b in dst.buffers if b.group in groups and id(b) not in paired]
        if extra:
            names = ", ".join(f"{b.component}/{b.label}" for b in extra[:4])
            msg = (
                f"the destination {dst.name} registers {len(extra)} buffer(s) the source "
                f"{src.name} does not: {names}.\n"
                "Hint: the pools come from different model configurations; pass layers=... "
                "to move only the layers both serve."
            )
            raise TransferPlanError(msg)
    return pairs


def _check_pair(src: PoolSpec, dst: PoolSpec, a: BufferSpec, b: BufferSpec) -> None:
    facts = (
        ("item bytes", a.item_length, b.item_length),
        ("dtype", a.dtype, b.dtype),
        ("row shape", a.row_shape, b.row_shape),
    )
    for what, mine, theirs in facts:
        if mine != theirs:
            msg = (
                f"cannot pair {a.component}/{a.label} ({a.group!r}): its {what} differ, "
                f"source {mine!r} vs destination {theirs!r}.\n"
                "Hint: both pools must use one model configuration (layouts, page sizes, "
                "dtypes and head dims); nothing was moved."
            )
            raise TransferPlanError(msg)
    if a.item_length <= 0:
        msg = f"{a.component}/{a.label} has no transfer item size; it cannot be paged."
        raise TransferPlanError(msg)
    mine_part, theirs_part = src.components.get(a.component), dst.components.get(b.component)
    if mine_part is None or theirs_part is None:
        return
    mine_cfg, theirs_cfg = mine_part.config(), theirs_part.config()
    if mine_cfg != theirs_cfg:
        diff = sorted(
            k for k in set(mine_cfg) | set(theirs_cfg) if mine_cfg.get(k) != theirs_cfg.get(k)
        )
        shown = ", ".join(f"{k}: {mine_cfg.get(k)!r} vs {theirs_cfg.get(k)!r}" for k in diff)
        msg = (
            f"component {a.component!r} is configured differently (source vs destination): "
            f"{shown}.\nHint: both pools must use one model configuration; nothing was moved."
        )
        raise TransferPlanError(msg)


def _check_ids(ids: tuple[int, ...], buf: BufferSpec, side: str, *, unique: bool) -> None:
    bad = [i for i in ids if not 0 <= i < buf.items]
    if bad:
        msg = (
            f"{side} page ids {bad[:8]} are out of range for {buf.component}/{buf.label} "
            f"({buf.group!r}), which has pages 0..{buf.items - 1}.\n"
            "Hint: page ids address the group's own items (see kvcompat.transfer.request_pages)."
        )
        raise TransferPlanError(msg)
    if unique and len(set(ids)) != len(ids):
        twice = sorted(i for i, n in Counter(ids).items() if n > 1)
        msg = (
            f"{side} page ids {twice[:8]} appear more than once for {buf.component}/{buf.label}: "
            "two source pages would land on one destination page.\n"
            "Hint: give every destination page once."
        )
        raise TransferPlanError(msg)


def _pair_ids(
    pairs: Sequence[tuple[BufferSpec, BufferSpec]],
    pages: Mapping[str, tuple[int, ...]] | None,
    dst_pages: Mapping[str, tuple[int, ...]] | None,
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """``(source ids, destination ids)`` of every pair, checked."""
    out = []
    for a, b in pairs:
        if pages is None:
            if a.items != b.items:
                msg = (
                    f"{a.component}/{a.label} has {a.items} pages on the source and {b.items} "
                    "on the destination, so it cannot be moved whole.\n"
                    "Hint: pass pages=... (and dst_pages=...) to say which pages go where."
                )
                raise TransferPlanError(msg)
            mine = theirs = tuple(range(a.items))
        else:
            mine = pages.get(a.group, ())
            theirs = mine if dst_pages is None else dst_pages.get(a.group, ())
        if len(mine) != len(theirs):
            msg = (
                f"group {a.group!r}: {len(mine)} source page ids but {len(theirs)} destination "
                "page ids.\nHint: dst_pages must list one destination page per source page."
            )
            raise TransferPlanError(msg)
        _check_ids(mine, a, "source", unique=False)
        _check_ids(theirs, b, "destination", unique=True)
        out.append((mine, theirs))
    return out


def _segments(
    pairs: Sequence[tuple[BufferSpec, BufferSpec]],
    ids: Sequence[tuple[tuple[int, ...], tuple[int, ...]]],
) -> list[tuple[int, int, int, Run]]:
    out: list[tuple[int, int, int, Run]] = []
    for index, ((a, b), (mine, theirs)) in enumerate(zip(pairs, ids, strict=True)):
        size = a.item_length
        for s, d in zip(mine, theirs, strict=True):
            out.append((a.ptr + s * size, b.ptr + d * size, size, Run(index, s, d, 1)))
    return out


def _coalesce(segments: list[tuple[int, int, int, Run]]) -> list[Descriptor]:
    """Merge segments that are contiguous on both sides (within and across buffers)."""
    ordered = sorted(segments, key=lambda seg: (seg[0], seg[1]))
    merged: list[Descriptor] = []
    for src, dst, length, run in ordered:
        if merged:
            last = merged[-1]
            if last.src + last.length == src and last.dst + last.length == dst:
                runs = list(last.runs)
                tail = runs[-1]
                if (
                    tail.buffer == run.buffer
                    and tail.src_page + tail.count == run.src_page
                    and tail.dst_page + tail.count == run.dst_page
                ):
                    runs[-1] = Run(tail.buffer, tail.src_page, tail.dst_page, tail.count + 1)
                else:
                    runs.append(run)
                merged[-1] = Descriptor(last.src, last.dst, last.length + length, tuple(runs))
                continue
        merged.append(Descriptor(src, dst, length, (run,)))
    return merged


def plan_transfer(
    src: Any,
    dst: Any,
    *,
    pages: PageIds | None = None,
    dst_pages: PageIds | None = None,
    layers: Iterable[int] | None = None,
    groups: Iterable[Any] | None = None,
    coalesce: bool = True,
    method: str = "auto",
    same_node: bool = False,
) -> TransferPlan:
    """Plan moving pages (or whole layers) of ``src`` into ``dst``; refuse any mismatch.

    Either side may be a live pool (native or adapter), its manifest, or the
    :class:`PoolSpec` (or its dict / JSON form) a peer process sent. Buffers are
    paired by transfer group, component, role and layer id; their item bytes,
    dtypes and row shapes, and each component's layout, page size and other
    configuration, must be equal — capacities may differ.

    Args:
        src: the pool the bytes come from.
        dst: the pool they go to.
        pages: source page ids per transfer group (``{"kv": [...], "state": [...]}``);
            every buffer of a group uses the same ids, as SGLang's PD path does
            (see :func:`request_pages`). None: every page of every selected buffer.
        dst_pages: destination page ids per group, one per source id (default: the
            same ids as ``pages``).
        layers: only buffers of these absolute layer ids (per-request rows with no
            layer are left out). None: every buffer.
        groups: only these transfer groups. Default: the groups named in ``pages``,
            or every group when ``pages`` is None.
        coalesce: merge runs contiguous on both sides into one descriptor.
        method: ``"auto"`` (the rule below), ``"pages"`` (the engine moves the
            descriptors), ``"packed"`` (the sender gathers every page into one
            stream, the engine moves it, the receiver scatters it: see
            ``engine.prepare(..., staging=...)`` and ``engine.receive``) or
            ``"direct"`` (both pools CUDA memory of one node: the receiver pulls
            through CUDA IPC, :class:`CudaIpcPeer`). The rule packs when what the
            engine would spend per descriptor exceeds what a gather and a scatter pass
            cost (``docs/transfer.md``, "Which method: the rule"): on a GPU a request
            of tens of small descriptors packs, on a CPU host only thousands of
            sub-KiB descriptors do; with ``same_node`` it pulls direct.
        same_node: the receiving process runs on this node, so CUDA IPC reaches it;
            with ``method="auto"`` a plan between two CUDA pools is then direct.

    Returns:
        The :class:`TransferPlan`.

    Raises:
        TransferPlanError: the pools do not pair, or a page id is out of range or
            repeated on the destination (a ``ValueError``); nothing moved.

    Example:
        >>> from kvcompat.transfer import plan_transfer
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool
        >>> a = ReferenceMHATokenToKVPool(64, 16, layer_num=2)
        >>> b = ReferenceMHATokenToKVPool(64, 16, layer_num=2)
        >>> plan = plan_transfer(a, b, pages={"kv": [1, 2]}, dst_pages={"kv": [3, 4]})
        >>> plan.summary()["descriptors"], plan.nbytes  # one per K/V buffer: pages 1-2 merged
        (4, 32768)
        >>> plan_transfer(a, b, layers=[1]).pages  # layer 1 whole: 5 pages of K and of V
        10
        >>> plan.method, plan_transfer(a, b, pages={"kv": [1, 2]}, method="packed").method
        ('pages', 'packed')
    """
    mine, theirs = pool_spec(src), pool_spec(dst)
    wanted = _normalise(pages, "pages")
    wanted_dst = _normalise(dst_pages, "dst_pages")
    if wanted is None and wanted_dst is not None:
        msg = "dst_pages needs pages (the source page ids it pairs with)."
        raise TransferPlanError(msg)
    if groups is not None:
        chosen = {_group_name(g) for g in groups}
    elif wanted is not None:
        chosen = set(wanted) | set(wanted_dst or {})
    else:
        chosen = set(_GROUPS)
    for name in sorted(set(wanted or {}) | set(wanted_dst or {})):
        if name not in mine.groups():
            msg = (
                f"{mine.name} registers no {name!r} buffers; it registers {list(mine.groups())}.\n"
                "Hint: drop that group from pages=."
            )
            raise TransferPlanError(msg)
    layer_set = None if layers is None else {int(i) for i in layers}
    pairs = _pair(mine, theirs, chosen, layer_set)
    for a, b in pairs:
        _check_pair(mine, theirs, a, b)
    for side, name in ((0, "source"), (1, "destination")):
        kinds = {pair[side].memory for pair in pairs}
        if len(kinds) > 1:
            msg = (
                f"the {name} buffers live on several devices {sorted(kinds)}; one plan moves "
                "one memory type per side.\nHint: plan each device's layers separately "
                "(layers=...)."
            )
            raise TransferPlanError(msg)
    ids = _pair_ids(pairs, wanted, wanted_dst)
    segments = _segments(pairs, ids)
    if coalesce:
        descriptors = _coalesce(segments)
    else:
        descriptors = [Descriptor(s, d, n, (run,)) for s, d, n, run in segments]
    merged = descriptors if coalesce else _coalesce(segments)
    mems = {b.memory[0] for pair in pairs for b in pair}
    memory = mems.pop() if len(mems) == 1 else "MIXED"
    chosen_method = choose_method(
        method, len(merged), sum(d.length for d in merged), memory, same_node=same_node
    )
    packing = None if chosen_method == "pages" else pack_layout(pairs, ids)
    return TransferPlan(
        mine, theirs, tuple(pairs), tuple(descriptors), coalesce, chosen_method, packing
    )


# -- which pages a request sends -------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One request's slots, as SGLang's prefill holds them when it sends KV.

    Attributes:
        kv_locs: the request's token locations in the full pool for positions
            ``[0, seq_len)`` (SGLang's ``req_to_token[req_pool_idx, :seq_len]``).
        swa_locs: for pools with a sliding-window component: the window's token
            locations in the SWA pool, from the page-aligned window start to
            ``seq_len`` (SGLang's translated ``window_kv_indices``). None: no
            sliding-window pages.
        req_pool_idx: the request slot (for request-scoped states and rows).
        seq_len: the request length; default ``len(kv_locs)``.

    Example:
        >>> from kvcompat.transfer import Request
        >>> Request(kv_locs=range(64, 96)).length
        32
    """

    kv_locs: Sequence[int]
    swa_locs: Sequence[int] | None = None
    req_pool_idx: int | None = None
    seq_len: int | None = None

    @property
    def length(self) -> int:
        """``seq_len``, or the number of locations."""
        return len(self.kv_locs) if self.seq_len is None else int(self.seq_len)


def _page_ids(locs: Sequence[int], page: int, what: str) -> list[int]:
    values = [int(i) for i in locs]
    ids = []
    for start in range(0, len(values), page):
        chunk = values[start : start + page]
        first = chunk[0]
        if first % page or chunk != list(range(first, first + len(chunk))):
            msg = (
                f"{what} {start}..{start + len(chunk) - 1} are not one page: got "
                f"{chunk[:4]}{'...' if len(chunk) > 4 else ''} with page size {page}.\n"
                "Hint: a paged allocator gives each page's tokens consecutive locations "
                "starting at a multiple of the page size."
            )
            raise TransferPlanError(msg)
        ids.append(first // page)
    return ids


def _request_state_ids(spec: PoolSpec, request: Request) -> list[int]:
    names = {b.component for b in spec.buffers if b.group == TransferGroup.REQUEST_STATE.value}
    layouts = set()
    for name in names:
        details = spec.components[name].details if name in spec.components else {}
        layouts.add(
            (
                int(details.get("ratio", 0)),
                bool(details.get("online", False)),
                int(details.get("ring_size", 0)),
            )
        )
    if len(layouts) != 1:
        msg = (
            f"the request-scoped states of {spec.name} do not share one ring layout "
            f"(ratio, online, ring size): {sorted(layouts)}."
        )
        raise TransferPlanError(msg)
    ratio, online, ring = layouts.pop()
    if request.req_pool_idx is None:
        msg = "request_state pages need the request slot: pass Request(req_pool_idx=...)."
        raise TransferPlanError(msg)
    slot, length = int(request.req_pool_idx), request.length
    if ratio == 2:  # only an odd prefix leaves a pending half-pair
        return [slot] if length % 2 else []
    if ratio <= 0 or length == 0 or length % ratio == 0:
        return []
    if online:
        return [slot]
    if ring % ratio:
        msg = f"request-state ring size {ring} is not a multiple of its ratio {ratio}."
        raise TransferPlanError(msg)
    return [slot * (ring // ratio) + ((length - 1) % ring) // ratio]


def _ring_rows(spec: PoolSpec, request: Request) -> list[int]:
    names = {b.component for b in spec.buffers if b.group == TransferGroup.SWA_RING.value}
    settings = set()
    for name in names:
        details = spec.components[name].details if name in spec.components else {}
        ring = details.get("swa_ring_size")
        if ring is None and details.get("num_slots"):  # SGLang: swa_pages = slots x ring
            ring = int(details.get("swa_pages", 0)) // int(details["num_slots"])
        settings.add((details.get("swa_window"), ring))
    if len(settings) != 1:
        msg = f"the unified_kv ring buffers of {spec.name} disagree on (window, ring): {settings}."
        raise TransferPlanError(msg)
    window, ring = settings.pop()
    if not isinstance(window, int) or not isinstance(ring, int) or window <= 0 or ring <= 0:
        msg = (
            f"{spec.name} keeps its sliding window in unified_kv ring rows, but its spec "
            f"does not say the window and ring size (got window={window!r}, ring={ring!r}).\n"
            "Hint: build the spec with pool_spec(pool) from the live pool (not from a "
            "describe() manifest), which reads unified_swa_window and unified_swa_ring_size."
        )
        raise TransferPlanError(msg)
    if request.req_pool_idx is None:
        msg = "swa_ring rows need the request slot: pass Request(req_pool_idx=...)."
        raise TransferPlanError(msg)
    slot, length = int(request.req_pool_idx), request.length
    return [slot * ring + position % ring for position in range(max(0, length - window), length)]


def _refuse_device_slots(spec: PoolSpec, groups: tuple[str, ...]) -> None:
    """Refuse a component whose pages are HiSparse device slots in a group paged by kv_locs.

    Its rows are not the request's locations (SGLang's PD path moves the HiSparse host
    pool for those layers instead), so pages derived from ``kv_locs`` would name others.
    """
    names = sorted({b.component for b in spec.buffers if b.group in groups})
    device = [n for n in names if n in spec.components and _device_slots(spec.components[n])]
    if device:
        msg = (
            f"{spec.name}: component(s) {device} store their pages by HiSparse device slot, "
            "not by the request's locations, so their pages cannot be derived from kv_locs "
            "(SGLang's PD path moves the HiSparse host pool for those layers instead).\n"
            "Hint: kvcompat does not plan this pool's request pages; move those layers "
            "from SGLang's HiSparse host pool as its PD path does, or pass explicit page ids "
            "per group to plan_transfer(pages=...) if you know the device pages."
        )
        raise TransferPlanError(msg)


def _device_slots(part: ComponentSpec) -> bool:
    return part.details.get("slots") == "hisparse_device"


def request_pages(pool: Any, *requests: Request) -> dict[str, tuple[int, ...]]:
    """The page ids SGLang's PD path sends for ``requests``, per transfer group.

    Mirrors SGLang 0.5.23's prefill sender, component by component:

    * ``kv`` (and ``kv_scale``): the full-attention pages of ``kv_locs``
      (``kv_locs[::page_size] // page_size``). DeepSeek-V4's compressed c4/c128
      pools and its indexer address the *same* page ids: one compressed page
      holds one full page's tokens.
    * ``state``: the sliding-window pages of ``swa_locs``; DeepSeek-V4's
      page-scoped compress states ride with those SWA pages.
    * ``request_state``: DeepSeek-V4's request-scoped (c128) compress state —
      the ring page holding the request's pending partial block, or nothing at a
      block boundary.
    * ``swa_ring``: DeepSeek-V4 ``unified_kv`` pools keep the sliding window in
      per-request ring rows: the rows of the last ``window`` positions,
      ``req_pool_idx * ring + position % ring``, in position order (so that the
      two sides, each with its own slot, match row for row).
    * ``request_row``: the request slot.

    Groups the pool does not register are left out. A pool that registers
    ``state`` needs ``swa_locs``.

    Args:
        pool: a pool, adapter, manifest or :class:`PoolSpec` (of either side).
        *requests: the requests, in order; their ids are concatenated.

    Raises:
        TransferPlanError: locations that are not whole pages, or a missing input.

    Example:
        >>> from kvcompat.transfer import Request, request_pages
        >>> from kvcompat.testing import reference_swa_pool
        >>> pool = reference_swa_pool()  # full pool pages of 16 tokens, SWA pages of 16
        >>> request_pages(pool, Request(kv_locs=range(16, 48), swa_locs=range(32, 48)))
        {'kv': (1, 2), 'state': (2,)}
    """
    spec = pool_spec(pool)
    present = spec.groups()
    page = spec.page_size
    if not page:
        msg = f"{spec.name} has no page size, so token locations cannot be turned into pages."
        raise TransferPlanError(msg)
    found: dict[str, list[int]] = {g: [] for g in present}
    _refuse_device_slots(spec, (TransferGroup.KV.value, TransferGroup.KV_SCALE.value))
    for request in requests:
        kv = _page_ids(request.kv_locs, page, "kv_locs")
        for group in (TransferGroup.KV.value, TransferGroup.KV_SCALE.value):
            if group in found:
                found[group].extend(kv)
        if TransferGroup.STATE.value in found:
            if request.swa_locs is None:
                msg = (
                    f"{spec.name} registers sliding-window pages ('state'): pass "
                    "Request(swa_locs=...) with the window's SWA-pool token locations."
                )
                raise TransferPlanError(msg)
            found[TransferGroup.STATE.value].extend(_page_ids(request.swa_locs, page, "swa_locs"))
        if TransferGroup.REQUEST_STATE.value in found:
            found[TransferGroup.REQUEST_STATE.value].extend(_request_state_ids(spec, request))
        if TransferGroup.SWA_RING.value in found:
            found[TransferGroup.SWA_RING.value].extend(_ring_rows(spec, request))
        if TransferGroup.REQUEST_ROW.value in found:
            if request.req_pool_idx is None:
                msg = "request_row pages need the request slot: pass Request(req_pool_idx=...)."
                raise TransferPlanError(msg)
            found[TransferGroup.REQUEST_ROW.value].append(int(request.req_pool_idx))
    return {group: tuple(ids) for group, ids in found.items()}


def merge_pages(*pages: PageIds) -> dict[str, tuple[int, ...]]:
    """Concatenate page ids per group (several requests' :func:`request_pages`).

    Example:
        >>> from kvcompat.transfer import merge_pages
        >>> merge_pages({"kv": [1]}, {"kv": (4, 5), "state": [0]})
        {'kv': (1, 4, 5), 'state': (0,)}
    """
    found: dict[str, tuple[int, ...]] = {}
    for one in pages:
        for group, ids in one.items():
            name = _group_name(group)
            found[name] = found.get(name, ()) + tuple(int(i) for i in ids)
    return found
