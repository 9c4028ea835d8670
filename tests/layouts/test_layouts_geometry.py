"""Page geometry, addressing helpers, the registry and the public surface."""

from __future__ import annotations

import dataclasses
import enum
import pkgutil
import subprocess
import sys

import pytest
import torch
from _layout_cases import ALL_LAYOUTS, DSV4_LAYOUTS, buffer_for, layout_id

import kvcompat.layouts as layouts
from kvcompat import LayoutError
from kvcompat.layouts import (
    DSA_FP8,
    UNIFORM_FP8,
    V4,
    V41,
    V41_FP4,
    V41_FP4_NEW,
    V41_NEW,
    Encoding,
    LayoutSpec,
    SegmentRole,
    dsa_fp8_layout,
    get_layout,
    mha_layout,
    mla_layout,
)
from kvcompat.layouts._addressing import gather_rows, token_views
from kvcompat.layouts._registry import EXPORTS, LAYOUT_FACTORIES, LAYOUTS

# sglang-pools.md §2.1 and §2.2, verbatim.
SPEC_TABLE = {
    # name: (data, scale, bytes/token, tile, page_align, interleaved)
    "v4": (576, 8, 584, 64, 576, False),
    "v41": (512, 16, 528, 32, 512, False),
    "v41_fp4": (256, 32, 288, 16, 256, False),
    "uniform_fp8": (512, 0, 512, 512, 512, False),
    "v41_new": (512, 16, 528, 32, 528, True),
    "v41_fp4_new": (256, 32, 288, 16, 288, True),
}
_NAMES = ("v4", "v41", "v41_fp4", "uniform_fp8", "v41_new", "v41_fp4_new")
PAGE_BYTES_TABLE = {
    2: dict(zip(_NAMES, (1728, 1536, 768, 1024, 1056, 576), strict=True)),
    64: dict(zip(_NAMES, (37440, 33792, 18432, 32768, 33792, 18432), strict=True)),
    128: dict(zip(_NAMES, (74880, 67584, 36864, 65536, 67584, 36864), strict=True)),
    256: dict(zip(_NAMES, (149760, 135168, 73728, 131072, 135168, 73728), strict=True)),
}
PADDING_TABLE = {
    2: {"v4": 560, "v41": 480, "v41_fp4": 192},
    64: {"v4": 64},
    128: {"v4": 128},
    256: {"v4": 256},
}


@pytest.mark.parametrize("spec", DSV4_LAYOUTS, ids=layout_id)
def test_spec_fields_match_sglang_table(spec: LayoutSpec) -> None:
    data, scale, bpt, tile, align, interleaved = SPEC_TABLE[spec.name]
    assert (spec.data_bytes, spec.scale_bytes, spec.bytes_per_token) == (data, scale, bpt)
    assert (spec.tile_size, spec.page_align, spec.interleaved) == (tile, align, interleaved)
    assert spec.paged
    assert spec.dim == 512
    assert spec.output_dtype == torch.bfloat16


@pytest.mark.parametrize("page_size", sorted(PAGE_BYTES_TABLE))
@pytest.mark.parametrize("spec", DSV4_LAYOUTS, ids=layout_id)
def test_page_bytes_table(spec: LayoutSpec, page_size: int) -> None:
    expected = PAGE_BYTES_TABLE[page_size][spec.name]
    assert spec.page_bytes(page_size) == expected
    padding = expected - page_size * spec.bytes_per_token
    assert padding == PADDING_TABLE[page_size].get(spec.name, 0)


def test_encodings_and_segments() -> None:
    assert (V4.data_encoding, V4.scale_encoding, V4.rope_encoding) == (
        Encoding.E4M3FN,
        Encoding.UE8M0,
        Encoding.BF16,
    )
    assert (V41_FP4.data_encoding, V41_FP4.scale_encoding) == (Encoding.E2M1X2, Encoding.E4M3FN)
    assert UNIFORM_FP8.scale_encoding is None
    assert V4.scale_pad == 1
    assert V4.scale_bytes_written == 7
    assert V4.segment("pad").role is SegmentRole.PAD
    assert [(s.name, s.offset, s.nbytes) for s in DSA_FP8.segments] == [
        ("nope", 0, 512),
        ("scale", 512, 16),
        ("rope", 528, 128),
    ]
    with pytest.raises(LayoutError, match="has no segment 'nothing'"):
        V4.segment("nothing")


