"""Who may make the reader snapshot a table, and what a signal may make it run (issue 20).

A role created with ``LOGIN`` and nothing else sends a signal through every channel it can
reach while the reader streams: an unsigned and a forged WAL message, ``cdc snapshot`` with
its own credentials (signed with its own password, not the reader's key), an unsigned
record on the signal topic, and an insert into the signal table (refused by PostgreSQL).
Nothing is queued, nothing runs, and the reader logs one line per attempt, naming its
source. Then the operator, who holds the key: a filter with ``;``, with a subquery on
``pg_authid`` or with a volatile function, and a table outside the publication, are
refused by ``cdc snapshot`` (one line, exit 2) and, sent signed straight into the WAL, by
the reader (one line each); a good filter runs. The signal table opened to PUBLIC is
refused while streaming (its rows ignored) and at startup (the run stops, one line). The
dead-letter counts of ``cdc status`` are read from the same stack.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import subprocess
import time
from pathlib import Path

import orjson
import psycopg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pydantic import SecretStr

from pgcdc.core.settings import PostgresSettings
from tests.conftest import ROOT, Endpoints, wait_until
from tests.e2e.pipeline import Pipeline
from tests.integration.incremental.support import CDC, Reader, cdc, cdc_fails, pipeline, topic
from tests.integration.reader_support import Workload

pytestmark = pytest.mark.integration

SECRET = "test-" + secrets.token_hex(16)
PROBE = "id < (select count(*) from pg_authid)::int + 1000"


def _log_lines(reader: Reader, pattern: str) -> list[str]:
    return [line for line in reader.text().splitlines() if re.search(pattern, line)]


def test_only_trusted_signals_run_and_no_sql_from_a_signal_runs_as_written(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    role = f"lo_{secrets.token_hex(6)}"
    try:
        _trust(endpoints, tmp_path, role)
    finally:
        with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def _forged(doc: dict[str, object]) -> bytes:
    """A signal signed with a key guessed by the sender (the reader's is SECRET's)."""
    payload = orjson.dumps(doc)
    digest = hmac.new(b"a guess", payload, hashlib.sha256).hexdigest().encode()
    return b"sig1:" + digest + b":" + payload


def _trust(endpoints: Endpoints, tmp_path: Path, role: str) -> None:
    with pipeline(endpoints, tmp_path, "incr_trust") as p:
        Workload(p.dsn, "public.t").setup(40)
        Workload(p.dsn, "public.outside").setup(5)
        password = secrets.token_hex(12)
        with psycopg.connect(p.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE cdc_signal (id text PRIMARY KEY, type text, data text)")
            conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        base, _, _ = p.dsn.rpartition("@")
        role_dsn = p.dsn.replace(base.split("//", 1)[1], f"{role}:{password}")
        signal_topic = f"{p.name}.signals"
        env = {
            "CDC_POSTGRES__TABLES": "public.t,public.cdc_signal",
            "CDC_POSTGRES__SIGNAL_DATA_COLLECTION": "public.cdc_signal",
            "CDC_POSTGRES__SIGNAL_SECRET": SECRET,
            "CDC_KAFKA__SIGNAL_TOPIC": signal_topic,
        }
        reader = Reader(p, tmp_path / "reader.log", **env)
        try:
            reader.start()
            reader.wait_for("replication started")
            doc = {
                "id": "x1",
                "type": "execute-snapshot",
                "ts": time.time(),
                "data": {
                    "data-collections": ["public.t"],
                    "type": "incremental",
                    "additional-conditions": [{"data-collection": "public.t", "filter": PROBE}],
                },
            }
            # --- the role with only LOGIN, every channel it can reach ------------------
            with psycopg.connect(role_dsn, autocommit=True) as conn:
                emit = "SELECT pg_logical_emit_message(true, 'pgcdc-signal', %s::bytea)"
                conn.execute(emit, (orjson.dumps(doc),))  # unsigned
                conn.execute(emit, (_forged(doc),))
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(
                        "INSERT INTO cdc_signal VALUES ('x', 'execute-snapshot', %s)",
                        (orjson.dumps(doc["data"]).decode(),),
                    )
            out = subprocess.run(
                [*CDC, "snapshot", "public.t"],
                env=p.env(CDC_POSTGRES__DSN=role_dsn, CDC_POSTGRES__TABLES="public.t"),
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert out.returncode == 0, out.stderr  # written (signed with the role's key)
            producer = Producer({"bootstrap.servers": p.endpoints.kafka_bootstrap})
            producer.produce(signal_topic, key=p.name.encode(), value=orjson.dumps(doc))
            assert producer.flush(30) == 0
            reader.wait_for("ignored:", count=4, timeout=60)
            refused = _log_lines(reader, r"signal from .* ignored: ")
            assert len(refused) == 4, refused
            assert len([r for r in refused if "from wal@" in r and "not signed" in r]) == 1
            assert len([r for r in refused if "from wal@" in r and "bad signature" in r]) == 2
            assert len([r for r in refused if "from kafka " in r and "not signed" in r]) == 1
            assert "queued" not in reader.text()
            assert "incremental snapshot of" not in reader.text()

            # --- the operator, who holds the key -------------------------------------
            from cdc.incremental.auth import signal_key
            from cdc.incremental.send import emit_signed, send_snapshot_signal
            from cdc.incremental.signals import execute_document
            from pgcdc.core.errors import ConfigError

            # cdc snapshot: one line and exit 2 (three through the CLI, the rest through
            # the function it calls, which raises the line as a ConfigError).
            line = cdc_fails(p, "snapshot", "public.t", "--where", "id = 1; SELECT 1")
            assert "more than one statement" in line, line
            assert "not in publication" in cdc_fails(p, "snapshot", "public.outside")
            assert "is not a column" in cdc_fails(p, "snapshot", "t", "--where", "vv > 1")
            settings = PostgresSettings(
                dsn=SecretStr(p.dsn), publication_name=p.name, signal_secret=SecretStr(SECRET)
            )
            for names, where, reason in (
                (["public.t"], PROBE, "a subquery is not allowed"),
                (["public.t"], "random() < 0.5", "function random is volatile"),
                (["public.nosuch"], None, "does not exist"),
            ):
                with pytest.raises(ConfigError, match=reason):
                    send_snapshot_signal(settings, names, where, stop=False)
            key = signal_key(settings)
            assert key is not None
            with psycopg.connect(p.dsn, autocommit=True) as conn:
                for where in ("id = 1; SELECT 1", PROBE, "random() < 0.5"):
                    emit_signed(conn, key, execute_document([("public", "t")], where), p.name)
                emit_signed(conn, key, execute_document([("public", "outside")]), p.name)
            pattern = "incremental snapshot of public.(t|outside) refused:"
            wait_until(lambda: len(_log_lines(reader, pattern)) >= 4, timeout=60, what=pattern)
            lines = _log_lines(reader, pattern)
            assert len(lines) == 4, lines
            assert "more than one statement" in lines[0]
            assert "subquery" in lines[1]
            assert "volatile" in lines[2]
            assert "not in publication" in lines[3]
            assert "queued" not in reader.text()

            # A bare name (the captured table of that name), signed with the reader's key.
            out = cdc(p, "snapshot", "t", "--where", "id % 2 = 0", **env)
            assert "for public.t" in out.stdout
            reader.wait_for("incremental snapshot of public.t complete: 20 rows", timeout=120)

            # --- the signal table opened to PUBLIC -----------------------------------
            with psycopg.connect(p.dsn, autocommit=True) as conn:
                conn.execute("GRANT INSERT ON cdc_signal TO PUBLIC")
            reader.wait_for("signal table rows are ignored from now on: PUBLIC may insert")
            with psycopg.connect(role_dsn, autocommit=True) as conn:
                conn.execute(
                    "INSERT INTO cdc_signal VALUES ('y', 'execute-snapshot', %s)",
                    (orjson.dumps({"data-collections": ["public.t"]}).decode(),),
                )
            reader.wait_for("signal from signal table row 'y'")
            assert reader.text().count("queued") == 1  # the operator's, above
        finally:
            reader.stop()
        # At startup, a signal table anyone may write stops the run with one line.
        refusal = subprocess.run(
            [*CDC, "run", "--until", "current"],
            env=p.env(**env),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert refusal.returncode == 2, refusal.stderr[-2000:]
        assert "refusing to watch the signal table: PUBLIC may insert" in refusal.stderr
        # The operator's snapshot ran with its filter: the even ids, as incremental rows.
        rows = [
            r.payload["after"]
            for r in topic(p, "public.t")
            if r.payload is not None and r.payload["source"]["snapshot"] == "incremental"
        ]
        assert sorted(r["id"] for r in rows) == list(range(0, 40, 2))
        _dead_letters_in_status(p)


def _dead_letters_in_status(p: Pipeline) -> None:
    """``cdc status`` counts the dead-letter topic's letters by job, beside the watermarks."""
    admin = AdminClient({"bootstrap.servers": p.endpoints.kafka_bootstrap})
    admin.create_topics([NewTopic(f"{p.name}.dlq", 1, 1)])[f"{p.name}.dlq"].result(30)
    wait_until(
        lambda: f"{p.name}.dlq" in admin.list_topics(timeout=10).topics,
        what="the dead-letter topic in the cluster's metadata",
    )
    producer = Producer({"bootstrap.servers": p.endpoints.kafka_bootstrap})
    for job in ("cache_sync", "cache_sync", "cdc-reader"):
        producer.produce(f"{p.name}.dlq", value=orjson.dumps({"job": job, "reason": "test"}))
    assert producer.flush(30) == 0
    out = subprocess.run(
        [*CDC, "status", "--json"],
        env=p.env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode in (0, 3), out.stderr[-2000:]
    status = orjson.loads(out.stdout)
    assert status["dead_letters"] == {"cache_sync": 2, "cdc-reader": 1}
