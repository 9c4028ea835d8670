"""SGLang 0.5.23's own, unmodified ``TorchNativeAttnBackend`` through ``kvcompat.compat``.

Each scenario runs prefill, an extend over the cached prefix, and a decode step for two
requests of different lengths, layer by layer, on SGLang's real pool classes. The backend's
inputs are SGLang's own classes, built on CPU: ``RadixAttention`` layers, a ``ReqToTokenPool``
holding each request's (shuffled, non-contiguous) slots, and a ``ForwardBatch``. The one
stand-in is the model runner, a namespace with exactly the three attributes the backend's
constructor reads (``device``, ``req_to_token_pool``, ``token_to_kv_pool``).

What is compared with what:

* MHA and SWA-of-MHA: the outputs through ``compat`` are **bit-identical** to the native pool's
  (the proxy returns the native tensors), and match a dense fp32 attention over the K/V handed
  in within bf16 rounding.
* DeepSeek-V4 (``DeepSeekV4SingleKVPool``; ``DeepSeekV4TokenToKVPool``, whose every layer keeps
  its sliding window in the SWA sub-pool): the native pools cannot run the backend at all
  (their getters raise). Through ``compat`` the output matches (a) a dense fp32 attention over
  the values kvcompat reads back, within bf16 rounding of SDPA (``rel-L2 <= 2**-7``), and (b) a
  dense fp32 attention over the K/V handed in, within the V4 layout's quantization error. The
  bound for (b): V4 stores 448 of the 512 dims as e4m3 with a power-of-two scale per 64-value
  tile and the 64 rope dims as bf16; e4m3 rounds to nearest with 3 mantissa bits, so each
  stored value is off by at most half an ulp, ``2**-4`` relative, hence
  ``||K_stored - K|| <= 2**-4 ||K||`` (6.25 %), and the test asserts the attention output's
  rel-L2 error stays under that same 6.25 %. Measured: about 3.5 %, all of it fp8 rounding.

``TorchNativeAttnBackend`` reads a sliding-window layer's cache at ``req_to_token``'s
full-pool locations: it never translates reads (only writes, through ``swa_out_cache_loc``).
So its output is right only when the full->SWA mapping is the identity -- the configuration
SGLang's own ``kv_cache_configurator`` builds when ``swa_uses_full_indices`` is set. The dense
comparisons use that identity mapping; with a scrambled mapping the native pool reads other
slots, and through ``compat`` it reads exactly the same ones (still bit-identical).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _sglang import builders as b
from _sglang.env import prepare_sglang
from _sglang.features import swa_writes_take_swa_loc, torch_native_sliding_window

import kvcompat

DEVICE = "cpu"
Q_HEADS = 4
# Two requests: (prefill length, extend length); then one decode token each.
REQUESTS: tuple[tuple[int, int], ...] = ((6, 3), (4, 2))


def _modules() -> SimpleNamespace:
    prepare_sglang()
    import sglang.srt.layers.attention.torch_native_backend as torch_native
    import sglang.srt.layers.radix_attention as radix
    import sglang.srt.mem_cache.memory_pool as memory_pool
    import sglang.srt.model_executor.forward_batch_info as batch_info

    return SimpleNamespace(
        backend=torch_native.TorchNativeAttnBackend,
        radix=radix.RadixAttention,
        req_pool=memory_pool.ReqToTokenPool,
        batch=batch_info.ForwardBatch,
        mode=batch_info.ForwardMode,
    )


@dataclass
class Scenario:
    """One model's geometry and the layers to run (global id -> sliding window, -1: none)."""

    kv_heads: int
    head_dim: int
    windows: dict[int, int]
    shared_kv: bool = False  # DSv4: the value is the key latent
    seed: int = 0
    slots: list[torch.Tensor] = field(default_factory=list)


