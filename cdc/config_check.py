"""``cdc config check``: connect to every service and check what the pipeline needs of it.

PostgreSQL: ``wal_level``, the role's ``REPLICATION`` (or superuser) and ``SELECT`` on the
captured tables, each captured table's replica identity and key, the publication as
``postgres.publication_autocreate_mode`` would make or use it (and the stored generated
columns it leaves out), and the slot. On PostgreSQL 17+, for a failover slot: the primary's
``synchronized_standby_slots`` and, on each standby ``postgres.dsn`` lists (a multi-host DSN,
which must pick the primary with ``target_session_attrs``), ``sync_replication_slots``,
``hot_standby_feedback``, ``primary_slot_name``, the ``dbname`` of ``primary_conninfo`` and
whether the slot's synchronized copy is ready. Then Kafka,
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
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cdc.connection import connect, current_database, in_recovery
from cdc.keys import KEY_COLUMNS_SETTING, matching_rule
from cdc.publication import (
    GENERATED_COLUMNS_SINCE,
    ensure_publication,
    generated_columns,
    publishes_generated,
)
from cdc.slots import FAILOVER_SLOTS_SINCE, slot_info
from pgcdc.core.errors import CdcError, root_reason
from pgcdc.core.qualified_names import quote_table
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
) -> tuple[list[tuple[str, str]], list[CheckResult]]:
    """The tables a run would capture, and whether it may create or use the publication."""
    pg = settings.postgres
    name = pg.publication_name
    try:
        with conn.transaction(force_rollback=True):
            captured = ensure_publication(
                conn,
                name,
                pg.listed_tables,
                pg.publication_autocreate_mode,
                generated=pg.publish_generated_columns,
            )
            left_out = [] if publishes_generated(conn, name) else generated_columns(conn, captured)
    except CdcError as e:
        fix = "see docs/own-postgres.md"
        return list(pg.listed_tables), [_fail("postgres", str(e), fix)]
    mode = pg.publication_autocreate_mode
    how = f"publication_autocreate_mode={mode.value}" if mode is not None else "default mode"
    exists = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,)).fetchone()
    state = "exists" if exists else "would be created"
    out = [_ok("postgres", f"publication {name} {state} ({how}), {len(captured)} tables")]
    if left_out:
        what = f"stored generated columns {', '.join(left_out)} are not published"
        if conn.info.server_version >= GENERATED_COLUMNS_SINCE and pg.publish_generated_columns:
            out.append(
                _fail(
                    "postgres",
                    f"{what} (the publication has publish_generated_columns = none)",
                    f"ALTER PUBLICATION {name} SET (publish_generated_columns = stored), then "
                    "`cdc snapshot <table>`",
                )
            )
        else:
            out.append(
                _ok(
                    "postgres",
                    f"{what}: no record carries them (PostgreSQL 18 can publish them; before, "
                    "see docs/own-postgres.md#generated-columns)",
                )
            )
    return captured, out


_TABLE_FACTS = """
SELECT c.relreplident,
       has_table_privilege(c.oid, 'SELECT'),
       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary),
       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisreplident)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s
