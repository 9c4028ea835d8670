"""A drop-in proxy for backends written against the MHA pool interface.

``kvcompat.compat(pool)`` returns the native pool's own class (a generated subclass sharing
the pool's state), so ``isinstance`` checks, attributes and native helper methods behave as
on the pool itself. The four generic methods never hand out packed bytes as token rows:

* split (MHA-family) pools, and pools of plain token rows (bf16/fp8 MLA, K-only MHA): the
  native tensors, bit-identical to the native getters;
* packed pools (DeepSeek-V4 single / HiSparse / uniform-fp8 pools and the V4 composite's
  parts, DSA's packed fp8 row, the V4 indexer): :class:`LogicalView` objects reporting the
  logical ``[rows, heads, head_dim]`` geometry; a gather by token index dequantizes through
  kvcompat's read, an index assignment quantizes through its write, anything else raises
  :class:`CompatViewError` naming the key-first call to use;
* ``set_kv_buffer`` stores through kvcompat's all-or-nothing write, routing SGLang's
  ``KVWriteLoc`` (or a translated plain loc) on composites.

It is a bridge: porting to the key-first API (``kvcompat.adapt``) is the clean fix.
"""

from __future__ import annotations

from kvcompat._compat._proxy import CompatPool, compat
from kvcompat._compat._view import CompatViewError, LogicalView

__all__ = ["CompatPool", "CompatViewError", "LogicalView", "compat"]
