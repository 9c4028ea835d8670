"""describe(): the manifest tree of reference pools, opaque parts, bad inputs, no native code."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import FrozenInstanceError
from typing import Any

import pytest
import torch

import kvcompat
from kvcompat.inspection import PoolManifest, Role, describe
from kvcompat.testing import (
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
    ReferenceMLATokenToKVPool,
    reference_swa_pool,
)

from ._guards import instrument, resolve_path


def _pools() -> dict[str, Any]:
    return {
        "mha": ReferenceMHATokenToKVPool(32, 16, head_num=2, head_dim=8, layer_num=3),
        "mha_stage": ReferenceMHATokenToKVPool(32, 16, layer_num=2, start_layer=5),
        "mha_kv_differ": ReferenceMHATokenToKVPool(32, 16, head_dim=8, v_head_dim=4, layer_num=2),
        "mla": ReferenceMLATokenToKVPool(32, 16, kv_lora_rank=32, qk_rope_head_dim=16, layer_num=2),
        "mla_fp8": ReferenceMLATokenToKVPool(32, 16, dtype=torch.float8_e4m3fn, layer_num=1),
        "dsv4": ReferenceDeepSeekV4SingleKVPool(64, 64, layer_num=2, start_layer=2),
        "swa": reference_swa_pool(),
    }


POOLS = sorted(_pools())


@pytest.fixture(params=POOLS)
def native(request: pytest.FixtureRequest) -> Any:
    return _pools()[request.param]


# -- structure ---------------------------------------------------------------------------


def test_every_tensor_path_resolves_to_the_very_tensor(native: Any) -> None:
    manifest = describe(native)
    assert list(manifest.iter_tensors()), "a pool has tensors"
    for entry in manifest.iter_tensors():
        tensor = resolve_path(native, entry.path)
        assert isinstance(tensor, torch.Tensor), entry.path
        assert tensor.data_ptr() == entry.data_ptr, entry.path
        assert tuple(tensor.shape) == entry.shape, entry.path
        assert tuple(tensor.stride()) == entry.stride, entry.path
        assert entry.nbytes == tensor.nbytes
        assert entry.storage_ptr == tensor.untyped_storage().data_ptr()
        assert entry.storage_nbytes == tensor.untyped_storage().nbytes()
        assert entry.data_ptr == entry.storage_ptr + entry.storage_offset
        assert entry.device == "cpu"


def test_layer_ids_agree_with_the_adapter(native: Any) -> None:
    manifest = describe(native)
    adapter = kvcompat.adapt(native)
    assert manifest.layer_ids == adapter.layer_ids
    assert manifest.kind is adapter.kind
    for layer in adapter.layer_ids:
        key = adapter.get_key_buffer(layer, wait=False)
        owners = [
            e
            for e in manifest.iter_tensors()
            if layer in e.layer_ids and e.data_ptr == key.data_ptr()
        ]
        assert owners, f"layer {layer}: the adapter's key buffer is not in the manifest"


def test_mha_manifest() -> None:
    manifest = describe(ReferenceMHATokenToKVPool(32, 16, head_num=2, head_dim=8, layer_num=2))
    assert (manifest.role, manifest.kind, manifest.layout) == (
        Role.KEY_VALUE,
        kvcompat.PoolKind.SPLIT,
        "mha_2x8_bf16",
    )
    assert (manifest.page_size, manifest.token_capacity) == (16, 32)
    assert manifest.native_class == "kvcompat.testing._reference.ReferenceMHATokenToKVPool"
    assert [(e.path, e.role, e.layer_ids, e.row_unit) for e in manifest.tensors] == [
        ("k_buffer[0]", Role.KEY, (0,), "token"),
        ("k_buffer[1]", Role.KEY, (1,), "token"),
        ("v_buffer[0]", Role.VALUE, (0,), "token"),
        ("v_buffer[1]", Role.VALUE, (1,), "token"),
    ]
    k0, _, v0, _ = manifest.tensors
    assert k0.storage_key == v0.storage_key  # the two halves of one [2, rows, H, D] allocation
    assert v0.storage_offset == k0.nbytes
    assert manifest.details["dtype"] == "bfloat16"
    assert manifest.details["head_dim"] == 8


def test_mla_value_is_a_listed_view_of_the_latent() -> None:
    manifest = describe(ReferenceMLATokenToKVPool(32, 16, kv_lora_rank=32, qk_rope_head_dim=16))
    latent, value = manifest.tensors
    assert (latent.role, value.role) == (Role.LATENT, Role.VALUE)
    assert value.alias_of == latent.path == "kv_buffer[0]"
    assert value.path == "kv_buffer[0][..., :32]"
    assert value.shape[-1] == 32
    assert value.data_ptr == latent.data_ptr
    assert not value.regions  # a view is never transferred on its own
    assert manifest.layout == "mla_32+16_bf16"


def test_fp8_pools_show_the_stored_dtype() -> None:
    entry = describe(ReferenceMLATokenToKVPool(32, 16, dtype=torch.float8_e4m3fn)).tensors[0]
    assert entry.dtype == "uint8"  # SGLang stores fp8 as uint8; the manifest shows storage


def test_dsv4_single_pool_manifest() -> None:
    native = ReferenceDeepSeekV4SingleKVPool(64, 64, layer_num=2, start_layer=3)
    manifest = describe(native)
    assert manifest.role is Role.PACKED_KV
    assert manifest.layout == "v4"
    assert manifest.layer_ids == (3, 4)
    assert [(e.path, e.layer_ids, e.row_unit) for e in manifest.tensors] == [
        ("kv_buffer[0]", (3,), "page"),
        ("kv_buffer[1]", (4,), "page"),
    ]
    assert manifest.details["kv_cache_total_dim"] == 584
    assert manifest.details["bytes_per_page_padded"] == native.bytes_per_page_padded


def test_composite_children_follow_the_adapter_components() -> None:
    native = reference_swa_pool()
    manifest = describe(native)
    adapter = kvcompat.adapt(native)
    assert manifest.role is Role.COMPOSITE
    assert [child.name for child in manifest.children] == list(adapter.components)
    for child in manifest.children:
        part = adapter.components[child.name]
        assert child.layer_ids == part.layer_ids
        assert resolve_path(native, child.path) is part.native
    assert manifest.find("swa").path == "swa_kv_pool"


def test_describe_accepts_adapters_and_components() -> None:
    native = reference_swa_pool()
    adapter = kvcompat.adapt(native)
    assert describe(adapter).to_dict() == describe(native).to_dict()
    part = describe(adapter.components["swa"])
    assert part.name == "swa"
    assert part.layer_ids == (0, 2)  # absolute ids, as the composite maps them
    assert [e.layer_ids for e in part.tensors] == [(0,), (2,), (0,), (2,)]


def test_to_dict_is_json_and_complete(native: Any) -> None:
    manifest = describe(native)
    data = json.loads(json.dumps(manifest.to_dict()))
    assert data["name"] == manifest.name
    assert data["role"] == manifest.role.value
    flat = [t for node in _walk_dict(data) for t in node["tensors"]]
    assert [t["path"] for t in flat] == [t.path for t in manifest.iter_tensors()]
    assert all(t["storage_ptr"] and t["storage_nbytes"] >= t["nbytes"] for t in flat)


def _walk_dict(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(n for child in node["children"] for n in _walk_dict(child))]


def test_str_is_a_readable_tree() -> None:
    text = str(describe(reference_swa_pool()))
    lines = text.splitlines()
    assert lines[0].startswith("ReferenceSWAKVPool  composite  layers 0..3")
    assert any(line.startswith("├─ full  key_value (split pool)") for line in lines)
    assert any(line.startswith("└─ swa  key_value (split pool)") for line in lines)
    assert "│     full_kv_pool.k_buffer[0]  key  layer 1  bfloat16[80, 2, 8]  2.5 KiB  cpu" in lines


def test_manifests_are_frozen() -> None:
    manifest = describe(ReferenceMHATokenToKVPool(16, 16))
    with pytest.raises(FrozenInstanceError):
        manifest.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        manifest.details["dtype"] = "x"  # type: ignore[index]


def test_find_names_the_parts_it_has() -> None:
    with pytest.raises(KeyError, match=r"no part named 'c4'.*'full', 'swa'"):
        describe(reference_swa_pool()).find("c4")


# -- unknown tensors are reported, not fatal ------------------------------------------------


class PoolWithExtras(ReferenceMHATokenToKVPool):
    """A pool a newer engine might ship: extra tensors in odd containers."""

    def __init__(self) -> None:
        super().__init__(16, 16, head_num=1, head_dim=4, layer_num=2)
        self.slot_table = torch.arange(8)
        self.scales = [torch.ones(4), None, torch.ones(2)]
        self.extra = {"tail": torch.zeros(3), 7: torch.zeros(1)}
        self.alias = self.k_buffer[0]  # the same tensor object under another name
        self.not_tensors = [1, 2, "three"]


def test_unknown_tensor_attributes_are_opaque_parts() -> None:
    native = PoolWithExtras()
    manifest = describe(native)
    opaque = [(e.path, e.role) for e in manifest.tensors if e.role is Role.OPAQUE]
    assert opaque == [
        ("slot_table", Role.OPAQUE),
        ("scales[0]", Role.OPAQUE),
        ("scales[2]", Role.OPAQUE),
        ("extra['tail']", Role.OPAQUE),
        ("extra[7]", Role.OPAQUE),
    ]
    assert "alias" not in {e.path for e in manifest.tensors}  # reported once, as k_buffer[0]
    for entry in manifest.tensors:
        assert resolve_path(native, entry.path).data_ptr() == entry.data_ptr
        if entry.role is Role.OPAQUE:
            assert not entry.regions
            assert entry.layer_id is None


# -- bad inputs -------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [object(), 3, "pool", None, [torch.zeros(2)], torch.zeros(2)])
def test_non_pools_are_refused_with_a_clear_message(bad: Any) -> None:
    with pytest.raises(kvcompat.UnsupportedPoolError) as info:
        describe(bad)
    message = str(info.value)
    assert message.startswith("describe() needs a KV pool kvcompat knows")
    assert type(bad).__qualname__ in message
    assert "Hint:" in message
    assert isinstance(info.value, TypeError)


def test_a_pool_class_is_refused() -> None:
    with pytest.raises(kvcompat.UnsupportedPoolError, match="construct the pool first"):
        describe(ReferenceMHATokenToKVPool)


# -- never runs native code -------------------------------------------------------------------


def test_describe_runs_no_getter_and_no_wait(native: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    guard = instrument(monkeypatch, native)
    from kvcompat.inspection import memory_report, transfer_descriptors

    manifest = describe(native)
    memory_report(native)
    transfer_descriptors(native)
    guard.assert_untouched()
    assert isinstance(manifest, PoolManifest)


def test_the_guard_catches_getter_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    native = ReferenceMHATokenToKVPool(16, 16)
    guard = instrument(monkeypatch, native)
    native.get_key_buffer(0)
    assert "ReferenceMHATokenToKVPool.get_key_buffer" in guard.calls
    assert guard.waits == [0]
    with pytest.raises(AssertionError, match="native code ran"):
        guard.assert_untouched()


def test_properties_are_never_run(monkeypatch: pytest.MonkeyPatch) -> None:
    class Trap(ReferenceMHATokenToKVPool):
        @property
        def kv_cache_layout_trap(self) -> str:
            raise AssertionError("a property ran")

        @property
        def k_scale_buffer(self) -> list[torch.Tensor]:  # a name inspection looks for
            raise AssertionError("a property ran")

    manifest = describe(Trap(16, 16, layer_num=1))
    assert [e.path for e in manifest.tensors] == ["k_buffer[0]", "v_buffer[0]"]


def test_inspection_imports_neither_sglang_nor_triton() -> None:
    code = textwrap.dedent(
        """
        import sys
        from kvcompat.inspection import describe, memory_report, transfer_descriptors
        from kvcompat.inspection._cli import run_doctor, run_inspect
        from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool, reference_swa_pool
        import io
        for pool in (ReferenceDeepSeekV4SingleKVPool(64, 64), reference_swa_pool()):
            describe(pool); memory_report(pool); transfer_descriptors(pool)
        run_inspect(io.StringIO()); run_doctor(io.StringIO())
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("sglang", "triton")))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


