"""The two-process prefill -> decode example, asserted: on every engine and on SGLang's own pool.

``examples/pd_transfer.py`` starts a prefill and a decode process (spawned, loopback only,
``UCX_NET_DEVICES=lo``, one torch thread), moves two requests' pages — packed or page by
page, as the planner chooses or as forced — and the decode side reports whether its bytes
equal the prefill's for exactly those pages, whether every other byte of its buffers is
unchanged, and whether kvcompat reads agree.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from .test_engines import needs_mooncake, needs_nixl

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(**kwargs: Any) -> dict[str, Any]:
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    import pd_transfer

    result: dict[str, Any] = pd_transfer.run(timeout=120.0, **kwargs)
    return result


def _assert_exact(result: dict[str, Any], names: set[str]) -> None:
    assert set(result) == names
    for name, facts in result.items():
        assert facts["bytes_equal"], name
        assert facts["others_unchanged"], (name, facts["untouched_buffers"])
        assert facts["reads_equal"], name
        assert facts["reads"] > 0, name
        assert facts["summary"]["pages"] > 0, name


@needs_mooncake
@pytest.mark.slow
def test_pd_example_over_mooncake() -> None:
    result = _run(engine="mooncake")
    _assert_exact(result, {"mha", "dsv4_single", "swa"})
    assert result["mha"]["summary"]["method"] == "packed"  # the commit went over the pipe


@needs_nixl
@pytest.mark.slow
def test_pd_example_over_nixl_packs_what_the_rule_says() -> None:
    result = _run(engine="nixl")
    _assert_exact(result, {"mha", "dsv4_single", "swa"})
    # one-token MHA pages at scattered slots: hundreds of 256 B ranges, packed; the rest not
    methods = {name: facts["summary"]["method"] for name, facts in result.items()}
    assert methods == {"mha": "packed", "dsv4_single": "pages", "swa": "pages"}


@needs_nixl
@pytest.mark.slow
@pytest.mark.sglang
def test_pd_example_on_sglangs_deepseek_v4_composite() -> None:
    pytest.importorskip("sglang")
    result = _run(engine="nixl", builder="transfer._pools:sglang_dsv4_pools")
    _assert_exact(result, {"dsv4_composite"})
    # every component moved: kv (c4, c4 indexer, c128), state (SWA, c4 states), request state
    assert result["dsv4_composite"]["summary"]["buffers"] == 9


@needs_nixl
@pytest.mark.slow
@pytest.mark.sglang
def test_pd_example_packed_on_sglangs_deepseek_v4_composite() -> None:
    pytest.importorskip("sglang")
    result = _run(engine="nixl", builder="transfer._pools:sglang_dsv4_pools", method="packed")
    _assert_exact(result, {"dsv4_composite"})
    summary = result["dsv4_composite"]["summary"]
    assert summary["method"] == "packed"
    assert summary["buffers"] == 9
    assert summary["gathers"] >= 4  # c4/c128/indexer pages, SWA and state rows, one pass each
