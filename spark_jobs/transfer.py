"""How a task's rows reach Python and its stats come back: Arrow, through
``DataFrame.mapInArrow``.

The task's function receives the Arrow record batches of its whole Spark partition (Spark
cuts a partition into batches of ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows; all
of them come through the one iterator, so the reduction still sees the whole partition).
:func:`rows_from_arrow` turns them into plain dicts column by column (~2.6 µs per row of
the classified frame here; ``RecordBatch.to_pylist()`` without the schema column 3.0 µs,
with it 7.9 µs). The path it replaces (``DataFrame.rdd``: each row turned into a Java Row,
pickled by Pyrolite and unpickled into a ``pyspark.sql.Row``) cost a few µs more per row of
JVM and Python CPU (``python -m benchmarks.transfer``: 85 + 11.0 µs against 78 + 8.0 µs); the
JVM's JSON parse before either (~80 µs per 4 kB event) is most of a change's cost.

Every event carries its table's whole Connect schema (``value_schema_json``, most of a
record's bytes) although the reduction needs each distinct one once: only the first row of
each (topic, ``schema_id``) in the partition gets it as a Python string, the others None
(:func:`spark_jobs.reduce.latest_per_key` reads a schema only where it is not None). Dead
records keep theirs: the task may read one again with a schema of its own, so it cannot
stand for the others of its id.

With ``spark.parse = "python"`` the task gets the Kafka source's own columns instead
(:data:`RECORD_COLUMNS`: key, value and header bytes, no parse in the JVM) and
:func:`records_from_arrow` hands them to :mod:`spark_jobs.parse` as they are.

A task returns one row: its :class:`~spark_jobs.stats.BatchStats`, pickled, in the binary
column of :data:`STATS_SCHEMA`.

Pure code over pyarrow; no Spark needed to test it.
"""

from __future__ import annotations

import array
import pickle
from collections.abc import Iterable, Iterator
from functools import cache
from typing import TYPE_CHECKING, Any

from spark_jobs.parse import KafkaRecord, carries_schema
from spark_jobs.stats import BatchStats

if TYPE_CHECKING:  # imported where used: it starts threads (see spark_jobs.daemon)
    import pyarrow as pa

SCHEMA_COLUMN = "value_schema_json"
# What each task returns to the driver (a DDL string for mapInArrow).
STATS_SCHEMA = "stats binary"


@cache
def _stats_arrow() -> pa.Schema:
    import pyarrow as pa

    return pa.schema([pa.field("stats", pa.binary())])


def rows_from_arrow(batches: Iterable[pa.RecordBatch]) -> Iterator[dict[str, Any]]:
    """The rows of ``batches`` (one partition of the classified frame) as dicts keyed by
    column name, ``value_schema_json`` only at each (topic, schema_id)'s first live row
    and at every dead one."""
    seen: set[tuple[Any, Any]] = set()
    for batch in batches:
        names = batch.schema.names
        columns: list[list[Any]] = []
        for i, name in enumerate(names):
            columns.append([] if name == SCHEMA_COLUMN else _pylist(batch.column(i)))
        if SCHEMA_COLUMN in names:
            at = names.index(SCHEMA_COLUMN)
            schemas = batch.column(at)
            topics = columns[names.index("topic")]
            ids = columns[names.index("schema_id")]
            kinds = columns[names.index("kind")]
            only_first: list[Any] = [None] * batch.num_rows
            for i, (kind, topic, sid) in enumerate(zip(kinds, topics, ids, strict=True)):
                if carries_schema(seen, kind, topic, sid):
                    only_first[i] = _py(schemas, i)
            columns[at] = only_first
        for values in zip(*columns, strict=True):
            yield dict(zip(names, values, strict=True))


# The Kafka source's columns the ``python`` parse reads (spark.parse; spark_jobs.parse).
RECORD_COLUMNS = ("topic", "partition", "offset", "key", "value", "headers")


