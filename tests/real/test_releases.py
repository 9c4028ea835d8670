"""What every SGLang release with DeepSeek-V4 pools (0.5.12 to 0.5.23) must get from kvcompat.

The release matrix (``tests/release_matrix.py``) runs the whole real tier under each release;
the tests here are the ones issue 12 added for it:

* kvcompat's transfer descriptors equal the installed release's own ``get_*_buf_infos()``
  triples, for every such method the native class has (``get_c128_state_buf_infos`` on
  0.5.15-0.5.19 and ``get_request_state_buf_infos`` from 0.5.20 are the ``request_state``
  group);
* :func:`~kvcompat.inspection.describe` lists every tensor reachable from the native pool
  object (attributes, lists, dicts, nested SGLang objects), so nothing a release's pool owns is
  silently left out, and :func:`~kvcompat.inspection.memory_report` counts all of their bytes;
* no kvcompat entry point raises a bare ``AttributeError`` / ``KeyError`` on any case.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from _sglang.cases import CONFORMANCE_CASES, PoolCase
from _sglang.features import ReleaseLacks, pool_class, release

import kvcompat
from kvcompat.inspection import (
    TransferGroup,
    as_buf_infos,
    describe,
    memory_report,
    transfer_descriptors,
)

# Each transfer group and the native methods that register it (the first one present wins).
NATIVE_BUF_INFOS: tuple[tuple[TransferGroup, tuple[str, ...]], ...] = (
    (TransferGroup.KV, ("get_contiguous_buf_infos",)),
    (TransferGroup.STATE, ("get_state_buf_infos",)),
    (TransferGroup.REQUEST_STATE, ("get_request_state_buf_infos", "get_c128_state_buf_infos")),
    (TransferGroup.SWA_RING, ("get_unified_swa_ring_buf_infos",)),
    (TransferGroup.REQUEST_ROW, ("get_swa_valid_from_buf_infos",)),
    (TransferGroup.KV_SCALE, ("get_kv_scale_buf_infos",)),
)

CASES = [pytest.param(case, id=case.id) for case in CONFORMANCE_CASES]
DSV4_TOKEN = [pytest.param(c, id=c.id) for c in CONFORMANCE_CASES if c.family == "dsv4_token"]


def where(case: PoolCase, what: str) -> str:
    """Failure prefix naming the release, the case (class first) and the call."""
    return f"[sglang {release()}] {case.id}: {what}"


def native_triple(native: Any, method: str) -> tuple[list[int], list[int], list[int]]:
    ptrs, lens, items = getattr(native, method)()
    return [int(p) for p in ptrs], [int(n) for n in lens], [int(i) for i in items]


@pytest.mark.parametrize("case", CASES)
def test_descriptors_equal_the_releases_own_buf_infos(case: PoolCase) -> None:
    native = case.build()
    compared = 0
    for group, methods in NATIVE_BUF_INFOS:
        method = next((m for m in methods if callable(getattr(type(native), m, None))), None)
        if method is None:
            continue
        ours = tuple(list(x) for x in as_buf_infos(transfer_descriptors(native, group=group)))
        try:
            theirs = native_triple(native, method)
        except AttributeError:
            # SGLang's own method is broken here (e.g. SWAKVPool.get_kv_scale_buf_infos asks
            # an unquantized MHA sub-pool for a method it lacks): nothing is registered.
            assert ours == ([], [], []), where(case, f"{method}() fails natively, ours {ours}")
            continue
        assert ours == theirs, where(
            case,
            f"transfer_descriptors(group={group.value!r}) vs native {method}(): "
            f"ours {len(ours[0])} ranges {ours[1]} items {ours[2]}, "
            f"SGLang's {len(theirs[0])} ranges {theirs[1]} items {theirs[2]}",
        )
        compared += 1
    if case.family not in ("single", "index", "key_only"):  # these have no such method
        assert compared, where(case, "the native class has no get_*_buf_infos() at all")


def test_dsv4_c128_state_is_in_the_group_the_release_ships_it_in() -> None:
    """0.5.12-0.5.14: inside ``get_state_buf_infos``; 0.5.15-0.5.19: a separate
    ``get_c128_state_buf_infos``; 0.5.20 on: ``get_request_state_buf_infos``."""
    case = next(c for c in CONFORMANCE_CASES if c.id == "DeepSeekV4TokenToKVPool-start0")
    native = case.build()
    ratios = native.compression_ratios  # the state pools record no ratio before 0.5.14
    c128_states = {
        pool.kv_score_buffer.kv_score.data_ptr()
        for layer, pool in enumerate(native.compress_state_pools)
        if pool is not None and ratios[layer] == 128
    }
    assert c128_states, where(case, "no c128 compress state built")
    apart = any(
        callable(getattr(type(native), m, None))
        for m in ("get_request_state_buf_infos", "get_c128_state_buf_infos")
    )
    groups = {d.group for d in transfer_descriptors(native) if d.ptr in c128_states}
    want = TransferGroup.REQUEST_STATE if apart else TransferGroup.STATE
    assert groups == {want}, where(case, f"c128 compress state in {groups}, want {want}")


# -- every tensor reachable from the pool object ------------------------------------------

_LEAF_TYPES = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device)


def reachable_tensors(root: Any, limit: int = 20_000) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor reachable from ``root``: instance attributes, lists, tuples, dicts and
    nested objects defined by SGLang (or kvcompat's test doubles), each object once."""
    seen: set[int] = set()
    stack: list[tuple[str, Any]] = [("pool", root)]
    while stack and len(seen) < limit:
        path, obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            yield path, obj
            continue
        if isinstance(obj, _LEAF_TYPES) or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, (list, tuple)):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(obj))
        elif isinstance(obj, dict):
            stack.extend((f"{path}[{key!r}]", item) for key, item in obj.items())
        elif _owned_object(obj):
            stack.extend((f"{path}.{name}", item) for name, item in vars(obj).items())


