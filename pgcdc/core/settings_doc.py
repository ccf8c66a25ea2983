"""Generate ``docs/settings.md``, the settings reference, from the settings model.

``python -m pgcdc.core.settings_doc`` rewrites the file; ``--check`` exits 1 when it is
stale (a unit test does the same). Each setting's meaning is its ``Field(description=...)``,
else a line of :data:`MEANINGS` here, else the comment written above or beside it in
:mod:`pgcdc.core.settings` (the spark section's in :mod:`pgcdc.core.spark_settings`); the
Debezium property it corresponds to comes from :data:`DEBEZIUM`.
"""

from __future__ import annotations

import argparse
import enum
import inspect
import io
import sys
import textwrap
import tokenize
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from pgcdc.core import settings as model

DOC = Path(__file__).resolve().parents[2] / "docs" / "settings.md"

# Meanings of settings that carry no comment of their own in pgcdc/core/settings.py or
# spark_settings.py (or share one with their neighbours).
MEANINGS = {
    "postgres.dsn": "libpq connection string or URI of the captured database; "
    "TLS with `sslmode=verify-full&sslrootcert=<ca file>`",
    "postgres.slot_name": "logical replication slot the reader creates and reads",
    "postgres.publication_name": "publication the slot streams",
    "postgres.snapshot_mode": "when to copy the tables' current rows: `initial` (once, "
    "then stream), `no_data` (never), `initial_only` (copy, then stop), `when_needed` "
    "(again whenever the slot is missing or lost)",
    "postgres.snapshot_workers": "parallel connections that read the snapshot",
    "postgres.snapshot_chunk_rows": "rows per snapshot read",
    "postgres.drop_slot_on_exit": "drop the replication slot when the reader stops "
    "(testing only: changes made while it is stopped are lost)",
    "postgres.status_interval_s": "seconds between standby status updates to the server",
    "postgres.proto_version": "pgoutput protocol version",
    "kafka.bootstrap_servers": "Kafka brokers, `host:port[,host:port...]`",
    "kafka.topic_prefix": "first part of every table topic, `<prefix>.<schema>.<table>`",
    "kafka.partitions": "partitions of each topic the reader creates",
    "kafka.replication_factor": "replication factor of each topic the reader creates",
    "kafka.min_insync_replicas": "`min.insync.replicas` of each topic the reader creates "
    "(none: the brokers' default)",
    "kafka.heartbeat_topic": "heartbeat topic (default `__cdc-heartbeat.<topic_prefix>`)",
    "kafka.heartbeat_interval_s": "seconds between heartbeats",
    "kafka.security_protocol": "how every client reaches the brokers (the reader's "
    "producer, admin and consumers, the state store, `cdc status`, dead letters, the Spark "
    "Kafka source), with librdkafka's meaning",
    "kafka.sasl_mechanism": "SASL mechanism; PLAIN and SCRAM use `sasl_username` and "
    "`sasl_password`, GSSAPI and OAUTHBEARER take their properties from `client` and "
    "`spark_client`",
    "kafka.sasl_username": "SASL user",
    "kafka.sasl_password": "SASL password",
    "kafka.ssl_ca_location": "PEM file of the CA that signed the brokers' certificates "
    "(default: the system's CAs)",
    "kafka.ssl_certificate_location": "mutual TLS: PEM file of the client certificate",
    "kafka.ssl_key_location": "mutual TLS: PEM file of the client's private key (PKCS#8 "
    "for the Spark source)",
    "kafka.ssl_key_password": "mutual TLS: password of the client's private key",
    "redis.ssl_ca_location": "`rediss://`: PEM file of the CA to trust (default: the system's)",
    "redis.ssl_certificate_location": "mutual TLS: PEM file of the client certificate",
    "redis.ssl_key_location": "mutual TLS: PEM file of the client's private key",
    "search.username": "HTTP basic auth user (or in the URL, `https://user:password@host`)",
    "search.password": "HTTP basic auth password",
    "search.ssl_ca_location": "`https://`: PEM file of the CA to trust (default: the system's)",
    "search.verify_certs": "check the server's certificate (false only for testing)",
    "search.ssl_certificate_location": "mutual TLS: PEM file of the client certificate",
    "search.ssl_key_location": "mutual TLS: PEM file of the client's private key",
    "kafka.dead_letter_topic": "topic for records that cannot be produced or applied, "
    "each with its reason",
    "schema.value_format": "`json` (Kafka Connect JsonConverter) or `avro`",
    "schema.schemas_enable": "JSON: embed the Connect schema beside each payload",
    "schema.decimal_handling_mode": "`precise` (bytes and scale), `string` or `double`",
    "schema.binary_handling_mode": "`bytes`, `base64` or `hex`",
    "schema.interval_handling_mode": "`numeric` (microseconds) or `string` (ISO 8601)",
    "schema.hstore_handling_mode": "`json` (a JSON string) or `map` (a Connect map of strings)",
    "schema.time_precision_mode": "`adaptive` (each column's own precision), "
    "`adaptive_time_microseconds` (every `time` as microseconds) or `connect` (Kafka "
    "Connect's Date, Time and Timestamp, milliseconds)",
    "schema.include_unknown_datatypes": "carry columns of types without a mapping as their "
    "text (false: leave them out, Debezium's default)",
    "schema.provide_transaction_metadata": "add the `transaction` block to each event",
    "schema.registry_url": "schema registry for Avro (Confluent API)",
    "schema.registry_basic_auth_user_info": "the registry's basic auth, `user:password`",
    "schema.registry_ssl_ca_location": "CA file to trust for an HTTPS registry",
    "schema.registry_ssl_certificate_location": "client certificate for the registry (mutual TLS)",
    "schema.registry_ssl_key_location": "client key for the registry (mutual TLS)",
    "schema.avro_schema_dir": "Avro without a registry: records in Avro's single-object "
    "encoding (the writer schema's fingerprint before the body), each schema written to this "
    "folder as `<topic>-value.<fingerprint>.avsc` (and `-key`), where the sync jobs read it; "
    "a path both see (README, Avro)",
    "redis.url": "Redis follower, `redis://` or `rediss://` (TLS), ACL user and password "
    "in the URL",
    "redis.key_prefix": "first part of every key, `<prefix>:<schema>.<table>:<key>`",
    "redis.cluster": "a Redis Cluster (the URL names any node); also `?cluster=true` in the URL",
    "redis.value_mode": "`hash` (one field per column) or `json` (one JSON string)",
    "redis.ttl_s": "expire rows after this many seconds (none: keep)",
    "redis.tombstone_ttl_s": "seconds a deleted row's version is kept, so a late older "
    "change cannot bring it back",
    "search.url": "OpenSearch follower, `http://` or `https://`",
    "search.index_prefix": "first part of every index name",
    "search.bulk_max_bytes": "bytes per bulk request at most (a 413 is split and sent again)",
    "search.number_of_shards": "shards of each index the follower creates",
    "search.number_of_replicas": "replicas of each index the follower creates (0: one node)",
    "search.refresh_interval": "how often new writes become searchable (`-1`: never)",
    "search.refresh_after_batch": "refresh the indices a micro-batch wrote before its "
    "watermark is recorded: what the watermark covers is searchable (false: searchable at "
    "the next `search.refresh_interval` tick)",
    "search.documents": "joined documents: `[[search.documents]]` tables in the file (a JSON "
    "list in the environment), each a root table with lookups (many-to-one) and nested lists "
    "(one-to-many), written to the index `<index_prefix>-<name>`; the keys are in "
    "[documents.md](documents.md). Checked at startup; kept by "
    "`spark_jobs/documents_sync.py`",
    "redis.pipeline_max_bytes": "bytes of script arguments per Redis pipeline at most",
    "spark.master": "Spark master of the sync jobs",
    "spark.trigger_interval": "micro-batch interval of the sync jobs",
    "spark.max_offsets_per_trigger": "records per micro-batch at most (none: no limit)",
    "spark.min_partitions": "tasks per micro-batch when above the partition count "
    "(spread by key hash); none: a task per Kafka partition",
    "spark.follower_retry_s": "seconds a job keeps retrying a batch while its follower is "
    "unreachable, then stops",
    "spark.follower_behind_after_s": "seconds one follower of `spark_jobs/sync.py` may stay "
    "unreachable while another applies the batch; then it falls behind and catches up later",
    "spark.checkpoint_files": "how a job writes its checkpoint's files: `filecontext` "
    "(Spark's default: Hadoop FileContext, an atomic rename that never overwrites), "
    "`filesystem` (Hadoop FileSystem; on a local path the raw local file system, without "
    "checksum files and the `readlink`/`chmod` forks each micro-batch, a lock file keeping a "
    "second job off the checkpoint) or `auto` (`filesystem` on a local path, `filecontext` "
    "on `hdfs://`, `s3a://` and the like)",
    "spark.concurrent_followers": "the shared job's tasks write each chunk of changes to their "
    "followers at the same time, a thread per follower (each follower's chunks in order), and "
    "build the next chunk meanwhile; false: one follower after the other",
    "spark.apply": "with `spark.read = direct`: `native` takes a range of one table's common "
    "records (one schema, version headers, no unchanged columns, plain values) from bytes to "
    "changes in pgcdc's native module; other ranges, or no module: `python`",
    "spark.job_endpoints": "job name → URL of its `--health-port`; `cdc status` shows its metrics",
    "spark.starting_offsets": "where a job without a checkpoint starts: `earliest` or `latest`",
    "metrics_port": "port of the Prometheus metrics endpoint (none: off)",
    "health_port": "port of the reader's `/healthz` (alive) and `/readyz` (streaming, "
    "acknowledged lately) endpoints (none: off); the sync jobs take `--health-port`",
    "health_host": "address the health endpoints listen on (`0.0.0.0` for a probe from "
    "outside the host)",
    "health_ready_s": "`/readyz` answers 503 when the reader (or a job) reported no "
    "progress for this many seconds",
    "log_level": "DEBUG, INFO, WARNING or ERROR",
}

