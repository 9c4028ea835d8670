"""``check_pool``: a conformance checker a user runs on their own pool or adapter.

It checks what every kvcompat adapter promises, on the pool as it is, and reports every
failure (not only the first):

* ``getters``: every served layer's key (and value) is a tensor whose storage the
  native pool really holds (found by walking the native object's attributes), the
  ``KVPair`` matches the two getters, and pools without values raise
  :class:`~kvcompat.NoValueBufferError`;
* ``layer_ids``: unserved ids raise :class:`~kvcompat.LayerOutOfRangeError` and non-int
  ids :class:`~kvcompat.LayerIdTypeError`;
* ``round_trip``: ``write`` then ``read`` of a few tokens returns exactly what the layer's
  own layout codec gives for those values (within the layout's error of the input), and
  no byte outside the written tokens' rows changes — the pool's bytes are restored
  afterwards;
* ``describe``: :func:`kvcompat.describe` names every tensor reachable from the native
  pool, and the getters' storage with a role (not ``opaque``);
* ``descriptors``: :func:`kvcompat.transfer_descriptors` covers every getter's storage;
* ``memory_report``: :func:`kvcompat.memory_report` runs.

Composites are checked component by component.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from kvcompat._errors import (
    KVCompatError,
    LayerIdTypeError,
    LayerOutOfRangeError,
    NoValueBufferError,
)
from kvcompat._protocol import KVPoolProtocol, PoolKind
from kvcompat._registry import adapt
from kvcompat.layouts import dequantize, quantize
from kvcompat.layouts._addressing import gather_rows

__all__ = ["CheckFailure", "PoolCheckError", "PoolReport", "check_pool"]

_LEAVES = (int, float, str, bytes, bool, type(None), torch.dtype, torch.device)

CHECKS = ("getters", "layer_ids", "round_trip", "describe", "descriptors", "memory_report")


@dataclass(frozen=True)
class CheckFailure:
    """One thing a pool got wrong.

    Attributes:
        check: which check (one of ``getters``, ``layer_ids``, ``round_trip``,
            ``describe``, ``descriptors``, ``memory_report``).
        where: the component and layer, e.g. ``"swa layer 2"``.
        message: what was expected and what happened.

    Example:
        >>> print(CheckFailure("layer_ids", "MyPool", "get_key_buffer(-1) returned a buffer"))
        [layer_ids] MyPool: get_key_buffer(-1) returned a buffer
    """

    check: str
    where: str
    message: str

    def __str__(self) -> str:
        return f"[{self.check}] {self.where}: {self.message}"


@dataclass(frozen=True)
class PoolReport:
    """What :func:`check_pool` found.

    Attributes:
        pool: the checked pool's class name.
        passed: the checks that ran without a failure.
        failures: every failure, in the order found.
        skipped: ``(check, why)`` for checks that could not run.

    Example:
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool, check_pool
        >>> report = check_pool(ReferenceMHATokenToKVPool(size=16, page_size=16, layer_num=2))
        >>> report.ok, report.failures
        (True, ())
    """

    pool: str
    passed: tuple[str, ...]
    failures: tuple[CheckFailure, ...]
    skipped: tuple[tuple[str, str], ...] = ()

    @property
    def ok(self) -> bool:
        """True when nothing failed."""
        return not self.failures

    def __str__(self) -> str:
        lines = [f"check_pool({self.pool}): {'ok' if self.ok else 'FAILED'}"]
        lines += [f"  passed: {', '.join(self.passed) or '-'}"]
        lines += [f"  skipped {check}: {why}" for check, why in self.skipped]
        lines += [f"  {failure}" for failure in self.failures]
        return "\n".join(lines)


class PoolCheckError(KVCompatError, AssertionError):
    """Raised by :func:`check_pool` when a check fails; ``report`` holds every failure.

    Example:
        >>> report = PoolReport("MyPool", (), (CheckFailure("getters", "layer 0", "a copy"),))
        >>> str(PoolCheckError(report)).splitlines()[0]
        'check_pool(MyPool): FAILED'
    """

    def __init__(self, report: PoolReport) -> None:
        super().__init__(str(report))
        self.report = report


PoolCheckError.__module__ = "kvcompat.testing"  # where users import it from


@dataclass
class _State:
    failures: list[CheckFailure] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def fail(self, check: str, where: str, message: str) -> None:
        self.failures.append(CheckFailure(check, where, message))


def check_pool(pool: Any, *, raise_on_failure: bool = True, tokens: int = 3) -> PoolReport:
    """Check that a pool (native or adapter) keeps kvcompat's promises; report what failed.

    The pool's bytes are left as they were: each storage a write touches is copied
    first and restored afterwards (so run it on a pool that no other thread uses).

    Args:
        pool: a native pool :func:`kvcompat.adapt` accepts, or an adapter.
        raise_on_failure: raise :class:`PoolCheckError` (an ``AssertionError``) when a
            check fails; False returns the report instead.
        tokens: how many token locations the round trip writes per layer.

    Raises:
        PoolCheckError: a check failed (with ``raise_on_failure``); ``str()`` lists all.
        UnsupportedPoolError: kvcompat cannot adapt ``pool`` at all.

    Example:
        >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool, check_pool
        >>> print(check_pool(ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64)))
        check_pool(ReferenceDeepSeekV4SingleKVPool): ok
          passed: getters, layer_ids, round_trip, describe, descriptors, memory_report
    """
    adapter = adapt(pool)
    native = getattr(adapter, "native", pool)
    state = _State()
    reachable = _reachable_storages(native)
    leaves = list(_leaves(adapter, ""))
    for label, leaf in leaves:
        _check_getters(state, label, leaf, reachable)
        _check_layer_ids(state, label, leaf)
        _check_round_trip(state, label, leaf, tokens)
    _check_inspection(state, adapter, leaves, reachable)
    failed = {failure.check for failure in state.failures}
    skipped = {check for check, _ in state.skipped}
    report = PoolReport(
        pool=type(native).__name__,
        passed=tuple(c for c in CHECKS if c not in failed and c not in skipped),
        failures=tuple(state.failures),
        skipped=tuple(state.skipped),
    )
    if raise_on_failure and not report.ok:
        raise PoolCheckError(report)
    return report


# -- walking -----------------------------------------------------------------------------------


def _leaves(pool: KVPoolProtocol, prefix: str) -> Iterator[tuple[str, KVPoolProtocol]]:
    """Every pool that serves buffers itself: a leaf, and each of its or a composite's parts.

    A leaf may have parts of its own (a DSA pool's ``indexer``): both are checked.
    """
    components = pool.components
    if not components or pool.kind is not PoolKind.COMPOSITE:
        yield prefix or type(getattr(pool, "native", pool)).__name__, pool
    for name, part in components.items():
        yield from _leaves(part, f"{prefix}{name}" if not prefix else f"{prefix}.{name}")


def _storage_key(tensor: torch.Tensor) -> tuple[str, int]:
    return str(tensor.device), int(tensor.untyped_storage().data_ptr())


def _reachable_storages(native: Any, depth: int = 4) -> dict[tuple[str, int], str]:
    """Storage -> attribute path, for every tensor reachable from the native pool's attributes."""
    found: dict[tuple[str, int], str] = {}
    seen: set[int] = set()

    def visit(value: Any, path: str, left: int) -> None:
        # Type checks only (no isinstance/hasattr on the value: proxies and deprecated
        # objects run code, and warn, on attribute access).
        kind = type(value)
        if id(value) in seen or kind in _LEAVES or issubclass(kind, (type, types.ModuleType)):
            return
        seen.add(id(value))
        if issubclass(kind, torch.Tensor):
            with contextlib.suppress(RuntimeError, NotImplementedError):  # meta: no storage
                found.setdefault(_storage_key(value), path)
            return
        if left == 0:
            return
        if issubclass(kind, (list, tuple)):
            for index, item in enumerate(value):
                visit(item, f"{path}[{index}]", left - 1)
        elif issubclass(kind, dict):
            for key, item in value.items():
                visit(item, f"{path}[{key!r}]", left - 1)
        else:
            try:
                attrs = object.__getattribute__(value, "__dict__")
            except AttributeError:
                return
            if type(attrs) is dict:
                for name, item in attrs.items():
                    visit(item, f"{path}.{name}" if path else name, left - 1)

    visit(native, "", depth)
    return found


# -- per-leaf checks ---------------------------------------------------------------------------


def _check_getters(
    state: _State, label: str, leaf: KVPoolProtocol, reachable: dict[tuple[str, int], str]
) -> None:
    for layer in leaf.layer_ids:
        where = f"{label} layer {layer}"
        try:
            key: Any = leaf.get_key_buffer(layer, wait=False)
        except Exception as exc:  # noqa: BLE001 -- a failure is a finding
            state.fail("getters", where, f"get_key_buffer raised {type(exc).__name__}: {exc}")
            continue
        if not isinstance(key, torch.Tensor):
            state.fail("getters", where, f"get_key_buffer returned {type(key).__name__}")
            continue
        if _storage_key(key) not in reachable:
            state.fail(
                "getters",
                where,
                "get_key_buffer returned a tensor whose storage the native pool does not "
                "hold (a copy?); it must return the native storage itself",
            )
        if not leaf.kind.has_values:
            try:
                leaf.get_value_buffer(layer, wait=False)
            except NoValueBufferError:
                pass
            except Exception as exc:  # noqa: BLE001 -- a failure is a finding
                state.fail(
                    "getters",
                    where,
                    f"get_value_buffer on a {leaf.kind.value} pool raised "
                    f"{type(exc).__name__}, not NoValueBufferError",
                )
            else:
                state.fail(
                    "getters", where, f"get_value_buffer on a {leaf.kind.value} pool returned"
                )
            continue
        try:
            value = leaf.get_value_buffer(layer, wait=False)
            pair = leaf.get_kv_buffer(layer, wait=False)
        except Exception as exc:  # noqa: BLE001 -- a failure is a finding
            state.fail("getters", where, f"value getters raised {type(exc).__name__}: {exc}")
            continue
        if _storage_key(value) not in reachable:
            state.fail("getters", where, "get_value_buffer is not the native storage")
        if pair[0] is not key or pair[1] is not value:
            state.fail("getters", where, "get_kv_buffer is not (get_key_buffer, get_value_buffer)")
        shares = value.untyped_storage().data_ptr() == key.untyped_storage().data_ptr()
        if leaf.kind.value_aliases_key and not shares:
            state.fail(
                "getters", where, f"a {leaf.kind.value} pool's value must alias its key storage"
            )


def _check_layer_ids(state: _State, label: str, leaf: KVPoolProtocol) -> None:
    served = leaf.layer_ids
    if not served:
        return
    unserved = sorted({-1, max(served) + 1, *(i for i in range(min(served)) if i not in served)})
    for layer in unserved[:4]:
        try:
            leaf.get_key_buffer(layer, wait=False)
        except LayerOutOfRangeError:  # noqa: PERF203 -- a checker, not a hot path
            continue
        except Exception as exc:  # noqa: BLE001 -- a failure is a finding
            state.fail(
                "layer_ids",
                label,
                f"get_key_buffer({layer}) raised {type(exc).__name__}, not LayerOutOfRangeError",
            )
        else:
            state.fail(
                "layer_ids",
                label,
                f"get_key_buffer({layer}) returned a buffer; layer {layer} is not served "
                f"(layer_ids {served})",
            )
    for bad in (float(served[0]), str(served[0]), True):
        try:
            leaf.get_key_buffer(bad, wait=False)  # type: ignore[arg-type]
        except LayerIdTypeError:  # noqa: PERF203 -- a checker, not a hot path
            continue
        except Exception as exc:  # noqa: BLE001 -- a failure is a finding
            state.fail(
                "layer_ids",
                label,
                f"get_key_buffer({bad!r}) raised {type(exc).__name__}, not LayerIdTypeError",
            )
        else:
            state.fail("layer_ids", label, f"get_key_buffer({bad!r}) was accepted")


def _snapshot(tensors: list[torch.Tensor]) -> dict[tuple[str, int], tuple[Any, torch.Tensor]]:
    saved: dict[tuple[str, int], tuple[Any, torch.Tensor]] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        key = _storage_key(tensor)
        if key not in saved:
            raw = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage)
            saved[key] = (storage, raw.clone())
    return saved


