"""Oracle: SGLang's DeepSeek-V4 ``KVLayout`` enum and pool buffers, for every value."""

from __future__ import annotations

import torch

from _oracle._common import (
    Result,
    check,
    fail_or_pass,
)
from kvcompat.layouts import (
    UNIFORM_FP8,
    get_layout,
)
from kvcompat.layouts._registry import KV_LAYOUT_NAMES


@check(
    *(get_layout(name) for name in KV_LAYOUT_NAMES),
    code="`KVLayout` enum (`kv_layout.py`)",
    compared="every field, `page_bytes` and `row_addressing` for P = 1 .. 512",
)
def layout_geometry() -> Result:
    from sglang.kernels.ops.attention.dsv4.kv_layout import KVLayout

    problems = []
    for member in KVLayout:
        spec = get_layout(member)
        for attr, ours in (
            ("data_bytes", spec.data_bytes),
            ("scale_bytes", spec.scale_bytes),
            ("tile_size", spec.tile_size),
            ("bytes_per_token", spec.bytes_per_token),
            ("page_align", spec.page_align),
        ):
            if getattr(member, attr) != ours:
                problems.append(f"{member.value}.{attr}: {getattr(member, attr)} != {ours}")
        # 0.5.21-0.5.22 have block-split pages only (no is_interleaved), addressed by
        # where their scale rows start (scale_offset; row_addressing came with _NEW).
        if getattr(member, "is_interleaved", False) != spec.interleaved:
            problems.append(f"{member.value}.is_interleaved != {spec.interleaved}")
        for page_size in (1, 2, 4, 64, 128, 256, 512):
            if member.page_bytes(page_size) != spec.page_bytes(page_size):
                problems.append(f"{member.value}.page_bytes({page_size})")
            if hasattr(member, "row_addressing"):
                theirs = member.row_addressing(page_size)
            else:
                offset = member.scale_offset(page_size)
                theirs = (member.data_bytes, offset, member.scale_bytes)
            if theirs != spec.row_addressing(page_size):
                problems.append(f"{member.value}.row_addressing({page_size})")
    return fail_or_pass(problems, f"{len(KVLayout)} KVLayout members, 7 page sizes")


@check(
    *(get_layout(name) for name in KV_LAYOUT_NAMES),
    code="`DeepSeekV4SingleKVPool` / `DeepSeekV4UniformFP8KVPool` buffers",
    compared="`[num_pages, page_bytes]` shape for every layout, P = 2, 64, 256",
)
def dsv4_pool_buffers() -> Result:
    from _sglang.env import prepare_sglang
    from _sglang.features import require

    session = prepare_sglang()
    module = session.deepseek_v4_memory_pool
    require(session.kv_layout, "KVLayout (kv_layout.py, 0.5.21 on)")
    kv_layout = session.kv_layout.KVLayout
    problems, seen = [], []
    for member in (KVLayout_ for KVLayout_ in kv_layout if KVLayout_.value != "uniform_fp8"):
        for page_size in (2, 64, 256):
            pool = module.DeepSeekV4SingleKVPool(
                size=page_size * 2,
                page_size=page_size,
                dtype=torch.float8_e4m3fn,
                qk_nope_head_dim=448,
                qk_rope_head_dim=64,
                layer_num=1,
                device="cpu",
                enable_memory_saver=False,
                kv_layout=member,
            )
            buf = pool.kv_buffer[0]
            spec = get_layout(pool.kv_layout)
            if buf.shape[1] != spec.page_bytes(page_size) or buf.dtype != torch.uint8:
                problems.append(f"{member.value} P={page_size}: {tuple(buf.shape)} {buf.dtype}")
            seen.append(f"{member.value}/{page_size}")
    pool = module.DeepSeekV4UniformFP8KVPool(
        size=128,
        page_size=64,
        dtype=torch.float8_e4m3fn,
        qk_nope_head_dim=448,
        qk_rope_head_dim=64,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    buf = pool.kv_buffer[0]
    if buf.shape[1] != UNIFORM_FP8.page_bytes(64):
        problems.append(f"uniform_fp8: {tuple(buf.shape)}")
    return fail_or_pass(problems, f"buffers of {len(seen) + 1} pools match page_bytes")
