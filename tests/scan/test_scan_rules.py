"""The detection and guard rules, one small module at a time."""

from __future__ import annotations

import sys
import textwrap

import pytest

from kvcompat.scan import scan_source


def codes(source: str) -> list[str]:
    return [finding.code for finding in scan_source(textwrap.dedent(source))]


# -- what is looked for ------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("pool.get_value_buffer(0)", ["KVC001"]),
        ("anything.get_kv_buffer(i)", ["KVC002"]),
        ("self.runner.x.set_kv_buffer(layer, loc, k, v)", ["KVC003"]),
        ("get_pool().get_kv_buffer(0)", ["KVC002"]),
        ("pool.k_buffer[0]", ["KVC004"]),
        ("pool.v_buffer", ["KVC004"]),
        ("pool.kv_buffer[0][loc]", ["KVC005"]),
        ("self.kv_cache.k_buffer", ["KVC004"]),
        ("runner.kvcache.kv_buffer[0][loc]", ["KVC005"]),
        ("runner.kvcache.kv_buffer", []),  # the list as a whole: any layout
        ("[b.data_ptr() for b in pool.kv_buffer], pool.kv_buffer[0].nbytes", []),
        ("pool.kv_buffer[layer].index_select(0, loc)", ["KVC005"]),
        ("pool.kv_buffer[:, loc]", ["KVC005"]),
        ("k = pool.get_key_buffer(i)\nk[loc]", ["KVC006"]),
        ("pool.get_key_buffer(i).to(q.dtype)[loc]", ["KVC006"]),
        ("pool.get_key_buffer(i)[0].nbytes", []),  # the size of one row
        ("pool.get_key_buffer(i)", []),
        # The adapter's buffer is the storage: on DeepSeek-V4 pools [pages, page_bytes].
        ("kvcompat.adapt(pool).get_key_buffer(i)[loc]", ["KVC006"]),
        ("kvcompat.compat(pool).get_key_buffer(i)[loc]", []),  # a view: gathers by token
        ("pool.get_kv_buffer_shape()", ["KVC007"]),
        ("self.get_kv_buffer_shape(chunk, group)", []),  # another API (LMCache's)
        ("host_pool.k_buffer[0], self.mem_pool_host.kv_buffer[0][loc]", []),
        ("self.token_to_kv.v_buffer", ["KVC004"]),
        ("self.pools[i].k_buffer", ["KVC004"]),
        ("KVPool.k_buffer", ["KVC004"]),
        ("pool.k_buffer[layer][loc] = x", ["KVC004"]),  # a write through the buffer
        ('getattr(pool, "v_buffer")', ["KVC004"]),
        ('getattr(kv_cache, "kv_buffer")[0][loc]', ["KVC005"]),
        ("pool.get_key_buffer(0)", []),  # works on every pool
        ("model.k_buffer, tensors.v_buffer, layer.kv_buffer", []),  # not pool-like
        ('getattr(pool, "kv_buffer", None)', []),  # a probe with a default
        ('hasattr(pool, "kv_buffer")', []),
        ("getattr(pool, name)", []),
        ("pool.k_buffer = x", []),  # a store defines the attribute
        ("del pool.kv_buffer", []),
        ("def get_kv_buffer(self, i): ...", []),  # a definition, not a call
        ("get_kv_buffer(pool, 0)", []),  # a function, not the pool method
    ],
)
def test_what_is_flagged(source: str, expected: list[str]) -> None:
    assert codes(source) == expected


def test_self_in_pool_classes() -> None:
    source = """
    class HostKVCache:
        def __init__(self):
            self.k_buffer = []

        def read(self, i):
            return self.k_buffer[i], self.v_buffer[i], self.device_pool.k_buffer[i]

    class Backend:
        def read(self, i):
            return self.k_buffer[i], self.kv_buffer[i][0]

    class DeviceTokenPool(Base):
        def read(self, i):
            def inner():
                return self.kv_buffer[i][0], self.get_value_buffer(i)
            return inner

    class Paged(KVCache):
        def read(self, i, loc):
            sub = self.full_kv_pool
            return sub.get_kv_buffer(i), self.swa_pool.kv_buffer[i][loc]
    """
    # A pool class's code is its implementation: its own and inherited storage,
    # its sub-pools and its device pool. Backend is no pool, and self.k_buffer is
    # its own attribute (receivers are pool-like by name, and "self" is not).
    assert scan_source(textwrap.dedent(source)) == []


def test_pool_methods_calling_themselves() -> None:
    source = """
    class MyPool(KVCache):
        def get_kv_buffer(self, i):
            return self.get_kv_buffer(i - 1), super().get_value_buffer(i)

        def shape(self):
            return self.get_value_buffer(0).shape

    class Composite:
        def get_value_buffer(self, layer_id):
            return self._pool_for(layer_id).get_value_buffer(layer_id)

    class Tool:
        def get_kv_buffer_shape(self):
            return self.get_kv_buffer_shape()
    """
    # Pool classes, and a method delegating to the method of the same name.
    assert codes(source) == []


def test_methods_of_non_pool_classes() -> None:
    source = """
    class Backend:
        def shape(self):
            return self.get_value_buffer(0).shape, self.token_to_kv_pool.get_kv_buffer(0)
    """
    assert codes(source) == ["KVC001", "KVC002"]


