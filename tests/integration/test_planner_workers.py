"""The Python data source planners' processes are stopped once a source is planned, and Spark
starts them again if it plans one again (spark_jobs.planner_workers)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from spark_jobs import planner_workers
from tests.conftest import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _planners() -> list[str]:
    """The planner modules among this process's descendants (the session's JVM and its
    Python workers and daemons), one entry a process."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            args = p.cmdline()
        except psutil.Error:
            continue
        found += [a for a in args if a in planner_workers.PLANNERS]
    return found


def _source() -> type:
    from pyspark.sql.datasource import DataSource, DataSourceReader

    class OneRow(DataSourceReader):
        def read(self, partition: Any) -> Iterator[tuple[int]]:
            yield (1,)

    class Tiny(DataSource):
        @classmethod
        def name(cls) -> str:
            return "cdc_test_planners"

        def schema(self) -> str:
            return "x int"

        def reader(self, schema: Any) -> DataSourceReader:
            return OneRow()

    return Tiny


def test_the_planners_stop_and_come_back_when_needed(spark: Any) -> None:
    spark.dataSource.register(_source())
    assert [r.x for r in spark.read.format("cdc_test_planners").load().collect()] == [1]
    running = set(_planners())
    assert {
        "pyspark.sql.worker.create_data_source",
        "pyspark.sql.worker.plan_data_source_read",
    } <= running

    assert planner_workers.stop(spark) >= 2
    wait_until(lambda: not _planners(), timeout=30, what="the planners' processes to end")

    # Planned again: the stopped factories start their daemons again.
    assert [r.x for r in spark.read.format("cdc_test_planners").load().collect()] == [1]
    assert "pyspark.sql.worker.plan_data_source_read" in _planners()


def test_without_spark_nothing_is_stopped_and_nothing_raised() -> None:
    assert planner_workers.stop(object()) == 0
