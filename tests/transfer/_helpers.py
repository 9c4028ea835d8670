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
