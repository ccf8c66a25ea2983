"""The tests' Spark JVMs map the archive of Spark's classes (pgcdc/stack/spark_cds.py), so the
half of a short job's start that class loading takes is saved where the archive exists."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from pgcdc.stack import spark_cds

pytestmark = [pytest.mark.unit, pytest.mark.spark]


def test_the_session_jvm_maps_the_class_archive(spark: Any) -> None:
    path = spark_cds.archive()
    given = f"-XX:SharedArchiveFile={path}" in os.environ.get("SPARK_SUBMIT_OPTS", "")
    if not given:
        pytest.skip(f"no class archive was given to the JVM (scripts/test writes {path})")
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    # Mapped: the JVM took the archive (one made by another JDK build, or for another class
    # path, would be left unmapped, silently).
    assert str(path) in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.parametrize(
    ("ages", "deleted"),
    [
        ([0, 1, 2, 3, 4, 5], 3),  # beyond the KEEP used last
        ([9, 8, 1, 7], 2),  # the 8-day one among the three newest, and the fourth
        ([1], 0),
    ],
)
def test_the_cache_keeps_the_archives_used_last(
    tmp_path: Path, ages: list[int], deleted: int
) -> None:
    """Beside the archive just written, the cache keeps the others used last, up to KEEP in
    all, and none unused for a week; the archive itself always stays."""
    now = 1_800_000_000.0
    day = 86400
    kept = tmp_path / "spark-4.2.0-current.jsa"
    kept.write_bytes(b"x")
    os.utime(kept, (now - 30 * day, now - 30 * day))  # old: it is the one in use all the same
    others = []
    for i, age in enumerate(ages):
        p = tmp_path / f"spark-4.2.0-{i}.jsa"
        p.write_bytes(b"x")
        os.utime(p, (now - age * day, now - age * day))
        others.append((age, p))
    (tmp_path / "not-an-archive.txt").write_text("x")

    by_use = sorted(others)
    want = [p for age, p in by_use[: spark_cds.KEEP - 1] if age <= 7]

    gone = spark_cds.prune(kept, now=now)

    assert sorted(p for p in tmp_path.glob("*.jsa") if p != kept) == sorted(want)
    assert kept.is_file() and (tmp_path / "not-an-archive.txt").is_file()
    assert sorted(gone) == sorted({p for _, p in by_use} - set(want))
    assert len(gone) == deleted


def test_giving_the_archive_out_marks_it_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "spark-4.2.0-x.jsa"
    path.write_bytes(b"x")
    os.utime(path, (1_000_000_000, 1_000_000_000))
    monkeypatch.setattr(spark_cds, "archive", lambda: path)
    assert spark_cds.jvm_options() == f"-XX:SharedArchiveFile={path} {spark_cds.QUIET}"
    assert path.stat().st_mtime > 1_000_000_000
