"""Model definitions: accesses in code that only its own architecture's pool reaches.

A module that sets ``EntryClass`` (SGLang's model registration) and reads no
``.architectures``, a module only such modules import, and a top-level def only they
import by name are model code: ``scan_paths`` counts their accesses in
``ScanReport.model_code`` instead of reporting them, ``--include-models`` reports them,
and ``--fix`` leaves them as they are.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trees import write_tree

from kvcompat.scan import main, scan_paths

READ = "def read(pool, i):\n    return pool.get_value_buffer(i)\n"


def _reported(report_paths: list[str], root: Path) -> list[str]:
    return sorted(Path(p).relative_to(root).as_posix() for p in report_paths)


def _scan(root: Path, **options: bool) -> tuple[list[str], int]:
    report = scan_paths([root], **options)
    return _reported([f.path for f in report.findings], root), report.model_code


def test_a_module_that_registers_models_is_not_reported(tmp_path: Path) -> None:
    write_tree(tmp_path, {"pkg/models/llama.py": READ + "EntryClass = [Llama]\n"})
    assert _scan(tmp_path) == ([], 1)
    assert _scan(tmp_path, include_models=True) == (["pkg/models/llama.py"], 0)


@pytest.mark.parametrize(
    "registration",
    [
        "EntryClass: list[type] = [Llama]\n",
        "EntryClass = Llama\n",
    ],
)
def test_annotated_and_single_registrations_count(tmp_path: Path, registration: str) -> None:
    write_tree(tmp_path, {"m.py": READ + registration})
    assert _scan(tmp_path) == ([], 1)


@pytest.mark.parametrize(
    "not_a_registration",
    [
        "def setup():\n    EntryClass = [Llama]\n",  # not at module level
        "ENTRYCLASS = [Llama]\n",
        "registry.EntryClass = [Llama]\n",
        "# EntryClass = [Llama]\n",
    ],
)
def test_only_a_module_level_entry_class_registers(tmp_path: Path, not_a_registration: str) -> None:
    write_tree(tmp_path, {"m.py": READ + not_a_registration})
    assert _scan(tmp_path) == (["m.py"], 0)


def test_a_wrapper_that_reads_architectures_is_reported(tmp_path: Path) -> None:
    """Like SGLang's MindSpore model: one class that serves whatever architecture it is given."""
    write_tree(
        tmp_path,
        {
            "wrapper.py": READ
            + "def use_mla(config):\n    return config.architectures[0] == 'DeepseekV3'\n"
            + "EntryClass = [Wrapper]\n",
        },
    )
    assert _scan(tmp_path) == (["wrapper.py"], 0)


def test_a_module_only_model_definitions_import_is_model_code(tmp_path: Path) -> None:
    write_tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/models/common/attn.py": READ,
            "pkg/models/llama.py": "from pkg.models.common.attn import read\nEntryClass = [L]\n",
            "pkg/models/qwen.py": "from pkg.models.common import attn\nEntryClass = [Q]\n",
        },
    )
    assert _scan(tmp_path) == ([], 1)


def test_one_import_from_generic_code_keeps_it_reported(tmp_path: Path) -> None:
    write_tree(
        tmp_path,
        {
            "pkg/models/common/attn.py": READ,
            "pkg/models/llama.py": "from pkg.models.common.attn import read\nEntryClass = [L]\n",
            "pkg/layers/backend.py": "def f():\n    from pkg.models.common.attn import read\n",
        },
    )
    assert _scan(tmp_path) == (["pkg/models/common/attn.py"], 0)


def test_relative_imports_are_resolved(tmp_path: Path) -> None:
    write_tree(
        tmp_path,
        {
            "pkg/models/common/__init__.py": "",
            "pkg/models/common/attn.py": READ,
            "pkg/models/llama.py": "from .common.attn import read\nEntryClass = [L]\n",
            "pkg/models/common/rope.py": READ,
            "pkg/models/mistral.py": "from .common import rope\nEntryClass = [M]\n",
            "pkg/other/rope.py": READ,  # same name, another package: not what .common names
        },
    )
    assert _scan(tmp_path) == (["pkg/other/rope.py"], 2)


