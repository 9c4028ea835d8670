"""``memory_report(pool)``: the bytes a pool really holds, each allocation counted once.

De-duplication rule
-------------------

Tensors are grouped by the storage they view (``untyped_storage().data_ptr()``
on one device). Each storage counts **once**, at its full
``untyped_storage().nbytes()`` — padding and slack included, since that is what
the allocator handed out. Its bytes are then *attributed* to the tensors that
own them, so per-component, per-role and per-layer figures add up to the total:

* Derived views that kvcompat lists for convenience (``alias_of`` set: the MLA
  value view ``kv_buffer[i][..., :kv_lora_rank]``) own nothing.
* The remaining tensors on one storage share it in proportion to the bytes
  each addresses (``numel x element size``); integer remainders go to the
  first tensor in manifest order. An MHA pool's ``k_buffer[i]`` and
  ``v_buffer[i]`` are the two halves of one ``[2, rows, heads, dim]``
  allocation: the storage counts once and K and V get half each (page padding
  included). A storage viewed by one tensor belongs to it entirely.

Per-layer bytes go to the tensor's owning layer (the lowest of its
``layer_ids``: the kv-source layer of a shared compressed buffer); tensors
serving no particular layer count in ``unlayered_bytes``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kvcompat.inspection._manifest import describe
from kvcompat.inspection._model import PoolManifest, Role, TensorManifest, format_bytes

__all__ = ["ComponentMemory", "MemoryReport", "StorageBlock", "memory_report"]


@dataclass(frozen=True)
class StorageBlock:
    """One distinct allocation and the tensors viewing it.

    Attributes:
        device: device string.
        ptr: ``untyped_storage().data_ptr()``.
        nbytes: ``untyped_storage().nbytes()``: counted once in the total.
        owners: paths of the tensors the bytes are attributed to.
        views: paths of listed derived views that own nothing.

    Example:
        >>> from kvcompat.inspection import memory_report
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool
        >>> block = memory_report(ReferenceMHATokenToKVPool(16, 16, layer_num=1)).storages[0]
        >>> block.owners, block.nbytes
        (('k_buffer[0]', 'v_buffer[0]'), 16384)
    """

    device: str
    ptr: int
    nbytes: int
    owners: tuple[str, ...]
    views: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form.

        Example:
            >>> from kvcompat.inspection import StorageBlock
            >>> StorageBlock("cpu", 1, 8, ("k",)).to_dict()["owners"]
            ['k']
        """
        return {
            "device": self.device,
            "ptr": self.ptr,
            "nbytes": self.nbytes,
            "owners": list(self.owners),
            "views": list(self.views),
        }


