"""Errors raised by kvcompat.

Every error subclasses both :class:`KVCompatError` and the built-in exception a
caller already catches, so ``except IndexError`` (or ``NotImplementedError``,
``TypeError``, ``ValueError``) written against a native pool keeps working.
Messages say what was received, what was expected, and what to do instead.
"""

from __future__ import annotations

__all__ = [
    "ImplError",
    "KVCompatError",
    "KernelUnavailableError",
    "LayerIdTypeError",
    "LayerOutOfRangeError",
    "LayoutError",
    "NoValueBufferError",
    "PoolStateError",
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
        >>> class Cache: ...
        >>> try:
        ...     kvcompat.adapt(Cache())
        ... except TypeError as exc:
        ...     print(exc.args[0].splitlines()[0])  # doctest: +ELLIPSIS
        kvcompat does not know how to adapt an object of type ...Cache.
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


class PoolStateError(LayoutError, AttributeError):
    """The pool's buffers are gone or are not tensors any more.

    Raised when a buffer list an adapter reads was deleted (SGLang's
    ``_clear_buffers()``), never allocated (a half-built pool), or holds something
    other than tensors. It is a :class:`LayoutError` (``ValueError``, what
    :func:`kvcompat.adapt` raises for a pool it cannot read) and an
    ``AttributeError`` (what the native getters raise on a cleared pool).

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool
        >>> native = ReferenceMHATokenToKVPool(size=16, page_size=16, layer_num=1)
        >>> pool = kvcompat.adapt(native)
        >>> del native.k_buffer
        >>> try:
        ...     pool.get_key_buffer(0)
        ... except AttributeError as exc:
        ...     print(type(exc).__name__, exc.args[0].split(",")[0])
        PoolStateError ReferenceMHATokenToKVPool has no attribute 'k_buffer'
    """


class ImplError(KVCompatError, ValueError):
    """An ``impl=`` argument that is not ``"auto"``, ``"torch"`` or ``"triton"``.

    Example:
        >>> import torch, kvcompat
        >>> from kvcompat.layouts import V4, dequantize
        >>> buf = torch.zeros(1, V4.page_bytes(64), dtype=torch.uint8)
        >>> try:
        ...     dequantize(V4, buf, torch.tensor([0]), 64, impl="cuda")
        ... except ValueError as exc:
        ...     print(type(exc).__name__, exc.args[0].split(";")[0])
        ImplError impl must be 'auto', 'torch' or 'triton'
    """


class KernelUnavailableError(KVCompatError, NotImplementedError):
    """``impl="triton"`` where no Triton kernel serves the call.

    The buffer is not on a CUDA device (and the Triton interpreter is off), the
    layout or value dtype has no kernel, or the buffer is not 16-byte aligned.
    ``NotImplementedError`` is a ``RuntimeError``, so both ``except`` clauses
    catch it. Use ``impl="auto"`` (which falls back to the torch twin) or
    ``impl="torch"``.

    Example:
        >>> import kvcompat
        >>> issubclass(kvcompat.KernelUnavailableError, RuntimeError)
        True
    """


# Users import these from ``kvcompat``: tracebacks, ``repr(type(exc))``, pickles and the API
# reference name them there, not in this private module (pickle finds them there too).
for _name in __all__:
    globals()[_name].__module__ = "kvcompat"
del _name