def _token_rows(spec: Any, buf: torch.Tensor) -> torch.Tensor:
    """``buf`` as the layout's rows (a view).

    A block-major ``[blocks, block_size, ...]`` buffer of token rows (vLLM's MLA caches) is
    viewed as ``[blocks * block_size, ...]``, so that slot ``block * block_size + offset``
    is row ``slot``, as the adapter addresses it.
    """
    if spec.paged or buf.dim() < 3 or not buf.is_contiguous():
        return buf
    row = buf[0].numel() * buf.element_size()
    if row == spec.bytes_per_token or row % spec.bytes_per_token:
        return buf
    return buf.flatten(0, 1)


def _owned_bytes(spec: Any, buf: torch.Tensor, loc: torch.Tensor, page: int) -> torch.Tensor:
    """Storage byte offsets the written tokens own in ``buf`` (data rows and scale rows)."""
    base = buf.storage_offset() * buf.element_size()
    spans = [(spec.data_offset(loc, page), spec.data_bytes)]
    if spec.scale_bytes:
        spans.append((spec.scale_offset(loc, page), spec.scale_bytes))
    parts = [
        (start[:, None] + torch.arange(width)[None, :]).reshape(-1) + base for start, width in spans
    ]
    return torch.cat(parts)


def _locations(leaf: KVPoolProtocol, tokens: int) -> torch.Tensor:
    size = int(leaf.size)
    page = int(leaf.page_size)
    # Skip the padding sink (slot/page 0) and spread over the capacity, last token included.
    start = page if size > page else 1
    picks = torch.linspace(start, max(start, size - 1), steps=max(1, tokens)).long()
    unique: torch.Tensor = torch.unique(picks)
    return unique


