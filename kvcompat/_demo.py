"""``kvcompat demo``: the main job on an embedded default, with nothing to install but torch.

It builds the reference MHA, MLA and DeepSeek-V4 single-KV pools, shows the
native interface failing on the DeepSeek-V4 pool, then runs one generic
key-first loop, written once, over all three through kvcompat. Every line it
prints is computed from the pools at run time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TextIO

import torch

import kvcompat
from kvcompat.testing import (
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
    ReferenceMLATokenToKVPool,
)

__all__ = ["build_demo_pools", "run_demo"]


def build_demo_pools(device: str = "cpu") -> dict[str, Any]:
    """The three reference pools the demo uses, by display name.

    Example:
        >>> from kvcompat._demo import build_demo_pools
        >>> sorted(build_demo_pools())
        ['DeepSeek-V4 single-KV', 'MHA', 'MLA']
    """
    return {
        "MHA": ReferenceMHATokenToKVPool(
            size=256,
            page_size=16,
            dtype=torch.bfloat16,
            head_num=8,
            head_dim=64,
            layer_num=2,
            device=device,
        ),
        "MLA": ReferenceMLATokenToKVPool(
            size=256,
            page_size=16,
            dtype=torch.bfloat16,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            layer_num=2,
            device=device,
        ),
        "DeepSeek-V4 single-KV": ReferenceDeepSeekV4SingleKVPool(
            size=256,
            page_size=64,
            dtype=torch.float8_e4m3fn,
            layer_num=2,
            device=device,
        ),
    }


def _outcome(call: Callable[[], object]) -> str:
    try:
        result = call()
    except NotImplementedError as exc:
        detail = str(exc)
        return (
            f"raises NotImplementedError({detail!r})" if detail else "raises NotImplementedError()"
        )
    if isinstance(result, tuple):
        return "returns a " + ", ".join(_tensor(t) for t in result) + " pair"
    return "returns " + _tensor(result)


def _tensor(tensor: object) -> str:
    if not isinstance(tensor, torch.Tensor):
        return type(tensor).__name__
    shape = "x".join(str(n) for n in tensor.shape)
    return f"[{shape}] {str(tensor.dtype).removeprefix('torch.')}"


def _table(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for index, row in enumerate(rows):
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print("  " + "  ".join(cells).rstrip(), file=out)
        if index == 0:
            print("  " + "  ".join("-" * w for w in widths), file=out)


def run_demo(out: TextIO, device: str = "cpu") -> int:
    """Print the demo to ``out``; returns the process exit status (0 on success).

    Example:
        >>> import io
        >>> from kvcompat._demo import run_demo
        >>> buf = io.StringIO()
        >>> run_demo(buf)
        0
        >>> "Use get_key_buffer instead." in buf.getvalue()
        True
    """
    pools = build_demo_pools(device)
    dsv4 = pools["DeepSeek-V4 single-KV"]
    print("kvcompat demo: one key-first loop over three reference pools (pure torch)", file=out)
    print(f"torch {torch.__version__}, device {device}", file=out)
    print("", file=out)
    print("1. The native interface on the DeepSeek-V4 single-KV pool:", file=out)
    native_calls: list[tuple[str, Callable[[], object]]] = [
        ("get_key_buffer(0)", lambda: dsv4.get_key_buffer(0)),
        ("get_value_buffer(0)", lambda: dsv4.get_value_buffer(0)),
        ("get_kv_buffer(0)", lambda: dsv4.get_kv_buffer(0)),
        ("set_kv_buffer(...)", lambda: dsv4.set_kv_buffer(None, None, None, None)),
    ]
    for label, call in native_calls:
        print(f"   pool.{label:<20} {_outcome(call)}", file=out)
    print("", file=out)

    print("2. Detection (by class name; sglang is never imported):", file=out)
    rows = [["pool", "pool_kind", "is_single_kv_pool"]]
    rows += [
        [name, str(kvcompat.pool_kind(native)), str(kvcompat.is_single_kv_pool(native))]
        for name, native in pools.items()
    ]
    _table(rows, out)
    print("", file=out)

    print("3. One generic loop, written once, through kvcompat:", file=out)
    print("     pool = kvcompat.adapt(native)", file=out)
    print("     for layer in pool.layer_ids:", file=out)
    print("         k, v = pool.get_kv_buffer(layer)", file=out)
    rows = [["pool", "kind", "layers", "key", "value", "shared", "same storage as native key"]]
    failures = 0
    for name, native in pools.items():
        pool = kvcompat.adapt(native)
        for layer in pool.layer_ids:
            pair = pool.get_kv_buffer(layer)
            k, v = pair
            native_key = native.get_key_buffer(layer)
            same = (
                k.data_ptr() == native_key.data_ptr()
                and k.shape == native_key.shape
                and k.stride() == native_key.stride()
                and k.dtype == native_key.dtype
            )
            failures += not same
            rows.append(
                [
                    name if layer == pool.layer_ids[0] else "",
                    pool.kind.value,
                    str(layer),
                    _tensor(k),
                    _tensor(v),
                    "yes" if pair.shared else "no",
                    "yes" if same else "NO",
                ]
            )
    _table(rows, out)
    print("", file=out)
    if failures:
        print(f"FAILED: {failures} layer(s) did not return the native storage.", file=out)
        return 1
    print(
        "Every layer of every pool answered through the same code; on the DeepSeek-V4 pool\n"
        "the value is the packed key storage itself (shared), where the native call raises.",
        file=out,
    )
    return 0