"""


def _tables(
    conn: psycopg.Connection[Any],
    settings: Settings,
    role: str,
    tables: Sequence[tuple[str, str]],
) -> list[CheckResult]:
    out: list[CheckResult] = []
    for schema, table in tables:
        qualified = quote_table((schema, table))
        pattern = f"{schema}.{table}"  # what message_key_columns patterns are matched against
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
                    f"and key it with {KEY_COLUMNS_SETTING}='{pattern}:<column>,...'",
                )
            )
        elif not keyed and rule is None:
            out.append(
                _fail(
                    "postgres",
                    f"table {qualified} (replica identity FULL) has no key: its records have "
                    "null keys and the followers skip it",
                    f"add a primary key, or set {KEY_COLUMNS_SETTING}='{pattern}:<column>,...'",
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


def _ownership(conn: psycopg.Connection[Any], settings: Settings) -> list[CheckResult]:
    """The topic prefix is this source's (or nobody's), and an existing slot is this
    reader's (cdc.ownership). Unreachable Kafka is check_kafka's to report."""
    from cdc.kafka_clients import admin_client
    from cdc.ownership import (
        PrefixOwnedError,
        Source,
        claim_prefix,
        system_identifier,
        unowned_slot_message,
    )
    from cdc.state import StateStore

    pg, kafka = settings.postgres, settings.kafka
    me = Source(system_identifier(conn), current_database(conn), pg.slot_name)
    try:
        store = StateStore(kafka, kafka.topic_prefix)
        exists = store.topic in admin_client(kafka).list_topics(timeout=5).topics
        records = store.latest() if exists else {}
    except CdcError:
        return []
    out: list[CheckResult] = []
    try:
        claim_prefix(records, me, kafka.topic_prefix, store.topic)
        out.append(_ok("kafka", f"topic prefix {kafka.topic_prefix} is free or this source's"))
    except PrefixOwnedError as e:
        out.append(_fail("kafka", str(e).split("; writing here")[0], "set kafka.topic_prefix"))
    info = slot_info(conn, pg.slot_name)
    if info is not None and records.get(store.key(me.database, pg.slot_name)) is None:
        if pg.adopt_slot:
            taken = f"slot {pg.slot_name} is not this reader's yet: postgres.adopt_slot takes it"
            return [*out, _ok("postgres", taken)]
        text = unowned_slot_message(pg.slot_name, kafka.topic_prefix, [], None, info.lost)
        fix = "set postgres.slot_name, or --adopt-slot"
        out.append(_fail("postgres", text.split(". The reader")[0], fix))
    return out


def _hosts(dsn: str) -> list[tuple[str, str]]:
    """(host, port) of every server a multi-host DSN lists, in order."""
    params = conninfo_to_dict(dsn)
    hosts = str(params.get("host") or params.get("hostaddr") or "localhost").split(",")
    ports = str(params.get("port") or "5432").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    return list(zip(hosts, ports, strict=False))


def _multi_host(dsn: str) -> list[CheckResult]:
    """A DSN naming several servers must pick the primary (or the reader may stream from a
    standby that cannot take its slot, or follow the wrong server after a failover)."""
    hosts = _hosts(dsn)
    if len(hosts) < 2:
        return []
    attrs = str(conninfo_to_dict(dsn).get("target_session_attrs") or "any")
    if attrs in ("read-write", "primary"):
        return [
            _ok(
                "postgres", f"postgres.dsn lists {len(hosts)} servers, target_session_attrs={attrs}"
            )
        ]
    return [
        _fail(
            "postgres",
            f"postgres.dsn lists {len(hosts)} servers with target_session_attrs={attrs}: the "
            "reader may connect to a standby",
            "add target_session_attrs=read-write (or primary) to postgres.dsn",
        )
    ]


def _setting(conn: psycopg.Connection[Any], name: str) -> str | None:
    """A server setting, or None where this role may not read it."""
    try:
        with conn.transaction():
            row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
    except psycopg.errors.InsufficientPrivilege:
        return None
    return str(row[0]) if row else None


def _failover(conn: psycopg.Connection[Any], settings: Settings) -> list[CheckResult]:
    """PostgreSQL 17+: the slot is a failover slot, and the standbys that should keep a copy
    of it are set up for that (``synchronized_standby_slots`` here, the standby side in
    :func:`_standby`)."""
    pg = settings.postgres
    if not pg.slot_failover or conn.info.server_version < FAILOVER_SLOTS_SINCE:
        return []
    if in_recovery(conn):
        return [_ok("postgres", "connected to a standby: its slot cannot be a failover slot")]
    out: list[CheckResult] = []
    info = slot_info(conn, pg.slot_name)
    if info is not None and info.failover is False:
        out.append(
            _ok(
                "postgres",
                f"slot {pg.slot_name} is not a failover slot yet; the next run makes it one",
            )
        )
    physical = [
        str(r[0])
        for r in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE slot_type = 'physical' ORDER BY 1"
        ).fetchall()
    ]
    listed = [s.strip() for s in (_setting(conn, "synchronized_standby_slots") or "").split(",")]
    listed = [s for s in listed if s]
    if not physical:
        out.append(
            _ok(
                "postgres",
                "no physical replication slot: no standby keeps a copy of the failover slot "
                "(a standby needs primary_slot_name, see docs/own-postgres.md)",
            )
        )
        return out
    missing = [s for s in listed if s not in physical]
    if not listed or missing:
        names = ", ".join(physical)
        out.append(
            _fail(
                "postgres",
                "synchronized_standby_slots "
                + (f"names unknown slots {', '.join(missing)}" if missing else "is empty")
                + f" (physical slots: {names}): the reader may receive changes a standby has "
                "not, which a failover to that standby loses while the followers keep them",
                f"ALTER SYSTEM SET synchronized_standby_slots = '{names}'; SELECT pg_reload_conf()",
            )
        )
    else:
        out.append(_ok("postgres", f"synchronized_standby_slots = {', '.join(listed)}"))
    return out


def _standby(dsn: str, host: str, port: str, settings: Settings, listed: str) -> list[CheckResult]:
    """A standby of a multi-host DSN: what keeps a synchronized copy of the reader's slot."""
    where = f"standby {host}:{port}"
    try:
        conn = connect(make_conninfo(dsn, host=host, port=port, target_session_attrs="any"))
    except CdcError as e:
        return [
            _fail("postgres", f"{where}: {e}", "check that server, or drop it from postgres.dsn")
        ]
    out: list[CheckResult] = []
    with conn:
        if not in_recovery(conn):
            return []
        if conn.info.server_version < FAILOVER_SLOTS_SINCE:
            return [_ok("postgres", f"{where}: PostgreSQL before 17 keeps no copy of slots")]
        wanted = {
            "sync_replication_slots": "on",
            "hot_standby_feedback": "on",
            "wal_level": "logical",
        }
        for name, value in wanted.items():
            have = _setting(conn, name)
            if have != value:
                out.append(
                    _fail(
                        "postgres",
                        f"{where}: {name} = {have}, a failover slot copy needs {value}",
                        f"on the standby: ALTER SYSTEM SET {name} = {value}"
                        + ("; restart it" if name == "wal_level" else "; SELECT pg_reload_conf()"),
                    )
                )
        slot_name = _setting(conn, "primary_slot_name") or ""
        if not slot_name or slot_name not in [s.strip() for s in listed.split(",")]:
            out.append(
                _fail(
                    "postgres",
                    f"{where}: primary_slot_name = {slot_name or '(none)'}, not listed in the "
                    f"primary's synchronized_standby_slots ({listed or 'empty'})",
                    "give the standby a physical slot (primary_slot_name) and list it in the "
                    "primary's synchronized_standby_slots",
                )
            )
        conninfo = _setting(conn, "primary_conninfo")
        if conninfo is not None and "dbname" not in conninfo_to_dict(conninfo):
            out.append(
                _fail(
                    "postgres",
                    f"{where}: primary_conninfo names no dbname, which slot synchronization needs",
                    "add dbname=<any database> to the standby's primary_conninfo",
                )
            )
        info = slot_info(conn, settings.postgres.slot_name)
        if info is None or info.temporary or not info.synced:
            out.append(
                _fail(
                    "postgres",
                    f"{where}: no synchronized copy of slot {settings.postgres.slot_name} ready"
                    + (" (still temporary)" if info is not None and info.temporary else ""),
                    "run the reader on the primary (a failover slot, postgres.slot_failover); "
                    "the copy is ready once the slot has moved past the standby's oldest "
                    "transaction",
                )
            )
        else:
            out.append(
                _ok(
                    "postgres",
                    f"{where}: slot {info.slot_name} is synchronized (confirmed_flush_lsn "
                    f"{info.confirmed_flush_lsn})",
                )
            )
    if all(r.ok for r in out):
        out.insert(0, _ok("postgres", f"{where}: sync_replication_slots, hot_standby_feedback on"))
    return out


