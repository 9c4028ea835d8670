"""``kvcompat scan --fix`` on SGLang 0.5.23's own pools: never failing where the original worked.

The snippets of ``tests/scan/fix_cases.py`` (getters, a v_head_dim probe, set_kv_buffer
with a tensor loc, with SGLang's own ``KVWriteLoc`` held in a variable, MLA-style with
a value the native pool drops, a backend calling per layer) run as written and as
``fix_source`` rewrites them, each on a fresh real pool.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from _sglang import builders as b
from _sglang.env import prepare_sglang
from _sglang.features import kv_write_loc
from scan.fix_cases import SNIPPETS, check, compare, inputs

POOLS: dict[str, Callable[[], Any]] = {
    "MHATokenToKVPool": b.build_mha_pool,
    "MHATokenToKOnlyPool": b.build_k_only_pool,
    "MLATokenToKVPool": b.build_mla_pool,
    "DSATokenToKVPool": b.build_dsa_pool,
    "SWAKVPool": b.build_swa_pool,
    "DeepSeekV4SingleKVPool": b.build_dsv4_single_pool,
    "DeepSeekV4TokenToKVPool": b.build_dsv4_token_pool,
}


def _no_write_loc(loc: Any) -> Any:
    msg = "this snippet does not build a KVWriteLoc"
    raise AssertionError(msg)


@pytest.mark.parametrize("pool_name", sorted(POOLS))
@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_rewrite_never_fails_where_the_original_worked(name: str, pool_name: str) -> None:
    if "make_write_loc(" in SNIPPETS[name]:
        write_loc = kv_write_loc()  # ReleaseLacks before 0.5.14 (no KVWriteLoc)
    else:
        prepare_sglang()
        write_loc = _no_write_loc
    check(compare(name, pool_name, POOLS[pool_name], inputs, write_loc))
