"""fix_source: the rewrites, the import line, and everything else left as it was."""

from __future__ import annotations

import ast
import textwrap

import pytest

from kvcompat.scan import fix_source


def fixed(source: str) -> str:
    text, _ = fix_source(textwrap.dedent(source))
    ast.parse(text)
    return text


def strip_header(text: str, newline: str = "\n") -> str:
    """The fixed text without the import line and helper block the fixer adds."""
    prefix = f"import kvcompat{newline}"
    if text.startswith(prefix):
        text = text[len(prefix) :]
    if text.startswith("# Added by `kvcompat scan --fix`"):
        last = text.rindex("\ndef _kvcompat_")
        end = text.index(f"{newline}{newline}{newline}", last) + 3 * len(newline)
        text = text[end:]
    return text


def body(source: str) -> str:
    """The fixed text without the import line and helpers the fixer adds at the top."""
    text = fixed(source)
    assert text.startswith("import kvcompat\n")
    return strip_header(text)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("pool.get_value_buffer(0)\n", "_kvcompat_get_value_buffer(pool, 0)\n"),
        ("k, v = p.get_kv_buffer(i)\n", "k, v = _kvcompat_get_kv_buffer(p, i)\n"),
        (
            "self.runner.token_to_kv_pool.get_kv_buffer(layer.layer_id)\n",
            "_kvcompat_get_kv_buffer(self.runner.token_to_kv_pool, layer.layer_id)\n",
        ),
        ("get_pool().get_kv_buffer(0)\n", "_kvcompat_get_kv_buffer(get_pool(), 0)\n"),
        ("pools[i] . get_kv_buffer( 0 )\n", "_kvcompat_get_kv_buffer(pools[i],  0 )\n"),
        (
            "pool.set_kv_buffer(layer, loc, k, v)\n",
            "_kvcompat_set_kv_buffer(pool, layer, loc, k, v)\n",
        ),
        (
            "pool.set_kv_buffer(self.layers[i], batch.out_cache_loc, k, v,)\n",
            "_kvcompat_set_kv_buffer(pool, self.layers[i], batch.out_cache_loc, k, v,)\n",
        ),
        (
            "pool.set_kv_buffer(get_layer(i), loc, k, v)\n",
            "_kvcompat_set_kv_buffer(pool, get_layer(i), loc, k, v)\n",
        ),
        (  # compat(pool).set_kv_buffer takes a KVWriteLoc, as SGLang's pools do
            "pool.set_kv_buffer(layer, KVWriteLoc(loc, swa_loc=s), k, v)\n",
            "_kvcompat_set_kv_buffer(pool, layer, KVWriteLoc(loc, swa_loc=s), k, v)\n",
        ),
        (
            "pool.set_kv_buffer(a if c else b, loc, k, v)\n",
            "_kvcompat_set_kv_buffer(pool, a if c else b, loc, k, v)\n",
        ),
        (
            "pool.set_kv_buffer((layer), loc, k, v)\n",
            "_kvcompat_set_kv_buffer(pool, (layer), loc, k, v)\n",
        ),
        (
            "f(pool.get_kv_buffer(i), pool.get_value_buffer(j))\n",
            "f(_kvcompat_get_kv_buffer(pool, i), _kvcompat_get_value_buffer(pool, j))\n",
        ),
        (
            "x = f'{pool.get_value_buffer(0).shape}'\n",
            "x = f'{_kvcompat_get_value_buffer(pool, 0).shape}'\n",
        ),
    ],
)
def test_rewrites(source: str, expected: str) -> None:
    assert body(source) == expected


def test_multi_line_call_keeps_comments_and_layout() -> None:
    source = """\
    pool.set_kv_buffer(  # write this step's keys
        layer,  # the RadixAttention
        loc,
        k,
        v,  # values
    )
    """
    assert body(source) == textwrap.dedent(
        """\
        _kvcompat_set_kv_buffer(pool,   # write this step's keys
            layer,  # the RadixAttention
            loc,
            k,
            v,  # values
        )
        """
    )


