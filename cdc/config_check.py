"""``cdc config check``: connect to every service and check what the pipeline needs of it.

PostgreSQL: ``wal_level``, the role's ``REPLICATION`` (or superuser) and ``SELECT`` on the
captured tables, each captured table's replica identity and key, the publication as
``postgres.publication_autocreate_mode`` would make or use it, and the slot. Then Kafka,
Redis and OpenSearch answer (with the configured TLS and credentials). Each result is one
line; a failure says how to fix it.

The publication check runs the reader's own start-up logic
(:func:`cdc.publication.ensure_publication`) in a transaction that is always rolled back, so
it reports exactly what a run would do or refuse, and changes nothing. Last, who may send
signals (:mod:`cdc.incremental`): a signing key, and a signal table only trusted roles write.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import psycopg

from cdc.connection import connect, current_database
from cdc.keys import KEY_COLUMNS_SETTING, matching_rule
from cdc.publication import ensure_publication
from cdc.slots import slot_info
from pgcdc.core.errors import CdcError, root_reason
from pgcdc.core.settings import Settings


@dataclass(frozen=True)
class CheckResult:
    """One check: which service, what was found, and (on failure) how to fix it."""

    service: str
    ok: bool
    message: str
    fix: str = ""

    def line(self) -> str:
        """``ok   service: message`` or ``FAIL service: message; fix: ...``."""
        if self.ok:
            return f"ok   {self.service}: {self.message}"
        return f"FAIL {self.service}: {self.message}" + (f"; fix: {self.fix}" if self.fix else "")


def _ok(service: str, message: str) -> CheckResult:
    return CheckResult(service, True, message)


def _fail(service: str, message: str, fix: str) -> CheckResult:
    return CheckResult(service, False, message, fix)


def _wal_level(conn: psycopg.Connection[Any]) -> CheckResult:
    row = conn.execute("SHOW wal_level").fetchone()
    level = row[0] if row else "unknown"
    if level == "logical":
        return _ok("postgres", "wal_level = logical")
    return _fail(
        "postgres",
        f"wal_level = {level}, logical replication needs logical",
        "set wal_level = logical in postgresql.conf (RDS/Aurora: rds.logical_replication = 1; "
        "Cloud SQL: cloudsql.logical_decoding = on) and restart the server",
    )


def _role(conn: psycopg.Connection[Any]) -> tuple[str, bool, CheckResult]:
    row = conn.execute(
        "SELECT current_user, rolsuper, rolreplication FROM pg_roles WHERE rolname = current_user"
    ).fetchone()
    assert row is not None  # the connected role always exists
    role, superuser, replication = str(row[0]), bool(row[1]), bool(row[2])
    if superuser or replication:
        what = "superuser" if superuser else "REPLICATION"
        return role, superuser, _ok("postgres", f"role {role} has {what}")
    return (
        role,
        superuser,
        _fail(
            "postgres",
            f"role {role} has no REPLICATION attribute: it cannot create or stream from a "
            "replication slot",
            f"as a superuser run `ALTER ROLE {role} REPLICATION` (RDS: `GRANT rds_replication "
            f"TO {role}`)",
        ),
    )


def _publication(
    conn: psycopg.Connection[Any], settings: Settings
) -> tuple[list[str], CheckResult]:
    """The tables a run would capture, and whether it may create or use the publication."""
    pg = settings.postgres
    name = pg.publication_name
    try:
        with conn.transaction(force_rollback=True):
            captured = ensure_publication(conn, name, pg.tables, pg.publication_autocreate_mode)
    except CdcError as e:
        fix = "see docs/own-postgres.md"
        return list(pg.tables), _fail("postgres", str(e), fix)
    tables = [f"{s}.{t}" for s, t in captured]
    mode = pg.publication_autocreate_mode
    how = f"publication_autocreate_mode={mode.value}" if mode is not None else "default mode"
    exists = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,)).fetchone()
    state = "exists" if exists else "would be created"
    return tables, _ok("postgres", f"publication {name} {state} ({how}), {len(tables)} tables")


_TABLE_FACTS = """
SELECT c.relreplident,
       has_table_privilege(c.oid, 'SELECT'),
       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary),
       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisreplident)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s
