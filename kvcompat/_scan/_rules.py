"""The rule table of ``kvcompat scan`` and the :class:`Finding` value type.

Each rule names one native pool access that breaks on some SGLang 0.5.23 pool
classes, the classes it breaks on, and the kvcompat call to use instead. The
codes are stable: a code is never reused for another check.
"""

from __future__ import annotations

import dataclasses

__all__ = [
    "ATTRIBUTE_RULES",
    "CALL_RULES",
    "ERROR_CODES",
    "HAND_CHECK",
    "RULES",
    "Finding",
    "Rule",
    "make_message",
]


@dataclasses.dataclass(frozen=True)
class Finding:
    r"""One place in a Python file that the scanner reports.

    Attributes:
        path: The file as it was named on the command line (or ``"<string>"``).
        line: 1-based line number; ``0`` for a problem with the whole file.
        col: 1-based column, counted in characters; ``0`` with ``line == 0``.
        code: ``KVC001`` … ``KVC009`` for pool accesses, ``KVC9xx`` for files the
            scanner could not read or parse.
        message: What was found, where it breaks, and what to use instead.
        fixable: Whether ``kvcompat scan --fix`` rewrites it.

    Example:
        >>> from kvcompat.scan import scan_source
        >>> [finding] = scan_source("k, v = pool.get_kv_buffer(layer_id)\n")
        >>> finding.line, finding.col, finding.code, finding.fixable
        (1, 13, 'KVC002', True)
        >>> print(finding.format())  # doctest: +ELLIPSIS
        <string>:1:13: KVC002 pool.get_kv_buffer() — breaks on ... instead
    """

    path: str
    line: int
    col: int
    code: str
    message: str
    fixable: bool

    @property
    def is_error(self) -> bool:
        r"""Whether this is a file the scanner could not check (a ``KVC9xx`` code).

        Example:
            >>> from kvcompat.scan import scan_source
            >>> scan_source("pool.get_value_buffer(0)\n")[0].is_error
            False
        """
        return self.code in ERROR_CODES

    def format(self) -> str:
        """The one-line ``path:line:col: CODE message`` form the CLI prints.

        A problem with the whole file (``line == 0``) prints as ``path: CODE message``.

        Example:
            >>> from kvcompat.scan import Finding
            >>> Finding("a.py", 3, 5, "KVC004", "pool.k_buffer — …", False).format()
            'a.py:3:5: KVC004 pool.k_buffer — …'
        """
        where = f"{self.path}:{self.line}:{self.col}" if self.line else self.path
        return f"{where}: {self.code} {self.message}"


@dataclasses.dataclass(frozen=True)
class Rule:
    """A check: its code, what it looks for, where that breaks, and the replacement.

    Attributes:
        code: The stable code, e.g. ``"KVC001"``.
        name: A short name (the method or attribute it looks for).
        breaks_on: Where the native access breaks, in words.
        classes: The SGLang 0.5.23 classes it breaks on.
        replacement: The kvcompat call to use, with ``{recv}`` for the receiver.

    Example:
        >>> from kvcompat.scan import RULES
        >>> RULES["KVC003"].name
        'set_kv_buffer'
    """

    code: str
    name: str
    breaks_on: str
    classes: tuple[str, ...]
    replacement: str


_DSV4_SINGLE = ("DeepSeekV4SingleKVPool", "DeepSeekV4UniformFP8KVPool", "HiSparseC4DevicePool")
_DSV4_OTHER = ("DeepSeekV4IndexerPool", "DeepSeekV4TokenToKVPool")
_KEY_ONLY = ("MHATokenToKOnlyPool",)
DSV4_POOLS = frozenset(_DSV4_SINGLE + _DSV4_OTHER)
"""SGLang 0.5.23's DeepSeek-V4 pool classes that break a rule."""
KEY_ONLY_POOLS = frozenset(_KEY_ONLY)
"""SGLang 0.5.23's key-only pool classes (an index-key sub-pool of another pool)."""
_READ_HINT = "kvcompat.adapt({recv}).get_key_buffer(layer_id) or .read(layer_id, loc)"

