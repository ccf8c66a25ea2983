"""The reader's hot path (decode + encode + produce) over a fixed, captured stream.

    .venv/bin/python -m benchmarks.hotpath capture --txn-rows 100 --changes 20000
    .venv/bin/python -m benchmarks.hotpath replay  --txn-rows 100 [--events 5000] [--profile]
    .venv/bin/python -m benchmarks.hotpath callgrind --txn-rows 100

``capture`` writes the same mixed backlog the bench writes (50% I / 40% U / 10% D, the
bench's 10-column row) into a throwaway database, reads it back from a slot of its own as
pgoutput frames, and saves the frames to ``.cache/hotpath/txn<rows>.frames`` (a header per
frame: wal_start, wal_end, server time, length). Database, slot and publication are dropped.

``replay`` runs the reader's own :class:`cdc.streamer.Streamer` over those frames, with the
real encoder and the real :class:`cdc.publisher.Publisher` producing to the real broker
(a topic prefix of its own, deleted afterwards). Only the replication connection is replaced,
by the file. The catalog reads type information from the live server; the captured table is
gone by then, so the Relation message alone describes it (as for a table dropped since).

``callgrind`` runs ``replay`` under ``valgrind --tool=callgrind`` twice, over the first
``--events`` changes and over three times as many, and reports (instructions of the long run −
instructions of the short run) / (changes between them): the per-change instruction count
of decode + encode + produce, start-up excluded. librdkafka's own threads (compression,
the protocol) are counted too; the broker is another process and is not. Unlike
wall-clock rates, the count hardly moves with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks import workload
from benchmarks.env import ROOT, BenchEnv
from cdc import pgoutput
from cdc.replication import XLogData
from pgcdc.core.lsn import Lsn

CACHE = ROOT / ".cache" / "hotpath"
TABLE = "public.orders"
_FRAME = struct.Struct("!QQqI")
_CHANGE_TYPES = frozenset(b"IUD")
_COMMIT = ord("C")


def frames_path(txn_rows: int) -> Path:
    return CACHE / f"txn{txn_rows}.frames"


# --- capture ------------------------------------------------------------------------------


def capture(env: BenchEnv, txn_rows: int, changes: int, out: Path, table: str = TABLE) -> int:
    """Write the backlog into ``table`` of the run's database (which must exist), read it
    back as pgoutput frames into ``out``; frames written. The slot is dropped at the end."""
    from cdc.replication import ReplicationConnection

    slot = env.register_slot(env.name(f"hot{txn_rows}"))
    pub = env.name(f"hot{txn_rows}_pub")
    existing = 10_000
    with env.connect() as conn:
        workload.create_table(conn, table)
        workload.bulk_load(conn, table, existing)
        conn.execute(f"CREATE PUBLICATION {pub} FOR TABLE {table}")
    repl = ReplicationConnection(env.dsn)
    try:
        created = repl.create_slot(slot, export_snapshot=False)
        with env.connect() as conn:
            backlog = workload.write_backlog(
                conn, table, changes, txn_rows, first_new_id=existing, update_ids=existing
            )
        repl.start(slot, pub, created.consistent_point)
        decoder = pgoutput.Decoder(1)
        seen = frames = 0
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".part")
        deadline = time.monotonic() + 300
        with open(tmp, "wb") as f:
            while True:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"capture stalled after {seen} of {backlog.changes}")
                frame = repl.read(5)
                if not isinstance(frame, XLogData):
                    continue
                payload = bytes(frame.payload)
                f.write(_FRAME.pack(frame.wal_start.value, frame.wal_end.value,
                                    frame.server_time_us, len(payload)))  # fmt: skip
                f.write(payload)
                frames += 1
                msg = decoder.decode(payload)
                if isinstance(msg, pgoutput.Insert | pgoutput.Update | pgoutput.Delete):
                    seen += 1
                elif isinstance(msg, pgoutput.Commit):
                    repl.acknowledge(msg.end_lsn)
                    if seen >= backlog.changes:
                        break
        tmp.rename(out)
        return frames
    finally:
        repl.close()
        env.drop_slot(slot)


def read_frames(path: Path) -> Iterator[XLogData]:
    raw = path.read_bytes()
    pos, end = 0, len(raw)
    while pos < end:
        start, wal_end, clock, n = _FRAME.unpack_from(raw, pos)
        pos += _FRAME.size
        yield XLogData(Lsn(start), Lsn(wal_end), clock, raw[pos : pos + n])
        pos += n


# --- replay -------------------------------------------------------------------------------


class FileReplication:
    """Stands in for :class:`cdc.replication.ReplicationConnection`: the captured frames,
    then a stop (the streamer then flushes the producer and acknowledges, as on a real stop;
    a keepalive loop instead would spin on ``poll(0)`` while Kafka answers, which callgrind
    would count as work)."""

    def __init__(self, frames: list[XLogData], stop: threading.Event) -> None:
        self._frames = iter(frames)
        self._stop = stop
        self.acked: Lsn | None = None

    def read(self, timeout_s: float) -> XLogData | None:
        frame = next(self._frames, None)
        if frame is None:
            self._stop.set()
        return frame

    def acknowledge(self, flush_lsn: Lsn) -> None:
        self.acked = flush_lsn

    def keep_alive(self) -> None:
        pass


def take_changes(frames: list[XLogData], events: int | None) -> tuple[list[XLogData], int]:
    """The frames up to the Commit after the first ``events`` changes (all when None).

    Counted by message type byte, not decoded: under callgrind, this pre-pass must cost
    next to nothing, or it would count as hot-path work."""
    seen = 0
    for i, frame in enumerate(frames):
        kind = frame.payload[0]
        if kind in _CHANGE_TYPES:
            seen += 1
        elif kind == _COMMIT and events is not None and seen >= events:
            return frames[: i + 1], seen
    return frames, seen


@dataclass(frozen=True)
class Replay:
    changes: int
    records: int
    wall_s: float
    cpu_s: float


def replay(env: BenchEnv, path: Path, events: int | None, prefix: str) -> Replay:
    """Stream the captured frames through the reader's Streamer into Kafka (``prefix``)."""
    import psycopg

    from cdc.catalog import SchemaCatalog
    from cdc.publisher import Publisher
    from cdc.streamer import Streamer
    from pgcdc.core.settings import KafkaSettings, PostgresSettings, Settings
    from schemas.envelope import EventEncoder

    frames, changes = take_changes(list(read_frames(path)), events)
    kafka = KafkaSettings(bootstrap_servers=env.bootstrap, topic_prefix=prefix)
    settings = Settings(postgres=PostgresSettings(), kafka=kafka)
    publisher = Publisher(kafka)
    stop = threading.Event()
    repl = FileReplication(frames, stop)
    with psycopg.connect(env.admin_dsn, autocommit=True) as conn:
        streamer = Streamer(
            repl,  # type: ignore[arg-type]
            settings=settings,
            publisher=publisher,
            encoder=EventEncoder(settings.schema_, prefix, "bench"),
            catalog=SchemaCatalog(conn, settings.postgres.message_key_columns),
            stop=stop,
            checkpoint=lambda _lsn: None,
        )
        w0, c0 = time.perf_counter(), time.process_time()
        streamer.run(frames[0].wal_start if frames else Lsn(0))
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    return Replay(changes, streamer.events, wall, cpu)


