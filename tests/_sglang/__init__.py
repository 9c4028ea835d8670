"""Test-only support for running SGLang 0.5.23's own KV-pool classes (the ``tests/real`` tier).

* :mod:`_sglang.env` -- :func:`prepare_sglang` / :func:`release_sglang`: torchvision import
  stub, cache folders, one-off module import, dummy published runtime config.
* :mod:`_sglang.builders` -- one ``build_*`` function per constructible pool class.
* :mod:`_sglang.cases` -- :data:`POOL_CASES`: class x start_layer cases with expected facts.
* :mod:`_sglang.places` -- where each release keeps its layout code (oracles, GPU tiers).
* :mod:`_sglang.legacy` -- a test double of the pre-0.5.23 ``DeepSeekV4SingleKVPool``.

Importable as ``_sglang`` because pytest puts ``tests/`` on ``sys.path`` (``tests/real`` is a
package and ``tests/`` is not; see tests/real/README.md). Nothing here imports sglang at
import time; the first builder call does.
"""

from _sglang.env import current_session, prepare_sglang, release_sglang, sglang_installed

__all__ = ["current_session", "prepare_sglang", "release_sglang", "sglang_installed"]
