"""Bad layer ids, locations, values and ``impl=``: the documented error, 0 bytes changed.

Each bad argument goes to ``write`` (and, where it applies, ``read`` and the getters) of
every target of every pool case. The error must be the documented kvcompat class *and* the
built-in a caller already catches, and every storage reachable from the pool, the adapter
and the arguments must hash as before. Hypothesis then places NaN, inf and just-too-large
values at random positions of random writes, and checks the converse: whatever the
overflow check accepts reads back finite.

``kvcompat inspect`` gets the same treatment: every bad ``--sglang`` name, module,
factory, argument or built object exits 2 with one line that says what was received
and ends with a ``Hint:``, and prints nothing to stdout.
"""

from __future__ import annotations

import io
import math
import sys
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kvcompat
from kvcompat.inspection._cli import run_inspect
from kvcompat.layouts import dequantize, quantize
from kvcompat.layouts._validate import value_limits

from ._harness import (
    ALL_CASES,
    LAYOUTS,
    REFERENCE_CASES,
    Case,
    Write,
    assert_unchanged,
    fingerprint,
    tried,
    valid_write,
)

E = kvcompat


def _nested(*pieces: list[int], dtype: torch.dtype = torch.int64) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "nested tensors are in prototype stage"
        return torch.nested.nested_tensor([torch.tensor(p, dtype=dtype) for p in pieces])


def _expect(
    error: type[BaseException], builtin: type[BaseException], call: Callable[[], Any]
) -> None:
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, kvcompat.KVCompatError), type(info.value)
    assert isinstance(info.value, builtin), type(info.value).__mro__
    assert "\n" in str(info.value) or "Hint" in str(info.value) or "received" in str(info.value)


def bad_layer_ids(pool: kvcompat.KVPoolProtocol) -> list[tuple[str, Any, type, type]]:
    top = max(pool.layer_ids)
    return [
        ("negative", -1, E.LayerOutOfRangeError, IndexError),
        ("past-the-end", top + 1, E.LayerOutOfRangeError, IndexError),
        ("huge", 2**70, E.LayerOutOfRangeError, IndexError),
        ("float", float(pool.layer_ids[0]), E.LayerIdTypeError, TypeError),
        ("bool", True, E.LayerIdTypeError, TypeError),
        ("str", "0", E.LayerIdTypeError, TypeError),
        ("none", None, E.LayerIdTypeError, TypeError),
        ("tensor", torch.tensor(pool.layer_ids[0]), E.LayerIdTypeError, TypeError),
    ]


def bad_locs(write: Write, capacity: int) -> list[tuple[str, Any]]:
    n = write.loc.numel()
    good = write.loc
    return [
        ("float", good.float()),
        ("bool", torch.ones(n, dtype=torch.bool)),
        ("list", good.tolist()),
        ("none", None),
        ("2-d", good.view(1, n)),
        ("0-d", good[0]),
        ("negative", torch.cat((good[:-1], torch.tensor([-1])))),
        ("past-the-end", torch.cat((good[:-1], torch.tensor([capacity])))),
        ("huge", torch.cat((good[:-1], torch.tensor([2**62])))),
        ("duplicate", torch.cat((good[:-1], good[:1]))),
        ("meta", good.to("meta")),
        ("sparse", good.to_sparse()),
        ("nested", _nested(good[:2].tolist(), good[2:].tolist())),
        ("short", good[:-1]),
    ]


def _fp4(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)


def bad_values(values: torch.Tensor, spec: Any) -> list[tuple[str, Any]]:
    n = values.shape[0]
    out: list[tuple[str, Any]] = [
        ("list", values.tolist()),
        ("wrong-width", values.reshape(n, -1)[:, :-1]),
        ("wrong-count", values[:-1]),
        ("int32", values.to(torch.int32)),
        ("complex", values.float().to(torch.complex64)),
        ("float4_e2m1fn_x2", _fp4(tuple(values.shape))),
        ("float8_e8m0fnu", values.float().abs().to(torch.float8_e8m0fnu)),
        ("sparse", values.float().to_sparse()),
        ("meta", values.to("meta")),
    ]
    for kind, bad in (("nan", math.nan), ("inf", math.inf), ("-inf", -math.inf)):
        poisoned = values.clone().reshape(n, -1)
        poisoned[n - 1, -1] = bad
        out.append((kind, poisoned.view_as(values)))
    for name, lo, _, limit, _ in value_limits(spec):
        for dtype in (torch.float32, torch.float64):
            big = values.to(dtype).reshape(n, -1).clone()
            over = limit * 1.01 if limit < 3.3e38 else (3.4e38 if dtype == torch.float32 else 1e39)
            if over <= limit or not math.isfinite(torch.tensor(over, dtype=dtype).item()):
                continue
            big[0, lo] = -over
            out.append((f"{name}-overflow-{dtype}".replace("torch.", ""), big.view(values.shape)))
    return out


