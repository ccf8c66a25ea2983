"""How cdc.replication classifies server errors (messages as PostgreSQL 15 words them)."""

from __future__ import annotations

import psycopg
import pytest

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
