"""``cdc forget TABLE``: a table that left the captured set leaves Kafka and the followers too.

When a table leaves the captured set (``postgres.tables``, or the publication), the reader
stops capturing it and says so, but its topic keeps the table's last rows, and so do the
followers (and any follower built later from the compacted topic). Debezium leaves the topic
as it is too; removing the rows is the user's call. This command makes it: it writes a
tombstone for every key live in the table's topic, versioned at the server's current WAL
position (newer than every change the topic holds), so the running sync jobs delete their
copies as they apply them, and compaction then empties the topic for followers built later.
The topic itself stays: a job subscribed to it keeps running. A table still captured is
refused (the stream would bring it back).
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from confluent_kafka import KafkaError, Producer

from cdc.connection import connect, current_database, current_wal_lsn
from cdc.kafka_clients import client_conf
from cdc.live_keys import keys_live_before
from cdc.state import StateStore
from pgcdc.core.contract import table_topic, version_headers
from pgcdc.core.errors import ConfigError, PublishError
from pgcdc.core.settings import Settings

log = logging.getLogger(__name__)


def _captured(conn: psycopg.Connection[Any], publication: str, schema: str, table: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM pg_publication_tables "
        "WHERE pubname = %s AND schemaname = %s AND tablename = %s",
        (publication, schema, table),
    ).fetchone()
    return row is not None


def forget(settings: Settings, schema: str, table: str) -> int:
    """Tombstone every live key of the table's topic; the number of keys. Raises
    ConfigError while the table is still captured."""
    pg, kafka = settings.postgres, settings.kafka
    name = f"{schema}.{table}"
    with connect(pg.dsn.get_secret_value()) as conn:
        if _captured(conn, pg.publication_name, schema, table):
            raise ConfigError(
                f"table {name} is still captured (publication {pg.publication_name}): remove it "
                "from postgres.tables (or the publication) and restart the reader first"
            )
        database = current_database(conn)
        commit_lsn = str(current_wal_lsn(conn).value).encode()
    topic = table_topic(kafka.topic_prefix, schema, table)
    errors: list[str] = []

    def on_delivery(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            errors.append(err.str())

    producer = Producer(client_conf(kafka, acks="all"))
    count = 0
    with keys_live_before(kafka, topic, (2**63 - 1, 0)) as live:
        for count, key in enumerate(live, 1):
            headers = version_headers(commit_lsn, count)
            producer.produce(topic, key=key, value=None, headers=headers, on_delivery=on_delivery)
            producer.poll(0)
    if producer.flush(60) or errors:
        raise PublishError(f"cannot write the tombstones of {topic}: {errors[:1] or 'timed out'}")
    store = StateStore(kafka, kafka.topic_prefix)
    left = store.load_left(database, pg.slot_name)
    if (schema, table) in left:
        store.save_left(database, pg.slot_name, [t for t in left if t != (schema, table)])
    store.close()
    log.info(
        "forgot %s: %d keys tombstoned in %s; the followers delete their copies as they apply them",
        name,
        count,
        topic,
        extra={"table": name, "topic": topic},
    )
    return count
