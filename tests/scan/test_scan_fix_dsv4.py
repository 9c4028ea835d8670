"""A backend fixed by ``kvcompat scan --fix``, imported from the file it wrote, on DeepSeek-V4.

The backend is the small one issue 35 reports: a ``v_head_dim`` probe
(``get_value_buffer(0).shape[-1]``), ``set_kv_buffer(layer, loc, k, v)`` and an attention
that unpacks ``k_cache, v_cache = get_kv_buffer(i)`` and gathers ``k_cache[loc]``. Written
for MHA pools, it raises on every one of those calls on a DeepSeek-V4 single-KV pool.

``scan --fix`` rewrites it; the fixed module is imported from the file and run on SGLang's
own ``DeepSeekV4SingleKVPool`` (and ``DeepSeekV4UniformFP8KVPool``), including a pipeline
stage (``start_layer > 0``) and out-of-order slots, and compared with a dense reference:

* the head-dim probe answers 512 (the model's), not 37,440 (the bytes of a packed page);
* the attention output equals a dense fp32 attention over the values kvcompat reads back
  (``kvcompat.adapt(pool).read``) exactly, and one over the keys handed in within the V4
  layout's quantization error (``rel-L2 <= 2**-4``: e4m3 with a power-of-two scale per 64
  values keeps each value within half an ulp, 2**-4 relative; see
  ``tests/real/test_backends_real.py``);
* what stays different from an MHA pool -- ``cache_v`` is not stored where the value is the
  key row -- is what the rescan lists as a ``KVC100`` note to check by hand.

The file an *older* ``--fix`` wrote (fallback ``kvcompat.adapt``) returns wrong values on the
same pools (the probe answers 37,440, the gather reads page rows); the scanner reports it
(``KVC008``, ``KVC009``) and never calls it clean.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch
from _sglang.env import IMPORT_WARNING_FILTERS, sglang_installed

import kvcompat
from kvcompat.scan import main, scan_paths

# SGLang's pool modules warn on import on a CPU machine: ignored narrowly, as tests/real does.
pytestmark = [
    pytest.mark.sglang,
    *(pytest.mark.filterwarnings(spec) for spec in IMPORT_WARNING_FILTERS),
    pytest.mark.skipif(not sglang_installed(), reason="needs SGLang 0.5.23's pool classes"),
]

BACKEND = textwrap.dedent(
    '''\
    """A small attention backend written against SGLang's MHA pools."""

    import math

    import torch


    def v_head_dim(pool):
        return pool.get_value_buffer(0).shape[-1]


    def store(pool, layer, loc, k, v):
        pool.set_kv_buffer(layer, loc, k, v)


    def attend(pool, layer_id, q, loc):
        k_cache, v_cache = pool.get_kv_buffer(layer_id)
        k = k_cache[loc].float().flatten(1)
        v = v_cache[loc].float().flatten(1)
        weights = torch.softmax(q.float() @ k.T / math.sqrt(k.shape[-1]), dim=-1)
        return weights @ v
    '''
)
HEAD_DIM = 512  # DeepSeek-V4's latent (448 fp8 + 64 bf16 rope dims)
PAGE_BYTES_V4 = 37440  # what the packed page's shape[-1] is


def _sglang() -> Any:
    from _sglang import builders
    from _sglang.env import prepare_sglang

    prepare_sglang()
    return builders


def _pools() -> dict[str, Callable[[], Any]]:
    b = _sglang()
    return {
        "DeepSeekV4SingleKVPool": b.build_dsv4_single_pool,
        "DeepSeekV4SingleKVPool@start_layer=2": lambda: b.build_dsv4_single_pool(start_layer=2),
        "DeepSeekV4UniformFP8KVPool": b.build_dsv4_uniform_fp8_pool,
    }


POOL_NAMES = (
    "DeepSeekV4SingleKVPool",
    "DeepSeekV4SingleKVPool@start_layer=2",
    "DeepSeekV4UniformFP8KVPool",
)


def _import(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


@pytest.fixture
def fixed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[ModuleType, str]:
    """The backend as ``kvcompat scan --fix`` rewrote it, imported from that file."""
    path = tmp_path / "small_backend.py"
    path.write_text(BACKEND)
    assert main([str(path)]) == 1  # three findings before fixing
    capsys.readouterr()
    main(["--fix", str(path)])
    out = capsys.readouterr().out
    return _import(path, "small_backend_fixed"), out


def _rel_l2(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a - ref).norm() / ref.norm())


def _dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    k, v = k.float().flatten(1), v.float().flatten(1)
    weights = torch.softmax(q.float() @ k.T / math.sqrt(k.shape[-1]), dim=-1)
    return weights @ v


def _inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    loc = torch.tensor([37, 3, 64, 12, 90, 41, 7])  # out of order, across pages
    latent = torch.randn(len(loc), 1, HEAD_DIM, generator=generator).to(torch.bfloat16)
    q = torch.randn(4, HEAD_DIM, generator=generator)
    return loc, latent, q


def test_the_fix_report_is_not_clean_and_says_what_to_check(
    fixed: tuple[ModuleType, str],
) -> None:
    _, out = fixed
    lines = out.splitlines()
    assert lines[-1] == (
        "kvcompat scan: fixed 3 findings; remaining: no unguarded pool accesses in 1 file;"
        " 1 line to check by hand (KVC100, listed above)."
    )
    [note] = lines[:-1]
    assert ": KVC100 check by hand: _kvcompat_set_kv_buffer(pool, layer, loc, k, v) — " in note
    assert "cache_v is not stored" in note


@pytest.mark.parametrize("pool_name", POOL_NAMES)
def test_the_fixed_backend_matches_the_dense_reference(
    fixed: tuple[ModuleType, str], pool_name: str
) -> None:
    backend, _ = fixed
    pool = _pools()[pool_name]()
    layer_id = pool.start_layer + 1
    adapter = kvcompat.adapt(pool)
    loc, latent, q = _inputs(seed=len(pool_name))
    with pytest.raises(NotImplementedError):
        pool.get_value_buffer(pool.start_layer)  # the native calls raise: the fallback answers
    # The head-dim probe (of layer 0, as written): the model's 512, not the packed page's
    # bytes; on a later pipeline stage layer 0 is refused, never answered wrongly.
    if pool.start_layer == 0:
        assert backend.v_head_dim(pool) == HEAD_DIM
    else:
        with pytest.raises(kvcompat.LayerOutOfRangeError, match=r"valid layer ids are 2\.\.3"):
            backend.v_head_dim(pool)
    assert adapter.get_value_buffer(pool.start_layer).shape[-1] != HEAD_DIM  # the raw buffer's
    before = [buf.clone() for buf in pool.kv_buffer]
    # A DeepSeek model hands in its latent as both key and value, as the note asks.
    backend.store(pool, SimpleNamespace(layer_id=layer_id), loc, latent, latent)
    changed = [i for i, buf in enumerate(pool.kv_buffer) if not torch.equal(buf, before[i])]
    assert changed == [layer_id - pool.start_layer]  # only that layer's bytes
    out = backend.attend(pool, layer_id, q, loc)
    stored = adapter.read(layer_id, loc)
    assert torch.equal(out, _dense(q, stored, stored))  # the same values, the same math
    assert _rel_l2(out, _dense(q, latent, latent)) <= 2**-4  # V4's fp8 rounding, no more


@pytest.mark.parametrize("pool_name", POOL_NAMES[:1])
def test_what_the_note_lists_is_what_differs_from_mha(
    fixed: tuple[ModuleType, str], pool_name: str
) -> None:
    # A value other than the latent is not stored (as compat(pool).set_kv_buffer, and SGLang's
    # MLA pool, do): the value read back is the key. That is the line the note lists.
    backend, _ = fixed
    pool = _pools()[pool_name]()
    loc, latent, _ = _inputs(seed=5)
    other = torch.randn_like(latent, dtype=torch.float32).to(torch.bfloat16)
    layer = SimpleNamespace(layer_id=pool.start_layer)
    backend.store(pool, layer, loc, latent, other)
    through_fix = pool.kv_buffer[0].clone()
    native = _pools()[pool_name]()
    kvcompat.compat(native).set_kv_buffer(layer, loc, latent, other)
    assert torch.equal(through_fix, native.kv_buffer[0])  # one call, one behaviour
    k, v = kvcompat.compat(pool).get_kv_buffer(pool.start_layer)
    assert torch.equal(v[loc], k[loc])


def _legacy(source: str) -> str:
    """What an older ``--fix`` wrote: the fallback through ``kvcompat.adapt`` (raw storage)."""
    legacy = source.replace("_kvcompat_compat_pools", "_kvcompat_adapters")
    legacy = legacy.replace("_kvcompat_compat_pool", "_kvcompat_adapter")
    legacy = legacy.replace("kvcompat.compat(pool)", "kvcompat.adapt(pool)")
    legacy = legacy.replace(
        "_kvcompat_adapter(pool).set_kv_buffer(layer, loc, cache_k, cache_v)",
        "_kvcompat_adapter(pool).write(layer.layer_id, loc, cache_k, cache_v)",
    )
    assert "compat(" not in legacy
    return legacy


def test_an_older_fix_returns_wrong_values_and_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "small_backend.py"
    path.write_text(BACKEND)
    main(["--fix", str(path)])
    capsys.readouterr()
    path.write_text(_legacy(path.read_text()))
    report = scan_paths([path])
    assert [(f.line, f.code) for f in report.findings] == [
        (report.findings[0].line, "KVC008"),
        (report.findings[1].line, "KVC009"),
        (report.findings[1].line + 1, "KVC009"),
    ]
    assert report.exit_code == 1
    assert "older `kvcompat scan --fix`" in report.findings[0].message
    # ...and the values it returns are wrong, where the rules say.
    backend = _import(path, "small_backend_legacy")
    pool = _pools()["DeepSeekV4SingleKVPool"]()
    assert backend.v_head_dim(pool) == PAGE_BYTES_V4
    loc, latent, q = _inputs(seed=1)
    # It passes v on to write(), which refuses a separate value on a single-KV pool, where
    # compat(pool).set_kv_buffer (and the current --fix) ignores it: two behaviours.
    with pytest.raises(kvcompat.WriteError, match="separate value tensor"):
        backend.store(pool, SimpleNamespace(layer_id=0), loc, latent, latent.clone())
    kvcompat.compat(pool).set_kv_buffer(SimpleNamespace(layer_id=0), loc, latent, latent.clone())
    with pytest.raises(IndexError):  # token ids index page rows (2 pages of 64 tokens)
        backend.attend(pool, 0, q, loc)