def _slots(
    total: int, capacity: int, seed: int, allocated: torch.Tensor | None = None
) -> list[torch.Tensor]:
    """Each request's token slots: a shuffled set of distinct slots in [1, capacity), or of
    ``allocated`` (the full-pool locations an allocator-shaped mapping gave a slot)."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(capacity - 1, generator=gen)[:total] + 1
    if allocated is not None:
        perm = allocated[torch.randperm(allocated.numel(), generator=gen)[:total]]
    out, start = [], 0
    for prefill, extend in REQUESTS:
        n = prefill + extend + 1
        out.append(perm[start : start + n])
        start += n
    return out


def _layer(m: SimpleNamespace, sc: Scenario, layer_id: int) -> Any:
    return m.radix(
        num_heads=Q_HEADS,
        head_dim=sc.head_dim,
        scaling=1 / math.sqrt(sc.head_dim),
        num_kv_heads=sc.kv_heads,
        layer_id=layer_id,
        v_head_dim=sc.head_dim,
        sliding_window_size=sc.windows[layer_id],
    )


def _batch(
    m: SimpleNamespace, sc: Scenario, starts: Sequence[int], ends: Sequence[int], pools: Any
) -> Any:
    """A ForwardBatch writing tokens [start, end) of each request (decode: one token each).

    ``pools`` (the runner) also rides on the batch where the release's ``ForwardBatch`` has
    the fields: 0.5.12's backend reads ``forward_batch.token_to_kv_pool`` /
    ``req_to_token_pool`` instead of keeping the runner's.
    """
    decode = all(e - s == 1 for s, e in zip(starts, ends, strict=True)) and min(starts) > 0
    out_loc = torch.cat(
        [sc.slots[r][s:e] for r, (s, e) in enumerate(zip(starts, ends, strict=True))]
    )
    seq_lens = torch.tensor(list(ends))
    names = {f.name for f in dataclasses.fields(m.batch)}
    carried = {
        name: getattr(pools, name)
        for name in ("req_to_token_pool", "token_to_kv_pool")
        if name in names
    }
    return m.batch(
        forward_mode=m.mode.DECODE if decode else m.mode.EXTEND,
        batch_size=len(REQUESTS),
        input_ids=torch.zeros(out_loc.shape[0], dtype=torch.long),
        req_pool_indices=torch.arange(len(REQUESTS)),
        seq_lens=seq_lens,
        out_cache_loc=out_loc,
        seq_lens_sum=int(seq_lens.sum()),
        extend_prefix_lens=torch.tensor(list(starts)),
        extend_seq_lens=torch.tensor([e - s for s, e in zip(starts, ends, strict=True)]),
        **carried,
    )


def _inputs(sc: Scenario, layer_id: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per request: q [n, Q_HEADS, d], k/v [n, kv_heads, d] (bf16) for all its tokens."""
    gen = torch.Generator().manual_seed(1000 * sc.seed + layer_id)
    out = []
    for prefill, extend in REQUESTS:
        n = prefill + extend + 1
        q = torch.randn(n, Q_HEADS, sc.head_dim, generator=gen).to(torch.bfloat16)
        k = torch.randn(n, sc.kv_heads, sc.head_dim, generator=gen).to(torch.bfloat16)
        v = k.clone() if sc.shared_kv else torch.randn(n, sc.kv_heads, sc.head_dim, generator=gen)
        out.append((q, k, v.to(torch.bfloat16)))
    return out


