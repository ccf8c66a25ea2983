"""The Python processes that planned the direct read's data source, stopped once it is planned.

PySpark runs a Python data source's planning in Python workers of their own
(``pyspark.sql.worker.lookup_data_sources``, ``create_data_source``,
``plan_data_source_read``), each forked from a daemon of its own, and keeps daemon and worker
for the life of the driver (an idle worker is ended after a minute, its daemon never), though
a streaming query plans its source once, at its start (what plans each batch's offsets is
another process, the source's runner, which stays). Measured in the shared job's
100,000-row backlog: six processes, 368 MiB of its 1.6 GiB RSS, idle from the first batch on.

Spark has no setting for this and no public handle on those workers: :func:`stop` reaches
the driver's ``SparkEnv`` table of worker factories by reflection and stops the planners'
factories (``PythonWorkerFactory.stop``: their idle workers and their daemon end). A factory
stopped this way starts its daemon again if Spark ever plans a Python data source again, so
nothing depends on this having worked: a Spark whose internals differ gets a DEBUG line and
keeps its processes.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

PLANNERS = frozenset(
    {
        "pyspark.sql.worker.lookup_data_sources",
        "pyspark.sql.worker.create_data_source",
        "pyspark.sql.worker.plan_data_source_read",
    }
)


def stop(spark: Any) -> int:
    """Stop the driver's Python data source planner workers and daemons (see the module's
    docstring); how many factories were stopped (0 if Spark's internals differ)."""
    try:
        sc = spark.sparkContext
        jvm, gateway = sc._jvm, sc._gateway
        env = jvm.org.apache.spark.SparkEnv.get()
        getter = env.getClass().getDeclaredMethod(
            "pythonWorkers", gateway.new_array(jvm.java.lang.Class, 0)
        )
        getter.setAccessible(True)
        factories = getter.invoke(env, gateway.new_array(jvm.java.lang.Object, 0))
        planners = []
        entries = factories.iterator()
        while entries.hasNext():
            entry = entries.next()
            if entry._1().workerModule() in PLANNERS:
                planners.append(entry._2())
        for factory in planners:
            factory.stop()
    except Exception as e:  # an optimisation only: the job runs the same without it
        log.debug("the Python data source planners keep running: %s", e)
        return 0
    return len(planners)