def _owned_object(obj: Any) -> bool:
    """An object whose attributes belong to the pool: SGLang's (or a test double's)."""
    module = type(obj).__module__ or ""
    return hasattr(obj, "__dict__") and (module.startswith(("sglang.", "_sglang.")))


def _span(tensor: torch.Tensor) -> tuple[int, int]:
    if tensor.numel() == 0:
        return tensor.data_ptr(), tensor.data_ptr()
    extent = 1 + sum(
        (size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True)
    )
    return tensor.data_ptr(), tensor.data_ptr() + extent * tensor.element_size()


@pytest.mark.parametrize("case", CASES)
def test_describe_lists_every_tensor_reachable_from_the_pool(case: PoolCase) -> None:
    native = case.build()
    manifest = describe(native)
    listed = [
        (t.storage_ptr, t.data_ptr, t.data_ptr + t.nbytes, t.path) for t in manifest.iter_tensors()
    ]
    missing = []
    storages: dict[int, int] = {}
    for path, tensor in reachable_tensors(native):
        if tensor.numel() == 0:
            continue
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        start, stop = _span(tensor)
        if not any(
            sp == storage.data_ptr() and lo <= start and stop <= hi for sp, lo, hi, _ in listed
        ):
            missing.append(f"{path} {tuple(tensor.shape)} {tensor.dtype} ({stop - start} B)")
    assert not missing, where(
        case, f"describe() leaves out {len(missing)} reachable tensor(s): {missing[:8]}"
    )
    total = memory_report(manifest).total_bytes
    assert total >= sum(storages.values()), where(
        case, f"memory_report total {total} B < {sum(storages.values())} B reachable"
    )


@pytest.mark.parametrize("case", DSV4_TOKEN)
def test_dsv4_composite_manifest_names_every_compressed_pool(case: PoolCase) -> None:
    """The bug of issue 12: before 0.5.20 the c4, c4-indexer and c128 pools went missing."""
    manifest = describe(case.build())
    names = {node.name for node in manifest.walk()}
    assert {"swa", "c4", "c4_indexer", "c128"} <= names, where(case, f"nodes {sorted(names)}")
    adapter = kvcompat.adapt(case.build())
    assert {"swa", "c4", "c4_indexer", "c128"} <= set(adapter.components), where(
        case, f"adapter components {sorted(adapter.components)}"
    )


