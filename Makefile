# Gangway: `make up` starts the local stack (and, later, the services); `make test` runs every tier.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# The venv's interpreter: the distribution's CPython 3.11 where there is one (Debian and Ubuntu
# build it with profile-guided and link-time optimisation, as the python:3.11 images the
# Dockerfile uses are built), else the first python3.11 (then python3) on PATH. pyenv's default
# build has neither: on it the scheduler's busy cycle and every service spend a quarter more CPU
# (docs/benchmarks.md). `make PYTHON=...` chooses another; a venv, once made, is kept.
PATH_PYTHON := $(shell command -v python3.11 || command -v python3)
PYTHON ?= $(firstword $(wildcard /usr/bin/python3.11) $(PATH_PYTHON))
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help venv venv-torch up up-stack up-services down down-stack down-services status test test-unit test-integration bench lint chaos mutation

help:
	@echo "make up | down | status | test | bench | lint | venv | chaos"

# Reinstalled whenever pyproject.toml changes, so new dependencies reach every checkout.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); \
		echo "[venv] $(PYTHON) cannot make a venv (no python3.11-venv?); using $(PATH_PYTHON)"; \
		$(PATH_PYTHON) -m venv $(VENV); }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

# torch for the tests only (`make up` stays light): PyTorch's CPU-only wheel where its index can
# be reached (one quick try), else PyPI's, which on Linux brings CUDA's libraries (about 5 GB
# installed). A venv that already has torch keeps it.
TORCH_STAMP := $(VENV)/.torch-installed
$(TORCH_STAMP): $(STAMP)
	$(PY) -c 'import torch' 2>/dev/null \
		|| $(PY) -m pip install -q --retries 0 --timeout 20 \
			--index-url https://download.pytorch.org/whl/cpu 'torch>=2.2' 2>/dev/null \
		|| echo "[venv] PyTorch's CPU-only index is unreachable; installing PyPI's torch"
	$(PY) -m pip install -q -e '.[dev,torch]'
	@touch $(TORCH_STAMP)

venv-torch: $(TORCH_STAMP)

up-stack:
	scripts/stack.sh up

# Migrations, admin token, every service and the simulated fleet (GANGWAY_CLUSTER, default
# 16x8:4:2) and Prometheus (unless GANGWAY_PROMETHEUS=0); prints the API URL. Idempotent:
# what already runs is left running.
up-services: venv up-stack
	scripts/prometheus.sh
	$(PY) -m gangway.launcher up

up: venv up-stack up-services

down-services:
	@if [ -x $(PY) ]; then $(PY) -m gangway.launcher down; fi

status:
	@scripts/stack.sh status
	@if [ -x $(PY) ]; then $(PY) -m gangway.launcher status; fi

down-stack:
	scripts/stack.sh down

down: down-services down-stack

# GANGWAY_TEST_TORCH=required: the PyTorch test fails, never skips, when torch is missing.
test: venv venv-torch up-stack
	scripts/prometheus.sh
	scripts/browser.sh
	set -a && source .gangway/env && set +a && GANGWAY_TEST_TORCH=required $(PY) -m pytest -q

test-unit: venv
	$(PY) -m pytest -q -m "not integration and not e2e"

test-integration: venv up-stack
	scripts/prometheus.sh
	scripts/browser.sh
	set -a && source .gangway/env && set +a && $(PY) -m pytest -q -m integration

bench: venv up-stack
	@$(PY) -c 'import sys; print("python", sys.version.split()[0], "from", sys._base_executable)'
	set -a && source .gangway/env && set +a && \
	for script in bench/bench_*.py; do echo "== $$script"; $(PY) "$$script" || exit 1; done

# Broker and database outages and scheduler kills under load, on a stack of its own (own ports
# and directories under .chaos/; a few minutes, stops by itself). Not part of `make test`.
chaos: venv
	$(PY) -m tests.chaos

# mutmut over the scheduling core with the core tests, bounded to 30 minutes; the last line is
# `mutation score: K killed of M (P%)`. MUTATION_ARGS passes options (e.g. --modules ordering).
mutation: venv
	$(PY) scripts/mutation.py $(MUTATION_ARGS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .
