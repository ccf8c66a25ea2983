"""The whole pipeline against secured servers: PostgreSQL over TLS (``sslmode=verify-full``),
Kafka over SASL_SSL (SCRAM-SHA-512), Redis over TLS as an ACL user.

One module-scoped run: the reader catches up, ``cdc status`` reads the topics, a record no
job can apply is produced into a table topic, both jobs run ``--available-now`` (the cache
job writing to the TLS Redis) and dead-letter that record over SASL_SSL. Then each step's
result is checked, a wrong password and a wrong CA each stop with one clear line, and no
captured output of any process holds a password.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
import psycopg
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from demo import compare
from pgcdc.core.contract import CACHE_JOB, SEARCH_JOB, table_topic
from tests.conftest import ROOT, Endpoints
from tests.integration.security.conftest import secrets_of

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow]

SPARK_SUBMIT = ROOT / "scripts" / "spark-submit"
TABLE = "public.items"
ROWS = 40


@dataclass
class SecureRun:
    """One pipeline over the secured endpoints, and everything its processes printed."""

    secure: dict[str, str]
    name: str
    db_dsn: str  # the test database over TLS, verify-full
    checkpoints: Path
    outputs: dict[str, str] = field(default_factory=dict)
    exits: dict[str, int] = field(default_factory=dict)

    def env(self, **more: str) -> dict[str, str]:
        import os

        env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
        env.update(self.secure)
        env.update(
            CDC_POSTGRES__DSN=self.db_dsn,
            CDC_POSTGRES__SLOT_NAME=self.name,
            CDC_POSTGRES__PUBLICATION_NAME=self.name,
            CDC_KAFKA__TOPIC_PREFIX=self.name,
            CDC_KAFKA__PARTITIONS="1",  # read back from partition 0
            CDC_KAFKA__HEARTBEAT_TOPIC=f"{self.name}.heartbeat",
            CDC_KAFKA__DEAD_LETTER_TOPIC=f"{self.name}.dlq",
            CDC_REDIS__KEY_PREFIX=self.name,
            CDC_SEARCH__INDEX_PREFIX=self.name,
            CDC_SPARK__CHECKPOINT_DIR=str(self.checkpoints),
            PYTHONUNBUFFERED="1",
        )
        env.update(more)
        return env

    def cdc(self, label: str, *args: str, timeout: float = 300, **more: str) -> int:
        """Run ``cdc <args>``; keep its output under ``label``; return its exit code."""
        done = subprocess.run(
            [sys.executable, "-m", "cdc", *args],
            env=self.env(**more),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        self.outputs[f"{label}.stdout"] = done.stdout
        self.outputs[f"{label}.stderr"] = done.stderr
        self.exits[label] = done.returncode
        return done.returncode

    def kafka_conf(self, **more: Any) -> dict[str, Any]:
        s = self.secure
        return {
            "bootstrap.servers": s["CDC_KAFKA__BOOTSTRAP_SERVERS"],
            "security.protocol": s["CDC_KAFKA__SECURITY_PROTOCOL"],
            "sasl.mechanism": s["CDC_KAFKA__SASL_MECHANISM"],
            "sasl.username": s["CDC_KAFKA__SASL_USERNAME"],
            "sasl.password": s["CDC_KAFKA__SASL_PASSWORD"],
            "ssl.ca.location": s["CDC_KAFKA__SSL_CA_LOCATION"],
        } | more

    def read(self, topic: str) -> list[tuple[bytes | None, bytes | None]]:
        """Every record of a one-partition topic, over SASL_SSL."""
        c = Consumer(
            self.kafka_conf(**{"group.id": f"t-{uuid.uuid4().hex}", "enable.partition.eof": True})
        )
        out = []
        try:
            c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
            while True:
                msg = c.poll(30)
                assert msg is not None, f"timed out reading {topic}"
                err = msg.error()
                if err is not None and err.code() == KafkaError._PARTITION_EOF:
                    return out
                assert err is None, err
                out.append((msg.key(), msg.value()))
        finally:
            c.close()

    @property
    def redis_url(self) -> str:
        # redis-py passes query arguments to the connection: the CA for the TLS Redis.
        ca = quote(self.secure["CDC_REDIS__SSL_CA_LOCATION"])
        return f"{self.secure['CDC_REDIS__URL']}?ssl_ca_certs={ca}"


def _create_database(endpoints: Endpoints, name: str) -> str:
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    with psycopg.connect(endpoints.postgres_dsn_for(name), autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, qty int)")
        conn.execute(
            "INSERT INTO items SELECT i, 'item ' || i, i * 3 FROM generate_series(1, %s) i",
            (ROWS,),
        )
    return name


def _drop_database(endpoints: Endpoints, name: str) -> None:
    with psycopg.connect(endpoints.postgres_dsn_for(name), autocommit=True) as conn:
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE database = current_database() AND NOT active"
        )
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def run(
    secure_env: dict[str, str], endpoints: Endpoints, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SecureRun]:
    name = f"sec_{uuid.uuid4().hex[:10]}"
    _create_database(endpoints, name)
    tls_dsn = secure_env["CDC_POSTGRES__DSN"].replace("/cdc?", f"/{name}?")
    r = SecureRun(secure_env, name, tls_dsn, tmp_path_factory.mktemp("ckpt") / "checkpoints")
    try:
        r.cdc("reader", "run", "--until", "current", timeout=600)
        r.cdc("status", "status", "--json", timeout=120)
        if r.exits["reader"] == 0:
            # A record no job can apply: its key is not a JSON object.
            p = Producer(r.kafka_conf())
            p.produce(table_topic(name, "public", "items"), key=b"not json", value=b"{}")
            assert p.flush(30) == 0
            _run_jobs(r, tmp_path_factory.mktemp("jobs"))
        yield r
    finally:
        _forget(r)
        _drop_database(endpoints, name)


def _forget(r: SecureRun) -> None:
    """Delete the run's topics (secured broker), Redis keys (TLS Redis) and indices."""
    import redis
    from confluent_kafka.admin import AdminClient
    from opensearchpy import OpenSearch

    admin = AdminClient(r.kafka_conf())
    topics = [t for t in admin.list_topics(timeout=30).topics if r.name in t]
    if topics:
        for fut in admin.delete_topics(topics, operation_timeout=30).values():
            fut.result()
    cache = redis.Redis.from_url(r.redis_url)
    keys = list(cache.scan_iter(match=f"{r.name}*", count=1000))
    if keys:
        cache.delete(*keys)
    cache.close()
    search = OpenSearch(r.secure["CDC_SEARCH__URL"])
    search.indices.delete(index=f"{r.name}*", ignore_unavailable=True, expand_wildcards="all")
    search.close()


