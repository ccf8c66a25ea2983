"""How cdc.replication classifies server errors (messages as PostgreSQL 15 words them)."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import pq

from cdc.connection import first_line
from cdc.connection_lost import connection_lost
from cdc.replication import classify
from pgcdc.core.errors import CdcError, ConfigError, ConnectionFailed, SlotError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("error", "expected", "retryable"),
    [
        (psycopg.errors.ObjectNotInPrerequisiteState(
            "logical decoding requires wal_level >= logical"), ConfigError, False),
        (psycopg.errors.ObjectInUse(
            'replication slot "s" is active for PID 4242'), SlotError, False),
        (psycopg.errors.UndefinedObject('replication slot "s" does not exist'), SlotError, False),
        (psycopg.errors.DuplicateObject('replication slot "s" already exists'), SlotError, False),
        (psycopg.errors.UndefinedObject('publication "p" does not exist'), SlotError, False),
        (psycopg.OperationalError(
            'connection failed: FATAL:  password authentication failed for user "cdc"'),
            ConfigError, False),
        (psycopg.OperationalError(
            'connection failed: FATAL:  database "nope" does not exist'), ConfigError, False),
        (psycopg.OperationalError(
            "connection to server at \"127.0.0.1\", port 1 failed: Connection refused\n"
            "\tIs the server running on that host?"), ConnectionFailed, True),
        (psycopg.OperationalError("server closed the connection unexpectedly"),
            ConnectionFailed, True),
        # A restart seen mid-stream comes back as a COPY result psycopg cannot class.
        (psycopg.DatabaseError("server closed the connection unexpectedly\n\tThis probably "
            "means the server terminated abnormally"), ConnectionFailed, True),
        (psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
            ConnectionFailed, True),
        (psycopg.errors.CannotConnectNow("the database system is starting up"),
            ConnectionFailed, True),
    ],
)  # fmt: skip
def test_classify(error: psycopg.Error, expected: type[CdcError], retryable: bool) -> None:
    got = classify(error, "doing it")
    assert type(got) is expected
    assert got.retryable is retryable
    assert str(got).startswith("doing it: ") and "\n" not in str(got)


def test_wal_level_error_names_the_setting() -> None:
    got = classify(psycopg.errors.ObjectNotInPrerequisiteState(
        "logical decoding requires wal_level >= logical"), "cannot create slot")  # fmt: skip
    assert "wal_level = logical" in str(got)


# What a PostgreSQL restart raised through psycopg 3.3 / libpq 18, captured from a throwaway
# server (pg_ctl restart -m fast) with and without TLS, by the path it came on.
LOST = [
    # The stream: COPY ended, and the result that followed was a FATAL one without SQLSTATE,
    # which psycopg can only make a DatabaseError (the reader exited 1 on it before).
    psycopg.DatabaseError("SSL connection has been closed unexpectedly"),
    # The stream: libpq noticed while reading.
    psycopg.OperationalError("consuming input failed: SSL connection has been closed unexpectedly"),
    psycopg.OperationalError(
        "consuming input failed: server closed the connection unexpectedly\n\tThis probably "
        "means the server terminated abnormally\n\tbefore or while processing the request."
    ),
    # A query running or sent on a connection the shutdown ended (TLS or not), then the next.
    psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
    psycopg.OperationalError("the connection is closed"),
    # libpq's words with other OpenSSL versions (not captured here).
    psycopg.DatabaseError("SSL SYSCALL error: EOF detected"),
]


@pytest.mark.parametrize("error", LOST, ids=lambda e: first_line(e)[:40])
def test_every_form_of_a_lost_connection_is_worth_a_reconnect(error: psycopg.Error) -> None:
    assert connection_lost(error)
    got = classify(error, "replication stream from 127.0.0.1:5432/app failed")
    assert type(got) is ConnectionFailed and got.retryable


@pytest.mark.parametrize(
    "error",
    [
        psycopg.errors.AdminShutdown(""),  # 57P01
        psycopg.errors.CrashShutdown(""),  # 57P02
        psycopg.errors.CannotConnectNow(""),  # 57P03
        psycopg.errors.IdleSessionTimeout(""),  # 57P05
        psycopg.errors.ConnectionFailure(""),  # 08006
        psycopg.errors.ProtocolViolation(""),  # 08P01
    ],
    ids=lambda e: e.sqlstate,
)
def test_the_sqlstate_decides_without_any_words(error: psycopg.Error) -> None:
    assert connection_lost(error)
    assert type(classify(error, "doing it")) is ConnectionFailed


def test_a_sqlstate_about_the_statement_is_not_a_lost_connection_whatever_it_says() -> None:
    raised = psycopg.errors.RaiseException("server closed the connection unexpectedly")  # P0001
    assert not connection_lost(raised)
    assert not classify(raised, "doing it").retryable


def _bad_pgconn() -> pq.abc.PGconn:
    """A libpq connection in CONNECTION_BAD (nothing listens on port 1)."""
    pgconn = pq.PGconn.connect(b"host=127.0.0.1 port=1 connect_timeout=2")
    assert pgconn.status == pq.ConnStatus.BAD
    return pgconn


def test_a_connection_libpq_gave_up_on_is_lost_whatever_the_words() -> None:
    # Words no list knows (another libpq or OpenSSL): the connection's state still tells.
    odd = psycopg.DatabaseError("SSL error: decryption failed or bad record mac")
    assert not connection_lost(odd)
    assert type(classify(odd, "doing it")) is SlotError
    pgconn = _bad_pgconn()
    try:
        assert connection_lost(odd, pgconn)
        assert type(classify(odd, "doing it", pgconn)) is ConnectionFailed
    finally:
        pgconn.finish()


def test_a_refused_login_stays_a_config_error_even_on_a_bad_connection() -> None:
    refused = psycopg.OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  '
        'password authentication failed for user "cdc"'
    )
    pgconn = _bad_pgconn()
    try:
        assert type(classify(refused, "doing it", pgconn)) is ConfigError
    finally:
        pgconn.finish()