def _check_round_trip(state: _State, label: str, leaf: KVPoolProtocol, tokens: int) -> None:
    served = leaf.layer_ids
    for layer in sorted({served[0], served[-1]}) if served else ():
        where = f"{label} layer {layer}"
        try:
            lay = leaf.layout(layer)
        except KVCompatError as exc:
            state.skipped.append(("round_trip", f"{where}: no layout ({exc})".split("\n")[0]))
            continue
        key_buf = leaf.get_key_buffer(layer, wait=False)
        value_buf = leaf.get_value_buffer(layer, wait=False) if lay.value is not None else None
        buffers = [key_buf] + ([value_buf] if value_buf is not None else [])
        if not all(b.is_contiguous() for b in buffers):
            state.skipped.append(("round_trip", f"{where}: non-contiguous buffer views"))
            continue
        loc = _locations(leaf, tokens).to(key_buf.device)
        gen = torch.Generator().manual_seed(layer)
        specs = [lay.key] + ([lay.value] if lay.value is not None else [])
        values = [
            (torch.randn(len(loc), s.dim, generator=gen) * 2).to(s.output_dtype).to(key_buf.device)
            for s in specs
        ]
        saved = _snapshot(buffers)
        try:
            _round_trip_one(state, where, leaf, layer, lay, loc, buffers, specs, values, saved)
        finally:
            for storage, raw in saved.values():
                torch.empty(0, dtype=torch.uint8, device=raw.device).set_(storage).copy_(raw)


