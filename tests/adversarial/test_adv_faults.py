"""Faults during a write (an encode or a torch op raising) leave every byte as it was.

For every layout (``quantize`` on a bare buffer), every reference pool and every SGLang
0.5.23 pool class that constructs on CPU, each write is first run with counting wrappers to
learn how many calls each stage makes (codec ``encode``: one per part and CPU chunk;
``index_select``: the saved bytes; ``index_copy_``: the scatters). Then, for every call of
every stage, the same write is run with that call raising -- an ``Exception`` and a
``BaseException`` (as KeyboardInterrupt is) -- and every storage reachable from the pool,
the adapter and the caller's arguments must hash as before. Scatters other than the last
also fail *after storing half their rows*: the restore must cover the failing op too. The
CPU chunk size is cut to 2 tokens so that writes of 5 tokens take three chunks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import kvcompat
from kvcompat.layouts import LayoutSpec, _codec, quantize

from ._harness import (
    ALL_CASES,
    LAYOUTS,
    STAGES,
    Case,
    Counter,
    InjectedFaultError,
    InjectedInterruptError,
    Write,
    assert_unchanged,
    fingerprint,
    inject,
    tried,
    valid_write,
)

PAGE = 4


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_codec, "CPU_CHUNK_TOKENS", 2)


def _calls(monkeypatch: pytest.MonkeyPatch, stage: str, run: Callable[[], None]) -> int:
    counter = Counter()
    with inject(monkeypatch, stage, counter):
        run()
    return counter.calls


def _attack(
    monkeypatch: pytest.MonkeyPatch,
    run: Callable[[], None],
    dry_run: Callable[[], None],
    roots: tuple[Any, ...],
    what: str,
) -> dict[str, int]:
    """Fail every call of every stage of ``run``; return the calls per stage."""
    calls = {stage: _calls(monkeypatch, stage, dry_run) for stage in STAGES}
    assert calls["encode"] >= 1, calls
    assert calls["scatter"] >= 1, calls
    before = fingerprint(*roots)
    for stage in STAGES:
        for call in range(1, calls[stage] + 1):
            variants = [(InjectedFaultError, False), (InjectedInterruptError, False)]
            if stage == "scatter" and call < calls[stage]:
                variants.append((InjectedFaultError, True))  # half its rows stored, then raise
            for error, partial in variants:
                counter = Counter(fail_at=call, partial=partial, error=error)
                with inject(monkeypatch, stage, counter), pytest.raises(error):
                    run()
                label = f"{what}: {error.__name__} at {stage} call {call}"
                assert_unchanged(before, fingerprint(*roots), label + (" (partial)" * partial))
                tried("fault")
    return calls


def _bare(spec: LayoutSpec, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    per_row = spec.tokens_per_row(PAGE)
    rows = -(-12 // per_row)
    buf = torch.randint(0, 256, (rows, spec.page_bytes(per_row)), generator=gen, dtype=torch.uint8)
    loc = torch.randperm(rows * per_row, generator=gen)[:5]
    values = torch.randn(5, spec.dim, generator=gen)
    return buf, loc, values


LAYOUT_PARAMS = [
    pytest.param(name, fnuz, id=name + ("-fnuz" if fnuz else ""))
    for name in sorted(LAYOUTS)
    for fnuz in ((False, True) if LAYOUTS[name].supports_fnuz else (False,))
]


@pytest.mark.parametrize(("name", "fnuz"), LAYOUT_PARAMS)
def test_layout_writes_are_all_or_nothing_under_faults(
    name: str, fnuz: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = LAYOUTS[name]
    buf, loc, values = _bare(spec, seed=len(name))
    spare = buf.clone()

    def run() -> None:
        quantize(spec, values, buf, loc, PAGE, fnuz=fnuz)

    def dry_run() -> None:
        quantize(spec, values, spare.clone(), loc, PAGE, fnuz=fnuz)

    calls = _attack(monkeypatch, run, dry_run, (buf, loc, values), name)
    assert calls["encode"] == (1 if spec.codec is _codec.PLAIN_CODEC else 3)  # chunks of 2
    # The same write, run cleanly afterwards, stores exactly the twin's bytes.
    run()
    expected = spare.clone()
    quantize(spec, values, expected, loc, PAGE, fnuz=fnuz)
    assert torch.equal(buf, expected)


def _expected_bytes(part: kvcompat.KVPoolProtocol, layer: int, write: Any) -> list[torch.Tensor]:
    """What the write must store: the layout codec applied to copies of the layer's buffers."""
    spec = part.layout(layer)
    out = []
    for buffer, layout, values in (
        (part.get_key_buffer(layer, wait=False), spec.key, write.key),
        (part.get_value_buffer(layer, wait=False) if spec.value else None, spec.value, write.value),
    ):
        if buffer is None or layout is None:
            continue
        copy = buffer.view(torch.uint8).clone()
        quantize(layout, values, copy.view(buffer.dtype), write.loc, part.page_size, impl="torch")
        out.append(copy)
    return out


@pytest.mark.parametrize("case", [c.param for c in ALL_CASES])
def test_pool_writes_are_all_or_nothing_under_faults(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    native = case.build()
    pool = kvcompat.adapt(native)
    targets = case.targets(pool)
    assert targets
    for index, (part, layer) in enumerate(targets):
        write = valid_write(part, layer, seed=index)
        if part.layout(layer).key.codec is _codec.PLAIN_CODEC:
            # Rows already in the stored dtype are stored as they are (no encode stage);
            # fp32 values take the cast, so every stage's faults are exercised.
            write = Write(
                part, layer, write.loc, write.key.float(),
                None if write.value is None else write.value.float(),
            )  # fmt: skip

        def dry_run(index: int = index, layer: int = layer, write: Any = write) -> None:
            twin_part, _ = case.targets(kvcompat.adapt(case.build()))[index]
            twin_part.write(layer, write.loc, write.key, write.value)

        calls = _attack(monkeypatch, write, dry_run, (native, pool, write), f"{case.id} L{layer}")
        if write.value is not None:
            assert calls["encode"] >= 2, "key and value are encoded separately"
        expected = _expected_bytes(part, layer, write)
        write()
        got = [part.get_key_buffer(layer, wait=False).view(torch.uint8)]
        if write.value is not None:
            got.append(part.get_value_buffer(layer, wait=False).view(torch.uint8))
        for have, want in zip(got, expected, strict=True):
            assert torch.equal(have, want), f"{case.id} L{layer}: the retried write differs"
