# The two commands that matter: `make demo` and `make test`. Both install what they need.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?= --durations=40

.PHONY: install stack demo test test-containers test-newest test-matrix unit lint bench bench-rebuild verify-load soak clean-stack docker-up docker-down docker-images demo-docker

install: $(VENV)/.installed $(VENV)/.native

# Python prerequisites come from PyPI, pinned by constraints.txt (the lock).
$(VENV)/.installed: pyproject.toml constraints.txt
	@python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "error: Python 3.11+ is required (python3 is $$(python3 --version))"; exit 1; }
	@python3 -m venv --help >/dev/null 2>&1 && python3 -c 'import ensurepip' 2>/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null; }
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -U pip setuptools wheel
	@# Every editable mode of setuptools prints a BuildBackendWarning (a UserWarning) about
	@# editable installs in general, on every install: not ours to act on, so not shown.
	PYTHONWARNINGS=ignore::UserWarning $(VENV)/bin/pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
	@# Bytecode in pyspark's zips, which Spark puts first on every Python process's path.
	$(PY) -m pgcdc.stack.pyspark_bytecode
	@touch $@

# pgcdc's native module (native/, Rust: pgcdc/core/native.py), built where cargo is (rustup's
# ~/.cargo/bin counts); without it pgcdc takes the Python twins of the same code, slower.
$(VENV)/.native: $(VENV)/.installed native/pyproject.toml native/Cargo.toml native/Cargo.lock $(wildcard native/src/*.rs)
	@export PATH="$$PATH:$$HOME/.cargo/bin"; \
	if command -v cargo >/dev/null; then \
		echo "building pgcdc's native module (native/, cargo)"; \
		$(VENV)/bin/pip install -q --disable-pip-version-check ./native || exit 1; \
	else \
		echo "note: no cargo here: pgcdc runs without its native module (cdc verify is slower)"; \
	fi
	@touch $@

# Real servers on 127.0.0.1 without Docker; state in .stack/, downloads cached in .cache/.
stack: install
	scripts/stack up
	@# The archive of Spark's classes every job's driver JVM maps (pgcdc/stack/spark_cds.py):
	@# written once (half a minute), it halves what a job's JVM spends starting.
	$(PY) -m pgcdc.stack.spark_cds

demo: stack
	$(PY) scripts/demo.py

# scripts/test runs the suite in three phases: the tests that restart a shared server alone,
# the part of the reader's suite a PostgreSQL major can change on the newest major (18, a
# server of its own: tests/pg_majors.py), then the rest on CDC_TEST_WORKERS parallel workers
# (default 3; tests/schedule.py says how).
# The servers: the native stack, or with CDC_TEST_DOCKER=1 containers (testcontainers) from
# the project's images (built if missing, never pulled); CDC_TEST_NATIVE=1 forces the native
# stack. The Docker tests (marker docker: the compose stack end to end, and the followers'
# e2e tests on testcontainers: make test-containers) start the parallel phase; their images are
# prepared in the background from the start, at the lowest CPU priority, while the exclusive
# tests run (not with CDC_TEST_NATIVE=1: then those tests prepare them when they start;
# CDC_TEST_DOCKER=0: neither, they skip).
test: install
	@if [ "$${CDC_TEST_NATIVE:-}" != 1 ] && [ "$${CDC_TEST_DOCKER:-}" = 1 ]; then \
		echo "CDC_TEST_DOCKER=1: the tests use testcontainers (the project's images), not the native stack"; \
		scripts/docker images; \
	else \
		scripts/stack up; \
		if [ "$${CDC_TEST_NATIVE:-}" != 1 ] && [ "$${CDC_TEST_DOCKER:-}" != 0 ]; then \
			scripts/docker images --background; \
		fi; \
	fi
	$(PY) scripts/test $(PYTEST_ARGS)

# The followers' end-to-end tests with their servers as testcontainers of the project's images
# (the default run has one such test, in tests/e2e/test_docker.py; the whole set is not, for CI
# time). CDC_TEST_FOLLOWERS_CHANGES sets the streamed workload.
test-containers: install
	scripts/docker images
	CDC_TEST_DOCKER=1 $(VENV)/bin/pytest tests/e2e/test_followers.py $(PYTEST_ARGS)

# PostgreSQL majors (docs/own-postgres.md#postgresql-versions). CDC_TEST_POSTGRES=<major>
# points the tests at a server of that major started beside the stack (15: the stack's own);
# 17 and 18 run from Debian roots built once into .cache/pgroots. The suites are named in
# tests/pg_majors.py.
PG_MAJORS ?= 15 17 18
PG_NEWEST := $(shell $(PY) -c 'from tests.pg_majors import NEWEST; print(NEWEST)' 2>/dev/null || echo 18)

# The newest major's part of `make test` alone.
test-newest: install
	scripts/stack up
	CDC_TEST_POSTGRES=$(PG_NEWEST) $(PY) scripts/test $(PYTEST_ARGS) \
		$$($(PY) -c 'from tests.pg_majors import NEWEST_SUBSET; print(*NEWEST_SUBSET)')

# The reader's suite, the real-database cases, the Debezium parity module and the failover
# test on every major (PG_MAJORS="17" for one), each through scripts/test; a line per major at
# the end.
test-matrix: install
	scripts/stack up
	@suite="$$($(PY) -c 'from tests.pg_majors import MAJOR_SUITE; print(*MAJOR_SUITE)')"; \
	status=0; summary=""; for m in $(PG_MAJORS); do \
		echo "=== PostgreSQL $$m"; \
		CDC_TEST_POSTGRES=$$m $(PY) scripts/test $(PYTEST_ARGS) $$suite; rc=$$?; \
		summary="$$summary\nPostgreSQL $$m: $$( [ $$rc -eq 0 ] && echo passed || echo "FAILED ($$rc)" )"; \
		[ $$rc -eq 0 ] || status=$$rc; \
	done; printf "$$summary\n"; exit $$status

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

# Issue 32's acceptance, not in CI: `cdc verify` ten passes in a row, none with drift, while
# 1,000 changes a second land in both followers (the suite runs the same test at about 280 a
# second, two passes). Run it alone on the machine.
verify-load: stack
	VERIFY_LOAD_TXNS_PER_SECOND=21.3 VERIFY_LOAD_PASSES=10 \
		$(VENV)/bin/pytest tests/e2e/test_verify.py -k live_load -s $(PYTEST_ARGS)

# Issue 32's chaos soak, not in CI: a pgbench-like load while a nemesis kills and restarts
# the reader, the job and the servers and cuts the followers off, at times drawn from a seed
# it prints; it ends with `cdc verify` clean (tests/soak.py). It restarts the stack's
# servers: run it alone on the machine. SOAK_ARGS="--minutes 5 --seed 7" for a shorter or a
# replayed run.
soak: stack
	$(PY) -m tests.soak $(SOAK_ARGS)

clean-stack:
	scripts/stack down

# The compose stack (docker-compose.yml) on the native stack's host ports: prepares what is
# missing (the Docker engine, Compose v2, the Debian base image, the images), then
# `docker compose up -d --wait`. Stop the native stack first (make clean-stack).
# REGISTRY=1 adds the schema registry for Avro (compose's profile `registry`, docs/avro.md).
docker-up:
	scripts/docker up $(if $(filter 1,$(REGISTRY)),--registry)

# `docker compose down -v`: the containers, the network and the volumes.
docker-down:
	scripts/docker down

docker-images:
	scripts/docker images

# The demo on the compose stack, from an empty one (its volumes are removed first): load the
# sample, live changes with the reader killed mid-stream, the followers compared row by row.
demo-docker: install
	scripts/docker down
	scripts/docker up
	$(VENV)/bin/python -P -m demo.compose
