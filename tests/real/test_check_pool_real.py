"""check_pool passes on every SGLang 0.5.23 pool class that kvcompat supports (built on CPU).

The cases are the conformance tier's (``_sglang.cases``: every supported class, pipeline
stages, fp8 and the DeepSeek-V4 layout variants), so a supported class without a case
already fails ``test_docs_traps``.
"""

from __future__ import annotations

from typing import Any

import pytest
from _sglang.cases import POOL_CASES, VARIANT_CASES, case_params

from kvcompat.testing import check_pool


@pytest.mark.parametrize("case", case_params([*POOL_CASES, *VARIANT_CASES]))
def test_check_pool_passes_on_the_real_class(case: Any) -> None:
    native = case.build()
    report = check_pool(native, raise_on_failure=False)
    assert report.ok, str(report)
    assert "getters" in report.passed
    assert "describe" in report.passed