# The Debezium PostgreSQL connector (or Kafka Connect) property each setting stands for.
DEBEZIUM = {
    "postgres.dsn": "`database.hostname`, `database.port`, `database.user`, "
    "`database.password`, `database.dbname`, `database.sslmode`, `database.sslrootcert`",
    "postgres.slot_name": "`slot.name`",
    "postgres.publication_name": "`publication.name`",
    "postgres.tables": "`table.include.list`",
    "postgres.snapshot_mode": "`snapshot.mode`",
    "postgres.snapshot_workers": "`snapshot.max.threads`",
    "postgres.snapshot_chunk_rows": "`snapshot.fetch.size`",
    "postgres.drop_slot_on_exit": "`slot.drop.on.stop`",
    "postgres.complete_unchanged_toast": "`unavailable.value.placeholder` (false: "
    "Debezium's behaviour)",
    "postgres.status_interval_s": "`status.update.interval.ms`",
    "postgres.slot_failover": "`slot.failover`",
    "postgres.message_key_columns": "`message.key.columns`",
    "postgres.skipped_operations": "`skipped.operations`",
    "postgres.publication_autocreate_mode": "`publication.autocreate.mode`",
    "kafka.bootstrap_servers": "`bootstrap.servers` (Connect worker)",
    "kafka.topic_prefix": "`topic.prefix`",
    "kafka.partitions": "`topic.creation.default.partitions`",
    "kafka.replication_factor": "`topic.creation.default.replication.factor`",
    "kafka.min_insync_replicas": "`topic.creation.default.min.insync.replicas`",
    "kafka.heartbeat_topic": "`topic.heartbeat.prefix`",
    "kafka.heartbeat_enabled": "`heartbeat.interval.ms` (0 turns heartbeats off)",
    "kafka.heartbeat_interval_s": "`heartbeat.interval.ms`",
    "kafka.dead_letter_topic": "`errors.deadletterqueue.topic.name` (Connect)",
    "kafka.unproducible_records": "`errors.tolerance` (Connect)",
    "kafka.exactly_once": "`exactly.once.source.support` (Connect worker, distributed mode; "
    "Debezium Server: none)",
    "kafka.transaction_ms": "`offset.flush.interval.ms` with `transaction.boundary=interval`",
    "kafka.producer": "`producer.override.*`",
    "kafka.security_protocol": "`security.protocol` (Connect worker, also `producer.*`)",
    "kafka.sasl_mechanism": "`sasl.mechanism`",
    "kafka.sasl_username": "`sasl.jaas.config`",
    "kafka.sasl_password": "`sasl.jaas.config`",
    "kafka.ssl_ca_location": "`ssl.truststore.location`",
    "kafka.ssl_certificate_location": "`ssl.keystore.location`",
    "kafka.ssl_key_location": "`ssl.keystore.location`",
    "kafka.ssl_key_password": "`ssl.key.password`",
    "kafka.client": "`producer.*`, `consumer.*`, `admin.*` (Connect worker)",
    "schema.value_format": "`value.converter`",
    "schema.header_format": "Kafka Connect's `header.converter` (Debezium Server: "
    "`debezium.format.header`)",
    "schema.schemas_enable": "`value.converter.schemas.enable`",
    "schema.decimal_handling_mode": "`decimal.handling.mode`",
    "schema.binary_handling_mode": "`binary.handling.mode`",
    "schema.interval_handling_mode": "`interval.handling.mode`",
    "schema.hstore_handling_mode": "`hstore.handling.mode`",
    "schema.time_precision_mode": "`time.precision.mode`",
    "schema.include_unknown_datatypes": "`include.unknown.datatypes` (default false there)",
    "schema.provide_transaction_metadata": "`provide.transaction.metadata`",
    "schema.registry_url": "`value.converter.schema.registry.url`",
    "schema.registry_basic_auth_user_info": "`value.converter.basic.auth.user.info`",
    "schema.registry_ssl_ca_location": "`value.converter.schema.registry.ssl.truststore.location`",
    "schema.registry_ssl_certificate_location": "`value.converter.schema.registry.ssl.keystore.location`",
    "schema.registry_ssl_key_location": "`value.converter.schema.registry.ssl.keystore.location`",
    "schema.avro_schema_dir": "– (Confluent's AvroConverter needs a registry)",
    "schema.server_name": "`topic.prefix` (as `source.name`)",
}