# -- pools taught to kvcompat by users --------------------------------------------------------


class VendorPool:
    """A vendor's MHA-like pool, taught to kvcompat by reusing the MHA family."""

    def __init__(self) -> None:
        self.size, self.page_size, self.dtype, self.start_layer = 16, 16, torch.float16, 2
        self.k_buffer = [torch.zeros(32, 1, 4, dtype=torch.float16) for _ in range(2)]
        self.v_buffer = [torch.zeros(32, 1, 4, dtype=torch.float16) for _ in range(2)]
        self.layer_transfer_counter = None

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k_buffer[layer_id - self.start_layer]


class CustomPool:
    """A pool with its own adapter factory: kvcompat knows its kind, not its attributes."""

    def __init__(self) -> None:
        self.slab = torch.zeros(4, 8)


def test_a_pool_reusing_a_builtin_family_is_described_like_it() -> None:
    qualname = f"{VendorPool.__module__}.VendorPool"
    kvcompat.register_adapter(
        qualname, f"{ReferenceMHATokenToKVPool.__module__}.ReferenceMHATokenToKVPool"
    )
    try:
        manifest = describe(VendorPool())
    finally:
        kvcompat.unregister_adapter(qualname)
    assert manifest.layer_ids == (2, 3)
    assert [(e.path, e.role, e.layer_ids) for e in manifest.tensors] == [
        ("k_buffer[0]", Role.KEY, (2,)),
        ("k_buffer[1]", Role.KEY, (3,)),
        ("v_buffer[0]", Role.VALUE, (2,)),
        ("v_buffer[1]", Role.VALUE, (3,)),
    ]


def test_a_pool_with_a_custom_factory_is_described_as_opaque() -> None:
    qualname = f"{CustomPool.__module__}.CustomPool"

    def factory(native: CustomPool) -> Any:
        return kvcompat.adapt(ReferenceMHATokenToKVPool(16, 16, layer_num=1))

    kvcompat.register_adapter(qualname, factory, kind=kvcompat.PoolKind.SPLIT)
    try:
        manifest = describe(CustomPool())
    finally:
        kvcompat.unregister_adapter(qualname)
    assert (manifest.role, manifest.kind) == (Role.OPAQUE, kvcompat.PoolKind.SPLIT)
    assert [(e.path, e.role) for e in manifest.tensors] == [("slab", Role.OPAQUE)]
