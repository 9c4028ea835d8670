"""Errors raised by kvcompat.

Every error subclasses both :class:`KVCompatError` and the built-in exception a
caller already catches, so ``except IndexError`` (or ``NotImplementedError``,
``TypeError``, ``ValueError``) written against a native pool keeps working.
Messages say what was received, what was expected, and what to do instead.
"""

from __future__ import annotations

__all__ = [
    "KVCompatError",
    "LayerIdTypeError",
    "LayerOutOfRangeError",
    "LayoutError",
    "NoValueBufferError",
    "UnsupportedPoolError",
    "WriteError",
]


class KVCompatError(Exception):
    """Base class of every error kvcompat raises.

    Example:
        >>> import kvcompat
        >>> try:
        ...     kvcompat.adapt(object())
        ... except kvcompat.KVCompatError as exc:
        ...     print(type(exc).__name__)
        UnsupportedPoolError
    """


class LayerOutOfRangeError(KVCompatError, IndexError):
    """A layer id that the pool does not serve (or that is not an ``int``).

    kvcompat always takes absolute model layer ids. Unlike SGLang, whose
    ``buffer[layer_id - start_layer]`` silently reads another layer for ids below
    ``start_layer``, kvcompat raises this error and names the valid ids.

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool
        >>> pool = kvcompat.adapt(ReferenceMHATokenToKVPool(size=16, page_size=16, layer_num=2))
        >>> try:
        ...     pool.get_key_buffer(7)
        ... except IndexError as exc:
        ...     print(exc.args[0].splitlines()[0])
        layer id 7 is not served by ReferenceMHATokenToKVPool: valid layer ids are 0..1.
    """


class LayerIdTypeError(KVCompatError, TypeError):
    """A layer id that is not an integer (``bool``, ``float``, ``str``, ``None``, a tensor).

    ``True`` is rejected on purpose: it would silently mean layer 1. Tensors are
    rejected because converting a CUDA tensor synchronises the host.

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool
        >>> pool = kvcompat.adapt(ReferenceMHATokenToKVPool(size=16, page_size=16, layer_num=2))
        >>> try:
        ...     pool.get_key_buffer(1.0)
        ... except TypeError as exc:
        ...     print(exc.args[0].splitlines()[0])
        layer id must be an int, got float 1.0 (ReferenceMHATokenToKVPool).
    """


class NoValueBufferError(KVCompatError, NotImplementedError):
    """The pool stores no values (a key-only pool such as an index-key cache).

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool
        >>> issubclass(kvcompat.NoValueBufferError, NotImplementedError)
        True
    """


class UnsupportedPoolError(KVCompatError, TypeError):
    """An object that kvcompat does not recognise as a KV pool.

    Example:
        >>> import kvcompat
        >>> try:
        ...     kvcompat.adapt(42)
        ... except TypeError as exc:
        ...     print(exc.args[0].splitlines()[0])
        kvcompat does not know how to adapt an object of type builtins.int.
    """


class LayoutError(KVCompatError, ValueError):
    """A byte layout that kvcompat cannot detect or that does not fit the buffer.

    Example:
        >>> import kvcompat
        >>> issubclass(kvcompat.LayoutError, ValueError)
        True
    """


class WriteError(KVCompatError, ValueError):
    """A write rejected before any byte moved (bad locations, shapes or dtypes).

    Example:
        >>> import kvcompat
        >>> issubclass(kvcompat.WriteError, ValueError)
        True
    """
