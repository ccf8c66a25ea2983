"""A job whose query's frame is only planned (spark.direct_planner = kafka) plans it without
whole-stage code generation (spark_jobs.source.plan_only), unless spark-submit's
configuration says otherwise."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pyspark import SparkConf

from spark_jobs.source import WHOLE_STAGE, plan_only

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def session(spark: Any) -> Iterator[Any]:
    """The shared session, its code generation setting as it was afterwards."""
    before = spark.conf.get(WHOLE_STAGE, None)
    try:
        yield spark
    finally:
        if before is None:
            spark.conf.unset(WHOLE_STAGE)
        else:
            spark.conf.set(WHOLE_STAGE, before)


def _compiled(spark: Any) -> bool:
    """Whether a projection's physical plan (what the foreachBatch sink makes an RDD of) is
    compiled whole-stage."""
    frame = spark.range(3).selectExpr("id + 1 AS x")
    plan = frame._jdf.queryExecution().executedPlan()
    return bool(plan.getClass().getSimpleName() == "WholeStageCodegenExec")


def test_a_planned_only_frame_is_not_compiled(session: Any) -> None:
    assert _compiled(session), "the session compiles whole stages before"
    assert plan_only(session, SparkConf(loadDefaults=False))
    assert session.conf.get(WHOLE_STAGE) == "false"
    assert not _compiled(session)


def test_a_setting_given_to_spark_submit_wins(session: Any) -> None:
    given = SparkConf(loadDefaults=False).set(WHOLE_STAGE, "true")
    assert not plan_only(session, given)
    assert _compiled(session)
