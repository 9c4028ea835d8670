"""Shared by the transfer tests: host memory views and an in-process plan executor."""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from kvcompat.transfer import TransferPlan, pool_spec


def host_bytes(ptr: int, length: int) -> torch.Tensor:
    """A writable uint8 view of host memory."""
    return torch.frombuffer((ctypes.c_uint8 * length).from_address(ptr), dtype=torch.uint8)


def randomise(pool: Any, seed: int) -> None:
    """Random bytes in every registered buffer of a CPU pool."""
    generator = torch.Generator().manual_seed(seed)
    for buf in pool_spec(pool).buffers:
        noise = torch.randint(0, 256, (buf.length,), dtype=torch.uint8, generator=generator)
        host_bytes(buf.ptr, buf.length).copy_(noise)


def snapshot(pool: Any) -> dict[str, torch.Tensor]:
    return {b.label: host_bytes(b.ptr, b.length).clone() for b in pool_spec(pool).buffers}


def run_locally(plan: TransferPlan) -> None:
    """Move a plan by memmove (both pools in this process): the reference executor."""
    for d in plan.descriptors:
        ctypes.memmove(d.dst, d.src, d.length)


def expected_after(
    src_pool: Any,
    dst_pool: Any,
    pages: dict[str, list[int]],
    dst_pages: dict[str, list[int]],
    src: dict[str, torch.Tensor],
    dst: dict[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """What the destination must hold, page by page, from the page lists alone (not the plan).

    Both pools are built alike, so a buffer has the same label on both sides.
    """
    out = {label: tensor.clone() for label, tensor in dst.items()}
    for buf in pool_spec(src_pool).buffers:
        if buf.group not in pages:
            continue
        size = buf.item_length
        for s, t in zip(pages[buf.group], dst_pages[buf.group], strict=True):
            out[buf.label][t * size : (t + 1) * size] = src[buf.label][s * size : (s + 1) * size]
    return out


def move_packed_locally(plan: TransferPlan, chunk_bytes: int) -> torch.Tensor:
    """Move a packed plan in this process: gather chunk by chunk, then one scatter (the twin).

    Both pools live here; the stream is returned (what the receiver's staging area holds).
    """
    from kvcompat.transfer._layout import chunk_pieces
    from kvcompat.transfer._packed import Packer

    assert plan.packing is not None
    src = Packer(plan, 0, [(p, n) for p, n, _ in plan.src_regions()], "test")
    dst = Packer(plan, 1, [(p, n) for p, n, _ in plan.dst_regions()], "test")
    stream = torch.full((plan.nbytes,), 0xEE, dtype=torch.uint8, device=src.device)
    for chunk in chunk_pieces(plan.packing, chunk_bytes):
        for piece in chunk:
            src.gather(piece, stream[piece.offset : piece.offset + piece.nbytes])
    dst.scatter_all(stream)
    return stream


def random_pages(
    pool: Any, seed: int, count: int = 3, *, dst_pool: Any = None
) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """Out-of-order source and destination page ids per group, in range for every buffer."""
    import random

    rng = random.Random(seed)
    pages: dict[str, list[int]] = {}
    dst_pages: dict[str, list[int]] = {}
    theirs = pool_spec(pool if dst_pool is None else dst_pool)
    for group in pool_spec(pool).groups():
        mine = min(b.items for b in pool_spec(pool).buffers if b.group == group)
        room = min(b.items for b in theirs.buffers if b.group == group)
        n = min(count, mine, room)
        pages[group] = [rng.randrange(mine) for _ in range(n)]  # a source page may repeat
        dst_pages[group] = rng.sample(range(room), n)
    return pages, dst_pages
