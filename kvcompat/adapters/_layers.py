"""Layer-id checking shared by every adapter (the slow, error-raising half)."""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any, NoReturn

import torch

from kvcompat._errors import LayerIdTypeError, LayerOutOfRangeError

__all__ = ["coerce_layer_id", "describe_ids", "raise_unserved"]


def describe_ids(ids: Iterable[int]) -> str:
    """Render layer ids compactly: ``0..31`` for a run, ``[1, 3, 5]`` otherwise.

    Example:
        >>> describe_ids(range(2, 6)), describe_ids([1, 3]), describe_ids([])
        ('2..5', '[1, 3]', 'none')
    """
    ids = sorted(ids)
    if not ids:
        return "none"
    if len(ids) > 1 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}..{ids[-1]}"
    if len(ids) == 1:
        return str(ids[0])
    if len(ids) > 12:
        head = ", ".join(map(str, ids[:10]))
        return f"[{head}, ... {ids[-1]}] ({len(ids)} ids)"
    return "[" + ", ".join(map(str, ids)) + "]"


def coerce_layer_id(layer_id: Any, owner: str) -> int:
    """Turn an integer-like layer id into an ``int``; reject everything else.

    Accepts ``int`` and integer scalars such as ``numpy.int64``. Rejects
    ``bool`` (``True`` would silently mean layer 1), floats, strings, ``None``
    and tensors (converting a CUDA tensor would synchronise the host).

    Example:
        >>> coerce_layer_id(3, "pool")
        3
        >>> coerce_layer_id(True, "pool")
        Traceback (most recent call last):
        ...
        kvcompat.LayerIdTypeError: layer id must be an int, got bool True (pool).
        Hint: pass the absolute model layer id, e.g. layer.layer_id.
    """
    if type(layer_id) is int:
        return layer_id
    if not isinstance(layer_id, (bool, torch.Tensor)):
        try:
            return operator.index(layer_id)
        except TypeError:
            pass
    msg = (
        f"layer id must be an int, got {type(layer_id).__name__} {layer_id!r} ({owner}).\n"
        "Hint: pass the absolute model layer id, e.g. layer.layer_id."
    )
    raise LayerIdTypeError(msg)


def raise_unserved(layer_id: Any, owner: str, ids: Iterable[int], note: str = "") -> NoReturn:
    """Raise the error for a layer id the pool does not serve.

    Example:
        >>> raise_unserved(5, "MHATokenToKVPool", range(2))
        Traceback (most recent call last):
        ...
        kvcompat.LayerOutOfRangeError: layer id 5 is not served by MHATokenToKVPool: valid layer ids are 0..1.
        Hint: kvcompat takes absolute model layer ids (the pool's start_layer is already accounted for).
    """  # noqa: E501
    layer = coerce_layer_id(layer_id, owner)
    msg = (
        f"layer id {layer} is not served by {owner}: valid layer ids are "
        f"{describe_ids(ids)}.{note}\n"
        "Hint: kvcompat takes absolute model layer ids "
        "(the pool's start_layer is already accounted for)."
    )
    raise LayerOutOfRangeError(msg)