@dataclass(frozen=True)
class ComponentMemory:
    """Bytes attributed to one manifest node.

    Attributes:
        name, path, role, native_class: as in the node's :class:`PoolManifest`.
        depth: the node's depth in the tree (0 for the pool itself).
        bytes: bytes attributed to the node's own tensors.
        total_bytes: bytes attributed to the node and everything below it.
        tensors: number of the node's own tensor entries.
        storages: number of distinct allocations its own tensors view.

    Example:
        >>> from kvcompat.inspection import memory_report
        >>> from kvcompat.testing import reference_swa_pool
        >>> report = memory_report(reference_swa_pool())
        >>> report.component("full").total_bytes + report.component("swa").total_bytes
        16384
    """

    name: str
    path: str
    role: Role
    native_class: str
    depth: int
    bytes: int
    total_bytes: int
    tensors: int
    storages: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form.

        Example:
            >>> from kvcompat.inspection import memory_report
            >>> from kvcompat.testing import reference_swa_pool
            >>> memory_report(reference_swa_pool()).components[0].to_dict()["role"]
            'composite'
        """
        return {
            "name": self.name,
            "path": self.path,
            "role": self.role.value,
            "native_class": self.native_class,
            "depth": self.depth,
            "bytes": self.bytes,
            "total_bytes": self.total_bytes,
            "tensors": self.tensors,
            "storages": self.storages,
        }


def _frozen(mapping: Mapping[Any, int]) -> Mapping[Any, int]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class MemoryReport:
    """Where a pool's bytes are: in total, per component, per role, per layer, per device.

    ``str(report)`` (or :meth:`table`) is a readable table; :meth:`to_dict` a
    JSON-ready form. See the module docstring for the de-duplication rule.

    Attributes:
        pool: display name of the described pool.
        total_bytes: the sum of the distinct storages' sizes.
        components: one entry per manifest node, in manifest order.
        storages: the distinct allocations, in order of first appearance.
        tensor_bytes: tensor path -> attributed bytes.
        by_role: role name -> attributed bytes.
        by_layer: owning layer id -> attributed bytes.
        by_device: device -> bytes.
        unlayered_bytes: bytes of tensors that serve no particular layer.

    Example:
        >>> from kvcompat.inspection import memory_report
        >>> from kvcompat.testing import ReferenceMLATokenToKVPool
        >>> report = memory_report(ReferenceMLATokenToKVPool(size=16, page_size=16, layer_num=2))
        >>> report.total_bytes, dict(report.by_role)
        (73728, {'latent': 73728})
    """

    pool: str
    total_bytes: int
    components: tuple[ComponentMemory, ...]
    storages: tuple[StorageBlock, ...]
    tensor_bytes: Mapping[str, int] = field(hash=False)
    by_role: Mapping[str, int] = field(hash=False)
    by_layer: Mapping[int, int] = field(hash=False)
    by_device: Mapping[str, int] = field(hash=False)
    unlayered_bytes: int = 0

    def component(self, name: str) -> ComponentMemory:
        """The entry of the node called ``name``.

        Raises:
            KeyError: no such node; the message lists the names.

        Example:
            >>> from kvcompat.inspection import memory_report
            >>> from kvcompat.testing import reference_swa_pool
            >>> memory_report(reference_swa_pool()).component("swa").tensors
            4
        """
        for entry in self.components:
            if entry.name == name:
                return entry
        names = ", ".join(repr(entry.name) for entry in self.components)
        msg = f"no component named {name!r} in the memory report of {self.pool}; have: {names}."
        raise KeyError(msg)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (layer ids become string keys, as JSON requires).

        Example:
            >>> import json
            >>> from kvcompat.inspection import memory_report
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> report = memory_report(ReferenceMHATokenToKVPool(16, 16))
            >>> data = json.loads(json.dumps(report.to_dict()))
            >>> data["total_bytes"], data["by_layer"]
            (16384, {'0': 16384})
        """
        return {
            "pool": self.pool,
            "total_bytes": self.total_bytes,
            "unlayered_bytes": self.unlayered_bytes,
            "components": [entry.to_dict() for entry in self.components],
            "storages": [block.to_dict() for block in self.storages],
            "tensor_bytes": dict(self.tensor_bytes),
            "by_role": dict(self.by_role),
            "by_layer": {str(layer): size for layer, size in self.by_layer.items()},
            "by_device": dict(self.by_device),
        }

    def table(self) -> str:
        r"""A readable table: one row per component, then totals by role and device.

        Example:
            >>> from kvcompat.inspection import memory_report
            >>> from kvcompat.testing import reference_swa_pool
            >>> lines = memory_report(reference_swa_pool()).table().splitlines()
            >>> print(lines[0], *(line[:22] + line[-18:] for line in lines[3:6]), sep="\n")
            Memory of ReferenceSWAKVPool: 16.0 KiB in 4 allocations (8 tensors)
              ReferenceSWAKVPool    16.0 KiB  100.0%
                full                10.0 KiB   62.5%
                swa                  6.0 KiB   37.5%
            >>> print(lines[-2])
              by role: key 8.0 KiB, value 8.0 KiB
        """
        tensors = sum(entry.tensors for entry in self.components)
        title = (
            f"Memory of {self.pool}: {format_bytes(self.total_bytes)} in "
            f"{len(self.storages)} allocations ({tensors} tensors)"
        )
        lines = [title]
        header = ("component", "role", "class", "tensors", "allocations", "bytes", "share")
        rows = [header]
        for entry in self.components:
            share = 100.0 * entry.total_bytes / self.total_bytes if self.total_bytes else 0.0
            rows.append(
                (
                    "  " * entry.depth + entry.name,
                    entry.role.value,
                    entry.native_class.rsplit(".", 1)[-1],
                    str(entry.tensors),
                    str(entry.storages),
                    format_bytes(entry.total_bytes),
                    f"{share:.1f}%",
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        right = {3, 4, 5, 6}
        for index, row in enumerate(rows):
            cells = [
                cell.rjust(widths[i]) if i in right and index else cell.ljust(widths[i])
                for i, cell in enumerate(row)
            ]
            lines.append("  " + "  ".join(cells).rstrip())
            if index == 0:
                lines.append("  " + "  ".join("-" * width for width in widths))
        roles = ", ".join(f"{role} {format_bytes(size)}" for role, size in self.by_role.items())
        devices = ", ".join(f"{dev} {format_bytes(size)}" for dev, size in self.by_device.items())
        lines.append(f"  by role: {roles or 'none'}")
        lines.append(f"  by device: {devices or 'none'}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _attribute(tensors: list[TensorManifest], nbytes: int) -> dict[str, int]:
    """Split one storage's bytes among the tensors owning it (see the module docstring)."""
    owners = [tensor for tensor in tensors if tensor.alias_of is None] or tensors[:1]
    weights = [tensor.nbytes for tensor in owners]
    total_weight = sum(weights)
    if total_weight == 0:
        shares = [0] * len(owners)
        shares[0] = nbytes
    else:
        shares = [nbytes * weight // total_weight for weight in weights]
        shares[0] += nbytes - sum(shares)
    attributed = {tensor.path: 0 for tensor in tensors}
    for tensor, share in zip(owners, shares, strict=True):
        attributed[tensor.path] += share
    return attributed


def memory_report(pool: Any) -> MemoryReport:
    """Total and per-component bytes of a pool, counting each allocation once.

    Works from :func:`~kvcompat.inspection.describe` (pass a pool, an adapter,
    or a manifest you already have), so it reads attributes only and never
    calls a native getter. Unlike SGLang's own accounting it sees every part
    of a DeepSeek-V4 pool (SGLang #37852 reports 0 GB there).

    Args:
        pool: a native pool, a kvcompat adapter, or a :class:`PoolManifest`.

    Returns:
        The :class:`MemoryReport`.

    Raises:
        UnsupportedPoolError: ``pool`` is not a pool kvcompat knows.

    Example:
        >>> from kvcompat.inspection import memory_report
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool
        >>> report = memory_report(ReferenceMHATokenToKVPool(size=16, page_size=16, layer_num=2))
        >>> report.total_bytes, dict(report.by_role), dict(report.by_layer)
        (32768, {'key': 16384, 'value': 16384}, {0: 16384, 1: 16384})
    """
    manifest = pool if isinstance(pool, PoolManifest) else describe(pool)
    blocks: dict[tuple[str, int], list[TensorManifest]] = {}
    sizes: dict[tuple[str, int], int] = {}
    for tensor in manifest.iter_tensors():
        blocks.setdefault(tensor.storage_key, []).append(tensor)
        sizes[tensor.storage_key] = max(sizes.get(tensor.storage_key, 0), tensor.storage_nbytes)
    attributed: dict[str, int] = {}
    storages: list[StorageBlock] = []
    by_device: dict[str, int] = {}
    for key, tensors in blocks.items():
        attributed.update(_attribute(tensors, sizes[key]))
        owners = tuple(t.path for t in tensors if t.alias_of is None) or (tensors[0].path,)
        views = tuple(t.path for t in tensors if t.path not in owners)
        storages.append(StorageBlock(key[0], key[1], sizes[key], owners, views))
        by_device[key[0]] = by_device.get(key[0], 0) + sizes[key]

    by_role: dict[str, int] = {}
    by_layer: dict[int, int] = {}
    unlayered = 0
    for tensor in manifest.iter_tensors():
        share = attributed[tensor.path]
        if not share:
            continue
        by_role[tensor.role.value] = by_role.get(tensor.role.value, 0) + share
        if tensor.layer_id is None:
            unlayered += share
        else:
            by_layer[tensor.layer_id] = by_layer.get(tensor.layer_id, 0) + share

    components: list[ComponentMemory] = []

    def visit(node: PoolManifest, depth: int) -> int:
        own = sum(attributed[tensor.path] for tensor in node.tensors)
        index = len(components)
        components.append(ComponentMemory("", "", node.role, "", 0, 0, 0, 0, 0))  # placeholder
        total = own + sum(visit(child, depth + 1) for child in node.children)
        components[index] = ComponentMemory(
            name=node.name,
            path=node.path,
            role=node.role,
            native_class=node.native_class,
            depth=depth,
            bytes=own,
            total_bytes=total,
            tensors=len(node.tensors),
            storages=len({tensor.storage_key for tensor in node.tensors}),
        )
        return total

    visit(manifest, 0)
    return MemoryReport(
        pool=manifest.name,
        total_bytes=sum(sizes.values()),
        components=tuple(components),
        storages=tuple(storages),
        tensor_bytes=_frozen(attributed),
        by_role=_frozen(by_role),
        by_layer=_frozen(dict(sorted(by_layer.items()))),
        by_device=_frozen(by_device),
        unlayered_bytes=unlayered,
    )
