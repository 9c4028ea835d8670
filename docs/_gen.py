"""Pages generated from the library at docs build time, so they cannot drift from it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from kvcompat.adapters import sglang


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _class_cell(qualname: str) -> str:
    module, name = qualname.rsplit(".", 1)
    return f"`{name}` ({module.removeprefix('sglang.srt.')})"


def supported_table() -> str:
    """Every SGLang class kvcompat knows, from its registry: what the supported ones return,
    then (under its own heading) why the others are refused, in their own column.

    ``{.kv-pools}`` and ``{.kv-refused}`` give the tables the classes the docs' stylesheet
    uses to keep every column on screen (code wraps at 1280 px; one card per class on a
    phone).
    """
    lines = [
        "{.kv-pools}",
        "| SGLang class | kvcompat kind | `get_key_buffer(l)` | `get_value_buffer(l)` |",
        "|---|---|---|---|",
    ]
    for family in sglang.SGLANG_CLASSES:
        if family.kind is None:
            continue
        if family.leaf is not None:
            key, value = family.leaf.returns
        else:
            key = "the primary component's key (see [Composites](#composites))"
            value = "the primary component's value"
        row = [_class_cell(family.qualname), family.kind.value, _cell(key), _cell(value)]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n\n" + REFUSED_INTRO + refused_table()


REFUSED_INTRO = """## Recognised and refused

These classes are recognised by name, and `kvcompat.adapt()` refuses them with
`UnsupportedPoolError`, saying why, rather than half-working:

"""


def refused_table() -> str:
    """The SGLang classes kvcompat recognises and refuses, each with the reason."""
    lines = [
        "{.kv-refused}",
        "| SGLang class | why `adapt()` refuses it |",
        "|---|---|",
    ]
    lines += [
        f"| {_class_cell(family.qualname)} | {_cell(family.reason or '')} |"
        for family in sglang.SGLANG_CLASSES
        if family.kind is None
    ]
    return "\n".join(lines) + "\n"


def _strided_cell(row: dict[str, object]) -> str:
    ratio = row.get("strided_vs_contiguous")
    if not isinstance(ratio, float):
        return "(the contiguous baseline) |"
    return f"strided / contiguous speed {100 * ratio:.1f} % |"


def _share_cell(row: dict[str, Any]) -> str:
    share = row.get("share_of_copy")
    if share is None:  # one-layer eager calls: compared with torch's op in the same table
        return "(one layer, eager) |"
    if math.isnan(share):  # no copy measured (the strided rows)
        return _strided_cell(row)
    return f"{100 * share:.1f} % |"


def layers_gpu_table(data: Path, name: str = "layers-gpu.json") -> str:
    """The multi-layer benchmark's figures, from the committed JSON (or what is owed)."""
    source = data / name
    if not source.exists():
        return (
            f"No GPU figures are committed yet: `{name}` under `docs/_data/` is written by "
            "the command above on a CUDA device.\n"
        )
    found = json.loads(source.read_text())
    machine = found["machine"]
    header = (
        f"{machine['gpu']}, driver {machine['driver']}, torch {machine['torch']}, "
        f"triton {machine['triton']}; `{found['command']}`."
    )
    lines = [
        header,
        "",
        "| pool | layers x tokens | op | implementation | timing | us | GB/s | share of copy |",
        "|---|---|---|---|---|---:|---:|---:|",
    ]
    lines.extend(
        f"| {row['pool']} | {row['layers']} x {row['tokens']} | {row['op']} | "
        f"{row['impl']} | {row['time']} | {row['us']:.1f} | {row['GBps']:.1f} | " + _share_cell(row)
        for row in found["rows"]
    )
    return "\n".join(lines) + "\n"


def vllm_matrix_table(data: Path) -> str:
    """Each vLLM case's outcome per release, from the tier's committed JSON."""
    records = [
        json.loads(path.read_text()) for path in sorted((data / "vllm-matrix").glob("*.json"))
    ]
    if not records:
        return "No vLLM tier results are committed yet (`make vllm` writes them).\n"
    releases = [record["release"] for record in records]
    cases = sorted({case for record in records for case in record.get("cases", {})})
    words = {"passed": "passed", "failed": "**failed**", "skipped": "not in this release"}
    lines = [
        "| case | " + " | ".join(f"vLLM {release}" for release in releases) + " |",
        "|---|" + "---|" * len(releases),
    ]
    for case in cases:
        served = "@" in case
        what = f"`{case}` (served)" if served else f"`{case}` (refused with its name)"
        cells = [words[record.get("cases", {}).get(case, "skipped")] for record in records]
        if not served:
            cells = ["refused, as tested" if cell == "passed" else cell for cell in cells]
        lines.append(f"| {what} | " + " | ".join(cells) + " |")
    totals = [
        f"{record['release']}: {record['passed']} passed, {record['skipped']} skipped, "
        f"{record['failures'] + record['errors']} failed"
        for record in records
    ]
    return "\n".join(lines) + "\n\nTotals: " + "; ".join(totals) + ".\n"


def host_cost_table(data: Path) -> str:
    """``bench_host_cost.py``'s per-call figures and targets, from the committed JSON."""
    source = data / "host-cost-cpu.json"
    if not source.exists():
        return "No host-cost figures are committed yet (`docs/_data/host-cost-cpu.json`).\n"
    found = json.loads(source.read_text())
    setting = (
        f"torch {found['torch']}, Python {found['python']}, {found['machine']}, "
        f"{found['threads']} thread; {found['tokens']} tokens, best of {found['batches']} "
        f"batches of {found['calls']} calls."
    )
    lines = [
        setting,
        "",
        "| pool | op | variant | µs a call | torch op µs | ratio | target µs | met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines.extend(
        f"| {row['pool']} | {row['op']} | `{row['variant']}` | {row['us']:.1f} | "
        f"{row['torch_us']:.1f} | {row['ratio']:.1f} | {row['target_us']:.1f} | "
        f"{'yes' if row['met'] else '**no**'} |"
        for row in found["rows"]
    )
    return "\n".join(lines) + "\n"


def write_generated(folder: Path) -> None:
    """Write every generated fragment under ``folder``."""
    folder.mkdir(exist_ok=True)
    data = folder.parent / "_data"
    for name, text in (
        ("supported_table.md", supported_table()),
        ("layers-gpu.md", layers_gpu_table(data)),
        ("layers-strided-gpu.md", layers_gpu_table(data, "layers-strided-gpu.json")),
        ("layers-components-gpu.md", layers_gpu_table(data, "layers-components-gpu.json")),
        ("vllm-matrix.md", vllm_matrix_table(data)),
        ("host-cost-cpu.md", host_cost_table(data)),
    ):
        target = folder / name
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