@pytest.mark.parametrize(
    "source",
    [
        """
        if hasattr(pool, "v_buffer"):
            v = pool.v_buffer[0]
        else:
            v = None
        """,
        """
        if isinstance(pool, MHATokenToKVPool):
            pool.get_value_buffer(0)
        """,
        """
        if type(self.token_to_kv_pool) is MHATokenToKVPool:
            self.token_to_kv_pool.set_kv_buffer(layer, loc, k, v)
        """,
        """
        if not hasattr(pool, "k_buffer"):
            return None
        k = pool.k_buffer[0]
        """,
        """
        is_mha = isinstance(pool, MHATokenToKVPool)
        v = pool.get_value_buffer(0) if is_mha else None
        """,
        """
        if hasattr(kvcache, "kv_buffer"):
            caches = list(kvcache.kv_buffer)
        else:
            caches = list(kvcache.k_buffer) + list(kvcache.v_buffer)
        """,
        """
        def attach_mha(pool):
            return pool.k_buffer[0], pool.v_buffer[0]
        """,
        """
        def _set_mla_kv_buffer(self, loc, k):
            self.token_to_kv_pool.set_kv_buffer(self.attn, loc, k, None)
        """,
    ],
)
def test_checks_on_the_receiver_are_guards(source: str) -> None:
    assert codes(source) == []


def test_a_check_on_another_object_is_no_guard() -> None:
    source = """
    if isinstance(other, MHATokenToKVPool):
        pool.get_value_buffer(0)
    if hasattr(pool, "layers_mapping"):
        sub_pool = pool.swa_kv_pool
    else:
        sub_pool = pool
    sub_pool.k_buffer[0]
    """
    assert codes(source) == ["KVC001", "KVC004"]


def test_a_hasattr_about_another_method_is_no_guard() -> None:
    # SGLang's aiter backend: hybrid pools have get_v_head_dim, DeepSeek-V4 pools do
    # not, so the else branch (the v_head_dim probe) runs on them and raises.
    source = """
    if hasattr(pool, "get_v_head_dim"):
        v_head_dim = pool.get_v_head_dim()
    else:
        v_head_dim = pool.get_value_buffer(0).shape[-1]
    if hasattr(pool, "kv_buffer") or hasattr(pool, attribute_name):
        pool.get_value_buffer(0)
    """
    assert codes(source) == ["KVC001"]


# -- a self attribute whose class a check fixed ---------------------------------

_NARROWED_BACKEND = """
class Backend:
    def __init__(self, runner):
        assert isinstance(runner.token_to_kv_pool, MiniMaxSparseKVPool)
        self.kv_pool = runner.token_to_kv_pool
        self.alias = runner.token_to_kv_pool
{extra}
    def forward(self, layer):
        k, v = self.kv_pool.get_kv_buffer(layer.layer_id)
        return self.alias.main_pool.k_buffer[0], k, v
"""


def test_a_self_attribute_assigned_a_checked_value_is_guarded() -> None:
    # SGLang's MiniMax sparse backend: ``assert isinstance(runner.token_to_kv_pool,
    # MiniMaxSparseKVPool)`` in __init__, then ``self.kv_pool = runner.token_to_kv_pool``.
    assert codes(_NARROWED_BACKEND.format(extra="")) == []


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        # Another assignment stores an unchecked value: the attribute is not narrowed.
        ("    def reset(self, pool):\n        self.kv_pool = pool\n", ["KVC002"]),
        ("    def reset(self, a):\n        self.kv_pool, self.alias = a\n", ["KVC002", "KVC004"]),
        ("    def grow(self, a):\n        self.alias += a\n", ["KVC004"]),
        ("    def scan(self, pools):\n        for self.alias in pools: pass\n", ["KVC004"]),
    ],
)
def test_one_unchecked_assignment_undoes_the_narrowing(extra: str, expected: list[str]) -> None:
    assert codes(_NARROWED_BACKEND.format(extra=extra)) == expected


@pytest.mark.parametrize(
    "check",
    [
        "if not isinstance(self.kv_pool, MiniMaxM3Nvfp4KVPool):\n                raise ValueError",
        "assert isinstance(self.kv_pool, MiniMaxM3Nvfp4KVPool)",
    ],
)
def test_a_self_attribute_checked_after_its_assignment_is_guarded(check: str) -> None:
    # SGLang's MiniMax NVFP4 backend stores runner.token_to_kv_pool, then raises
    # unless it is a MiniMaxM3Nvfp4KVPool.
    source = f"""
    class Backend:
        def __init__(self, runner):
            self.kv_pool = runner.token_to_kv_pool
            self.unchecked = runner.token_to_kv_pool
            {check}
            self.alias = self.kv_pool

        def forward(self, layer):
            self.kv_pool.get_kv_buffer(layer.layer_id)
            self.alias.get_kv_buffer(layer.layer_id)
            self.unchecked.get_kv_buffer(layer.layer_id)
    """
    assert codes(source) == ["KVC002"]


def test_a_check_that_does_not_leave_validates_nothing() -> None:
    source = """
    class Backend:
        def __init__(self, runner):
            self.kv_pool = runner.token_to_kv_pool
            if not isinstance(self.kv_pool, MiniMaxM3Nvfp4KVPool):
                log("unexpected pool")

        def forward(self, layer):
            self.kv_pool.get_kv_buffer(layer.layer_id)
    """
    assert codes(source) == ["KVC002"]


def test_narrowing_needs_the_check_on_the_assigned_value() -> None:
    source = """
    class Backend:
        def __init__(self, runner, other):
            assert isinstance(other, MiniMaxSparseKVPool)
            self.kv_pool = runner.token_to_kv_pool
            if isinstance(runner.token_to_kv_pool, MHATokenToKVPool):
                pass
            self.later = runner.token_to_kv_pool   # the check is in another block
            self.checked = other

        def forward(self, layer):
            self.kv_pool.get_kv_buffer(layer.layer_id)
            self.later.get_kv_buffer(layer.layer_id)
            self.checked.get_kv_buffer(layer.layer_id)
    """
    assert codes(source) == ["KVC002", "KVC002"]


