# The two commands that matter: `make demo` and `make test`. Both install what they need.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?= --durations=15

.PHONY: install stack demo test unit lint bench bench-rebuild clean-stack

install: $(VENV)/.installed

# Python prerequisites come from PyPI, pinned by constraints.txt (the lock).
$(VENV)/.installed: pyproject.toml constraints.txt
	@python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "error: Python 3.11+ is required (python3 is $$(python3 --version))"; exit 1; }
	@python3 -m venv --help >/dev/null 2>&1 && python3 -c 'import ensurepip' 2>/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null; }
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -U pip setuptools wheel
	$(VENV)/bin/pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
	@touch $@

# Real servers on 127.0.0.1 without Docker; state in .stack/, downloads cached in .cache/.
stack: install
	scripts/stack up

demo: stack
	$(PY) scripts/demo.py

# scripts/test runs the suite in two phases: the tests that restart a shared server alone, then
# the rest on CDC_TEST_WORKERS parallel workers (default 2; tests/schedule.py says how).
# With a Docker engine that answers, the tests start their servers with testcontainers (the
# images of docker-compose.yml) and the native stack stays down; CDC_TEST_NATIVE=1 forces it.
test: install
	@if [ "$${CDC_TEST_NATIVE:-}" != 1 ] && command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then \
		echo "Docker answers: the tests use testcontainers, not the native stack"; \
	else \
		scripts/stack up; \
	fi
	$(PY) scripts/test $(PYTEST_ARGS)

unit: install
	$(VENV)/bin/pytest -m unit $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy pgcdc cdc schemas sinks spark_jobs

bench: stack
	$(PY) scripts/bench.py

# Issue 12 case 6: rebuild a Redis follower from offset 0 of a 1M-row compacted topic with a
# 512 MiB driver and bounded micro-batches; reports peak RSS (BENCH_REBUILD_ARGS=--cluster:
# on the two-worker standalone cluster).
bench-rebuild: stack
	$(PY) -m benchmarks.rebuild $(BENCH_REBUILD_ARGS)

clean-stack:
	scripts/stack down
