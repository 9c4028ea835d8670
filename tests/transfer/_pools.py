"""Pool builders the two-process example imports by name (``transfer._pools:<function>``).

:func:`sglang_dsv4_pools` builds SGLang 0.5.23's own ``DeepSeekV4TokenToKVPool`` (SWA
pages, c4 and c128 compressed pools, the c4 indexer, page-scoped c4 compress states and
the request-scoped c128 compress state) with two requests per side, placed in different
slots on prefill and decode as SGLang's allocators would.
"""

from __future__ import annotations

from typing import Any

from kvcompat.transfer import Request


def sglang_dsv4_pools(role: str) -> dict[str, Any]:
    from _sglang.builders import build_dsv4_token_pool

    pool = build_dsv4_token_pool()  # page 256: 5 full pages, 2 SWA pages, 7 c128 state rings
    if role == "prefill":  # 300 tokens (2 pages) in slot 0, 100 tokens (1 page) in slot 1
        requests = [
            Request(range(256, 556), swa_locs=range(256, 300), req_pool_idx=0),
            Request(range(768, 868), swa_locs=range(100), req_pool_idx=1),
        ]
    else:
        requests = [
            Request(range(512, 812), swa_locs=range(44), req_pool_idx=2),
            Request(range(100), swa_locs=range(256, 356), req_pool_idx=3),
        ]
    return {"dsv4_composite": (pool, requests)}