@pytest.mark.parametrize("spec", ALL_LAYOUTS, ids=layout_id)
def test_segments_tile_each_row(spec: LayoutSpec) -> None:
    for region, size in (("data", spec.data_bytes), ("scale", spec.scale_bytes)):
        covered = sorted((s.offset, s.end) for s in spec.segments if s.region == region)
        assert sum(end - start for start, end in covered) == size
        value_bytes = sum(
            s.elements * s.encoding.bits // 8
            for s in spec.segments
            if s.region == region and s.encoding is not None
        )
        pad_bytes = sum(
            s.nbytes for s in spec.segments if s.region == region and s.encoding is None
        )
        assert value_bytes + pad_bytes == size


@pytest.mark.parametrize("page_size", [1, 2, 4, 64])
@pytest.mark.parametrize("spec", ALL_LAYOUTS, ids=layout_id)
def test_addressing_formulas(spec: LayoutSpec, page_size: int) -> None:
    per_row = page_size if spec.paged else 1
    pb = spec.page_bytes(per_row)
    for loc in range(3 * per_row):
        page, slot = divmod(loc, per_row)
        if spec.interleaved or not spec.paged:
            data = page * pb + slot * spec.bytes_per_token
            scale = data + spec.data_bytes
        else:
            data = page * pb + slot * spec.data_bytes
            scale = page * pb + per_row * spec.data_bytes + slot * spec.scale_bytes
        assert spec.data_offset(loc, page_size) == data
        assert spec.scale_offset(loc, page_size) == scale
    locs = torch.arange(3 * per_row)
    expected = [spec.data_offset(int(v), page_size) for v in locs]
    assert spec.data_offset(locs, page_size).tolist() == expected


@pytest.mark.parametrize("page_size", [2, 4, 64])
@pytest.mark.parametrize("spec", ALL_LAYOUTS, ids=layout_id)
def test_gather_rows_reads_the_documented_offsets(spec: LayoutSpec, page_size: int) -> None:
    buf = buffer_for(spec, page_size, rows=3, seed=page_size)
    per_row = page_size if spec.paged else 1
    loc = torch.randperm(3 * per_row, generator=torch.Generator().manual_seed(1))
    data, scale = gather_rows(spec, buf, loc, page_size)
    flat = buf.contiguous().view(torch.uint8).reshape(-1)
    data_view, scale_view = token_views(spec, buf, page_size)
    for i, token in enumerate(loc.tolist()):
        d = spec.data_offset(token, page_size)
        s = spec.scale_offset(token, page_size)
        assert torch.equal(data[i], flat[d : d + spec.data_bytes])
        assert torch.equal(scale[i], flat[s : s + spec.scale_bytes])
        page, slot = divmod(token, per_row)
        assert torch.equal(data_view[page, slot], data[i])
        assert torch.equal(scale_view[page, slot], scale[i])


def test_specs_are_immutable_and_hashable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        V4.data_bytes = 1  # type: ignore[misc]
    assert len({V4, V41, V41_NEW, V41, DSA_FP8, dsa_fp8_layout()}) == 4
    assert mha_layout(2, 8, torch.bfloat16) is mha_layout(2, 8, torch.bfloat16)


def test_inconsistent_spec_is_rejected() -> None:
    with pytest.raises(LayoutError, match="segments cover"):
        dataclasses.replace(V41, data_bytes=500)


# ----------------------------------------------------------------------------- registry


@pytest.mark.parametrize(
    ("name", "spec"),
    [
        ("v4", V4),
        ("v41", V41),
        ("v41_fp4", V41_FP4),
        ("uniform_fp8", UNIFORM_FP8),
        ("v41_new", V41_NEW),
        ("v41_fp4_new", V41_FP4_NEW),
        ("dsa_fp8", DSA_FP8),
        ("V41_FP4", V41_FP4),
    ],
)
def test_get_layout_by_name(name: str, spec: LayoutSpec) -> None:
    assert get_layout(name) is spec
    assert get_layout(spec) is spec