def _run_jobs(r: SecureRun, logs: Path) -> None:
    """Both jobs side by side, ``--available-now``, through scripts/spark-submit."""
    procs = {}
    for job in (CACHE_JOB, SEARCH_JOB):
        with open(logs / f"{job}.log", "wb") as out:
            procs[job] = subprocess.Popen(
                [str(SPARK_SUBMIT), f"spark_jobs/{job}.py", "--available-now"],
                env=r.env(),
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
    for job, proc in procs.items():
        try:
            r.exits[job] = proc.wait(900)
        except subprocess.TimeoutExpired:
            proc.kill()
            r.exits[job] = -1
        r.outputs[job] = (logs / f"{job}.log").read_text(errors="replace")


def test_reader_streams_over_tls_and_sasl_ssl(run: SecureRun) -> None:
    assert run.exits["reader"] == 0, run.outputs["reader.stderr"][-3000:]
    records = run.read(table_topic(run.name, "public", "items"))
    ids = {orjson.loads(k)["payload"]["id"] for k, _ in records if k and k != b"not json"}
    assert ids == set(range(1, ROWS + 1))


def test_status_reads_the_topics_over_sasl_ssl(run: SecureRun) -> None:
    assert run.exits["status"] == 0, run.outputs["status.stderr"]
    status = json.loads(run.outputs["status.stdout"])
    topic = table_topic(run.name, "public", "items")
    assert sum(status["topics"][topic].values()) >= ROWS
    assert (status["slot"]["slot"], status["slot"]["exists"]) == (run.name, True)
    assert status["slot"]["database"] == run.name


def test_both_jobs_converge_reading_sasl_ssl_and_writing_tls_redis(run: SecureRun) -> None:
    for job in (CACHE_JOB, SEARCH_JOB):
        assert run.exits.get(job) == 0, f"{job}:\n{run.outputs.get(job, '')[-4000:]}"
    leader = compare.leader_state(run.db_dsn, TABLE)
    assert len(leader) == ROWS
    assert compare.cache_state(run.db_dsn, run.redis_url, run.name, TABLE) == leader
    search = compare.search_state(run.db_dsn, run.secure["CDC_SEARCH__URL"], run.name, TABLE)
    assert search == leader


def test_an_unreadable_record_is_dead_lettered_over_sasl_ssl(run: SecureRun) -> None:
    for job in (CACHE_JOB, SEARCH_JOB):
        assert run.exits.get(job) == 0, f"{job}:\n{run.outputs.get(job, '')[-4000:]}"
    letters = [orjson.loads(v) for _, v in run.read(f"{run.name}.dlq") if v]
    by_job = {letter["job"]: letter for letter in letters}
    assert set(by_job) == {CACHE_JOB, SEARCH_JOB}, letters
    for letter in by_job.values():
        assert letter["key"] == "not json"
        assert letter["topic"] == table_topic(run.name, "public", "items")
        assert letter["reason"]


def _one_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line, got:\n{text}"
    return lines[0]


def test_a_wrong_kafka_password_is_one_clear_line(run: SecureRun) -> None:
    wrong = f"wrong-{uuid.uuid4().hex}"
    code = run.cdc(
        "wrong-reader",
        "run",
        "--until",
        "current",
        CDC_KAFKA__SASL_PASSWORD=wrong,
        CDC_POSTGRES__SLOT_NAME=f"{run.name}_w",
        CDC_POSTGRES__PUBLICATION_NAME=f"{run.name}_w",
    )
    line = _one_line(run.outputs["wrong-reader.stderr"])
    assert code == 2, line
    assert "refused the login" in line and "SCRAM-SHA-512" in line, line
    assert run.secure["CDC_KAFKA__BOOTSTRAP_SERVERS"] in line
    assert wrong not in line
    code = run.cdc("wrong-status", "status", CDC_KAFKA__SASL_PASSWORD=wrong)
    line = _one_line(run.outputs["wrong-status.stderr"])
    assert code == 2 and "refused the login" in line, line
    assert wrong not in run.outputs["wrong-status.stdout"] + line


def test_a_wrong_ca_is_one_clear_line_for_kafka_and_postgres(
    run: SecureRun, tmp_path: Path
) -> None:
    other = tmp_path / "other-ca.crt"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes"),
            *("-keyout", tmp_path / "other.key", "-out", other, "-days", "1", "-subj", "/CN=x"),
        ],
        check=True,
        capture_output=True,
    )
    code = run.cdc("wrong-kafka-ca", "status", CDC_KAFKA__SSL_CA_LOCATION=str(other))
    line = _one_line(run.outputs["wrong-kafka-ca.stderr"])
    assert code == 2 and "certificate does not verify" in line, line
    ca = run.secure["CDC_KAFKA__SSL_CA_LOCATION"]
    code = run.cdc(
        "wrong-pg-ca", "status", CDC_POSTGRES__DSN=run.db_dsn.replace(quote(ca), str(other))
    )
    line = _one_line(run.outputs["wrong-pg-ca.stderr"])
    assert code != 0 and "certificate verify failed" in line, line


def test_no_output_holds_a_password(run: SecureRun) -> None:
    """Every line any process of the run printed (reader, status, jobs, the failures)."""
    # The failure tests add their outputs; this one runs last in the module.
    assert {"reader", "status", CACHE_JOB, SEARCH_JOB} <= set(run.exits)
    secrets = secrets_of(run.secure)
    assert len(secrets) == 2 and all(len(s) > 10 for s in secrets)
    for label, text in run.outputs.items():
        for secret in secrets:
            assert secret not in text, f"{label} printed a password"