CASE_PARAMS = [c.param for c in ALL_CASES]


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_bad_arguments_raise_the_documented_error_and_change_nothing(case: Case) -> None:
    native = case.build()
    pool = kvcompat.adapt(native)
    for index, (part, layer) in enumerate(case.targets(pool)):
        _attack_target(case.id, native, pool, part, layer, index)


def _attack_target(case_id: str, native: Any, pool: Any, part: Any, layer: int, index: int) -> None:
    write = valid_write(part, layer, seed=index)
    spec = part.layout(layer)
    capacity = part.get_key_buffer(layer, wait=False).shape[0] * spec.key.tokens_per_row(
        part.page_size
    )
    roots = (native, pool, write)
    before = fingerprint(*roots)
    what = f"{case_id} L{layer}"

    def check(label: str, error: type, builtin: type, call: Callable[[], Any]) -> None:
        _expect(error, builtin, call)
        assert_unchanged(before, fingerprint(*roots), f"{what}: {label}")
        tried("bad input")

    for label, bad, error, builtin in bad_layer_ids(part):
        check(
            f"layer {label}",
            error,
            builtin,
            lambda b=bad: part.write(b, write.loc, write.key, write.value),
        )
        check(f"get layer {label}", error, builtin, lambda b=bad: part.get_key_buffer(b))
        check(f"read layer {label}", error, builtin, lambda b=bad: part.read(b, write.loc))
    for label, bad in bad_locs(write, capacity):
        check(
            f"loc {label}",
            E.WriteError,
            ValueError,
            lambda b=bad: part.write(layer, b, write.key, write.value),
        )
        if label not in ("duplicate", "short"):  # reads may repeat and take any count
            check(
                f"read loc {label}",
                E.LayoutError,
                ValueError,
                lambda b=bad: part.read(layer, b),
            )
    for label, bad in bad_values(write.key, spec.key):
        check(
            f"key {label}",
            E.WriteError,
            ValueError,
            lambda b=bad: part.write(layer, write.loc, b, write.value),
        )
    if write.value is not None and spec.value is not None:
        # The value is checked before the key is stored (the issue's half write).
        for label, bad in bad_values(write.value, spec.value):
            check(
                f"value {label}",
                E.WriteError,
                ValueError,
                lambda b=bad: part.write(layer, write.loc, write.key, b),
            )
        check(
            "value missing",
            E.WriteError,
            ValueError,
            lambda: part.write(layer, write.loc, write.key),
        )
    elif part.kind is not kvcompat.PoolKind.KEY_ONLY:
        check(
            "separate value",
            E.WriteError,
            ValueError,
            lambda: part.write(layer, write.loc, write.key, write.key.clone()),
        )
    for impl in ("cuda", "TRITON", None, 1, ["torch"]):
        check(
            f"impl {impl!r}",
            E.ImplError,
            ValueError,
            lambda i=impl: part.write(layer, write.loc, write.key, write.value, impl=i),
        )
        check(
            f"read impl {impl!r}",
            E.ImplError,
            ValueError,
            lambda i=impl: part.read(layer, write.loc, impl=i),
        )
    from kvcompat.kernels import _launch

    if not _launch.INTERPRETED:
        check(
            "impl triton on cpu",
            E.KernelUnavailableError,
            RuntimeError,
            lambda: part.write(layer, write.loc, write.key, write.value, impl="triton"),
        )
        check(
            "read impl triton on cpu",
            E.KernelUnavailableError,
            NotImplementedError,
            lambda: part.read(layer, write.loc, impl="triton"),
        )
    # And the good write still works afterwards.
    write()


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_bare_layout_writes_reject_bad_values_and_change_nothing(name: str) -> None:
    spec = LAYOUTS[name]
    per_row = spec.tokens_per_row(4)
    buf = torch.randint(0, 256, (4, spec.page_bytes(per_row)), dtype=torch.uint8)
    loc = torch.tensor([0, 3, 2])
    values = torch.randn(3, spec.dim)
    before = fingerprint(buf, loc, values)
    for label, bad in bad_values(values, spec):
        _expect(E.WriteError, ValueError, lambda b=bad: quantize(spec, b, buf, loc, 4))
        assert_unchanged(before, fingerprint(buf, loc, values), f"{name}: {label}")
        tried("bad input")