def check_postgres(settings: Settings) -> list[CheckResult]:
    """Every PostgreSQL check; an unreachable server is one failure."""
    dsn = settings.postgres.dsn.get_secret_value()
    try:
        conn = connect(dsn)
    except CdcError as e:  # the line names the cause and what to check
        return [_fail("postgres", str(e), "")]
    with conn:
        here = (conn.info.host, str(conn.info.port))
        results = [_ok("postgres", "connected"), *_multi_host(dsn), _wal_level(conn)]
        role, _superuser, role_result = _role(conn)
        results.append(role_result)
        tables, publication = _publication(conn, settings)
        results += publication
        results += _tables(conn, settings, role, tables)
        results.append(_slot(conn, settings))
        results += _ownership(conn, settings)
        results.append(_signals(conn, settings))
        failover = _failover(conn, settings)
        results += failover
        listed = _setting(conn, "synchronized_standby_slots") if failover else None
    if failover:
        for host, port in _hosts(dsn):
            if (host, port) != here:
                results += _standby(dsn, host, port, settings, listed or "")
    return results


def _signals(conn: psycopg.Connection[Any], settings: Settings) -> CheckResult:
    """Who may send signals: the signing key, and the signal table's grants."""
    from cdc.incremental.auth import SET_A_KEY, key_of
    from cdc.incremental.signal_table import untrusted_writers

    pg = settings.postgres
    table = pg.signal_table
    if table:
        reason = untrusted_writers(conn, table, pg.signal_trusted_roles)
        if reason is not None:
            return _fail(
                "postgres", reason, "see docs/incremental-snapshots.md#who-may-send-a-signal"
            )
    key = key_of(pg)
    if key.key is None:
        return _fail(
            "postgres",
            f"{key.source}: cdc snapshot and the signal topic are refused",
            SET_A_KEY,
        )
    return _ok("postgres", f"signals are signed with {key.source}")


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