def run_backend(pool: Any, sc: Scenario, backend_class: Any = None) -> dict[int, torch.Tensor]:
    """Prefill, extend over the cached prefix, decode; every layer's outputs, in token order.

    ``backend_class``: SGLang's backend class to run (default ``TorchNativeAttnBackend``).
    """
    m = _modules()
    capacity = max(int(s.max()) for s in sc.slots) + 1
    req_pool = m.req_pool(len(REQUESTS), capacity, DEVICE, False)
    for r, slots in enumerate(sc.slots):
        req_pool.req_to_token[r, : slots.shape[0]] = slots.to(req_pool.req_to_token.dtype)
    runner = SimpleNamespace(device=DEVICE, req_to_token_pool=req_pool, token_to_kv_pool=pool)
    backend = (m.backend if backend_class is None else backend_class)(runner)
    prefill = [p for p, _ in REQUESTS]
    total = [p + e for p, e in REQUESTS]
    steps = (([0, 0], prefill), (prefill, total), (total, [t + 1 for t in total]))
    outputs: dict[int, list[torch.Tensor]] = {layer: [] for layer in sc.windows}
    for starts, ends in steps:
        batch = _batch(m, sc, starts, ends, runner)
        backend.init_forward_metadata(batch)
        for layer_id in sc.windows:
            layer = _layer(m, sc, layer_id)
            data = _inputs(sc, layer_id)
            q, k, v = (
                torch.cat([d[i][s:e] for d, s, e in zip(data, starts, ends, strict=True)])
                for i in range(3)
            )
            forward = (
                backend.forward_decode
                if batch.forward_mode.is_decode()
                else (backend.forward_extend)
            )
            o = forward(q.reshape(q.shape[0], -1), k, v, layer, batch)
            outputs[layer_id].append(o.view(-1, Q_HEADS, sc.head_dim))
    return {layer: _by_request(sc, chunks) for layer, chunks in outputs.items()}


def _by_request(sc: Scenario, chunks: list[torch.Tensor]) -> torch.Tensor:
    """Reorder step outputs (step-major) into request-major token order."""
    prefill = [p for p, _ in REQUESTS]
    sizes = [prefill, [e for _, e in REQUESTS], [1] * len(REQUESTS)]
    per_request: list[list[torch.Tensor]] = [[] for _ in REQUESTS]
    for chunk, step_sizes in zip(chunks, sizes, strict=True):
        for r, part in enumerate(chunk.split(step_sizes)):
            per_request[r].append(part)
    return torch.cat([torch.cat(parts) for parts in per_request])


def dense_reference(
    sc: Scenario, layer_id: int, kv: Callable[[int, torch.Tensor, torch.Tensor], Any] | None = None
) -> torch.Tensor:
    """fp32 causal attention (with the layer's window) over each request's K/V, token order.

    ``kv(request, k, v)`` may replace the K/V handed in (e.g. by what the pool reads back).
    """
    # What the installed backend computes: a release whose backend has no sliding windows
    # (0.5.12) attends each layer's whole causal prefix.
    window = sc.windows[layer_id] if torch_native_sliding_window() else -1
    outs = []
    for r, (q, k_in, v_in) in enumerate(_inputs(sc, layer_id)):
        k, v = (k_in, v_in) if kv is None else kv(r, k_in, v_in)
        n = q.shape[0]
        group = Q_HEADS // sc.kv_heads
        kf = k.float().repeat_interleave(group, dim=1)
        vf = v.float().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q.float(), kf) / math.sqrt(sc.head_dim)
        pos = torch.arange(n)
        allowed = pos[None, :] <= pos[:, None]
        if window > -1:
            allowed &= pos[None, :] >= pos[:, None] - window
        scores = scores.masked_fill(~allowed, float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), vf))
    return torch.cat(outs)


def rel_l2(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.float() - ref).norm() / ref.norm())


def _identity_mapping(pool: Any, n: int) -> None:
    """SGLang's configurator's identity mode: SWA slots are full-pool slots."""
    mapping = torch.arange(n + 1, dtype=torch.int64)
    mapping[-1] = -1
    pool.register_mapping(mapping)
    pool.swa_uses_full_indices = True


# -- MHA: bit-identical to native -----------------------------------------------------------