def _round_trip_one(
    state: _State,
    where: str,
    leaf: KVPoolProtocol,
    layer: int,
    lay: Any,
    loc: torch.Tensor,
    buffers: list[torch.Tensor],
    specs: list[Any],
    values: list[torch.Tensor],
    saved: dict[tuple[str, int], tuple[Any, torch.Tensor]],
) -> None:
    page = int(leaf.page_size)
    shaped = [
        v.view(len(loc), s.heads, s.dim // s.heads) for v, s in zip(values, specs, strict=True)
    ]
    try:
        leaf.write(layer, loc, shaped[0], shaped[1] if len(shaped) > 1 else None, impl="torch")
    except Exception as exc:  # noqa: BLE001 -- a failure is a finding
        state.fail("round_trip", where, f"write raised {type(exc).__name__}: {exc}")
        return
    try:
        read = [leaf.read(layer, loc, impl="torch")]
        if len(specs) > 1:
            read.append(leaf.read_kv(layer, loc, impl="torch")[1])
    except Exception as exc:  # noqa: BLE001 -- a failure is a finding
        state.fail("round_trip", where, f"read raised {type(exc).__name__}: {exc}")
        return
    buffers = [_token_rows(spec, buf) for spec, buf in zip(specs, buffers, strict=True)]
    for what, spec, buf, given, got in zip(
        ("key", "value"), specs, buffers, values, read, strict=False
    ):
        scratch = torch.zeros_like(buf)
        quantize(spec, given, scratch, loc, page)
        expected = dequantize(spec, scratch, loc, page)
        got2 = got.reshape(len(loc), -1)
        if got2.shape != expected.shape or not torch.equal(
            got2.view(torch.uint8) if got2.dtype == expected.dtype else got2.float(),
            expected.view(torch.uint8) if got2.dtype == expected.dtype else expected.float(),
        ):
            state.fail(
                "round_trip",
                where,
                f"read({what}) after write differs from the {spec.name!r} layout's own "
                "quantize/dequantize of the same values",
            )
        error = (expected.float() - given.float()).abs()
        if spec.max_error is not None:  # the layout's own per-value bound
            _, scale_rows = gather_rows(spec, scratch, loc, page)
            bound = spec.max_error(given.float(), scale_rows)
        else:  # a coarse bound: catches ignored scales and garbage, not last bits
            bound = torch.full_like(error, 0.35 * given.float().abs().max().item())
        if bool((error > bound).any()):
            worst = int((error - bound).argmax())
            state.fail(
                "round_trip",
                where,
                f"the {what} round trip error {error.flatten()[worst].item():.4g} exceeds the "
                f"{spec.name!r} layout's bound ({bound.flatten()[worst].item():.4g})",
            )
    owned: dict[tuple[str, int], list[torch.Tensor]] = {}
    for spec, buf in zip(specs, buffers, strict=True):
        owned.setdefault(_storage_key(buf), []).append(_owned_bytes(spec, buf, loc.cpu(), page))
    for key, (storage, before) in saved.items():
        after = torch.empty(0, dtype=torch.uint8, device=before.device).set_(storage)
        changed = (after != before).nonzero().flatten().cpu()
        allowed = torch.cat(owned.get(key, [torch.empty(0, dtype=torch.long)]))
        stray = changed[~torch.isin(changed, allowed)]
        if stray.numel():
            state.fail(
                "round_trip",
                where,
                f"write changed {stray.numel()} byte(s) outside the written tokens' rows "
                f"(first at storage byte {int(stray[0])})",
            )


# -- inspection --------------------------------------------------------------------------------


def _check_inspection(  # noqa: PLR0912 -- one branch per finding
    state: _State,
    adapter: KVPoolProtocol,
    leaves: list[tuple[str, KVPoolProtocol]],
    reachable: dict[tuple[str, int], str],
) -> None:
    from kvcompat.inspection import describe, memory_report, transfer_descriptors  # noqa: PLC0415

    getter_tensors: list[tuple[str, torch.Tensor]] = []
    for label, leaf in leaves:
        for layer in leaf.layer_ids:
            try:
                getter_tensors.append(
                    (f"{label} layer {layer}", leaf.get_key_buffer(layer, wait=False))
                )
                if leaf.kind.has_values:
                    getter_tensors.append(
                        (f"{label} layer {layer} value", leaf.get_value_buffer(layer, wait=False))
                    )
            except Exception:  # noqa: BLE001, PERF203, S112 -- the getters check reports it
                continue
    try:
        manifest = describe(adapter)
    except Exception as exc:  # noqa: BLE001 -- a failure is a finding
        state.fail("describe", "pool", f"describe raised {type(exc).__name__}: {exc}")
    else:
        entries = list(manifest.iter_tensors())
        described = {(e.device, e.storage_ptr) for e in entries}
        named = {(e.device, e.storage_ptr) for e in entries if e.role.value != "opaque"}
        for storage, path in reachable.items():
            if storage not in described and storage[1] != 0:
                state.fail("describe", path, "a tensor the pool holds is missing from describe()")
        for where, tensor in getter_tensors:
            if _storage_key(tensor) not in named:
                state.fail(
                    "describe",
                    where,
                    "the getter's storage is described only as opaque (or not at all); "
                    "declare the adapter's buffers (see docs/extending.md)",
                )
    try:
        descriptors = transfer_descriptors(adapter)
    except Exception as exc:  # noqa: BLE001 -- a failure is a finding
        state.fail(
            "descriptors", "pool", f"transfer_descriptors raised {type(exc).__name__}: {exc}"
        )
    else:
        spans = [(d.device, d.ptr, d.ptr + d.length) for d in descriptors]
        for where, tensor in getter_tensors:
            first = int(tensor.data_ptr())
            device = str(tensor.device)
            if tensor.numel() and not any(
                dev == device and lo <= first < hi for dev, lo, hi in spans
            ):
                state.fail(
                    "descriptors", where, "no transfer descriptor covers the getter's storage"
                )
    try:
        memory_report(adapter)
    except Exception as exc:  # noqa: BLE001 -- a failure is a finding
        state.fail("memory_report", "pool", f"memory_report raised {type(exc).__name__}: {exc}")