"""


def _tables(
    conn: psycopg.Connection[Any], settings: Settings, role: str, tables: Sequence[str]
) -> list[CheckResult]:
    out: list[CheckResult] = []
    for qualified in tables:
        schema, table = qualified.split(".", 1)
        row = conn.execute(_TABLE_FACTS, (schema, table)).fetchone()
        if row is None:
            continue  # the publication check names a listed table that does not exist
        identity, can_select, has_pk, has_index = str(row[0]), bool(row[1]), row[2], row[3]
        if not can_select:
            out.append(
                _fail(
                    "postgres",
                    f"role {role} may not SELECT {qualified} (the snapshot reads it)",
                    f"`GRANT SELECT ON {qualified} TO {role}` (and USAGE on schema {schema})",
                )
            )
        rule = matching_rule(settings.postgres.message_key_columns, schema, table)
        keyed = (identity == "d" and has_pk) or (identity == "i" and has_index)
        if identity == "n" or (identity == "d" and not has_pk):
            out.append(
                _fail(
                    "postgres",
                    f"table {qualified} has no primary key and replica identity "
                    f"{'NOTHING' if identity == 'n' else 'DEFAULT'}: PostgreSQL refuses its "
                    "UPDATEs and DELETEs while it is published, and its records have no key",
                    f"add a primary key, or `ALTER TABLE {qualified} REPLICA IDENTITY FULL` "
                    f"and key it with {KEY_COLUMNS_SETTING}='{qualified}:<column>,...'",
                )
            )
        elif not keyed and rule is None:
            out.append(
                _fail(
                    "postgres",
                    f"table {qualified} (replica identity FULL) has no key: its records have "
                    "null keys and the followers skip it",
                    f"add a primary key, or set {KEY_COLUMNS_SETTING}='{qualified}:<column>,...'",
                )
            )
    if tables and not any(not r.ok for r in out):
        out.append(_ok("postgres", f"{len(tables)} captured tables readable and keyed"))
    return out


def _slot(conn: psycopg.Connection[Any], settings: Settings) -> CheckResult:
    name = settings.postgres.slot_name
    info = slot_info(conn, name)
    if info is None:
        row = conn.execute(
            "SELECT count(*), current_setting('max_replication_slots')::int "
            "FROM pg_replication_slots"
        ).fetchone()
        used, limit = (int(row[0]), int(row[1])) if row else (0, 0)
        if used >= limit:
            return _fail(
                "postgres",
                f"slot {name} does not exist and all {limit} replication slots are in use",
                "raise max_replication_slots (restart) or drop an unused slot",
            )
        return _ok("postgres", f"slot {name} does not exist yet; the first run creates it")
    database = current_database(conn)
    if info.plugin != "pgoutput" or info.database != database:
        return _fail(
            "postgres",
            f"slot {name} belongs to plugin {info.plugin} in database {info.database}",
            "set postgres.slot_name to another name, or drop that slot",
        )
    if info.lost:
        return _fail(
            "postgres",
            f"slot {name} is lost (wal_status = lost)",
            "`cdc run --snapshot-mode when_needed` drops it and takes a new snapshot",
        )
    state = f"in use by pid {info.active_pid}" if info.active else "inactive"
    return _ok("postgres", f"slot {name} exists ({state}, wal_status = {info.wal_status})")


def check_postgres(settings: Settings) -> list[CheckResult]:
    """Every PostgreSQL check; an unreachable server is one failure."""
    try:
        conn = connect(settings.postgres.dsn.get_secret_value())
    except CdcError as e:  # the line names the cause and what to check
        return [_fail("postgres", str(e), "")]
    with conn:
        results = [_ok("postgres", "connected"), _wal_level(conn)]
        role, _superuser, role_result = _role(conn)
        results.append(role_result)
        tables, publication = _publication(conn, settings)
        results.append(publication)
        results += _tables(conn, settings, role, tables)
        results.append(_slot(conn, settings))
        results.append(_signals(conn, settings))
    return results


def _signals(conn: psycopg.Connection[Any], settings: Settings) -> CheckResult:
    """Who may send signals: the signing key, and the signal table's grants."""
    from cdc.incremental.auth import signal_key
    from cdc.incremental.signal_table import untrusted_writers
    from cdc.incremental.signals import split_table

    pg = settings.postgres
    if pg.signal_data_collection:
        table = split_table(pg.signal_data_collection)
        reason = untrusted_writers(conn, table, pg.signal_trusted_roles)
        if reason is not None:
            return _fail(
                "postgres", reason, "see docs/incremental-snapshots.md#who-may-send-a-signal"
            )
    if signal_key(pg) is None:
        return _fail(
            "postgres",
            "no key signs signals: cdc snapshot and the signal topic are refused",
            "set postgres.signal_secret (or a password in postgres.dsn)",
        )
    source = "postgres.signal_secret" if pg.signal_secret is not None else "the DSN's password"
    return _ok("postgres", f"signals are signed with a key from {source}")


