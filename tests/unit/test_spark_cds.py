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