RULES: dict[str, Rule] = {
    rule.code: rule
    for rule in (
        Rule(
            code="KVC001",
            name="get_value_buffer",
            breaks_on=(
                "DeepSeek-V4 single-KV, indexer and composite pools and key-only pools "
                "(NotImplementedError)"
            ),
            classes=_DSV4_SINGLE + _DSV4_OTHER + _KEY_ONLY,
            replacement="kvcompat.compat({recv}).get_value_buffer(layer_id)",
        ),
        Rule(
            code="KVC002",
            name="get_kv_buffer",
            breaks_on=(
                "DeepSeek-V4 single-KV, indexer and composite pools and key-only pools "
                "(NotImplementedError)"
            ),
            classes=_DSV4_SINGLE + _DSV4_OTHER + _KEY_ONLY,
            replacement="kvcompat.compat({recv}).get_kv_buffer(layer_id)",
        ),
        Rule(
            code="KVC003",
            name="set_kv_buffer",
            breaks_on=(
                "every DeepSeek-V4 pool and key-only pools (NotImplementedError); "
                "MLA pools drop cache_v"
            ),
            classes=_DSV4_SINGLE + _DSV4_OTHER + _KEY_ONLY,
            replacement="kvcompat.compat({recv}).set_kv_buffer(layer, loc, cache_k, cache_v)",
        ),
        Rule(
            code="KVC004",
            name="k_buffer/v_buffer",
            breaks_on=(
                "MLA, DSA and DeepSeek-V4 pools (AttributeError); key-only pools have no v_buffer"
            ),
            classes=(
                "MLATokenToKVPool",
                "MLATokenToKVPoolFP4",
                "DSATokenToKVPool",
                *_DSV4_SINGLE,
                *_DSV4_OTHER,
                *_KEY_ONLY,
            ),
            replacement=(
                "kvcompat.adapt({recv}).get_key_buffer(layer_id) / .get_value_buffer(layer_id) "
                "or .read(layer_id, loc)"
            ),
        ),
        Rule(
            code="KVC005",
            name="kv_buffer",
            breaks_on=(
                "MHA pools and the DeepSeek-V4 composite (AttributeError); on DeepSeek-V4 "
                "single-KV pools it is packed page-major bytes [pages, page_bytes], so "
                "indexing it by token reads page rows"
            ),
            classes=("MHATokenToKVPool", *_DSV4_SINGLE, "DeepSeekV4TokenToKVPool"),
            replacement=_READ_HINT,
        ),
        Rule(
            code="KVC006",
            name="get_key_buffer rows",
            breaks_on=(
                "DeepSeek-V4 single-KV pools (silently): get_key_buffer returns packed "
                "page-major bytes [pages, page_bytes], so indexing it by token reads page rows"
            ),
            classes=_DSV4_SINGLE,
            replacement="kvcompat.adapt({recv}).read(layer_id, loc) or .write(layer_id, loc, key)",
        ),
        Rule(
            code="KVC007",
            name="get_kv_buffer_shape",
            breaks_on=(
                "every pool whose get_kv_buffer raises: DeepSeek-V4 single-KV, indexer and "
                "composite pools and key-only pools (NotImplementedError)"
            ),
            classes=_DSV4_SINGLE + _DSV4_OTHER + _KEY_ONLY,
            replacement=(
                "kvcompat.adapt({recv}).get_key_buffer(layer_id).shape, or the layout's "
                "logical shape from kvcompat.describe({recv})"
            ),
        ),
        Rule(
            code="KVC008",
            name="value buffer head-dim probe",
            breaks_on=(
                "DeepSeek-V4 single-KV pools (silently): kvcompat's key-first adapter hands "
                "out the pool's storage, packed page-major bytes [pages, page_bytes], so its "
                "shape[-1] is the bytes of a page (37440 on V4), not the head dim"
            ),
            classes=_DSV4_SINGLE,
            replacement="kvcompat.compat({recv}).get_value_buffer(layer_id).shape[-1]",
        ),
        Rule(
            code="KVC009",
            name="unpacked buffer rows",
            breaks_on=(
                "DeepSeek-V4 single-KV pools (silently): kvcompat's key-first adapter hands "
                "out the pool's storage, packed page-major bytes [pages, page_bytes], so "
                "indexing a get_kv_buffer / get_value_buffer result by token reads page rows"
            ),
            classes=_DSV4_SINGLE,
            replacement=(
                "kvcompat.adapt({recv}).read(layer_id, loc) / .read_kv(layer_id, loc), or "
                "kvcompat.compat({recv}).get_kv_buffer(layer_id) (views that gather by token)"
            ),
        ),
    )
}

CALL_RULES: dict[str, str] = {
    "get_value_buffer": "KVC001",
    "get_kv_buffer": "KVC002",
    "set_kv_buffer": "KVC003",
    "get_kv_buffer_shape": "KVC007",
}
"""Method name -> code, for the three generic methods the scanner looks for."""

ATTRIBUTE_RULES: dict[str, str] = {
    "k_buffer": "KVC004",
    "v_buffer": "KVC004",
    "kv_buffer": "KVC005",
}
"""Attribute name -> code, for the storage attributes the scanner looks for."""

HAND_CHECK = "KVC100"
"""The code of a note ``--fix`` leaves: a use of a rewritten call to check by hand.

Notes are listed apart from findings (``ScanReport.hand_checks``) and never change the
exit status; ``# kvcompat: ignore[KVC100]`` silences one.
"""

ERROR_CODES: dict[str, str] = {
    "KVC900": "syntax error",
    "KVC901": "cannot decode",
    "KVC902": "cannot read",
    "KVC903": "too large",
}
"""Codes for files the scanner could not check; any of them makes the exit status 2."""


def make_message(code: str, what: str, recv: str, note: str = "", use: str = "") -> str:
    """Build a finding's message: ``<what> — breaks on <…> — use <…> instead``.

    Args:
        code: A code of :data:`RULES`.
        what: The access as written, e.g. ``"pool.get_kv_buffer()"``.
        recv: The receiver's source text, put into the replacement.
        note: Appended after ``instead`` (e.g. why it is not auto-fixable).
        use: The replacement to suggest, when it is more specific than the rule's.

    Returns:
        The message, one line.

    Example:
        >>> from kvcompat._scan._rules import make_message
        >>> make_message("KVC001", "pool.get_value_buffer()", "pool").endswith(
        ...     "use kvcompat.compat(pool).get_value_buffer(layer_id) instead")
        True
    """
    rule = RULES[code]
    use = use or rule.replacement.format(recv=recv)
    return f"{what} — breaks on {rule.breaks_on} — use {use} instead{note}"
