"""Port a third-party attention backend to DeepSeek-V4 pools, in three steps.

1. ``LegacyBackend`` is written against SGLang's MHA pool interface, like most
   third-party backends: it probes ``get_value_buffer`` for the value head dim,
   writes with ``set_kv_buffer``, fetches ``get_kv_buffer`` and gathers token
   rows ``k_buf[loc]``. It works on MHA and MLA pools and crashes on
   DeepSeek-V4's single-KV pool.
2. The same, unchanged code runs on every pool through ``kvcompat.compat(pool)``:
   on DSv4 the buffers are logical views, the probe reads the model's value dim
   (512, not the 37,440 page bytes) and ``k_buf[loc]`` dequantizes through
   kvcompat's read. A kernel that wants the raw buffer (``data_ptr()``) gets a
   clear error instead of packed bytes.
3. ``PortedBackend`` is the clean, key-first port: ``pool.write`` and
   ``pool.read_kv`` through ``kvcompat.adapt(pool)`` -- no kernel per pool kind,
   no per-gather dispatch, Triton kernels on CUDA.

Run: python examples/port_backend.py
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

import kvcompat
from kvcompat.compat import CompatViewError
from kvcompat.testing import (
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
    ReferenceMLATokenToKVPool,
)


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Decode attention of ``query [q_heads, d]`` over ``key/value [n, kv_heads, *]``."""
    group = query.shape[0] // key.shape[1]
    k = key.float().repeat_interleave(group, dim=1)[..., : query.shape[1]]
    v = value.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("hd,nhd->hn", query.float(), k) / math.sqrt(query.shape[1])
    return torch.einsum("hn,nhd->hd", scores.softmax(dim=-1), v)


# -- "engine kernels": what a backend hands the raw buffers to -------------------------------


def token_row_kernel(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, loc: Any) -> Any:
    """MHA/MLA kernels index token rows directly."""
    return attend(q, k_buf[loc], v_buf[loc])


def raw_pointer_kernel(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, loc: Any) -> Any:
    """Stand-in for a CUDA kernel launched on the buffers' raw pointers (FlashInfer, Triton)."""
    k_buf.data_ptr()
    msg = "a raw-pointer kernel must never receive packed pages as token rows"
    raise AssertionError(msg)


PAGE_SIZE = 64


class Layer:
    """The bit of SGLang's RadixAttention a backend passes to the pool."""

    def __init__(self, layer_id: int) -> None:
        self.layer_id = layer_id


class LegacyBackend:
    """A third-party backend written against the MHA pool interface (unchanged below)."""

    def __init__(self, pool: Any, kernel: Callable[..., torch.Tensor]) -> None:
        self.pool = pool
        self.kernel = kernel
        # the shape probe of SGLang #30340: crashes on native DSv4 pools (get_value_buffer
        # raises); through kvcompat.compat it reads the model's value dim
        self.v_head_dim = pool.get_value_buffer(pool.start_layer).shape[-1]

    def forward_decode(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor
    ) -> torch.Tensor:
        self.pool.set_kv_buffer(Layer(layer_id), loc, k, v)
        k_buf, v_buf = self.pool.get_kv_buffer(layer_id)
        return self.kernel(q, k_buf, v_buf, loc)


class PortedBackend:
    """The key-first port: one code path for every pool kind."""

    def __init__(self, pool: Any) -> None:
        self.pool = kvcompat.adapt(pool)

    def forward_decode(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor
    ) -> torch.Tensor:
        value = v if self.pool.get_kv_buffer(layer_id).shared is False else None
        self.pool.write(layer_id, loc, k, value)
        key, val = self.pool.read_kv(layer_id, loc)
        return attend(q, key, val)


def make_pools() -> dict[str, Any]:
    return {
        "MHA": ReferenceMHATokenToKVPool(256, 16, torch.bfloat16, head_num=1, head_dim=512),
        "MLA": ReferenceMLATokenToKVPool(256, 16, torch.bfloat16, kv_lora_rank=448),
        "DSv4": ReferenceDeepSeekV4SingleKVPool(256, PAGE_SIZE),
    }


def run(backend_factory: Callable[[Any, Any], Any], name: str) -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(4, 512, generator=gen)
    k = torch.randn(32, 1, 512, generator=gen).to(torch.bfloat16)
    v = torch.randn(32, 1, 512, generator=gen).to(torch.bfloat16)
    loc = torch.arange(1, 33)
    print(f"{name}:")
    for pool_name, native in make_pools().items():
        try:
            backend = backend_factory(native, token_row_kernel)
            out = backend.forward_decode(0, q, k, v, loc)
        except NotImplementedError as exc:
            print(f"  {pool_name:<5} crashes: NotImplementedError({str(exc)!r})")
            continue
        pool = kvcompat.adapt(native)
        value = v if not pool.get_kv_buffer(0).shared else k[..., : pool.layout(0).value_dim or 512]
        error = (out - attend(q, k, value)).abs().max()
        probe = getattr(backend, "v_head_dim", None)
        shown = "" if probe is None else f"   (v_head_dim probe: {probe})"
        print(f"  {pool_name:<5} runs:    max |out - dense attention| = {error:.3g}{shown}")


def main() -> None:
    run(LegacyBackend, "1. unported backend, native pools")
    run(
        lambda pool, kernel: LegacyBackend(kvcompat.compat(pool), kernel),
        "2. same code via kvcompat.compat",
    )
    dsv4 = kvcompat.compat(ReferenceDeepSeekV4SingleKVPool(256, PAGE_SIZE))
    try:
        LegacyBackend(dsv4, raw_pointer_kernel).forward_decode(
            0, torch.zeros(4, 512), torch.zeros(1, 1, 512), None, torch.tensor([1])
        )
    except CompatViewError as exc:
        print(f"  DSv4  raw-pointer kernel refused: {str(exc).splitlines()[0][:88]}...")
    run(lambda pool, kernel: PortedBackend(pool), "3. key-first port via kvcompat.adapt")
    print("\nkvcompat scan finds the calls to port: kvcompat scan examples/port_backend.py")


if __name__ == "__main__":
    main()
