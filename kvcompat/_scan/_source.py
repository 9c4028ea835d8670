r"""Source text helpers: node positions as string offsets, and suppression comments.

``ast`` reports columns as UTF-8 byte offsets within a line, and counts ``\r\n``,
``\r`` and ``\n`` as line breaks. :class:`SourceText` turns those positions into
offsets into the decoded ``str``, so rewrites touch exactly the node's text and
leave every other character (line endings included) as it was.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import re
import tokenize
import warnings

__all__ = [
    "ALL_CODES",
    "SourceText",
    "Suppressions",
    "node_span",
    "parse_expression",
    "parse_module",
    "split_lines",
]

_NEWLINE = re.compile(r"\r\n|\r|\n")
_SUPPRESS = re.compile(r"#\s*kvcompat:\s*ignore(-file)?(?:\[([^\]]*)\])?(?![\w-])")

ALL_CODES: frozenset[str] = frozenset({"*"})
"""The code set of a suppression comment without a ``[...]`` list: every code."""


def parse_module(text: str, path: str) -> ast.Module:
    r"""``ast.parse`` without the warnings it emits for the scanned code (invalid escapes).

    Raises:
        SyntaxError: The text is not valid Python.

    Example:
        >>> from kvcompat._scan._source import parse_module
        >>> type(parse_module("x = '\\d'", "a.py")).__name__
        'Module'
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(text, filename=path)


def parse_expression(text: str) -> ast.expr:
    """Parse one expression quietly (see :func:`parse_module`).

    Raises:
        SyntaxError: The text is not one valid expression.

    Example:
        >>> from kvcompat._scan._source import parse_expression
        >>> type(parse_expression("pool.k_buffer")).__name__
        'Attribute'
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(text, mode="eval").body


def split_lines(text: str) -> list[str]:
    r"""Split like the Python tokenizer: on ``\r\n``, ``\r`` and ``\n`` only, keeping ends.

    ``str.splitlines`` also splits on form feeds and other separators that are
    not line breaks in Python source, which would shift line numbers.

    Example:
        >>> from kvcompat._scan._source import split_lines
        >>> split_lines("a\r\nb\x0cc\rd")
        ['a\r\n', 'b\x0cc\r', 'd']
    """
    lines: list[str] = []
    start = 0
    for match in _NEWLINE.finditer(text):
        lines.append(text[start : match.end()])
        start = match.end()
    if start < len(text):
        lines.append(text[start:])
    return lines


class SourceText:
    r"""A module's text with a line table, for converting ``ast`` positions.

    Example:
        >>> import ast
        >>> from kvcompat._scan._source import SourceText
        >>> src = SourceText("x = 'é'; pool.k_buffer\n")
        >>> node = ast.parse(src.text).body[1].value
        >>> node.col_offset, src.char_col(node.lineno, node.col_offset)
        (10, 9)
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self._starts = [0]
        self._starts.extend(match.end() for match in _NEWLINE.finditer(text))

    def line(self, lineno: int) -> str:
        r"""The text of 1-based line ``lineno``, without its line break.

        Example:
            >>> from kvcompat._scan._source import SourceText
            >>> SourceText("a\r\nb").line(2)
            'b'
        """
        start = self._starts[lineno - 1]
        end = self._starts[lineno] if lineno < len(self._starts) else len(self.text)
        return self.text[start:end].rstrip("\r\n")

    def char_col(self, lineno: int, col_bytes: int) -> int:
        """The 0-based character column of a UTF-8 byte column on line ``lineno``.

        Example:
            >>> from kvcompat._scan._source import SourceText
            >>> SourceText("é = 1").char_col(1, 3)
            2
        """
        line = self.line(lineno)
        if line.isascii():
            return col_bytes
        return len(line.encode("utf-8")[:col_bytes].decode("utf-8", errors="replace"))

    def offset(self, lineno: int, col_bytes: int) -> int:
        r"""The offset into :attr:`text` of an ``ast`` position (1-based line, byte column).

        Example:
            >>> from kvcompat._scan._source import SourceText
            >>> SourceText("a\npool").offset(2, 1)
            3
        """
        return self._starts[lineno - 1] + self.char_col(lineno, col_bytes)

    def start(self, node: ast.expr | ast.stmt) -> int:
        r"""The offset where ``node`` starts.

        Example:
            >>> import ast
            >>> from kvcompat._scan._source import SourceText
            >>> src = SourceText("x = pool\n")
            >>> src.start(ast.parse(src.text).body[0].value)
            4
        """
        return self.offset(node.lineno, node.col_offset)

    def end(self, node: ast.expr | ast.stmt) -> int:
        r"""The offset just past the end of ``node``.

        Example:
            >>> import ast
            >>> from kvcompat._scan._source import SourceText
            >>> src = SourceText("x = pool\n")
            >>> src.end(ast.parse(src.text).body[0].value)
            8
        """
        end_lineno, end_col = node_span(node)[2:]
        return self.offset(end_lineno, end_col)

    def segment(self, node: ast.expr) -> str:
        r"""The exact source text of ``node``.

        Example:
            >>> import ast
            >>> from kvcompat._scan._source import SourceText
            >>> src = SourceText("f( a .b )\n")
            >>> src.segment(ast.parse(src.text).body[0].value.args[0])
            'a .b'
        """
        return self.text[self.start(node) : self.end(node)]


