"""The compat proxy over SGLang 0.5.23's own pools: native writers' bytes, KVWriteLoc routing."""

from __future__ import annotations

import pytest
import torch
from _sglang import builders as b
from _sglang.builders import radix_layer
from _sglang.cases import CONFORMANCE_CASES, PoolCase
from _sglang.features import kv_write_loc

import kvcompat


def test_swa_pool_with_sglangs_own_kv_write_loc() -> None:
    write_loc_cls = kv_write_loc()
    ours, theirs = b.build_swa_pool(), b.build_swa_pool()
    k = torch.randn(2, 2, 8).to(torch.bfloat16)
    v = torch.randn(2, 2, 8).to(torch.bfloat16)
    loc = write_loc_cls(torch.tensor([10, 50]), swa_loc=torch.tensor([3, 4]))
    for layer_id in (0, 1):  # a sliding-window layer, then a full-attention layer
        theirs.set_kv_buffer(radix_layer(layer_id), loc, k.clone(), v.clone())
        kvcompat.compat(ours).set_kv_buffer(radix_layer(layer_id), loc, k, v)
    for side in ("full_kv_pool", "swa_kv_pool"):
        for attr in ("k_buffer", "v_buffer"):
            for mine, native in zip(
                getattr(getattr(ours, side), attr),
                getattr(getattr(theirs, side), attr),
                strict=True,
            ):
                assert torch.equal(mine, native), f"{side}.{attr}"


@pytest.mark.parametrize(
    "build", [b.build_dsv4_single_pool, b.build_hisparse_c4_pool, b.build_dsv4_token_pool]
)
def test_dsv4_pools_run_an_unported_backend(build: object) -> None:
    native = build()  # type: ignore[operator]
    pool = kvcompat.compat(native)
    layer_id = pool.kvcompat.layer_ids[-1]
    k, v = pool.get_kv_buffer(layer_id)
    assert k is v
    assert pool.get_value_buffer(layer_id).shape == k.shape
    keys = torch.randn(2, 1, 512).to(torch.bfloat16)
    loc: object = torch.tensor([5, 6])
    if kvcompat.is_composite_pool(native):
        loc = kv_write_loc()(torch.tensor([99, 98]), swa_loc=loc)
    pool.set_kv_buffer(radix_layer(layer_id), loc, keys, None)
    back = pool.kvcompat.read(layer_id, torch.tensor([5, 6]))
    assert (back.float() - keys.float()).abs().max() <= keys.float().abs().max() / 16


@pytest.mark.parametrize("case", CONFORMANCE_CASES, ids=[c.id for c in CONFORMANCE_CASES])
def test_proxy_getters_and_writer_on_every_conformance_case(case: PoolCase) -> None:
    native = case.build()
    pool = kvcompat.compat(native)
    adapter = pool.kvcompat
    for layer_id in case.layer_ids:
        assert pool.get_key_buffer(layer_id) is adapter.get_key_buffer(layer_id), case.id
        if adapter.kind.has_values:
            assert pool.get_kv_buffer(layer_id) is adapter.get_kv_buffer(layer_id), case.id
            assert pool.get_value_buffer(layer_id) is adapter.get_value_buffer(layer_id)
        else:
            with pytest.raises(kvcompat.NoValueBufferError):
                pool.get_value_buffer(layer_id)
    if case.family == "index":
        return  # no codec for indexer keys yet: set_kv_buffer says so (LayoutError)
    layer_id = case.layer_ids[-1]
    spec = adapter.layout(layer_id)
    keys = torch.randn(2, spec.key.heads, spec.key.dim // spec.key.heads).to(torch.bfloat16)
    values = None
    if spec.value is not None:
        values = torch.randn(2, spec.value.heads, spec.value.dim // spec.value.heads)
    loc: object = torch.tensor([3, 4])
    if adapter.kind is kvcompat.PoolKind.COMPOSITE:
        loc = kv_write_loc()(torch.tensor([3, 4]), swa_loc=loc)
    pool.set_kv_buffer(radix_layer(layer_id), loc, keys, values)
    back = adapter.read(layer_id, torch.tensor([3, 4]))
    bound = keys.float().abs().max() / 4  # the coarsest layout here (fp8 rows) stays within
    assert (back.float() - keys.float()).abs().max() <= bound, case.id
