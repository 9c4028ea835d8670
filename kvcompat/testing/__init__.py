"""Test helpers: reference pools with SGLang 0.5.23's behaviour, and real SGLang on a CPU.

:func:`check_pool` checks a pool or adapter (yours included) against kvcompat's
promises and reports every failure. :func:`sglang_cpu` lets SGLang's own pool modules import
on a CPU-only machine (a torchvision import shim, only where no working torchvision imports).

Use the reference pools to test code against the uniform API without installing SGLang. They
are proven equal to the real classes (shapes, dtypes, page geometry,
exceptions and messages) by kvcompat's conformance tests.

Example:
    >>> import kvcompat
    >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
    >>> kvcompat.is_single_kv_pool(ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64))
    True
"""

from __future__ import annotations

from kvcompat.testing._check import CheckFailure, PoolCheckError, PoolReport, check_pool
from kvcompat.testing._reference import (
    KVLayout,
    RecordingLayerCounter,
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
    ReferenceMLATokenToKVPool,
    ReferenceSWAKVPool,
    reference_swa_pool,
)
from kvcompat.testing._sglang_cpu import SGLangCPU, sglang_cpu

__all__ = [
    "CheckFailure",
    "KVLayout",
    "PoolCheckError",
    "PoolReport",
    "RecordingLayerCounter",
    "ReferenceDeepSeekV4SingleKVPool",
    "ReferenceMHATokenToKVPool",
    "ReferenceMLATokenToKVPool",
    "ReferenceSWAKVPool",
    "SGLangCPU",
    "check_pool",
    "reference_swa_pool",
    "sglang_cpu",
]