def test_mha_pool_through_compat_is_bit_identical_to_native() -> None:
    sc = Scenario(kv_heads=2, head_dim=8, windows={0: -1, 1: 3}, seed=1)
    sc.slots = _slots(sum(p + e + 1 for p, e in REQUESTS), 64, seed=1)
    native = run_backend(b.build_mha_pool(), sc)
    through = run_backend(kvcompat.compat(b.build_mha_pool()), sc)
    for layer in sc.windows:
        assert torch.equal(native[layer], through[layer]), layer
        assert rel_l2(through[layer], dense_reference(sc, layer)) < 2**-7


@pytest.mark.parametrize("mapping", ["identity", "allocator"])
def test_swa_of_mha_through_compat_is_bit_identical_to_native(mapping: str) -> None:
    sc = Scenario(kv_heads=2, head_dim=8, windows={0: 2, 1: -1, 2: 4, 3: -1}, seed=2)
    total = sum(p + e + 1 for p, e in REQUESTS)
    pools = [b.build_swa_pool(), b.build_swa_pool()]
    if mapping == "identity":
        for pool in pools:
            _identity_mapping(pool, 64 + 16)
        sc.slots = _slots(total, 48, seed=2)
    else:  # a real allocator's shape: some full slots -> other SWA slots, the rest -> none
        # (full slots below the SWA pool's 48 rows: SGLang's backend reads SWA layers at
        # full-pool locations, which crashes natively past row 47)
        table, allocated = b.allocator_mapping(48, 48, seed=5)
        unmapped = torch.zeros(64 + 16 - 48, dtype=torch.int64)
        table = torch.cat([table[:-1], unmapped, table[-1:]])
        for pool in pools:
            pool.register_mapping(table)
        sc.slots = _slots(total, 48, seed=2, allocated=allocated)
    native = run_backend(pools[0], sc)
    proxy = kvcompat.compat(pools[1])
    assert isinstance(proxy, type(pools[1]))  # so the backend takes its sliding-window path
    if mapping == "allocator" and not swa_writes_take_swa_loc():
        # 0.5.12's backend hands a plain full-pool loc, which its pool translates; the
        # proxy's getters are the native tensors, indexed by SWA slot, so that loc cannot
        # mean one token in the write and in the backend's reads: refused, nothing written.
        before = [t.clone() for t in _all_tensors(pools[1])]
        with pytest.raises(kvcompat.WriteError, match="indexed by SWA slot"):
            run_backend(proxy, sc)
        assert all(torch.equal(x, y) for x, y in zip(before, _all_tensors(pools[1]), strict=True))
        return
    through = run_backend(proxy, sc)
    for layer in sc.windows:
        assert torch.equal(native[layer], through[layer]), layer
        if mapping == "identity":
            assert rel_l2(through[layer], dense_reference(sc, layer)) < 2**-7
    for mine, theirs in zip(_all_tensors(pools[1]), _all_tensors(pools[0]), strict=True):
        assert torch.equal(mine, theirs)  # the same bytes in the same slots


def _all_tensors(pool: Any) -> list[torch.Tensor]:
    return [
        t for side in (pool.full_kv_pool, pool.swa_kv_pool) for t in side.k_buffer + side.v_buffer
    ]


# -- DeepSeek-V4: within the layout's quantization error -------------------------------------

V4_BOUND = 2**-4  # e4m3's half-ulp: the worst relative rounding of one stored value


def _check_v4(proxy: Any, sc: Scenario, out: dict[int, torch.Tensor]) -> list[float]:
    adapter = proxy.kvcompat
    errors = []
    for layer in sc.windows:

        def stored(r: int, k: torch.Tensor, v: torch.Tensor, layer: int = layer) -> Any:
            back = adapter.read(layer, _swa_slots(proxy, sc.slots[r]))
            return back, back

        assert rel_l2(out[layer], dense_reference(sc, layer, stored)) < 2**-7, layer
        error = rel_l2(out[layer], dense_reference(sc, layer))
        assert error < V4_BOUND, (layer, error)
        errors.append(error)
    return errors


def _swa_slots(proxy: Any, slots: torch.Tensor) -> torch.Tensor:
    if getattr(proxy, "full_to_swa_index_mapping", None) is None:
        return slots
    return proxy.translate_loc_from_full_to_swa(slots)