SECTION_TITLES = {
    "postgres": "PostgreSQL (the captured database)",
    "kafka": "Kafka",
    "schema": "Event format",
    "redis": "Redis follower",
    "search": "OpenSearch follower",
    "spark": "Spark jobs",
    "verify": "Verification (`cdc verify`)",
    "": "Process",
}


def _comments(cls: type[BaseModel]) -> dict[str, str]:
    """Comments above (consecutive lines) and beside each field of a class body."""
    source = textwrap.dedent(inspect.getsource(cls))
    above: dict[int, str] = {}
    beside: dict[int, str] = {}
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            (beside if tok.start[0] in code_lines else above)[tok.start[0]] = text
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.add(tok.start[0])
    out: dict[str, str] = {}
    lines = source.splitlines()
    for no, line in enumerate(lines, start=1):
        name = line[4:].split(":", 1)[0] if line.startswith("    ") and line[4:5].isalpha() else ""
        if name not in cls.model_fields:
            continue
        block: list[str] = []
        prev = no - 1
        while prev in above:
            block.insert(0, above[prev])
            prev -= 1
        if no in beside:
            block.append(beside[no])
        if block:
            out[name] = " ".join(block)
    return out


def _type(annotation: Any) -> str:
    """A short, human type: enums list their values, Optional says "or none"."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        inner = " or ".join(_type(a) for a in args)
        return f"{inner} or none" if len(args) < len(typing.get_args(annotation)) else inner
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(f"`{m.value}`" for m in annotation)
    if annotation is SecretStr:
        return "secret"
    if origin in (tuple, list):
        return "list"
    if origin is dict:
        return "table"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: FieldInfo) -> str:
    factory = field.default_factory
    value = factory() if factory is not None else field.default  # type: ignore[call-arg]
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None or value == () or value == {}:
        return "–"
    if isinstance(value, tuple):
        value = ",".join(str(v) for v in value)
    if isinstance(value, bool):
        value = str(value).lower()
    return f"`{value}`"


def _markdown(text: str) -> str:
    """Text for a table cell: pipes escaped, and angle brackets outside code spans, which
    Markdown would take for HTML."""
    parts = text.replace("|", "\\|").split("`")
    for i in range(0, len(parts), 2):  # even parts are outside backticks
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def _rows(section: str, cls: type[BaseModel]) -> Iterator[tuple[str, ...]]:
    comments = _comments(cls)
    for name, field in cls.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            continue  # a section: listed under its own heading
        key = name if not section else f"{section}.{name}"
        env = "CDC_" + (f"{section.upper()}__{name.upper()}" if section else name.upper())
        meaning = field.description or MEANINGS.get(key) or comments.get(name, "")
        yield (
            f"`{key}`",
            f"`{env}`",
            _type(field.annotation),
            _default(field),
            _markdown(meaning),
            DEBEZIUM.get(key, "–"),
        )


def sections() -> Iterator[tuple[str, type[BaseModel]]]:
    """Each settings section (name as in the environment and the file) and its model."""
    for name, field in model.Settings.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield field.alias or name, ann
    yield "", model.Settings


def render() -> str:
    """The whole of docs/settings.md."""
    out = [
        "# Settings reference",
        "",
        "<!-- Generated by `python -m pgcdc.core.settings_doc` from pgcdc/core/settings.py;"
        " do not edit by hand. -->",
        "",
        "Every setting has three spellings: a key in the TOML config file (`--config` or "
        "`CDC_CONFIG`; the part before the dot is the `[section]`), an environment variable "
        "(`CDC_<SECTION>__<NAME>`; tables and lists as JSON), and for some a command-line flag. "
        "Flags beat the environment, which beats the file, which beats the defaults; the "
        "defaults point at the local stack (`scripts/stack`). Secrets are never printed. A "
        "`CDC_*` variable that names no setting (`CDC_POSTGRES_DSN`, one underscore) stops "
        "every command with its name and the closest valid one, and every invalid value is "
        "reported at once with where it came from (the variable, the file and line, the "
        "flag).",
        "",
        "The last column names the Debezium PostgreSQL connector (or Kafka Connect) property a "
        "setting corresponds to, for those coming from Debezium.",
        "",
    ]
    for section, cls in sections():
        out += [f"## {SECTION_TITLES.get(section, section)}", ""]
        out += [
            "| setting | environment | type | default | meaning | Debezium |",
            "|---|---|---|---|---|---|",
        ]
        out += ["| " + " | ".join(row) + " |" for row in _rows(section, cls)]
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Write docs/settings.md, or with ``--check`` say whether it is up to date."""
    parser = argparse.ArgumentParser(prog="python -m pgcdc.core.settings_doc")
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not DOC.exists() or DOC.read_text() != text:
            print(f"{DOC} is stale: run python -m pgcdc.core.settings_doc", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