def test_nested_calls_are_all_fixed() -> None:
    source = "pool.get_kv_buffer(other_pool.get_value_buffer(0).shape[0])\n"
    assert body(source) == (
        "_kvcompat_get_kv_buffer(pool, _kvcompat_get_value_buffer(other_pool, 0).shape[0])\n"
    )
    chained = "a.get_kv_buffer(0).pool.get_value_buffer(1)\n"
    assert body(chained) == ("_kvcompat_get_value_buffer(_kvcompat_get_kv_buffer(a, 0).pool, 1)\n")


@pytest.mark.parametrize(
    ("call", "reason"),
    [
        ("pool.get_value_buffer(layer_id=0)", "it passes keyword arguments"),
        ("pool.get_value_buffer()", "it passes 0 positional arguments, not 1"),
        ("pool.get_kv_buffer(*ids)", "it passes *args"),
        ("pool.set_kv_buffer(layer, loc, k)", "it passes 3 positional arguments, not 4"),
        (
            "pool.set_kv_buffer(layer, loc, k, v, 1.0, 1.0)",
            "it passes 6 positional arguments, not 4",
        ),
        ("pool.set_kv_buffer(layer, loc, k, v, **scales)", "it passes keyword arguments"),
        ("(a or b).get_kv_buffer(0)", "its source text could not be located exactly"),
        (
            "pool.get_kv_buffer_shape()",
            "kvcompat has no get_kv_buffer_shape(); read get_key_buffer(i).shape",
        ),
    ],
)
def test_not_fixable(call: str, reason: str) -> None:
    source = f"{call}\n"
    text, [finding] = fix_source(source)
    assert text is source
    assert not finding.fixable
    assert finding.message.endswith(f"; not auto-fixable: {reason}")


def test_a_rewrite_that_would_not_parse_is_left_and_reported() -> None:
    source = "def gen():\n    (yield).get_kv_buffer(0)\n    pool.get_kv_buffer(1)\n"
    text, [finding] = fix_source(source)
    assert strip_header(text) == (
        "def gen():\n    (yield).get_kv_buffer(0)\n    _kvcompat_get_kv_buffer(pool, 1)\n"
    )
    line = text.splitlines().index("    (yield).get_kv_buffer(0)") + 1
    assert (finding.line, finding.fixable) == (line, False)
    assert finding.message.endswith(
        "not auto-fixable: its source text could not be located exactly"
    )


def test_guarded_suppressed_and_attribute_findings_are_left_alone() -> None:
    source = textwrap.dedent(
        """\
        import kvcompat
        if not kvcompat.is_single_kv_pool(pool):
            pool.get_kv_buffer(0)
        pool.get_kv_buffer(1)  # kvcompat: ignore
        x = pool.k_buffer[0]
        """
    )
    text, remaining = fix_source(source)
    assert text is source
    assert [(f.line, f.code, f.fixable) for f in remaining] == [(5, "KVC004", False)]


def test_syntax_error() -> None:
    source = "pool.get_kv_buffer(0\n"
    text, [finding] = fix_source(source, "bad.py")
    assert text is source
    assert (finding.path, finding.code) == ("bad.py", "KVC900")


# -- the import line -----------------------------------------------------------


def _without_helpers(text: str) -> str:
    """The fixed text with the helper block (which follows the import line) cut out."""
    start = text.find("# Added by `kvcompat scan --fix`")
    assert start >= 0
    last = text.rindex("\ndef _kvcompat_")
    end = text.index("\n\n\n", last) + 3
    return text[:start] + text[end:]


_CALL = "v = pool.get_value_buffer(0)\n"
_FIXED = "v = _kvcompat_get_value_buffer(pool, 0)\n"


