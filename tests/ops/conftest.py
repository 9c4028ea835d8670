"""tests/ops settings: undo the process-wide state torch.compile changes."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _keep_the_recursion_limit() -> Iterator[None]:
    """Inductor raises ``sys.getrecursionlimit()`` to 2000 on a cache miss; put it back,
    so later tests (the scanner's "too deep for the parser" case) see the default."""
    limit = sys.getrecursionlimit()
    yield
    sys.setrecursionlimit(limit)
