"""One micro-batch of the joined documents' job (``spark_jobs/documents_sync.py``): the
batch's Kafka records, in the driver, become the join's changes; the documents they touch
are written; the batch is recorded in the state's files.

A record's path: the raw record is parsed by the followers' own parse
(:class:`spark_jobs.parse.RecordParser`) and converted by their change builder
(:class:`spark_jobs.changes.ChangeBuilder`, the values the search follower writes); its key
columns are converted with the key's own schema, so a join value compares as the
converter gives it on both sides (a ``numeric`` key is text in the key as in the row that
references it). The row keeps only the columns the declared documents use, its unchanged
TOAST columns filled from the row the state holds; then :func:`apply_to` feeds every
document's :class:`~spark_jobs.join.JoinState`, record after record, each partition in
offset order. A record no change can be read from is a dead letter (with the reason), and
the rest of the batch is applied, as the table followers do.

Order of a batch (:mod:`spark_jobs.document_state` says why it is safe): compute, write the
documents, write the delta; Spark commits after.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson

from pgcdc.core.errors import SinkError
from sinks.base import key_id
from sinks.search_documents import DocumentWrite, DocumentWriter
from spark_jobs.changes import ChangeBuilder, RecordError
from spark_jobs.convert import RowConverter
from spark_jobs.dead_letter import UnreadableRecord
from spark_jobs.document_state import DocumentStateStore, Event, apply_to
from spark_jobs.join import DocumentSpec, JoinChange, JoinState, Truncate
from spark_jobs.parse import (
    CHANGE,
    DEAD,
    HEARTBEAT,
    KEYLESS,
    TRUNCATE,
    KafkaRecord,
    RecordParser,
    Transcode,
)

log = logging.getLogger(__name__)


def used_columns(specs: Iterable[DocumentSpec]) -> dict[str, frozenset[str]]:
    """Per table, the columns some document reads: the rest is not kept in the state."""
    used: dict[str, set[str]] = defaultdict(set)
    for spec in specs:
        used[spec.root] |= {spec.root_key, *spec.fields, *(lk.on for lk in spec.lookups)}
        for lk in spec.lookups:
            used[lk.table] |= {lk.key, *lk.fields}
        for n in spec.nested:
            used[n.table] |= {n.on, *n.fields, *(a.field for a in n.aggregates)}
    return {t: frozenset(c) for t, c in used.items()}


class KeyReader:
    """A record key's column values, converted with the key's schema (as the row's are)."""

    def __init__(self) -> None:
        self._converters: dict[bytes, RowConverter] = {}

    def __call__(self, key: bytes | None) -> tuple[Any, ...]:
        if key is None:
            raise RecordError("the record has no key")
        parsed = orjson.loads(key)
        if not isinstance(parsed, dict) or not parsed:
            raise RecordError("the key is not a JSON object of key columns")
        payload, schema = parsed, None
        if parsed.get("payload") is not None:
            payload, schema = parsed["payload"], parsed.get("schema")
        if not isinstance(payload, dict) or not payload:
            raise RecordError("the key is not a JSON object of key columns")
        text = orjson.dumps(schema)
        conv = self._converters.get(text)
        if conv is None:
            conv = self._converters[text] = RowConverter(
                schema if isinstance(schema, dict) else None
            )
        return tuple(conv(payload)[0].values())


class RecordChanges:
    """A batch's records → the join's changes, each applied as it is made (a TOAST fill
    reads the state the change before it left)."""

    def __init__(
        self,
        topic_prefix: str,
        specs: Iterable[DocumentSpec],
        transcode: Transcode | None = None,
    ) -> None:
        self.topic_prefix = topic_prefix
        self.columns = used_columns(specs)
        self._keys = KeyReader()
        # Avro records read into Connect JSON first (spark_jobs.avro_input), key included,
        # so the key's schema converts the key as the JSON path's does.
        self._transcode = transcode

    def apply(
        self, records: Iterable[KafkaRecord], states: Mapping[str, JoinState]
    ) -> tuple[list[Event], dict[str, set[Any]], list[UnreadableRecord]]:
        """Apply ``records`` (in order) to ``states``: the changes applied, the ids of the
        documents touched per index, and the records no change could be read from (for
        the dead-letter topic, with the reason; the others are applied)."""
        parser = RecordParser(self.topic_prefix)
        schemas: dict[int, str] = {}
        build = ChangeBuilder(schemas)
        events: list[Event] = []
        touched: dict[str, set[Any]] = defaultdict(set)
        dead: list[UnreadableRecord] = []
        for rec in records:
            if self._transcode is not None:  # the job reads the documents' topics only
                raw_key, raw_value, why = self._transcode(rec.topic, rec.key, rec.value)
                if why is not None:
                    table = rec.topic.removeprefix(self.topic_prefix + ".")
                    dead.append(_unreadable(rec, table, why))
                    continue
                rec = rec._replace(key=raw_key, value=raw_value)
            row = parser(rec)
            if row["schema_id"] is not None and row["value_schema_json"] is not None:
                schemas.setdefault(row["schema_id"], row["value_schema_json"])
            table = row["table"]
            if table not in self.columns or row["kind"] in (HEARTBEAT, KEYLESS):
                continue
            version = (row["commit_lsn"], row["tx_order"])
            event: Event
            if row["kind"] == DEAD:
                dead.append(_unreadable(rec, table, row["parse_error"]))
                continue
            if row["kind"] == TRUNCATE:
                event = Truncate(table, version)
            else:
                assert row["kind"] == CHANGE
                try:
                    change = build({**row, "history": None})
                    key = self._keys(rec.key)
                except RecordError as e:
                    dead.append(_unreadable(rec, table, str(e)))
                    continue
                event = JoinChange(table, key, version, self._row(table, key, change, states))
            events.append(event)
            for index, ids in apply_to(states, event).items():
                touched[index] |= ids
        return events, touched, dead

    def _row(
        self, table: str, key: tuple[Any, ...], change: Any, states: Mapping[str, JoinState]
    ) -> dict[str, Any] | None:
        if change.doc is None:
            return None
        wanted = self.columns[table]
        row = {c: v for c, v in change.doc.items() if c in wanted}
        missing = [c for c in change.unchanged if c in wanted]
        if missing:  # unchanged TOAST: the value the state holds
            for state in states.values():
                held = state.rows[table].get(key) if table in state.spec.tables() else None
                if held is not None and held.row is not None:
                    row.update({c: held.row[c] for c in missing if c in held.row})
                    break
        return row


def _unreadable(rec: KafkaRecord, table: str, reason: str) -> UnreadableRecord:
    """The dead letter of a record no change could be read from."""

    def text(raw: bytes | None) -> str | None:
        return None if raw is None else raw.decode(errors="replace")

    return UnreadableRecord(
        topic=rec.topic,
        partition=rec.partition,
        offset=rec.offset,
        table=table,
        key=text(rec.key),
        value=text(rec.value),
        reason=f"cannot be joined: {reason}",
    )


def document_writes(state: JoinState, ids: Iterable[Any]) -> list[DocumentWrite]:
    """Each document of ``ids`` as the state makes it, with its version (None: delete)."""
    writes: list[DocumentWrite] = []
    for doc_id in sorted(ids, key=repr):
        version, doc = state.document(doc_id)
        writes.append((key_id({state.spec.root_key: doc_id}), version, doc))
    return writes


def kafka_record(r: Any) -> KafkaRecord:
    """A row of Spark's Kafka source as the parse's record."""
    headers = r["headers"]
    return KafkaRecord(
        r["topic"],
        r["partition"],
        r["offset"],
        None if r["key"] is None else bytes(r["key"]),
        None if r["value"] is None else bytes(r["value"]),
        None if headers is None else [(h["key"], h["value"]) for h in headers],
    )


class DocumentsBatch:
    """``foreachBatch``'s function: one batch of the documents' job."""

    def __init__(
        self,
        changes: RecordChanges,
        states: dict[str, JoinState],
        store: DocumentStateStore,
        writer: DocumentWriter,
        dead_letters: Callable[[list[UnreadableRecord]], object],
    ) -> None:
        self.changes = changes
        self.dead_letters = dead_letters
        self.states = states
        self.store = store
        self.writer = writer
        self._failed: BaseException | None = None

    def __call__(self, batch: Any, batch_id: int) -> None:
        records = sorted(
            (kafka_record(r) for r in batch.collect()),
            key=lambda r: (r.topic, r.partition, r.offset),
        )
        self.run(records, batch_id)

    def run(self, records: list[KafkaRecord], batch_id: int) -> None:
        """Batch ``batch_id`` of ``records`` (each partition's in offset order)."""
        if self._failed is not None:
            # The states took part of a batch that failed: only a start from the files is
            # sound (Spark stops the query on the failure anyway).
            raise SinkError("an earlier batch failed; restart the job") from self._failed
        started = time.monotonic()
        try:
            done = self.store.delta(batch_id)
            if done is not None:
                for event in done:
                    apply_to(self.states, event)
                log.info(
                    "batch %d: its documents were written before a restart (its delta is "
                    "there): %d changes applied to the state, nothing written",
                    batch_id,
                    len(done),
                    extra={"batch_id": batch_id},
                )
                return
            events, touched, dead = self.changes.apply(records, self.states)
            if dead:  # before the delta: a batch run again sends them again, never none
                self.dead_letters(dead)
                log.warning(
                    "batch %d: %d records cannot be joined, sent to the dead-letter topic "
                    "(first: %s)",
                    batch_id,
                    len(dead),
                    dead[0]["reason"],
                    extra={"batch_id": batch_id},
                )
            written = 0
            for index, ids in touched.items():
                writes = document_writes(self.states[index], ids)
                self.writer.write(index, writes)
                written += len(writes)
            self.store.commit(batch_id, events, self.states)
        except BaseException as e:
            self._failed = e
            raise
        log.info(
            "batch %d: records=%d changes=%d dead=%d documents=%d in %.2fs",
            batch_id,
            len(records),
            len(events),
            len(dead),
            written,
            time.monotonic() - started,
            extra={"batch_id": batch_id},
        )