def test_dsv4_single_pool_runs_through_compat_within_fp8_error() -> None:
    sc = Scenario(kv_heads=1, head_dim=512, windows={0: -1, 1: 4}, shared_kv=True, seed=3)
    sc.slots = _slots(sum(p + e + 1 for p, e in REQUESTS), 128, seed=3)
    native = b.build_dsv4_single_pool()
    with pytest.raises(NotImplementedError):
        run_backend(native, sc)  # the native pool cannot run it
    proxy = kvcompat.compat(b.build_dsv4_single_pool())
    errors = _check_v4(proxy, sc, run_backend(proxy, sc))
    assert min(errors) > 2**-8  # the error is real fp8 rounding, not a no-op write


def test_dsv4_token_pool_sliding_window_layers_run_through_compat() -> None:
    # Every layer of the composite keeps its sliding window in the SWA sub-pool; the c4/c128
    # caches are the compressed extra keys, which TorchNativeAttnBackend knows nothing of.
    sc = Scenario(kv_heads=1, head_dim=512, windows={0: 3, 1: 5, 2: -1}, shared_kv=True, seed=4)
    native = b.build_dsv4_token_pool()
    allocated = b.register_allocator_mapping(native, seed=4)  # neither identity nor a permutation
    sc.slots = _slots(sum(p + e + 1 for p, e in REQUESTS), 256, seed=4, allocated=allocated)
    proxy = kvcompat.compat(native)
    errors = _check_v4(proxy, sc, run_backend(proxy, sc))
    assert min(errors) > 2**-8


@pytest.mark.latest_only
def test_sglangs_flex_backend_runs_through_compat_on_the_dsv4_composite() -> None:
    # SGLang's other triton-free backend, unmodified: torch.compile'd flex attention over the
    # token rows it gathers (about 100 s of compiling on the CPU, so once, not per release).
    flex = pytest.importorskip("sglang.srt.layers.attention.torch_flex_backend")
    sc = Scenario(kv_heads=1, head_dim=512, windows={0: -1, 1: -1, 2: -1}, shared_kv=True, seed=6)
    native = b.build_dsv4_token_pool()  # layers of ratio 0, 4 and 128
    allocated = b.register_allocator_mapping(native, seed=6)
    sc.slots = _slots(sum(p + e + 1 for p, e in REQUESTS), 256, seed=6, allocated=allocated)
    proxy = kvcompat.compat(native)
    out = run_backend(proxy, sc, flex.TorchFlexAttnBackend)
    native_out = run_backend(kvcompat.compat(_copy_of(native)), sc)
    for layer in sc.windows:  # the same tokens as the other backend, within fp8 of the input
        assert rel_l2(out[layer], native_out[layer].float()) < 2**-7, layer
        assert rel_l2(out[layer], dense_reference(sc, layer)) < V4_BOUND, layer


def _copy_of(native: Any) -> Any:
    """A fresh composite with ``native``'s mapping (the same slots, empty storage)."""
    fresh = b.build_dsv4_token_pool()
    fresh.register_mapping(native.full_to_swa_index_mapping)
    return fresh


def test_dsv4_token_pool_without_a_mapping_refuses_the_plain_loc_and_writes_nothing() -> None:
    sc = Scenario(kv_heads=1, head_dim=512, windows={0: -1}, shared_kv=True, seed=5)
    sc.slots = _slots(sum(p + e + 1 for p, e in REQUESTS), 256, seed=5)
    native = b.build_dsv4_token_pool()
    before = [t.clone() for t in native.swa_kv_pool.kv_buffer]
    with pytest.raises(kvcompat.WriteError, match="no full->SWA mapping"):
        run_backend(kvcompat.compat(native), sc)
    assert all(torch.equal(a, c) for a, c in zip(before, native.swa_kv_pool.kv_buffer, strict=True))
