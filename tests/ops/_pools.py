"""Reference pools and the key-first loop the compile and capture tests run."""

from __future__ import annotations

from typing import Any

import torch

import kvcompat
from kvcompat.testing import (
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
    ReferenceMLATokenToKVPool,
)

POOLS = ("mha", "mla", "v4")


def make_pool(name: str, device: str = "cpu", *, seed: int = 0) -> Any:
    """An adapted reference pool whose every stored token holds random values."""
    natives = {
        "mha": lambda: ReferenceMHATokenToKVPool(
            64, 16, torch.bfloat16, head_num=2, head_dim=8, layer_num=2, device=device
        ),
        "mla": lambda: ReferenceMLATokenToKVPool(
            64, 16, torch.bfloat16, kv_lora_rank=32, qk_rope_head_dim=16, layer_num=2,
            device=device,
        ),
        "v4": lambda: ReferenceDeepSeekV4SingleKVPool(
            size=128, page_size=64, layer_num=2, device=device
        ),
    }  # fmt: skip
    pool = kvcompat.adapt(natives[name]())
    gen = torch.Generator().manual_seed(seed)
    for layer in pool.layer_ids:
        spec = pool.layout(layer)
        loc = torch.arange(64, device=device)
        keys = torch.randn(64, spec.key.dim, generator=gen).to(torch.bfloat16).to(device)
        values = None
        if spec.value is not None:
            values = torch.randn(64, spec.value.dim, generator=gen).to(torch.bfloat16)
            values = values.to(device)
        pool.write(layer, loc, keys, values)
    return pool


def write_args(pool: Any, n: int, *, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Random keys (and values, for split pools) for a write of ``n`` tokens."""
    gen = torch.Generator().manual_seed(seed)
    spec = pool.layout(pool.layer_ids[0])
    keys = torch.randn(n, spec.key.dim, generator=gen).to(torch.bfloat16).to(pool.device)
    values = None
    if spec.value is not None:
        values = torch.randn(n, spec.value.dim, generator=gen).to(torch.bfloat16)
        values = values.to(pool.device)
    return keys, values


def key_first_loop(
    pool: Any, loc: torch.Tensor, loc2: torch.Tensor, x: torch.Tensor, v: torch.Tensor | None
) -> list[torch.Tensor]:
    """The loop of issue 15: read every layer at ``loc``, write ``x`` at ``loc2``."""
    outs = []
    for layer in pool.layer_ids:
        out = pool.read(layer, loc)
        pool.write(layer, loc2, x, v)
        outs.append(out)
    return outs


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes, for exact comparison."""
    return t.contiguous().view(torch.uint8).cpu()


def buffers(pool: Any) -> list[torch.Tensor]:
    """Every buffer of the pool, as bytes."""
    out = []
    for layer in pool.layer_ids:
        out.append(as_bytes(pool.get_key_buffer(layer)))
        if pool.layout(layer).value is not None:
            out.append(as_bytes(pool.get_value_buffer(layer)))
    return out
