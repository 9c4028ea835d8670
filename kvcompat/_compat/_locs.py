"""One location space per compat layer: the single owner of every loc translation.

A backend written against SGLang's MHA interface hands the pool one kind of token location
everywhere -- the full pool's ``out_cache_loc`` and ``req_to_token`` slots -- and expects a
write followed by a gather at the same ``loc`` to return what it wrote. Three kinds of pool
keep a layer's rows in another space:

* a composite's sliding-window layers (``SWAKVPool``, every layer of
  ``DeepSeekV4TokenToKVPool``) store rows by SWA slot, reached through the pool's registered
  full->SWA mapping (``translate_loc_from_full_to_swa``);
* ``HiSparseC4DevicePool`` stores rows by HiSparse device slot, reached from compressed
  locations through its registered mapping (``translate_loc_to_hisparse_device``);
* every other layer stores rows by the location itself.

:func:`loc_space` decides, once per layer (and again when the pool registers a new mapping),
what a compat location means there; :meth:`LocSpace.storage_loc` is the one translation
every compat operation goes through -- ``set_kv_buffer``, every logical-view gather, slice
and index assignment -- so a plain location means the same token in all of them, or is
refused in all of them. Where the layer's getters hand out the native tensors (an
``SWAKVPool`` over MHA or MLA), indexing those tensors cannot be translated: they are
indexed by SWA slot, as SGLang's own backends index them, and ``set_kv_buffer`` takes a
plain location only where SWA slots *are* full-pool locations (``swa_uses_full_indices``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kvcompat._errors import WriteError
from kvcompat._protocol import KVPoolProtocol, PoolKind

__all__ = ["LocSpace", "loc_space"]

_SWA = "full_to_swa_index_mapping"
_HISPARSE = "full_to_hisparse_device_index_mapping"


class LocSpace:
    """What a compat location means for one layer, and the one function translating it.

    Attributes:
        rows: how many locations the space holds (a logical view's ``shape[0]``).
        mapping: the native mapping tensor the translation reads (None: none used).
        fixed: True where nothing the pool registers later can change the space (the
            getters' hot path then skips :meth:`is_current`).
    """

    __slots__ = (
        "_attr",
        "_describe",
        "_full_layer",
        "_missing",
        "_owner",
        "_plain_writes",
        "_translate",
        "fixed",
        "mapping",
        "rows",
    )

    def __init__(
        self,
        rows: int,
        *,
        describe: str,
        owner: Any = None,
        attr: str = _SWA,
        mapping: Any = None,
        translate: Callable[[torch.Tensor], torch.Tensor] | None = None,
        missing: str | None = None,
        plain_writes: str | None = None,
        full_layer: bool = False,
    ) -> None:
        self.rows = rows
        self.mapping = mapping
        self._describe = describe
        self._owner = owner
        self._attr = attr
        self.fixed = owner is None
        self._translate = translate
        self._missing = missing
        self._plain_writes = plain_writes
        self._full_layer = full_layer

    def is_current(self) -> bool:
        """Whether the pool still holds the mapping this space was built for."""
        return self.fixed or getattr(self._owner, self._attr, None) is self.mapping

    def storage_loc(self, loc: torch.Tensor, *, what: str, error: type[Exception]) -> torch.Tensor:
        """The storage rows of compat locations ``loc`` (1-D int64 on the storage's device).

        ``what`` names the operation for messages; ``error`` is the class raised (a
        ``WriteError`` for writes, an ``IndexError`` for gathers). Nothing is written.
        """
        if self._missing is not None:
            msg = f"{what}: {self._missing}"
            raise error(msg)
        if self._translate is None:
            return loc
        if loc.numel():
            low, high = torch.stack(torch.aminmax(loc)).tolist()
            if low < 0 or high >= self.rows:
                bad = loc[(loc < 0) | (loc >= self.rows)][:8].tolist()
                msg = (
                    f"{what}: location(s) {bad} are outside the {self.rows} {self._describe} "
                    "this layer's compat view addresses.\n"
                    "Hint: pass the same full-pool locations you pass set_kv_buffer "
                    "(out_cache_loc, req_to_token entries)."
                )
                raise error(msg)
        rows = self._translate(loc).to(torch.long)
        if rows.numel() and bool((rows < 0).any()):
            bad = loc[rows < 0][:8].tolist()
            msg = (
                f"{what}: location(s) {bad} have no slot in this layer's storage (the pool's "
                f"mapping holds -1 for them).\n"
                "Hint: only locations the allocator handed out are valid."
            )
            raise error(msg)
        return rows

    def write_loc(self, loc_info: Any, swa_loc: torch.Tensor | None, layer_id: int) -> Any:
        """The storage rows ``set_kv_buffer`` writes for ``loc_info`` (a tensor or KVWriteLoc).

        A sliding-window layer takes the caller's own translation where it hands one
        (``KVWriteLoc.swa_loc``, or 0.5.13's ``swa_loc=`` keyword), as SGLang's pools do;
        otherwise the plain location goes through :meth:`storage_loc`.
        """
        full = (
            loc_info if isinstance(loc_info, torch.Tensor) else getattr(loc_info, "loc", loc_info)
        )
        if self._owner is not None and self._attr == _SWA:
            given = swa_loc if swa_loc is not None else getattr(loc_info, "swa_loc", None)
            if given is not None:
                return given
        elif self._full_layer:  # a composite's full-attention layer: KVWriteLoc.full_loc
            full_loc = getattr(loc_info, "full_loc", None)
            full = full if full_loc is None else full_loc
        if self._plain_writes is not None:
            msg = f"set_kv_buffer on layer {layer_id}: {self._plain_writes}"
            raise WriteError(msg)
        if not isinstance(full, torch.Tensor):
            return full  # the write validates it and says what it received
        return self.storage_loc(
            full.reshape(-1).to(torch.long),
            what=f"set_kv_buffer on layer {layer_id}",
            error=WriteError,
        )


def loc_space(
    adapter: KVPoolProtocol, layer_id: int, storage_rows: int, *, views: bool
) -> LocSpace:
    """The location space of ``layer_id`` through compat (see the module doc).

    ``storage_rows`` is the number of token rows the layer's storage holds; ``views`` says
    whether the layer's getters are logical views (True) or the native tensors (False).
    """
    part = adapter.component_for(layer_id) if adapter.kind is PoolKind.COMPOSITE else None
    if part == "swa":
        return _sliding_window(adapter, layer_id, storage_rows, views=views)
    leaf = adapter if part is None else adapter.components[part]
    native = leaf.native
    if hasattr(type(native), "translate_loc_to_hisparse_device"):
        return _hisparse(native, layer_id, storage_rows, name=adapter.name, views=views)
    return LocSpace(storage_rows, describe="token slots", full_layer=part is not None)


def _sliding_window(
    adapter: KVPoolProtocol, layer_id: int, storage_rows: int, *, views: bool
) -> LocSpace:
    native = adapter.native
    mapping = getattr(native, _SWA, None)
    full_indices = getattr(native, "swa_uses_full_indices", False) is True
    where = f"layer {layer_id} of {adapter.name} keeps its rows in the sliding-window sub-pool"
    if not views:
        # Native tensors, indexed by SWA slot: a plain write location can only mean the
        # same row as a later gather where SWA slots are full-pool locations.
        plain = None
        if not full_indices:
            plain = (
                f"{where}, and compat hands out its native tensors, which are indexed by SWA "
                "slot; a plain location names a full-pool slot, so writing it translated "
                "would put the token where your later k_buffer[loc] does not look.\n"
                "Hint: pass KVWriteLoc(loc, swa_loc=pool.translate_loc_from_full_to_swa(loc)) "
                "and index the buffers with that swa_loc, as SGLang's attention backends do "
                "(or set pool.swa_uses_full_indices with an identity mapping, as SGLang's "
                "configurator does when SWA slots are full-pool slots)."
            )
        return LocSpace(
            storage_rows,
            describe="SWA slots",
            owner=native,
            mapping=mapping,
            plain_writes=plain,
        )
    translate = getattr(native, "translate_loc_from_full_to_swa", None)
    if mapping is not None and translate is not None:
        return LocSpace(
            int(mapping.shape[0]),
            describe="full-pool locations",
            owner=native,
            mapping=mapping,
            translate=translate,
        )
    if full_indices:
        return LocSpace(storage_rows, describe="full-pool locations", owner=native)
    missing = (
        f"{where}, whose slots are not full-pool locations, and the pool has no full->SWA "
        "mapping registered, so compat cannot tell which slot a location names.\n"
        "Hint: register the allocator's mapping first (pool.register_mapping(...)), as "
        "SGLang's model runner does; or address SWA slots directly with the key-first API: "
        f"pool.kvcompat.read({layer_id}, swa_loc) / pool.kvcompat.write({layer_id}, swa_loc, k)."
    )
    return LocSpace(
        storage_rows, describe="full-pool locations", owner=native, mapping=None, missing=missing
    )


def _hisparse(native: Any, layer_id: int, storage_rows: int, *, name: str, views: bool) -> LocSpace:
    mapping = getattr(native, _HISPARSE, None)
    if not views:  # native tensors, indexed by device slot: as SWAKVPool's, see above
        plain = (
            f"{type(native).__qualname__} stores layer {layer_id} ({name}) by HiSparse device "
            "slot, and compat hands out its native tensors, indexed by device slot; a plain "
            "location is a logical one, so writing it translated (as the native writer does) "
            "would put the token where your later k_buffer[loc] does not look.\n"
            "Hint: translate first and use the device slots for both: slots = "
            "pool.translate_loc_to_hisparse_device(loc); pool.kvcompat.write("
            f"{layer_id}, slots, k, v); k_buffer[slots]."
        )
        return LocSpace(
            storage_rows,
            describe="device slots",
            owner=native,
            attr=_HISPARSE,
            mapping=mapping,
            plain_writes=plain,
        )
    if mapping is None:
        missing = (
            f"{type(native).__qualname__} stores layer {layer_id} ({name}) by HiSparse device "
            "slot; compat takes compressed locations, as its native writers do, but no "
            "compressed->device mapping is registered, so they cannot be translated.\n"
            "Hint: register the mapping first (pool.register_mapping(...)), or address device "
            f"slots directly with the key-first API: pool.kvcompat.read({layer_id}, slots) / "
            f"pool.kvcompat.write({layer_id}, slots, k)."
        )
        return LocSpace(
            storage_rows,
            describe="compressed locations",
            owner=native,
            attr=_HISPARSE,
            missing=missing,
        )
    return LocSpace(
        int(mapping.shape[0]),
        describe="compressed locations",
        owner=native,
        attr=_HISPARSE,
        mapping=mapping,
        translate=native.translate_loc_to_hisparse_device,
    )