# -- no bare AttributeError / KeyError ----------------------------------------------------


def _calls(native: Any) -> Iterator[tuple[str, Any]]:
    yield "pool_kind", lambda: kvcompat.pool_kind(native)
    yield "describe", lambda: describe(native)
    yield "memory_report", lambda: memory_report(native)
    yield "transfer_descriptors", lambda: transfer_descriptors(native)
    yield "adapt", lambda: kvcompat.adapt(native)


@pytest.mark.parametrize("case", CASES)
def test_no_kvcompat_call_raises_a_bare_attribute_or_key_error(case: PoolCase) -> None:
    native = case.build()
    for name, call in _calls(native):
        try:
            call()
        except (AttributeError, KeyError) as exc:  # noqa: PERF203 -- one call each
            pytest.fail(where(case, f"{name} raised a bare {type(exc).__name__}: {exc}"))
    pool = kvcompat.adapt(native)
    for layer in pool.layer_ids:
        for name in ("get_key_buffer", "layout", "read"):
            try:
                if name == "read":
                    pool.read(layer, torch.tensor([1]))
                elif name == "layout":
                    pool.layout(layer)
                else:
                    pool.get_key_buffer(layer, wait=False)
            except kvcompat.KVCompatError:  # noqa: PERF203
                pass  # a clear refusal is fine (e.g. no codec for the indexer layout)
            except (AttributeError, KeyError) as exc:
                pytest.fail(
                    where(case, f"layer {layer} {name} raised a bare {type(exc).__name__}: {exc}")
                )


def test_dsv4_composite_with_fewer_swa_buffers_than_layers_is_refused() -> None:
    """0.5.12 with ``start_layer`` and no ``end_layer``: the stage is the whole model but the
    SWA pool has ``layer_num`` buffers, so layers 3-5 have none. kvcompat says so instead of
    serving some other layer's buffer; the other releases size the SWA pool to the stage."""
    from _sglang.builders import build_dsv4_token_pool

    native = build_dsv4_token_pool(
        compression_ratios=(0, 4, 128, 0, 4, 128), start_layer=3, end_layer=None,
        allow_short_swa=True,
    )  # fmt: skip
    stage = native._stage_end - native._stage_start
    if len(native.swa_kv_pool.kv_buffer) >= stage:
        kvcompat.adapt(native)  # consistent: adapts
        return
    with pytest.raises(kvcompat.LayoutError, match="outside the 3 buffers"):
        kvcompat.adapt(native)
    assert describe(native).find("swa").layer_ids  # described natively all the same


# -- DSv4 V4 bytes vs SGLang's own CPU writer ---------------------------------------------

_V4_WRITER_MODULES = (
    "sglang.kernels.ops.attention.dsv4.index_buf_accessor",  # 0.5.13-0.5.22
    "sglang.srt.layers.attention.dsv4.index_buf_accessor",  # 0.5.12
)


def _native_v4_writer() -> tuple[Any, Any]:
    """``(_set_k_and_s_torch, NopeFp8RopeBf16Pack)`` of the installed release, or a skip:
    0.5.23 ships only the Triton store (``kernels/ops/kvcache/dsv4_main_kv_store.py``)."""
    import importlib
    import importlib.util

    for name in _V4_WRITER_MODULES:
        try:
            spec = importlib.util.find_spec(name)
        except ModuleNotFoundError:
            continue
        if spec is None:
            continue
        module = importlib.import_module(name)
        writer = getattr(module, "_set_k_and_s_torch", None)
        pack = getattr(module, "NopeFp8RopeBf16Pack", None)
        if callable(writer) and pack is not None:
            return writer, pack
    raise ReleaseLacks("pure-torch DSv4 V4 writer (index_buf_accessor._set_k_and_s_torch)")


