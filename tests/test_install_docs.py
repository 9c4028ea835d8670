"""The install the pages promise is the one CI runs.

README.md, docs/index.md and docs/quickstart.md carry one install block after an
``<!-- install-commands`` marker; ``.ci/wheel_check.py`` (``make wheel-check``) reads it
from docs/quickstart.md and runs it line by line in a clean venv. docs/real-sglang.md's
SGLang line is the one the Makefile's test environment runs. Until kvcompat is on PyPI, no
page tells a user to ``pip install kvcompat``.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "docs" / "index.md", ROOT / "docs" / "quickstart.md"]
REAL_SGLANG = ROOT / "docs" / "real-sglang.md"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


@pytest.fixture(scope="module")
def wheel_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("wheel_check", ROOT / ".ci" / "wheel_check.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _block(text: str, marker: str) -> str:
    after = text[text.index(marker) :]
    return after[: after.index("\n```", after.index("```bash")) + 4]


def _pinned_torch() -> str:
    pins = (ROOT / "requirements" / "torch-cpu.txt").read_text().splitlines()
    (line,) = [line for line in pins if line.startswith("torch==")]
    return line.split("==", 1)[1].strip()


def test_the_three_pages_carry_the_same_install_block() -> None:
    blocks = {}
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert text.count("<!-- install-commands") == 1, page.name
        blocks[page.name] = _block(text, "<!-- install-commands")
    assert len(set(blocks.values())) == 1, blocks


def test_wheel_check_runs_the_quickstart_block(wheel_check: ModuleType) -> None:
    text = (ROOT / "docs" / "quickstart.md").read_text(encoding="utf-8")
    commands = wheel_check.install_commands(text)
    assert commands == [
        f"pip install torch=={_pinned_torch()} --index-url {CPU_INDEX}",
        "pip wheel --no-deps -w dist .",
        "pip install dist/kvcompat-*.whl",
        "kvcompat demo",
    ]
    # Where the CPU index resolves, every line runs as written; CI's machines reach PyPI only,
    # so the index option alone goes (their pip configuration serves the same CPU wheel).
    literal = wheel_check.page_steps(commands, reachable=True)
    assert literal == [
        ("torch", commands[0]),
        ("build", commands[1]),
        ("shell", commands[2]),
        ("shell", commands[3]),
    ]
    offline = wheel_check.page_steps(commands, reachable=False)
    assert offline[0] == ("torch", f"pip install torch=={_pinned_torch()}")
    assert offline[1:] == literal[1:]


def test_wheel_check_refuses_a_page_it_cannot_follow(wheel_check: ModuleType) -> None:
    with pytest.raises(wheel_check.CheckError, match="build line changed"):
        wheel_check.page_steps(["pip wheel -w wheels ."], reachable=True)
    with pytest.raises(wheel_check.CheckError, match="no <!-- install-commands marker"):
        wheel_check.install_commands("```bash\npip install kvcompat\n```\n")


def test_cpu_torch_comes_first_on_every_page() -> None:
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        installs = re.findall(r"^pip install .*$", text, flags=re.MULTILINE)
        assert installs, page.name
        assert installs[0].startswith(f"pip install torch=={_pinned_torch()} "), (page, installs)
        assert f"--index-url {CPU_INDEX}" in installs[0]


@pytest.mark.parametrize("page", [*PAGES, REAL_SGLANG], ids=lambda p: p.name)
def test_no_page_installs_kvcompat_from_pypi_before_a_release(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    from_pypi = re.findall(r"pip install (?:--no-deps )?['\"]?kvcompat\b", text)
    assert from_pypi == [], f"{page.name}: kvcompat is not on PyPI yet: {from_pypi}"


def test_real_sglang_page_installs_what_the_test_environment_installs() -> None:
    text = REAL_SGLANG.read_text(encoding="utf-8")
    block = _block(text, "<!-- sglang-install-commands")
    lines = [line for line in block.splitlines()[2:-1] if line.strip()]
    assert lines == ["pip install --no-deps -r requirements/sglang-cpu.txt"]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "install -q --no-deps -r requirements/sglang-cpu.txt" in makefile
    requirements = (ROOT / "requirements" / "sglang-cpu.txt").read_text(encoding="utf-8")
    assert "docs/real-sglang.md" in requirements
    assert "torchvision" not in [line.split("==")[0] for line in requirements.splitlines()]
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    assert "\nreal-sglang\n" in index, "the page is in the toctree"
