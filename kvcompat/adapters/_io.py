"""Reading and writing pool values by token index, on top of the layout codecs.

A leaf adapter declares each layer's byte layout (its ``detect_layout`` hook, built
from :func:`mha_layer_layout`, :func:`latent_layer_layout` or
:func:`packed_layer_layout` for SGLang's families); reads
dequantize rows at token locations into dense ``[n, heads, dim]`` tensors and
writes quantize dense values into rows, through :mod:`kvcompat.layouts` (the
torch twin, or a Triton kernel on CUDA). Every write is all-or-nothing: the
layer id, locations, shapes, dtypes and values of *every* buffer it touches
are checked before the first byte moves, every part is encoded before the
first scatter, and a fault during the scatters puts the old bytes back
(:func:`kvcompat.layouts._codec.commit`; see ``docs/atomic-writes.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from kvcompat._errors import LayoutError, WriteError
from kvcompat._ops import (
    BufferPlan,
    check_impl,
    check_write,
    plan_buffer,
    quantize_planned,
    read_planned,
)
from kvcompat._protocol import Impl
from kvcompat.layouts import (
    UNIFORM_FP8,
    V4,
    LayoutSpec,
    dsa_fp8_layout,
    get_layout,
    mha_layout,
    mla_layout,
)
from kvcompat.layouts._registry import KV_LAYOUT_NAMES
from kvcompat.layouts._validate import check_loc, check_values

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "Impl",
    "LayerLayout",
    "latent_layer_layout",
    "mha_layer_layout",
    "packed_layer_layout",
    "read_rows",
    "write_rows",
]


@dataclass(frozen=True)
class LayerLayout:
    """The byte layouts of one layer's buffers.

    Attributes:
        key: layout of the key buffer.
        value: layout of a *separate* value buffer (split pools), else None.
        value_dim: for latent pools, the leading columns of the key row that are the
            value (``kv_lora_rank``); None otherwise.
        fnuz: the pool stores ROCm ``float8_e4m3fnuz`` bytes (V4 only).

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import ReferenceMLATokenToKVPool
        >>> pool = kvcompat.adapt(ReferenceMLATokenToKVPool(size=16, page_size=16))
        >>> lay = pool.layout(0)
        >>> lay.key.name, lay.value, lay.value_dim
        ('mla_512+64_bf16', None, 512)
    """

    key: LayoutSpec
    value: LayoutSpec | None = None
    value_dim: int | None = None
    fnuz: bool = False
    _plans: dict[str, BufferPlan] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """The buffers' plans (:func:`kvcompat._ops.plan_buffer`), by role, made on first use."""

    def _plan_for(
        self, role: str, spec: LayoutSpec, buf: torch.Tensor, page_size: int
    ) -> BufferPlan | None:
        """The plan of the layer's ``role`` ("key" or "value") buffer ``buf``, or None.

        Made on the first read or write of the buffer, kept (``_keep``) once that call
        has succeeded (a call that raises leaves nothing behind), and reused while the
        adapter hands out the same tensor; the adapter makes a new LayerLayout when its
        buffers change.
        """
        found = self._plans.get(role)
        if found is not None and found.holds(buf):
            return found
        return plan_buffer(spec, buf, page_size, fnuz=self.fnuz)

    def _keep(self, role: str, plan: BufferPlan | None) -> None:
        """Keep ``plan`` for the next calls (after the call that made it succeeded)."""
        if plan is not None and self._plans.get(role) is not plan:
            self._plans[role] = plan


def _shape_error(owner: str, what: str, shape: Sequence[int], hint: str) -> LayoutError:
    msg = f"{owner}: cannot tell the byte layout of {what} with shape {tuple(shape)}.\nHint: {hint}"
    return LayoutError(msg)


def mha_layer_layout(
    native: Any, key: torch.Tensor, value: torch.Tensor | None, owner: str
) -> LayerLayout:
    """Token-major MHA rows: ``[rows, heads, head_dim]`` keys (and values, when given).

    What :class:`~kvcompat.adapters.SplitAdapter` and
    :class:`~kvcompat.adapters.KeyOnlyAdapter` declare as their ``detect_layout``;
    ``value`` is None for a key-only pool.

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool
        >>> native = ReferenceMHATokenToKVPool(size=16, page_size=16, layer_num=1)
        >>> lay = mha_layer_layout(native, native.k_buffer[0], native.v_buffer[0], "demo")
        >>> lay.key.name, lay.value is not None
        ('mha_1x128_bf16', True)
    """
    dtype: torch.dtype = native.dtype
    if key.dim() != 3:
        raise _shape_error(
            owner,
            "the key buffer",
            key.shape,
            "only token-major (NHD) MHA buffers [rows, heads, head_dim] can be read; "
            f"this pool's kv_cache_layout is {getattr(native, 'kv_cache_layout', '?')!r}.",
        )
    key_spec = mha_layout(int(key.shape[1]), int(key.shape[2]), dtype)
    if value is None:
        return LayerLayout(key_spec)
    if value.dim() != 3:
        raise _shape_error(owner, "the value buffer", value.shape, "see the key buffer.")
    return LayerLayout(key_spec, mha_layout(int(value.shape[1]), int(value.shape[2]), dtype))


