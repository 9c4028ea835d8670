"""Every component of SGLang's DeepSeek-V4 pool in one call: ``plan_components``.

SGLang's own ``DeepSeekV4TokenToKVPool`` (a pipeline stage starting at layer 3, so every
component's layer ids are absolute and its buffer slots are not its ids) keeps its
sliding-window pages, c4 and c128 compressed pages and c4 indexer keys in four components
of three page sizes and four token spaces. One plan reads and writes all of them; it
must give exactly what each component's single-layer calls give, change nothing but the
written tokens, and refuse bad input with nothing written. The CPU runs the torch twin;
the one-launch kernel path is compared with the twin in the interpreter and GPU tiers.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _sglang import builders
from transfer._helpers import randomise, snapshot

import kvcompat
from kvcompat import LayoutError, WriteError
from kvcompat.layouts._validate import check_buffer

pytestmark = [
    pytest.mark.sglang,
    pytest.mark.filterwarnings("ignore:Only CUDA:UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

RATIOS = [0, 0, 0, 4, 128, 4, 128, 4, 0]  # the model's; the stage is layers 3..8


def _pool(seed: int) -> Any:
    try:
        native = builders.build_dsv4_token_pool(compression_ratios=RATIOS, start_layer=3)
    except builders.ReleaseLacks as exc:
        pytest.skip(str(exc))
    randomise(native, seed)
    return native


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _capacity(part: Any) -> int:
    """The tokens (or states) a component's first layer holds."""
    layer = part.layer_ids[0]
    return check_buffer(part.layout(layer).key, part.get_key_buffer(layer), part.page_size)


def _locs(pool: Any, seed: int) -> dict[str, torch.Tensor]:
    """Distinct locations in each component's own space, shuffled, of different counts."""
    g = torch.Generator().manual_seed(seed)
    found = {}
    for index, (name, part) in enumerate(pool.components.items()):
        capacity = _capacity(part)
        found[name] = torch.randperm(capacity, generator=g)[: 3 + 2 * index]
    return found


def test_one_call_reads_what_each_components_layers_read() -> None:
    pool = kvcompat.adapt(_pool(5))
    step = pool.plan_components()
    assert step.components == tuple(pool.components)
    assert {"swa", "c4", "c128", "c4_indexer"} <= set(step.components)
    assert step.layouts.count("v4") == 1  # sliding-window, c4 and c128: one launch group
    assert step.layers["c4"] == (3, 5, 7)
    locs = _locs(pool, 6)
    got = step.read(locs)
    for name, part in pool.components.items():
        assert got[name].shape[:2] == (len(part.layer_ids), locs[name].numel())
        for i, layer in enumerate(part.layer_ids):
            want = part.read(layer, locs[name])
            assert torch.equal(_bits(got[name][i]), _bits(want)), (name, layer)


def test_one_call_writes_what_each_components_layers_write() -> None:
    mine, theirs = _pool(7), _pool(7)
    pool, twin = kvcompat.adapt(mine), kvcompat.adapt(theirs)
    locs = _locs(pool, 8)
    g = torch.Generator().manual_seed(9)
    keys = {}
    for name, part in pool.components.items():
        spec = part.layout(part.layer_ids[0]).key
        shape = (len(part.layer_ids), locs[name].numel(), spec.heads, spec.dim // spec.heads)
        keys[name] = torch.randn(*shape, generator=g).to(torch.bfloat16)
    before = snapshot(mine)
    pool.plan_components().write(locs, keys)
    for name, part in twin.components.items():
        for i, layer in enumerate(part.layer_ids):
            part.write(layer, locs[name], keys[name][i])
    after, want = snapshot(mine), snapshot(theirs)
    changed = 0
    for label in want:
        assert torch.equal(after[label], want[label]), label
        changed += int((after[label] != before[label]).sum())
    assert changed > 0


def test_bad_input_is_refused_and_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    native = _pool(11)
    pool = kvcompat.adapt(native)
    step = pool.plan_components()
    locs = _locs(pool, 12)
    keys = {
        name: torch.ones(len(part.layer_ids), locs[name].numel(), 1, part.layout(
            part.layer_ids[0]).key.dim, dtype=torch.bfloat16)
        for name, part in pool.components.items()
    }  # fmt: skip
    before = snapshot(native)
    with pytest.raises(LayoutError, match="must map every planned component"):
        step.read({"swa": locs["swa"]})
    last = step.components[-1]
    capacity = _capacity(pool.components[last])
    bad = dict(locs, **{last: torch.tensor([0, capacity])})  # one out of range, last component
    with pytest.raises(WriteError, match=rf"'{last}' component's key: .*{capacity}"):
        step.write(bad, keys)
    with pytest.raises(LayoutError, match=rf"'{last}' component's key: .*{capacity}"):
        step.read(bad)
    with pytest.raises(WriteError, match="keeps no separate values"):
        step.write(locs, keys, {"swa": torch.zeros_like(keys["swa"])})
    with pytest.raises(WriteError, match="the 'c4' component's keys must hold one block per"):
        step.write(locs, dict(keys, c4=keys["c4"][:, :1]))
    real = torch.Tensor.index_copy_
    calls = {"n": 0, "fail": 0}

    def flaky(self: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor) -> Any:
        calls["n"] += 1
        if calls["n"] == calls["fail"]:
            msg = "injected fault mid-store"
            raise RuntimeError(msg)
        return real(self, dim, index, source)

    monkeypatch.setattr(torch.Tensor, "index_copy_", flaky)
    kvcompat.adapt(_pool(11)).plan_components().write(locs, keys, impl="torch")  # counts
    calls["n"], calls["fail"] = 0, calls["n"]  # the last store: every other one has landed
    with pytest.raises(RuntimeError, match="injected"):
        step.write(locs, keys, impl="torch")
    monkeypatch.undo()
    assert calls["n"] >= calls["fail"] > len(step.components)  # (restoring stores too)
    after = snapshot(native)
    for label, tensor in before.items():
        assert torch.equal(after[label], tensor), label


def test_components_are_named_and_distinct() -> None:
    pool = kvcompat.adapt(_pool(13))
    with pytest.raises(LayoutError, match="distinct names"):
        pool.plan_components(["swa", "swa"])
    with pytest.raises(LayoutError, match="distinct names"):
        pool.plan_components(["c8"])
    with pytest.raises(LayoutError, match="sequence of component names"):
        pool.plan_components("swa")  # type: ignore[arg-type]
    assert pool.plan_components(["c4", "swa"]).components == ("c4", "swa")
