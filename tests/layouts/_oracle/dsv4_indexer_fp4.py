"""Oracle of the DeepSeek-V4 fp4 indexer keys: SGLang's Triton store and the pool's reader."""

from __future__ import annotations

import torch
from _sglang.features import fp4_indexer_store

from _oracle._common import (
    Result,
    check,
    fail_or_pass,
    nan_aware_equal,
    tile_values,
)
from kvcompat.layouts import (
    DSV4_INDEXER_FP4,
    DSV4_INDEXER_FP4_RNE,
    LayoutSpec,
    dequantize,
    quantize,
)


def _indexer_fp4_store(spec: LayoutSpec, *, rne: bool) -> Result:
    """SGLang's Triton quantizer + store (``store_fp4_index_k_cache``) under the interpreter,
    against kvcompat's codec, whole pages. The interpreter's arithmetic here is exact (IEEE
    ``amax / 6``, a division by a power of two, comparisons, integer exponents). A GPU may
    compile ``amax / 6`` into ``amax * fl(1/6)`` (as it does DSA's ``/ 448``); the ceiled
    exponent then differs only if the two land on opposite sides of a power of two (the
    GPU run is owed)."""
    store = fp4_indexer_store(rne=rne)

    problems, tokens = [], 0
    for page_size, seed in ((64, 41), (128, 42)):
        n = 3 * page_size // 2
        values = tile_values(n, 128, 32, seed=seed, dtype=torch.bfloat16)
        values[5, :32] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 4) * -1
        values[5, 31] = 6.0  # scale exactly 1: the thresholds themselves are the values
        g = torch.Generator().manual_seed(seed)
        loc = torch.randperm(3 * page_size, generator=g)[:n]
        theirs = torch.zeros(3, page_size * 68, dtype=torch.uint8)
        store(values, theirs, loc, page_size=page_size)
        ours = torch.zeros_like(theirs)
        quantize(spec, values, ours, loc, page_size)
        if not torch.equal(theirs, ours):
            bad = int((theirs != ours).sum())
            problems.append(f"P={page_size}: {bad} of {theirs.numel()} bytes differ")
        tokens += n
    return fail_or_pass(problems, f"{tokens} tokens, whole pages byte-identical")


@check(
    DSV4_INDEXER_FP4,
    code="`store_fp4_index_k_cache` + `quantize_fp4_indexer_tensor` (DSv4 fp4 indexer, Triton)",
    compared="whole pages, threshold and ties-to-even rounding, P = 64, 128",
)
def dsv4_indexer_fp4_store_triton() -> Result:
    return _indexer_fp4_store(DSV4_INDEXER_FP4, rne=False)


@check(
    DSV4_INDEXER_FP4_RNE,
    code="`store_fp4_index_k_cache` + `quantize_fp4_indexer_tensor` (DSv4 fp4 indexer, Triton)",
    compared="whole pages, threshold and ties-to-even rounding, P = 64, 128",
)
def dsv4_indexer_fp4_rne_store_triton() -> Result:
    return _indexer_fp4_store(DSV4_INDEXER_FP4_RNE, rne=True)


@check(
    DSV4_INDEXER_FP4,
    DSV4_INDEXER_FP4_RNE,
    code="`DeepSeekV4IndexerPool.get_index_k_dequant` (fp4, torch)",
    compared="every payload byte x every scale byte",
)
def dsv4_indexer_fp4_pool_dequant() -> Result:
    """``DeepSeekV4IndexerPool.get_index_k_dequant`` (torch) on pages of random bytes, every
    payload byte against every scale byte, against kvcompat's reader."""
    from _sglang.builders import build_dsv4_indexer_pool

    pool = build_dsv4_indexer_pool(use_fp4_indexer=True, layer_num=1)
    buf = pool.index_k_with_scale_buffer[0]
    page = pool.page_size
    g = torch.Generator().manual_seed(7)
    buf.copy_(torch.randint(0, 256, buf.shape, generator=g).to(torch.uint8))
    slots = torch.arange(min(pool.size, buf.shape[0] * page))
    # Every scale byte for some group: overwrite the first 64 tokens' scale words.
    scale_bytes = torch.arange(256, dtype=torch.uint8).reshape(64, 4)
    buf[0, page * 64 : page * 64 + 256] = scale_bytes.reshape(-1)
    theirs = pool.get_index_k_dequant(0, slots)
    ours = dequantize(DSV4_INDEXER_FP4, buf, slots, page)
    same = nan_aware_equal(theirs, ours)
    if not bool(same.all()):
        return "fail", f"{int((~same).sum())} of {same.numel()} values differ"
    return "pass", f"{slots.numel()} tokens x 128 values identical (all 256 scale bytes)"


@check(
    DSV4_INDEXER_FP4,
    DSV4_INDEXER_FP4_RNE,
    code="`DeepSeekV4IndexerPool.set_index_fp4` vs kvcompat `write`/`read`",
    compared="real pool, both roundings",
)
def dsv4_indexer_fp4_pool_io() -> Result:
    """kvcompat's ``write`` on a real fp4 ``DeepSeekV4IndexerPool`` against the pool's own
    ``set_index_fp4`` (Triton, interpreter), both roundings; ``read`` against
    ``get_index_k_dequant``."""
    from _sglang.builders import build_dsv4_indexer_pool

    import kvcompat

    problems = []
    for rne in (False, True):
        theirs = build_dsv4_indexer_pool(use_fp4_indexer=True, layer_num=2)
        ours = build_dsv4_indexer_pool(use_fp4_indexer=True, layer_num=2)
        theirs.index_k_rne = ours.index_k_rne = rne
        loc = torch.tensor([1, 5, 63, 64, 100])
        values = tile_values(loc.numel(), 128, 32, seed=9, dtype=torch.bfloat16)
        theirs.set_index_fp4(1, loc, values)
        pool = kvcompat.adapt(ours)
        pool.write(1, loc, values)
        problems.extend(
            f"rne={rne}: layer {layer} bytes differ after the write"
            for layer in (0, 1)
            if not torch.equal(
                theirs.index_k_with_scale_buffer[layer], ours.index_k_with_scale_buffer[layer]
            )
        )
        back = pool.read(1, loc).reshape(loc.numel(), -1)
        if not bool(nan_aware_equal(back, theirs.get_index_k_dequant(1, loc)).all()):
            problems.append(f"rne={rne}: read differs from get_index_k_dequant")
    return fail_or_pass(problems, "write bytes and read values identical (both roundings)")
