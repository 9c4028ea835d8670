"""What families and layouts declare is what inspection, kernels and testing consume.

Composite families declare their manifest parts (:class:`kvcompat.adapters.CompositeParts`)
instead of inspection recognising their factory; the layout registry is discovered from
the layout modules and the reference pools' ``KVLayout`` is checked against it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import kvcompat
import kvcompat.layouts
from kvcompat._registry import family_of, qualified_name
from kvcompat.adapters import CompositeParts
from kvcompat.adapters.sglang import SWA_PARTS, adapt_swa
from kvcompat.inspection import describe, transfer_descriptors
from kvcompat.layouts import LayoutSpec
from kvcompat.layouts._registry import KV_LAYOUT_NAMES, LAYOUTS
from kvcompat.testing import KVLayout, ReferenceSWAKVPool, _reference, reference_swa_pool


class VendorSWAPool(ReferenceSWAKVPool):
    """A third party's sliding-window pool, taught with the public hooks only."""


class ForkedSWAPool(ReferenceSWAKVPool):
    """A fork that reuses the SWA family by name."""


def _vendor(cls: type[ReferenceSWAKVPool]) -> Any:
    native = reference_swa_pool()
    native.__class__ = cls
    return native


@pytest.fixture
def registered() -> Iterator[None]:
    vendor, fork = qualified_name(VendorSWAPool), qualified_name(ForkedSWAPool)
    kvcompat.register_adapter(
        vendor,
        adapt_swa,
        kind=kvcompat.PoolKind.COMPOSITE,
        parts=CompositeParts(regroup={"full": {"kv": None}, "swa": {"kv": "state"}}),
    )
    kvcompat.register_adapter(fork, qualified_name(ReferenceSWAKVPool))
    yield
    kvcompat.unregister_adapter(vendor)
    kvcompat.unregister_adapter(fork)


def _groups(pool: Any) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for descriptor in transfer_descriptors(pool):
        found.setdefault(descriptor.component, set()).add(descriptor.group.value)
    return found


def test_a_registered_composite_gets_the_groups_it_declares(registered: None) -> None:
    assert _groups(reference_swa_pool()) == {"full": {"kv"}, "swa": {"state"}}
    assert _groups(_vendor(VendorSWAPool)) == {"swa": {"state"}}  # full: declared untransferred


def test_reusing_a_composite_family_keeps_its_declaration(registered: None) -> None:
    fork = family_of(ForkedSWAPool)
    assert fork is not None
    assert fork.parts is SWA_PARTS
    native = _vendor(ForkedSWAPool)
    assert _groups(native) == {"full": {"kv"}, "swa": {"state"}}
    assert describe(native).layer_ids == (0, 1, 2, 3)


def test_a_bad_group_in_a_declaration_is_refused_with_the_valid_ones() -> None:
    name = qualified_name(VendorSWAPool)
    kvcompat.register_adapter(
        name,
        adapt_swa,
        kind=kvcompat.PoolKind.COMPOSITE,
        parts=CompositeParts(regroup={"swa": {"kv": "stat"}}),
    )
    try:
        with pytest.raises(kvcompat.KVCompatError, match=r"groups must be among .*'state'"):
            describe(_vendor(VendorSWAPool))
    finally:
        kvcompat.unregister_adapter(name)


def test_the_registry_is_every_spec_the_layout_modules_export() -> None:
    exported = {
        getattr(kvcompat.layouts, name)
        for name in kvcompat.layouts.__all__
        if isinstance(getattr(kvcompat.layouts, name), LayoutSpec)
    }
    assert exported <= set(LAYOUTS.values())  # exporting from the package is optional
    assert all(LAYOUTS[spec.name] is spec for spec in exported)


def test_reference_kv_layout_enum_is_the_registrys() -> None:
    assert [member.value for member in KVLayout] == sorted(
        KV_LAYOUT_NAMES, key=[m.value for m in KVLayout].index
    )
    assert {member.value for member in KVLayout} == set(KV_LAYOUT_NAMES)
    assert set(KV_LAYOUT_NAMES) <= set(LAYOUTS)


def test_a_layout_missing_from_kv_layout_fails_the_import_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_reference, "KV_LAYOUT_NAMES", (*KV_LAYOUT_NAMES, "v5"))
    with pytest.raises(ImportError, match=r"add the missing members to KVLayout"):
        _reference._check_kv_layouts()
