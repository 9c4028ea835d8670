"""``docs/supported-versions.md`` is what the committed release-matrix results render to."""

from __future__ import annotations

import release_matrix


def test_supported_versions_page_is_rendered_from_the_committed_matrix() -> None:
    results = release_matrix.load_results()
    assert results, f"no matrix results under {release_matrix.DATA}: run `make releases`"
    want = release_matrix.render(results)
    got = release_matrix.PAGE.read_text()
    assert got == want, (
        "docs/supported-versions.md differs from the committed matrix data: run "
        "`python tests/release_matrix.py --render` (or the whole matrix) and commit both"
    )
