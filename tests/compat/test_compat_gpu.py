"""The compat proxy's logical views on a CUDA pool: gathers run kvcompat's Triton read.

Run on a GPU machine: ``python -m pytest tests/compat/test_compat_gpu.py -q -p no:cacheprovider``
(needs triton; without CUDA every test here is skipped).
"""

from __future__ import annotations

import pytest
import torch

import kvcompat
from kvcompat.compat import CompatViewError, LogicalView
from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool, ReferenceMHATokenToKVPool

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_gather_and_assignment_on_cuda_match_the_key_first_calls() -> None:
    pool = kvcompat.compat(ReferenceDeepSeekV4SingleKVPool(4096, 64, layer_num=2, device="cuda"))
    view = pool.get_key_buffer(1)
    assert isinstance(view, LogicalView)
    assert view.device.type == "cuda"
    loc = torch.randperm(4096, device="cuda")[:300]
    keys = torch.randn(300, 1, 512, device="cuda").to(torch.bfloat16)
    view[loc] = keys
    dense = view[loc]
    assert dense.device.type == "cuda"
    assert torch.equal(dense, pool.kvcompat.read(1, loc))
    assert torch.equal(dense, pool.kvcompat.read(1, loc.cpu().cuda(), impl="torch"))
    assert torch.equal(view[loc.cpu()], dense)  # a host index is moved to the pool's device
    assert (dense.float() - keys.float()).abs().max() <= keys.float().abs().max() / 16
    with pytest.raises(CompatViewError, match=r"Tensor\.data_ptr\(\)"):
        view.data_ptr()  # what a Triton/CUDA launcher calls first


def test_mha_on_cuda_stays_native() -> None:
    native = ReferenceMHATokenToKVPool(
        256, 16, torch.bfloat16, head_num=2, head_dim=64, device="cuda"
    )
    pool = kvcompat.compat(native)
    assert pool.get_key_buffer(0) is native.k_buffer[0]
    assert pool.get_kv_buffer(0)[1] is native.v_buffer[0]
