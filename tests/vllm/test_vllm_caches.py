"""kvcompat on the caches vLLM's own planner and allocator build (every served case).

Each case is ``format@layout`` (``tests/_vllm/builders.py: SERVED``): the views are what
``register_kv_caches`` receives — strided views of one shared storage under 0.33 and 0.34's
non-extensible cache, one storage per layer under 0.34's extensible cache — with layer ids
that do not start at 0. Slots are vLLM's: ``block * N + offset``; the tests address blocks
out of order.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kvcompat
from kvcompat.inspection import describe, memory_report, transfer_descriptors

pytest.importorskip(
    "vllm.v1.kv_cache_interface",
    reason="vLLM is not installed: `make vllm` (tests/vllm_matrix.py) runs this tier",
)

from tests._vllm import builders

SERVED = builders.SERVED


def _adapt(case: str) -> tuple[builders.Built, kvcompat.KVPoolProtocol]:
    built = builders.build(case)
    return built, kvcompat.adapt(built.kv_caches, config=built.config)


def _all_leaves(pool: kvcompat.KVPoolProtocol) -> list[kvcompat.KVPoolProtocol]:
    return list(pool.components.values()) or [pool]


def _leaves(pool: kvcompat.KVPoolProtocol) -> list[kvcompat.KVPoolProtocol]:
    """The components with a token codec (DeepSeek-V4's compressor state has none)."""
    return [part for part in _all_leaves(pool) if part.name != "state"]


def _fill(built: builders.Built, seed: int = 0) -> None:
    """Random finite contents in every registered view (bf16 stays finite: small normals)."""
    generator = torch.Generator().manual_seed(seed)
    for view in built.kv_caches.values():
        if view.dtype.is_floating_point:
            view.copy_(torch.randn(view.shape, generator=generator).to(view.dtype))
        else:
            view.copy_(torch.randint(0, 256, view.shape, generator=generator).to(view.dtype))


def _storages(built: builders.Built) -> dict[int, torch.Tensor]:
    """Storage pointer -> a uint8 tensor over the whole storage (for byte comparisons)."""
    found: dict[int, torch.Tensor] = {}
    for view in built.kv_caches.values():
        storage = view.untyped_storage()
        found.setdefault(storage.data_ptr(), torch.empty(0, dtype=torch.uint8).set_(storage))
    return found


def _snapshot(built: builders.Built) -> dict[int, torch.Tensor]:
    return {ptr: raw.clone() for ptr, raw in _storages(built).items()}


EXPECTED = {
    "mha": ("split", {}),
    "mha-swa": ("composite", {"full": "split", "swa": "split"}),
    "mla": ("latent", {}),
    "swa-mla": ("latent", {}),
    "fp8_ds_mla-656": ("latent", {}),
    "fp8_ds_mla-528": ("latent", {}),
    "dsv4": (
        "composite",
        {"swa": "single_kv", "c4": "single_kv", "indexer": "key_only", "state": "key_only"},
    ),
}


@pytest.mark.parametrize("case", SERVED)
def test_adapt_recognises_every_served_case(case: str) -> None:
    built, pool = _adapt(case)
    kind, parts = EXPECTED[case.split("@", maxsplit=1)[0]]
    assert pool.kind.value == kind
    assert {name: part.kind.value for name, part in pool.components.items()} == parts
    ids = sorted({int(name.split(".")[2]) for name in built.kv_caches})
    assert list(pool.layer_ids) == ids
    assert ids[0] > 0
    names = pool.layer_names  # type: ignore[attr-defined]
    assert sorted(n for found in names.values() for n in found) == sorted(built.kv_caches)
    if case.startswith("dsv4"):
        assert names[2] == (
            "model.layers.2.self_attn.swa_cache",
            "model.layers.2.self_attn.attn",
            "model.layers.2.self_attn.attn.indexer.k_cache",
            "model.layers.2.self_attn.attn.compressor",
        )
        state = pool.components["state"]
        with pytest.raises(kvcompat.LayoutError, match="no token codec"):
            state.read(2, torch.tensor([0]))
        with pytest.raises(kvcompat.LayoutError, match="no token codec"):
            state.write(2, torch.tensor([0]), torch.zeros(1, 1, 2048))
        compressor = built.kv_caches["model.layers.2.self_attn.attn.compressor"]
        assert state.get_key_buffer(2).data_ptr() == compressor.data_ptr()
        assert not kvcompat.is_single_kv_pool(pool)
        assert kvcompat.is_single_kv_pool(pool.components["c4"])
        assert pool.component_for(2) == "swa"


@pytest.mark.parametrize("case", SERVED)
def test_getters_view_the_registered_storage(case: str) -> None:
    built, pool = _adapt(case)
    for part in _all_leaves(pool):
        for layer in part.layer_ids:
            name = part.layer_names[layer][0]  # type: ignore[attr-defined]
            view = built.kv_caches[name]
            key = part.get_key_buffer(layer)
            assert key.untyped_storage().data_ptr() == view.untyped_storage().data_ptr()
            assert key.data_ptr() == view.data_ptr()
            corner = (0,) * key.dim()
            key[corner] = 7  # written through the key buffer: visible in the registered view
            assert view.view(key.dtype)[0, 0, 0, 0] == 7
            if part.kind.has_values:
                value = part.get_value_buffer(layer)
                assert value.untyped_storage().data_ptr() == view.untyped_storage().data_ptr()


def _slots(part: kvcompat.KVPoolProtocol, data: st.DataObject, *, most: int = 12) -> torch.Tensor:
    blocks = data.draw(st.permutations(range(builders.BLOCKS)))[: data.draw(st.integers(1, 3))]
    states = part.page_size
    slots = [b * states + s for b in blocks for s in range(states)]
    chosen = data.draw(st.lists(st.sampled_from(slots), min_size=1, max_size=most, unique=True))
    return torch.tensor(chosen, dtype=torch.int64)


def _values(part: kvcompat.KVPoolProtocol, layer: int, n: int, seed: int) -> torch.Tensor:
    spec = part.layout(layer).key
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, spec.heads, spec.dim // spec.heads, generator=generator).to(
        torch.bfloat16
    )