# -- MLX modules ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("imports", "expected"),
    [
        ("import mlx.core as mx", []),
        ("from mlx import nn", []),
        ("import mlx.core as mx\nimport torch", ["KVC004"]),
        ("import mlx.core as mx\nfrom sglang.srt.mem_cache.memory_pool import KVCache", ["KVC004"]),
        ("import mlxtend", ["KVC004"]),  # not MLX
        ("import numpy as np", ["KVC004"]),
    ],
)
def test_mlx_modules_hold_mlx_pools(imports: str, expected: list[str]) -> None:
    # SGLang's MLX attention wrapper reads its MLX pool's ``k_buffer`` (lists of
    # mx.array): none of SGLang's torch pool classes can reach a module that imports
    # MLX but neither torch nor sglang.srt.mem_cache.
    source = f"{imports}\n\ndef rope(ctx, i):\n    return ctx.kv_pool.k_buffer[i]\n"
    assert codes(source) == expected


# -- detector guards ----------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        """
        if kvcompat.is_single_kv_pool(pool):
            pass
        else:
            pool.get_value_buffer(0)
        """,
        """
        if not is_single_kv_pool(pool):
            pool.get_kv_buffer(0)
        """,
        """
        if kvcompat.pool_kind(pool) in (PoolKind.SPLIT, PoolKind.LATENT):
            pool.get_value_buffer(0)
        """,
        """
        if x:
            pass
        elif kvcompat.pool_kind(pool) == PoolKind.SPLIT:
            pass
        else:
            pool.kv_buffer[0]
        """,
        """
        if kvcompat.is_key_only_pool(pool) or kvcompat.is_single_kv_pool(pool):
            pass
        else:
            pool.set_kv_buffer(layer, loc, k, v)
        """,
        """
        def f(pool):
            if kvcompat.is_single_kv_pool(pool):
                return None
            return pool.get_value_buffer(0)
        """,
        """
        def f(pool):
            assert not kvcompat.is_single_kv_pool(pool), "single-KV pools are not supported"
            return pool.get_value_buffer(0)
        """,
        """
        while True:
            if kvcompat.is_single_kv_pool(pool):
                break
            pool.get_kv_buffer(0)
        """,
        "v = None if kvcompat.is_single_kv_pool(pool) else pool.get_value_buffer(0)",
        "v = kvcompat.is_single_kv_pool(pool) or pool.get_value_buffer(0)",
        "v = not kvcompat.is_single_kv_pool(pool) and x and pool.get_value_buffer(0)",
        """
        match kvcompat.pool_kind(pool):
            case PoolKind.SPLIT:
                pool.get_value_buffer(0)
        """,
        """
        single = kvcompat.is_single_kv_pool(pool)
        if not single:
            pool.get_value_buffer(0)
        """,
        """
        from kvcompat import pool_kind as kind_of
        if kind_of(pool) is PoolKind.SPLIT:
            pool.v_buffer[0]
        """,
        """
        if kvcompat.is_single_kv_pool(pool):
            if not kvcompat.is_single_kv_pool(other):
                pool.get_value_buffer(0)
        """,
        """
        if kvcompat.is_split_kv_pool(pool):
            pool.v_buffer[0]
        elif kvcompat.is_latent_pool(pool):
            pool.kv_buffer[0]
        """,
    ],
)
def test_detector_guards(source: str) -> None:
    assert codes(source) == []


@pytest.mark.parametrize(
    "source",
    [
        # The branch where the detector says the pool IS single-KV breaks for sure.
        """
        if kvcompat.is_single_kv_pool(pool):
            pool.get_value_buffer(0)
        """,
        """
        if not kvcompat.is_single_kv_pool(pool):
            pass
        else:
            pool.get_value_buffer(0)
        """,
        """
        if kvcompat.is_key_only_pool(pool) and debug:
            pool.get_value_buffer(0)
        """,
        "v = kvcompat.is_single_kv_pool(pool) and pool.get_value_buffer(0)",
        """
        def f(pool):
            if not kvcompat.is_single_kv_pool(pool):
                return None
            return pool.get_value_buffer(0)
        """,
        """
        if kvcompat.is_supported_pool(pool) and not kvcompat.is_composite_pool(pool):
            pool.get_value_buffer(0)
        """,
        # An if that does not leave the block guards nothing after it.
        """
        if kvcompat.is_single_kv_pool(pool):
            log("single")
        pool.get_value_buffer(0)
        """,
        # A guard does not reach into a function defined under it.
        """
        if not kvcompat.is_single_kv_pool(pool):
            def later():
                return pool.get_value_buffer(0)
        """,
    ],
)
def test_not_guards(source: str) -> None:
    expected = "KVC005" if "kv_buffer[0][" in source else "KVC001"
    assert codes(source) == [expected]


# -- try / except -------------------------------------------------------------

_CALLS = "pool.get_value_buffer(0)"


@pytest.mark.parametrize(
    ("handler", "guarded"),
    [
        ("except NotImplementedError:", True),
        ("except builtins.NotImplementedError:", True),
        ("except (KeyError, NotImplementedError) as exc:", True),
        ("except RuntimeError:", True),  # NotImplementedError's base class
        ("except Exception:", True),
        ("except BaseException:", True),
        ("except:", True),
        ("except AttributeError:", False),
        ("except kvcompat.NoValueBufferError:", False),  # kvcompat's, not SGLang's
        ("except (ValueError, TypeError):", False),
        ("finally:", False),
    ],
)
def test_try_guards_calls(handler: str, guarded: bool) -> None:
    source = f"try:\n    {_CALLS}\n{handler}\n    pass\n"
    assert codes(source) == ([] if guarded else ["KVC001"])


@pytest.mark.parametrize(
    ("access", "handler", "expected"),
    [
        ("pool.k_buffer[0]", "except AttributeError:", []),
        ("pool.v_buffer[0]", "except (AttributeError, IndexError):", []),
        ("pool.k_buffer[0]", "except NotImplementedError:", ["KVC004"]),
        # kv_buffer exists on DeepSeek-V4 single-KV pools and silently has another
        # shape, so no except clause makes it safe.
        ("pool.kv_buffer[0][loc]", "except AttributeError:", ["KVC005"]),
        ("pool.kv_buffer[0][loc]", "except Exception:", ["KVC005"]),
    ],
)
def test_try_guards_attributes(access: str, handler: str, expected: list[str]) -> None:
    assert codes(f"try:\n    {access}\n{handler}\n    pass\n") == expected


def test_try_covers_only_its_body() -> None:
    source = """
    try:
        a = pool.get_value_buffer(0)
    except NotImplementedError:
        a = pool.get_kv_buffer(0)
    else:
        b = pool.get_kv_buffer(1)
    finally:
        c = pool.get_kv_buffer(2)
    """
    assert [f.line for f in scan_source(textwrap.dedent(source))] == [5, 7, 9]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="except* is Python 3.11+")
def test_except_star() -> None:
    source = "try:\n    pool.get_kv_buffer(0)\nexcept* NotImplementedError:\n    pass\n"
    assert codes(source) == []


@pytest.mark.parametrize(
    "context",
    [
        "contextlib.suppress(NotImplementedError)",
        "suppress(ValueError, NotImplementedError)",
    ],
)
def test_suppress_context_manager(context: str) -> None:
    assert codes(f"with {context}:\n    pool.get_kv_buffer(0)\n") == []


# -- adapted receivers --------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "kvcompat.adapt(pool).get_value_buffer(0)",
        "kvcompat.compat(pool).set_kv_buffer(layer, loc, k, v)",
        "adapt(pool).kv_buffer",
        "import kvcompat as kc\nkc.adapt(pool).get_kv_buffer(0)",
        "from kvcompat import adapt as wrap\nwrap(pool).get_kv_buffer(0)",
        "(kv := kvcompat.adapt(pool)).get_kv_buffer(0)",
        "kv = kvcompat.adapt(pool)\nkv.get_kv_buffer(0)",
        "kv: object = kvcompat.adapt(pool)\nkv.get_kv_buffer(0)",
        "def f(pool):\n    pool = kvcompat.adapt(pool)\n    return pool.get_value_buffer(0)",
        "def f(kv: kvcompat.KVPoolProtocol):\n    return kv.get_value_buffer(0)",
        "def f(kv: 'kvcompat.KVPoolProtocol'):\n    return kv.get_value_buffer(0)",
        (
            "from kvcompat import KVPoolProtocol\ndef f(kv: KVPoolProtocol | None):\n"
            "    return kv.get_value_buffer(0)"
        ),
        # module global, used in a function
        "KV = kvcompat.adapt(pool)\ndef f():\n    return KV.get_kv_buffer(0)",
        # closure
        (
            "def f(pool):\n    kv = kvcompat.adapt(pool)\n    def g():\n"
            "        return kv.get_kv_buffer(0)\n    return g"
        ),
        # an attribute set from kvcompat.adapt in every assignment of the class
        (
            "class B:\n    def __init__(self, pool):\n        self.kv = kvcompat.adapt(pool)\n"
            "    def f(self):\n        return self.kv.get_value_buffer(0)"
        ),
    ],
)
def test_adapted_receivers(source: str) -> None:
    assert codes(source) == []


@pytest.mark.parametrize(
    "source",
    [
        "something.adapt(pool).get_value_buffer(0)",  # not kvcompat's adapt
        "kv.get_value_buffer(0)\nkv = kvcompat.adapt(pool)",  # used before
        "kv = kvcompat.adapt(pool)\nkv = pool\nkv.get_value_buffer(0)",  # rebound
        "kv = kvcompat.adapt(pool)\nfor kv in pools:\n    kv.get_value_buffer(0)",
        "kv = kvcompat.adapt(pool)\n[kv.get_value_buffer(0) for kv in pools]",
        "kv = kvcompat.adapt(pool) if x else pool\nkv.get_value_buffer(0)",
        "KV = kvcompat.adapt(pool)\nKV = None\ndef f():\n    return KV.get_value_buffer(0)",
        (
            "class B:\n    def __init__(self, pool):\n        self.kv = kvcompat.adapt(pool)\n"
            "    def reset(self, pool):\n        self.kv = pool\n"
            "    def f(self):\n        return self.kv.get_value_buffer(0)"
        ),
        "lambda pool: pool.get_value_buffer(0)",
    ],
)
def test_not_adapted_receivers(source: str) -> None:
    assert codes(source) == ["KVC001"]


# -- suppression comments ------------------------------------------------------


@pytest.mark.parametrize(
    ("comment", "suppressed"),
    [
        ("# kvcompat: ignore", True),
        ("#kvcompat:ignore", True),
        ("# kvcompat: ignore[KVC005]", True),
        ("# kvcompat: ignore[KVC001, kvc005]", True),
        ("# type: ignore  # kvcompat: ignore", True),
        ("# kvcompat: ignore[KVC004]", False),
        ("# kvcompat: ignored", False),
        ("# kvcompat: ignore-files", False),
        ("# kvcompat ignore", False),
    ],
)
def test_line_suppression(comment: str, suppressed: bool) -> None:
    source = f"x = pool.kv_buffer[0][loc]  {comment}\n"
    assert codes(source) == ([] if suppressed else ["KVC005"])


def test_line_suppression_applies_to_the_reported_line() -> None:
    source = "v = (pool  # kvcompat: ignore\n     .get_value_buffer(0))\n"
    assert codes(source) == ["KVC001"]  # reported on line 2, where the name is
    source = "v = (pool\n     .get_value_buffer(0))  # kvcompat: ignore\n"
    assert codes(source) == []


@pytest.mark.parametrize(
    ("marker", "expected"),
    [
        ("# kvcompat: ignore-file", []),
        ("# kvcompat: ignore-file[KVC005]", ["KVC001"]),
        ("x = '# kvcompat: ignore-file'", ["KVC001", "KVC005"]),
    ],
)
def test_file_suppression(marker: str, expected: list[str]) -> None:
    source = f'"""Doc."""\n{marker}\npool.get_value_buffer(0)\npool.kv_buffer[0][loc]\n'
    assert codes(source) == expected


# -- positions ----------------------------------------------------------------


def test_columns_are_characters_not_bytes() -> None:
    [finding] = scan_source("x = ('é', '日本'); pool.get_kv_buffer(0)\n")
    assert (finding.line, finding.col) == (1, 23)


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_line_numbers_with_any_line_ending(newline: str) -> None:
    source = newline.join(["import x", "", "pool.k_buffer", ""])
    [finding] = scan_source(source)
    assert (finding.line, finding.col) == (3, 6)


def test_findings_are_in_source_order() -> None:
    source = (
        "a = (pool.kv_buffer[0][1], pool.get_kv_buffer(pool.get_value_buffer(0)))\n"
        "b = pool.v_buffer\n"
    )
    assert [(f.line, f.col, f.code) for f in scan_source(source)] == [
        (1, 11, "KVC005"),
        (1, 33, "KVC002"),
        (1, 52, "KVC001"),
        (2, 10, "KVC004"),
    ]


def test_syntax_error_is_a_finding_not_an_exception() -> None:
    [finding] = scan_source("def f(:\n", "bad.py")
    assert (finding.path, finding.line, finding.code, finding.fixable) == (
        "bad.py",
        1,
        "KVC900",
        False,
    )
    assert finding.message.startswith("syntax error: ")
    assert finding.is_error


def test_invalid_escapes_in_scanned_code_do_not_warn() -> None:
    # pytest turns warnings into errors here; the scanner must stay quiet.
    assert codes("import re\nre.compile('\\d')\npool.get_kv_buffer(0)\n") == ["KVC002"]


def test_deeply_nested_expressions_do_not_exhaust_the_stack() -> None:
    # 2000 nested BinOps parse fine; a recursive visitor would need ~4000 frames.
    source = "x = " + " + ".join(["pool.k_buffer[0]"] * 2000) + "\n"
    assert codes(source) == ["KVC004"] * 2000


def test_too_deep_for_the_parser_is_reported() -> None:
    # Under Python's default recursion limit, as the kvcompat command runs: torch.compile,
    # run earlier in the same process, raises it process-wide (to 2000 in torch 2.13).
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        source = "x = " + " + ".join(["pool.k_buffer[0]"] * 5000) + "\n"
        findings = scan_source(source)
    finally:
        sys.setrecursionlimit(limit)
    [finding] = findings
    assert finding.code == "KVC900"
    assert "too deeply nested" in finding.message


# -- modules written for one model family's pool ---------------------------------


@pytest.mark.parametrize(
    ("imports", "expected"),
    [
        # SGLang's QSA backend: its pools are QSATokenToKVPool / HybridLinearKVPool /
        # MHATokenToKVPool, token-major, where every one of these accesses works.
        ("from sglang.srt.mem_cache.qsa_kv_pool import QSATokenToKVPool", []),
        # The MiniMax NVFP4 main pool is packed page-major: token rows misread.
        (
            "from sglang.srt.mem_cache.minimax_m3_nvfp4_pool import MiniMaxM3Nvfp4KVPool",
            ["KVC006"],
        ),
        # A module that also imports a class the methods break on is generic.
        (
            (
                "from sglang.srt.mem_cache.qsa_kv_pool import QSATokenToKVPool\n"
                "from sglang.srt.mem_cache.memory_pool import MHATokenToKOnlyPool"
            ),
            ["KVC001", "KVC006", "KVC003"],
        ),
        ("", ["KVC001", "KVC006", "KVC003"]),
    ],
)
def test_model_family_modules(imports: str, expected: list[str]) -> None:
    body = (
        "def forward(pool, layer, loc, k, v):\n"
        "    v_cache = pool.get_value_buffer(layer.layer_id)\n"
        "    k_cache = pool.get_key_buffer(layer.layer_id)\n"
        "    pool.set_kv_buffer(layer, loc, k, v)\n"
        "    return k_cache[loc], v_cache\n"
    )
    assert codes(f"{imports}\n{body}") == expected


# -- classes built for one model family's configuration --------------------------

_FAMILY_METHODS = """
    def forward(self, layer, loc, k, v):
        v_cache = self.pool.get_value_buffer(layer.layer_id)
        kv = self.pool.get_kv_buffer(layer.layer_id)
        self.pool.set_kv_buffer(layer, loc, k, v)
        k_cache = self.pool.get_key_buffer(layer.layer_id)
        shape = self.pool.get_kv_buffer_shape()
        return k_cache[loc], v_cache, kv, shape, self.pool.k_buffer[layer.layer_id]
