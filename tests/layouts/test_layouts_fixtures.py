"""Golden fixtures: fixed writes and reads of every layout, compared byte for byte.

Rewrite them (after an intended change) with ``python tests/layouts/regen_fixtures.py``.
"""

from __future__ import annotations

import pytest
import torch
from regen_fixtures import CASES, FIXTURE_DIR, PAGE_SIZE, build, load, path_of

from kvcompat.layouts import dequantize

BUDGET_BYTES = 200_000


@pytest.mark.parametrize("case", sorted(CASES))
def test_fixture_is_reproduced_byte_for_byte(case: str) -> None:
    assert path_of(case).exists(), "missing fixture; run python tests/layouts/regen_fixtures.py"
    stored, fresh = load(case), build(case)
    assert stored.keys() == fresh.keys()
    for key in stored:
        a, b = stored[key], fresh[key]
        assert (a.dtype, a.shape) == (b.dtype, b.shape), key
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), key


@pytest.mark.parametrize("case", sorted(CASES))
def test_fixture_reads_back_from_the_stored_bytes(case: str) -> None:
    """The stored 'after' bytes alone decode to the stored output (no re-encoding)."""
    spec, fnuz = CASES[case]
    stored = load(case)
    rows = 3 if spec.paged else 6
    buf = stored["after"].reshape(rows, -1)
    out = dequantize(spec, buf, stored["loc"], PAGE_SIZE, fnuz=fnuz)
    assert torch.equal(
        out.contiguous().view(torch.uint8).reshape(out.shape[0], -1), stored["dequantized"]
    )
    changed = (stored["after"] != stored["before"]).sum().item()
    assert 0 < changed <= stored["loc"].numel() * spec.bytes_per_token


def test_fixtures_stay_small() -> None:
    total = sum(p.stat().st_size for p in FIXTURE_DIR.glob("*.pt"))
    assert total < BUDGET_BYTES
    assert {p.stem for p in FIXTURE_DIR.glob("*.pt")} == set(CASES)
