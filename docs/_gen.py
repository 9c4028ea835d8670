"""Pages generated from the library at docs build time, so they cannot drift from it."""

from __future__ import annotations

from pathlib import Path

from kvcompat.adapters import sglang


def supported_table() -> str:
    """The SGLang class table of the supported-pools page, from kvcompat's registry."""
    lines = [
        "| SGLang class | kvcompat kind | `get_key_buffer(l)` | `get_value_buffer(l)` |",
        "|---|---|---|---|",
    ]
    for family in sglang.SGLANG_CLASSES:
        module, name = family.qualname.rsplit(".", 1)
        short = module.removeprefix("sglang.srt.")
        if family.kind is None:
            reason = (family.reason or "").replace("|", "\\|")
            lines.append(f"| `{name}` ({short}) | unsupported | {reason} | |")
            continue
        if family.leaf is not None:
            key, value = family.leaf.returns
        else:
            key = "the primary component's key (see below)"
            value = "the primary component's value"
        lines.append(f"| `{name}` ({short}) | {family.kind.value} | {key} | {value} |")
    return "\n".join(lines) + "\n"


def write_generated(folder: Path) -> None:
    """Write every generated fragment under ``folder``."""
    folder.mkdir(exist_ok=True)
    target = folder / "supported_table.md"
    text = supported_table()
    if not target.exists() or target.read_text() != text:
        target.write_text(text)
