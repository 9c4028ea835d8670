"""Oracle of the fp8 indexer keys (132 B/token): the DSv4 indexer pool's and DSA's
``IndexKeyCache`` stores."""

from __future__ import annotations

import torch

from _oracle._common import (
    Result,
    check,
    fail_or_pass,
    tile_values,
)
from kvcompat.layouts import (
    DSV4_INDEXER_FP8,
    dequantize,
    quantize,
)


@check(
    DSV4_INDEXER_FP8,
    code="`DeepSeekV4IndexerPool.set_index_k_scale_buffer` (`SetKAndS`, fp8 indexer) vs kvcompat "
    "`write`",
    compared="placement, scales, untouched bytes (the CUDA quantizer's arithmetic: GPU run owed)",
)
def dsv4_indexer_fp8_pool_store() -> Result:
    """kvcompat's ``write`` on a real fp8 ``DeepSeekV4IndexerPool`` against the pool's own
    ``set_index_k_scale_buffer`` (SGLang's Triton ``SetKAndS``, interpreter) handed the codes
    and scales kvcompat's codec computes: placement, scale bytes and untouched bytes. The
    quantizing store is CUDA JIT (``fused_store_indexer_cache``): its arithmetic is checked
    on the GPU tier (owed)."""
    from _sglang.builders import build_dsv4_indexer_pool

    import kvcompat

    theirs = build_dsv4_indexer_pool(use_fp4_indexer=False, layer_num=2)
    ours = build_dsv4_indexer_pool(use_fp4_indexer=False, layer_num=2)
    for pool in (theirs, ours):
        for buf in pool.index_k_with_scale_buffer:
            noise = torch.randint(0, 256, buf.shape, generator=torch.Generator().manual_seed(5))
            buf.copy_(noise.to(torch.uint8))
    loc = torch.randperm(theirs.size, generator=torch.Generator().manual_seed(3))[:9]
    values = tile_values(loc.numel(), 128, 128, seed=11, dtype=torch.bfloat16)
    codes, scales = DSV4_INDEXER_FP8.codec.encode(DSV4_INDEXER_FP8, values, fnuz=False)
    theirs.set_index_k_scale_buffer(
        1, loc, codes.view(torch.float8_e4m3fn), scales.view(torch.float32).reshape(-1)
    )
    pool = kvcompat.adapt(ours)
    pool.write(1, loc, values)
    problems = [
        f"layer {layer} bytes differ"
        for layer in (0, 1)
        if not torch.equal(
            theirs.index_k_with_scale_buffer[layer], ours.index_k_with_scale_buffer[layer]
        )
    ]
    back = pool.read(1, loc).reshape(loc.numel(), -1)
    expected = codes.view(torch.float8_e4m3fn).float() * scales.view(torch.float32)
    if not torch.equal(back, expected):
        problems.append("read is not fp32(e4m3) * scale")
    return fail_or_pass(problems, f"{loc.numel()} tokens placed byte-identically")


@check(
    DSV4_INDEXER_FP8,
    code="`DSATokenToKVPool.set_index_k_scale_buffer` (`IndexKeyCache.store_quantized`) vs "
    "kvcompat `quantize`",
    compared="placement at `index_page_size`, scales, read",
)
def dsa_index_k_cache_store() -> Result:
    """DSA's ``IndexKeyCache`` holds the fp8 indexer bytes: the pool's own
    ``set_index_k_scale_buffer`` (``store_quantized``, SGLang's Triton ``SetKAndS`` under the
    interpreter) handed kvcompat's codes and scales equals kvcompat's ``quantize`` of the same
    values into the kernel view ``get_index_k_with_scale_buffer`` at ``index_page_size``; the
    read back is ``fp32(e4m3) * scale``. (On CUDA, DSA's fused store
    ``dsa/fused_store_index_cache.cuh`` has the DSv4 indexer store's arithmetic.)"""
    from _sglang.builders import build_dsa_pool

    pool = build_dsa_pool()
    view = pool.get_index_k_with_scale_buffer(0)
    # 0.5.21 on may page the index keys apart from the KV; before, they share page_size.
    page = int(getattr(pool, "index_page_size", pool.page_size))
    expected = view.clone()
    loc = torch.randperm(view.shape[0] * page, generator=torch.Generator().manual_seed(4))[:7]
    values = tile_values(loc.numel(), 128, 128, seed=12, dtype=torch.bfloat16)
    codes, scales = DSV4_INDEXER_FP8.codec.encode(DSV4_INDEXER_FP8, values, fnuz=False)
    pool.set_index_k_scale_buffer(
        0, loc, codes.view(torch.float8_e4m3fn), scales.view(torch.float32).reshape(-1)
    )
    quantize(DSV4_INDEXER_FP8, values, expected, loc, page)
    problems = []
    if not torch.equal(pool.get_index_k_with_scale_buffer(0), expected):
        problems.append("pool bytes differ from kvcompat's quantize")
    back = dequantize(DSV4_INDEXER_FP8, expected, loc, page)
    if not torch.equal(back, codes.view(torch.float8_e4m3fn).float() * scales.view(torch.float32)):
        problems.append("read is not fp32(e4m3) * scale")
    return fail_or_pass(problems, f"{loc.numel()} tokens, page {page}: byte-identical")