def check_kafka(settings: Settings) -> CheckResult:
    """The brokers answer a metadata request with the configured security settings."""
    from cdc.kafka_clients import cluster_metadata, consumer

    try:
        client = consumer(settings.kafka, "cdc-config-check")
        try:
            md = cluster_metadata(client, settings.kafka.bootstrap_servers, timeout_s=5)
        finally:
            client.close()
    except CdcError as e:  # the line names the cause and what to check
        return _fail("kafka", str(e), "")
    return _ok("kafka", f"{len(md.brokers)} broker(s) answer, {len(md.topics)} topics")


def check_redis(settings: Settings) -> CheckResult:
    """Redis answers PING with the URL's credentials and TLS."""
    import redis

    from pgcdc.core.follower_clients import redis_cluster_url, redis_options

    try:
        # PING answers on any node of a Redis Cluster as well.
        client = redis.Redis.from_url(
            redis_cluster_url(settings.redis.url.get_secret_value())[0],
            socket_connect_timeout=5,
            **redis_options(settings.redis),
        )
        try:
            client.ping()
        finally:
            client.close()
    except (CdcError, redis.RedisError, ValueError) as e:
        return _fail(
            "redis",
            f"Redis at {_where(settings.redis.url.get_secret_value())}: {root_reason(e)}",
            "check redis.url (CDC_REDIS__URL: host, port, user, password, rediss://) and that "
            "Redis runs",
        )
    return _ok("redis", "answers PING")


def check_search(settings: Settings) -> CheckResult:
    """OpenSearch answers with the configured credentials and TLS."""
    from opensearchpy import OpenSearch
    from opensearchpy.exceptions import OpenSearchException

    from pgcdc.core.follower_clients import opensearch_options

    try:
        client = OpenSearch(
            hosts=[settings.search.url.get_secret_value()],
            timeout=5,
            max_retries=0,
            **opensearch_options(settings.search),
        )
        try:
            version = client.info()["version"]["number"]
        finally:
            client.close()
    except (CdcError, OpenSearchException, ValueError) as e:
        return _fail(
            "opensearch",
            f"OpenSearch at {_where(settings.search.url.get_secret_value())}: {root_reason(e)}",
            "check search.url (CDC_SEARCH__URL), search.username/password and TLS, and that "
            "OpenSearch runs",
        )
    return _ok("opensearch", f"answers (version {version})")


def _where(url: str) -> str:
    """``host:port`` of a URL (never its credentials)."""
    try:
        parts = urlsplit(url)
        return f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
    except ValueError:
        return "the URL set"


CHECKS: tuple[Callable[[Settings], CheckResult], ...] = (check_kafka, check_redis, check_search)


def run_checks(settings: Settings) -> list[CheckResult]:
    """Every check, PostgreSQL first."""
    return check_postgres(settings) + [check(settings) for check in CHECKS]
