"""Build the docs without triton and measure rendered pages in Debian's headless chromium.

No screenshots: a small script is injected into a copy of the page, runs after the page has
loaded (fonts, CSS), measures with ``getBoundingClientRect``/``getBBox`` and writes JSON into
the DOM, which ``chromium --dump-dom`` prints.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SKIP_VAR = "KVCOMPAT_SKIP_BROWSER"
INSTALL = "apt-get update && apt-get install -y chromium (make test does it as root)"

# Runs sphinx with triton hidden, as if it were not installed (the docs dependency group
# does not install it). The hiding finder is put first; autodoc's mock finder, inserted
# later for autodoc_mock_imports, goes before it.
_SPHINX_WITHOUT_TRITON = textwrap.dedent(
    """
    import importlib.abc, sys

    class NoTriton(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "triton":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoTriton())
    from sphinx.cmd.build import main
    sys.exit(main(sys.argv[1:]))
    """
)


def build_docs_without_triton(out: Path) -> subprocess.CompletedProcess[str]:
    """``sphinx -W --keep-going -b html docs OUT`` with triton unimportable."""
    cmd = [sys.executable, "-c", _SPHINX_WITHOUT_TRITON]
    cmd += ["-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)


def chromium() -> str:
    """The chromium executable; fails (in CI always) or skips (locally, when asked) without it."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get(SKIP_VAR) == "1" and os.environ.get("CI", "").lower() not in {"1", "true"}:
        pytest.skip(f"chromium is not installed and {SKIP_VAR}=1 (install: {INSTALL})")
    pytest.fail(
        f"chromium is not installed: the rendered docs cannot be checked. Install it: {INSTALL}. "
        f"Locally (never in CI) {SKIP_VAR}=1 skips these tests.",
        pytrace=False,
    )


_HARNESS = """
<script>
window.addEventListener("load", () => {
  const run = () => {
    let result;
    try { result = (%s)(); } catch (e) { result = {error: String(e && e.stack || e)}; }
    result.innerWidth = window.innerWidth;
    result.clientWidth = document.documentElement.clientWidth;
    result.pageScrollWidth = document.documentElement.scrollWidth;
    if (window.parent !== window) {  // inside the phone-width frame: report to the wrapper
      window.parent.postMessage(JSON.stringify(result), "*");
      return;
    }
    const pre = document.createElement("pre");
    pre.id = "kvcompat-check";
    pre.textContent = JSON.stringify(result);
    document.body.appendChild(pre);
  };
  (document.fonts ? document.fonts.ready : Promise.resolve()).then(run);
});
</script>
"""

# Headless chromium will not make a window narrower than 500 px, so a phone's viewport is
# an iframe of the phone's width (media queries inside it see that width); the framed
# page posts its measurement to this wrapper, which puts it in the DOM chromium dumps.
_FRAME = """<!doctype html><html><body style="margin:0">
<iframe src="%s" width="%d" height="%d" style="border:0;display:block"></iframe>
<script>
window.addEventListener("message", (event) => {
  const pre = document.createElement("pre");
  pre.id = "kvcompat-check";
  pre.textContent = event.data;
  document.body.appendChild(pre);
});
</script></body></html>
"""
_MIN_WINDOW = 500

_RESULT = re.compile(r'<pre id="kvcompat-check">(.*?)</pre>', re.DOTALL)


def measure(page: Path, script: str, width: int, height: int) -> dict[str, Any]:
    """Load ``page`` at ``width`` x ``height`` CSS pixels and return what ``script`` returns.

    ``script`` is a JavaScript function expression returning a JSON-able object; it runs
    after the load event and the fonts. The page is copied next to itself so that its
    relative links (CSS, images) still resolve.
    """
    exe = chromium()
    copy = page.with_name(f"{page.stem}.kvcheck-{width}.html")
    text = page.read_text(encoding="utf-8")
    copy.write_text(text.replace("</body>", _HARNESS % script + "</body>", 1), encoding="utf-8")
    target = copy
    if width < _MIN_WINDOW:
        target = page.with_name(f"{page.stem}.kvframe-{width}.html")
        target.write_text(_FRAME % (copy.name, width, height), encoding="utf-8")
    cmd = [
        exe,
        "--headless",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--window-size={max(width, _MIN_WINDOW)},{height}",
        "--virtual-time-budget=15000",
        "--dump-dom",
        target.as_uri(),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=180)
    match = _RESULT.search(result.stdout)
    assert match, (
        f"chromium printed no measurement for {page.name} (exit {result.returncode}):\n"
        f"{result.stderr[-2000:]}"
    )
    data: dict[str, Any] = json.loads(html.unescape(match.group(1)))
    assert "error" not in data, data.get("error")
    assert data["innerWidth"] == width, f"chromium used a {data['innerWidth']}-px viewport"
    return data
