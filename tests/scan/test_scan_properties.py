"""Properties over generated sources: detection does not depend on names, fixes round-trip."""

from __future__ import annotations

import ast
import keyword
import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from kvcompat.scan import fix_source, scan_source

_RESERVED = {"self", "super", "kvcompat", "adapt", "compat", "getattr", "print"}
_POOL_WORDS = ("pool", "kv_cache", "kvcache", "token_to_kv")

identifiers = (
    st.text(
        alphabet=st.characters(categories=("Lu", "Ll", "Lo", "Nd"), include_characters="_"),
        min_size=1,
        max_size=10,
    )
    .filter(str.isidentifier)
    .filter(lambda name: not keyword.iskeyword(name))
    .filter(lambda name: unicodedata.normalize("NFKC", name) not in _RESERVED)
    # a receiver that names a host pool is not a finding (host pools own their buffers)
    .filter(lambda name: "host" not in unicodedata.normalize("NFKC", name).lower())
)
receivers = st.lists(identifiers, min_size=1, max_size=4).map(".".join)
methods = st.sampled_from([("get_value_buffer", "KVC001"), ("get_kv_buffer", "KVC002")])
newlines = st.sampled_from(["\n", "\r\n", "\r"])


def _cut_header(fixed: str, newline: str = "\n") -> tuple[str, str]:
    """``(before, after)``: the fixed text around the import line and helpers --fix adds."""
    start = fixed.index(f"import kvcompat{newline}")
    last = fixed.rindex(f"{newline}def _kvcompat_")
    end = fixed.index(newline * 3, last) + 3 * len(newline)
    return fixed[:start], fixed[end:]


def _no_pool_word(text: str) -> bool:
    return not any(word in text.lower() for word in _POOL_WORDS)


@given(receiver=receivers, method=methods, arg=identifiers)
def test_any_receiver_is_detected_and_fixed(
    receiver: str, method: tuple[str, str], arg: str
) -> None:
    name, code = method
    source = f"x = {receiver}.{name}({arg})\n"
    [finding] = scan_source(source)
    assert (finding.line, finding.code, finding.fixable) == (1, code, True)
    assert source[finding.col - 1 :].startswith(name)
    fixed, remaining = fix_source(source)
    assert remaining == []
    assert _cut_header(fixed) == ("", f"x = _kvcompat_{name}({receiver}, {arg})\n")
    assert fix_source(fixed) == (fixed, [])


@given(receiver=receivers, layer=receivers, loc=identifiers, k=identifiers, v=identifiers)
def test_set_kv_buffer_is_fixed_for_any_names(
    receiver: str, layer: str, loc: str, k: str, v: str
) -> None:
    source = f"{receiver}.set_kv_buffer({layer}, {loc}, {k}, {v})\n"
    fixed, remaining = fix_source(source)
    assert remaining == []
    assert _cut_header(fixed) == (
        "",
        f"_kvcompat_set_kv_buffer({receiver}, {layer}, {loc}, {k}, {v})\n",
    )


@given(
    before=identifiers,
    word=st.sampled_from(_POOL_WORDS),
    after=identifiers,
    attr=st.sampled_from(["k_buffer", "v_buffer", "kv_buffer"]),
)
def test_pool_like_attribute_receivers(before: str, word: str, after: str, attr: str) -> None:
    receiver = f"{before}.{after}{word}" if len(before) % 2 else f"{before}{word.upper()}{after}"
    [finding] = scan_source(f"y = {receiver}.{attr}[0][loc]\n")
    assert finding.code == ("KVC005" if attr == "kv_buffer" else "KVC004")
    assert not finding.fixable


@given(receiver=receivers.filter(_no_pool_word), attr=st.sampled_from(["k_buffer", "kv_buffer"]))
def test_other_attribute_receivers_are_not_flagged(receiver: str, attr: str) -> None:
    assert scan_source(f"y = {receiver}.{attr}[0]\n") == []


_FILLER = [
    "# a comment naming pool.get_kv_buffer(0)",
    "s = 'pool.get_value_buffer(0)'",
    'doc = """pool.set_kv_buffer(layer, loc, k, v)"""',
    "x = [1,\t2 ,3]  ",
    "",
    "café = 'é'",
    "if x:\n    pass",
    "pool.get_key_buffer(0)",
]


