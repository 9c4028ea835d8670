"""A minimal vLLM KV connector on kvcompat: offload a request's blocks to host memory and back.

``register_kv_caches`` adapts what vLLM hands the connector with
``kvcompat.adapt(kv_caches, config=kv_cache_config)``; save and load then move a request's
blocks through kvcompat's getters, which view the registered storage (every component, every
layer, keys and values, DeepSeek-V4's indexer pages included), and check them through the
key-first reads. Nothing here depends on the model's format, layout or vLLM release.

Needs vLLM importable (the tier in ``tests/vllm`` runs it under every supported release, as
``docs/vllm.md`` says); without it, says so and exits 0.

Run: python examples/vllm_connector.py
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

import kvcompat

if importlib.util.find_spec("vllm") is None:
    print(
        "skipped: vllm is not installed here. Run the vLLM tier (python tests/vllm_matrix.py), "
        "which installs each supported release as an overlay, or install vLLM yourself."
    )
    sys.exit(0)

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)


@dataclass
class HostOffloadMetadata(KVConnectorMetadata):
    """What the scheduler tells the workers this step: request id -> block ids."""

    save: dict[str, list[int]] = field(default_factory=dict)
    load: dict[str, list[int]] = field(default_factory=dict)


class KVCompatHostConnector(KVConnectorBase_V1):
    """Saves finished requests' blocks to host memory and loads them into new blocks.

    The worker side is all kvcompat: one adapter over the registered caches, and a loop over
    its components and layers that is the same for MHA, MLA and DeepSeek-V4.
    """

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.pool: kvcompat.KVPoolProtocol | None = None
        self.host: dict[str, dict[tuple[str, int, str], torch.Tensor]] = {}
        self.pending = HostOffloadMetadata()

    # -- worker side ------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self.pool = kvcompat.adapt(kv_caches, config=self._kv_cache_config)

    def _parts(self) -> dict[str, kvcompat.KVPoolProtocol]:
        assert self.pool is not None, "register_kv_caches has not run"
        return dict(self.pool.components) or {"": self.pool}

    def _buffers(self) -> list[tuple[tuple[str, int, str], torch.Tensor]]:
        """Every per-layer buffer a request's blocks live in: (component, layer, role)."""
        found = []
        for name, part in self._parts().items():
            for layer in part.layer_ids:
                pair = part.get_kv_buffer(layer, wait=False) if part.kind.has_values else None
                found.append(((name, layer, "key"), part.get_key_buffer(layer, wait=False)))
                if pair is not None and not pair.shared:
                    found.append(((name, layer, "value"), pair.value))
        return found

    def save_request(self, request_id: str, blocks: list[int]) -> None:
        index = torch.tensor(blocks)
        self.host[request_id] = {
            where: buffer[index].to("cpu", copy=True) for where, buffer in self._buffers()
        }

    def load_request(self, request_id: str, blocks: list[int]) -> None:
        saved = self.host.pop(request_id)
        index = torch.tensor(blocks)
        for where, buffer in self._buffers():
            buffer[index] = saved[where].to(buffer.device)  # one indexed store per buffer

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        metadata = self._get_connector_metadata()
        assert isinstance(metadata, HostOffloadMetadata)
        for request_id, blocks in metadata.load.items():
            self.load_request(request_id, blocks)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None  # start_load_kv loads every layer before the forward pass

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return None  # wait_for_save saves whole requests after the forward pass

    def wait_for_save(self) -> None:
        metadata = self._get_connector_metadata()
        assert isinstance(metadata, HostOffloadMetadata)
        for request_id, blocks in metadata.save.items():
            self.save_request(request_id, blocks)

    # -- scheduler side ---------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        return None

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        metadata, self.pending = self.pending, HostOffloadMetadata()
        return metadata


def slots(pool: kvcompat.KVPoolProtocol, blocks: list[int]) -> torch.Tensor:
    """vLLM's slot mapping of whole blocks: ``block * N + offset``."""
    per_block = pool.page_size
    return torch.tensor([b * per_block + s for b in blocks for s in range(per_block)])


