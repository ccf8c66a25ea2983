"""The one settings object.

Sources, highest priority first: explicit overrides (CLI flags), ``CDC_*`` environment
variables (``__`` separates sections, e.g. ``CDC_POSTGRES__DSN``), a TOML config file
(``--config`` or ``CDC_CONFIG``), then defaults that point at the local stack
(``scripts/stack``, ports from ``pgcdc.core.ports``). Only entry points call :func:`load_settings`;
it refuses a ``CDC_*`` variable that is no setting and reports every invalid value at once,
each with where it came from (:mod:`pgcdc.core.settings_sources`).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from pgcdc.core import client_security, ports
from pgcdc.core.client_security import SaslMechanism, SecurityProtocol
from pgcdc.core.contract import DEFAULT_DEAD_LETTER_TOPIC
from pgcdc.core.document_settings import DocumentSettings, check_documents, documents_from_text
from pgcdc.core.errors import ConfigError
from pgcdc.core.key_columns import KeyColumns, parse_message_key_columns
from pgcdc.core.qualified_names import split_list, split_qualified
from pgcdc.core.spark_settings import SparkSettings

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class SnapshotMode(StrEnum):
    INITIAL = "initial"
    NO_DATA = "no_data"
    INITIAL_ONLY = "initial_only"
    WHEN_NEEDED = "when_needed"


class InitialSnapshot(StrEnum):
    """How the initial snapshot is read (see docs/incremental-snapshots.md)."""

    EXPORTED = "exported"  # inside the slot's exported snapshot, in parallel; restarts if cut
    INCREMENTAL = "incremental"  # chunks between watermarks while streaming; resumes if cut


class DecimalHandling(StrEnum):
    PRECISE = "precise"
    STRING = "string"
    DOUBLE = "double"


class BinaryHandling(StrEnum):
    BYTES = "bytes"
    BASE64 = "base64"
    HEX = "hex"


class IntervalHandling(StrEnum):
    NUMERIC = "numeric"
    STRING = "string"


class HStoreHandling(StrEnum):
    """Debezium's ``hstore.handling.mode``: a JSON string, or a Connect map."""

    JSON = "json"
    MAP = "map"


class TimePrecision(StrEnum):
    """Debezium's ``time.precision.mode`` for date, time and timestamp columns."""

    ADAPTIVE = "adaptive"
    ADAPTIVE_TIME_MICROSECONDS = "adaptive_time_microseconds"
    CONNECT = "connect"


class HeaderFormat(StrEnum):
    """How the key-change headers (``__debezium.newkey``/``__debezium.oldkey``) are written."""

    SIMPLE = "simple"  # Kafka Connect's default SimpleHeaderConverter: {"id":5}
    JSON = "json"  # JsonConverter, as Debezium Server writes them: the record key itself


class ValueFormat(StrEnum):
    JSON = "json"
    AVRO = "avro"


class PublicationAutocreate(StrEnum):
    """Debezium's ``publication.autocreate.mode``: what the reader may do to the publication."""

    ALL_TABLES = "all_tables"  # create it FOR ALL TABLES if missing (needs a superuser)
    DISABLED = "disabled"  # never create or alter it: it must exist (made by its owner)
    FILTERED = "filtered"  # create it, or set its tables, to exactly postgres.tables
    NO_TABLES = "no_tables"  # create it without tables if missing; its owner adds them


class UnproducibleRecords(StrEnum):
    """What the reader does with a record Kafka refuses for good (too large, invalid)."""

    FAIL = "fail"  # stop with one line naming the table and key; acknowledge nothing after it
    DEAD_LETTER = "dead_letter"  # write it to kafka.dead_letter_topic with the reason; go on


# Debezium's skipped.operations values (its "none" means the empty set).
OPERATIONS = ("c", "u", "d", "t")


