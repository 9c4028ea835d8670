"""``kvcompat inspect --sglang CLASS KEY=VALUE...`` builds and inspects a real SGLang pool."""

from __future__ import annotations

import io
import json

from kvcompat.inspection._cli import run_inspect


def test_inspect_builds_an_sglang_pool_from_arguments() -> None:
    out = io.StringIO()
    args = ["size=64", "page_size=64", "dtype=float8_e4m3fn", "qk_nope_head_dim=448",
            "qk_rope_head_dim=64", "layer_num=2"]  # fmt: skip
    assert run_inspect(out, sglang_class="DeepSeekV4SingleKVPool", pool_args=args) == 0
    text = out.getvalue()
    assert "an SGLang DeepSeekV4SingleKVPool" in text
    assert "kv_buffer[1]" in text
    assert "uint8[2, 37440]" in text


def test_inspect_json_for_a_dotted_class() -> None:
    out = io.StringIO()
    cls = "sglang.srt.mem_cache.memory_pool.MHATokenToKVPool"
    args = ["size=64", "page_size=16", "dtype=bfloat16", "head_num=2", "head_dim=8", "layer_num=1"]
    assert run_inspect(out, json=True, sglang_class=cls, pool_args=args) == 0
    document = json.loads(out.getvalue())
    assert document["source"] == "sglang"
    (pool,) = document["pools"].values()
    by_role = pool["memory"]["by_role"]
    assert by_role["key"] + by_role["value"] == 2 * 80 * 2 * 8 * 2  # K and V halves, bf16


def test_bad_sglang_arguments_exit_2_with_the_signature() -> None:
    out = io.StringIO()
    assert run_inspect(out, sglang_class="MHATokenToKVPool", pool_args=["size=64"]) == 2
    assert "its parameters:" in out.getvalue()
    out = io.StringIO()
    assert run_inspect(out, sglang_class="NoSuchPool", pool_args=[]) == 2
    assert "no pool class 'NoSuchPool'" in out.getvalue()
    out = io.StringIO()
    assert run_inspect(out, sglang_class="MHATokenToKVPool", pool_args=["size"]) == 2
    assert "expected KEY=VALUE" in out.getvalue()
