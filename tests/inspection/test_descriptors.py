"""transfer_descriptors(): (ptr, length, item_length) per buffer, in SGLang's order."""

from __future__ import annotations

import json

import pytest

from kvcompat.inspection import (
    Role,
    TransferDescriptor,
    TransferGroup,
    as_buf_infos,
    describe,
    transfer_descriptors,
)
from kvcompat.testing import (
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
    ReferenceMLATokenToKVPool,
    reference_swa_pool,
)


@pytest.mark.parametrize("layers", [1, 3])
def test_mha_matches_the_reference_get_contiguous_buf_infos(layers: int) -> None:
    native = ReferenceMHATokenToKVPool(48, 16, head_num=2, head_dim=8, layer_num=layers)
    assert (
        as_buf_infos(transfer_descriptors(native, group="kv")) == native.get_contiguous_buf_infos()
    )
    assert transfer_descriptors(native) == transfer_descriptors(native, group="kv")


def test_token_major_items_are_one_page_of_token_rows() -> None:
    native = ReferenceMLATokenToKVPool(32, 16, kv_lora_rank=32, qk_rope_head_dim=16, layer_num=2)
    descriptors = transfer_descriptors(native)
    bytes_per_token = (32 + 16) * 2
    assert [(d.path, d.length, d.item_length, d.items) for d in descriptors] == [
        ("kv_buffer[0]", 48 * bytes_per_token, 16 * bytes_per_token, 3),
        ("kv_buffer[1]", 48 * bytes_per_token, 16 * bytes_per_token, 3),
    ]
    assert [d.ptr for d in descriptors] == [buf.data_ptr() for buf in native.kv_buffer]
    assert all(d.role is Role.LATENT and d.group == "kv" for d in descriptors)


def test_page_major_items_are_one_row() -> None:
    native = ReferenceDeepSeekV4SingleKVPool(100, 64, layer_num=2, start_layer=4)
    descriptors = transfer_descriptors(native)
    assert [(d.layer_id, d.ptr, d.length, d.item_length) for d in descriptors] == [
        (4 + i, buf.data_ptr(), buf.nbytes, buf[0].nbytes) for i, buf in enumerate(native.kv_buffer)
    ]
    assert descriptors[0].item_length == native.bytes_per_page_padded  # page bytes, not token bytes
    assert descriptors[0].items == native.kv_buffer[0].shape[0]


def test_swa_composite_groups_like_sglang() -> None:
    native = reference_swa_pool()
    kv = transfer_descriptors(native, group="kv")
    state = transfer_descriptors(native, group="state")
    assert {d.component for d in kv} == {"full"}
    assert {d.component for d in state} == {"swa"}
    assert [d.path for d in kv] == [
        "full_kv_pool.k_buffer[0]",
        "full_kv_pool.k_buffer[1]",
        "full_kv_pool.v_buffer[0]",
        "full_kv_pool.v_buffer[1]",
    ]
    assert as_buf_infos(kv) == native.full_kv_pool.get_contiguous_buf_infos()
    assert as_buf_infos(state) == native.swa_kv_pool.get_contiguous_buf_infos()
    assert [d.layer_id for d in state] == [0, 2, 0, 2]
    assert transfer_descriptors(native) == kv + state  # groups in TransferGroup order


def test_every_descriptor_lies_inside_its_tensor() -> None:
    native = reference_swa_pool()
    entries = {e.path: e for e in describe(native).iter_tensors()}
    for d in transfer_descriptors(native):
        entry = entries[d.path]
        assert entry.storage_ptr <= d.ptr
        assert d.ptr + d.length <= entry.storage_ptr + entry.storage_nbytes
        assert d.length % d.item_length == 0


def test_unknown_group_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"(?s)unknown transfer group 'pages'.*Hint: pass one of 'kv'"
    ):
        transfer_descriptors(reference_swa_pool(), group="pages")


def test_descriptor_dict_and_groups() -> None:
    descriptor = transfer_descriptors(ReferenceMHATokenToKVPool(16, 16))[0]
    assert isinstance(descriptor, TransferDescriptor)
    data = json.loads(json.dumps(descriptor.to_dict()))
    assert data == {
        "ptr": descriptor.ptr,
        "length": 8192,
        "item_length": 4096,
        "items": 2,
        "group": "kv",
        "component": "ReferenceMHATokenToKVPool",
        "path": "k_buffer[0]",
        "layer_id": 0,
        "role": "key",
        "device": "cpu",
    }
    assert [group.value for group in TransferGroup][:3] == ["kv", "state", "request_state"]
    native = reference_swa_pool()
    by_enum = transfer_descriptors(native, group=TransferGroup.STATE)
    assert by_enum == transfer_descriptors(native, group="state")
    assert by_enum[0].group is TransferGroup.STATE


def test_as_buf_infos_of_nothing() -> None:
    assert as_buf_infos(()) == ([], [], [])
