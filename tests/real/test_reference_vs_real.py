"""kvcompat's reference pools (``kvcompat.testing``) behave as SGLang 0.5.23's real classes.

Differential: the same constructor arguments go to the real class and to its reference twin,
then everything a consumer observes is compared -- the attributes consumers read, the buffer
lists (lengths, shapes, strides, dtypes, and which buffers share one allocation), every getter
for ids below, inside and beyond the stage (tensors located by buffer and byte offset, or the
exception's type and message), the layer-transfer waits, the DSv4 refusals, and the bytes
``set_kv_buffer`` writes. Hypothesis draws the arguments (sizes, page sizes, head dims,
v_head_dim != head_dim, fp8 dtypes, start_layer / end_layer).

A reference that deviates is a kvcompat bug; the failure message names the
class, the attribute or call and what differed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
import torch
from _sglang.builders import radix_layer
from _sglang.env import prepare_sglang
from _sglang.features import (
    ReleaseLacks,
    accepts,
    cpu_kernel,
    kv_write_loc,
    mha_fuses_k_and_v,
    require_kv_layout,
)
from hypothesis import given
from hypothesis import strategies as st

from kvcompat.testing import (
    RecordingLayerCounter,
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
    ReferenceMLATokenToKVPool,
    ReferenceSWAKVPool,
)

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz)
BF16 = torch.bfloat16


def _real(name: str) -> type:
    session = prepare_sglang()
    for module in (
        session.memory_pool,
        session.deepseek_v4_memory_pool,
        session.swa_memory_pool,
    ):
        cls = getattr(module, name, None)
        if cls is not None:
            return cls  # type: ignore[no-any-return]
    raise LookupError(name)


# -- observations ---------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A comparable form of an attribute value (enums by value, numpy scalars as Python)."""
    if (
        hasattr(value, "value")
        and type(value).__module__ != "builtins"
        and not isinstance(value, torch.Tensor)
    ):
        return ("enum", value.value)
    if hasattr(value, "item") and not isinstance(value, torch.Tensor):
        return value.item()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


def _diff_attrs(real: Any, ref: Any, names: Iterable[str], label: str) -> list[str]:
    diffs = []
    for name in names:
        missing = object()
        got_real = getattr(real, name, missing)
        got_ref = getattr(ref, name, missing)
        if got_real is missing and got_ref is not missing:
            # The reference pools model 0.5.23's classes; an older release's class lacks what
            # arrived later (model_layer_ids, kv_scale_buffer...): not comparable there.
            raise ReleaseLacks(
                f"{type(real).__name__}.{name}", "kvcompat.testing models 0.5.23's class"
            )
        if got_real is missing or got_ref is missing:
            diffs.append(
                f"{label}.{name}: {'real' if got_real is missing else 'reference'} has none"
            )
            continue
        if _plain(got_real) != _plain(got_ref):
            diffs.append(f"{label}.{name}: real {got_real!r} vs reference {got_ref!r}")
    return diffs


@dataclass(frozen=True)
class BufferFact:
    """One tensor of a per-layer buffer list, position-independent."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: torch.dtype
    byte_offset: int  # within its allocation
    allocation_bytes: int
    allocation: int  # index of the first listed tensor sharing this allocation


def sub_pool_buffer_facts(pool: Any, real: Any) -> Any:
    """An SWA sub-pool's MHA buffer facts; only their geometry where the real release
    allocates K and V separately (0.5.12-0.5.20: ``ReferenceSWAKVPool`` models 0.5.23's
    one-allocation sub-pools)."""
    facts = buffer_facts(pool, MHA_BUFFERS)
    if mha_fuses_k_and_v(real.full_kv_pool):
        return facts
    return {k: [(f.shape, f.strides, f.dtype) for f in v] for k, v in facts.items()}


def buffer_facts(pool: Any, attrs: Sequence[str]) -> dict[str, list[BufferFact]]:
    """Every listed buffer's geometry and which allocation it shares (by first appearance)."""
    firsts: dict[int, int] = {}
    out: dict[str, list[BufferFact]] = {}
    counter = 0
    for attr in attrs:
        facts = []
        for tensor in getattr(pool, attr):
            storage = tensor.untyped_storage()
            owner = firsts.setdefault(storage.data_ptr(), counter)
            counter += 1
            facts.append(
                BufferFact(
                    shape=tuple(tensor.shape),
                    strides=tensor.stride(),
                    dtype=tensor.dtype,
                    byte_offset=tensor.data_ptr() - storage.data_ptr(),
                    allocation_bytes=storage.nbytes(),
                    allocation=owner,
                )
            )
        out[attr] = facts
    return out


