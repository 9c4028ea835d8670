"""The release-matrix scripts' own logic: the release list and order, and the GPU runner's
failure report (``tests/release_matrix.py``, ``tests/gpu_matrix.py``)."""

from __future__ import annotations

import gpu_matrix
import release_matrix


def test_releases_are_oldest_first_with_each_patch_build_after_its_release() -> None:
    assert (
        tuple(sorted(release_matrix.RELEASES, key=release_matrix.release_key))
        == release_matrix.RELEASES
    )
    assert len(set(release_matrix.RELEASES)) == len(release_matrix.RELEASES)
    key = release_matrix.release_key
    assert key("0.5.12") < key("0.5.12.post1") < key("0.5.13") < key("0.5.23")
    assert release_matrix.RELEASES[-1] == release_matrix.BASE


def test_every_release_has_its_overlay_requirements_and_nothing_else_does() -> None:
    files = {path.stem for path in release_matrix.REQUIREMENTS.glob("*.txt")}
    assert files == set(release_matrix.RELEASES)
    for release in release_matrix.RELEASES:
        pins = (release_matrix.REQUIREMENTS / f"{release}.txt").read_text().splitlines()
        if release == release_matrix.BASE:  # the test venv itself (requirements/sglang-cpu.txt)
            assert not [pin for pin in pins if not pin.startswith("#")], pins
            continue
        assert f"sglang=={release}" in pins, release


def test_a_failed_gpu_run_reports_the_first_failure_not_the_summary_lines() -> None:
    cause = "building the store harness failed: no member named 'V41_NEW'"
    output = "\n".join(
        [".....EEEE", "==== ERRORS ====", "____ ERROR at setup ____", cause]
        + [f"ERROR tests/x.py::test[{i}]" for i in range(3000)]
        + ["==== 2 failed, 64 errors in 49.8s ===="]
    )
    report = gpu_matrix._first_failures(output)
    assert report.startswith("==== ERRORS ====")
    assert cause in report
    assert report.endswith("==== 2 failed, 64 errors in 49.8s ====")
    assert len(report) < 8000
    assert gpu_matrix._first_failures("1 failed") == "1 failed"  # no section: the tail