@pytest.mark.parametrize("case", SERVED)
@settings(max_examples=8)
@given(data=st.data())
def test_write_changes_only_the_written_slots_and_reads_back(
    case: str, data: st.DataObject
) -> None:
    built, pool = _adapt(case)
    _fill(built)
    for part in _leaves(pool):
        layer = data.draw(st.sampled_from(part.layer_ids))
        loc = _slots(part, data)
        others = torch.tensor(
            [s for s in range(part.size) if s not in set(loc.tolist())], dtype=torch.int64
        )
        before_other = part.read(layer, others)
        before = _snapshot(built)
        key = _values(part, layer, loc.numel(), data.draw(st.integers(0, 99)))
        value = None
        if part.kind is kvcompat.PoolKind.SPLIT:
            value = _values(part, layer, loc.numel(), 1000)
        part.write(layer, loc, key, value)
        back = part.read_kv(layer, loc) if value is not None else None
        if not part.layout(layer).key.name.startswith(("v4", "dsa", "dsv4")):
            got = part.read(layer, loc)
            assert torch.equal(got.view(torch.int16), key.view(got.shape).view(torch.int16))
            if back is not None:
                assert torch.equal(back.value, value)
        else:  # packed: what was stored decodes to within the format's rounding
            got = part.read(layer, loc).float()
            ref = key.float().view(got.shape)
            scale = ref.abs().amax(dim=-1, keepdim=True).clamp_min(1e-3)
            assert ((got - ref).abs() <= scale / 4).all()
        # Nothing else changed: the other slots read the same, and the changed bytes all
        # lie inside the written slots' blocks of this layer.
        assert torch.equal(
            part.read(layer, others).view(torch.uint8), before_other.view(torch.uint8)
        )
        touched = set((loc // part.page_size).tolist())
        name = part.layer_names[layer][0]  # type: ignore[attr-defined]
        view = built.kv_caches[name]
        allowed = _block_bytes(view, touched, part.layout(layer).key, part.page_size)
        for ptr, raw in _storages(built).items():
            changed = (raw != before[ptr]).nonzero().flatten()
            if ptr == view.untyped_storage().data_ptr():
                assert set(changed.tolist()) <= allowed
            else:
                assert changed.numel() == 0


def _block_bytes(view: torch.Tensor, blocks: set[int], spec: object, states: int) -> set[int]:
    """Storage byte offsets of the pages of ``blocks`` in this layer (codec page included)."""
    size = view.element_size()
    start = view.storage_offset() * size
    per_block = view[0].numel() * size
    page = max(per_block, spec.page_bytes(states) if spec.paged else 0)  # type: ignore[attr-defined]
    found: set[int] = set()
    for block in blocks:
        first = start + block * view.stride(0) * size
        found.update(range(first, first + page))
    return found


@pytest.mark.parametrize("case", SERVED)
def test_bad_writes_change_nothing(case: str) -> None:
    built, pool = _adapt(case)
    _fill(built)
    part = _leaves(pool)[0]
    layer = part.layer_ids[-1]
    before = _snapshot(built)
    n = 2
    key = _values(part, layer, n, 0)
    value = _values(part, layer, n, 1) if part.kind is kvcompat.PoolKind.SPLIT else None
    bad_key = key.clone()
    bad_key[1, 0, 0] = float("nan")
    capacity = part.size
    for loc, keys, error in (
        (torch.tensor([capacity, 0]), key, kvcompat.WriteError),  # out of range
        (torch.tensor([3, 3]), key, kvcompat.WriteError),  # repeated
        (torch.tensor([1, 2]), bad_key, kvcompat.WriteError),  # NaN
        (torch.tensor([1, 2]), key[:1], kvcompat.WriteError),  # shape
    ):
        with pytest.raises(error) as info:
            part.write(layer, loc, keys, value if value is None else value[: keys.shape[0]])
        assert "Hint" in str(info.value) or "received" in str(info.value)
        for ptr, raw in _storages(built).items():
            assert torch.equal(raw, before[ptr])
    with pytest.raises(kvcompat.LayerOutOfRangeError, match="valid layer ids"):
        part.read(0, torch.tensor([0]))


def _intervals(descriptors: tuple[object, ...]) -> list[tuple[int, int]]:
    return sorted((d.ptr, d.ptr + d.length) for d in descriptors)  # type: ignore[attr-defined]


@pytest.mark.parametrize("case", SERVED)
def test_descriptors_cover_every_registered_byte_once(case: str) -> None:
    built, pool = _adapt(case)
    runs = _intervals(transfer_descriptors(pool))
    for (_, end), (start, _) in itertools.pairwise(runs):
        assert end <= start  # no byte twice
    expected: set[tuple[int, int]] = set()
    for view in built.kv_caches.values():
        per_block = view[0].numel() * view.element_size()
        for block in range(view.shape[0]):
            first = view.data_ptr() + block * view.stride(0) * view.element_size()
            expected.add((first, first + per_block))
    merged: list[list[int]] = []  # the union of the views' bytes (groups alias each other)
    for start, end in sorted(expected):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    got: list[list[int]] = []
    for start, end in runs:
        if got and got[-1][1] == start:
            got[-1][1] = end
        else:
            got.append([start, end])
    if case.split("@")[1].startswith("LB"):
        assert got == merged  # layer-outer: exactly the views' bytes
    else:  # block-outer: whole blocks, every view's bytes inside, nothing past the storage
        assert len(got) == 1
        assert all(got[0][0] <= start and end <= got[0][1] for start, end in merged)
        views = list(built.kv_caches.values())
        storage = views[0].untyped_storage()
        assert (
            got[0][1] - got[0][0]
            == views[0].shape[0] * views[0].stride(0) * views[0].element_size()
        )
        assert got[0][1] <= storage.data_ptr() + storage.nbytes()
    report = memory_report(pool)
    storages = {
        v.untyped_storage().data_ptr(): v.untyped_storage().nbytes()
        for v in built.kv_caches.values()
    }
    assert report.total_bytes == sum(storages.values())
    manifest = describe(pool)
    assert sorted(t.path for t in manifest.iter_tensors()) == sorted(
        f"kv_caches[{name!r}]" for name in built.kv_caches
    )


def test_one_view_per_layer_is_a_strided_view_of_shared_storage() -> None:
    """The state production creates (0.33 on): strided, non-contiguous views of one storage."""
    built, pool = _adapt("mha@LBNHC")
    views = list(built.kv_caches.values())
    assert len({v.untyped_storage().data_ptr() for v in views}) == 1
    assert not any(v.is_contiguous() for v in views)
    assert pool.vllm_layers[5].layout == "LBNHC"  # type: ignore[attr-defined]


@pytest.mark.parametrize("case", ["mha@LBNHC", "mha@BLHNC"])
def test_mha_reads_equal_vllm_flash_attention_split(case: str) -> None:
    """FlashAttention's own split of the page, ``kv.transpose(1, 2).split(D, -1)``, vs read_kv."""
    built, pool = _adapt(case)
    _fill(built, seed=3)
    loc = torch.tensor([5 * 16 + 3, 0, 2 * 16 + 15, 4 * 16 + 1])
    for layer in pool.layer_ids:
        view = built.kv_caches[pool.layer_names[layer][0]]  # type: ignore[attr-defined]
        key_cache, value_cache = view.transpose(1, 2).split(64, dim=-1)
        keys, values = pool.read_kv(layer, loc)
        assert torch.equal(keys, key_cache[loc // 16, loc % 16])
        assert torch.equal(values, value_cache[loc // 16, loc % 16])


@pytest.mark.parametrize("case", ["dsv4@BLHNC", "dsv4@BLNHC"])
def test_dsv4_reads_equal_vllm_triton_reader(case: str) -> None:
    """vLLM's ``dequantize_and_gather_k_cache`` (Triton interpreter) reads what kvcompat reads."""
    cache_utils = pytest.importorskip("vllm.models.deepseek_v4.common.ops.cache_utils")
    built, pool = _adapt(case)
    for name in ("c4", "swa"):
        part = pool.components[name]
        layer = part.layer_ids[-1]
        states = part.page_size
        order = [4, 1, 3]  # blocks out of order
        loc = torch.tensor([b * states + s for b in order for s in range(states)])
        part.write(layer, loc, _values(part, layer, loc.numel(), 5))
        theirs = torch.zeros(1, loc.numel(), 512, dtype=torch.bfloat16)
        kv_cache = built.kv_caches[part.layer_names[layer][0]].squeeze(1)  # type: ignore[attr-defined]
        cache_utils.dequantize_and_gather_k_cache(
            theirs,
            kv_cache,
            torch.tensor([loc.numel()], dtype=torch.int32),
            None,
            torch.tensor([order], dtype=torch.int32),
            states,
            0,
        )
        ours = part.read(layer, loc)
        assert torch.equal(theirs[0].view(torch.int16), ours[:, 0].view(torch.int16))


@pytest.mark.parametrize("mode", sorted(builders.refused_specs()))
def test_refused_modes_raise_naming_the_mode(mode: str) -> None:
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    spec, word = builders.refused_specs()[mode]
    config = KVCacheConfig(
        num_blocks=2,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["model.layers.1.self_attn.attn"], spec)],
    )
    caches = {"model.layers.1.self_attn.attn": torch.zeros(2, 1, 16, 8)}
    with pytest.raises(kvcompat.UnsupportedPoolError, match=word):
        kvcompat.adapt(caches, config=config)


def test_config_is_required_for_a_dict_and_refused_beside_other_pools() -> None:
    built = builders.build("mla@LBNHC")
    with pytest.raises(kvcompat.UnsupportedPoolError, match="config=kv_cache_config"):
        kvcompat.adapt(built.kv_caches)
    from kvcompat.testing import ReferenceMHATokenToKVPool

    with pytest.raises(kvcompat.UnsupportedPoolError, match="without config"):
        kvcompat.adapt(ReferenceMHATokenToKVPool(16, 16), config=built.config)


def test_views_that_disagree_with_the_config_are_refused() -> None:
    built = builders.build("mha@LBNHC")
    other = builders.build("mla@LBNHC")
    with pytest.raises(kvcompat.LayoutError, match="lacks"):
        kvcompat.adapt(other.kv_caches, config=built.config)
    squeezed = {n: v[:, :2] for n, v in built.kv_caches.items()}
    with pytest.raises(kvcompat.LayoutError, match="does not hold what its spec says"):
        kvcompat.adapt(squeezed, config=built.config)


@pytest.mark.skipif(not builders.has_extensible(), reason="no extensible KV cache before 0.34")
@pytest.mark.parametrize("case", builders.EXTENSIBLE)
def test_extensible_cache_per_layer_storages(case: str) -> None:
    """0.34's extensible cache: one storage per layer-outer layer; the 0.33 rule is wrong."""
    built = builders.build_extensible(case)
    pool = kvcompat.adapt(built.kv_caches, config=built.config)
    storages = {v.untyped_storage().data_ptr() for v in built.kv_caches.values()}
    layer_outer = case.split("@")[1].startswith("LB")
    assert len(storages) == (len(built.kv_caches) if layer_outer else 1)
    if layer_outer:  # "one base + offset + layer * layer_stride" misses every layer past 0
        tensor = built.config.kv_cache_tensors[1]
        first = built.kv_caches[built.config.kv_cache_tensors[0].layers[0]]
        rule = first.untyped_storage().data_ptr() + tensor.offset
        assert rule != built.kv_caches[tensor.layers[0]].data_ptr()
    for part in _leaves(pool):
        layer = part.layer_ids[-1]
        loc = torch.tensor([5 * part.page_size + 1, part.page_size])
        key = _values(part, layer, 2, 7)
        value = _values(part, layer, 2, 8) if part.kind is kvcompat.PoolKind.SPLIT else None
        part.write(layer, loc, key, value)
        if not part.layout(layer).key.name.startswith(("v4", "dsv4")):
            assert torch.equal(part.read(layer, loc), key.view(part.read(layer, loc).shape))
    assert memory_report(pool).total_bytes == sum(
        v.untyped_storage().nbytes()
        for v in {v.untyped_storage().data_ptr(): v for v in built.kv_caches.values()}.values()
    )
    runs = _intervals(transfer_descriptors(pool))
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(runs))


@pytest.mark.parametrize("case", SERVED)
def test_multi_layer_calls_equal_the_per_layer_calls(case: str) -> None:
    built, pool = _adapt(case)
    _fill(built, seed=11)
    assert isinstance(pool, kvcompat.KVPoolProtocol)
    for part in _leaves(pool):
        layers = list(reversed(part.layer_ids))
        loc = torch.tensor([4 * part.page_size + 2, 1, 3 * part.page_size])
        together = part.read_layers(layers, loc)
        assert torch.equal(
            together.view(torch.uint8),
            torch.stack([part.read(layer, loc) for layer in layers]).view(torch.uint8),
        )
        keys = torch.stack([_values(part, layer, 3, seed) for seed, layer in enumerate(layers)])
        values = None
        if part.kind is kvcompat.PoolKind.SPLIT:
            values = torch.stack(
                [_values(part, layer, 3, 50 + i) for i, layer in enumerate(layers)]
            )
        bad = keys.clone()
        bad[-1, 0, 0, 0] = float("inf")  # the last layer's part fails: nothing is stored
        before = _snapshot(built)
        with pytest.raises(kvcompat.WriteError):
            part.write_layers(layers, loc, bad, values)
        for ptr, raw in _storages(built).items():
            assert torch.equal(raw, before[ptr])
        part.write_layers(layers, loc, keys, values)
        for index, layer in enumerate(layers):
            single = part.read(layer, loc)
            assert torch.equal(
                part.read_layers([layer], loc)[0].view(torch.uint8), single.view(torch.uint8)
            )
            if not part.layout(layer).key.name.startswith(("v4", "dsa", "dsv4")):
                assert torch.equal(single, keys[index].view(single.shape))


@pytest.mark.parametrize(
    ("case", "fused"),
    [
        pytest.param(case, fused, id=case)  # the id is the case: the tier's per-case table
        for case, fused in (
            ("dsv4@BLHNC", True),
            ("dsv4@BLNHC", True),
            ("fp8_ds_mla-656@LBNHC", True),
            ("fp8_ds_mla-656@BLHNC", False),
            ("mla@BLHNC", False),
            ("mha@BLHNC", False),
        )
    ],
)
def test_packed_pages_of_every_layer_move_in_one_call(
    case: str, fused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeepSeek-V4 pages (strided per layer under block-outer layouts) are one multi-layer
    call: one read_layers / write_layers for every layer, none per layer; per-layer slots
    too. Formats indexed per head or per block move layer by layer."""
    import kvcompat.adapters.vllm as vllm_adapter

    built, pool = _adapt(case)
    theirs, other = _adapt(case)
    _fill(built, seed=3)
    _fill(theirs, seed=3)
    for part in _leaves(pool):
        layers = list(reversed(part.layer_ids))
        step = part.plan(layers)  # type: ignore[attr-defined]
        assert step.fused is fused, part.name
        if not fused:
            continue
        twin = other.components[part.name] if other.components else other
        per_layer = torch.stack([torch.randperm(part.size)[:5] for _ in layers])  # own slots
        expect = torch.stack([twin.read(layer, per_layer[i]) for i, layer in enumerate(layers)])
        keys = torch.stack([_values(part, layer, 5, 70 + i) for i, layer in enumerate(layers)])
        for i, layer in enumerate(layers):
            twin.write(layer, per_layer[i], keys[i])
        calls: list[str] = []
        for name in ("dequantize", "quantize"):
            real = getattr(vllm_adapter, name)

            def counted(
                *args: Any,
                _real: Any = real,
                _name: str = name,
                _calls: list[str] = calls,
                **kwargs: Any,
            ) -> Any:
                _calls.append(_name)
                return _real(*args, **kwargs)

            monkeypatch.setattr(vllm_adapter, name, counted)
        got = step.read(per_layer)
        into = torch.empty_like(got)
        assert step.read(per_layer, out=into) is into  # read straight into the caller's buffer
        assert torch.equal(into.view(torch.uint8), got.view(torch.uint8))
        step.write(per_layer, keys)
        monkeypatch.undo()
        assert calls == [], calls  # no per-layer codec call
        assert torch.equal(got.view(torch.uint8), expect.view(torch.uint8))
        mine, twins = _storages(built).values(), _storages(theirs).values()
        for raw, raw_twin in zip(mine, twins, strict=True):
            assert torch.equal(raw, raw_twin), part.name


def test_doctor_reports_the_installed_vllm() -> None:
    import io

    import vllm

    from kvcompat.inspection._cli import run_doctor

    out = io.StringIO()
    assert run_doctor(out) == 0
    assert f"  vllm         {vllm.__version__}" in out.getvalue()
    assert f"vLLM {vllm.__version__}: a tested release" in out.getvalue()


@pytest.mark.parametrize("case", SERVED)
def test_the_demos_generic_decode_step_runs_unchanged(case: str) -> None:
    """``kvcompat demo``'s key-first decode step, written once, on a vLLM cache as on SGLang's."""
    from kvcompat._demo import attention, decode_attention
    from kvcompat.testing import ReferenceMHATokenToKVPool

    _, pool = _adapt(case)
    sglang = kvcompat.adapt(ReferenceMHATokenToKVPool(64, 16, head_num=4, head_dim=64))
    for target in (pool, sglang):
        layer = target.layer_ids[-1]
        spec = target.layout(layer).key
        loc = torch.tensor([7, 2 * target.page_size + 1, 0, 3 * target.page_size])
        keys = _values(target, layer, loc.numel(), 21)
        values = _values(target, layer, loc.numel(), 22)
        if not target.get_kv_buffer(layer).shared:  # K and V apart (MHA), composite or not
            target.write(layer, loc, keys, values)
            reference_values = values
        else:
            target.write(layer, loc, keys)
            reference_values = keys[..., : target.layout(layer).value_dim or spec.dim]
        width = spec.dim // spec.heads
        query = torch.randn(8, width, generator=torch.Generator().manual_seed(3))
        ours = decode_attention(target, layer, loc, query)
        dense = attention(query, keys, reference_values)
        exact = not spec.name.startswith(("v4", "dsa"))  # packed fp8: quantized keys
        assert (ours - dense).abs().max().item() <= (0 if exact else 0.5)


def test_kv_sharing_aliases_serve_their_target_and_own_no_bytes() -> None:
    """vLLM registers a KV-sharing layer under its own name, viewing its target's cache."""
    built = builders.build("mha@LBNHC")
    target = "model.layers.5.self_attn.attn"
    caches = {**built.kv_caches, "model.layers.9.self_attn.attn": built.kv_caches[target]}
    pool = kvcompat.adapt(caches, config=built.config)
    assert pool.layer_ids == (5, 6, 7, 9)
    assert pool.layer_names[9] == ("model.layers.9.self_attn.attn",)  # type: ignore[attr-defined]
    assert pool.get_key_buffer(9).data_ptr() == pool.get_key_buffer(5).data_ptr()
    alone = transfer_descriptors(kvcompat.adapt(built.kv_caches, config=built.config))
    assert [(d.ptr, d.length) for d in transfer_descriptors(pool)] == [
        (d.ptr, d.length) for d in alone
    ]
    entry = next(t for t in describe(pool).iter_tensors() if "layers.9." in t.path)
    assert entry.alias_of == f"kv_caches[{target!r}]"
    stray = {**built.kv_caches, "model.layers.9.self_attn.attn": torch.zeros(6, 4, 16, 128)}
    with pytest.raises(kvcompat.LayoutError, match="in no KV-cache group"):
        kvcompat.adapt(stray, config=built.config)


@pytest.mark.parametrize(
    "case", ["mha@LBNHC", "mha@BLHNC", "mla@LBNHC", "fp8_ds_mla-656@LBNHC", "dsv4@BLHNC"]
)
def test_transfer_plans_move_blocks_between_two_workers(case: str) -> None:
    """``plan_transfer`` over two vLLM workers' caches: page ``b`` is block ``b``.

    The plan's descriptors are executed with a host memmove, as a transfer engine would
    move them; the destination's blocks then read what the source's did.
    """
    import ctypes

    from kvcompat.transfer import plan_transfer, pool_spec

    source, dest = builders.build(case), builders.build(case)
    _fill(source, seed=31)
    src = kvcompat.adapt(source.kv_caches, config=source.config)
    dst = kvcompat.adapt(dest.kv_caches, config=dest.config)
    plan = plan_transfer(
        src, pool_spec(dst).to_json(), pages={"kv": [4, 1]}, dst_pages={"kv": [0, 5]}
    )
    for descriptor in plan.descriptors:
        ctypes.memmove(descriptor.dst, descriptor.src, descriptor.length)
    for part, other in zip(_leaves(src), _leaves(dst), strict=True):
        per_block = part.page_size
        for layer in part.layer_ids:
            ours = part.read(layer, torch.arange(per_block) + 4 * per_block)
            theirs = other.read(layer, torch.arange(per_block))
            assert torch.equal(ours.view(torch.uint8), theirs.view(torch.uint8))


@pytest.mark.parametrize("case", ["dsv4@BLHNC"])
def test_dsv4_writes_match_vllm_triton_writer_outside_the_e4m3_payload(case: str) -> None:
    """vLLM's ``quantize_and_insert_k_cache`` (interpreter) and kvcompat write the same bytes.

    Every byte but the e4m3 payload: the ue8m0 scales, the bf16 rope, the pad byte and every
    untouched byte. The payload needs a GPU to compare (the interpreter rounds fp32 to e4m3
    unlike the GPU); the reads of both caches are compared with vLLM's reader elsewhere.
    """
    cache_utils = pytest.importorskip("vllm.models.deepseek_v4.common.ops.cache_utils")
    theirs_built, ours_built = builders.build(case), builders.build(case)
    theirs = kvcompat.adapt(theirs_built.kv_caches, config=theirs_built.config)
    ours = kvcompat.adapt(ours_built.kv_caches, config=ours_built.config)
    part = ours.components["c4"]
    layer = part.layer_ids[-1]
    name = part.layer_names[layer][0]  # type: ignore[attr-defined]
    loc = torch.tensor([4 * 64 + 3, 1 * 64 + 63, 0, 5 * 64 + 17])
    keys = _values(part, layer, loc.numel(), 9) * 40  # values across the e4m3 range
    part.write(layer, loc, keys)
    view = theirs_built.kv_caches[name]
    cache_utils.quantize_and_insert_k_cache(keys[:, 0].contiguous(), view[:, 0].flatten(1), loc)
    a = torch.empty(0, dtype=torch.uint8).set_(view.untyped_storage())
    b = torch.empty(0, dtype=torch.uint8).set_(ours_built.kv_caches[name].untyped_storage())
    payload = torch.zeros_like(a, dtype=torch.bool)
    start = view.storage_offset()
    for slot in loc.tolist():
        row = start + (slot // 64) * view.stride(0) + (slot % 64) * 576
        payload[row : row + 448] = True
    assert torch.equal(a[~payload], b[~payload])
    assert not torch.equal(a, torch.zeros_like(a))  # vLLM's writer ran
    # kvcompat reads what vLLM's writer stored, within the format's rounding.
    back = theirs.components["c4"].read(layer, loc).float()
    scale = keys.float().abs().amax(dim=-1, keepdim=True)
    assert ((back - keys.float()).abs() <= scale / 4).all()


@pytest.mark.parametrize("case", SERVED)
def test_the_conformance_check_passes_on_every_served_case(case: str) -> None:
    """``kvcompat.testing.check_pool`` -- what a user runs on a pool -- finds nothing wrong."""
    from kvcompat.testing import check_pool

    _, pool = _adapt(case)
    report = check_pool(pool)
    assert report.ok, str(report)
    kind = case.split("@", maxsplit=1)[0]
    if kind in ("mla", "fp8_ds_mla-656", "fp8_ds_mla-528") and "LB" in case:
        assert "round_trip" in report.passed, str(report)  # block-major rows, written in place