"""
_EVERY_CODE = ["KVC001", "KVC002", "KVC003", "KVC006", "KVC007", "KVC004"]


def _backend(init: str) -> str:
    head = "class Backend:\n    def __init__(self, runner):\n        self.pool = runner.pool\n"
    return head + textwrap.indent(textwrap.dedent(init), " " * 8) + _FAMILY_METHODS


@pytest.mark.parametrize(
    "check",
    [
        # SGLang's MiniCPM sparse backend, as it reads in 0.5.23.
        """
        hf_config = runner.model_config.hf_config
        if not isinstance(hf_config, MiniCPMHybridConfig) or not hf_config.sparse:
            raise ValueError("MiniCPM model must have sparse attention enabled.")
        """,
        "assert isinstance(runner.model_config.hf_config, MiniCPMHybridConfig)\n",
        "assert runner.ok and isinstance(runner.hf_config, (QwenConfig, Qwen2Config))\n",
        # The name the one assignment stores says what it is.
        """
        cfg = runner.model_config.hf_config
        assert isinstance(cfg, MiniCPMHybridConfig)
        """,
        """
        if not isinstance(runner.model_config.hf_config, configs.MiniCPMHybridConfig):
            raise TypeError("MiniCPM only")
        """,
    ],
)
def test_a_constructor_that_refuses_other_families_rules_out_deepseek_v4(check: str) -> None:
    # No DeepSeek-V4 model gets past __init__, so no method sees a DeepSeek-V4 pool;
    # KVC004 still breaks on the MLA pools such a family may get.
    assert codes(_backend(check)) == ["KVC004"]


@pytest.mark.parametrize(
    "check",
    [
        "pass\n",
        # Checks that admit DeepSeek-V4: its own config classes, their base, the generic one.
        "assert isinstance(runner.model_config.hf_config, DeepseekV3Config)\n",
        "assert isinstance(runner.hf_config, DeepSeekV4Config)\n",
        "assert isinstance(runner.hf_config, (QwenConfig, PretrainedConfig))\n",
        "assert isinstance(runner.hf_config, transformers.PreTrainedConfig)\n",
        "assert isinstance(runner.hf_config, RotaryEmbeddingConfigMixin)\n",
        # The subject is not a configuration, or the check does not leave.
        "assert isinstance(runner.model, MiniCPMForCausalLM)\n",
        """
        if not isinstance(runner.hf_config, MiniCPMHybridConfig):
            logger.warning("not MiniCPM")
        """,
        """
        if not isinstance(runner.hf_config, MiniCPMHybridConfig):
            raise ValueError("MiniCPM only")
        else:
            pass
        """,
        # Positive, or only on one path: "isinstance and x" may fail on x alone.
        """
        if isinstance(runner.hf_config, MiniCPMHybridConfig):
            raise ValueError("not for MiniCPM")
        """,
        """
        if not (isinstance(runner.hf_config, MiniCPMHybridConfig) and runner.ok):
            raise ValueError("MiniCPM only")
        """,
        """
        if runner.fast:
            assert isinstance(runner.hf_config, MiniCPMHybridConfig)
        """,
        "assert runner.ok or isinstance(runner.hf_config, MiniCPMHybridConfig)\n",
        """
        if not isinstance(runner.hf_config, MiniCPMHybridConfig) and runner.strict:
            raise ValueError("MiniCPM only")
        """,
        # A path that leaves the constructor before the check.
        """
        if runner.dummy:
            return
        assert isinstance(runner.hf_config, MiniCPMHybridConfig)
        """,
        # A configuration name assigned twice is not resolved.
        """
        c = runner.model_config.hf_config
        c = runner.model
        assert isinstance(c, MiniCPMHybridConfig)
        """,
    ],
)
def test_a_constructor_check_that_may_admit_deepseek_v4_is_no_signal(check: str) -> None:
    assert codes(_backend(check)) == _EVERY_CODE


@pytest.mark.parametrize(
    "member",
    [
        # Code that runs without an instance never passed the constructor's check.
        "    @staticmethod\n    def write(pool, layer):\n        return pool.get_value_buffer(0)\n",
        "    @classmethod\n    def write(cls, pool):\n        return pool.get_value_buffer(0)\n",
        "    DEFAULT = POOL.get_value_buffer(0)\n",
    ],
)
def test_code_that_runs_without_the_constructor_is_still_checked(member: str) -> None:
    source = _backend("assert isinstance(runner.hf_config, MiniCPMHybridConfig)\n") + member
    assert codes(source) == ["KVC004", "KVC001"]


def test_code_nested_in_a_method_is_ruled_out() -> None:
    nested = (
        "    def make(self):\n"
        "        def step(loc):\n"
        "            return self.pool.get_value_buffer(0)[loc]\n"
        "        return lambda: self.pool.get_kv_buffer(0), step\n"
    )
    source = _backend("assert isinstance(runner.hf_config, MiniCPMHybridConfig)\n") + nested
    assert codes(source) == ["KVC004"]


def test_only_the_refusing_class_is_ruled_out() -> None:
    other = "\nclass Other:\n    def __init__(self, runner):\n        self.pool = runner.pool\n"
    refusing = _backend("assert isinstance(runner.hf_config, MiniCPMHybridConfig)\n")
    # Module-level code and another class of the module are generic.
    source = refusing + other + textwrap.indent(textwrap.dedent(_FAMILY_METHODS), "    ")
    source += "\ndef helper(pool):\n    return pool.get_value_buffer(0)\n"
    assert codes(source) == ["KVC004", *_EVERY_CODE, "KVC001"]


def test_a_read_of_an_mha_only_attribute_fixes_the_class() -> None:
    # TRT-LLM's native-FP4 helper: pool.native_k_scale_buffer (defined only by
    # MHATokenToKVPool) is read before pool.k_buffer, so only MHA pools get there.
    source = """
    def native_fp4(pool, layer):
        if pool.native_k_scale_buffer is None:
            raise RuntimeError("no native scales")
        return pool.k_buffer[layer], pool.v_buffer[layer]

    def only_sometimes(pool, layer, fp4):
        if fp4:
            scales = pool.native_k_scale_buffer
        return pool.k_buffer[layer]

    def another_pool(pool, other_pool, layer):
        scales = other_pool.native_k_scale_buffer
        return pool.k_buffer[layer]
    """
    assert codes(source) == ["KVC004", "KVC004"]


# -- positive class probes: a true test that names the pool's class ----------

_VEC5D_BACKEND = """
class Backend:
    def __init__(self, model_runner):
        def _is_vec5d(pool):
            if isinstance(pool, SWAKVPool):
                return getattr(pool.full_kv_pool, "kv_cache_layout", "nhd") == "vectorized_5d"
            return getattr(pool, "kv_cache_layout", "nhd") == "vectorized_5d"

        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.vec5d = _is_vec5d(model_runner.token_to_kv_pool)

    def forward(self, layer, loc, k, v):
        if self.vec5d:
            self.token_to_kv_pool.set_kv_buffer(layer, loc, k, v)
            keys = self.token_to_kv_pool.k_buffer[layer.layer_id]
        else:
            self.token_to_kv_pool.set_kv_buffer(layer, loc, k, v)
        return keys
