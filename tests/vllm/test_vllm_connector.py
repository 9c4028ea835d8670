"""``examples/vllm_connector.py`` against vLLM's own connector base and caches, every case."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

pytest.importorskip(
    "vllm.v1.kv_cache_interface",
    reason="vLLM is not installed: `make vllm` (tests/vllm_matrix.py) runs this tier",
)

from tests._vllm import builders

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vllm_connector.py"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_connector_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example() -> ModuleType:
    return _example()


def _cases() -> list[str]:
    found = list(builders.SERVED)
    if builders.has_extensible():
        found += [f"extensible:{case}" for case in builders.EXTENSIBLE]
    return found


@pytest.mark.parametrize("case", _cases())
def test_connector_moves_a_request_bit_exactly(example: ModuleType, case: str) -> None:
    extensible = case.startswith("extensible:")
    name = case.removeprefix("extensible:")
    built = builders.build_extensible(name) if extensible else builders.build(name)
    for view in built.kv_caches.values():
        raw = view.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8))
        if view.dtype.is_floating_point:  # finite values only: NaN bytes never compare equal
            view.copy_(torch.randn(view.shape).to(view.dtype))
    connector = example.connector_for(built.kv_caches, built.config)
    assert isinstance(connector, example.KVConnectorBase_V1)
    storages = {v.untyped_storage().data_ptr(): v for v in built.kv_caches.values()}
    before = {
        ptr: torch.empty(0, dtype=torch.uint8).set_(v.untyped_storage()).clone()
        for ptr, v in storages.items()
    }
    out = example.round_trip(connector, source=[5, 2], target=[1, 3])
    decoded = [p for name, p in connector._parts().items() if name != "state"]
    assert out.count("identical") == sum(len(p.layer_ids) for p in decoded)
    # Only the target blocks' bytes changed (the source blocks are left as they were).
    for ptr, view in storages.items():
        after = torch.empty(0, dtype=torch.uint8).set_(view.untyped_storage())
        changed = set((after != before[ptr]).nonzero().flatten().tolist())
        allowed: set[int] = set()
        for layer_view in built.kv_caches.values():
            if layer_view.untyped_storage().data_ptr() != ptr:
                continue
            size = layer_view.element_size()
            per_block = layer_view[0].numel() * size
            for block in (1, 3):
                first = (layer_view.storage_offset() + block * layer_view.stride(0)) * size
                allowed.update(range(first, first + per_block))
        assert changed <= allowed


def test_the_example_runs_as_a_script() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "layer 1: (32, 2, 64) identical" in done.stdout
