"""Compile kvcompat's GPU-only kernel paths for sm_90 without a GPU (run as a script).

The inline PTX of the V41_FP4 pairs writer and the edge-sector prefetch, and the hardware
paths of the ROCm-flavour V4 kernels and of the indexer-key kernels (fp8 and fp4), never
run under the CPU interpreter, so this script
hands those kernels to Triton's own compiler for an H100/H200 target (ptxas ships with
triton) and fails if any does not assemble. It prints one line per kernel: name, SASS size
in bytes. Then, for the V4 read and write kernels on one layer, on many layers and over
several token spaces, a line ``widths <kernel> <addressing>: <access>=<count> ...`` of
their global loads and stores by width (``ld.v4.b32`` moves 16 bytes, ``st.b8`` one): a
layered launch must move as many bytes at a time as a one-layer launch.
"""

from __future__ import annotations

import re
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kvcompat.kernels import _triton as jit
from kvcompat.kernels._plan import chunk_words, read_plan, write_plan
from kvcompat.layouts import (
    DSA_FP8,
    DSV4_INDEXER_FP4,
    DSV4_INDEXER_FP4_RNE,
    DSV4_INDEXER_FP8,
    V4,
    V41_NEW,
)

GEOMETRY = ("n", "PAGE", "PAGE_BYTES", "DATA_STRIDE", "SCALE_BASE", "SCALE_STRIDE")
SEGMENT_SCALARS = tuple(f"{what}{i}" for what in ("n", "loc", "row") for i in range(4))
"""The e4m3-tile kernels' per-call numbers of a launch over several token spaces."""


def tile_pointers(first: str, dtype: str) -> dict[str, str]:
    """The pointer arguments of the tile kernels: ``first`` (values or output), pool, loc, table."""
    return {first: dtype, "buf_ptr": "*u8", "loc_ptr": "*i64", "bases_ptr": "*i64"}


def compile_sm90(
    kernel: object, pointers: dict[str, str], constants: dict[str, object], warps: int
) -> dict[str, object]:
    """The compiled kernel's assembly (``ptx``, ``cubin``, ...) for sm_90.

    ``pointers`` names the kernel's pointer arguments and their types. Pointers and the
    byte strides are passed as 16-byte multiples, as a real launch's are.
    """
    names = list(kernel.arg_names)  # type: ignore[attr-defined]
    signature = dict(pointers)
    signature.update({name: "i32" for name in GEOMETRY if name in names})
    signature.update({name: "i64" for name in SEGMENT_SCALARS if name in names})
    signature.update(dict.fromkeys(constants, "constexpr"))
    divisible = [name for name in (*pointers, *GEOMETRY[2:]) if name in names]
    aligned = {(names.index(name),): [["tt.divisibility", 16]] for name in divisible}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=aligned)
    compiled = triton.compile(
        source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}
    )
    return dict(compiled.asm)


def build(kernel: object, first: str, dtype: str, constants: dict[str, object], warps: int) -> int:
    return len(compile_sm90(kernel, tile_pointers(first, dtype), constants, warps)["cubin"])  # type: ignore[arg-type]


_ACCESS = re.compile(r"\b(ld|st)\.global((?:\.[\w:]+)+)")


def widths(ptx: str) -> dict[str, int]:
    """The global loads and stores of ``ptx`` by width: ``{"ld.v4.b32": 1, "st.b8": 2}``."""
    found: dict[str, int] = {}
    for op, suffix in _ACCESS.findall(ptx):
        parts = [p for p in suffix.split(".") if p and "::" not in p]  # no cache hints
        vector = [parts[-2]] if len(parts) > 1 and parts[-2].startswith("v") else []
        key = ".".join([op, *vector, parts[-1]])
        found[key] = found.get(key, 0) + 1
    return dict(sorted(found.items()))


def print_widths() -> None:
    """One ``widths`` line per V4 read / write kernel and addressing (see the docstring)."""
    read_v4, write_v4 = read_plan(V4, fnuz=False), write_plan(V4, torch.bfloat16, fnuz=False)
    assert not isinstance(read_v4, str)
    assert not isinstance(write_v4, str)
    plain = {"SOFT": False, "EVICT": "", "BLOCK_T": 2, "LOC_LAYERS": False}
    addressing = {
        "one-layer": {"LAYERED": False, "SEGMENTS": False},
        "layered": {"LAYERED": True, "SEGMENTS": False},
        "segments": {"LAYERED": True, "SEGMENTS": True},
    }
    for name, kernel, first, plan in (
        ("read_fp8", jit._read_fp8_kernel, "out_ptr", read_v4),
        ("write_fp8", jit._write_fp8_kernel, "values_ptr", write_v4),
    ):
        for how, flags in addressing.items():
            constants = {**plan.constants, **plain, **flags}
            ptx = compile_sm90(kernel, tile_pointers(first, "*bf16"), constants, warps=2)["ptx"]
            counts = " ".join(f"{k}={v}" for k, v in widths(str(ptx)).items())
            print(f"widths {name} {how}: {counts}")
    # Plain rows (MHA / MLA reads, a transfer's pack step): 512-byte rows in 8-byte words.
    words = 512 // 8
    block, tail = chunk_words(words)
    rows = {"ROW_WORDS": words, "WORD": 8, "GATHER": True, "BLOCK_C": block, "TAIL_C": tail,
            "EVICT": "", "BLOCK_T": 4, "LOC_LAYERS": False, "BASE_ALIGN": 16}  # fmt: skip
    pointers = {"src_ptr": "*u8", "dst_ptr": "*u8", "loc_ptr": "*i64", "bases_ptr": "*i64"}
    for how, layered in (("one-layer", False), ("layered", True)):
        constants = {**rows, "LAYERED": layered}
        asm = compile_sm90(jit._copy_rows_kernel, pointers, constants, warps=4)
        counts = " ".join(f"{k}={v}" for k, v in widths(str(asm["ptx"])).items())
        print(f"widths gather_rows {how}: {counts}")


