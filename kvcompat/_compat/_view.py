"""Logical views: token-row buffers over packed storage, for code written against MHA pools.

A :class:`LogicalView` is what :func:`kvcompat.compat` hands out for a layer whose storage is
not plain token rows (DeepSeek-V4 pages, DSA's packed fp8 row, the V4 indexer). It is a
``torch.Tensor`` subclass without storage of its own (a wrapper subclass) that reports the
*logical* geometry a token-row backend expects -- ``[rows, heads, head_dim]`` of the layout's
output dtype -- and answers exactly two kinds of use through kvcompat's codecs:

* a gather by token index (``view[loc]``, ``view[a:b]``, ``view[i]``, ``view[loc, h]``,
  ``view.index_select(0, loc)``, ``torch.index_select(view, 0, loc)``) returns a new, dense
  tensor read through the pool's key-first ``read``;
* an index assignment of whole rows (``view[loc] = x``) quantizes and stores through the
  pool's all-or-nothing ``write``.

Metadata (``shape``, ``dtype``, ``device``, ``size()``, ``dim()``, ``len()``, ``numel()``)
answers logically. Everything else -- a kernel call, ``data_ptr()``, ``view()``, ``stride()``,
arithmetic on the whole pool -- raises :class:`CompatViewError` naming the operation and the
key-first call to use; nothing ever sees the packed bytes as token rows. The raw storage stays
reachable explicitly: ``view.storage_tensor``.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from kvcompat._compat._locs import LocSpace
from kvcompat._errors import KVCompatError, LayoutError, WriteError
from kvcompat._protocol import KVPoolProtocol, PoolKind
from kvcompat.layouts._plain import PLAIN_CODEC

__all__ = ["CompatViewError", "LogicalView", "ViewPlan", "plan_views"]


class CompatViewError(KVCompatError, RuntimeError):
    """An operation on a compat logical view that would treat packed bytes as token rows.

    A ``RuntimeError``, not a ``TypeError``: torch turns a ``TypeError`` raised by an
    operator override into ``NotImplemented``, which would hide the message.

    Example:
        >>> import kvcompat
        >>> from kvcompat.compat import CompatViewError
        >>> issubclass(CompatViewError, (kvcompat.KVCompatError, RuntimeError))
        True
    """


CompatViewError.__module__ = "kvcompat.compat"  # where users import it from


@dataclass(frozen=True)
class ViewPlan:
    """What one layer's views look like: logical geometry plus where reads go.

    Attributes:
        rows: addressable token rows (``view.shape[0]``).
        heads: key heads; ``key_dim``/``value_dim``: per-head dims (``value_dim`` None for a
            key-only pool).
        dtype: the dense dtype reads return (the layout's output dtype).
        layout: the layout's name, for messages.
        value_cols: latent pools: the value is the first ``value_cols`` columns of the key.
        codec_error: when kvcompat has no codec for the storage, the error every read raises.
    """

    rows: int
    heads: int
    key_dim: int
    value_dim: int | None
    dtype: torch.dtype
    layout: str
    bytes_per_token: int | None
    value_cols: int | None = None
    codec_error: str | None = None


def _leaf_kind(adapter: KVPoolProtocol, layer_id: int) -> PoolKind:
    if adapter.kind is not PoolKind.COMPOSITE:
        return adapter.kind
    part = adapter.component_for(layer_id)
    return adapter.kind if part is None else adapter.components[part].kind


def plan_views(adapter: KVPoolProtocol, layer_id: int, storage: torch.Tensor) -> ViewPlan | None:
    """The views for ``layer_id``, or None where the native tensors already are token rows.

    Split (MHA-family) pools, and latent or key-only pools whose rows are plain elements
    (bf16/fp8 MLA, K-only MHA) keep their native tensors: indexing them by token already
    gives the values. Every packed layout gets a view.

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
        >>> pool = kvcompat.adapt(ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64))
        >>> plan = plan_views(pool, 0, pool.get_key_buffer(0))
        >>> plan.rows, plan.heads, plan.key_dim, plan.value_dim, plan.dtype
        (128, 1, 512, 512, torch.bfloat16)
    """
    kind = _leaf_kind(adapter, layer_id)
    if kind is PoolKind.SPLIT:
        return None
    try:
        layout = adapter.layout(layer_id)
    except LayoutError as exc:
        return _opaque_plan(adapter, layer_id, storage, kind, exc)
    spec = layout.key
    if spec.codec is PLAIN_CODEC and storage.dim() == 3:
        return None
    rows = int(storage.shape[0]) * spec.tokens_per_row(adapter.page_size)
    heads = spec.heads
    key_dim = spec.dim // heads
    value_dim: int | None = None
    value_cols = None
    if kind.has_values:
        value_cols = layout.value_dim
        value_dim = key_dim if value_cols is None else value_cols // heads
    return ViewPlan(
        rows=rows,
        heads=heads,
        key_dim=key_dim,
        value_dim=value_dim,
        dtype=spec.output_dtype,
        layout=spec.name,
        bytes_per_token=spec.bytes_per_token,
        value_cols=value_cols,
    )


def _opaque_plan(
    adapter: KVPoolProtocol,
    layer_id: int,
    storage: torch.Tensor,
    kind: PoolKind,
    exc: LayoutError,
) -> ViewPlan:
    """A view for storage kvcompat has no codec for (the V4 indexer keys): reads refuse."""
    part = adapter.component_for(layer_id)
    native = (adapter if part is None else adapter.components[part]).native
    dim = getattr(native, "index_head_dim", None)
    if kind is not PoolKind.KEY_ONLY or dim is None:
        raise exc
    rows = int(storage.shape[0]) * (adapter.page_size if storage.dim() == 2 else 1)
    dtype: torch.dtype = adapter.dtype
    return ViewPlan(
        rows=rows,
        heads=1,
        key_dim=int(dim),
        value_dim=None,
        dtype=dtype,
        layout="dsv4 indexer keys",
        bytes_per_token=None,
        codec_error=str(exc),
    )


def _allowed() -> frozenset[Any]:
    tensor: Any = torch.Tensor
    getters: tuple[str, ...] = ("shape", "dtype", "device", "ndim", "is_cuda", "is_cpu")
    getters += ("layout", "requires_grad", "is_sparse", "is_quantized", "is_meta", "is_nested")
    methods: tuple[str, ...] = ("size", "dim", "ndimension", "numel", "nelement", "__len__")
    methods += ("element_size", "__hash__", "get_device", "is_floating_point", "is_complex")
    return frozenset(
        [getattr(tensor, name).__get__ for name in getters]
        + [getattr(tensor, name) for name in methods]
    )


_ALLOWED = _allowed()
_GATHERS = frozenset([torch.Tensor.__getitem__, torch.Tensor.index_select, torch.index_select])
_SETITEM = torch.Tensor.__setitem__


def _op_name(func: Any) -> str:
    if type(func).__module__ == "torch._ops":
        return str(func)
    if getattr(func, "__name__", None) == "__get__" and hasattr(func, "__self__"):
        return f"Tensor.{func.__self__.__name__}"
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or str(func)
    name = str(name).replace("_VariableFunctionsClass.", "torch.")
    name = name.replace("_TensorBase.", "Tensor.").replace("TensorBase.", "Tensor.")
    if "." not in name and getattr(func, "__module__", None) == "torch":
        name = f"torch.{name}"
    return name if name.startswith("aten") or name.endswith(")") else f"{name}()"


class LogicalView(torch.Tensor):
    """A layer's keys or values as logical token rows over packed storage (see module doc).

    Example:
        >>> import torch, kvcompat
        >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
        >>> pool = kvcompat.compat(ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64))
        >>> k = pool.get_key_buffer(0)
        >>> k.shape, k.dtype                      # logical, not [pages, 37440] bytes
        (torch.Size([128, 1, 512]), torch.bfloat16)
        >>> k[torch.tensor([3, 4])] = torch.ones(2, 1, 512)   # quantizes through write()
        >>> k[torch.tensor([3, 4])].sum().item()               # dense values through read()
        1024.0
        >>> k.storage_tensor.shape                # the raw pages, reachable explicitly
        torch.Size([2, 37440])
    """

    _kv_adapter: KVPoolProtocol
    _kv_layer: int
    _kv_role: str
    _kv_plan: ViewPlan
    _kv_storage: torch.Tensor
    _kv_space: LocSpace
    __torch_function_priority__: ClassVar[float] = 100.0

    @staticmethod
    def __new__(
        cls: type[LogicalView],
        adapter: KVPoolProtocol,
        layer_id: int,
        role: str,
        plan: ViewPlan,
        storage: torch.Tensor,
        space: LocSpace | None = None,
    ) -> LogicalView:
        dim = plan.key_dim if role == "key" else plan.value_dim
        assert dim is not None
        make: Any = torch.Tensor._make_wrapper_subclass
        view: LogicalView = make(
            cls, (plan.rows, plan.heads, dim), dtype=plan.dtype, device=storage.device
        )
        view._kv_adapter = adapter
        view._kv_layer = layer_id
        view._kv_role = role
        view._kv_plan = plan
        view._kv_storage = storage
        view._kv_space = LocSpace(plan.rows, describe="token slots") if space is None else space
        return view

    # -- explicit escapes ---------------------------------------------------------

    @property
    def storage_tensor(self) -> torch.Tensor:
        """The raw storage the view reads (packed pages or rows), as the native pool holds it.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
            >>> native = ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64)
            >>> view = kvcompat.compat(native).get_value_buffer(0)
            >>> view.storage_tensor.data_ptr() == native.kv_buffer[0].data_ptr()
            True
        """
        return self._kv_storage

    @property
    def kvcompat(self) -> KVPoolProtocol:
        """The key-first adapter the view reads and writes through.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
            >>> pool = kvcompat.compat(ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64))
            >>> pool.get_key_buffer(0).kvcompat is pool.kvcompat
            True
        """
        return self._kv_adapter

    def __repr__(self, *, tensor_contents: Any = None) -> Any:  # type: ignore[override]
        plan = self._kv_plan
        return (
            f"LogicalView(layer={self._kv_layer}, role={self._kv_role!r}, "
            f"shape={list(self.shape)}, dtype={plan.dtype}, layout={plan.layout!r}, "
            f"pool={self._kv_adapter.name!r})"
        )

    def __format__(self, spec: str) -> str:
        return repr(self)

    # -- torch's override protocol -------------------------------------------------

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _ALLOWED:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        if func in _GATHERS:
            return _gather(func, args, kwargs)
        if func is _SETITEM:
            _store(*args, **kwargs)
            return None
        view = next(a for a in _flat(args, kwargs) if isinstance(a, LogicalView))
        raise view._refuse(_op_name(func))

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]  # torch types it as a plain function
        cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        view = next((a for a in _flat(args, kwargs or {}) if isinstance(a, LogicalView)), None)
        if view is None:  # pragma: no cover - torch only dispatches here with a view
            msg = f"{func} reached a kvcompat logical view."
            raise CompatViewError(msg)
        raise view._refuse(str(func))

    # -- the two supported uses -------------------------------------------------------

    def _rows(self, index: Any, what: str) -> tuple[torch.Tensor, tuple[int, ...]]:
        """Token locations (1-D int64, on the storage's device) and the result's lead shape."""
        rows = self._kv_plan.rows
        device = self._kv_storage.device
        if isinstance(index, torch.Tensor):
            if index.dtype == torch.bool:
                if index.dim() != 1 or index.shape[0] != rows:
                    op = f"{what} with a boolean mask of shape {tuple(index.shape)}"
                    raise self._refuse(op)
                loc = index.nonzero().flatten()
                return loc.to(device), (int(loc.shape[0]),)
            if index.dtype.is_floating_point or index.dtype.is_complex:
                op = f"{what} with a {index.dtype} index"
                raise self._refuse(op)
            return index.reshape(-1).to(device=device, dtype=torch.long), tuple(index.shape)
        if isinstance(index, slice):
            start, stop, step = index.indices(rows)
            loc = torch.arange(start, stop, step, device=device, dtype=torch.long)
            return loc, (int(loc.shape[0]),)
        if isinstance(index, list):
            return self._rows(torch.tensor(index, dtype=torch.long), what)
        if not isinstance(index, bool):
            try:
                row = operator.index(index)
            except TypeError:
                pass
            else:
                if not -rows <= row < rows:
                    msg = (
                        f"index {row} is out of range for a logical view of {rows} token rows "
                        f"(layer {self._kv_layer}'s {self._kv_role}s, {self._kv_adapter.name})."
                    )
                    raise IndexError(msg)
                return torch.tensor([row % rows], device=device), ()
        op = f"{what} with index {index!r}"
        raise self._refuse(op)

    def _read(self, loc: torch.Tensor) -> torch.Tensor:
        plan = self._kv_plan
        if plan.codec_error is not None:
            msg = (
                f"reading layer {self._kv_layer}'s {self._kv_role}s ({self._kv_adapter.name}) "
                f"through a logical view: {plan.codec_error}"
            )
            raise LayoutError(msg)
        dim = plan.key_dim if self._kv_role == "key" else plan.value_dim
        if loc.numel() == 0:
            return torch.empty((0, plan.heads, dim or 0), dtype=plan.dtype, device=loc.device)
        what = f"a gather from layer {self._kv_layer}'s {self._kv_role}s ({self._kv_adapter.name})"
        rows = self._kv_space.storage_loc(loc, what=what, error=IndexError)
        dense = self._kv_adapter.read(self._kv_layer, rows, wait=False)
        if self._kv_role == "value" and plan.value_cols is not None:
            dense = dense[..., : plan.value_dim]
        return dense

    def _refuse(self, op: str) -> CompatViewError:
        plan = self._kv_plan
        dim = plan.key_dim if self._kv_role == "key" else plan.value_dim
        packed = (
            f"{plan.bytes_per_token} bytes per token" if plan.bytes_per_token else "packed bytes"
        )
        msg = (
            f"{op} on kvcompat's logical view of layer {self._kv_layer}'s {self._kv_role}s "
            f"({self._kv_adapter.name}): its storage is the {plan.layout!r} layout "
            f"({packed}), not [{plan.rows}, {plan.heads}, {dim}] {plan.dtype} token rows, so "
            f"{op} would see meaningless bytes.\n"
            "Hint: a gather by token index works (view[loc], view.index_select(0, loc)) and "
            "returns dense values; for a kernel, port to the key-first API: "
            f"pool.kvcompat.read_kv({self._kv_layer}, loc) / "
            f"pool.kvcompat.write({self._kv_layer}, loc, k, v); a layout-aware kernel takes "
            "the raw bytes explicitly: view.storage_tensor."
        )
        return CompatViewError(msg)


def _flat(args: Any, kwargs: Any) -> list[Any]:
    out: list[Any] = []
    for item in (*args, *kwargs.values()):
        if isinstance(item, (list, tuple)):
            out.extend(item)
        else:
            out.append(item)
    return out


def _gather(func: Any, args: Any, kwargs: Any) -> torch.Tensor:
    if func is torch.Tensor.__getitem__:
        view, index = args
        if not isinstance(view, LogicalView):  # pragma: no cover - dispatched on the view
            raise TypeError(type(view).__name__)
        rest: tuple[Any, ...] = ()
        if isinstance(index, tuple):
            if not index or index[0] is Ellipsis or index[0] is None:
                op = f"view[{index!r}] (index the token rows first)"
                raise view._refuse(op)
            index, rest = index[0], index[1:]
        loc, lead = view._rows(index, "view[...]")
        dense = view._read(loc)
        dense = dense.reshape(*lead, *dense.shape[1:])
        return dense[(slice(None),) * len(lead) + rest] if rest else dense
    params = dict(zip(("input", "dim", "index"), args, strict=False)) | kwargs
    view = params.get("input", params.get("self"))
    if not isinstance(view, LogicalView):
        other = next(a for a in _flat(args, kwargs) if isinstance(a, LogicalView))
        op = "index_select() with the view as the index"
        raise other._refuse(op)
    if set(params) - {"input", "self", "dim", "index"} or params.get("dim") not in (0, -3):
        op = f"index_select({', '.join(sorted(k for k in params if k != 'input'))})"
        raise view._refuse(op)
    index = params["index"]
    if not isinstance(index, torch.Tensor) or index.dim() > 1:
        op = "index_select() with a non-1-D index"
        raise view._refuse(op)
    loc, _ = view._rows(index, "index_select()")
    return view._read(loc)


def _store(view: Any, index: Any, value: Any) -> None:
    if not isinstance(view, LogicalView):
        other = next(a for a in (index, value) if isinstance(a, LogicalView))
        op = "assigning a logical view into a tensor"
        raise other._refuse(op)
    if isinstance(index, tuple):
        op = "view[rows, ...] = x (a partial-row write cannot be quantized)"
        raise view._refuse(op)
    if view._kv_role == "value" and view._kv_plan.value_cols is not None:
        op = (
            "view[loc] = x on a latent pool's value view (the value is part of the key row; "
            "assign whole rows through get_key_buffer())"
        )
        raise view._refuse(op)
    loc, lead = view._rows(index, "view[loc] = x")
    if not isinstance(value, torch.Tensor):
        op = f"view[loc] = {type(value).__name__} (assign a tensor of rows)"
        raise view._refuse(op)
    if isinstance(value, LogicalView):
        op = "reading a whole logical view as the assigned value"
        raise value._refuse(op)
    n = int(loc.shape[0])
    rows = value.reshape(n, -1) if value.numel() and value.shape[: len(lead)] == lead else value
    what = f"view[loc] = x on layer {view._kv_layer}'s {view._kv_role}s ({view._kv_adapter.name})"
    slots = view._kv_space.storage_loc(loc, what=what, error=WriteError)
    view._kv_adapter.write(view._kv_layer, slots, rows)