# --- callgrind ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Instructions:
    """Per-change instruction count of the hot path (callgrind), and its two runs."""

    txn_rows: int
    events_short: int
    events_long: int
    ir_short: int
    ir_long: int

    @property
    def per_change(self) -> float:
        return (self.ir_long - self.ir_short) / (self.events_long - self.events_short)


def _callgrind_run(txn_rows: int, events: int, workdir: Path) -> tuple[int, int]:
    """(changes replayed, total instructions) of one replay under callgrind."""
    out = workdir / f"cg.{txn_rows}.{events}.out"
    cmd = [
        "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
        sys.executable, "-m", "benchmarks.hotpath", "replay",
        "--txn-rows", str(txn_rows), "--events", str(events), "--json",
    ]  # fmt: skip
    env = dict(os.environ, PYTHONHASHSEED="0")
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"callgrind run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    m = re.search(r"Collected\s*:\s*(\d+)", proc.stderr)
    if not m:
        raise RuntimeError(f"no 'Collected' line in callgrind's output: {proc.stderr[-500:]}")
    return int(result["changes"]), int(m.group(1))


def callgrind(txn_rows: int, events: int) -> Instructions:
    """Instructions per change: two replays (``events`` and ``3 × events`` changes)."""
    if shutil.which("valgrind") is None:
        raise RuntimeError("valgrind is not installed (apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="hotpath-cg-") as tmp:
        short = _callgrind_run(txn_rows, events, Path(tmp))
        long = _callgrind_run(txn_rows, 3 * events, Path(tmp))
    return Instructions(txn_rows, short[0], long[0], short[1], long[1])


# --- command line -------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.hotpath",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("command", choices=("capture", "replay", "callgrind"))
    ap.add_argument("--txn-rows", type=int, default=100)
    ap.add_argument("--changes", type=int, default=20_000, help="capture: backlog size")
    ap.add_argument("--events", type=int, default=None, help="replay/callgrind: changes")
    ap.add_argument("--profile", action="store_true", help="replay under cProfile")
    ap.add_argument("--json", action="store_true", help="replay: one JSON line")
    a = ap.parse_args(argv)
    env = BenchEnv.from_environ()
    path = frames_path(a.txn_rows)
    if a.command == "capture":
        try:
            env.create_database()
            n = capture(env, a.txn_rows, a.changes, path)
        finally:
            env.cleanup()
        print(f"{n:,} frames -> {path}")
        return 0
    if not path.exists():
        print(f"{path} is missing: run 'python -m benchmarks.hotpath capture "
              f"--txn-rows {a.txn_rows}' first", file=sys.stderr)  # fmt: skip
        return 2
    if a.command == "callgrind":
        ins = callgrind(a.txn_rows, a.events or 2_000)
        print(json.dumps(asdict(ins) | {"per_change": ins.per_change}))
        return 0
    prefix = env.register_prefix(env.name("hot"))
    try:
        if a.profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            r = prof.runcall(replay, env, path, a.events, prefix)
            pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(30)
        else:
            r = replay(env, path, a.events, prefix)
    finally:
        env.cleanup()
    if a.json:
        print(json.dumps(asdict(r)))
    else:
        print(f"{r.changes:,} changes ({r.records:,} events) in {r.wall_s:.2f}s wall, "
              f"{r.cpu_s:.2f}s CPU: {r.changes / r.wall_s:,.0f}/s wall, "
              f"{r.changes / r.cpu_s:,.0f} per CPU-second (loaded shared machine)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