"""


def test_a_flag_computed_from_a_class_probe_guards_its_true_branch() -> None:
    # The flag is true on an SWAKVPool (whose methods work but which has no k_buffer)
    # or on a pool with kv_cache_layout (MHA only): set_kv_buffer is safe under it,
    # k_buffer is not, and the else branch learns nothing.
    found = scan_source(textwrap.dedent(_VEC5D_BACKEND))
    assert [(f.code, f.line) for f in found] == [("KVC004", 15), ("KVC003", 17)]


@pytest.mark.parametrize(
    ("test", "expected"),
    [
        ('getattr(pool, "kv_cache_layout", "nhd") == "vectorized_5d"', []),
        ('pool.kv_cache_layout == "hnd"', []),
        ('getattr(pool, "kv_cache_layout", "nhd") == "nhd"', ["KVC003"]),  # true on a default
        ('getattr(pool, "kv_cache_layout", "nhd") != "vectorized_5d"', ["KVC003"]),
        ('getattr(pool, "page_layout", "nhd") == "vectorized_5d"', ["KVC003"]),  # not MHA-only
        ('getattr(other, "kv_cache_layout", "nhd") == "vectorized_5d"', ["KVC003"]),
        ("isinstance(pool, MHATokenToKVPool) and ready", []),
        ('pool.kv_cache_layout == "hnd" or ready', ["KVC003"]),  # ready alone: unknown
        ("ready and is_mha(pool)", []),  # a module function's truthy return
        ("is_mha_or_none(pool)", []),  # its None/False returns are never true
        ("is_anything(pool)", ["KVC003"]),
    ],
)
def test_a_probe_guards_only_its_true_branch(test: str, expected: list[str]) -> None:
    source = f"""
    def is_mha(p):
        return isinstance(p, MHATokenToKVPool)

    def is_mha_or_none(p):
        if p is None:
            return False
        if isinstance(p, MHATokenToKVPool):
            return p
        return None

    def is_anything(p):
        return p is not None

    def write(pool, other, ready, layer, loc, k, v):
        if {test}:
            pool.set_kv_buffer(layer, loc, k, v)
    """
    assert codes(source) == expected


def test_swa_pools_are_safe_for_methods_only() -> None:
    source = """
    class Backend:
        def __init__(self, runner):
            self.pool = runner.token_to_kv_pool
            self.swa = self._resolve(runner)

        @staticmethod
        def _resolve(runner):
            active = runner.token_to_kv_pool
            return active if isinstance(active, SWAKVPool) else None

        def forward(self, layer):
            if self.swa:
                return self.pool.get_kv_buffer(layer), self.pool.v_buffer[layer]
    """
    assert codes(source) == ["KVC004"]


def test_a_flag_tells_nothing_when_one_assignment_is_not_a_probe() -> None:
    source = """
    class Backend:
        def __init__(self, runner):
            self.pool = runner.token_to_kv_pool
            self.mha = runner.token_to_kv_pool.kv_cache_layout == "nhd"

        def reset(self, enabled):
            self.mha = enabled

        def forward(self, layer):
            if self.mha:
                return self.pool.get_value_buffer(layer)
    """
    assert codes(source) == ["KVC001"]


def test_a_flag_of_itself_and_deep_helpers_terminate() -> None:
    source = """
    def a(p):
        return b(p)

    def b(p):
        return a(p)

    class Backend:
        def __init__(self, runner):
            self.pool = runner.pool
            self.flag = self.flag and a(runner.pool)

        def forward(self, layer):
            if self.flag:
                return self.pool.get_value_buffer(layer)
    """
    assert codes(source) == ["KVC001"]


def test_a_probe_of_another_methods_parameter_says_nothing_about_self() -> None:
    # __init__ stores its `pool` parameter in self.pool; forward's own `pool` parameter
    # is another object, and a flag's knowledge about __init__'s `runner` does not
    # carry to forward's `runner`.
    source = """
    class Backend:
        def __init__(self, pool, runner):
            self.pool = pool
            self.mha = runner.token_to_kv_pool.kv_cache_layout == "nhd"

        def forward(self, pool, runner, layer):
            if pool.kv_cache_layout == "nhd":
                self.pool.get_value_buffer(layer)
            if self.mha:
                runner.token_to_kv_pool.get_value_buffer(layer)

    class Rebinds:
        def __init__(self, runner):
            self.mha = runner.token_to_kv_pool.kv_cache_layout == "nhd"

        def bind(self, runner):
            self.pool = runner.token_to_kv_pool  # another method's runner

        def forward(self, layer):
            if self.mha:
                self.pool.get_value_buffer(layer)

    class Swaps:
        def __init__(self, runner):
            self.pool = runner.token_to_kv_pool
            self.mha = runner.token_to_kv_pool.kv_cache_layout == "nhd"

        def swap(self, other):
            self.pool = other  # the probed pool may be replaced

        def forward(self, layer):
            if self.mha:
                self.pool.get_value_buffer(layer)
    """
    assert codes(source) == ["KVC001", "KVC001", "KVC001", "KVC001"]


def test_a_parameter_reassigned_after_the_probe_is_not_resolved_to_its_new_value() -> None:
    source = """
    def write(pool, other, layer, loc, k, v):
        if pool.kv_cache_layout == "nhd":
            other.set_kv_buffer(layer, loc, k, v)
        pool = other
    """
    assert codes(source) == ["KVC003"]


# -- KVC008 / KVC009: the buffers of kvcompat's key-first adapter ----------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # head-dim probes on the adapter's value buffer: packed page bytes on DeepSeek-V4
        ("kvcompat.adapt(pool).get_value_buffer(0).shape[-1]", ["KVC008"]),
        ("kvcompat.adapt(pool).get_value_buffer(0).size(-1)", ["KVC008"]),
        ("kvcompat.adapt(pool).get_value_buffer(0).shape[2]", ["KVC008"]),
        ("kvcompat.adapt(pool).get_kv_buffer(0)[1].shape[-1]", ["KVC008"]),
        ("a = kvcompat.adapt(pool)\nv = a.get_value_buffer(i)\nd = v.shape[-1]", ["KVC008"]),
        ("k, v = kvcompat.adapt(pool).get_kv_buffer(i)\nd = v.size(-1)", ["KVC008"]),
        ("pool.kvcompat.get_value_buffer(0).shape[-1]", ["KVC008"]),  # a proxy's adapter
        (
            "def f(a: kvcompat.KVPoolProtocol):\n    return a.get_value_buffer(0).shape[-1]",
            ["KVC008"],
        ),
        # rows of an unpacked get_kv_buffer result
        ("k, v = kvcompat.adapt(pool).get_kv_buffer(i)\nx = k[loc]", ["KVC009"]),
        ("k, v = kvcompat.adapt(pool).get_kv_buffer(i)\nx = v.index_select(0, loc)", ["KVC009"]),
        ("k, v = kvcompat.adapt(pool).get_kv_buffer(i)\nk[loc] = x", ["KVC009"]),
        ("kvcompat.adapt(pool).get_kv_buffer(i)[0][loc]", ["KVC009"]),
        ("v = kvcompat.adapt(pool).get_value_buffer(i).to(dt)\nx = v[loc]", ["KVC009"]),
        # what is fine: sizes of rows, whole-buffer use, compat views, rebinding, native
        ("kvcompat.adapt(pool).get_value_buffer(0).shape[0]", []),
        ("kvcompat.adapt(pool).get_value_buffer(0).data_ptr()", []),
        ("k, v = kvcompat.adapt(pool).get_kv_buffer(i)\nengine.register(k, v)", []),
        ("kvcompat.compat(pool).get_value_buffer(0).shape[-1]", []),
        ("k, v = kvcompat.compat(pool).get_kv_buffer(i)\nx = k[loc]", []),
        ("k, v = kvcompat.adapt(pool).get_kv_buffer(i)\nk = dense(k)\nx = k[loc]", []),
        ("k, v = pool.get_kv_buffer(i)\nx = k[loc]", ["KVC002"]),  # the native call raises
        ("k, _ = kvcompat.adapt(pool).get_kv_buffer(i)\nn = len(k)", []),
        # a guard that the pool is not single-KV protects as for the other rules
        (
            (
                "if not kvcompat.is_single_kv_pool(pool):\n"
                "    d = kvcompat.adapt(pool).get_value_buffer(0).shape[-1]"
            ),
            [],
        ),
        ("d = kvcompat.adapt(pool).get_value_buffer(0).shape[-1]  # kvcompat: ignore[KVC008]", []),
    ],
)
def test_adapter_buffers(source: str, expected: list[str]) -> None:
    assert codes(source) == expected


def test_adapter_buffer_messages_name_the_use_the_getter_and_the_pool() -> None:
    source = "def f(pool, loc):\n    a = kvcompat.adapt(pool)\n    k, v = a.get_kv_buffer(3)\n"
    source += "    return v.shape[-1], k[loc]\n"
    probe, rows = scan_source(source)
    assert (probe.line, probe.col, probe.code) == (4, 12, "KVC008")
    assert probe.message.startswith(
        "v.shape[-1] (the value buffer of a.get_kv_buffer(), line 3) — breaks on DeepSeek-V4 "
        "single-KV pools (silently)"
    )
    assert "37440" in probe.message
    assert probe.message.endswith(
        "use kvcompat.compat(a.native).get_value_buffer(layer_id).shape[-1] instead"
    )
    assert (rows.line, rows.col, rows.code) == (4, 25, "KVC009")
    assert "reads page rows" in rows.message
    assert not probe.fixable
    assert not rows.fixable


def test_the_helpers_of_an_older_fix_are_raw_adapters() -> None:
    legacy = (
        "import kvcompat\n"
        "def _kvcompat_adapter(pool):\n"
        "    return kvcompat.adapt(pool)\n"
        "def _kvcompat_get_value_buffer(pool, layer_id):\n"
        "    try:\n"
        "        return pool.get_value_buffer(layer_id)\n"
        "    except NotImplementedError:\n"
        "        return _kvcompat_adapter(pool).get_value_buffer(layer_id)\n"
        "def probe(pool):\n"
        "    return _kvcompat_get_value_buffer(pool, 0).shape[-1]\n"
    )
    [finding] = scan_source(legacy)
    assert (finding.line, finding.code) == (10, "KVC008")
    assert "older `kvcompat scan --fix`" in finding.message
    current = legacy.replace("kvcompat.adapt(pool)", "kvcompat.compat(pool)")
    assert scan_source(current) == []