def node_span(node: ast.expr | ast.stmt) -> tuple[int, int, int, int]:
    """``(lineno, col_offset, end_lineno, end_col_offset)`` of a parsed node.

    Example:
        >>> import ast
        >>> from kvcompat._scan._source import node_span
        >>> node_span(ast.parse("pool.k_buffer").body[0].value)
        (1, 0, 1, 13)
    """
    end_lineno = node.end_lineno if node.end_lineno is not None else node.lineno
    end_col = node.end_col_offset if node.end_col_offset is not None else node.col_offset
    return node.lineno, node.col_offset, end_lineno, end_col


def _comments(text: str) -> list[tuple[int, str]]:
    """``(line, comment text)`` for every comment token (never text inside strings)."""
    normalized = _NEWLINE.sub("\n", text)
    try:
        return [
            (token.start[0], token.string)
            for token in tokenize.generate_tokens(io.StringIO(normalized).readline)
            if token.type == tokenize.COMMENT
        ]
    except (tokenize.TokenError, SyntaxError):
        # Only reached for text ast accepted but tokenize rejects; fall back to a
        # plain search, which may also see the marker inside a string literal.
        return [
            (number, line[line.index("#") :])
            for number, line in enumerate(normalized.split("\n"), start=1)
            if "#" in line
        ]


def _codes(listed: str | None) -> frozenset[str]:
    if listed is None:
        return ALL_CODES
    codes = frozenset(code.strip().upper() for code in listed.split(",") if code.strip())
    return codes or ALL_CODES


@dataclasses.dataclass(frozen=True)
class Suppressions:
    r"""The ``# kvcompat: ignore`` comments of one module.

    ``# kvcompat: ignore`` silences every finding on its line;
    ``# kvcompat: ignore[KVC001,KVC004]`` only those codes.
    ``# kvcompat: ignore-file`` (or ``ignore-file[...]``) anywhere in the file
    silences the whole file (or those codes in it).

    Example:
        >>> from kvcompat._scan._source import Suppressions
        >>> marks = Suppressions.parse("x = pool.k_buffer  # kvcompat: ignore[KVC004]\n")
        >>> marks.covers(1, "KVC004"), marks.covers(1, "KVC005"), marks.covers(2, "KVC004")
        (True, False, False)
    """

    lines: dict[int, frozenset[str]]
    whole_file: frozenset[str]

    @classmethod
    def parse(cls, text: str) -> Suppressions:
        r"""Collect the suppression comments of ``text``.

        Example:
            >>> from kvcompat._scan._source import Suppressions
            >>> Suppressions.parse("# kvcompat: ignore-file\n").whole_file
            frozenset({'*'})
        """
        lines: dict[int, frozenset[str]] = {}
        whole_file: frozenset[str] = frozenset()
        for line, comment in _comments(text):
            for match in _SUPPRESS.finditer(comment):
                codes = _codes(match.group(2))
                if match.group(1):
                    whole_file |= codes
                else:
                    lines[line] = lines.get(line, frozenset()) | codes
        return cls(lines=lines, whole_file=whole_file)

    def covers(self, line: int, code: str) -> bool:
        r"""Whether a finding with ``code`` on ``line`` is suppressed.

        Example:
            >>> from kvcompat._scan._source import Suppressions
            >>> Suppressions.parse("a  # kvcompat: ignore\n").covers(1, "KVC002")
            True
        """
        for codes in (self.whole_file, self.lines.get(line, frozenset())):
            if "*" in codes or code in codes:
                return True
        return False
