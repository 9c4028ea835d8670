"""The layout name ``describe`` shows comes from the family's declaration, never a class name.

An adapter's ``layout(l)`` when it has a codec; else its ``layout_name`` hook; the base
adapter with no ``detect_layout`` refuses ``read``/``write`` with a hint to declare one.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import kvcompat
from kvcompat import LayoutError, PoolKind
from kvcompat.adapters import (
    Buffer,
    IndexKeyAdapter,
    LatentAdapter,
    LeafAdapter,
    SingleKVAdapter,
    SplitAdapter,
)


class RawAdapter(LeafAdapter):
    """A storage scheme with no codec yet: getters only."""

    kind = PoolKind.KEY_ONLY
    source_attr = "rows"
    native_waits = False
    buffers = (Buffer("rows", "key"),)

    def layer_buffers(self, source: Any, slot: int) -> tuple[torch.Tensor, None]:
        return source[slot], None


class NamedRawAdapter(RawAdapter):
    @classmethod
    def layout_name(cls, native: Any) -> str | None:
        return f"raw-{native.row_bytes}"


class DeepSeekV4UniformFP8KVPool:  # a user's class that only shares SGLang's name
    def __init__(self) -> None:
        self.rows = [torch.zeros(8, 16, dtype=torch.uint8)]
        self.row_bytes, self.dtype, self.size, self.page_size = 16, torch.uint8, 8, 1


QUALNAME = f"{DeepSeekV4UniformFP8KVPool.__module__}.DeepSeekV4UniformFP8KVPool"


@pytest.fixture(params=[RawAdapter, NamedRawAdapter], ids=["no-hook", "hook"])
def adapter_class(request: pytest.FixtureRequest) -> Iterator[type[LeafAdapter]]:
    kvcompat.register_adapter(QUALNAME, request.param)
    yield request.param
    kvcompat.unregister_adapter(QUALNAME)


def test_describe_names_the_layout_by_the_hook_not_the_class_name(
    adapter_class: type[LeafAdapter],
) -> None:
    native = DeepSeekV4UniformFP8KVPool()
    expected = "raw-16" if adapter_class is NamedRawAdapter else None
    assert kvcompat.describe(native).layout == expected  # never "uniform_fp8"


def test_an_adapter_without_detect_layout_refuses_read_with_a_hint(
    adapter_class: type[LeafAdapter],
) -> None:
    pool = kvcompat.adapt(DeepSeekV4UniformFP8KVPool())
    with pytest.raises(LayoutError, match=r"(?s)declares no byte layout.*override detect_layout"):
        pool.read(0, torch.tensor([1]))
    assert pool.get_key_buffer(0).shape == (8, 16)  # the getters still work


@pytest.mark.parametrize(
    ("adapter", "native", "name"),
    [
        (SplitAdapter, SimpleNamespace(kv_cache_layout="HND"), "mha-HND"),
        (SplitAdapter, SimpleNamespace(), "mha-nhd"),
        (LatentAdapter, SimpleNamespace(dsa_kv_cache_store_fp8=True), "dsa-fp8-656"),
        (LatentAdapter, SimpleNamespace(), "mla-latent"),
        # SGLang's uniform-fp8 pool keeps kv_layout = V4 over 512-byte rows.
        (SingleKVAdapter, SimpleNamespace(kv_layout="v4", kv_cache_total_dim=512), "uniform_fp8"),
        (SingleKVAdapter, SimpleNamespace(kv_layout="V41", kv_cache_total_dim=528), "v41"),
        (SingleKVAdapter, SimpleNamespace(kv_layout="v41_new", kv_cache_total_dim=528), "v41_new"),
        (SingleKVAdapter, SimpleNamespace(), "v4"),
        (IndexKeyAdapter, SimpleNamespace(), "dsv4_indexer_fp8"),
        (IndexKeyAdapter, SimpleNamespace(use_fp4_indexer=True, index_k_rne=True),
         "dsv4_indexer_fp4_rne"),
        (IndexKeyAdapter, SimpleNamespace(index_k_with_scale_buffer=None),
         "dsv4-indexer-fp4-split"),
    ],
)  # fmt: skip
def test_built_in_families_declare_their_fallback_names(
    adapter: type[LeafAdapter], native: Any, name: str
) -> None:
    assert adapter.layout_name(native) == name


def test_the_fallback_runs_no_property() -> None:
    class Pool:
        @property
        def kv_layout(self) -> str:
            raise AssertionError("a property ran")

    assert SingleKVAdapter.layout_name(Pool()) == "v4"
