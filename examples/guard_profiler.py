"""A guard-safe per-layer memory and occupancy profiler for KV pools.

A profiler runs beside a live server, so it must never call a pool's native
getters: they wait on layer-transfer events, allocate dequantized copies or
join collectives (see docs/guard-profiler.md). This one uses only

* ``kvcompat.inspection.describe`` and ``memory_report`` (attribute reads), and
* the adapter's ``get_key_buffer(layer, wait=False)`` (the very storage, no wait),

and proves it: every pool gets a recording layer-transfer counter, and the
profiler checks at the end that nothing waited on it.

Run: python examples/guard_profiler.py
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

import kvcompat
from kvcompat.inspection import PoolManifest, TensorManifest, describe, memory_report
from kvcompat.testing import (
    RecordingLayerCounter,
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
    ReferenceMLATokenToKVPool,
)


@dataclass(frozen=True)
class LayerProfile:
    """What the profiler learns about one layer of one pool."""

    pool: str
    layer: int
    buffer: str
    unit: str
    rows: int
    used: int
    nbytes: int

    @property
    def occupancy(self) -> float:
        return self.used / self.rows if self.rows else 0.0


def human(nbytes: int) -> str:
    """Bytes in binary units."""
    size = float(nbytes)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.1f} {unit}" if unit != "B" else f"{nbytes} B"
        size /= 1024
    return f"{size:.1f} GiB"


def key_entry(manifest: PoolManifest, layer: int, key: torch.Tensor) -> TensorManifest:
    """The manifest entry of a layer's key storage (found by address, not by class)."""
    return next(
        entry
        for entry in manifest.iter_tensors()
        if layer in entry.layer_ids and entry.data_ptr == key.data_ptr() and entry.alias_of is None
    )


def used_rows(key: torch.Tensor) -> int:
    """Leading-axis rows (tokens or pages) holding any non-zero byte."""
    raw = key.view(torch.uint8).reshape(key.shape[0], -1)
    return int(raw.ne(0).any(dim=1).sum())


def profile(name: str, native: Any) -> list[LayerProfile]:
    """Per-layer bytes and occupancy of one pool, without a single native getter call."""
    manifest = describe(native)
    report = memory_report(manifest)
    pool = kvcompat.adapt(native)
    rows = []
    for layer in pool.layer_ids:
        key = pool.get_key_buffer(layer, wait=False)
        entry = key_entry(manifest, layer, key)
        rows.append(
            LayerProfile(
                pool=name,
                layer=layer,
                buffer=f"{entry.path} {entry.dtype}{list(entry.shape)}",
                unit=entry.row_unit or "row",
                rows=entry.shape[0],
                used=used_rows(key),
                nbytes=report.by_layer.get(layer, 0),
            )
        )
    return rows


def simulate_traffic(native: Any, tokens: int) -> None:
    """Stand-in for a serving engine: mark ``tokens`` tokens of every layer as written."""
    pool = kvcompat.adapt(native)
    manifest = describe(native)
    for layer in pool.layer_ids:
        key = pool.get_key_buffer(layer, wait=False)
        per_row = native.page_size if key_entry(manifest, layer, key).row_unit == "page" else 1
        written = math.ceil(tokens / per_row)
        key.view(torch.uint8)[1 : 1 + written] = 0x3C  # row 0 is the engine's padding sink


def main() -> None:
    pools = {
        "MHA": ReferenceMHATokenToKVPool(
            size=256, page_size=16, head_num=8, head_dim=64, layer_num=2, start_layer=4
        ),
        "MLA": ReferenceMLATokenToKVPool(size=256, page_size=16, layer_num=2),
        "DeepSeek-V4": ReferenceDeepSeekV4SingleKVPool(
            size=1024, page_size=64, dtype=torch.float8_e4m3fn, layer_num=2
        ),
    }
    counters = {}
    for name, native in pools.items():
        counters[name] = RecordingLayerCounter()
        native.register_layer_transfer_counter(counters[name])
        simulate_traffic(native, tokens={"MHA": 100, "MLA": 40, "DeepSeek-V4": 300}[name])

    print("Guard profiler: per-layer KV memory and occupancy (no native getter is called)")
    print()
    header = ("pool", "layer", "key storage", "rows used", "occupancy", "layer bytes")
    table = [header]
    for name, native in pools.items():
        table.extend(
            (
                row.pool,
                str(row.layer),
                row.buffer,
                f"{row.used}/{row.rows} {row.unit}s",
                f"{100 * row.occupancy:.1f}%",
                human(row.nbytes),
            )
            for row in profile(name, native)
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for index, line in enumerate(table):
        cells = (cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        print("  ".join(cells).rstrip())
        if index == 0:
            print("  ".join("-" * width for width in widths))
    print()
    for name, native in pools.items():
        report = memory_report(native)
        size = human(report.total_bytes)
        print(f"{name:<12} {size:>10} in {len(report.storages)} allocations")
    waits = sum(len(counter.waits) for counter in counters.values())
    print()
    print(f"Layer-transfer waits triggered while profiling: {waits}")
    if waits:
        msg = "the profiler waited on a layer transfer"
        raise SystemExit(msg)
    # For contrast: the native getter a naive profiler would call waits on the counter.
    pools["MHA"].get_key_buffer(4)
    print(f"One native MHA get_key_buffer(4) call instead: waits {counters['MHA'].waits}")


if __name__ == "__main__":
    main()
