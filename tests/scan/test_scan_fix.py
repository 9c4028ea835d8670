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


def body(source: str) -> str:
    """The fixed text without the import line the fixer adds at the top."""
    text = fixed(source)
    prefix = "import kvcompat\n"
    assert text.startswith(prefix)
    return text[len(prefix) :]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("pool.get_value_buffer(0)\n", "kvcompat.adapt(pool).get_value_buffer(0)\n"),
        ("k, v = p.get_kv_buffer(i)\n", "k, v = kvcompat.adapt(p).get_kv_buffer(i)\n"),
        (
            "self.runner.token_to_kv_pool.get_kv_buffer(layer.layer_id)\n",
            "kvcompat.adapt(self.runner.token_to_kv_pool).get_kv_buffer(layer.layer_id)\n",
        ),
        ("get_pool().get_kv_buffer(0)\n", "kvcompat.adapt(get_pool()).get_kv_buffer(0)\n"),
        ("(a or b).get_kv_buffer(0)\n", "(kvcompat.adapt(a or b)).get_kv_buffer(0)\n"),
        ("pools[i] . get_kv_buffer( 0 )\n", "kvcompat.adapt(pools[i]) . get_kv_buffer( 0 )\n"),
        (
            "pool.set_kv_buffer(layer, loc, k, v)\n",
            "kvcompat.adapt(pool).write(layer.layer_id, loc, k, v)\n",
        ),
        (
            "pool.set_kv_buffer(self.layers[i], batch.out_cache_loc, k, v,)\n",
            "kvcompat.adapt(pool).write(self.layers[i].layer_id, batch.out_cache_loc, k, v,)\n",
        ),
        (
            "pool.set_kv_buffer(get_layer(i), loc, k, v)\n",
            "kvcompat.adapt(pool).write(get_layer(i).layer_id, loc, k, v)\n",
        ),
        (
            "pool.set_kv_buffer(a if c else b, loc, k, v)\n",
            "kvcompat.adapt(pool).write((a if c else b).layer_id, loc, k, v)\n",
        ),
        (
            "pool.set_kv_buffer((layer), loc, k, v)\n",
            "kvcompat.adapt(pool).write((layer.layer_id), loc, k, v)\n",
        ),
        (
            "f(pool.get_kv_buffer(i), pool.get_value_buffer(j))\n",
            "f(kvcompat.adapt(pool).get_kv_buffer(i), kvcompat.adapt(pool).get_value_buffer(j))\n",
        ),
        (
            "x = f'{pool.get_value_buffer(0).shape}'\n",
            "x = f'{kvcompat.adapt(pool).get_value_buffer(0).shape}'\n",
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
        kvcompat.adapt(pool).write(  # write this step's keys
            layer.layer_id,  # the RadixAttention
            loc,
            k,
            v,  # values
        )
        """
    )


def test_nested_calls_are_all_fixed() -> None:
    source = "pool.get_kv_buffer(other_pool.get_value_buffer(0).shape[0])\n"
    assert body(source) == (
        "kvcompat.adapt(pool).get_kv_buffer(kvcompat.adapt(other_pool).get_value_buffer(0).shape[0])\n"
    )
    chained = "a.get_kv_buffer(0).pool.get_value_buffer(1)\n"
    assert body(chained) == (
        "kvcompat.adapt(kvcompat.adapt(a).get_kv_buffer(0).pool).get_value_buffer(1)\n"
    )


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
        (
            "pool.set_kv_buffer(layer, KVWriteLoc(loc, swa_loc=s), k, v)",
            "its location is a KVWriteLoc, not a tensor of token indices",
        ),
        (
            "pool.set_kv_buffer(layer, mem.KVWriteLoc(loc), k, v)",
            "its location is a KVWriteLoc, not a tensor of token indices",
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
    assert text == (
        "import kvcompat\ndef gen():\n    (yield).get_kv_buffer(0)\n"
        "    kvcompat.adapt(pool).get_kv_buffer(1)\n"
    )
    assert (finding.line, finding.fixable) == (3, False)
    assert finding.message.endswith("not auto-fixable: the rewrite would not parse")


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

_CALL = "v = pool.get_value_buffer(0)\n"
_FIXED = "v = kvcompat.adapt(pool).get_value_buffer(0)\n"


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
    assert text == expected_head + _FIXED


def test_import_on_the_docstring_line() -> None:
    text, _ = fix_source('"""Doc."""; v = pool.get_value_buffer(0)\n')
    assert text == '"""Doc."""; import kvcompat; v = kvcompat.adapt(pool).get_value_buffer(0)\n'


def test_import_uses_the_files_line_ending() -> None:
    text, _ = fix_source('"""Doc."""\r\n\r\nv = pool.get_value_buffer(0)\r\n')
    assert text == (
        '"""Doc."""\r\n\r\nimport kvcompat\r\nv = kvcompat.adapt(pool).get_value_buffer(0)\r\n'
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
    assert text == (
        "import kvcompat\r\n"
        "import os\r\n"
        "x = 1 if os else 2\t \r\n"
        "# comment: pool.get_kv_buffer(0)\r\n"
        "s = 'pool.get_kv_buffer(0)'\r\n"
        "y = ('é', kvcompat.adapt(pool) .get_kv_buffer( 0 ))\x0c\r\n"
        "z = kvcompat.adapt(pool).get_value_buffer(1)"
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