def test_a_helper_imported_by_name_only_by_models_is_model_code(tmp_path: Path) -> None:
    """Like ``create_fused_set_kv_buffer_arg`` of SGLang's ``models/utils.py``."""
    write_tree(
        tmp_path,
        {
            "pkg/models/utils.py": READ + "def shared(pool):\n    return pool.get_kv_buffer(0)\n",
            "pkg/models/gpt.py": "from pkg.models.utils import read\nEntryClass = [G]\n",
            "pkg/layers/quant.py": "from pkg.models.utils import shared\n",
        },
    )
    report = scan_paths([tmp_path])
    assert [(f.line, f.code) for f in report.findings] == [(4, "KVC002")]
    assert report.model_code == 1


def test_a_whole_module_import_from_generic_code_keeps_every_def_reported(
    tmp_path: Path,
) -> None:
    write_tree(
        tmp_path,
        {
            "pkg/models/utils.py": READ,
            "pkg/models/gpt.py": "from pkg.models.utils import read\nEntryClass = [G]\n",
            "pkg/layers/quant.py": "import pkg.models.utils as helpers\n",
        },
    )
    assert _scan(tmp_path) == (["pkg/models/utils.py"], 0)


def test_an_import_cycle_without_a_model_is_reported(tmp_path: Path) -> None:
    write_tree(
        tmp_path,
        {
            "a.py": "import b\n" + READ,
            "b.py": "import a\n" + READ,
        },
    )
    assert _scan(tmp_path) == (["a.py", "b.py"], 0)


def test_chains_of_importers_are_followed(tmp_path: Path) -> None:
    write_tree(
        tmp_path,
        {
            "m/base.py": READ,
            "m/mid.py": "import m.base\n",
            "m/top.py": "import m.mid\nEntryClass = [T]\n",
        },
    )
    assert _scan(tmp_path) == ([], 1)


def test_files_named_one_by_one_are_not_judged_by_importers(tmp_path: Path) -> None:
    """Pre-commit passes the changed files: their importers may be elsewhere."""
    write_tree(
        tmp_path,
        {
            "pkg/models/common.py": READ,
            "pkg/models/llama.py": "from pkg.models.common import read\nEntryClass = [L]\n",
        },
    )
    alone = scan_paths([tmp_path / "pkg/models/common.py"])
    assert [f.code for f in alone.findings] == ["KVC001"]
    assert alone.model_code == 0


def test_a_part_of_the_package_is_not_enough(tmp_path: Path) -> None:
    """Scanning ``pkg/models`` alone cannot see ``pkg/layers`` importing the helper."""
    write_tree(
        tmp_path,
        {
            "pkg/models/common.py": READ,
            "pkg/models/llama.py": "from pkg.models.common import read\nEntryClass = [L]\n",
            "pkg/layers/backend.py": "from pkg.models.common import read\n",
        },
    )
    models = scan_paths([tmp_path / "pkg" / "models"])
    assert [f.code for f in models.findings] == ["KVC001"]
    assert _scan(tmp_path) == (["pkg/models/common.py"], 0)


