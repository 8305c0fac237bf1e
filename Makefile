# Two commands do all set-up on a fresh machine:
#   make demo   — sweep the local node with the project's own model pair, write review.html
#   make test   — lint and run the whole test suite against real sshd, PostgreSQL, mlx-lm, Chromium
# Each creates .venv (keyed by the hash of pyproject.toml) and installs what it needs.

SHELL := /bin/bash
# Debian's interpreter when present: sshd test nodes log in as other users and must be
# able to run the venv's python (pyenv builds often live under a 0700 /root).
PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || command -v python3)
VENV := .venv
DEPS_HASH := $(shell cat pyproject.toml | sha256sum | cut -c1-16)
STAMP := $(VENV)/.installed-$(DEPS_HASH)

.PHONY: demo test lint system-deps clean

$(STAMP): pyproject.toml
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	@# uv (one of our dependencies anyway) installs the same versions in half pip's time:
	@# it unpacks from its cache and compiles the bytecode on both CPUs (pip: 31 s, uv: 16 s)
	$(VENV)/bin/python -m pip install -q --upgrade pip 'uv>=0.5'
	$(VENV)/bin/uv pip install -q --python $(VENV)/bin/python --compile-bytecode -e '.[test]'
	@rm -f $(VENV)/.installed-* && touch $@

demo: $(STAMP)
	$(VENV)/bin/specfleet demo

system-deps:
	@scripts/system-deps

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy --cache-dir $${SPECFLEET_CACHE:-$$HOME/.cache/specfleet}/mypy

# Three workers, one test module at a time each (its fixtures run once; most tests wait on
# sshd, agents and servers, not on the 2 CPUs), the slow modules first (tests/conftest.py),
# then the few marked `alone`: they restart PostgreSQL or judge timing and contention.
# Lint runs among the modules (tests/test_lint.py: the same commands as `make lint`).
# Both parts preload OpenBLAS (tests/blas.py: ~3x faster generations, the same checks;
# a test that asks for the `default_blas` fixture keeps mlx's own). The alone part collects
# only the modules that mark a test `alone` (collecting all of them took 4 CPU-s).
# Bytecode is cached even where PYTHONDONTWRITEBYTECODE is set: without it every worker
# rewrote every test module's asserts afresh (collecting all: 11.9 -> 5.7 CPU-s) and every
# `specfleet` and agent process compiled our modules from source (a sweep's ~0.1 CPU-s).
PYTEST = env -u PYTHONDONTWRITEBYTECODE $$($(VENV)/bin/python -m tests.blas) $(VENV)/bin/python -m pytest
# The alone part runs and reports even when the first part failed; the target still fails
# if either did (each part's status is said at the end).
test: $(STAMP) system-deps
	@first=0; second=0; \
	$(PYTEST) -n 3 --dist loadscope --no-loadscope-reorder -m "not alone" -v -ra --durations=15 \
		|| first=$$?; \
	$(PYTEST) -m alone -v -ra $$(grep -l "mark.alone" tests/test_*.py) || second=$$?; \
	echo "make test: parallel part exit $$first, alone part exit $$second"; \
	test $$first -eq 0 -a $$second -eq 0

clean:
	rm -rf $(VENV) .specfleet-demo
