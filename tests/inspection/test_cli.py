"""run_inspect / run_doctor and the AST scan of SGLang's source (sglang is never imported)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kvcompat.inspection._cli import KVCacheClass, find_kvcache_classes, run_doctor, run_inspect


def test_inspect_prints_tree_and_memory_of_every_demo_pool() -> None:
    out = io.StringIO()
    assert run_inspect(out) == 0
    text = out.getvalue()
    for name in ("== MHA ==", "== MLA ==", "== DeepSeek-V4 single-KV =="):
        assert name in text
    assert "ReferenceDeepSeekV4SingleKVPool  packed_kv (single_kv pool)" in text
    assert "   kv_buffer[0]  packed_kv  layer 0  uint8[5, 37440]  182.8 KiB  cpu" in text
    assert "kv_buffer[0][..., :448]  value" in text
    assert text.count("Memory of ") == 3


def test_inspect_json() -> None:
    out = io.StringIO()
    assert run_inspect(out, json=True) == 0
    data = json.loads(out.getvalue())
    assert data["source"] == "demo"
    dsv4 = data["pools"]["DeepSeek-V4 single-KV"]
    assert dsv4["manifest"]["layout"] == "v4"
    assert dsv4["memory"]["total_bytes"] == 2 * 5 * 37440


def test_inspect_rejects_unknown_sources() -> None:
    out = io.StringIO()
    assert run_inspect(out, source="sglang-live") == 2
    assert "unknown source 'sglang-live'; choose one of: demo. Hint: " in out.getvalue()


_FACTORIES = """
import collections

from kvcompat.testing import ReferenceMLATokenToKVPool


def ordered(**kwargs):
    return collections.OrderedDict(kwargs)


def latent(size=16, layer_num=2, **_):
    return ReferenceMLATokenToKVPool(size, 16, layer_num=layer_num)
"""


@pytest.fixture
def factories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = "kvc_test_cli_factories"
    (tmp_path / f"{name}.py").write_text(_FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


@pytest.mark.parametrize(
    ("target", "says"),
    [
        (".{m}:ordered", "--sglang '.{m}:ordered' is a relative module path"),
        ("{m}:ordered", "--sglang {m}:ordered built a collections.OrderedDict (OrderedDict("),
        ("builtins.int", "--sglang builtins.int built a builtins.int (0), which kvcompat cannot"),
    ],
    ids=["relative-path", "factory-returns-a-dict", "builtin-int"],
)
def test_inspect_failures_of_the_issue_are_one_line_exit_2(
    factories: str, target: str, says: str
) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert run_inspect(out, sglang_class=target.format(m=factories), err=err) == 2
    assert out.getvalue() == ""
    line = err.getvalue()
    assert line.count("\n") == 1
    assert line.startswith("kvcompat inspect: error: " + says.format(m=factories)), line
    assert "Hint: " in line
    assert "no signature found" not in line


def test_inspect_builds_a_pool_with_a_factory(factories: str) -> None:
    out = io.StringIO()
    assert run_inspect(out, sglang_class=f"{factories}:latent", pool_args=["layer_num=3"]) == 0
    assert "kv_buffer[2]" in out.getvalue()
    out = io.StringIO()
    assert run_inspect(out, json=True, sglang_class=f"{factories}.latent") == 0
    (pool,) = json.loads(out.getvalue())["pools"].values()
    assert pool["memory"]["total_bytes"] == 2 * (16 + 16) * 576 * 2  # 2 layers, bf16 rows


def test_inspect_json_memory_is_the_reports_of_the_pools() -> None:
    from kvcompat._demo import build_demo_pools
    from kvcompat.inspection import memory_report

    def without_pointers(report: dict[str, Any]) -> dict[str, Any]:
        storages = [{k: v for k, v in s.items() if k != "ptr"} for s in report["storages"]]
        return {**report, "storages": storages}

    out = io.StringIO()
    assert run_inspect(out, json=True) == 0
    pools = json.loads(out.getvalue())["pools"]
    for name, native in build_demo_pools().items():  # fresh pools: other addresses
        expected = json.loads(json.dumps(memory_report(native).to_dict()))
        assert without_pointers(pools[name]["memory"]) == without_pointers(expected)


def test_doctor_text() -> None:
    out = io.StringIO()
    assert run_doctor(out) == 0
    text = out.getvalue()
    assert text.startswith("kvcompat ")
    assert "  python   3." in text
    assert "  torch    2." in text
    assert "  triton   " in text
    assert "engines" in text


def test_doctor_json_shape() -> None:
    out = io.StringIO()
    assert run_doctor(out, json=True) == 0
    data = json.loads(out.getvalue())
    assert set(data["torch"]) == {"version", "cuda_available", "cuda_version", "device_name"}
    assert set(data["engines"]) == {"sglang", "vllm"}
    assert data["vllm"]["tested_releases"] == ["0.33.0", "0.34.0"]
    if data["engines"]["sglang"] is None:
        assert data["sglang_classes"] is None
        assert data["sglang_import"] is None
    else:
        assert data["sglang_classes"]
        assert data["sglang_import"]["modules"]


def test_doctor_imports_no_engine() -> None:
    # Speed is a benchmark's business, not a test's: this checks what doctor loads.
    code = textwrap.dedent(
        """
        import io, sys
        from kvcompat.inspection._cli import run_doctor
        run_doctor(io.StringIO())
        engines = ("sglang", "triton", "vllm", "nixl")
        print(sorted(m for m in sys.modules if m.split(".")[0] in engines))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


# -- the AST scan on a synthetic SGLang tree ---------------------------------------------------

_TREE = {
    "srt/__init__.py": "",
    "srt/mem_cache/__init__.py": (
        "from sglang.srt.mem_cache.memory_pool import KVCache as KVCache\n"
    ),
    "srt/mem_cache/memory_pool.py": """
        import abc
        class KVCache(abc.ABC):
            pass
        class MHATokenToKVPool(KVCache):
            pass
        class FancyMHA(
            MHATokenToKVPool,
        ):
            '''A multi-line header.'''
        class NotAPool:
            pass
        class MLATokenToKVPool(KVCache): ...
    """,
    "srt/other/pools.py": """
        from sglang.srt.mem_cache import memory_pool as mp
        from ..mem_cache.memory_pool import MLATokenToKVPool as Latent
        from sglang.srt.mem_cache import KVCache
        from typing import Generic, TypeVar
        T = TypeVar("T")
        class Mixin:
            pass
        class Wrapped(mp.MHATokenToKVPool):
            pass
        class Aliased(Latent, Generic[T]):
            pass
        class MixedIn(Mixin, mp.MHATokenToKVPool):
            pass
        class Mystery(KVCache):
            pass
        text = '''
        class InAString(KVCache):
        '''
    """,
}


@pytest.fixture
def fake_sglang(tmp_path: Path) -> Path:
    root = tmp_path / "sglang"
    for relative, body in _TREE.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(body))
    return root


def test_ast_scan_finds_transitive_subclasses(fake_sglang: Path) -> None:
    found = {entry.qualname: entry for entry in find_kvcache_classes(fake_sglang)}
    assert sorted(found) == [
        "sglang.srt.mem_cache.memory_pool.FancyMHA",
        "sglang.srt.mem_cache.memory_pool.MHATokenToKVPool",
        "sglang.srt.mem_cache.memory_pool.MLATokenToKVPool",
        "sglang.srt.other.pools.Aliased",
        "sglang.srt.other.pools.MixedIn",
        "sglang.srt.other.pools.Mystery",
        "sglang.srt.other.pools.Wrapped",
    ]
    mha = "sglang.srt.mem_cache.memory_pool.MHATokenToKVPool"
    mla = "sglang.srt.mem_cache.memory_pool.MLATokenToKVPool"
    assert found[mha] == KVCacheClass(
        mha, ("sglang.srt.mem_cache.memory_pool.KVCache",), "split", mha, None
    )
    assert (
        found["sglang.srt.mem_cache.memory_pool.FancyMHA"].kind,
        found["sglang.srt.mem_cache.memory_pool.FancyMHA"].via,
    ) == ("split", mha)
    assert found["sglang.srt.other.pools.Wrapped"].bases == (mha,)
    assert (
        found["sglang.srt.other.pools.Aliased"].kind,
        found["sglang.srt.other.pools.Aliased"].via,
    ) == (
        "latent",
        mla,
    )
    assert found["sglang.srt.other.pools.MixedIn"].kind == "split"
    mystery = found["sglang.srt.other.pools.Mystery"]
    assert mystery.bases == ("sglang.srt.mem_cache.memory_pool.KVCache",)  # re-export resolved
    assert (mystery.kind, mystery.supported) == ("unsupported", False)
    assert mystery.reason == "this KVCache subclass is not one kvcompat knows."


def test_ast_scan_of_a_tree_without_srt(tmp_path: Path) -> None:
    assert find_kvcache_classes(tmp_path) == ()


def test_doctor_lists_the_installed_sglang_classes() -> None:
    out = io.StringIO()
    run_doctor(out, json=True)
    classes = json.loads(out.getvalue())["sglang_classes"]
    if classes is None:
        pytest.skip("sglang is not installed")
    kinds = {entry["qualname"].rsplit(".", 1)[-1]: entry["kind"] for entry in classes}
    assert kinds["MHATokenToKVPool"] == "split"
    assert kinds["DeepSeekV4SingleKVPool"] == "single_kv"
    assert kinds["HiSparseC4DevicePool"] == "single_kv"
    assert kinds["DeepSeekV4TokenToKVPool"] == "composite"
    assert kinds["UnifiedMHATokenToKVPool"] == "split"
    assert kinds["MHATokenToKVPoolFP4"] == "unsupported"
    assert kinds["PageInterleaveMHATokenToKVPool"] == "unsupported"  # the mixin comes first
    assert "KVCache" not in kinds
    assert len(classes) >= 40
