"""``kvcompat demo``: the main job on an embedded default, with nothing to install but torch.

It builds the reference MHA, MLA and DeepSeek-V4 single-KV pools, shows the
native interface failing on the DeepSeek-V4 pool, then runs one generic
key-first loop, written once, over all three through kvcompat. Every line it
prints is computed from the pools at run time.
"""

from __future__ import annotations

import io
import json as _json
import math
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import torch

import kvcompat
from kvcompat.testing import (
    ReferenceDeepSeekV4SingleKVPool,
    ReferenceMHATokenToKVPool,
    ReferenceMLATokenToKVPool,
)

__all__ = ["build_demo_pools", "decode_attention", "device_problem", "run_demo"]

LATENT = 512
"""Every demo pool stores 512 values per token, so the same keys go into all three."""


def device_problem(device: str) -> str | None:
    """Why the demo cannot run on ``device``, in one line; None when it can.

    Example:
        >>> from kvcompat._demo import device_problem
        >>> device_problem("cpu") is None
        True
        >>> print(device_problem("gpu"))  # doctest: +ELLIPSIS
        --device 'gpu' is not a torch device; use cpu, cuda or cuda:N
    """
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        return f"--device {device!r} is not a torch device; use cpu, cuda or cuda:N"
    if parsed.type == "meta":
        return "--device meta holds no data, so nothing can be read back; use cpu or cuda"
    try:
        torch.empty(1, device=parsed)
    except (AssertionError, RuntimeError, NotImplementedError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        reason = reason if len(reason) <= 120 else reason[:117] + "..."
        cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return (
            f"--device {device}: torch {torch.__version__} cannot allocate there ({reason}); "
            f"it sees {cuda} CUDA device(s); use --device cpu"
        )
    return None


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
            head_num=4,
            head_dim=128,
            layer_num=2,
            device=device,
        ),
        "MLA": ReferenceMLATokenToKVPool(
            size=256,
            page_size=16,
            dtype=torch.bfloat16,
            kv_lora_rank=448,
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


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Softmax attention of one decode query ``[q_heads, d]`` over ``[n, kv_heads, *]`` K/V.

    KV heads are shared by groups of query heads (MQA/GQA); the key may be wider than the
    query (the query covers its leading columns). Computed in fp32.

    Example:
        >>> import torch
        >>> k = torch.eye(2).view(2, 1, 2)
        >>> attention(torch.tensor([[0.0, 50.0]]), k, k)[0].round()
        tensor([0., 1.])
    """
    group = query.shape[0] // key.shape[1]
    k = key.float().repeat_interleave(group, dim=1)[..., : query.shape[1]]
    v = value.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("hd,nhd->hn", query.float(), k) / math.sqrt(query.shape[1])
    return torch.einsum("hn,nhd->hd", scores.softmax(dim=-1), v)


def decode_attention(
    pool: kvcompat.KVPoolProtocol, layer: int, loc: torch.Tensor, query: torch.Tensor
) -> torch.Tensor:
    """One generic decode step over any pool, written once against the key-first API.

    Example:
        >>> import torch, kvcompat
        >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
        >>> pool = kvcompat.adapt(ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64))
        >>> decode_attention(pool, 0, torch.tensor([1, 2]), torch.ones(4, 512)).shape
        torch.Size([4, 512])
    """
    key, value = pool.read_kv(layer, loc)  # dense (dequantized) keys and values
    return attention(query, key, value)


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


def _table(rows: Sequence[Sequence[str]], out: TextIO, tables: list[list[dict[str, str]]]) -> None:
    tables.append([dict(zip(rows[0], row, strict=True)) for row in rows[1:]])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for index, row in enumerate(rows):
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print("  " + "  ".join(cells).rstrip(), file=out)
        if index == 0:
            print("  " + "  ".join("-" * w for w in widths), file=out)


def run_demo(out: TextIO, device: str = "cpu", *, json: bool = False) -> int:
    """Print the demo to ``out``; returns the process exit status (0 on success).

    Args:
        out: where to print.
        device: the torch device of the pools.
        json: print one JSON document (the same results, by section) instead of text.

    Example:
        >>> import io, json
        >>> from kvcompat._demo import run_demo
        >>> buf = io.StringIO()
        >>> run_demo(buf)
        0
        >>> "Use get_key_buffer instead." in buf.getvalue()
        True
        >>> buf = io.StringIO()
        >>> run_demo(buf, json=True)
        0
        >>> doc = json.loads(buf.getvalue())
        >>> doc["native"]["get_kv_buffer(0)"]
        "raises NotImplementedError('Use get_key_buffer instead.')"
        >>> [row["pool"] for row in doc["detection"]]
        ['MHA', 'MLA', 'DeepSeek-V4 single-KV']
    """
    tables: list[list[dict[str, str]]] = []
    outcomes: dict[str, str] = {}
    text = io.StringIO() if json else out
    status = _run_demo(text, device, tables, outcomes)
    if json:
        names = ("detection", "layers", "values")
        document = {
            "kvcompat": kvcompat.__version__,
            "torch": torch.__version__,
            "device": device,
            "ok": status == 0,
            "native": outcomes,
            **dict(zip(names, tables, strict=False)),
        }
        print(_json.dumps(document, indent=2), file=out)
    return status


def _run_demo(
    out: TextIO, device: str, tables: list[list[dict[str, str]]], outcomes: dict[str, str]
) -> int:
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
        outcomes[label] = _outcome(call)
        print(f"   pool.{label:<20} {outcomes[label]}", file=out)
    print("", file=out)

    print("2. Detection (by class name; sglang is never imported):", file=out)
    rows = [["pool", "pool_kind", "is_single_kv_pool"]]
    rows += [
        [name, str(kvcompat.pool_kind(native)), str(kvcompat.is_single_kv_pool(native))]
        for name, native in pools.items()
    ]
    _table(rows, out, tables)
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
    _table(rows, out, tables)
    print("", file=out)
    if failures:
        print(f"FAILED: {failures} layer(s) did not return the native storage.", file=out)
        return 1
    print(
        "Every layer of every pool answered through the same code; on the DeepSeek-V4 pool\n"
        "the value is the packed key storage itself (shared), where the native call raises.",
        file=out,
    )
    print("", file=out)
    return _values_section(pools, out, device, tables)


def _values_section(
    pools: dict[str, Any], out: TextIO, device: str, tables: list[list[dict[str, str]]]
) -> int:
    gen = torch.Generator(device="cpu").manual_seed(0)
    n, q_heads = 96, 8
    keys = torch.randn(n, LATENT, generator=gen).to(torch.bfloat16).to(device)
    values = torch.randn(n, LATENT, generator=gen).to(torch.bfloat16).to(device)
    query = torch.randn(q_heads, LATENT, generator=gen).to(device)
    loc = (torch.randperm(200, generator=gen)[:n] + 1).to(device)
    print("4. The same random keys written through kvcompat, read back, and one generic", file=out)
    print(
        f"   decode-attention step (written once) over {n} tokens, vs a dense reference:", file=out
    )
    print("     pool.write(layer, loc, keys[, values]); k, v = pool.read_kv(layer, loc)", file=out)
    rows = [["pool", "layout", "key bytes/token", "max |read - written|", "max |attn - dense|"]]
    for name, native in pools.items():
        pool = kvcompat.adapt(native)
        layer = pool.layer_ids[-1]
        spec = pool.layout(layer).key
        shape = (n, spec.heads, spec.dim // spec.heads)
        k_in = keys.view(shape)
        if pool.kind is kvcompat.PoolKind.SPLIT:
            v_in = values.view(shape)
            pool.write(layer, loc, k_in, v_in)
            v_ref = v_in
        else:
            pool.write(layer, loc, k_in)  # the value lives inside the key row
            v_ref = k_in[..., : pool.layout(layer).value_dim or shape[-1]]
        back = pool.read(layer, loc)
        read_err = (back.float() - k_in.float()).abs().max().item()
        ours = decode_attention(pool, layer, loc, query[:, : spec.dim // spec.heads])
        dense = attention(query[:, : spec.dim // spec.heads], k_in, v_ref)
        attn_err = (ours - dense).abs().max().item()
        rows.append(
            [name, spec.name, str(spec.bytes_per_token), f"{read_err:.3g}", f"{attn_err:.3g}"]
        )
    _table(rows, out, tables)
    print(
        "\nbf16 pools store the keys exactly; the DeepSeek-V4 V4 layout quantizes the 448\n"
        "nope values to fp8 with one power-of-two scale per 64 values (rope stays bf16).",
        file=out,
    )
    return 0
