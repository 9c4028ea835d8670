r"""``kvcompat scan``: a static check for native KV-pool accesses that break on some pools.

It finds, in Python source, the calls and attribute reads that raise (or silently
misread) on SGLang's single-KV DeepSeek-V4 and key-only pools when no guard
protects them, and points at the kvcompat call to use instead:

==========  ======================================  ============================================
Code        Looks for                               Use instead
==========  ======================================  ============================================
``KVC001``  ``pool.get_value_buffer(...)``          ``kvcompat.compat(pool).get_value_buffer``
``KVC002``  ``pool.get_kv_buffer(...)``             ``kvcompat.compat(pool).get_kv_buffer``
``KVC003``  ``pool.set_kv_buffer(...)``             ``kvcompat.compat(pool).set_kv_buffer``
``KVC004``  ``pool.k_buffer`` / ``pool.v_buffer``   ``kvcompat.adapt(pool).get_key_buffer``
``KVC005``  ``pool.kv_buffer``                      ``kvcompat.adapt(pool).read``
``KVC006``  ``pool.get_key_buffer(i)[loc]``         ``kvcompat.adapt(pool).read``
``KVC007``  ``pool.get_kv_buffer_shape()``          ``kvcompat.adapt(pool).get_key_buffer(i).shape``
``KVC008``  ``adapter.get_value_buffer(i).shape``   ``kvcompat.compat(pool).get_value_buffer``
``KVC009``  ``k, v = adapter.get_kv_buffer(i)``     ``kvcompat.adapt(pool).read_kv``
            ``k[loc]``
==========  ======================================  ============================================

(``adapter``: kvcompat's key-first adapter, ``kvcompat.adapt(pool)``, whose buffers are the
pool's storage; ``kvcompat.compat(pool)``'s getters hand out logical views instead.)

The rules, guards and suppression comments are described in ``docs/scan.md``.
This module uses the standard library only (``ast``); it never imports torch.

Example:
    >>> from kvcompat.scan import scan_source
    >>> [f.code for f in scan_source("k, v = token_to_kv_pool.get_kv_buffer(layer_id)\n")]
    ['KVC002']
"""

from __future__ import annotations

from kvcompat._scan._fix import fix_source, scan_source
from kvcompat._scan._rules import RULES, Finding, Rule
from kvcompat._scan._run import ScanReport, main, scan_paths

__all__ = [
    "RULES",
    "Finding",
    "Rule",
    "ScanReport",
    "fix_source",
    "main",
    "scan_paths",
    "scan_source",
]

if __name__ == "__main__":
    raise SystemExit(main())