def locate(pool: Any, attrs: Sequence[str], tensor: torch.Tensor) -> tuple[str, int, int] | None:
    """``(attr, index, byte offset)`` of the listed buffer ``tensor`` views, or None."""
    candidates = []
    for attr in attrs:
        for index, buf in enumerate(getattr(pool, attr)):
            if buf.untyped_storage().data_ptr() != tensor.untyped_storage().data_ptr():
                continue
            offset = tensor.data_ptr() - buf.data_ptr()
            if 0 <= offset < max(buf.nbytes, 1):
                candidates.append((attr, index, offset))
    return min(candidates, key=lambda c: c[2]) if candidates else None


def outcome(pool: Any, attrs: Sequence[str], fn: Callable[[], Any]) -> Any:
    """What a call did: the exception (type, message, args), or where the tensor(s) point."""
    try:
        result = fn()
    except Exception as exc:  # the exception is the observation
        return ("raised", type(exc).__name__, str(exc), exc.args)
    results = result if isinstance(result, tuple) else (result,)
    return tuple(
        ("tensor", locate(pool, attrs, t), tuple(t.shape), t.stride(), t.dtype)
        if isinstance(t, torch.Tensor)
        else ("value", t)
        for t in results
    )


def assert_same(real: Any, ref: Any, what: str) -> None:
    assert real == ref, f"{what}:\n  real      {real!r}\n  reference {ref!r}"


def _probe_ids(start: int, layer_num: int) -> range:
    """Below the stage (negative list indices), the stage, and one past it."""
    return range(start - layer_num - 1, start + layer_num + 1)


def _compare_getters(
    real: Any,
    ref: Any,
    attrs: Sequence[str],
    getters: Sequence[str],
    ids: Iterable[int],
    label: str,
) -> None:
    for layer in ids:
        for getter in getters:
            assert_same(
                outcome(real, attrs, partial(getattr(real, getter), layer)),
                outcome(ref, attrs, partial(getattr(ref, getter), layer)),
                f"{label}: {getter}({layer})",
            )


def _compare_waits(
    real: Any, ref: Any, getters: Sequence[str], ids: Iterable[int], label: str
) -> None:
    counters = RecordingLayerCounter(), RecordingLayerCounter()
    real.register_layer_transfer_counter(counters[0])
    ref.register_layer_transfer_counter(counters[1])
    for layer in ids:
        for getter in getters:
            for pool, counter in zip((real, ref), counters, strict=True):
                counter.waits.clear()
                with contextlib.suppress(Exception):  # only the waits are compared here
                    getattr(pool, getter)(layer)
            assert_same(
                counters[0].waits, counters[1].waits, f"{label}: waits of {getter}({layer})"
            )


