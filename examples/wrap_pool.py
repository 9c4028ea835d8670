"""Wrap three kinds of pool and walk them with one loop written once.

Run: python examples/wrap_pool.py
"""

from __future__ import annotations

import kvcompat
from kvcompat.testing import (
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
    ReferenceMLATokenToKVPool,
)


def layer_bytes(native: object) -> dict[int, int]:
    """Bytes of key (+ value, when separate) storage per layer, for any supported pool."""
    pool = kvcompat.adapt(native)
    sizes = {}
    for layer in pool.layer_ids:
        pair = pool.get_kv_buffer(layer, wait=False)  # inspection: no layer-transfer wait
        size = pair.key.nbytes
        if not pair.shared:
            size += pair.value.nbytes
        sizes[layer] = size
    return sizes


def main() -> None:
    pools = [
        ReferenceMHATokenToKVPool(size=256, page_size=16, head_num=8, head_dim=64, layer_num=2),
        ReferenceMLATokenToKVPool(size=256, page_size=16, layer_num=2, start_layer=2),
        ReferenceDeepSeekV4SingleKVPool(size=256, page_size=64, layer_num=2),
    ]
    for native in pools:
        print(
            f"{type(native).__name__:<34} {kvcompat.pool_kind(native)!s:<10} {layer_bytes(native)}"
        )


if __name__ == "__main__":
    main()