def records_from_arrow(batches: Iterable[pa.RecordBatch]) -> Iterator[KafkaRecord]:
    """The Kafka records of ``batches`` (the source's :data:`RECORD_COLUMNS`), bytes as
    they are: the task parses them itself (:mod:`spark_jobs.parse`). Column by column: the
    headers as one flat list of (name, value) pairs, sliced per record (a dict per header
    through ``to_pylist`` cost more than the rest of the record)."""
    for batch in batches:
        names = batch.schema.names
        topics, partitions, offsets, keys, values, headers = (
            batch.column(names.index(name)) for name in RECORD_COLUMNS
        )
        yield from map(
            KafkaRecord,
            topics.to_pylist(),
            partitions.to_pylist(),
            offsets.to_pylist(),
            keys.to_pylist(),
            values.to_pylist(),
            _header_pairs(headers),
        )


def _header_pairs(headers: pa.ListArray) -> list[list[tuple[str, bytes | None]] | None]:
    """Each record's headers as (name, value) pairs; None for a null list."""
    bounds = headers.offsets.to_pylist()
    names, values = headers.flatten().flatten()
    pairs = list(zip(names.to_pylist(), values.to_pylist(), strict=True))
    base = bounds[0]
    out: list[list[tuple[str, bytes | None]] | None] = [
        pairs[bounds[i] - base : bounds[i + 1] - base] for i in range(len(headers))
    ]
    if headers.null_count:
        for i, valid in enumerate(headers.is_valid().to_pylist()):
            if not valid:
                out[i] = None
    return out


def _pylist(column: pa.Array) -> list[Any]:
    """The column's values; text that is not UTF-8 (Spark's strings are bytes: a Kafka key
    or value cast to a string keeps whatever it held) gets U+FFFD for each bad sequence, as
    the JVM's conversion of the old path gave, instead of failing the task."""
    try:
        return column.to_pylist()  # type: ignore[no-any-return]
    except UnicodeDecodeError:
        import pyarrow as pa

        raw = column.cast(pa.binary()).to_pylist()
        return [None if b is None else b.decode("utf-8", "replace") for b in raw]


def _py(column: pa.Array, i: int) -> Any:
    """The value at ``i`` (see :func:`_pylist` for text that is not UTF-8)."""
    try:
        return column[i].as_py()
    except UnicodeDecodeError:
        import pyarrow as pa

        return column[i].cast(pa.binary()).as_py().decode("utf-8", "replace")


def stats_batch(stats: Iterable[BatchStats]) -> pa.RecordBatch:
    """The task's answer to the driver: one row per :class:`BatchStats`, pickled."""
    import pyarrow as pa

    values = [pickle.dumps(s, protocol=pickle.HIGHEST_PROTOCOL) for s in stats]
    return pa.RecordBatch.from_arrays([binary_array(values)], schema=_stats_arrow())


def binary_array(values: list[bytes]) -> pa.Array:
    """``values`` as an Arrow binary array, made from its buffers: pyarrow's conversion of a
    Python list (``pa.array``, ``from_pylist``) imports pandas to look for its types, which
    costs each Python worker that never needs pandas 0.28 s of CPU and its memory."""
    import pyarrow as pa

    offsets = array.array("i", [0])
    end = 0
    for v in values:
        end += len(v)
        offsets.append(end)
    data = pa.py_buffer(b"".join(values))
    return pa.Array.from_buffers(pa.binary(), len(values), [None, pa.py_buffer(offsets), data])


def stats_from_rows(rows: Iterable[Any]) -> list[BatchStats]:
    """The tasks' stats back from the collected rows of :data:`STATS_SCHEMA` (the driver
    reads what its own job's tasks pickled)."""
    out: list[BatchStats] = []
    for row in rows:
        stats = pickle.loads(row["stats"])
        if not isinstance(stats, BatchStats):
            raise TypeError(f"a task returned {type(stats).__name__}, not BatchStats")
        out.append(stats)
    return out
