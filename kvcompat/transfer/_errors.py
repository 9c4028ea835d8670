"""Errors of :mod:`kvcompat.transfer`: a plan refused before anything moved; a failed transfer."""

from __future__ import annotations

from collections.abc import Mapping

from kvcompat._errors import KVCompatError

__all__ = ["TransferError", "TransferPlanError"]


class TransferPlanError(KVCompatError, ValueError):
    """Two pools (or a selection of pages) that cannot be paired; nothing was moved.

    Raised while a plan is built: the configurations differ (layouts, page sizes,
    layer ids, item bytes), a page id is out of range, or the selection names a
    transfer group the pools do not register.

    Example:
        >>> from kvcompat.transfer import TransferPlanError
        >>> issubclass(TransferPlanError, ValueError)
        True
    """


class TransferError(KVCompatError, RuntimeError):
    """A transfer engine failed or timed out; the message says which pages did and did not arrive.

    Attributes:
        arrived: per buffer label (``"c4 kv_pools[4].kv_buffer[0] (layer 1)"``),
            the destination page ids known to have arrived.
        not_arrived: per buffer label, the destination page ids that did not
            arrive or whose state is unknown (treat them as not arrived).

    Example:
        >>> from kvcompat.transfer import TransferError
        >>> err = TransferError("x", arrived={"k": (0,)}, not_arrived={"k": (1, 2)})
        >>> isinstance(err, RuntimeError), err.not_arrived["k"]
        (True, (1, 2))
    """

    def __init__(
        self,
        message: str,
        *,
        arrived: Mapping[str, tuple[int, ...]] | None = None,
        not_arrived: Mapping[str, tuple[int, ...]] | None = None,
    ) -> None:
        super().__init__(message)
        self.arrived: dict[str, tuple[int, ...]] = dict(arrived or {})
        self.not_arrived: dict[str, tuple[int, ...]] = dict(not_arrived or {})


# Users import these from ``kvcompat.transfer``: tracebacks and pickles name them there.
TransferPlanError.__module__ = TransferError.__module__ = "kvcompat.transfer"
