"""The vLLM matrix script's own logic (``tests/vllm_matrix.py``): releases, overlays, refusals."""

from __future__ import annotations

import os

import pytest
import vllm_matrix

from kvcompat.adapters._vllm_plan import TESTED_RELEASES


def _key(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in release.split("."))


def test_the_releases_are_the_tested_ones_oldest_first() -> None:
    assert vllm_matrix.RELEASES == TESTED_RELEASES
    assert list(vllm_matrix.RELEASES) == sorted(set(vllm_matrix.RELEASES), key=_key)


def test_the_tier_runs_on_the_release_overlay_first_with_triton_interpreted() -> None:
    env = vllm_matrix._env("0.34.0")
    paths = env["PYTHONPATH"].split(os.pathsep)
    assert paths[:2] == [str(vllm_matrix.OVERLAYS / "0.34.0"), str(vllm_matrix.DEPS)]
    assert env["TRITON_INTERPRET"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == ""


def test_an_unknown_release_is_refused_before_anything_is_installed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        vllm_matrix.main(["0.99.0"])
    assert "unknown releases ['0.99.0']" in capsys.readouterr().err
