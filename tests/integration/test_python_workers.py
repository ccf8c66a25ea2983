"""A job's Python workers are started beside its query's first planning
(spark_jobs.source.start_python_workers): a job of one empty task a core, in a group of its
own, that ends once each core's worker ran its task."""

from __future__ import annotations

from typing import Any

import pytest

from spark_jobs.source import WORKERS_GROUP, start_python_workers
from tests.conftest import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_the_workers_start_in_a_job_of_their_own_one_task_a_core(spark: Any) -> None:
    sc = spark.sparkContext
    thread = start_python_workers(spark)
    thread.join(120)
    assert not thread.is_alive(), "the job that starts the Python workers did not end"

    tracker = sc.statusTracker()

    def succeeded() -> list[Any]:
        # The tracker learns of a job's end from Spark's listener bus, after the action has
        # returned: read at once, the job was still RUNNING (a suite run on 172b6b8).
        jobs = [tracker.getJobInfo(i) for i in tracker.getJobIdsForGroup(WORKERS_GROUP)]
        done = jobs and all(j is not None and j.status == "SUCCEEDED" for j in jobs)
        return jobs if done else []

    jobs = wait_until(succeeded, timeout=30, what="the workers' job is SUCCEEDED")
    stages = [tracker.getStageInfo(s) for j in jobs for s in j.stageIds]
    assert [(s.numTasks, s.numCompletedTasks) for s in stages if s is not None] == [
        (sc.defaultParallelism, sc.defaultParallelism)
    ] * len(jobs)
    # The caller's thread is not left in the group: its own jobs are not the workers'.
    assert sc.getLocalProperty("spark.jobGroup.id") != WORKERS_GROUP