def latent_layer_layout(native: Any, key: torch.Tensor, owner: str) -> LayerLayout:
    """One latent row per token (MLA), or DSA's packed fp8 row (``dsa_kv_cache_store_fp8``).

    What :class:`~kvcompat.adapters.LatentAdapter` declares as its ``detect_layout``.

    Example:
        >>> from kvcompat.testing import ReferenceMLATokenToKVPool
        >>> native = ReferenceMLATokenToKVPool(size=16, page_size=16, layer_num=1)
        >>> latent_layer_layout(native, native.kv_buffer[0], "demo").key.name
        'mla_512+64_bf16'
    """
    rank = int(native.kv_lora_rank)
    if getattr(native, "dsa_kv_cache_store_fp8", False):
        spec = dsa_fp8_layout(rank, int(native.qk_rope_head_dim))
        if spec.bytes_per_token != key.shape[-1] * key.element_size():
            raise _shape_error(
                owner,
                "the packed DSA row",
                key.shape,
                f"expected {spec.bytes_per_token} bytes per token for the DSA fp8 row.",
            )
        # The value is the first kv_lora_rank *bytes* (e4m3 codes) of the packed row.
        return LayerLayout(spec, value_dim=rank)
    width = int(key.shape[-1])
    return LayerLayout(mla_layout(rank, width - rank, native.dtype), value_dim=rank)


def packed_layer_layout(native: Any, key: torch.Tensor, owner: str) -> LayerLayout:
    """DeepSeek-V4 packed pages: the ``KVLayout`` the pool names, checked against its pages.

    What :class:`~kvcompat.adapters.SingleKVAdapter` declares as its ``detect_layout``.

    Example:
        >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
        >>> native = ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64)
        >>> packed_layer_layout(native, native.kv_buffer[0], "demo").key.name
        'v4'
    """
    return LayerLayout(_single_kv_layout(native, key, owner), fnuz=_is_fnuz(native.dtype))


def _is_fnuz(dtype: torch.dtype) -> bool:
    return dtype == getattr(torch, "float8_e4m3fnuz", None)


def _single_kv_layout(native: Any, key: torch.Tensor, owner: str) -> LayoutSpec:
    page_size = int(native.page_size)
    row_bytes = int(key.shape[-1]) * key.element_size() if key.dim() == 2 else -1
    if key.dim() == 2 and key.dtype == torch.float8_e4m3fn and row_bytes == page_size * 512:
        # DeepSeekV4UniformFP8KVPool stores e4m3 directly; its kv_layout attribute still
        # reads V4, so the geometry decides.
        return UNIFORM_FP8
    named = getattr(native, "kv_layout", None)
    try:
        spec = V4 if named is None else get_layout(named)
    except LayoutError:
        spec = V4
    if row_bytes != spec.page_bytes(page_size):
        candidates = [
            name for name in KV_LAYOUT_NAMES if get_layout(name).page_bytes(page_size) == row_bytes
        ]
        msg = (
            f"{owner}: its pages are {row_bytes} bytes at page_size={page_size}, which does "
            f"not match the {spec.name!r} layout ({spec.page_bytes(page_size)} bytes per page); "
            f"layouts with that page size: {candidates or 'none'}.\n"
            "Hint: the pool's kv_layout attribute must name the layout its buffers hold."
        )
        raise LayoutError(msg)
    return spec


