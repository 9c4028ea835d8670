"""What every adapter answers the same way: metadata read live from the native pool."""

from __future__ import annotations

import inspect
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

from kvcompat._errors import PoolStateError

__all__ = ["AdapterBase", "Buffer", "require_attrs"]


def _absent(native: Any, name: str) -> bool:
    try:
        found = inspect.getattr_static(native, name)
    except AttributeError:
        if inspect.getattr_static(type(native), "__getattr__", None) is None:
            return True
        return not hasattr(native, name)  # served by a __getattr__ only: the one code run
    if isinstance(found, types.MemberDescriptorType):  # a __slots__ entry, maybe unset
        return not hasattr(native, name)  # a slot read runs no user code
    return False


def require_attrs(native: Any, names: Sequence[str], *, reader: str) -> None:
    """Raise :class:`~kvcompat.PoolStateError` naming every attribute of ``names`` ``native`` lacks.

    The one check of what an adapter reads from its pool, run before anything is read,
    so a pool caught half-built (or after its attributes were deleted) is refused with
    the names of *all* the missing attributes, never with whichever one happened to be
    read first. Presence is tested with ``inspect.getattr_static``: no property runs.

    Args:
        native: the engine's pool.
        names: the attributes ``reader`` needs.
        reader: who reads them, for the message (``"kvcompat's SplitAdapter"``).

    Example:
        >>> from types import SimpleNamespace
        >>> from kvcompat.adapters._base import require_attrs
        >>> try:
        ...     require_attrs(SimpleNamespace(k_buffer=[]), ("k_buffer", "dtype"), reader="X")
        ... except Exception as exc:
        ...     print(str(exc).split(",")[0])
        SimpleNamespace has no attribute 'dtype'
    """
    missing = [name for name in dict.fromkeys(names) if _absent(native, name)]
    if not missing:
        return
    listed = ", ".join(repr(name) for name in missing)
    noun = "attribute" if len(missing) == 1 else "attributes"
    msg = (
        f"{type(native).__qualname__} has no {noun} {listed}, which {reader} reads: the "
        "pool is half-built (caught before its constructor returned), or its buffers were "
        "released or not allocated.\n"
        "Hint: adapt the pool after its constructor has returned; after _clear_buffers(), "
        "adapt it again once it has buffers."
    )
    raise PoolStateError(msg)


@dataclass(frozen=True)
class Buffer:
    """One native buffer an adapter declares, for ``describe``, ``memory_report`` and transfers.

    A leaf adapter lists its pool's buffers in :attr:`AdapterBase.buffers`; kvcompat's
    inspection reads them from there (attribute reads only, never a getter), so a pool
    taught with :func:`kvcompat.register_adapter` is described, sized and transferred
    like a built-in one. Tensors the pool holds that no declaration names are reported
    as ``opaque``.

    Attributes:
        attr: attribute path from the native pool (``"k_buffer"``, ``"cache.pages"``):
            a per-layer list of tensors, or one tensor.
        role: what it holds, a :class:`kvcompat.inspection.Role` value (``"key"``,
            ``"value"``, ``"latent"``, ``"packed_kv"``, ``"index_keys"``, ``"key_scales"``...).
        group: the :class:`kvcompat.inspection.TransferGroup` value its ranges belong to
            (``"kv"``, ``"state"``, ``"kv_scale"``...), or None when it is not transferred.
        rows: whether the leading axis counts tokens or pages (``"auto"``: tokens when it
            has ``size + page_size`` rows).
        value_prefix: native attribute naming the width of a value view on the leading
            columns of this buffer (MLA's ``kv_lora_rank``), or None.

    Example:
        >>> from kvcompat.adapters import Buffer
        >>> Buffer("pages", "packed_kv", rows="page")
        Buffer(attr='pages', role='packed_kv', group='kv', rows='page', value_prefix=None)
    """

    attr: str
    role: str
    group: str | None = "kv"
    rows: Literal["token", "page", "auto"] = "auto"
    value_prefix: str | None = None


