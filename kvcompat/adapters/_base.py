"""What every adapter answers the same way: metadata read live from the native pool."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

__all__ = ["AdapterBase", "Buffer"]


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
        return int(self._native.size)

    @property
    def page_size(self) -> int:
        """Tokens per page.

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceMHATokenToKVPool
            >>> kvcompat.adapt(ReferenceMHATokenToKVPool(size=16, page_size=8)).page_size
            8
        """
        return int(self._native.page_size)

    @property
    def dtype(self) -> torch.dtype:
        """Logical element dtype (``float8_e4m3fn`` even when stored as ``uint8``).

        Example:
            >>> import kvcompat
            >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
            >>> kvcompat.adapt(ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64)).dtype
            torch.float8_e4m3fn
        """
        dtype: torch.dtype = self._native.dtype
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
