# Two entry points, each doing all of its own set-up on a fresh machine:
#   make demo   - the main job on its embedded default (reference pools, pure torch)
#   make test   - lint, type-check, docs build, the whole test suite (incl. real SGLang and
#                 the rendered docs in headless Chromium) and the built wheel in a clean venv
# Both create .venv with the CPU build of torch pinned first (requirements/torch-cpu.txt):
# an unpinned torch would pull a multi-GB CUDA build.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check

.PHONY: demo test lint typecheck docs unit releases vllm wheel-check chromium bench clean

$(VENV)/.base-stamp: requirements/torch-cpu.txt requirements/build.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -r requirements/torch-cpu.txt -r requirements/build.txt
	$(PIP) install -q --no-deps --no-build-isolation -e .
	touch $@

$(VENV)/.test-stamp: $(VENV)/.base-stamp requirements/sglang-cpu.txt requirements/dev.txt requirements/transfer.txt
	$(PIP) install -q --no-deps -r requirements/sglang-cpu.txt -r requirements/dev.txt -r requirements/transfer.txt
	dpkg -s libibverbs1 >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
		{ apt-get update -q >/dev/null && apt-get install -y -q libibverbs1 >/dev/null; } || \
		echo "no libibverbs1: the Mooncake tests will skip"
	touch $@

demo: $(VENV)/.base-stamp
	$(PY) -m kvcompat demo

lint: $(VENV)/.test-stamp
	$(PY) -m ruff check kvcompat tests benchmarks examples docs .ci
	$(PY) -m ruff format --check kvcompat tests benchmarks examples .ci

typecheck: $(VENV)/.test-stamp
	$(PY) -m mypy

docs: $(VENV)/.test-stamp
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html

unit: $(VENV)/.test-stamp chromium
	$(PY) -m pytest

# The real tier under every SGLang release with DeepSeek-V4 pools (overlays beside the venv's
# 0.5.23); writes docs/_data/sglang-matrix/*.json and docs/supported-versions.md.
releases: $(VENV)/.test-stamp
	$(PY) tests/release_matrix.py

# The vLLM tier under every supported vLLM release (tests/vllm_matrix.py: RELEASES): each
# release, and the pinned light packages its imports need (requirements/vllm-cpu.txt), is a
# --no-deps overlay in .vllm-releases/ (never the venv: a plain pip install vllm pulls CUDA);
# writes docs/_data/vllm-matrix/*.json. Measured from an empty pip cache on 2 shared CPU
# cores: 3.3 minutes (installs 23 + 22 s, the tier 85 + 58 s).
vllm: $(VENV)/.test-stamp
	$(PY) tests/vllm_matrix.py

# The wheel as a user gets it: built, installed into a clean venv with only the pinned CPU
# torch, running demo, doctor, scan and every example outside the checkout (.ci/wheel_check.py).
wheel-check: $(VENV)/.base-stamp
	$(PY) .ci/wheel_check.py

# tests/docs/ renders the built docs in Debian's chromium. As root (CI on a fresh machine)
# it is installed when missing; elsewhere those tests fail with the install line, unless
# KVCOMPAT_SKIP_BROWSER=1 skips them (never in CI).
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
	else \
		echo "chromium is missing: sudo apt-get install chromium (the rendered-docs tests need it)"; \
	fi

test: lint typecheck docs unit releases vllm wheel-check

bench: $(VENV)/.base-stamp
	$(PY) benchmarks/bench_getters.py

clean:
	rm -rf $(VENV) docs/_build docs/_generated .wheel-check .vllm-releases build dist \
		.pytest_cache .mypy_cache .ruff_cache .hypothesis