MAGNITUDES = [
    0.0,
    1e-30,
    1.0,
    448.0,
    449.0,
    2688.0,
    2700.0,
    6.0e4,
    7.0e4,
    1e38,
    3.19e38,
    3.3e38,
    3.39e38,
]


@settings(max_examples=60)
@given(
    name=st.sampled_from(sorted(LAYOUTS)),
    row=st.integers(0, 3),
    column=st.integers(0, 10_000),
    magnitude=st.sampled_from([*MAGNITUDES, math.inf, math.nan]),
    negative=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
)
def test_overflow_check_rejects_what_would_not_read_back(
    name: str, row: int, column: int, magnitude: float, negative: bool, dtype: torch.dtype
) -> None:
    spec = LAYOUTS[name]
    column %= spec.dim
    per_row = spec.tokens_per_row(4)
    buf = torch.randint(0, 256, (2, spec.page_bytes(per_row)), dtype=torch.uint8)
    loc = torch.tensor([0, 1, 2, 3]) % (2 * per_row)
    loc = torch.unique(loc)
    values = torch.randn(loc.numel(), spec.dim, dtype=torch.float64)
    row %= loc.numel()
    values[row, column] = -magnitude if negative else magnitude
    values = values.to(dtype)
    stored = float(values[row, column].double())
    limit = next(run[3] for run in value_limits(spec) if run[1] <= column < run[2])
    before = fingerprint(buf)
    if math.isfinite(stored) and abs(stored) <= limit:
        quantize(spec, values, buf, loc, 4)
        back = dequantize(spec, buf, loc, 4).float()
        assert bool(torch.isfinite(back).all()), f"{name}: accepted {stored} read back non-finite"
    else:
        with pytest.raises(E.WriteError, match="cannot be stored"):
            quantize(spec, values, buf, loc, 4)
        assert_unchanged(before, fingerprint(buf), f"{name}: {stored} at column {column}")
        tried("bad input")


def test_fp4_and_rope_overflow_cases_from_the_issue() -> None:
    """V41_FP4 must not silently clamp 1e5 to 2688; a bf16 rope tail must not become inf."""
    v41_fp4 = LAYOUTS["v41_fp4"]
    buf = torch.zeros(1, v41_fp4.page_bytes(4), dtype=torch.uint8)
    with pytest.raises(E.WriteError, match="2688"):
        quantize(v41_fp4, torch.full((1, 512), 1e5), buf, torch.tensor([0]), 4)
    quantize(v41_fp4, torch.full((1, 512), 1e5), buf, torch.tensor([0]), 4, check_finite=False)
    assert float(dequantize(v41_fp4, buf, torch.tensor([0]), 4)[0, 0]) == 2688.0  # documented
    for spec, rope_at in ((LAYOUTS["v4"], 448), (LAYOUTS["dsa_fp8"], 512)):
        buf = torch.zeros(2, spec.page_bytes(spec.tokens_per_row(4)), dtype=torch.uint8)
        for big in (torch.tensor(3.4e38), torch.tensor(1e39, dtype=torch.float64)):
            values = torch.ones(1, spec.dim, dtype=big.dtype)
            values[0, rope_at] = big
            with pytest.raises(E.WriteError, match="rope"):
                quantize(spec, values, buf, torch.tensor([1]), 4)
        tried("bad input", 4)


