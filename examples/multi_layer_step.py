"""Move every layer of a step in one call: plan once, then read and write all layers.

On three reference pools (MHA, MLA, DeepSeek-V4), it writes random keys (and values) for a
few tokens on every layer with one ``write``, reads them back with one ``read`` of every
layer, and checks both against the per-layer calls they replace, byte for byte. On a CUDA
device with triton each call is one Triton launch for all the layers; on a CPU the torch
twin runs them layer by layer with the same bytes. Last, a composite (a sliding-window
pool): every layer of both its components in one call, each with locations in its own
token space (``plan_components``; a DeepSeek-V4 pool's four components work the same way).

Run: python examples/multi_layer_step.py
"""

from __future__ import annotations

import torch

import kvcompat
from kvcompat.testing import (
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
    ReferenceMLATokenToKVPool,
    reference_swa_pool,
)


def pools(device: str) -> dict[str, object]:
    return {
        "MHA": ReferenceMHATokenToKVPool(
            256, 16, torch.bfloat16, head_num=4, head_dim=64, layer_num=6, start_layer=2,
            device=device,
        ),
        "MLA": ReferenceMLATokenToKVPool(256, 16, layer_num=6, device=device),
        "DeepSeek-V4": ReferenceDeepSeekV4SingleKVPool(
            size=1024, page_size=64, layer_num=6, device=device
        ),
    }  # fmt: skip


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for name, native in pools(device).items():
        pool = kvcompat.adapt(native)
        step = pool.plan()  # every layer: layouts and buffers checked once, plan kept
        layout = step.layout
        loc = torch.tensor([200, 3, 77, 130], device=device)  # pages out of order
        shape = (
            len(step.layers),
            loc.numel(),
            layout.key.heads,
            layout.key.dim // layout.key.heads,
        )
        keys = torch.randn(shape, device=device).to(torch.bfloat16)
        values = None
        if layout.value is not None:
            values = torch.randn(
                len(step.layers), loc.numel(), layout.value.heads,
                layout.value.dim // layout.value.heads, device=device,
            ).to(torch.bfloat16)  # fmt: skip
        step.write(loc, keys, values)  # all layers, all or nothing
        together = step.read(loc)  # [layers, n, heads, head_dim]
        one_by_one = torch.stack([pool.read(layer, loc) for layer in step.layers])
        assert torch.equal(together.view(torch.uint8), one_by_one.view(torch.uint8))
        print(
            f"{name:12} layers {step.layers[0]}..{step.layers[-1]}: one read of "
            f"{tuple(together.shape)} {together.dtype}, equal to {len(step.layers)} "
            "single-layer reads"
        )

    composite = kvcompat.adapt(reference_swa_pool(device=device))
    step = composite.plan_components()  # every component, every layer
    locs = {
        "full": torch.tensor([9, 2, 30], device=device),
        "swa": torch.tensor([5], device=device),
    }
    keys = {}
    for part in step.components:
        spec = composite.components[part].layout(step.layers[part][0]).key
        shape = (len(step.layers[part]), locs[part].numel(), spec.heads, spec.dim // spec.heads)
        keys[part] = torch.randn(shape, device=device).to(torch.bfloat16)
    step.write(locs, keys, {part: -keys[part] for part in step.components})
    together = step.read(locs)
    for part in step.components:
        native = composite.components[part]
        one_by_one = torch.stack([native.read(layer, locs[part]) for layer in step.layers[part]])
        assert torch.equal(together[part].view(torch.uint8), one_by_one.view(torch.uint8))
    shapes = {part: tuple(keys.shape) for part, keys in together.items()}
    print(f"composite    every component in one call: {shapes}, equal to single-layer reads")


if __name__ == "__main__":
    main()
