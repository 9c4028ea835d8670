"""What every adapter answers the same way: metadata read live from the native pool."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["AdapterBase"]


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
