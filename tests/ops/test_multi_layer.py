"""Many layers in one call: ``pool.plan(layers)`` / ``read_layers`` / ``write_layers``.

Every check compares against the single-layer calls the multi-layer ones replace, byte for
byte (``uint8`` views), on pools in the states production creates: ``start_layer > 0``,
layers asked for out of order, locations that cross pages in shuffled order, layers
allocated separately. The Triton path is checked against the same per-layer twin in the
interpreter tier (``tests/kernels/_interp_cases.py``) and on the GPU.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kvcompat
from kvcompat import LayerOutOfRangeError, LayoutError, WriteError
from kvcompat.testing import (
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
    ReferenceMLATokenToKVPool,
    reference_swa_pool,
)

KINDS = ("mha", "mha_fp8", "mla", "v4")
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _native(kind: str, device: str = "cpu") -> Any:
    if kind == "mha":
        return ReferenceMHATokenToKVPool(
            48, 16, torch.bfloat16, head_num=2, head_dim=8, layer_num=4, start_layer=3,
            device=device,
        )  # fmt: skip
    if kind == "mha_fp8":
        return ReferenceMHATokenToKVPool(
            48, 16, torch.float8_e4m3fn, head_num=2, head_dim=8, layer_num=3, start_layer=1,
            device=device,
        )  # fmt: skip
    if kind == "mla":
        return ReferenceMLATokenToKVPool(
            48, 16, torch.bfloat16, kv_lora_rank=32, qk_rope_head_dim=16, layer_num=3,
            start_layer=2, device=device,
        )  # fmt: skip
    return ReferenceDeepSeekV4SingleKVPool(
        size=192, page_size=64, layer_num=3, start_layer=5, device=device
    )


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _fill(pool: Any, seed: int) -> None:
    """Random bytes in every buffer (every byte value, so every code is read)."""
    g = torch.Generator().manual_seed(seed)
    for layer in pool.layer_ids:
        pair = pool.get_kv_buffer(layer, wait=False)
        for buf in {id(pair.key): pair.key, id(pair.value): pair.value}.values():
            raw = buf.view(torch.uint8)
            raw.copy_(torch.randint(0, 256, raw.shape, generator=g).to(torch.uint8).to(raw.device))
            if buf.dtype.is_floating_point and buf.element_size() > 1:
                buf.nan_to_num_(0.0, 0.0, 0.0)  # finite rows: reads compare NaN-free


def _values(pool: Any, layers: tuple[int, ...], n: int, seed: int, role: str = "key") -> Any:
    """Random ``[layers, n, heads, head_dim]`` bf16 values on the pool's device."""
    g = torch.Generator().manual_seed(seed)
    spec = getattr(pool.layout(layers[0]), role)
    if spec is None:
        return None
    heads = spec.heads
    x = torch.randn(len(layers), n, heads, spec.dim // heads, generator=g)
    return x.to(torch.bfloat16).to(pool.device)


def _shuffled_loc(pool: Any, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(pool.size, generator=g)[:n].to(pool.device)


def _snapshot(pool: Any) -> list[torch.Tensor]:
    out = []
    for layer in pool.layer_ids:
        pair = pool.get_kv_buffer(layer, wait=False)
        out.append(_bytes(pair.key).clone())
        out.append(_bytes(pair.value).clone())
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
def test_read_layers_equals_one_read_per_layer(kind: str, device: str) -> None:
    pool = kvcompat.adapt(_native(kind, device))
    _fill(pool, 1)
    layers = tuple(reversed(pool.layer_ids))  # out of order
    loc = _shuffled_loc(pool, 20, 2)
    loc = torch.cat((loc, loc[:3]))  # reads may repeat
    got = pool.read_layers(layers, loc)
    expect = torch.stack([pool.read(layer, loc) for layer in layers])
    assert got.shape == expect.shape
    assert torch.equal(_bytes(got), _bytes(expect))
    k, v = pool.plan(layers).read_kv(loc)
    for i, layer in enumerate(layers):
        pair = pool.read_kv(layer, loc)
        assert torch.equal(_bytes(k[i]), _bytes(pair.key))
        assert torch.equal(_bytes(v[i]), _bytes(pair.value))
    out = torch.empty_like(expect)
    assert pool.read_layers(layers, loc, out=out) is out
    assert torch.equal(_bytes(out), _bytes(expect))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
def test_write_layers_equals_one_write_per_layer(kind: str, device: str) -> None:
    ours, theirs = kvcompat.adapt(_native(kind, device)), kvcompat.adapt(_native(kind, device))
    _fill(ours, 3)
    _fill(theirs, 3)
    layers = (ours.layer_ids[-1], ours.layer_ids[0])
    loc = _shuffled_loc(ours, 17, 4)
    keys = _values(ours, layers, 17, 5)
    values = _values(ours, layers, 17, 6, role="value")
    ours.write_layers(layers, loc, keys, values)
    for i, layer in enumerate(layers):
        theirs.write(layer, loc, keys[i], None if values is None else values[i])
    for a, b in zip(_snapshot(ours), _snapshot(theirs), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
def test_a_failing_multi_layer_write_changes_nothing(kind: str, device: str) -> None:
    pool = kvcompat.adapt(_native(kind, device))
    _fill(pool, 7)
    layers = pool.layer_ids
    loc = _shuffled_loc(pool, 9, 8)
    keys = _values(pool, layers, 9, 9)
    values = _values(pool, layers, 9, 10, role="value")
    before = _snapshot(pool)
    bad_loc = torch.cat((loc, loc[:1]))  # a duplicate location
    longer = None if values is None else torch.cat((values, values[:, :1]), 1)
    with pytest.raises(WriteError, match=r"duplicate|distinct"):
        pool.write_layers(layers, bad_loc, torch.cat((keys, keys[:, :1]), 1), longer)
    poisoned = keys.clone()
    poisoned[-1, -1, 0, 0] = float("nan")  # the last layer's last value
    with pytest.raises(WriteError, match=r"NaN|finite"):
        pool.write_layers(layers, loc, poisoned, values)
    with pytest.raises(WriteError, match="one block per layer"):
        pool.write_layers(layers, loc, keys[:-1], values)
    if values is not None:
        with pytest.raises(WriteError, match="no values"):
            pool.write_layers(layers, loc, keys)
    for a, b in zip(_snapshot(pool), before, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("kind", KINDS)
def test_a_fault_while_storing_puts_every_layer_back(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = kvcompat.adapt(_native(kind))
    _fill(pool, 11)
    layers = pool.layer_ids
    loc = _shuffled_loc(pool, 9, 12)
    keys = _values(pool, layers, 9, 13)
    values = _values(pool, layers, 9, 14, role="value")
    before = _snapshot(pool)
    real = torch.Tensor.index_copy_
    calls = {"n": 0}

    def flaky(self: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:  # after the first store has landed
            msg = "injected fault mid-store"
            raise RuntimeError(msg)
        return real(self, dim, index, source)

    monkeypatch.setattr(torch.Tensor, "index_copy_", flaky)
    with pytest.raises(RuntimeError, match="injected"):
        pool.write_layers(layers, loc, keys, values, impl="torch")
    monkeypatch.undo()
    assert calls["n"] >= 2  # the fault did hit after a store had landed
    for a, b in zip(_snapshot(pool), before, strict=True):
        assert torch.equal(a, b)


def test_bad_layer_sets_are_refused_with_what_was_received() -> None:
    pool = kvcompat.adapt(_native("mha"))
    with pytest.raises(LayerOutOfRangeError, match=r"layers \[0\] are not served"):
        pool.plan([0, 3])
    with pytest.raises(LayoutError, match="distinct"):
        pool.plan([3, 3])
    with pytest.raises(LayoutError, match="integer"):
        pool.plan(["3"])  # type: ignore[list-item]
    with pytest.raises(LayoutError, match="sequence of layer ids"):
        pool.plan(3)  # type: ignore[arg-type]
    with pytest.raises(LayoutError, match="no layer ids"):
        pool.plan([])


def test_a_composite_plans_across_components_with_one_row_of_locations_per_layer() -> None:
    pool = kvcompat.adapt(reference_swa_pool())
    twin = kvcompat.adapt(reference_swa_pool())
    by_part: dict[str, list[int]] = {}
    for layer in pool.layer_ids:
        by_part.setdefault(str(pool.component_for(layer)), []).append(layer)
    assert len(by_part) == 2
    for part, layers in by_part.items():  # within one component: one space, 1-D loc
        loc = torch.tensor([1, 5])
        got = pool.plan(layers).read(loc)
        for i, layer in enumerate(layers):
            assert torch.equal(_bytes(got[i]), _bytes(pool.read(layer, loc))), part
    step = pool.plan()  # across components: every layer, still one launch
    assert step.spans_components
    with pytest.raises(LayoutError, match="separate spaces"):
        step.read(torch.tensor([1, 5]))
    with pytest.raises(WriteError, match="separate spaces"):
        step.write(torch.tensor([1]), torch.ones(len(step.layers), 1, 2, 8))
    loc = torch.stack([torch.tensor([i + 1, 2 * i + 4]) for i in range(len(step.layers))])
    keys = torch.randn(len(step.layers), 2, 2, 8).to(torch.bfloat16)
    values = torch.randn(len(step.layers), 2, 2, 8).to(torch.bfloat16)
    step.write(loc, keys, values)
    for i, layer in enumerate(step.layers):
        twin.write(layer, loc[i], keys[i], values[i])
    for layer in pool.layer_ids:
        for get in ("get_key_buffer", "get_value_buffer"):
            mine = getattr(pool, get)(layer, wait=False)
            theirs = getattr(twin, get)(layer, wait=False)
            assert torch.equal(_bytes(mine), _bytes(theirs)), (layer, get)
    got = step.read(loc)
    for i, layer in enumerate(step.layers):
        assert torch.equal(_bytes(got[i]), _bytes(pool.read(layer, loc[i])))


def test_a_plan_follows_buffers_the_pool_replaces() -> None:
    native = _native("mha")
    pool = kvcompat.adapt(native)
    plan = pool.plan()
    loc = torch.tensor([4, 2])
    plan.read(loc)
    fresh = torch.full_like(native.k_buffer[1], 3.0)
    native.k_buffer[1] = fresh  # SGLang replaces buffers when it resizes
    got = plan.read(loc)
    assert bool((got[1] == 3.0).all())
    assert not bool((got[0] == 3.0).all())


def test_the_plan_is_kept_and_repr_says_what_it_moves() -> None:
    pool = kvcompat.adapt(_native("mha"))
    assert pool.plan([4, 3]) is pool.plan([4, 3])
    assert "layers=[4, 3]" in repr(pool.plan([4, 3]))
    assert "key, value" in repr(pool.plan([4, 3]))


@settings(max_examples=25, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    data=st.data(),
)
def test_multi_layer_round_trip_touches_only_the_written_tokens(kind: str, data: Any) -> None:
    pool = kvcompat.adapt(_native(kind))
    _fill(pool, 17)
    layers = tuple(data.draw(st.permutations(pool.layer_ids)))[
        : data.draw(st.integers(1, len(pool.layer_ids)))
    ]
    n = data.draw(st.integers(0, 12))
    loc = torch.tensor(
        data.draw(st.lists(st.integers(0, pool.size - 1), min_size=n, max_size=n, unique=True)),
        dtype=torch.int64,
    )
    keys = _values(pool, layers, n, data.draw(st.integers(0, 99)))
    values = _values(pool, layers, n, 1, role="value")
    other = tuple(layer for layer in pool.layer_ids if layer not in layers)
    before = {layer: pool.read_layers([layer], torch.arange(pool.size)) for layer in other}
    untouched = torch.ones(pool.size, dtype=torch.bool)
    untouched[loc] = False
    rest = torch.arange(pool.size)[untouched]
    kept = pool.read_layers(layers, rest)
    pool.write_layers(layers, loc, keys, values)
    # The written tokens read back as one single-layer write of them would.
    twin = kvcompat.adapt(_native(kind))
    for i, layer in enumerate(layers):
        twin.write(layer, loc, keys[i], None if values is None else values[i])
    assert torch.equal(_bytes(pool.read_layers(layers, loc)), _bytes(twin.read_layers(layers, loc)))
    assert torch.equal(_bytes(pool.read_layers(layers, rest)), _bytes(kept))
    for layer, old in before.items():
        assert torch.equal(_bytes(pool.read_layers([layer], torch.arange(pool.size))), _bytes(old))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
def test_each_layer_may_take_its_own_locations(kind: str, device: str) -> None:
    ours, theirs = kvcompat.adapt(_native(kind, device)), kvcompat.adapt(_native(kind, device))
    _fill(ours, 21)
    _fill(theirs, 21)
    layers = tuple(reversed(ours.layer_ids))
    loc = torch.stack([_shuffled_loc(ours, 6, 30 + i) for i in range(len(layers))])
    got = ours.read_layers(layers, loc)
    for i, layer in enumerate(layers):
        assert torch.equal(_bytes(got[i]), _bytes(ours.read(layer, loc[i])))
    keys = _values(ours, layers, 6, 40)
    values = _values(ours, layers, 6, 41, role="value")
    ours.write_layers(layers, loc, keys, values)
    for i, layer in enumerate(layers):
        theirs.write(layer, loc[i], keys[i], None if values is None else values[i])
    for a, b in zip(_snapshot(ours), _snapshot(theirs), strict=True):
        assert torch.equal(a, b)


def test_per_layer_locations_are_checked_row_by_row() -> None:
    pool = kvcompat.adapt(_native("v4"))
    layers = pool.layer_ids
    before = _snapshot(pool)
    keys = _values(pool, layers, 3, 1)
    across = torch.tensor([[1, 2, 3]] * len(layers))  # the same slots on every layer: fine
    pool.write_layers(layers, across, keys)
    before = _snapshot(pool)
    repeated = across.clone()
    repeated[1, 2] = 1  # layer 1 names slot 1 twice
    with pytest.raises(WriteError, match="within row 1"):
        pool.write_layers(layers, repeated, keys)
    with pytest.raises(WriteError, match=r"one row per layer"):
        pool.write_layers(layers, across[:2], keys)
    with pytest.raises(LayoutError, match="outside"):
        pool.read_layers(layers, across + 10**6)
    for a, b in zip(_snapshot(pool), before, strict=True):
        assert torch.equal(a, b)


@settings(max_examples=30, deadline=None)
@given(
    width=st.sampled_from([1, 2, 6, 37, 40, 64]),
    pad=st.sampled_from([0, 3, 8, 24]),
    offset=st.sampled_from([0, 1, 8]),
    data=st.data(),
)
def test_raw_row_moves_equal_byte_indexing_on_any_alignment(
    width: int, pad: int, offset: int, data: Any
) -> None:
    from kvcompat._ops import gather_rows_layers, scatter_rows_layers

    g = torch.Generator().manual_seed(width + pad + offset)
    pitch = width + pad
    backing = [torch.randint(0, 256, (8 * pitch + offset,), generator=g).to(torch.uint8)
               for _ in range(3)]  # fmt: skip
    views = [b[offset:].as_strided((8, width), (pitch, 1)) for b in backing]
    rows = torch.tensor(data.draw(st.lists(st.integers(0, 7), min_size=0, max_size=10)))
    got = gather_rows_layers(views, rows.long(), impl="torch")
    for i, view in enumerate(views):
        assert torch.equal(got[i], view[rows.long()])
    where = torch.tensor(data.draw(st.lists(st.integers(0, 7), max_size=5, unique=True)))
    payload = torch.randint(0, 256, (3, where.numel(), width), generator=g).to(torch.uint8)
    expect = [b.clone() for b in backing]
    for i, b in enumerate(expect):
        b[offset:].as_strided((8, width), (pitch, 1))[where.long()] = payload[i]
    scatter_rows_layers(views, where.long(), payload, impl="torch")
    for b, e in zip(backing, expect, strict=True):
        assert torch.equal(b, e)


@settings(max_examples=30, deadline=None)
@given(
    width=st.sampled_from([1, 2, 6, 40, 64]),
    pads=st.tuples(st.sampled_from([0, 3, 8]), st.sampled_from([0, 5, 16])),
    data=st.data(),
)
def test_pool_to_pool_moves_copy_the_named_rows_and_nothing_else(
    width: int, pads: tuple[int, int], data: Any
) -> None:
    from kvcompat._ops import move_rows_layers

    g = torch.Generator().manual_seed(width + 7 * pads[0] + pads[1])
    src_pitch, dst_pitch = width + pads[0], width + pads[1]
    src_back = [torch.randint(0, 256, (8 * src_pitch,), generator=g).to(torch.uint8)
                for _ in range(2)]  # fmt: skip
    dst_back = [torch.randint(0, 256, (6 * dst_pitch,), generator=g).to(torch.uint8)
                for _ in range(2)]  # fmt: skip
    srcs = [b.as_strided((8, width), (src_pitch, 1)) for b in src_back]
    dsts = [b.as_strided((6, width), (dst_pitch, 1)) for b in dst_back]
    put = data.draw(st.lists(st.integers(0, 5), max_size=6, unique=True))
    take = data.draw(st.lists(st.integers(0, 7), min_size=len(put), max_size=len(put)))
    sources = [b.clone() for b in src_back]
    expect = [b.clone() for b in dst_back]
    for i, e in enumerate(expect):
        e.as_strided((6, width), (dst_pitch, 1))[torch.tensor(put, dtype=torch.long)] = srcs[i][
            torch.tensor(take, dtype=torch.long)
        ]
    move_rows_layers(
        srcs,
        torch.tensor(take, dtype=torch.long),
        dsts,
        torch.tensor(put, dtype=torch.long),
        impl="torch",
    )
    for i in range(2):
        assert torch.equal(dst_back[i], expect[i])
        assert torch.equal(src_back[i], sources[i])


def test_pool_to_pool_moves_refuse_bad_rows_and_write_nothing() -> None:
    from kvcompat._ops import move_rows_layers

    srcs = [torch.arange(12, dtype=torch.uint8).view(4, 3) for _ in range(2)]
    dsts = [torch.zeros(5, 3, dtype=torch.uint8) for _ in range(2)]
    with pytest.raises(WriteError, match=r"duplicate|repeat|distinct"):
        move_rows_layers(srcs, torch.tensor([0, 1]), dsts, torch.tensor([2, 2]))
    with pytest.raises(WriteError, match=r"outside|range"):
        move_rows_layers(srcs, torch.tensor([4]), dsts, torch.tensor([0]))
    with pytest.raises(WriteError, match="as many rows"):
        move_rows_layers(srcs, torch.tensor([0, 1]), dsts, torch.tensor([0]))
    with pytest.raises(LayoutError, match="pair layer for layer"):
        move_rows_layers(srcs[:1], torch.tensor([0]), dsts, torch.tensor([0]))
    with pytest.raises(LayoutError, match="pair layer for layer"):
        move_rows_layers(srcs, torch.tensor([0]), [d[:, :2] for d in dsts], torch.tensor([0]))
    assert all(not d.any() for d in dsts)


def test_pool_to_pool_moves_within_one_pool_read_every_row_before_writing() -> None:
    from kvcompat._ops import move_rows_layers

    pages = [torch.arange(8, dtype=torch.uint8).view(4, 2) + 10 * i for i in range(2)]
    before = [p.clone() for p in pages]
    move_rows_layers(pages, torch.tensor([0, 1]), pages, torch.tensor([1, 2]))  # a shift
    for p, b in zip(pages, before, strict=True):
        assert torch.equal(p[1:3], b[0:2])
        assert torch.equal(p[0], b[0])
        assert torch.equal(p[3], b[3])


@settings(max_examples=60, deadline=None)
@given(
    spans=st.lists(
        st.tuples(st.integers(0, 60), st.integers(1, 12), st.booleans()), min_size=1, max_size=8
    )
)
def test_the_overlap_sweep_agrees_with_checking_every_pair(
    spans: list[tuple[int, int, bool]],
) -> None:
    from kvcompat._ops import _any_overlap
    from kvcompat.layouts._validate import overlaps

    backing = torch.zeros(80, dtype=torch.uint8)
    views = [(backing[lo : lo + n], side) for lo, n, side in spans]
    a = [v for v, side in views if side]
    b = [v for v, side in views if not side]
    assert _any_overlap(a, b) == any(overlaps(x, y) for x in a for y in b)


_VIEW = st.tuples(st.integers(0, 9), st.integers(1, 10), st.integers(0, 7), st.integers(1, 8))


@settings(max_examples=80, deadline=None)
@given(bufs=st.lists(_VIEW, min_size=1, max_size=6), values=_VIEW)
def test_a_plans_alias_check_agrees_with_checking_every_buffer(
    bufs: list[tuple[int, int, int, int]], values: tuple[int, int, int, int]
) -> None:
    """``LayersPlan.touches`` (merged ranges, one bisect) = ``overlaps`` with each buffer,
    for row slices and interleaved column slices (strided views) of one storage."""
    from kvcompat._ops import LayersPlan
    from kvcompat.layouts import mha_layout
    from kvcompat.layouts._validate import overlaps

    backing = torch.zeros(10, 8, dtype=torch.uint8)

    def view(rows: int, count: int, col: int, width: int) -> torch.Tensor:
        return backing[rows : rows + count, col : col + width]

    layers = tuple(view(*b) for b in bufs)
    plan = LayersPlan(
        mha_layout(1, 8, torch.float8_e4m3fn), layers, 1, (1,) * len(layers), fnuz=False
    )
    tensor = view(*values)
    expected = any(overlaps(tensor, buf) for buf in layers)
    assert plan.touches(tensor) == expected
    assert plan.touches(tensor) == expected  # the merged ranges, once made, agree too
    assert not plan.touches(tensor.clone())


def test_a_multi_layer_write_of_a_layers_own_rows_stores_them_as_they_were() -> None:
    """Values that are a view of the pool (a "move tokens" call) are copied before the
    store overwrites them: the result equals writing a copy taken before the call."""
    from kvcompat._ops import _unaliased, plan_layers, write_layers
    from kvcompat.layouts import mha_layout

    spec = mha_layout(1, 4, torch.float32)
    bufs = [torch.arange(32.0).view(8, 1, 4) + 100 * i for i in range(3)]
    expected = [b.clone() for b in bufs]
    loc = torch.tensor([1, 2, 3])
    backing = torch.stack(bufs)  # the values: rows 0-2 of every layer, read from the pool
    values = backing[:, 0:3]
    for layer in range(3):
        expected[layer][loc] = values[layer].clone()
    bufs = list(backing.unbind(0))  # the pool's buffers are views of the same memory
    plan = plan_layers(spec, bufs, 1)
    apart = values.clone()
    assert _unaliased(apart, [plan]) is apart  # values elsewhere are passed on as they are
    copied = _unaliased(values, [plan])  # what a kernel reads while it writes the pool
    assert copied.data_ptr() != values.data_ptr()
    assert torch.equal(copied, values)
    write_layers(plan, loc, values, impl="torch")
    for got, want in zip(bufs, expected, strict=True):
        assert torch.equal(got, want)