@pytest.mark.parametrize(
    ("head", "expected_head"),
    [
        ("", "import kvcompat\n"),
        ('"""Doc."""\n', '"""Doc."""\nimport kvcompat\n'),
        (
            '"""Doc.\n\nMore.\n"""\n\nfrom __future__ import annotations\n\nimport os\n',
            (
                '"""Doc.\n\nMore.\n"""\n\nfrom __future__ import annotations\n\n'
                "import kvcompat\nimport os\n"
            ),
        ),
        (
            "#!/usr/bin/env python\n# -*- coding: utf-8 -*-\n# Copyright header.\n\nimport os\n",
            (
                "#!/usr/bin/env python\n# -*- coding: utf-8 -*-\n# Copyright header.\n\n"
                "import kvcompat\nimport os\n"
            ),
        ),
        ("import kvcompat\n", "import kvcompat\n"),
        ("import os, kvcompat\n", "import os, kvcompat\n"),
        ("import kvcompat.scan\n", "import kvcompat.scan\n"),
        ("import kvcompat as kc\n", "import kvcompat\nimport kvcompat as kc\n"),
        ("from kvcompat import adapt\n", "import kvcompat\nfrom kvcompat import adapt\n"),
        (
            "if TYPE_CHECKING:\n    import kvcompat\n",
            "import kvcompat\nif TYPE_CHECKING:\n    import kvcompat\n",
        ),
        ("@decorator\ndef f(): ...\n", "import kvcompat\n@decorator\ndef f(): ...\n"),
    ],
)
def test_import_placement(head: str, expected_head: str) -> None:
    text, _ = fix_source(head + _CALL)
    assert _without_helpers(text) == expected_head + _FIXED


def test_import_on_the_docstring_line() -> None:
    text, _ = fix_source('"""Doc."""; v = pool.get_value_buffer(0)\n')
    assert text.startswith('"""Doc."""; import kvcompat\n# Added by `kvcompat scan --fix`')
    assert text.endswith("\n\n\nv = _kvcompat_get_value_buffer(pool, 0)\n")
    ast.parse(text)


def test_import_uses_the_files_line_ending() -> None:
    text, _ = fix_source('"""Doc."""\r\n\r\nv = pool.get_value_buffer(0)\r\n')
    assert "\n" not in text.replace("\r\n", "")
    assert text.startswith('"""Doc."""\r\n\r\nimport kvcompat\r\n# Added by')
    assert strip_header(text[len('"""Doc."""\r\n\r\n') :], "\r\n") == (
        "v = _kvcompat_get_value_buffer(pool, 0)\r\n"
    )


def test_no_import_when_nothing_was_fixed() -> None:
    source = "pool.k_buffer[0]\n"
    assert fix_source(source)[0] is source


# -- byte-for-byte ---------------------------------------------------------------


def test_everything_outside_the_edits_is_unchanged() -> None:
    source = (
        "import os\r\n"
        "x = 1 if os else 2\t \r\n"
        "# comment: pool.get_kv_buffer(0)\r\n"
        "s = 'pool.get_kv_buffer(0)'\r\n"
        "y = ('é', pool .get_kv_buffer( 0 ))\x0c\r\n"
        "z = pool.get_value_buffer(1)"  # no newline at the end
    )
    text, remaining = fix_source(source)
    assert remaining == []
    assert strip_header(text, "\r\n") == (
        "import os\r\n"
        "x = 1 if os else 2\t \r\n"
        "# comment: pool.get_kv_buffer(0)\r\n"
        "s = 'pool.get_kv_buffer(0)'\r\n"
        "y = ('é', _kvcompat_get_kv_buffer(pool,  0 ))\x0c\r\n"
        "z = _kvcompat_get_value_buffer(pool, 1)"
    )


def test_fix_is_idempotent_on_a_realistic_module() -> None:
    source = textwrap.dedent(
        '''\
        """Backend."""
        from __future__ import annotations


        class Backend:
            def forward(self, layer, batch, k, v):
                batch.token_to_kv_pool.set_kv_buffer(layer, batch.out_cache_loc, k, v)
                return batch.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        '''
    )
    once, remaining = fix_source(source)
    assert remaining == []
    twice, again = fix_source(once)
    assert twice is once
    assert again == []