class AdapterBase:
    """Metadata shared by leaf and composite adapters (subclasses set ``_native``, ``_name``).

    Example:
        >>> import kvcompat
        >>> from kvcompat.adapters import AdapterBase
        >>> from kvcompat.testing import reference_swa_pool
        >>> isinstance(kvcompat.adapt(reference_swa_pool()), AdapterBase)
        True
    """

    __slots__ = ()
    _native: Any
    _name: str
    buffers: ClassVar[tuple[Buffer, ...]] = ()
    """The native buffers this adapter's pools keep (see :class:`Buffer`)."""

    def _native_attr(self, name: str) -> Any:
        """``native.<name>``; a missing one is a :class:`~kvcompat.PoolStateError` naming it."""
        try:
            return getattr(self._native, name)
        except AttributeError:
            reader = f"kvcompat's {type(self).__name__} ({self._name})"
            require_attrs(self._native, (name,), reader=reader)
            raise  # present, but its getter raised: not ours to rename

    @property
    def name(self) -> str:
        """The native class name, or the component name inside a composite.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import reference_swa_pool
            >>> pool = kvcompat.adapt(reference_swa_pool())
            >>> pool.name, pool.components["swa"].name
            ('ReferenceSWAKVPool', 'swa')
        """
        return self._name

    @property
    def size(self) -> int:
        """Token capacity as the native pool reports it (``pool.size``), read live.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> kvcompat.adapt(ReferenceMHATokenToKVPool(size=16, page_size=16)).size
            16
        """
        return int(self._native_attr("size"))

    @property
    def page_size(self) -> int:
        """Tokens per page.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> kvcompat.adapt(ReferenceMHATokenToKVPool(size=16, page_size=8)).page_size
            8
        """
        return int(self._native_attr("page_size"))

    @property
    def dtype(self) -> torch.dtype:
        """Logical element dtype (``float8_e4m3fn`` even when stored as ``uint8``).

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
            >>> kvcompat.adapt(ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64)).dtype
            torch.float8_e4m3fn
        """
        dtype: torch.dtype = self._native_attr("dtype")
        return dtype

    @property
    def native(self) -> Any:
        """The wrapped native pool object, unchanged.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> native = ReferenceMHATokenToKVPool(size=16, page_size=16)
            >>> kvcompat.adapt(native).native is native
            True
        """
        return self._native

    # -- many layers (plan: LeafAdapter.plan, CompositeAdapter.plan) -------------

    def plan(self, layers: Sequence[int] | None = None, /) -> Any:
        """Plan reads and writes of several layers at once (``LeafAdapter.plan``).

        Leaf and composite adapters implement it; an adapter class of your own that
        derives from neither says so here.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> pool = kvcompat.adapt(ReferenceMHATokenToKVPool(size=16, page_size=1,
            ...                                                 layer_num=2))
            >>> pool.plan([1]).layers
            (1,)
        """
        msg = f"{type(self).__name__} does not implement plan(layers)."
        raise NotImplementedError(msg)

    def read_layers(
        self,
        layers: Sequence[int] | None,
        loc: torch.Tensor,
        /,
        *,
        out: torch.Tensor | None = None,
        wait: bool = True,
        validate: bool = True,
        impl: Literal["auto", "torch", "triton"] = "auto",
    ) -> torch.Tensor:
        """Dense keys of tokens ``loc`` on each of ``layers``: ``[layers, n, heads, head_dim]``.

        ``pool.plan(layers).read(loc, ...)``, through a plan the adapter keeps: the same
        values as one ``read`` per layer, checked once and moved in one launch.

        Example:
            >>> import torch, kvcompat
            >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
            >>> pool = kvcompat.adapt(ReferenceDeepSeekV4SingleKVPool(size=128, page_size=64,
            ...                                                       layer_num=3))
            >>> pool.read_layers(None, torch.tensor([1, 2])).shape
            torch.Size([3, 2, 1, 512])
        """
        step = self.plan(layers)
        dense: torch.Tensor = step.read(loc, out=out, wait=wait, validate=validate, impl=impl)
        return dense

    def write_layers(
        self,
        layers: Sequence[int] | None,
        loc: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor | None = None,
        /,
        *,
        check_finite: bool = True,
        validate: bool = True,
        impl: Literal["auto", "torch", "triton"] = "auto",
    ) -> None:
        """Store ``key[i]`` (and ``value[i]``) at ``loc`` of layer ``layers[i]`` — all or nothing.

        ``pool.plan(layers).write(loc, key, value, ...)``, through a plan the adapter
        keeps. Nothing is written unless every layer's part passes its checks.

        Example:
            >>> import torch, kvcompat
            >>> from kvcompat.testing import ReferenceMLATokenToKVPool
            >>> pool = kvcompat.adapt(ReferenceMLATokenToKVPool(size=16, page_size=16,
            ...                                                 layer_num=2))
            >>> pool.write_layers([0, 1], torch.tensor([3]), torch.ones(2, 1, 1, 576))
            >>> pool.read(1, torch.tensor([3]))[0, 0, :2].tolist()
            [1.0, 1.0]
        """
        self.plan(layers).write(
            loc, key, value, check_finite=check_finite, validate=validate, impl=impl
        )