@given(
    parts=st.lists(
        st.one_of(
            st.sampled_from(_FILLER).map(lambda line: ("filler", line)),
            st.tuples(receivers, methods).map(lambda rm: ("call", rm)),
        ),
        max_size=12,
    ),
    newline=newlines,
)
def test_fix_changes_only_the_calls(parts: list[tuple[str, object]], newline: str) -> None:
    lines: list[str] = []
    expected_lines: list[int] = []
    fixed_lines: list[str] = []
    for kind, part in parts:
        if kind == "filler":
            assert isinstance(part, str)
            lines.append(part.replace("\n", newline))
            fixed_lines.append(part.replace("\n", newline))
        else:
            assert isinstance(part, tuple)
            receiver, (name, _) = part
            lines.append(f"v = {receiver}.{name}(i)")
            fixed_lines.append(f"v = _kvcompat_{name}({receiver}, i)")
        expected_lines.append(sum(line.count(newline) + 1 for line in lines))
    source = newline.join(lines) + newline
    calls = [n for (kind, _), n in zip(parts, expected_lines, strict=True) if kind == "call"]
    assert [f.line for f in scan_source(source)] == calls
    fixed, remaining = fix_source(source)
    assert remaining == []
    ast.parse(fixed)
    if not calls:
        assert fixed is source
        return
    # The import goes before the first statement (after leading comments and blanks).
    before, after = _cut_header(fixed, newline)
    assert all(not line or line.startswith("#") for line in before.split(newline))
    assert before + after == newline.join(fixed_lines) + newline


_GUARDS = [
    "if not kvcompat.is_single_kv_pool(pool):\n{body}",
    "if kvcompat.is_single_kv_pool(pool):\n    pass\nelse:\n{body}",
    "if kvcompat.pool_kind(pool) is not kvcompat.PoolKind.SINGLE_KV:\n{body}",
    "try:\n{body}\nexcept NotImplementedError:\n    pass",
    "with contextlib.suppress(NotImplementedError):\n{body}",
]
_BREAKING = [
    "if kvcompat.is_single_kv_pool(pool):\n{body}",
    "if x:\n{body}",
    "try:\n{body}\nexcept ValueError:\n    pass",
]
_STATEMENTS = st.sampled_from(
    [
        ("v = pool.get_value_buffer(i)", "KVC001"),
        ("k, v = pool.get_kv_buffer(i)", "KVC002"),
        ("pool.set_kv_buffer(layer, loc, k, v)", "KVC003"),
        ("x = pool.get_value_buffer(i).shape", "KVC001"),
    ]
)


@given(
    statements=st.lists(_STATEMENTS, min_size=1, max_size=5),
    guard=st.sampled_from(_GUARDS),
    breaking=st.sampled_from(_BREAKING),
)
def test_guards_cover_every_statement_in_their_block(
    statements: list[tuple[str, str]], guard: str, breaking: str
) -> None:
    body = "\n".join(f"    {statement}" for statement, _ in statements)
    assert scan_source(guard.format(body=body) + "\n") == []
    found = scan_source(breaking.format(body=body) + "\n")
    assert [f.code for f in found] == [code for _, code in statements]


probes = st.sampled_from(
    [
        '{p}.kv_cache_layout == "hnd"',
        'getattr({p}, "native_k_scale_buffer", None) == 1',
        "isinstance({p}, MHATokenToKVPool)",
    ]
)


@given(probed=receivers, other=receivers, probe=probes, method=methods)
def test_a_class_probe_guards_only_its_receiver_and_only_when_true(
    probed: str, other: str, probe: str, method: tuple[str, str]
) -> None:
    name, code = method
    test = probe.format(p=probed)
    guarded = f"if {test}:\n    {probed}.{name}(0)\n"
    assert scan_source(guarded) == []
    if not (other == probed or other.startswith(probed + ".")):
        elsewhere = f"if {test}:\n    {other}.{name}(0)\n"
        assert [f.code for f in scan_source(elsewhere)] == [code]
    if not probe.startswith("isinstance"):  # isinstance is also a receiver check (both branches)
        negated = f"if not ({test}):\n    {probed}.{name}(0)\n"
        assert [f.code for f in scan_source(negated)] == [code]
        otherwise = f"if {test}:\n    pass\nelse:\n    {probed}.{name}(0)\n"
        assert [f.code for f in scan_source(otherwise)] == [code]