class PostgresSettings(BaseModel):
    model_config = _FROZEN

    dsn: SecretStr = SecretStr(ports.POSTGRES_DSN)
    slot_name: str = "cdc_slot"
    publication_name: str = "cdc_pub"
    # Include list of "schema.table" (a name with a dot or a comma in double quotes, as in
    # SQL: public."a.b"); empty means every table.
    tables: Annotated[tuple[str, ...], NoDecode] = ()
    # Debezium's publication.autocreate.mode; unset: filtered when postgres.tables lists
    # tables, else all_tables. A least-privilege role uses disabled (see docs/own-postgres.md).
    publication_autocreate_mode: PublicationAutocreate | None = None
    snapshot_mode: SnapshotMode = SnapshotMode.INITIAL
    snapshot_workers: int = Field(default=2, ge=1, le=64)
    snapshot_chunk_rows: int = Field(default=50_000, ge=100)
    drop_slot_on_exit: bool = False
    # A slot that exists without a record of this reader creating it (under this topic
    # prefix) is refused, never dropped, recreated or advanced: it belongs to another tool or
    # another prefix. True takes it over: the reader streams from its position and (unless
    # snapshot_mode = no_data) snapshots every captured table incrementally while streaming.
    adopt_slot: bool = False
    # exported: the initial snapshot reads every table inside the slot's exported snapshot
    # (fast, parallel; an interrupted one starts over). incremental: the slot streams at once
    # and every table is read in watermarked chunks, resumed at the next chunk after a stop.
    initial_snapshot: InitialSnapshot = InitialSnapshot.EXPORTED
    # Rows per chunk of an incremental snapshot (Debezium's incremental.snapshot.chunk.size).
    incremental_chunk_rows: int = Field(default=10_000, ge=1)
    # A table that joins the captured set (publication or postgres.tables), while the reader
    # runs or between runs, is snapshotted incrementally (Flink CDC's newly added tables).
    snapshot_new_tables: bool = True
    # A captured table whose columns change (a Relation message with other columns or types
    # than last seen: DROP, RENAME, ALTER TYPE, ADD COLUMN) is snapshotted again,
    # incrementally, so rows that did not change since reach the followers in the new shape.
    snapshot_on_schema_change: bool = True
    # Debezium's signal.data.collection: a "schema.table" with columns id, type, data whose
    # inserted rows are signals (execute-snapshot, stop-snapshot); added to the publication.
    # Its grants authenticate it: only trusted roles may insert (signal_trusted_roles).
    signal_data_collection: str | None = None
    # The key (16 characters or more) that signs signals sent through the WAL (`cdc
    # snapshot`) and the Kafka signal topic: HMAC-SHA256, unsigned ones are refused (see
    # docs/incremental-snapshots.md). Unset: the local stack's generated key when postgres.dsn
    # points at it, else derived from the password in postgres.dsn if that has 16 characters
    # or more, so the reader and `cdc snapshot` with the same settings agree; else WAL and
    # Kafka signals are refused.
    signal_secret: SecretStr | None = None
    # Roles besides the reader's own and superusers (and the members of all of these) that
    # may insert into the signal table; the reader refuses to watch one anyone else can write.
    signal_trusted_roles: Annotated[tuple[str, ...], NoDecode] = ()
    # Functions (schema.name) a signal's filter may call besides pg_catalog's immutable
    # ones (they must be immutable too); e.g. "public.tenant_of". Operators resolve in
    # pg_catalog only.
    signal_filter_functions: Annotated[tuple[str, ...], NoDecode] = ()
    # An UPDATE that leaves a TOASTed column alone does not carry its value (pgoutput sends
    # "unchanged TOAST"). True: the reader reads the value by key, so every event holds the
    # whole row and a compacted topic alone rebuilds a follower. False: Debezium's behaviour,
    # the placeholder __debezium_unavailable_value.
    complete_unchanged_toast: bool = True
    status_interval_s: float = Field(default=5.0, gt=0)
    # After the stream lost PostgreSQL (a restart, a failover, a dropped connection), or Kafka
    # for longer than the producer's message.timeout.ms, the reader starts a new run from the
    # slot's position, waiting 1 s, then twice as long each time up to 30 s, for at most this
    # many seconds of failures in a row; 0 stops at once. A run that never reached the stream
    # or the initial snapshot is not retried: a wrong host or password shows at once.
    reconnect_timeout_s: float = Field(default=300.0, ge=0)
    # An initial snapshot that lost PostgreSQL (a restart, a terminated connection) starts
    # over by itself this many times (from a new slot: the copy is exact again), each after
    # reconnecting as above, with one log line saying which attempt and why; 0 stops at once.
    snapshot_retries: int = Field(default=3, ge=0)
    proto_version: int = Field(default=1, ge=1, le=4)
    # PostgreSQL 17+: the slot is a failover slot (failover = true), which a standby with
    # sync_replication_slots = on keeps a copy of, so that after a failover the reader resumes
    # on the promoted standby with no new snapshot. An existing slot is altered to match at
    # start. Ignored before 17 and on a standby (where a slot cannot be a failover slot).
    slot_failover: bool = True
    # PostgreSQL 18+: the publication the reader creates publishes stored generated columns
    # (publish_generated_columns = stored), so records (snapshot and stream) carry them. An
    # existing publication keeps its own choice; the reader reads it and says what it leaves out.
    publish_generated_columns: bool = True
    # `cdc status` warns when the slot holds back more WAL than this (bytes).
    retained_wal_warn_bytes: int = Field(default=1024**3, ge=1)
    # Debezium's message.key.columns: the Kafka key of tables without a usable key (or another
    # key than theirs), e.g. "public.logs:id;inventory\..*:tenant,id". Checked at start: the
    # columns exist and every UPDATE/DELETE's old row carries them (replica identity FULL, or
    # columns within the replica identity).
    message_key_columns: Annotated[tuple[KeyColumns, ...], NoDecode] = ()
    # Debezium's skipped.operations: operations (c, u, d, t) left out of the topics; "none"
    # skips nothing. "t" (the default, as Debezium >= 2.0) leaves out only the `t` event: a
    # TRUNCATE still deletes every row it removed (a delete and a tombstone per key).
    skipped_operations: Annotated[tuple[str, ...], NoDecode] = ("t",)

    @field_validator("tables", mode="before")
    @classmethod
    def _split_tables(cls, v: Any) -> Any:
        if isinstance(v, str):
            if v.lstrip().startswith("["):  # a JSON list is accepted too
                import json

                try:
                    return tuple(json.loads(v))
                except ValueError as e:
                    raise ValueError(
                        f"tables {v!r} is neither a JSON list nor comma-separated"
                    ) from e
            return split_list(v)
        return v

    @field_validator("signal_secret", mode="before")
    @classmethod
    def _empty_is_unset(cls, v: Any) -> Any:
        # An empty CDC_POSTGRES__SIGNAL_SECRET (compose passes ${PGCDC_SIGNAL_SECRET:-}) is none.
        return None if v == "" else v

    @field_validator("signal_secret")
    @classmethod
    def _long_enough(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and len(v.get_secret_value()) < 16:
            raise ValueError(
                "signal_secret must be at least 16 characters (a guessable key signs anything)"
            )
        return v

    @field_validator("signal_trusted_roles", "signal_filter_functions", mode="before")
    @classmethod
    def _split_names(cls, v: Any) -> Any:
        return split_list(v) if isinstance(v, str) else v

    @field_validator("tables", "signal_data_collection", "signal_filter_functions")
    @classmethod
    def _qualified(cls, v: Any, info: ValidationInfo) -> Any:
        what = "function" if info.field_name == "signal_filter_functions" else "table"
        for name in (v,) if isinstance(v, str) else v or ():
            split_qualified(name, what)
        return v

    @property
    def listed_tables(self) -> tuple[tuple[str, str], ...]:
        """``tables`` as (schema, table), read by :mod:`pgcdc.core.qualified_names`."""
        return tuple(split_qualified(t) for t in self.tables)

    @property
    def signal_table(self) -> tuple[str, str] | None:
        """``signal_data_collection`` as (schema, table), if set."""
        name = self.signal_data_collection
        return split_qualified(name) if name else None

    @field_validator("message_key_columns", mode="before")
    @classmethod
    def _parse_key_columns(cls, v: Any) -> Any:
        return parse_message_key_columns(v) if isinstance(v, str) else v

    @field_validator("skipped_operations", mode="before")
    @classmethod
    def _split_operations(cls, v: Any) -> Any:
        if isinstance(v, str):
            ops = tuple(o.strip() for o in v.split(",") if o.strip())
            return () if ops == ("none",) else ops
        return v

    @field_validator("skipped_operations")
    @classmethod
    def _known_operations(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [o for o in v if o not in OPERATIONS]
        if unknown:
            raise ValueError(f"unknown operations {unknown}; use c, u, d, t or none")
        return v

    @field_validator("slot_name", "publication_name")
    @classmethod
    def _identifier(cls, v: str) -> str:
        if not v or not all(c.isalnum() or c == "_" for c in v) or v != v.lower():
            raise ValueError(f"{v!r} must be lower-case letters, digits and underscores")
        return v


class KafkaSettings(BaseModel):
    model_config = _FROZEN

    bootstrap_servers: str = ports.KAFKA_BOOTSTRAP
    topic_prefix: str = "cdc"
    # The first reader under a prefix records its source (the cluster's system identifier and
    # the database) and a reader of another source is refused. True takes the prefix over:
    # the same database on a new server (pg_upgrade, a restore, a blue/green switch).
    claim_prefix: bool = False
    # Partitions of each table topic the reader creates: how many tasks apply a micro-batch
    # in parallel (one key lives in one partition, so per-key order holds). 3 fits a
    # three-broker cluster (a leader on each), keeps both local[2] cores and a two-worker
    # cluster busy, and costs little per batch (a task each). Raise it for more parallelism
    # before the topics exist: adding partitions later moves keys between partitions.
    partitions: int = Field(default=3, ge=1)
    replication_factor: int = Field(default=1, ge=1)
    # min.insync.replicas of the topics the reader creates (none: the brokers' default).
    # With replication_factor 3, 2 lets one broker be down while acks=all writes go on.
    min_insync_replicas: int | None = Field(default=None, ge=1)
    heartbeat_topic: str | None = None  # default: __cdc-heartbeat.<topic_prefix>
    # Heartbeats carry the reader's last acknowledged LSN: the followers' watermark.
    heartbeat_enabled: bool = True
    heartbeat_interval_s: float = Field(default=1.0, gt=0)
    dead_letter_topic: str = DEFAULT_DEAD_LETTER_TOPIC
    # Debezium's signal.kafka.topic: records keyed by topic_prefix whose value is a signal
    # signed with postgres.signal_secret (sig1:<hmac>:<{"id", "type", "data", "ts"}>, see
    # docs/incremental-snapshots.md; `cdc topic send --sign` signs one); read by the group
    # cdc-signals.<database>.<slot>; the reader creates it (one partition) at start.
    signal_topic: str | None = None
    # A record Kafka refuses for good: stop (fail) or write it to dead_letter_topic.
    unproducible_records: UnproducibleRecords = UnproducibleRecords.FAIL
    # Each change committed to Kafka once (docs/exactly-once.md): a transactional producer
    # (transactional.id from the server, database and slot) whose transactions hold whole
    # PostgreSQL transactions and the reader's position in the state topic; a restart skips
    # what Kafka already holds. Consumers must read with isolation.level=read_committed.
    exactly_once: bool = False
    # How long a Kafka transaction stays open at most before it is committed (at the end of
    # a PostgreSQL transaction): commit→visible latency for read_committed consumers.
    transaction_ms: int = Field(default=100, ge=1, le=60_000)
    # Extra librdkafka producer settings, merged over ours.
    producer: dict[str, str] = Field(default_factory=dict)
    # How every client (the reader's producer, admin and consumers, the state store,
    # `cdc status`, dead letters, the Spark Kafka source) reaches the brokers, with
    # librdkafka's meanings; pgcdc.core.kafka_config builds each client's properties.
    security_protocol: SecurityProtocol = SecurityProtocol.PLAINTEXT
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    # PEM files: the CA that signed the brokers' certificates (default: the system's CAs),
    # and a client certificate, key and key password for mutual TLS.
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: SecretStr | None = None
    # Any other librdkafka property, for every Python client (e.g. client.id,
    # sasl.oauthbearer.*); the dedicated settings above may not be repeated here.
    client: dict[str, str] = Field(default_factory=dict)
    # Java client properties for the Spark Kafka source only, merged last (e.g.
    # sasl.jaas.config for GSSAPI or OAUTHBEARER, ssl.truststore.* for a JKS truststore).
    # The jobs set fetch.max.wait.ms to 10 (the broker holds a fetch at the log's end that
    # long, and a batch's task waits it out): a larger value here trades latency for fewer
    # fetches.
    spark_client: dict[str, str] = Field(default_factory=dict)

    @field_validator("security_protocol", "sasl_mechanism", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v

    @field_validator(
        "sasl_mechanism",
        "sasl_username",
        "sasl_password",
        "ssl_ca_location",
        "ssl_certificate_location",
        "ssl_key_location",
        "ssl_key_password",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, v: Any) -> Any:
        # CDC_KAFKA__SSL_CA_LOCATION= (set but empty) means "not set", as for librdkafka.
        return None if v == "" else v

    @field_validator("client", "spark_client")
    @classmethod
    def _not_dedicated(cls, v: dict[str, str]) -> dict[str, str]:
        client_security.check_not_dedicated(v)
        return v

    @model_validator(mode="after")
    def _security_consistent(self) -> KafkaSettings:
        client_security.check_kafka(self)
        if self.min_insync_replicas is not None and (
            self.min_insync_replicas > self.replication_factor
        ):
            raise ValueError(
                f"min_insync_replicas {self.min_insync_replicas} is more than "
                f"replication_factor {self.replication_factor}: no write could be acknowledged"
            )
        return self


class SchemaSettings(BaseModel):
    model_config = _FROZEN

    value_format: ValueFormat = ValueFormat.JSON
    schemas_enable: bool = True
    decimal_handling_mode: DecimalHandling = DecimalHandling.PRECISE
    binary_handling_mode: BinaryHandling = BinaryHandling.BYTES
    interval_handling_mode: IntervalHandling = IntervalHandling.NUMERIC
    hstore_handling_mode: HStoreHandling = HStoreHandling.JSON
    time_precision_mode: TimePrecision = TimePrecision.ADAPTIVE
    # Columns of types without a mapping: carried as their text (true, the default: nothing
    # is dropped, design guarantee 6), or left out of the events as Debezium's default does.
    include_unknown_datatypes: bool = True
    provide_transaction_metadata: bool = False
    # The __debezium.newkey/__debezium.oldkey headers of a key change: "simple" for Kafka
    # Connect's default header converter (SimpleHeaderConverter must read them back; a sink
    # connector with default settings needs that): as Debezium in Kafka Connect writes them
    # where the converter reads that back, as a JSON string of it where not (keys of mixed
    # types); or "json" as Debezium Server writes them (the key's JsonConverter bytes).
    header_format: HeaderFormat = HeaderFormat.SIMPLE
    registry_url: str | None = None
    # The registry's basic auth as "user:password" (Confluent's basic.auth.user.info), and
    # its TLS: the CA to trust (default: the system's) and, for mutual TLS, a certificate and key.
    registry_basic_auth_user_info: SecretStr | None = None
    registry_ssl_ca_location: str | None = None
    registry_ssl_certificate_location: str | None = None
    registry_ssl_key_location: str | None = None
    # Schemaless Avro (no registry): the folder of each topic's writer schemas, written by the
    # reader (<topic>-key.avsc, <topic>-value.avsc) and read by the sync jobs.
    avro_schema_dir: str | None = None
    server_name: str | None = None  # source.name; defaults to the topic prefix


class RedisSettings(BaseModel):
    model_config = _FROZEN

    url: SecretStr = SecretStr(ports.REDIS_URL)
    key_prefix: str = "cdc"
    value_mode: str = Field(default="hash", pattern="^(hash|json)$")
    ttl_s: int | None = Field(default=None, ge=1)
    tombstone_ttl_s: int = Field(default=3600, ge=1)
    # A Redis Cluster: the URL names any one node, the client finds the others. Also set by
    # cluster=true in the URL's query (redis://host:7000/0?cluster=true).
    cluster: bool = False
    # TLS (a rediss:// URL; an ACL user and password go in the URL: rediss://user:pw@host):
    # the CA to trust (default: the system's) and, for mutual TLS, a certificate and key.
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    # One pipeline carries at most this many bytes of script arguments (a batch is sent in
    # as many pipelines as it needs): bounds the sink's and the server's buffers.
    pipeline_max_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)

    @model_validator(mode="after")
    def _tls_needs_rediss(self) -> RedisSettings:
        client_security.check_redis(self)
        return self


class SearchSettings(BaseModel):
    model_config = _FROZEN

    url: SecretStr = SecretStr(ports.OPENSEARCH_URL)
    index_prefix: str = "cdc"
    # HTTP basic auth (or in the URL: https://user:password@host:9200).
    username: str | None = None
    password: SecretStr | None = None
    # HTTPS: the CA to trust (default: the system's), whether to verify the server's
    # certificate at all, and a client certificate and key for mutual TLS.
    ssl_ca_location: str | None = None
    verify_certs: bool = True
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    # One bulk request carries at most this many bytes (OpenSearch refuses bodies over
    # http.max_content_length, 100 MB by default, with 413; its docs advise 5-15 MB); a 413
    # is split and sent again, and a single document over the server's limit is dead-lettered.
    bulk_max_bytes: int = Field(default=10 * 1024 * 1024, ge=1024)
    # Settings of the indices the sink creates (an existing index keeps its own). One shard
    # is enough for millions of rows per table on one node; replicas 0 because a single node
    # cannot place a replica (the index would stay yellow), raise it on a cluster; refresh
    # every second is OpenSearch's default and what keeps commit-to-searchable near 1 s.
    number_of_shards: int = Field(default=1, ge=1)
    number_of_replicas: int = Field(default=0, ge=0)
    refresh_interval: str = "1s"
    # After each micro-batch that wrote to it, the job refreshes the follower's indices before
    # it records the batch's watermark: what the watermark covers is searchable, and a change
    # waits for no refresh_interval tick. One refresh a batch (bounded by the trigger).
    refresh_after_batch: bool = True
    # A table whose columns change so that its index cannot take them (a type change) gets
    # the next version of its index, built beside the one searches read (which stays complete)
    # and switched to by an alias once it holds every document (docs/schema-changes.md); the
    # follower's user needs the indices:admin/aliases privilege. False: those changes are
    # refused and dead-lettered, and cdc status says so until the index is built by hand.
    evolve_indices: bool = True
    # Each document's row digest kept beside it in the indices the follower makes, left out of
    # _source, so that cdc verify folds ranges inside OpenSearch (docs/verify.md). It costs
    # OpenSearch about a quarter of its CPU a document (benchmarks.search_mapping_cost). False:
    # new indices keep none, and cdc verify reads their documents back (slower). An index
    # keeps what it was made with.
    row_digests: bool = True
    # Joined documents, [[search.documents]] in the file (CDC_SEARCH__DOCUMENTS: a JSON
    # list): each a root table with lookups and nested lists, written to the index
    # <index_prefix>-<name> (docs/documents.md) by spark_jobs/documents_sync.py.
    documents: tuple[DocumentSettings, ...] = ()

    @field_validator("documents", mode="before")
    @classmethod
    def _documents_json(cls, v: Any) -> Any:
        return documents_from_text(v)

    @field_validator("documents")
    @classmethod
    def _documents_apart(
        cls, v: tuple[DocumentSettings, ...], info: ValidationInfo
    ) -> tuple[DocumentSettings, ...]:
        return check_documents(v, str(info.data.get("index_prefix", "")))

    @model_validator(mode="after")
    def _auth_complete(self) -> SearchSettings:
        client_security.check_search(self)
        return self


class VerifySettings(BaseModel):
    model_config = _FROZEN

    # Rows `cdc verify` reads per second at most, from PostgreSQL and the followers together
    # (a token bucket on rows read), so that a background pass (`cdc verify --every`) cannot
    # swamp production; 0: unbounded.
    max_rows_per_second: int = Field(default=20_000, ge=0)
    # Port of `cdc verify --every`'s Prometheus metrics (cdc_verify_*), on 127.0.0.1; also
    # its --metrics-port flag (none: off).
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    # Fold each table inside the stores (a Lua script in Redis, a sum aggregation of the
    # digests the search follower keeps beside each document): only buckets that differ are
    # read back. Off: every row of both followers is read back and compared here (slower;
    # for a Redis whose ACL refuses scripts).
    fold_in_stores: bool = True


class Settings(BaseSettings):
    """Every setting of the reader and the followers."""

    # The values come from load_settings, which reads the file, the CDC_* environment and the
    # flags itself (pgcdc.core.settings_sources); the model reads no source of its own.
    model_config = SettingsConfigDict(frozen=True, extra="forbid")

    postgres: PostgresSettings = PostgresSettings()
    kafka: KafkaSettings = KafkaSettings()
    # The alias keeps the file's [schema] section (and CDC_SCHEMA__*); "schema" would shadow
    # a BaseModel attribute.
    schema_: SchemaSettings = Field(default=SchemaSettings(), alias="schema")
    redis: RedisSettings = RedisSettings()
    search: SearchSettings = SearchSettings()
    # A factory, so the checkpoint folder resolves against the directory at load time.
    spark: SparkSettings = Field(default_factory=SparkSettings)
    verify: VerifySettings = VerifySettings()
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    # The reader's /healthz and /readyz (the jobs take --health-port): off when unset.
    health_port: int | None = Field(default=None, ge=1, le=65535)
    health_host: str = "127.0.0.1"
    health_ready_s: float = Field(default=30.0, gt=0)
    log_level: str = "INFO"
    # One JSON object per log line (with the structured fields), for log shippers.
    log_json: bool = False

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    flag_names: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Build and validate the settings; raise :class:`ConfigError` naming every problem.

    ``overrides`` are the flags' values (nested like the file); ``flag_names`` says which
    flag set each dotted setting (``{"postgres.slot_name": "--slot"}``), for the messages.
    Every problem is reported at once, each with where its value came from (the variable,
    the file and line, the flag); a ``CDC_*`` variable that is not a setting is one too.
    """
    from pgcdc.core import settings_sources as sources

    env = os.environ if environ is None else environ
    layers = sources.Layers(flags=dict(overrides or {}), flag_names=dict(flag_names or {}))
    path = config_file or env.get("CDC_CONFIG")
    if path:
        p = Path(path)
        try:
            layers.file_text = p.read_text()
        except FileNotFoundError as e:
            raise ConfigError(f"config file {p} does not exist") from e
        except OSError as e:
            raise ConfigError(f"config file {p} cannot be read: {e.strerror}") from e
        try:
            layers.file = tomllib.loads(layers.file_text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {p} is not valid TOML: {e}") from e
        layers.file_path = str(p)
    # Environment variables beat the file, and flags beat both.
    sources.read_environment(env, Settings, layers)
    merged = _deep_merge(_deep_merge(layers.file, layers.env), layers.flags)
    problems = list(layers.problems)
    settings: Settings | None = None
    try:
        # Validation only: the environment was read above (model_validate reads no source).
        settings = Settings.model_validate(merged)
    except ValidationError as e:
        problems += [sources.describe(err, Settings, layers) for err in e.errors()]
    if problems or settings is None:
        raise ConfigError(sources.report(problems))
    return settings