def round_trip(connector: KVCompatHostConnector, source: list[int], target: list[int]) -> str:
    """Save ``source`` blocks, load them into ``target``: the same bytes, the same reads."""
    parts = connector._parts()
    index, into = torch.tensor(source), torch.tensor(target)
    saved = {where: buffer[index].clone() for where, buffer in connector._buffers()}
    before = {
        (name, layer): part.read(layer, slots(part, source))
        for name, part in parts.items()
        for layer in part.layer_ids
        if _has_codec(part, layer)
    }
    connector.bind_connector_metadata(HostOffloadMetadata(save={"req-0": source}))
    connector.wait_for_save()
    connector.bind_connector_metadata(HostOffloadMetadata(load={"req-0": target}))
    connector.start_load_kv(None)
    for (name, layer, role), buffer in connector._buffers():
        if not torch.equal(
            buffer[into].view(torch.uint8), saved[name, layer, role].view(torch.uint8)
        ):
            msg = f"{name or 'pool'} layer {layer} {role}: the loaded blocks hold other bytes"
            raise AssertionError(msg)
    lines = []
    for (name, layer), keys in before.items():
        part = parts[name]
        after = part.read(layer, slots(part, target))
        if not torch.equal(after.view(torch.uint8), keys.view(torch.uint8)):
            msg = f"{name or 'pool'} layer {layer}: the loaded blocks read differently"
            raise AssertionError(msg)
        lines.append(f"{name or part.kind.value:>8} layer {layer}: {tuple(keys.shape)} identical")
    return "\n".join(lines)


def _has_codec(part: kvcompat.KVPoolProtocol, layer: int) -> bool:
    """Whether the layer's bytes decode (DeepSeek-V4's compressor state moves as bytes only)."""
    try:
        part.layout(layer)
    except kvcompat.LayoutError:
        return False
    return True


def _demo_caches() -> tuple[dict[str, torch.Tensor], Any]:
    """An MHA model's caches from vLLM's own planner and allocator, on the CPU."""
    from types import SimpleNamespace

    from vllm.v1.core.kv_cache_planning import get_kv_cache_config_from_groups
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec
    from vllm.v1.kv_cache_layout import KVCacheLayout
    from vllm.v1.worker.utils import allocate_kv_cache

    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    names = [f"model.layers.{i}.self_attn.attn" for i in (0, 1)]
    cache = SimpleNamespace(
        prefix_cache_retention_interval=None,
        num_gpu_blocks_override=8,
        get_resolved_kv_cache_layout=lambda: KVCacheLayout.LBNHC,
    )
    stub = SimpleNamespace(
        cache_config=cache, attention_config=SimpleNamespace(hisparse_config=None)
    )
    config = get_kv_cache_config_from_groups(stub, [KVCacheGroupSpec(names, spec)], 1 << 40)
    caches = allocate_kv_cache(config, torch.device("cpu"), KVCacheLayout.LBNHC)
    for view in caches.values():
        view.copy_(torch.randn(view.shape).to(view.dtype))
    return caches, config


def connector_for(kv_caches: dict[str, torch.Tensor], config: Any) -> KVCompatHostConnector:
    """A worker-side connector as vLLM builds it, with its caches registered."""
    from types import SimpleNamespace

    vllm_config = SimpleNamespace(kv_transfer_config=SimpleNamespace(kv_role="kv_both"))
    connector = KVCompatHostConnector(vllm_config, KVConnectorRole.WORKER, config)
    connector.register_kv_caches(kv_caches)
    return connector


def main() -> None:
    caches, config = _demo_caches()
    connector = connector_for(caches, config)
    print(f"adapted: {connector.pool!r}")
    print(round_trip(connector, source=[5, 2], target=[1, 6]))


if __name__ == "__main__":
    main()