@pytest.mark.parametrize("case", [c.param for c in REFERENCE_CASES])
def test_check_finite_false_and_validate_false_do_not_sync(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finite check is one host read; check_finite=False makes none, validate=False none."""
    pool = kvcompat.adapt(case.build())
    part, layer = case.targets(pool)[0]
    write = valid_write(part, layer)
    reads: list[str] = []
    for method in ("__bool__", "item", "tolist", "__int__", "__float__"):
        original = getattr(torch.Tensor, method)

        def spy(
            self: torch.Tensor, *args: Any, _name: str = method, _original: Any = original
        ) -> Any:
            reads.append(_name)
            return _original(self, *args)

        monkeypatch.setattr(torch.Tensor, method, spy)
    write(check_finite=True)
    checked = len(reads)
    reads.clear()
    write(check_finite=False)
    assert len(reads) == checked - (2 if write.value is not None else 1), reads
    reads.clear()
    write(check_finite=False, validate=False)
    assert reads == []


@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize("case", [c.param for c in REFERENCE_CASES])
def test_values_that_require_grad_do_not_pull_the_pool_into_a_graph(
    case: Case, validate: bool
) -> None:
    pool = kvcompat.adapt(case.build())
    part, layer = case.targets(pool)[0]
    write = valid_write(part, layer)
    write.key = write.key.float().requires_grad_()
    if write.value is not None:
        write.value = write.value.float().requires_grad_()
    write(validate=validate)
    for tensor in (
        part.get_key_buffer(layer),
        *([part.get_value_buffer(layer)] * part.kind.has_values),
    ):
        assert not tensor.requires_grad
        assert tensor.grad_fn is None
    tried("bad input")


# -- kvcompat inspect: every bad input is one line, exit 2 -------------------------------------

_USER_MODULE = "kvc_adv_inspect_pools"
_USER_SOURCES = {
    _USER_MODULE: """
import abc
import collections

from kvcompat.testing import ReferenceMHATokenToKVPool


def ordered(**kwargs):
    return collections.OrderedDict(kwargs)


def raises(**kwargs):
    raise RuntimeError("the factory failed")


def exits(**kwargs):
    raise SystemExit(3)


def positional(x, /):
    return x


def reference(size=16, layer_num=2, **_):
    return ReferenceMHATokenToKVPool(size, 16, layer_num=layer_num)


def half_built(**_):  # a pool caught before its constructor returned
    pool = ReferenceMHATokenToKVPool(16, 16, layer_num=2)
    del pool.dtype
    return pool


class NeedsArgs:
    def __init__(self, head_num, head_dim):
        pass


class Abstract(abc.ABC):
    @abc.abstractmethod
    def run(self):
        pass


NOT_CALLABLE = 3
""",
    f"{_USER_MODULE}_broken": 'raise RuntimeError("fails at import")\n',
    f"{_USER_MODULE}_syntax": "def f(:\n",
    f"{_USER_MODULE}_dep": "import kvcompat_no_such_dependency\n",
}

M = _USER_MODULE
# (id, run_inspect keyword arguments, what the one line must say besides "Hint:")
INSPECT_BAD_INPUTS: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("relative-colon", {"sglang_class": f".{M}:ordered"}, ("is a relative module path",)),
    ("relative-dots", {"sglang_class": "..pools.Pool"}, ("'..pools.Pool' is a relative",)),
    ("empty", {"sglang_class": ""}, ("--sglang '': names no class",)),
    ("no-name", {"sglang_class": f"{M}:"}, (f"--sglang '{M}:': names no class",)),
    ("bad-module-path", {"sglang_class": "a-b.Pool"}, ("'a-b' is not a module path",)),
    ("bad-name", {"sglang_class": f"{M}:1x"}, ("'1x' is not a name",)),
    ("not-a-pool", {"sglang_class": f"{M}:ordered"}, ("built a collections.OrderedDict (",)),
    ("builtin-int", {"sglang_class": "builtins.int"}, ("built a builtins.int (0)",)),
    ("class-not-pool", {"sglang_class": "collections.OrderedDict"}, ("OrderedDict())",)),
    ("half-built", {"sglang_class": f"{M}:half_built"}, ("has no attribute 'dtype'",)),
    (
        "factory-raises",
        {"sglang_class": f"{M}:raises"},
        (f"{M}:raises(device='cpu', enable_memory_saver=False) raised RuntimeError: the fac",),
    ),
    ("factory-exits", {"sglang_class": f"{M}:exits"}, ("raised SystemExit: 3",)),
    ("import-raises", {"sglang_class": f"{M}_broken:X"}, ("RuntimeError: fails at import",)),
    ("import-syntax", {"sglang_class": f"{M}_syntax:X"}, (f"importing {M}_syntax failed: Syn",)),
    (
        "import-dependency",
        {"sglang_class": f"{M}_dep:X"},
        ("No module named 'kvcompat_no_such_dependency'",),
    ),
    (
        "no-module",
        {"sglang_class": "kvcompat_no_such_module.Pool"},
        ("no module 'kvcompat_no_such_module'", "PYTHONPATH"),
    ),
    ("no-attribute", {"sglang_class": f"{M}.Nothing"}, (f"no class or factory 'Nothing' in {M}",)),
    ("not-callable", {"sglang_class": f"{M}.NOT_CALLABLE"}, ("is a builtins.int (3), not a",)),
    ("a-module", {"sglang_class": "os.path"}, ("os.path is a builtins.module",)),
    ("abstract", {"sglang_class": f"{M}.Abstract"}, (f"{M}.Abstract is an abstract class",)),
    ("positional-only", {"sglang_class": f"{M}:positional"}, ("positional-only arguments (x)",)),
    (
        "missing-args",
        {"sglang_class": f"{M}.NeedsArgs"},
        ("needs head_num, head_dim, which were not given", "e.g. head_num=... head_dim=..."),
    ),
    (
        "unknown-kwarg",
        {"sglang_class": f"{M}.NeedsArgs", "pool_args": ["head_num=2", "head_dim=8", "bogus=1"]},
        ("takes no argument bogus", "its parameters: head_num, head_dim"),
    ),
    (
        "misspelt-kwarg",
        {"sglang_class": f"{M}.NeedsArgs", "pool_args": ["head-num=2", "head_dim=8"]},
        ("head-num (did you mean head_num?)",),
    ),
    ("no-equals", {"sglang_class": f"{M}:reference", "pool_args": ["size"]}, ("got 'size'",)),
    ("no-key", {"sglang_class": f"{M}:reference", "pool_args": ["=3"]}, ("got '=3'",)),
    (
        "twice",
        {"sglang_class": f"{M}:reference", "pool_args": ["size=1", "size=2"]},
        ("size is given twice (1 and 2)",),
    ),
    ("args-without-sglang", {"pool_args": ["size=3"]}, ("KEY=VALUE arguments (size=3)",)),
    ("unknown-source", {"source": "live"}, ("unknown source 'live'",)),
    (
        "source-and-sglang",
        {"source": "live", "sglang_class": f"{M}:reference"},
        ("--source 'live' and --sglang",),
    ),
]
_MHA_ARGS = ["size=64", "page_size=16", "dtype=bfloat16", "head_num=2", "head_dim=8", "layer_num=2"]
SGLANG_INSPECT_BAD_INPUTS: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    (
        "recognised-unsupported",
        {
            "sglang_class": "NoOpMHATokenToKVPool",
            "pool_args": _MHA_ARGS,
        },
        ("built a sglang.srt.mem_cache.memory_pool.NoOpMHATokenToKVPool,", "does not support"),
    ),
    ("misspelt-class", {"sglang_class": "MHATokenToKvPool"}, ("did you mean MHATokenToKVPool",)),
    (
        "sglang-missing-args",
        {"sglang_class": "MHATokenToKVPool", "pool_args": ["size=64"]},
        ("needs page_size, dtype, head_num, head_dim, layer_num",),
    ),
    ("sglang-abstract", {"sglang_class": "KVCache"}, ("KVCache is an abstract class",)),
    (
        "sglang-no-class",
        {"sglang_class": "sglang.srt.mem_cache.memory_pool.NoSuchPool"},
        ("no pool class 'NoSuchPool' in sglang.srt.mem_cache.memory_pool",),
    ),
]


@pytest.fixture
def user_modules(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, source in _USER_SOURCES.items():
        (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in _USER_SOURCES:
        sys.modules.pop(name, None)


def _assert_one_line_error(kwargs: dict[str, Any], says: tuple[str, ...]) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert run_inspect(out, err=err, **kwargs) == 2
    assert out.getvalue() == ""  # nothing half-printed before the error
    line = err.getvalue()
    assert line.count("\n") == 1, line
    assert line.startswith("kvcompat inspect: error: "), line
    assert "Traceback" not in line
    assert "Hint: " in line, line
    for text in says:
        assert text in line, (text, line)
    tried("bad input")


@pytest.mark.parametrize(
    ("kwargs", "says"), [pytest.param(k, s, id=i) for i, k, s in INSPECT_BAD_INPUTS]
)
@pytest.mark.usefixtures("user_modules")
def test_inspect_bad_inputs_are_one_line_with_what_was_received_and_a_hint(
    kwargs: dict[str, Any], says: tuple[str, ...]
) -> None:
    _assert_one_line_error(kwargs, says)


@pytest.mark.sglang
@pytest.mark.parametrize(
    ("kwargs", "says"), [pytest.param(k, s, id=i) for i, k, s in SGLANG_INSPECT_BAD_INPUTS]
)
def test_inspect_bad_sglang_inputs_are_one_line_with_a_hint(
    kwargs: dict[str, Any], says: tuple[str, ...]
) -> None:
    from _sglang.env import prepare_sglang

    prepare_sglang()
    _assert_one_line_error(kwargs, says)


@pytest.mark.usefixtures("user_modules")
def test_inspect_builds_a_pool_from_a_factory_path() -> None:
    out = io.StringIO()
    assert run_inspect(out, sglang_class=f"{M}:reference", pool_args=["layer_num=3"]) == 0
    assert "k_buffer[2]" in out.getvalue()