def _v4_pack(key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An independent V4 quantizer (test side): per 64-value tile of the 448 nope values,
    scale ``2**ceil(log2(amax / 448))`` stored as a ue8m0 byte; e4m3 codes; bf16 rope."""
    nope = key[:, :448].float().reshape(len(key), 7, 64)
    amax = nope.abs().amax(dim=-1).clamp_min(1e-30)
    exponent = torch.ceil(torch.log2(amax / 448.0))
    codes = (nope / torch.exp2(exponent).unsqueeze(-1)).reshape(len(key), 448)
    scale = (exponent + 127).to(torch.uint8)
    return codes.to(torch.float8_e4m3fn), key[:, 448:].to(torch.bfloat16).contiguous(), scale


def test_dsv4_v4_bytes_equal_sglangs_own_writer() -> None:
    """kvcompat's V4 write equals SGLang's pure-torch V4 writer byte for byte, and kvcompat
    reads what that writer stored (the releases that ship one: 0.5.12-0.5.22)."""
    from _sglang.builders import build_dsv4_single_pool

    writer, pack_cls = _native_v4_writer()
    gen = torch.Generator().manual_seed(12)
    loc = torch.tensor([1, 7, 63, 64, 100])
    key = (torch.randn(len(loc), 512, generator=gen) * 3).to(torch.bfloat16)
    nope, rope, scale = _v4_pack(key)
    theirs = build_dsv4_single_pool(size=128)
    writer(theirs.kv_buffer[0], loc, pack_cls(nope, rope, scale), theirs.page_size)
    ours_native = build_dsv4_single_pool(size=128)
    ours = kvcompat.adapt(ours_native)
    ours.write(0, loc, key.reshape(len(loc), 1, 512))
    label = f"[sglang {release()}] DeepSeekV4SingleKVPool layer 0"
    assert torch.equal(ours_native.kv_buffer[0], theirs.kv_buffer[0]), (
        f"{label}: kvcompat's V4 bytes differ from SGLang's _set_k_and_s_torch at "
        f"{(ours_native.kv_buffer[0] != theirs.kv_buffer[0]).nonzero()[:8].tolist()}"
    )
    back = kvcompat.adapt(theirs).read(0, loc).reshape(len(loc), 512).float()
    want_nope = nope.float().reshape(len(loc), 7, 64) * torch.exp2(scale.float() - 127)[..., None]
    want = torch.cat([want_nope.reshape(len(loc), 448), rope.float()], dim=1)
    assert torch.equal(back.to(torch.bfloat16), want.to(torch.bfloat16)), (
        f"{label}: kvcompat's read of SGLang-written bytes is not their dequantized value"
    )


def test_nsa_pool_of_0_5_12_is_described_and_registered_like_sglang() -> None:
    """0.5.12 names DSA's pool ``NSATokenToKVPool`` (an MLA subclass whose index keys are an
    ``index_k_with_scale_buffer`` list): kvcompat serves it as a latent pool, and its index
    keys are in the manifest and in the ``state`` group exactly as SGLang registers them."""
    cls = pool_class("NSATokenToKVPool")
    native = cls(
        size=64, page_size=64, kv_lora_rank=32, dtype=torch.bfloat16, qk_rope_head_dim=16,
        layer_num=2, device="cpu", index_head_dim=128, enable_memory_saver=False,
        kv_cache_dim=48,
    )  # fmt: skip
    label = f"[sglang {release()}] NSATokenToKVPool"
    assert kvcompat.pool_kind(native) is kvcompat.PoolKind.LATENT, label
    for group, method in ((TransferGroup.KV, "get_contiguous_buf_infos"),
                          (TransferGroup.STATE, "get_state_buf_infos")):  # fmt: skip
        ours = tuple(list(x) for x in as_buf_infos(transfer_descriptors(native, group=group)))
        assert ours == native_triple(native, method), f"{label}: {group.value} vs {method}()"
    listed = {t.data_ptr for t in describe(native).iter_tensors() if t.role.value != "opaque"}
    for i, buf in enumerate(native.index_k_with_scale_buffer):
        assert buf.data_ptr() in listed, f"{label}: index_k_with_scale_buffer[{i}] not described"
