"""The recipe of docs/extending.md, as a test: public names only, every feature working."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import kvcompat
from kvcompat import PoolKind
from kvcompat.adapters import Buffer, LayerLayout, LeafAdapter
from kvcompat.compat import LogicalView
from kvcompat.layouts import V4
from kvcompat.testing import check_pool

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


class PackedAdapter(LeafAdapter):
    kind = PoolKind.SINGLE_KV
    source_attr = "pages"  # native attribute: one tensor per layer
    native_waits = False
    buffers = (Buffer("pages", "packed_kv", rows="page"),)

    def layer_buffers(self, source: Any, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        key = source[slot]
        return key, key  # the value is the key storage

    def detect_layout(self, layer_id: int, key: Any, value: Any) -> LayerLayout:
        return LayerLayout(V4)  # every layer holds V4 pages


class PackedPool:
    """A user's engine pool: V4 pages in ``pages``, and a pointer table kvcompat does not know."""

    def __init__(self, size: int = 128, page_size: int = 64, layer_num: int = 3) -> None:
        self.size, self.page_size, self.layer_num = size, page_size, layer_num
        self.dtype, self.device, self.start_layer = torch.uint8, "cpu", 0
        pages = -(-(size + page_size) // page_size)
        self.pages = [
            torch.zeros(pages, V4.page_bytes(page_size), dtype=torch.uint8)
            for _ in range(layer_num)
        ]
        self.page_table = torch.arange(pages, dtype=torch.int32)


QUALNAME = f"{PackedPool.__module__}.PackedPool"


@pytest.fixture
def taught() -> Iterator[None]:
    kvcompat.register_adapter(QUALNAME, PackedAdapter)
    yield
    kvcompat.unregister_adapter(QUALNAME)


def test_the_doc_shows_this_recipe() -> None:
    code = DOC.read_text()
    for line in (
        "class PackedAdapter(LeafAdapter):",
        'buffers = (Buffer("pages", "packed_kv", rows="page"),)',
        "def layer_buffers(self, source, slot):",
        "def detect_layout(self, layer_id, key, value):",
        "return LayerLayout(V4)",
        'kvcompat.register_adapter("my_engine.pools.PackedPool", PackedAdapter)',
    ):
        assert line in code, line
    assert not re.search(r"\b_build\b", code), "the recipe must use public hooks only"


def test_getters_read_and_write(taught: None) -> None:
    native = PackedPool()
    assert kvcompat.is_single_kv_pool(native)
    pool = kvcompat.adapt(native)
    assert pool.get_key_buffer(2) is native.pages[2]
    assert pool.get_value_buffer(2) is native.pages[2]
    loc = torch.tensor([3, 70, 129])
    keys = torch.randn(3, 1, 512, dtype=torch.bfloat16)
    pool.write(1, loc, keys)
    back = pool.read(1, loc)
    assert back.shape == (3, 1, 512)
    assert ((back.float() - keys.float()).abs() <= keys.float().abs().max() / 8).all()
    assert int(native.pages[0].count_nonzero()) == 0  # other layers untouched


def test_describe_memory_report_and_descriptors(taught: None) -> None:
    native = PackedPool()
    manifest = kvcompat.describe(native)
    roles = {entry.path: entry.role.value for entry in manifest.iter_tensors()}
    assert roles == {
        "pages[0]": "packed_kv",
        "pages[1]": "packed_kv",
        "pages[2]": "packed_kv",
        "page_table": "opaque",
    }
    assert manifest.layout == "v4"
    report = kvcompat.memory_report(native)
    assert report.total_bytes == sum(t.nbytes for t in native.pages) + native.page_table.nbytes
    descriptors = kvcompat.transfer_descriptors(native)
    assert [(d.path, d.layer_id, d.group.value) for d in descriptors] == [
        ("pages[0]", 0, "kv"),
        ("pages[1]", 1, "kv"),
        ("pages[2]", 2, "kv"),
    ]
    assert all(d.item_length == V4.page_bytes(64) for d in descriptors)


def test_compat_and_check_pool(taught: None) -> None:
    native = PackedPool()
    legacy = kvcompat.compat(native)
    k, v = legacy.get_kv_buffer(0)
    assert k is v
    # A packed pool's buffers come back as logical token-row views over the very pages.
    assert isinstance(k, LogicalView)
    assert k.storage_tensor is native.pages[0]
    assert list(k.shape)[-2:] == [1, 512]
    loc = torch.tensor([0, 5, 70])
    pool = kvcompat.adapt(native)
    pool.write(0, loc, torch.randn(3, 1, 512, dtype=torch.bfloat16))
    assert torch.equal(k[loc].reshape(3, -1), pool.read(0, loc).reshape(3, -1))
    assert check_pool(native).ok
