"""Generated fragment of docs/transfer.md: the packed-transfer tables, from committed JSON.

``benchmarks/bench_transfer_packed.py --json docs/_data/transfer-packed-<device>.json``
writes every figure with the machine it ran on and the command; this module turns each
such file into a table at docs build time (hooked into conf.py), so the page shows
exactly what was measured.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "_data"
POOLS = {
    "dsv4_single": "DeepSeek-V4 single",
    "dsv4_composite": "DeepSeek-V4 composite",
    "mha": "MHA",
}


def _gbps(row: dict[str, Any], key: str) -> str:
    seconds = row.get(f"{key}_s")
    return f"{row['bytes'] / seconds / 1e9:.2f}" if seconds else "-"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.0%}" if a and b else "-"


def table(data: dict[str, Any]) -> str:
    """One measured run as a markdown table with its machine, command and scale."""
    machine = data["machine"]
    cpu = machine["device"] == "cpu"
    where = (
        f"{machine['cpus']}-core CPU host (load {machine['load_average']:.1f}), "
        if cpu
        else f"{machine.get('gpu')}, "
    )
    scale = int(data.get("scale", 1))
    scaled = f", request lengths divided by {scale}" if scale > 1 else ""
    caption = (
        f"Measured {machine['date']} on a {where}torch {machine['torch']}, NIXL "
        f"{machine.get('nixl')}, two processes{scaled}; `{data['command']}`. GB/s of the "
        "request's bytes, median of the timed rounds."
    )
    lines = [
        caption,
        "",
        "| pool | tokens | MiB | descriptors (per page) | gathers | one copy | gather | scatter "
        + ("| cma, one range " if cpu else "")
        + "| per-page | packed "
        + ("" if cpu else "| direct | direct / one copy ")
        + "| per-page / one copy | packed / one copy | packed vs per-page "
        "| `auto` picks |",
        "|---|---|---|---|---|---|---|---"
        + ("|---" if cpu else "|---|---")
        + "|---|---|---|---|---|---|",
    ]
    for row in data["rows"]:
        copy = row.get("one_copy_s")
        cells = [
            POOLS.get(row["pool"], row["pool"]),
            str(row["tokens"]),
            f"{row['bytes'] / 2**20:.1f}",
            str(row["descriptors"]),
            str(row["gathers"]),
            _gbps(row, "one_copy"),
            _gbps(row, "gather"),
            _gbps(row, "scatter"),
            *([_gbps(row, "cma")] if cpu else []),
            _gbps(row, "pages"),
            _gbps(row, "packed"),
            *([] if cpu else [_gbps(row, "direct"), _ratio(copy, row.get("direct_s"))]),
            _ratio(copy, row.get("pages_s")),
            _ratio(copy, row.get("packed_s")),
            f"x{row['pages_s'] / row['packed_s']:.2f}",
            row["auto"],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_transfer_tables(folder: Path) -> None:
    """Write ``transfer_packed_<device>.md`` under ``folder`` for each JSON file there is."""
    folder.mkdir(exist_ok=True)
    for source in sorted(DATA.glob("transfer-packed-*.json")):
        device = source.stem.removeprefix("transfer-packed-")
        target = folder / f"transfer_packed_{device}.md"
        text = table(json.loads(source.read_text()))
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