def _dsa_or_nsa_pool(start_layer: int) -> object:
    """A DSA pool of the installed release: ``DSATokenToKVPool``, or 0.5.12's
    ``NSATokenToKVPool`` (ReleaseLacks when it has neither)."""
    from _sglang.builders import build_dsa_pool, build_nsa_pool
    from _sglang.features import has_class

    build = build_dsa_pool if has_class("DSATokenToKVPool") else build_nsa_pool
    return build(start_layer=start_layer, layer_num=2)


@check(
    DSV4_INDEXER_FP8,
    code="`DSATokenToKVPool.set_index_k_scale_buffer` vs kvcompat "
    "`adapt(pool).components['indexer'].write`",
    compared="placement at `index_page_size` (start_layer 2, out-of-order locs over pages), "
    "scales, every other byte of the index keys and the latent rows",
)
def dsa_indexer_component_store() -> Result:
    """kvcompat's ``indexer`` component of a real DSA pool (``start_layer=2``) writes what the
    pool's own ``set_index_k_scale_buffer`` (SGLang's Triton ``SetKAndS``, interpreter)
    writes when handed the codes and scales kvcompat's codec computes (the torch twin):
    the ``uint8`` views of every layer's index keys are equal, so is every latent row, and
    the component reads back ``fp32(e4m3) * scale``."""
    from _sglang.features import ReleaseLacks

    import kvcompat

    theirs, ours = _dsa_or_nsa_pool(2), _dsa_or_nsa_pool(2)
    writer = getattr(theirs, "set_index_k_scale_buffer", None)
    if writer is None:
        raise ReleaseLacks(f"{type(theirs).__name__}.set_index_k_scale_buffer")
    for pool in (theirs, ours):
        for layer, buf in enumerate(pool.index_k_with_scale_buffer):
            noise = torch.randint(0, 256, buf.shape, generator=torch.Generator().manual_seed(layer))
            buf.copy_(noise.to(torch.uint8))
    part = kvcompat.adapt(ours).components["indexer"]
    capacity = ours.index_k_with_scale_buffer[1].shape[0] * part.page_size
    # Out of order, across every page; the last row of the last page is included.
    loc = torch.randperm(capacity, generator=torch.Generator().manual_seed(6))[:11]
    loc[0] = capacity - 1
    values = tile_values(loc.numel(), 128, 128, seed=13, dtype=torch.bfloat16)
    codes, scales = DSV4_INDEXER_FP8.codec.encode(DSV4_INDEXER_FP8, values, fnuz=False)
    writer(3, loc, codes.view(torch.float8_e4m3fn), scales.view(torch.float32).reshape(-1))
    part.write(3, loc, values, impl="torch")
    problems = [
        f"{name}[{slot}] bytes differ"
        for name in ("index_k_with_scale_buffer", "kv_buffer")
        for slot in (0, 1)
        if not torch.equal(
            getattr(theirs, name)[slot].view(torch.uint8),
            getattr(ours, name)[slot].view(torch.uint8),
        )
    ]
    back = part.read(3, loc, impl="torch").reshape(loc.numel(), -1)
    expected = codes.view(torch.float8_e4m3fn).float() * scales.view(torch.float32)
    if not torch.equal(back, expected):
        problems.append("read is not fp32(e4m3) * scale")
    return fail_or_pass(problems, f"{loc.numel()} tokens, start_layer 2: byte-identical")
