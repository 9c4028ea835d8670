"""Measure what the compat proxy costs per call: ``python tests/compat/measure_gather.py [cuda]``.

Prints, per token count, the median time of one gather through a DeepSeek-V4 logical view
(``view[loc]``), of the key-first read it wraps (``adapter.read``), and of the plain index of
an MHA pool's native tensor; then the getter overhead on MHA (native vs proxy).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import torch

import kvcompat
from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool, ReferenceMHATokenToKVPool


def _median_us(call: Callable[[], object], repeat: int) -> float:
    sync = torch.cuda.synchronize if torch.cuda.is_initialized() else (lambda: None)
    for _ in range(3):
        call()
    times = []
    for _ in range(repeat):
        sync()
        start = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main(device: str) -> None:
    torch.set_num_threads(1)
    v4 = kvcompat.compat(ReferenceDeepSeekV4SingleKVPool(4096, 64, layer_num=1, device=device))
    mha = ReferenceMHATokenToKVPool(
        4096, 16, torch.bfloat16, head_num=1, head_dim=512, device=device
    )
    proxy = kvcompat.compat(mha)
    view = v4.get_key_buffer(0)
    every = torch.arange(4096, device=device)
    view[every] = torch.randn(4096, 1, 512, device=device).to(torch.bfloat16)
    print(f"device {device}")
    print("tokens  view[loc] us  adapter.read us  mha k_buffer[loc] us")
    for n in (1, 64, 1024, 4096):
        loc = torch.randperm(4096, device=device)[:n]
        via_view = _median_us(lambda loc=loc: view[loc], 200)
        via_read = _median_us(lambda loc=loc: v4.kvcompat.read(0, loc), 200)
        native = _median_us(lambda loc=loc: mha.k_buffer[0][loc], 200)
        print(f"{n:6d}  {via_view:12.1f}  {via_read:15.1f}  {native:19.1f}")
    getter_native = _median_us(lambda: mha.get_key_buffer(0), 2000)
    getter_proxy = _median_us(lambda: proxy.get_key_buffer(0), 2000)
    getter_view = _median_us(lambda: v4.get_key_buffer(0), 2000)
    print(
        f"get_key_buffer: native MHA {getter_native:.2f} us, proxy MHA {getter_proxy:.2f} us, "
        f"proxy V4 (cached view) {getter_view:.2f} us"
    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "cpu")
