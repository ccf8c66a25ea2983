"""A class-data-sharing archive for this checkout's Spark JVMs: their start, and their first
micro-batches, cost less CPU.

Every Spark JVM (a job's driver through ``scripts/spark-submit``, the tests' session) loads
and verifies the same ten thousand or so classes of Spark's jars before it does anything;
on this 2-core machine that is most of a short job's CPU. A HotSpot archive of those
classes, written once by a JVM that ran a small representative workload
(``-XX:ArchiveClassesAtExit``), is mapped by the others (``-XX:SharedArchiveFile``). A
trivial job measured 8.7 CPU seconds without it, 5.1 with it; the shared job over a
100,000-row backlog, 10.9 s of JVM CPU without it, 5.4 with it (2.1 and 1.4 s inside the
apply window).

``make install`` writes it (``python -m pgcdc.stack.spark_cds``), as ``scripts/test`` does
before its phases when it is missing, into ``CACHE_DIR/spark-cds/`` under a name of the JVM,
the Spark release and its jars' directory. ``scripts/spark-submit`` gives it to the job's
driver JVM (through ``SPARK_SUBMIT_OPTS``, unless that is set: set it, even to a space, to
run without), and ``tests/conftest.py`` to every JVM the tests start. A JVM that finds it
unusable (another JDK build, another class path) runs without it, as if it were not given;
the JVM says nothing then (``-Xlog:cds=off``). Executors on a cluster are not touched.
Every JVM that maps it has the Kafka connector's jars on its class path
(:func:`driver_class_path`), as its writer had: an archive serves only the class path it
was written with.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run by spark-submit as a file (the archive's workload)

from pgcdc.stack import common  # noqa: E402

# What the JVM prints about an archive it cannot use (and about classes it skips while
# writing one) is none of a test's business.
QUIET = "-Xlog:cds=off,cds+dynamic=off"
# Archives kept in the cache: this one and the others used last (each checkout's virtualenv
# has its own, about 170 MiB: a fresh clone a run left 25 of them, 3.9 GiB, in two days).
KEEP = 4
# The class path the archive is written with, as the JVMs that map it have it: the Kafka
# connector's jars on the driver's class path (driver_class_path), before Spark's own.
LAYOUT = "connector-jars-on-the-driver-class-path"
_UNUSED_S = 7 * 86400  # and none kept that went unused for a week


def _java() -> str:
    """The java Spark's launcher runs (bin/spark-class): JAVA_HOME's, else the first on PATH."""
    home = os.environ.get("JAVA_HOME")
    java = Path(home) / "bin" / "java" if home else shutil.which("java")
    return str(Path(java).resolve()) if java else "java"


def pyspark_dir() -> Path | None:
    """The installed pyspark package: the running interpreter's, else the checkout's venv's
    (``scripts/spark-submit`` may run under a python3 without it)."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec and spec.origin:
        return Path(spec.origin).parent
    found = sorted(ROOT.glob(".venv/lib/python*/site-packages/pyspark"))
    return found[0] if found else None


def _spark_version(pyspark: Path) -> str:
    text = (pyspark / "version.py").read_text() if (pyspark / "version.py").is_file() else ""
    match = re.search(r"""__version__[^=]*=\s*["']([^"']+)["']""", text)
    return match.group(1) if match else "unknown"


def archive() -> Path:
    """Where the archive of this JVM and this Spark release lives (it may not exist)."""
    java = _java()
    pyspark = pyspark_dir()
    # The jars' directory as the JVM's class path names it (a checkout's own virtualenv):
    # an archive is only used with the class path it was written with.
    jars = pyspark / "jars" if pyspark else Path("-")
    stamp = [java, os.stat(java).st_mtime_ns if os.path.exists(java) else 0, jars]
    stamp.append(jars.stat().st_mtime_ns if jars.exists() else 0)
    spark = _spark_version(pyspark) if pyspark else "unknown"
    key = hashlib.sha256(repr((stamp, spark, LAYOUT)).encode()).hexdigest()[:16]
    return common.paths().cache / "spark-cds" / f"spark-{spark}-{key}.jsa"


def driver_class_path(jars: Sequence[Path | str]) -> str:
    """The Kafka connector's ``jars`` as the driver's class path (``--driver-class-path``,
    ``spark.driver.extraClassPath``), which every JVM that maps the archive is given.

    With the jars only in ``--jars`` (``spark.jars``), Spark's own class loader read their
    classes from the jars at every start, outside any archive: the Kafka admin client's
    first request alone loaded the protocol's several hundred message classes. On the class
    path, the archive holds them. Measured (a 20,000-row backlog, the shared job, four runs
    each): the driver JVM's CPU 3.6 s against 4.1 in all, 0.97 s against 1.22 from the
    query's start to its end."""
    return ":".join(str(j) for j in jars)


def jvm_options() -> str:
    """The options that map the archive, or nothing when there is none yet. Giving it out
    marks it used (its modification time: what :func:`prune` keeps the newest of)."""
    path = archive()
    if not path.is_file():
        return ""
    with contextlib.suppress(OSError):  # a cache this user may read but not write
        os.utime(path)
    return f"-XX:SharedArchiveFile={path} {QUIET}"