@pytest.mark.parametrize(
    ("options", "parses"),
    [
        (["--exclude", "layers"], True),  # the directory left out
        (["--exclude", "backend.py"], True),  # the file left out
        ([], False),  # it does not parse: its imports are unknown
    ],
)
def test_a_package_with_a_file_left_out_is_not_judged_by_importers(
    tmp_path: Path, options: list[str], parses: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """The one generic importer, ``pkg/layers/backend.py``, is not read."""
    backend = "from pkg.models.common import read\n" + ("" if parses else "def broken(:\n")
    write_tree(
        tmp_path,
        {
            "pkg/models/common.py": READ,
            "pkg/models/llama.py": "from pkg.models.common import read\nEntryClass = [L]\n",
            "pkg/layers/backend.py": backend,
        },
    )
    main(["--format", "json", *options, str(tmp_path)])
    document = json.loads(capsys.readouterr().out)
    flagged = [Path(f["path"]).relative_to(tmp_path).as_posix() for f in document["findings"]]
    assert flagged == ["pkg/models/common.py"]
    assert document["model_code"] == 0


def test_fix_leaves_model_code_alone(tmp_path: Path) -> None:
    write_tree(
        tmp_path,
        {
            "pkg/models/utils.py": READ + "def shared(pool):\n    return pool.get_kv_buffer(0)\n",
            "pkg/models/gpt.py": "from pkg.models.utils import read\nEntryClass = [G]\n",
            "pkg/layers/quant.py": "from pkg.models.utils import shared\n",
        },
    )
    utils = tmp_path / "pkg/models/utils.py"
    assert main(["--fix", str(tmp_path)]) == 0
    fixed = utils.read_text(encoding="utf-8")
    assert "    return pool.get_value_buffer(i)\n" in fixed  # model code: as it was
    assert "return _kvcompat_get_kv_buffer(pool, 0)" in fixed  # the generic helper: fixed


def test_fix_with_include_models_rewrites_model_code_too(tmp_path: Path) -> None:
    write_tree(tmp_path, {"llama.py": READ + "EntryClass = [L]\n"})
    assert main(["--fix", "--include-models", str(tmp_path)]) == 0
    assert "return _kvcompat_get_value_buffer(pool, i)" in (tmp_path / "llama.py").read_text()


def test_the_cli_says_what_it_did_not_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_tree(tmp_path, {"llama.py": READ + "EntryClass = [L]\n", "backend.py": READ})
    assert main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "backend.py:2:" in out
    assert "llama.py" not in out
    assert out.splitlines()[-1] == (
        "kvcompat scan: 1 finding in 1 of 2 files (1 fixable with --fix); "
        "1 access in model definitions not reported (--include-models shows them)."
    )
    assert main(["--include-models", "--format", "json", str(tmp_path)]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["model_code"] == 0
    assert len(document["findings"]) == 2


def test_files_without_findings_do_not_count(tmp_path: Path) -> None:
    write_tree(tmp_path, {"llama.py": "EntryClass = [L]\n", "backend.py": "import kvcompat\n"})
    report = scan_paths([tmp_path])
    assert (report.findings, report.model_code, report.files) == ((), 0, 2)
    assert report.summary() == "kvcompat scan: no unguarded pool accesses in 2 files."


_SOURCES = {
    "pkg/models/llama.py": "from pkg.models.common import read\nEntryClass = [L]\n" + READ,
    "pkg/models/common.py": "from pkg.models.utils import read\n" + READ,
    "pkg/models/utils.py": READ,
    "pkg/models/rope.py": "from . import utils\n" + READ,
    "pkg/layers/backend.py": "import pkg.models.utils\n" + READ,
    "pkg/layers/__init__.py": "",
}
_PARTS = (*_SOURCES, "pkg", "pkg/models", "pkg/layers")


def _found(paths: list[Path], root: Path) -> set[tuple[str, int]]:
    return {(Path(f.path).relative_to(root).as_posix(), f.line) for f in scan_paths(paths).findings}


@settings(max_examples=30, deadline=None)
@given(
    chosen=st.sets(st.sampled_from(_PARTS), min_size=1),
    drop_backend_import=st.booleans(),
)
def test_scanning_part_of_a_tree_never_reports_less(
    tmp_path_factory: pytest.TempPathFactory, chosen: set[str], drop_backend_import: bool
) -> None:
    """Every finding of a whole-tree scan is found again by a scan of some of its files
    and directories; and model code is counted, not lost."""
    sources = dict(_SOURCES)
    if drop_backend_import:
        sources["pkg/layers/backend.py"] = READ
    root = write_tree(tmp_path_factory.mktemp("tree"), sources)
    whole = _found([root], root)
    part = _found([root / name for name in sorted(chosen)], root)
    scanned = {
        name for name in _SOURCES if any(name == c or name.startswith(c + "/") for c in chosen)
    }
    assert {found for found in whole if found[0] in scanned} <= part
    everything = scan_paths([root], include_models=True)
    assert len(everything.findings) == len(whole) + scan_paths([root]).model_code