def main() -> int:
    common = {"SOFT": False, "EVICT": "", "BLOCK_T": 4, "LAYERED": True, "LOC_LAYERS": True}
    one_space = {**common, "SEGMENTS": False}
    cases = [
        ("write_fp4_pairs bf16", jit._write_fp4_pairs_kernel, "values_ptr", "*bf16",
         {"IN_KIND": 0, **common}),
        ("write_fp4_pairs fp16", jit._write_fp4_pairs_kernel, "values_ptr", "*fp16",
         {"IN_KIND": 1, **common}),
    ]  # fmt: skip
    for spec, fnuz in (
        (V41_NEW, False), (DSA_FP8, False), (V4, False), (V4, True), (DSV4_INDEXER_FP8, False)
    ):  # fmt: skip
        plan = write_plan(spec, torch.bfloat16, fnuz=fnuz)
        assert not isinstance(plan, str)
        name = f"write_fp8 {spec.name} MODE={plan.constants['MODE']} SPAN={plan.constants['SPAN']}"
        cases.append((name, jit._write_fp8_kernel, "values_ptr", "*bf16",
                      {**plan.constants, **one_space}))  # fmt: skip
    for fnuz in (False, True):
        plan = read_plan(V4, fnuz=fnuz)
        assert not isinstance(plan, str)
        cases.append((f"read_fp8 v4 FNUZ={fnuz}", jit._read_fp8_kernel, "out_ptr", "*bf16",
                      {**plan.constants, **one_space}))  # fmt: skip
    plan = read_plan(DSV4_INDEXER_FP8, fnuz=False)
    assert not isinstance(plan, str)
    cases.append(("read_fp8 dsv4_indexer_fp8 OUT_F32", jit._read_fp8_kernel, "out_ptr", "*fp32",
                  {**plan.constants, **one_space}))  # fmt: skip
    # One launch over several token spaces (a DeepSeek-V4 composite's parts): V4 both ways.
    spaces = {**common, "LOC_LAYERS": False, "SEGMENTS": True}
    read_v4, write_v4 = read_plan(V4, fnuz=False), write_plan(V4, torch.bfloat16, fnuz=False)
    assert not isinstance(read_v4, str)
    assert not isinstance(write_v4, str)
    cases.append(("read_fp8 v4 SEGMENTS", jit._read_fp8_kernel, "out_ptr", "*bf16",
                  {**read_v4.constants, **spaces}))  # fmt: skip
    cases.append(("write_fp8 v4 SEGMENTS", jit._write_fp8_kernel, "values_ptr", "*bf16",
                  {**write_v4.constants, **spaces}))  # fmt: skip
    plan = read_plan(DSV4_INDEXER_FP4, fnuz=False)
    assert not isinstance(plan, str)
    cases.append(("read_fp4 dsv4_indexer_fp4", jit._read_fp4_kernel, "out_ptr", "*bf16",
                  {**plan.constants, **common}))  # fmt: skip
    for spec, dtype, pointer in (
        (DSV4_INDEXER_FP4, torch.bfloat16, "*bf16"),
        (DSV4_INDEXER_FP4_RNE, torch.float16, "*fp16"),
        (DSV4_INDEXER_FP4, torch.float32, "*fp32"),
    ):
        plan = write_plan(spec, dtype, fnuz=False)
        assert not isinstance(plan, str)
        cases.append((f"write_fp4_ue8m0 {spec.name} {pointer}", jit._write_fp4_ue8m0_kernel,
                      "values_ptr", pointer, {**plan.constants, **common}))  # fmt: skip
    for name, kernel, first, dtype, constants in cases:
        size = build(kernel, first, dtype, constants, warps=2)
        print(f"{name}: {size} bytes of sm_90 code")
    print_widths()
    return 0


if __name__ == "__main__":
    sys.exit(main())
