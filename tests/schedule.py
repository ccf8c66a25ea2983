"""How `make test` spreads the suite over parallel pytest workers (pytest-xdist).

Three rules, applied at collection (``pytest_collection_modifyitems`` in ``tests/conftest.py``):

- **A module is one unit of work.** ``tests/conftest.py``'s ``pytest_xdist_make_scheduler``
  gives pytest-xdist a scheduler whose unit of work is a module's group (:func:`scope_of`), so
  a whole module goes to one worker and a module-scoped fixture (a pipeline, a throwaway
  server, a started job) is built once. (xdist's own ``--dist loadgroup`` marks no group under
  pytest 9.2: it renames ``item._nodeid``, which pytest no longer reads, and every test became
  a unit of its own, so two workers built the same module's fixtures and started the same
  fixed-port cluster.) Modules that share something
  the stack owns under a fixed name (the Spark standalone cluster, the Redis and Kafka
  clusters, the secure listeners) share one group, so they never start it at the same time.
- **Longest first.** Units are handed out in collection order, so the modules known to be
  slow are moved to the front (longest-processing-time-first keeps one long module from
  starting last and running alone at the end).
- **Exclusive tests run alone.** A test that stops or kills a server of the shared stack is
  marked ``exclusive``; `make test` runs those in a second, serial phase after the parallel
  one (``scripts/test``), because every other test would see the server go away.
"""

from __future__ import annotations

# Modules that use a server of the stack that has one fixed name and port, by group.
SHARED_GROUPS: dict[str, str] = {
    "tests/e2e/test_scale_out.py": "clusters",
    "tests/integration/test_sinks_cache_cluster.py": "clusters",
    "tests/integration/security/": "secure",
}

# Seconds a module took in a full run on this kind of machine (2 cores, whole stack), the
# slowest first; modules not listed count as fast. Only the order matters.
SLOW_MODULES: dict[str, float] = {
    # The Docker module is the longest and goes first: `make test` prepares their images in
    # the background while the exclusive tests run, so they are ready by then (they were
    # last once, and ran alone for 25 minutes at the end while the other worker idled).
    "tests/e2e/test_docker.py": 1200,
    "tests/integration/real_databases/test_followers_real.py": 700,
    "tests/e2e/test_jobs_robustness.py": 420,
    # Case 9 on servers of its own (it left the exclusive phase): kills, restarts, both jobs.
    "tests/integration/real_databases/test_kills_and_restarts.py": 250,
    "tests/integration/real_databases/test_keys_and_truncate.py": 400,
    "tests/integration/incremental/test_kills.py": 360,
    "tests/integration/incremental/test_joined_and_signals.py": 300,
    "tests/integration/incremental/test_on_demand.py": 300,
    "tests/e2e/test_followers.py": 300,
    "tests/e2e/test_scale_out.py": 280,
    "tests/e2e/test_avro_input.py": 200,
    "tests/integration/real_databases/test_reader_robustness.py": 180,
    "tests/integration/debezium_parity/test_debezium_parity.py": 150,
    "tests/e2e/test_demo.py": 150,
    "tests/e2e/test_sync.py": 150,
    "tests/integration/security/": 150,
    "tests/integration/real_databases/test_reader_robustness_failures.py": 120,
    "tests/integration/operator/test_newcomer_mistakes.py": 120,
    "tests/integration/test_docs_run.py": 110,
    "tests/e2e/test_failover.py": 240,
    "tests/integration/debezium_parity/test_connect_sink.py": 100,
}


def _lookup(table: dict[str, object], path: str) -> object | None:
    for prefix, value in table.items():
        if path == prefix or (prefix.endswith("/") and path.startswith(prefix)):
            return value
    return None


def scope_of(nodeid: str) -> str:
    """The unit of work a test id belongs to: its module's group (see the module docstring)."""
    return group_of(nodeid.split("::", 1)[0])


def group_of(module_path: str) -> str:
    """The xdist group a module's tests go to (its own path unless it shares a group)."""
    shared = _lookup(SHARED_GROUPS, module_path)
    return str(shared) if shared is not None else module_path


def weight(module_path: str) -> float:
    """How long a module is expected to take; 0 for the ones not listed."""
    w = _lookup(SLOW_MODULES, module_path)
    return float(w) if isinstance(w, int | float) else 0.0


class TimeSpent:
    """Where a parallel run's time went: each worker's busy seconds and the span from its
    first test to its last (a worker idle at the end shows as a shorter span), and the
    slowest modules with setup and teardown counted. Printed at the end of a run on workers
    (``pytest_terminal_summary``), so CI's log says which modules to cut or move first."""

    def __init__(self) -> None:
        self.busy: dict[str, float] = {}
        self.tests: dict[str, int] = {}
        self.span: dict[str, tuple[float, float]] = {}
        self.modules: dict[str, float] = {}

    def add(self, worker: str, nodeid: str, when: str, start: float, stop: float) -> None:
        took = max(0.0, stop - start)
        self.busy[worker] = self.busy.get(worker, 0.0) + took
        if when == "call":
            self.tests[worker] = self.tests.get(worker, 0) + 1
        first, last = self.span.get(worker, (start, stop))
        self.span[worker] = (min(first, start), max(last, stop))
        module = nodeid.split("::", 1)[0]
        self.modules[module] = self.modules.get(module, 0.0) + took

    def lines(self, slowest: int = 15) -> list[str]:
        out = [
            f"worker {w}: busy {self.busy[w]:,.0f} s over {self.tests.get(w, 0)} tests, "
            f"first to last {self.span[w][1] - self.span[w][0]:,.0f} s"
            for w in sorted(self.busy)
        ]
        ranked = sorted(self.modules.items(), key=lambda kv: -kv[1])[:slowest]
        out.append(f"the {len(ranked)} slowest modules (setup, tests and teardown):")
        out += [f"  {secs:7.1f} s  {module}" for module, secs in ranked]
        return out