def read_rows(
    spec: LayoutSpec,
    buf: torch.Tensor,
    loc: torch.Tensor,
    page_size: int,
    *,
    heads: int,
    fnuz: bool,
    validate: bool,
    impl: Impl,
    out: torch.Tensor | None = None,
    layout: LayerLayout | None = None,
    role: str = "key",
) -> torch.Tensor:
    """Dequantize rows ``loc`` of one buffer into ``[n, heads, dim // heads]``.

    With the layer's ``layout``, plain rows go through the buffer's plan
    (``LayerLayout._plan_for``): the same checks and bytes, less work per call.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import mha_layout
        >>> k = torch.arange(32 * 4, dtype=torch.float32).view(32, 2, 2)
        >>> read_rows(mha_layout(2, 2, torch.float32), k, torch.tensor([1]), 16,
        ...           heads=2, fnuz=False, validate=True, impl="auto").tolist()
        [[[4.0, 5.0], [6.0, 7.0]]]
    """
    check_impl(impl)
    planned = layout is not None and not torch.compiler.is_compiling()
    plan = layout._plan_for(role, spec, buf, page_size) if planned else None  # type: ignore[union-attr]
    flat = None if out is None else out.view(out.shape[0], -1)
    dense = read_planned(
        plan, spec, buf, loc, page_size, fnuz=fnuz, validate=validate, impl=impl, out=flat
    )
    if planned:
        layout._keep(role, plan)  # type: ignore[union-attr]
    if out is not None:
        return out
    return dense.view(dense.shape[0], heads, spec.dim // heads)


class _Planned(NamedTuple):
    spec: LayoutSpec
    buf: torch.Tensor
    rows: torch.Tensor
    loc: torch.Tensor
    plan: BufferPlan | None = None
    given: object = None
    """The caller's ``loc``, which ``loc`` is the checked form of (None: not checked)."""
    layout: LayerLayout | None = None
    role: str = "key"


def plan_write(
    spec: LayoutSpec,
    buf: torch.Tensor,
    loc: torch.Tensor,
    values: Any,
    page_size: int,
    *,
    what: str,
    owner: str,
    check_finite: bool,
    validate: bool,
    layout: LayerLayout | None = None,
    role: str = "key",
    checked: _Planned | None = None,
) -> _Planned:
    """Validate one buffer's part of a write; nothing is written here.

    With the layer's ``layout``, a part of plain rows is checked through its buffer's
    plan (the geometry was checked when the plan was made), and the locations are
    checked once per write: a part whose buffer holds as many tokens as ``checked``'s
    reuses its checked locations.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import V4
        >>> buf = torch.zeros(1, V4.page_bytes(64), dtype=torch.uint8)
        >>> plan_write(V4, buf, torch.tensor([2]), torch.zeros(1, 1, 512), 64, what="key",
        ...            owner="demo", check_finite=True, validate=True).rows.shape
        torch.Size([1, 512])
    """
    if not isinstance(values, torch.Tensor):
        msg = (
            f"{owner}: the {what} to write must be a torch.Tensor, got {type(values).__name__}.\n"
            f"Hint: pass a [n, heads, head_dim] (or [n, dim]) tensor of {what}s."
        )
        raise WriteError(msg)
    planned = layout is not None and not torch.compiler.is_compiling()
    plan = layout._plan_for(role, spec, buf, page_size) if planned else None  # type: ignore[union-attr]
    if not validate:
        rows = values.reshape(values.shape[0], spec.dim)
        rows = rows.detach() if rows.requires_grad else rows
        return _Planned(spec, buf, rows, loc.long(), plan, None, layout, role)
    try:
        if plan is None:  # not plain rows (or under torch.compile): the general checks
            rows, loc64 = check_write(spec, buf, loc, values, page_size, check_finite=check_finite)
            return _Planned(spec, buf, rows, loc64)
        if (
            checked is not None
            and checked.given is loc
            and checked.plan is not None
            and checked.plan.capacity == plan.capacity
            and checked.loc.device == buf.device
        ):
            loc64 = checked.loc
        else:
            loc64 = check_loc(
                loc, capacity=plan.capacity, device=buf.device, error=WriteError, unique=True
            )
        rows = check_values(spec, values, loc64.numel(), buf.device, check_finite=check_finite)
    except WriteError as exc:
        msg = f"{owner}: writing the {what}: {exc}"
        raise WriteError(msg) from None
    return _Planned(spec, buf, rows, loc64, plan, loc, layout, role)


def write_rows(
    plans: Sequence[_Planned], page_size: int, *, fnuz: bool, check_finite: bool, impl: Impl
) -> None:
    """Quantize and store every validated part of a write, all or nothing (no further checks).

    Every part is encoded before the first byte moves; values that alias any of the
    parts' buffers are copied first. ``check_finite`` was applied by :func:`plan_write`.

    Example:
        >>> import torch
        >>> from kvcompat.layouts import V4
        >>> buf = torch.zeros(1, V4.page_bytes(64), dtype=torch.uint8)
        >>> plan = plan_write(V4, buf, torch.tensor([2]), torch.ones(1, 512), 64, what="key",
        ...                   owner="demo", check_finite=True, validate=True)
        >>> write_rows([plan], 64, fnuz=False, check_finite=True, impl="auto")
        >>> int(buf.count_nonzero()) > 0
        True
    """
    check_impl(impl)
    quantize_planned(
        [(part.spec, part.rows, part.buf, part.loc) for part in plans],
        [part.plan for part in plans],
        page_size,
        fnuz=fnuz,
        impl=impl,
    )
    for part in plans:
        if part.layout is not None:
            part.layout._keep(part.role, part.plan)
