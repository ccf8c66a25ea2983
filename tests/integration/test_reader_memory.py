"""A large transaction streams without the reader's memory growing with it."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import psycopg
import pytest

from tests.conftest import Endpoints, unique
from tests.integration.reader_support import ReaderEnv, end_offset

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _peak_rss(pid: int, proc_done: object) -> int:
    """The process's peak resident set: its kernel high-water mark (VmHWM), polled to the end."""
    assert callable(proc_done)
    ps = psutil.Process(pid)
    peak = 0
    while not proc_done():
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]) * 1024)
            peak = max(peak, ps.memory_info().rss)
        except (OSError, psutil.NoSuchProcess):
            break
        time.sleep(0.02)  # sampling interval; VmHWM keeps the peak between samples
    return peak


def _stream_one_transaction(
    endpoints: Endpoints, dsn: str, prefix: str, rows: int, log_path: Path
) -> int:
    """Peak RSS of ``cdc run --until current`` streaming one ``rows``-row transaction."""
    reader = ReaderEnv(dsn, endpoints.kafka_bootstrap, prefix, unique("slot"))
    table = f"items_{rows}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, marker text, v text)")
    reader.catch_up(CDC_POSTGRES__TABLES=f"public.{table}")  # slot exists; then pure streaming
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {table} SELECT g, 'm' || g, repeat('x', 200) "
            "FROM generate_series(1, %s) g",
            (rows,),
        )
    proc = reader.start(
        "--until", "current", log_path=log_path, CDC_POSTGRES__TABLES=f"public.{table}"
    )
    try:
        peak = _peak_rss(proc.pid, lambda: proc.poll() is not None)
        proc.wait(300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == 0, log_path.read_text()[-3000:]
    assert end_offset(endpoints.kafka_bootstrap, f"{prefix}.public.{table}") == rows
    return peak


def test_large_transaction_streams_in_bounded_memory(
    endpoints: Endpoints, pg_database: str, topic_prefix: str, tmp_path: Path
) -> None:
    small = _stream_one_transaction(
        endpoints, pg_database, topic_prefix, 20_000, tmp_path / "small.log"
    )
    large = _stream_one_transaction(
        endpoints, pg_database, topic_prefix, 200_000, tmp_path / "large.log"
    )
    mib = 2**20
    print(
        f"reader peak RSS: {small / mib:.0f} MiB for a 20k-row transaction, "
        f"{large / mib:.0f} MiB for a 200k-row one"
    )
    # 200k events of ~600 bytes would add ~120 MiB if the transaction were buffered.
    assert large < 1.5 * small, f"peak RSS grew with the transaction: {small=} {large=}"
    assert large < 300 * mib