def prune(keep: Path, *, now: float | None = None) -> list[Path]:
    """Delete from ``keep``'s folder the archives beyond the :data:`KEEP` used last (``keep``
    among them) and any other unused for a week; those deleted. An archive deleted while a
    JVM maps it stays mapped; a checkout whose archive went writes it again (``ensure``) and
    its JVMs start without it meanwhile."""
    now = time.time() if now is None else now
    used: list[tuple[float, Path]] = []
    for p in keep.parent.glob("spark-*.jsa"):
        try:  # another checkout's ensure may prune beside this one
            used.append((p.stat().st_mtime, p))
        except OSError:
            continue
    others = [(at, p) for at, p in sorted(used, reverse=True) if p != keep]
    gone = [p for i, (at, p) in enumerate(others) if i >= KEEP - 1 or now - at > _UNUSED_S]
    for p in gone:
        p.unlink(missing_ok=True)
    return gone


def workload() -> None:
    """What the archive's JVM runs: a session as the tests configure it, a shuffle, a Python
    UDF over Arrow, two micro-batches of a streaming query with ``foreachBatch`` and Spark's
    Kafka source asking a listener that is no broker for its topics, so the classes of the
    paths the jobs take are loaded (and so archived) once."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    jars = sys.argv[2] if len(sys.argv) > 2 else ""
    builder = SparkSession.builder.master("local[2]").appName("cdc-tests-cds")
    session = (
        builder.config("spark.jars", jars)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    df = session.range(2000).selectExpr("id % 7 AS k", "CAST(id AS STRING) AS v")
    assert df.groupBy("k").count().count() == 7

    def lengths(batches):  # type: ignore[no-untyped-def]
        for b in batches:
            yield b.select(["k"])

    assert df.mapInArrow(lengths, "k long").count() == 2000
    seen: list[int] = []
    with tempfile.TemporaryDirectory() as cp:
        query = (
            session.readStream.format("rate")
            .option("rowsPerSecond", 100)
            .load()
            .withColumn("k", F.col("value") % 3)
            .writeStream.option("checkpointLocation", cp)
            .foreachBatch(lambda batch, n: seen.append(batch.count()))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        deadline = time.monotonic() + 120
        while len(seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        query.stop()
    kafka_source(session)
    session.stop()
    assert len(seen) >= 3, f"the streaming query ran {len(seen)} batches"


def kafka_source(session: Any) -> None:
    """Start a query on Spark's Kafka source whose broker is a socket here that takes the
    admin client's connection and answers nothing: the client sends its first request
    (which loads the protocol's message classes) and the query fails once it gives up. No
    broker is needed to write the archive."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):  # closed at the end
            while True:
                held.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    port = listener.getsockname()[1]
    with tempfile.TemporaryDirectory() as cp:
        query = (
            session.readStream.format("kafka")
            .option("kafka.bootstrap.servers", f"127.0.0.1:{port}")
            .option("subscribePattern", "^cds$")
            .option("kafka.default.api.timeout.ms", "3000")
            .option("kafka.request.timeout.ms", "1000")
            .option("fetchOffset.numRetries", "1")
            .load()
            .writeStream.option("checkpointLocation", cp)
            .foreachBatch(lambda batch, n: None)
            .start()
        )
        with contextlib.suppress(Exception):  # it fails: no broker answered
            query.awaitTermination(60)
        query.stop()
    listener.close()
    for conn in held:
        conn.close()


def ensure() -> Path | None:
    """Write the archive when it is missing; its path, or None when writing it failed (the
    JVMs then start without it)."""
    path = archive()
    if path.is_file():
        return path
    import pyspark

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    jars = subprocess.run(
        [str(ROOT / "scripts" / "stack"), "jars"], capture_output=True, text=True, check=False
    ).stdout.strip()
    class_path = ["--driver-class-path", driver_class_path(jars.split(","))] if jars else []
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_SUBMIT_OPTS": f"-XX:TieredStopAtLevel=1 -XX:ArchiveClassesAtExit={partial} {QUIET}",
    }
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    began = time.monotonic()
    try:  # half a minute here; the parallel phase waits for it, so not for ever
        done = subprocess.run(
            [str(submit), *class_path, __file__, "--workload", jars],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    except subprocess.TimeoutExpired:
        partial.unlink(missing_ok=True)
        print("spark-cds: no archive (its JVM ran over 240 s); Spark's JVMs start without one")
        return None
    if done.returncode == 0 and partial.is_file():
        # A JVM that maps a damaged archive stops at once; a sound one maps it or leaves it.
        done = subprocess.run(
            [_java(), f"-XX:SharedArchiveFile={partial}", "-version"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=tempfile.gettempdir(),
        )
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        print(f"spark-cds: no archive, Spark's JVMs start without one: {tail}")
        return None
    partial.replace(path)
    prune(path)
    print(
        f"spark-cds: wrote {path} ({path.stat().st_size >> 20} MiB, {time.monotonic() - began:.0f} s)"
    )
    return path


if __name__ == "__main__":
    if sys.argv[1:2] == ["--workload"]:
        workload()
    else:
        ensure()
