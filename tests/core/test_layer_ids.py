"""Bad layer ids raise the documented errors with useful messages (hypothesis over ids)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import kvcompat
from kvcompat.testing import (
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
    ReferenceMLATokenToKVPool,
    reference_swa_pool,
)

START = 4
POOLS = {
    "mha": lambda: ReferenceMHATokenToKVPool(
        size=16, page_size=16, head_num=1, head_dim=4, layer_num=3, start_layer=START
    ),
    "mla": lambda: ReferenceMLATokenToKVPool(
        size=16, page_size=16, kv_lora_rank=8, qk_rope_head_dim=4, layer_num=3, start_layer=START
    ),
    "dsv4": lambda: ReferenceDeepSeekV4SingleKVPool(
        size=64, page_size=64, layer_num=3, start_layer=START
    ),
    "swa": reference_swa_pool,
}
ADAPTED = {name: kvcompat.adapt(build()) for name, build in POOLS.items()}
GETTERS = ("get_key_buffer", "get_value_buffer", "get_kv_buffer", "component_for")


@pytest.mark.parametrize("name", sorted(ADAPTED))
@given(layer=st.integers(min_value=-(2**70), max_value=2**70), getter=st.sampled_from(GETTERS))
def test_unserved_int_ids_raise_index_error_naming_the_range(
    name: str, layer: int, getter: str
) -> None:
    pool = ADAPTED[name]
    if layer in pool.layer_ids:
        getattr(pool, getter)(layer)
        return
    with pytest.raises(kvcompat.LayerOutOfRangeError) as info:
        getattr(pool, getter)(layer)
    message = str(info.value)
    assert isinstance(info.value, IndexError)
    assert f"layer id {layer} is not served by" in message
    assert "valid layer ids are" in message
    expected = "4..6" if name != "swa" else "0..3"
    assert expected in message


@pytest.mark.parametrize("name", sorted(ADAPTED))
@given(
    bad=st.one_of(
        st.booleans(),
        st.floats(allow_nan=True),
        st.text(max_size=5),
        st.none(),
        st.just(torch.tensor(5)),
        st.lists(st.integers(), max_size=2),
    ),
    getter=st.sampled_from(GETTERS),
)
def test_non_int_ids_raise_type_error(name: str, bad: Any, getter: str) -> None:
    pool = ADAPTED[name]
    with pytest.raises(kvcompat.LayerIdTypeError) as info:
        getattr(pool, getter)(bad)
    assert isinstance(info.value, TypeError)
    assert f"got {type(bad).__name__}" in str(info.value)
    assert "Hint:" in str(info.value)


def test_ids_below_start_layer_never_read_another_layer() -> None:
    # SGLang's buffer[layer_id - start_layer] turns these into negative list indices.
    native = POOLS["mha"]()
    assert native.get_key_buffer(START - 1).data_ptr() == native.k_buffer[-1].data_ptr()
    pool = kvcompat.adapt(native)
    for layer in range(START):
        with pytest.raises(kvcompat.LayerOutOfRangeError):
            pool.get_key_buffer(layer)


def test_integer_scalars_are_accepted() -> None:
    pool = ADAPTED["mha"]
    for layer in (np.int64(START), np.int32(START + 1), np.uint8(START + 2)):
        assert pool.get_key_buffer(layer) is pool.get_key_buffer(int(layer))  # type: ignore[arg-type]
