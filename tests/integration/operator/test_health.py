"""The health endpoints of a real run: the reader's and a sync job's ``/healthz`` and
``/readyz`` answer 200 once they stream; ``cdc status`` of the running reader is healthy."""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import psycopg
import pytest

from tests.conftest import Endpoints, wait_until
from tests.e2e.pipeline import CDC, Pipeline, kill_group, start_job, tail
from tests.integration.reader_support import ROOT
from tests.integration.real_databases.throwaway import free_port

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.spark]


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:  # not listening (yet)
        return 0, str(e)


def _wait_ready(port: int, timeout: float, what: str, log: str | Path) -> str:
    seen: list[tuple[int, str]] = []

    def ready() -> bool:
        seen.append(_get(port, "/readyz"))
        return seen[-1][0] == 200

    try:
        wait_until(ready, timeout=timeout, interval=1, what=what)
    except BaseException:
        print(tail(Path(log)) if isinstance(log, Path) else log)
        raise
    return seen[-1][1]


def test_reader_and_job_health_endpoints(
    endpoints: Endpoints,
    pg_database: str,
    topic_prefix: str,
    index_prefix: str,
    key_prefix: str,
    tmp_path: Path,
) -> None:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        conn.execute("INSERT INTO items SELECT g, 'n' || g FROM generate_series(1, 50) g")
    p = Pipeline(endpoints, pg_database, topic_prefix, index_prefix, key_prefix, tmp_path / "ck")
    reader_port, job_port = free_port(), free_port()
    reader_log = tmp_path / "reader.log"
    with reader_log.open("wb") as out:
        reader = subprocess.Popen(
            [*CDC, "run", "--health-port", str(reader_port)],
            env=p.env(),
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    job = None
    try:
        body = _wait_ready(reader_port, 120, "the reader to be ready", reader_log)
        assert body.startswith("streaming"), body
        assert _get(reader_port, "/healthz") == (200, "alive\n")
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("INSERT INTO items VALUES (51, 'late')")
        # The change is acknowledged: readiness names the position.
        wait_until(
            lambda: "acknowledged " in _get(reader_port, "/readyz")[1],
            timeout=60,
            what="the reader to acknowledge the insert",
        )

        # The running reader's status: healthy, its slot active, lag in seconds measured.
        status = subprocess.run(
            [*CDC, "status", "--json"], env=p.env(), cwd=ROOT, capture_output=True, text=True
        )
        assert status.returncode == 0, status.stdout + status.stderr
        slot = json.loads(status.stdout)["slot"]
        assert slot["active"] is True and slot["lag_seconds"] is not None
        table = subprocess.run(
            [*CDC, "status"], env=p.env(), cwd=ROOT, capture_output=True, text=True
        )
        assert table.returncode == 0, table.stdout + table.stderr
        assert f"{topic_prefix}.public.items" in table.stdout
        assert table.stdout.rstrip().endswith("healthy")

        job_log = tmp_path / "cache_sync.log"
        job = start_job(p, "cache_sync", "--health-port", str(job_port), log=job_log)
        body = _wait_ready(job_port, 300, "the cache job to be ready", job_log)
        assert body.startswith(("batch ", "processing a micro-batch")), body
        assert _get(job_port, "/healthz") == (200, "alive\n")
    finally:
        if job is not None:
            kill_group(job, signal.SIGTERM)
        reader.send_signal(signal.SIGTERM)
        rc = reader.wait(60)
    assert rc == 0, tail(reader_log)
    assert _get(reader_port, "/healthz")[0] == 0  # closed with the reader