def _bytes(buffers: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    return [b.contiguous().view(torch.uint8).clone() for b in buffers]


def _assert_bytes_equal(
    real: Sequence[torch.Tensor], ref: Sequence[torch.Tensor], label: str
) -> None:
    for i, (a, b) in enumerate(zip(real, ref, strict=True)):
        if not torch.equal(a, b):
            rows = (a != b).reshape(a.shape[0], -1).any(dim=1).nonzero().flatten().tolist()
            msg = f"{label}[{i}]: bytes differ in rows {rows[:10]}"
            raise AssertionError(msg)


# -- MHATokenToKVPool -----------------------------------------------------------------------

MHA_ATTRS = (
    "size",
    "page_size",
    "dtype",
    "store_dtype",
    "start_layer",
    "end_layer",
    "layer_num",
    "head_num",
    "head_dim",
    "v_head_dim",
    "kv_cache_layout",
    "model_layer_ids",
    "device",
    "layer_transfer_counter",
    "allocation_label",
    "mem_usage",
)
MHA_BUFFERS = ("k_buffer", "v_buffer")
GETTERS = ("get_key_buffer", "get_value_buffer", "get_kv_buffer")

_DTYPES = st.sampled_from([BF16, torch.float16, torch.float32, *FP8_DTYPES])
_STAGE = st.tuples(st.integers(1, 3), st.none() | st.integers(0, 4), st.none() | st.integers(0, 8))


def _staged(draw: st.DrawFn, fields: dict[str, Any]) -> dict[str, Any]:
    """A pool's constructor arguments: ``fields``, a drawn layer count and pipeline stage
    (``start_layer`` / ``end_layer`` only when drawn), on the CPU without memory saver."""
    layer_num, start, end = draw(_STAGE)
    args = {**fields, "layer_num": layer_num, "device": "cpu", "enable_memory_saver": False}
    if start is not None:
        args["start_layer"] = start
    if end is not None:
        args["end_layer"] = end
    return args


@st.composite
def mha_args(draw: st.DrawFn) -> dict[str, Any]:
    args = _staged(
        draw,
        {
            "size": draw(st.integers(1, 96)),
            "page_size": draw(st.sampled_from([1, 2, 4, 8, 16, 32, 64])),
            "dtype": draw(_DTYPES),
            "head_num": draw(st.integers(1, 4)),
            "head_dim": draw(st.sampled_from([4, 8, 16])),
        },
    )
    v_head_dim = draw(st.none() | st.sampled_from([4, 8, 16]))
    if v_head_dim is not None:
        args["v_head_dim"] = v_head_dim
    return args


def _mha_pair(args: dict[str, Any]) -> tuple[Any, Any]:
    return _real("MHATokenToKVPool")(**args), ReferenceMHATokenToKVPool(**args)


def _compare_buf_infos(real: Any, ref: Any, buffers: tuple[str, ...], label: str) -> None:
    """Equal ``get_contiguous_buf_infos()`` lengths and item sizes, and each pool's pointers
    are those of its own ``buffers`` lists, in order."""
    real_ptrs, real_lens, real_items = real.get_contiguous_buf_infos()
    ref_ptrs, ref_lens, ref_items = ref.get_contiguous_buf_infos()
    assert_same(
        (list(real_lens), list(real_items)),
        (list(ref_lens), list(ref_items)),
        f"{label}: get_contiguous_buf_infos() lengths",
    )
    for pool, ptrs, who in ((real, real_ptrs, "real"), (ref, ref_ptrs, "reference")):
        listed = [t.data_ptr() for name in buffers for t in getattr(pool, name)]
        assert list(ptrs) == listed, f"{label}: {who} get_contiguous_buf_infos() pointers"


def _compare_attrs_and_buffers(
    real: Any, ref: Any, attrs: Iterable[str], buffers: Sequence[str], label: str
) -> None:
    """Equal public attributes ``attrs`` and equal facts about each tensor in ``buffers``."""
    diffs = _diff_attrs(real, ref, attrs, label)
    assert not diffs, "\n".join(diffs)
    assert_same(buffer_facts(real, buffers), buffer_facts(ref, buffers), f"{label}: buffers")


def compare_mha(real: Any, ref: Any, label: str) -> None:
    _compare_attrs_and_buffers(real, ref, MHA_ATTRS, MHA_BUFFERS, label)
    assert_same(real.get_v_head_dim(), ref.get_v_head_dim(), f"{label}: get_v_head_dim()")
    assert_same(
        tuple(int(x) for x in real.get_kv_size_bytes()),
        tuple(int(x) for x in ref.get_kv_size_bytes()),
        f"{label}: get_kv_size_bytes()",
    )
    _compare_buf_infos(real, ref, ("k_buffer", "v_buffer"), label)
    ids = _probe_ids(real.start_layer, real.layer_num)
    _compare_getters(real, ref, MHA_BUFFERS, GETTERS, ids, label)


@given(args=mha_args())
def test_mha_pool_matches_the_real_class(args: dict[str, Any]) -> None:
    real, ref = _mha_pair(args)
    label = f"MHATokenToKVPool({_show(args)})"
    compare_mha(real, ref, label)
    _compare_waits(real, ref, GETTERS, _probe_ids(real.start_layer, real.layer_num), label)


def _show(args: dict[str, Any]) -> str:
    return ", ".join(
        f"{k}={v}" for k, v in args.items() if k not in ("device", "enable_memory_saver")
    )


@given(
    args=mha_args(),
    seed=st.integers(0, 2**16),
    source_dtype=st.sampled_from([None, torch.float32, BF16]),
    scale=st.sampled_from([None, 2.0, 0.5]),
    use_override=st.booleans(),
)
def test_mha_set_kv_buffer_writes_the_same_bytes(
    args: dict[str, Any],
    seed: int,
    source_dtype: torch.dtype | None,
    scale: float | None,
    use_override: bool,
) -> None:
    real, ref = _mha_pair(args)
    label = f"MHATokenToKVPool({_show(args)}).set_kv_buffer"
    gen = torch.Generator().manual_seed(seed)
    rows = args["size"] + args["page_size"]
    start = real.start_layer
    for layer in range(start - real.layer_num, start + real.layer_num):  # wrapping ids too
        count = int(torch.randint(1, min(rows, 6) + 1, (1,), generator=gen))
        loc = torch.randperm(rows, generator=gen)[:count]
        dtype = source_dtype or args["dtype"]
        k = torch.randn((count, real.head_num, real.head_dim), generator=gen).to(dtype)
        v = torch.randn((count, real.head_num, real.v_head_dim), generator=gen).to(dtype)
        inputs = []
        for pool in (real, ref):
            ck, cv = k.clone(), v.clone()
            if use_override:
                pool.set_kv_buffer(
                    None, loc, ck, cv, k_scale=scale, v_scale=scale, layer_id_override=layer
                )
            else:
                pool.set_kv_buffer(radix_layer(layer), loc, ck, cv, k_scale=scale, v_scale=scale)
            inputs.append(
                (
                    ck.view(torch.uint8) if ck.element_size() == 1 else ck,
                    cv.view(torch.uint8) if cv.element_size() == 1 else cv,
                )
            )
        for side, name in ((0, "cache_k"), (1, "cache_v")):
            assert torch.equal(inputs[0][side], inputs[1][side]), (
                f"{label}(layer {layer}): the caller's {name} was changed differently "
                f"(scale={scale})"
            )
        for attr in MHA_BUFFERS:
            _assert_bytes_equal(
                _bytes(getattr(real, attr)),
                _bytes(getattr(ref, attr)),
                f"{label}(layer {layer}, loc {loc.tolist()}): {attr}",
            )


def test_mha_write_loc_objects_are_unwrapped_alike() -> None:
    args: dict[str, Any] = {
        "size": 64,
        "page_size": 16,
        "dtype": BF16,
        "head_num": 2,
        "head_dim": 8,
        "layer_num": 2,
        "device": "cpu",
        "enable_memory_saver": False,
        "start_layer": 2,
    }
    real, ref = _mha_pair(args)
    k = torch.randn(2, 2, 8).to(BF16)
    loc = kv_write_loc()(torch.tensor([4, 9]))
    for pool in (real, ref):
        pool.set_kv_buffer(radix_layer(3), loc, k.clone(), k.clone())
    for attr in MHA_BUFFERS:
        _assert_bytes_equal(
            _bytes(getattr(real, attr)),
            _bytes(getattr(ref, attr)),
            f"MHA set_kv_buffer(KVWriteLoc): {attr}",
        )


# -- MLATokenToKVPool -----------------------------------------------------------------------

MLA_ATTRS = (
    "size",
    "page_size",
    "dtype",
    "store_dtype",
    "start_layer",
    "end_layer",
    "layer_num",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "kv_cache_dim",
    "use_dsa",
    "dsa_kv_cache_store_fp8",
    "kv_scale_buffer",
    "model_layer_ids",
    "device",
    "layer_transfer_counter",
    "mem_usage",
)


@st.composite
def mla_args(draw: st.DrawFn) -> dict[str, Any]:
    return _staged(
        draw,
        {
            "size": draw(st.integers(1, 96)),
            "page_size": draw(st.sampled_from([1, 4, 16, 64])),
            "dtype": draw(_DTYPES),
            "kv_lora_rank": draw(st.sampled_from([8, 16, 32, 512])),
            "qk_rope_head_dim": draw(st.sampled_from([4, 16, 64])),
        },
    )


def _mla_pair(args: dict[str, Any]) -> tuple[Any, Any]:
    return _real("MLATokenToKVPool")(**args), ReferenceMLATokenToKVPool(**args)


@given(args=mla_args())
def test_mla_pool_matches_the_real_class(args: dict[str, Any]) -> None:
    real, ref = _mla_pair(args)
    label = f"MLATokenToKVPool({_show(args)})"
    _compare_attrs_and_buffers(real, ref, MLA_ATTRS, ("kv_buffer",), label)
    assert_same(
        int(real.get_kv_size_bytes()), int(ref.get_kv_size_bytes()), f"{label}: get_kv_size_bytes()"
    )
    _compare_buf_infos(real, ref, ("kv_buffer",), label)
    ids = _probe_ids(real.start_layer, real.layer_num)
    _compare_getters(real, ref, ("kv_buffer",), GETTERS, ids, label)
    _compare_waits(real, ref, GETTERS, ids, label)


@given(args=mla_args(), seed=st.integers(0, 2**16), mla_writer=st.booleans())
def test_mla_writes_the_same_bytes(args: dict[str, Any], seed: int, mla_writer: bool) -> None:
    """set_kv_buffer (whole rows from K, V ignored) and set_mla_kv_buffer (nope + rope).

    Slot 0 is left out for set_mla_kv_buffer: see the test after this one.
    """
    real, ref = _mla_pair(args)
    label = f"MLATokenToKVPool({_show(args)})"
    gen = torch.Generator().manual_seed(seed)
    rows = args["size"] + args["page_size"]
    rank, rope = args["kv_lora_rank"], args["qk_rope_head_dim"]
    start = real.start_layer
    for layer in range(start - real.layer_num, start + real.layer_num):
        first = 1 if mla_writer else 0
        count = int(torch.randint(1, min(rows - first, 6) + 1, (1,), generator=gen))
        loc = torch.randperm(rows - first, generator=gen)[:count] + first
        row = torch.randn((count, 1, rank + rope), generator=gen).to(BF16)
        for pool in (real, ref):
            if mla_writer:
                with cpu_kernel("MLATokenToKVPool.set_mla_kv_buffer"):
                    pool.set_mla_kv_buffer(
                        radix_layer(layer), loc, row[..., :rank].clone(), row[..., rank:].clone()
                    )
            else:
                # MLA ignores cache_v: pass something that would show if it were written.
                junk = torch.full((count, 1, rank), 7.0, dtype=BF16)
                pool.set_kv_buffer(radix_layer(layer), loc, row.clone(), junk)
        writer = "set_mla_kv_buffer" if mla_writer else "set_kv_buffer"
        _assert_bytes_equal(
            _bytes(real.kv_buffer),
            _bytes(ref.kv_buffer),
            f"{label}.{writer}(layer {layer}, loc {loc.tolist()}): kv_buffer",
        )


def test_mla_set_mla_kv_buffer_skips_the_padding_slot_alike() -> None:
    args: dict[str, Any] = {
        "size": 16,
        "page_size": 16,
        "dtype": BF16,
        "kv_lora_rank": 8,
        "qk_rope_head_dim": 4,
        "layer_num": 1,
        "device": "cpu",
        "enable_memory_saver": False,
    }
    real, ref = _mla_pair(args)
    loc = torch.tensor([0, 5])
    nope, rope = torch.ones(2, 1, 8, dtype=BF16), torch.ones(2, 1, 4, dtype=BF16)
    for pool in (real, ref):
        with cpu_kernel("MLATokenToKVPool.set_mla_kv_buffer"):
            pool.set_mla_kv_buffer(radix_layer(0), loc, nope.clone(), rope.clone())
    assert int(real.kv_buffer[0][0].count_nonzero()) == 0, "the real class wrote slot 0"
    _assert_bytes_equal(
        _bytes(real.kv_buffer),
        _bytes(ref.kv_buffer),
        "MLATokenToKVPool.set_mla_kv_buffer(loc [0, 5]): kv_buffer",
    )


# -- DeepSeekV4SingleKVPool -----------------------------------------------------------------

DSV4_ATTRS = (
    "size",
    "page_size",
    "dtype",
    "store_dtype",
    "start_layer",
    "end_layer",
    "layer_num",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "global_page_size",
    "kv_layout",
    "scale_pad",
    "quantize_block_size",
    "rope_storage_dtype",
    "k_with_scale_buffer_dtype",
    "kv_cache_total_dim",
    "bytes_per_page_padded",
    "device",
    "layer_transfer_counter",
    "mem_usage",
)


@st.composite
def dsv4_args(draw: st.DrawFn) -> dict[str, Any]:
    page_size = draw(st.sampled_from([1, 2, 4, 16, 64, 128, 256]))
    args = _staged(
        draw,
        {
            "size": draw(st.integers(1, 300)),
            "page_size": page_size,
            "dtype": draw(st.sampled_from([*FP8_DTYPES, torch.uint8])),
            "qk_nope_head_dim": 448,
            "qk_rope_head_dim": 64,
        },
    )
    global_page = draw(st.none() | st.sampled_from([1, 2, 4]))
    if global_page is not None:
        args["global_page_size"] = page_size * global_page
    if draw(st.booleans()):
        args["kv_layout"] = "v4"
    return args


def _require_dsv4_layouts() -> type:
    """``DeepSeekV4SingleKVPool`` if it takes ``kv_layout`` (0.5.21 on), else ReleaseLacks:
    ``ReferenceDeepSeekV4SingleKVPool`` models that class (``kv_layout``, ``global_page_size``)."""
    cls = _real("DeepSeekV4SingleKVPool")
    if not accepts(cls, "kv_layout"):
        raise ReleaseLacks(
            "DeepSeekV4SingleKVPool(kv_layout=...)", "kvcompat.testing models 0.5.23's class"
        )
    return cls


def _dsv4_pair(args: dict[str, Any]) -> tuple[Any, Any]:
    return _require_dsv4_layouts()(**args), ReferenceDeepSeekV4SingleKVPool(**args)


@given(args=dsv4_args())
def test_dsv4_single_pool_matches_the_real_class(args: dict[str, Any]) -> None:
    real, ref = _dsv4_pair(args)
    label = f"DeepSeekV4SingleKVPool({_show(args)})"
    _compare_attrs_and_buffers(real, ref, DSV4_ATTRS, ("kv_buffer",), label)
    assert_same(
        real.get_bytes_per_token(), ref.get_bytes_per_token(), f"{label}: get_bytes_per_token()"
    )
    ids = _probe_ids(real.start_layer, real.layer_num)
    # get_key_buffer's two branches (fp8: l - start_layer; uint8: raw l), below-stage ids and
    # all, plus the refusals of the other three generic methods, message for message.
    _compare_getters(real, ref, ("kv_buffer",), GETTERS, ids, label)
    for args_ in ((), (radix_layer(0), torch.tensor([1]), None, None)):
        assert_same(
            outcome(real, (), partial(real.set_kv_buffer, *args_)),
            outcome(ref, (), partial(ref.set_kv_buffer, *args_)),
            f"{label}: set_kv_buffer{args_!r}",
        )
    _compare_waits(real, ref, GETTERS, ids, label)


@pytest.mark.parametrize(
    "overrides",
    [
        {"dtype": BF16},
        {"dtype": torch.float16},
        {"qk_rope_head_dim": 32},
        {"qk_nope_head_dim": 512},
    ],
    ids=["bf16", "fp16", "rope32", "nope512"],
)
def test_dsv4_single_pool_refuses_like_the_real_class(overrides: dict[str, Any]) -> None:
    args: dict[str, Any] = {
        "size": 64,
        "page_size": 64,
        "dtype": torch.float8_e4m3fn,
        "qk_nope_head_dim": 448,
        "qk_rope_head_dim": 64,
        "layer_num": 2,
        "device": "cpu",
        "enable_memory_saver": False,
        **overrides,
    }
    real = outcome(None, (), partial(_real("DeepSeekV4SingleKVPool"), **args))
    ref = outcome(None, (), partial(ReferenceDeepSeekV4SingleKVPool, **args))
    assert real[0] == "raised", f"the real class now accepts {overrides}"
    assert_same(real, ref, f"DeepSeekV4SingleKVPool({overrides}) construction")


@pytest.mark.parametrize("layout", ["v41", "v41_fp4", "uniform_fp8", "v41_new", "v41_fp4_new"])
def test_dsv4_reference_refuses_the_layouts_it_does_not_model(layout: str) -> None:
    """Documented scope: the reference models V4 only and says so instead of mis-sizing pages."""
    require_kv_layout(_require_dsv4_layouts(), layout)
    args: dict[str, Any] = {
        "size": 64,
        "page_size": 64,
        "dtype": torch.float8_e4m3fn,
        "qk_nope_head_dim": 448,
        "qk_rope_head_dim": 64,
        "layer_num": 1,
        "device": "cpu",
        "enable_memory_saver": False,
        "kv_layout": layout,
    }
    assert _real("DeepSeekV4SingleKVPool")(**args).kv_layout.value == layout
    with pytest.raises(
        NotImplementedError, match=f"models the V4 layout only, got kv_layout='{layout}'"
    ):
        ReferenceDeepSeekV4SingleKVPool(**args)


# -- SWAKVPool ------------------------------------------------------------------------------

SWA_ATTRS = (
    "size",
    "size_swa",
    "dtype",
    "head_num",
    "head_dim",
    "page_size",
    "start_layer",
    "layer_num",
    "swa_layer_nums",
    "full_layer_nums",
    "layers_mapping",
    "full_to_swa_index_mapping",
    "device",
    "layer_transfer_counter",
)
# What SGLang's MHA sub-pools have that a consumer of the composite reads through them.
SWA_SUB_POOL_ATTRS = tuple(
    a for a in MHA_ATTRS if a not in ("model_layer_ids", "allocation_label", "mem_usage")
)


@st.composite
def swa_args(draw: st.DrawFn) -> dict[str, Any]:
    total = draw(st.integers(2, 6))
    first = draw(st.sampled_from([0, 4]))
    ids = list(range(first, first + total))
    swa = draw(st.lists(st.sampled_from(ids), min_size=1, max_size=total - 1, unique=True))
    return {
        "size": draw(st.integers(1, 96)),
        "size_swa": draw(st.integers(1, 64)),
        "page_size": draw(st.sampled_from([1, 4, 16])),
        "dtype": draw(st.sampled_from([BF16, torch.float8_e4m3fn])),
        "head_num": draw(st.integers(1, 3)),
        "head_dim": draw(st.sampled_from([4, 8])),
        "swa_attention_layer_ids": sorted(swa),
        "full_attention_layer_ids": [i for i in ids if i not in swa],
        "device": "cpu",
        "enable_memory_saver": False,
    }


def _swa_pair(args: dict[str, Any]) -> tuple[Any, Any]:
    cls = _real("SWAKVPool")
    # 0.5.12-0.5.14 require enable_kvcache_transpose (always False: it is asserted off).
    extra = {"enable_kvcache_transpose": False} if accepts(cls, "enable_kvcache_transpose") else {}
    return cls(**args, **extra), ReferenceSWAKVPool(**args)


def _swa_probe_ids(args: dict[str, Any]) -> list[int]:
    ids = [*args["swa_attention_layer_ids"], *args["full_attention_layer_ids"]]
    return sorted({*ids, min(ids) - 1, max(ids) + 1, -1})


@given(args=swa_args())
def test_swa_pool_matches_the_real_class(args: dict[str, Any]) -> None:
    real, ref = _swa_pair(args)
    label = f"SWAKVPool({_show(args)})"
    diffs = _diff_attrs(real, ref, SWA_ATTRS, label)
    diffs += _sub_pool_diffs(real, ref, SWA_SUB_POOL_ATTRS, label)
    assert not diffs, "\n".join(diffs)
    for side in ("full_kv_pool", "swa_kv_pool"):
        assert_same(
            sub_pool_buffer_facts(getattr(real, side), real),
            sub_pool_buffer_facts(getattr(ref, side), real),
            f"{label}.{side}: buffers",
        )
    ids = _swa_probe_ids(args)
    _compare_swa_getters(real, ref, ids, label)
    _compare_waits(real, ref, GETTERS, ids, label)


def _swa_outcome(pool: Any, fn: Callable[[], Any]) -> Any:
    class _Both:
        """Views the two sub-pools' buffer lists as one pool for :func:`locate`."""

        full_k = pool.full_kv_pool.k_buffer
        full_v = pool.full_kv_pool.v_buffer
        swa_k = pool.swa_kv_pool.k_buffer
        swa_v = pool.swa_kv_pool.v_buffer

    return outcome(_Both, ("full_k", "full_v", "swa_k", "swa_v"), fn)


def _compare_swa_getters(real: Any, ref: Any, ids: Iterable[int], label: str) -> None:
    """Each generic getter on each id: the same sub-pool tensor, or the same exception."""
    for layer in ids:
        for getter in GETTERS:
            assert_same(
                _swa_outcome(real, partial(getattr(real, getter), layer)),
                _swa_outcome(ref, partial(getattr(ref, getter), layer)),
                f"{label}: {getter}({layer})",
            )


def _sub_pool_diffs(real: Any, ref: Any, attrs: Iterable[str], label: str) -> list[str]:
    """Attribute differences of the full and SWA sub-pools."""
    diffs: list[str] = []
    for side in ("full_kv_pool", "swa_kv_pool"):
        diffs += _diff_attrs(getattr(real, side), getattr(ref, side), attrs, f"{label}.{side}")
    return diffs


def _swa_small(**overrides: Any) -> dict[str, Any]:
    """A small SWA pool's arguments (layers 0 and 2 sliding-window, 1 and 3 full), fresh
    lists each call."""
    return {
        "size": 64,
        "size_swa": 32,
        "page_size": 16,
        "dtype": BF16,
        "head_num": 2,
        "head_dim": 8,
        "swa_attention_layer_ids": [0, 2],
        "full_attention_layer_ids": [1, 3],
        "device": "cpu",
        "enable_memory_saver": False,
        **overrides,
    }


def test_swa_start_layer_through_kwargs_shifts_alike() -> None:
    """Trap 5 reproduced by the reference: both sub-pools get the leaked start_layer."""
    args = _swa_small(start_layer=1)
    real, ref = _swa_pair(args)
    _compare_swa_getters(real, ref, range(4), "SWAKVPool(start_layer=1 via kwargs)")


def test_swa_sub_pool_metadata_matches_the_real_class() -> None:
    real, ref = _swa_pair(_swa_small())
    diffs = _sub_pool_diffs(real, ref, ("model_layer_ids", "allocation_label"), "SWAKVPool")
    assert not diffs, "\n".join(diffs)


def test_swa_head_overrides_reach_only_the_swa_sub_pool() -> None:
    args = _swa_small(swa_head_num=4, swa_head_dim=16, swa_v_head_dim=4)
    real, ref = _swa_pair(args)
    diffs = _sub_pool_diffs(real, ref, ("head_num", "head_dim", "v_head_dim"), "SWAKVPool")
    assert not diffs, "\n".join(diffs)
    for side in ("full_kv_pool", "swa_kv_pool"):
        assert_same(
            sub_pool_buffer_facts(getattr(real, side), real),
            sub_pool_buffer_facts(getattr(ref, side), real),
            f"SWAKVPool.{side}",
        )


# -- the consumer-facing surface ------------------------------------------------------------

_SURFACE = {
    (ReferenceMHATokenToKVPool, "MHATokenToKVPool"): (
        *GETTERS,
        "set_kv_buffer",
        "get_v_head_dim",
        "get_kv_size_bytes",
        "get_contiguous_buf_infos",
        "register_layer_transfer_counter",
        *MHA_BUFFERS,
        *MHA_ATTRS,
    ),
    (ReferenceMLATokenToKVPool, "MLATokenToKVPool"): (
        *GETTERS,
        "set_kv_buffer",
        "set_mla_kv_buffer",
        "get_kv_size_bytes",
        "get_contiguous_buf_infos",
        "register_layer_transfer_counter",
        "kv_buffer",
        *MLA_ATTRS,
    ),
    (ReferenceDeepSeekV4SingleKVPool, "DeepSeekV4SingleKVPool"): (
        *GETTERS,
        "set_kv_buffer",
        "get_bytes_per_token",
        "create_buffer",
        "register_layer_transfer_counter",
        "kv_buffer",
        *DSV4_ATTRS,
    ),
}
_SWA_SURFACE = (
    *GETTERS,
    "set_kv_buffer",
    "get_v_head_dim",
    "get_kv_size_bytes",
    "register_mapping",
    "register_layer_transfer_counter",
    "full_kv_pool",
    "swa_kv_pool",
    "mem_usage",
    *SWA_ATTRS,
)


def _missing(ref: Any, real: Any, names: Iterable[str]) -> list[str]:
    return sorted(n for n in names if hasattr(real, n) and not hasattr(ref, n))


@pytest.mark.parametrize(
    ("ref_cls", "real_name"), list(_SURFACE), ids=[name for _, name in _SURFACE]
)
def test_reference_has_what_consumers_use(ref_cls: type, real_name: str) -> None:
    args: dict[str, Any] = {
        "MHATokenToKVPool": {
            "size": 16,
            "page_size": 16,
            "dtype": BF16,
            "head_num": 1,
            "head_dim": 8,
            "layer_num": 1,
        },
        "MLATokenToKVPool": {
            "size": 16,
            "page_size": 16,
            "dtype": BF16,
            "kv_lora_rank": 8,
            "qk_rope_head_dim": 4,
            "layer_num": 1,
        },
        "DeepSeekV4SingleKVPool": {
            "size": 64,
            "page_size": 64,
            "dtype": torch.float8_e4m3fn,
            "qk_nope_head_dim": 448,
            "qk_rope_head_dim": 64,
            "layer_num": 1,
        },
    }[real_name]
    common = {"device": "cpu", "enable_memory_saver": False}
    real, ref = _real(real_name)(**args, **common), ref_cls(**args, **common)
    missing = _missing(ref, real, _SURFACE[ref_cls, real_name])
    assert missing == [], f"{ref_cls.__name__} lacks {missing}"


def test_reference_swa_has_what_consumers_use() -> None:
    real, ref = _swa_pair(_swa_small())
    missing = _missing(ref, real, _SWA_SURFACE)
    assert missing == [], f"ReferenceSWAKVPool lacks {missing}"