def test_get_layout_accepts_enum_members_without_sglang() -> None:
    class KVLayout(str, enum.Enum):  # the shape of SGLang's enum
        V4 = "v4"
        V41_NEW = "v41_new"

    class Plain(enum.Enum):
        FP4 = "v41_fp4"

    class Duck:
        value = "uniform_fp8"

    assert get_layout(KVLayout.V4) is V4
    assert get_layout(KVLayout.V41_NEW) is V41_NEW
    assert get_layout(Plain.FP4) is V41_FP4
    assert get_layout(Duck()) is UNIFORM_FP8


def test_get_layout_never_runs_a_property() -> None:
    calls = []

    class Sneaky:
        @property
        def value(self) -> str:
            calls.append(1)
            return "v4"

    with pytest.raises(LayoutError):
        get_layout(Sneaky())
    assert calls == []


@pytest.mark.parametrize("received", ["v5", "", 42, None, object()])
def test_get_layout_unknown(received: object) -> None:
    with pytest.raises(LayoutError) as info:
        get_layout(received)
    message = str(info.value)
    assert repr(received) in message
    for name in ("'v4'", "'v41'", "'v41_fp4'", "'uniform_fp8'", "'v41_new'", "'v41_fp4_new'"):
        assert name in message
    assert isinstance(info.value, ValueError)


def test_row_layout_factories() -> None:
    mha = mha_layout(8, 128, torch.float8_e4m3fn)
    assert (mha.dim, mha.heads, mha.bytes_per_token, mha.paged) == (1024, 8, 1024, False)
    mla = mla_layout(512, 64, torch.bfloat16)
    assert (mla.dim, mla.value_dim, mla.rope_dim, mla.bytes_per_token) == (576, 512, 64, 1152)
    dsa = dsa_fp8_layout(256, 0)
    assert (dsa.bytes_per_token, dsa.name) == (264, "dsa_fp8_256+0")
    with pytest.raises(LayoutError, match="cannot store dtype"):
        mha_layout(2, 8, torch.int8)
    with pytest.raises(LayoutError, match="positive int head_num"):
        mha_layout(0, 8, torch.bfloat16)
    with pytest.raises(LayoutError, match="kv_lora_rank >= 1"):
        mla_layout(0, 8, torch.bfloat16)
    with pytest.raises(LayoutError, match="multiple of 128"):
        dsa_fp8_layout(100, 64)
    with pytest.raises(LayoutError, match="64 or 0"):
        dsa_fp8_layout(512, 32)


# ------------------------------------------------------------------------ public surface

# The package API, by hand; the named layouts come from the registry (discovered).
EXPECTED_API = [
    "Encoding",
    "LayoutSpec",
    "Segment",
    "SegmentRole",
    "check_read",
    "check_write",
    "dequantize",
    "dsa_fp8_layout",
    "get_layout",
    "mha_layout",
    "mla_layout",
    "quantize",
]
EXPECTED_ALL = EXPECTED_API + sorted(EXPORTS)


def test_all_is_pinned() -> None:
    assert layouts.__all__ == EXPECTED_ALL
    assert {"V4", "DSA_FP8", "DSV4_INDEXER_FP8"} <= set(EXPORTS)  # discovery finds them
    public = {name for name in dir(layouts) if not name.startswith("_")}
    modules = {info.name for info in pkgutil.iter_modules(layouts.__path__)}
    assert public - modules - {"annotations"} == set(EXPECTED_ALL)


def test_named_layouts_are_package_attributes_by_discovery() -> None:
    for export, spec in EXPORTS.items():
        assert getattr(layouts, export) is spec
        assert LAYOUTS[spec.name] is spec
    with pytest.raises(AttributeError, match="no attribute 'V5'"):
        _ = layouts.V5


def test_every_layout_factory_is_a_package_attribute() -> None:
    """Factories of parametrised layouts are imported by name (typed functions)."""
    for name, factory in LAYOUT_FACTORIES.items():
        assert getattr(layouts, name) is factory
        assert name in EXPECTED_API


def test_public_objects_have_examples() -> None:
    for name in EXPECTED_ALL:
        obj = getattr(layouts, name)
        doc = obj.__doc__ if not isinstance(obj, LayoutSpec) else None
        if doc is not None:
            assert "Example:" in doc, name


def test_import_does_not_load_sglang_or_triton() -> None:
    code = (
        "import sys, kvcompat.layouts as L, torch\n"
        "L.get_layout('v4')\n"
        "print(sorted(m for m in ('sglang', 'triton') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
