"""torch.compile(fullgraph=True) over kvcompat's reads and writes (CPU: the torch twin).

Under compilation the codec entry points call kvcompat's ``torch.library`` custom ops
(``kvcompat._ops``); these tests compile the key-first loop of issue 15 on the reference
pools and compare every returned and stored byte with the eager run.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import torch
from _pools import POOLS, as_bytes, buffers, key_first_loop, make_pool, write_args

from kvcompat import LayoutError, WriteError
from kvcompat._ops import OPS, register_layout, spec_for
from kvcompat.layouts import (
    DSA_FP8,
    V41_FP4,
    LayoutSpec,
    dequantize,
    dsa_fp8_layout,
    mha_layout,
    mla_layout,
    quantize,
)
from kvcompat.layouts._registry import LAYOUTS

pytestmark = pytest.mark.filterwarnings(
    # inductor's own import of torch.jit on CPU (torch 2.13); not kvcompat's
    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"
)


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


def _warm(pool: Any) -> None:
    for layer in pool.layer_ids:
        pool.layout(layer)  # detect layouts eagerly: Dynamo cannot build a LayoutSpec


@pytest.mark.parametrize("name", POOLS)
def test_key_first_loop_compiles_fullgraph_and_matches_eager(name: str) -> None:
    eager_pool, compiled_pool = make_pool(name), make_pool(name)
    _warm(compiled_pool)
    loc = torch.tensor([1, 2, 3, 40])
    loc2 = torch.tensor([5, 9, 7, 63])
    x, v = write_args(eager_pool, 4)
    compiled = torch.compile(key_first_loop, fullgraph=True)
    got = compiled(compiled_pool, loc, loc2, x, v)
    want = key_first_loop(eager_pool, loc, loc2, x, v)
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        assert torch.equal(as_bytes(g), as_bytes(w))
    for g, w in zip(buffers(compiled_pool), buffers(eager_pool), strict=True):
        assert torch.equal(g, w)
    # The written tokens read back through the compiled loop too (a second call, new loc).
    again = compiled(compiled_pool, loc2, loc, x, v)
    assert torch.equal(as_bytes(again[0]), as_bytes(key_first_loop(eager_pool, loc2, loc, x, v)[0]))


@pytest.mark.parametrize("spec", [V41_FP4, DSA_FP8], ids=lambda s: s.name)
def test_codec_calls_compile_for_other_layouts(spec: LayoutSpec) -> None:
    page = 4
    buf = torch.zeros(3, spec.page_bytes(spec.tokens_per_row(page)), dtype=torch.uint8)
    if not spec.paged:
        buf = torch.zeros(12, spec.bytes_per_token, dtype=torch.uint8)
    values = torch.randn(3, spec.dim).to(torch.bfloat16)
    loc = torch.tensor([5, 0, 9])

    def roundtrip(b: torch.Tensor) -> torch.Tensor:
        quantize(spec, values, b, loc, page)
        return dequantize(spec, b, loc, page)

    eager_buf, compiled_buf = buf.clone(), buf.clone()
    want = roundtrip(eager_buf)
    got = torch.compile(roundtrip, fullgraph=True)(compiled_buf)
    assert torch.equal(as_bytes(got), as_bytes(want))
    assert torch.equal(compiled_buf, eager_buf)


def test_the_graph_holds_the_ops() -> None:
    pool = make_pool("v4")
    _warm(pool)
    seen: list[str] = []

    def backend(gm: torch.fx.GraphModule, _inputs: list[torch.Tensor]) -> Any:
        seen.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    x, v = write_args(pool, 2)
    torch.compile(key_first_loop, fullgraph=True, backend=backend)(
        pool, torch.tensor([1, 2]), torch.tensor([3, 4]), x, v
    )
    # One op per read, per write check and per write; nothing else (no traced twin).
    assert seen == ["kvcompat.dequantize", "kvcompat.check_write", "kvcompat.quantize"] * 2


def test_read_into_out_compiles() -> None:
    pool = make_pool("mla")
    _warm(pool)
    loc = torch.tensor([0, 17, 5])

    def read_into(out: torch.Tensor) -> torch.Tensor:
        return pool.read(0, loc, out=out)

    out = torch.empty(3, 1, 48, dtype=torch.bfloat16)
    got = torch.compile(read_into, fullgraph=True)(out)
    assert torch.equal(as_bytes(got), as_bytes(pool.read(0, loc)))
    assert torch.equal(as_bytes(out), as_bytes(pool.read(0, loc)))


def test_validation_still_runs_inside_the_compiled_graph() -> None:
    pool = make_pool("v4")
    _warm(pool)
    before = buffers(pool)
    compiled = torch.compile(key_first_loop, fullgraph=True)
    x, v = write_args(pool, 2)
    with pytest.raises(LayoutError, match="outside"):
        compiled(pool, torch.tensor([0, 999]), torch.tensor([3, 4]), x, v)
    with pytest.raises(WriteError, match="repeats"):
        compiled(pool, torch.tensor([0, 1]), torch.tensor([3, 3]), x, v)
    with pytest.raises(WriteError, match="cannot be stored"):
        compiled(pool, torch.tensor([0, 1]), torch.tensor([3, 4]), x * torch.nan, v)
    for got, want in zip(buffers(pool), before, strict=True):
        assert torch.equal(got, want)


def test_compiled_split_write_is_all_or_nothing() -> None:
    """A bad value for the V buffer leaves the K buffer unwritten, compiled as in eager."""
    pool = make_pool("mha")
    _warm(pool)
    before = buffers(pool)
    x, v = write_args(pool, 2)
    assert v is not None

    def write(values: torch.Tensor) -> None:
        pool.write(0, torch.tensor([3, 4]), x, values)

    with pytest.raises(WriteError, match="value"):
        torch.compile(write, fullgraph=True)(v * torch.inf)
    for got, want in zip(buffers(pool), before, strict=True):
        assert torch.equal(got, want)


def _every_layout() -> list[LayoutSpec]:
    return [
        *LAYOUTS.values(),
        mha_layout(8, 128, torch.bfloat16),
        mha_layout(2, 8, torch.float8_e4m3fn),
        mha_layout(1, 64, torch.float32),
        mla_layout(512, 64, torch.bfloat16),
        mla_layout(32, 16, torch.float16),
        dsa_fp8_layout(),
        dsa_fp8_layout(256, 64),
    ]


@pytest.mark.parametrize("spec", _every_layout(), ids=lambda s: s.name)
def test_every_layout_crosses_the_op_boundary_by_name(spec: LayoutSpec) -> None:
    assert spec_for(spec.name, spec.dim, spec.output_dtype) == spec


def test_unknown_or_mismatched_layouts_are_refused() -> None:
    with pytest.raises(LayoutError, match="register_layout"):
        spec_for("mine", 8, torch.bfloat16)
    with pytest.raises(LayoutError, match="register_layout"):
        spec_for("v4", 576, torch.bfloat16)  # V4's name with a different width
    with pytest.raises(LayoutError, match="register_layout"):
        spec_for(DSA_FP8.name, DSA_FP8.dim, torch.float16)


def test_register_layout_admits_a_layout_of_ones_own() -> None:
    from dataclasses import replace

    mine = replace(mha_layout(1, 4, torch.bfloat16), name="my_rows_1x4")
    register_layout(mine)
    assert spec_for("my_rows_1x4", 4, torch.bfloat16) is mine
    with pytest.raises(LayoutError, match="already registered"):
        register_layout(replace(mine, dim=4, heads=1, error_bound="other"))

    def read(buf: torch.Tensor, loc: torch.Tensor) -> torch.Tensor:
        return dequantize(mine, buf, loc, 16)

    buf = torch.randn(8, 1, 4).to(torch.bfloat16)
    got = torch.compile(read, fullgraph=True)(buf, torch.tensor([2, 7]))
    assert torch.equal(got, buf[[2, 7]].view(2, 4))


_MHA = mha_layout(2, 8, torch.bfloat16)


@pytest.mark.parametrize(
    ("op", "args"),
    [
        ("dequantize", lambda b, i, x: (*_key(_MHA), b, i, 16, False, True, "torch")),
        ("dequantize_into", lambda b, i, x: (*_key(_MHA), b, i, 16, False, True, "torch", x)),
        ("quantize", lambda b, i, x: (*_key(_MHA), x, b, i, 16, False, True, True, "torch")),
        ("check_write", lambda b, i, x: (*_key(_MHA), b, i, x, 16, True)),
    ],
)
def test_opcheck(op: str, args: Any) -> None:
    """torch.library.opcheck: schema, fake implementation and dispatch agree with the op.

    (On a bf16 MHA layout: the schema check's mode runs the fp8 codecs' arithmetic on
    CPU kernels that do not exist for fp8.)
    """
    buf = torch.randn(64, 2, 8).to(torch.bfloat16)
    vals = torch.randn(3, 16).to(torch.bfloat16)
    torch.library.opcheck(
        getattr(torch.ops.kvcompat, op).default,
        args(buf, torch.tensor([1, 40, 3]), vals),
        test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"),
    )


def _key(spec: LayoutSpec) -> tuple[str, int, torch.dtype]:
    return spec.name, spec.dim, spec.output_dtype


def test_every_op_is_registered() -> None:
    for name in OPS:
        namespace, op = name.split("::")
        assert hasattr(getattr(torch.ops, namespace), op)


def test_registering_the_ops_imports_neither_dynamo_nor_triton() -> None:
    code = (
        "import sys, kvcompat, kvcompat.layouts, kvcompat._ops, kvcompat.kernels\n"
        "bad = [m for m in ('torch._dynamo', 'torch._inductor', 'triton') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_ops_register_with_the_codec_not_with_kvcompat() -> None:
    """``import kvcompat`` registers nothing; the codec's import does, before any trace.

    (Importing inside the traced branch made Dynamo trace the lazy package's
    ``__getattr__``, which torch 2.11 refuses under ``fullgraph``.)
    """
    code = (
        "import sys, torch\n"
        "import kvcompat\n"
        "assert 'kvcompat._ops' not in sys.modules\n"
        "from kvcompat.layouts import V4, dequantize, quantize\n"
        "assert 'kvcompat._ops' in sys.modules\n"
        "def f(b, loc, x):\n"
        "    quantize(V4, x, b, loc, 4)\n"
        "    return dequantize(V4, b, loc, 4)\n"
        "buf = torch.zeros(2, V4.page_bytes(4), dtype=torch.uint8)\n"
        "x, loc = torch.randn(2, 512).to(torch.bfloat16), torch.tensor([1, 6])\n"
        "eager = buf.clone()\n"
        "want = f(eager, loc, x)\n"
        "got = torch.compile(f, fullgraph=True)(buf, loc, x)\n"
        "assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))\n"
        "assert torch.equal(buf, eager)\n"
        "assert 'kvcompat._ops' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", "-c", code], check=True)
