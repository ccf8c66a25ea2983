"""The Redis follower's writer.

Layout (``table`` is the table id the jobs take from the topic, the contract's
:func:`~pgcdc.core.contract.table_id`: ``<schema>.<table>`` with each part encoded as in topic
names, so plain lower-case names read as they are, any other character is ``-HH``, and the
id holds exactly one ``.`` and never ``:``; two tables never share a key):

- ``<prefix>:<table>:<key>`` holds the row. ``value_mode="hash"``: a hash with one field per
  column whose value is the column's value as JSON, so types round-trip and SQL NULL is the
  field ``null`` (a column is absent only if the follower never got a value for it).
  ``value_mode="json"``: a string holding the row as one JSON object.
- ``<prefix>:__v__:{<tag>}:<table>:<key>`` holds the row's version as exact, fixed-width
  text (:mod:`sinks.cache_script`); ``<tag>`` makes it hash to the row key's Redis Cluster
  slot, so the script touches one slot (:mod:`sinks.cache_keys`). Kept beside the row rather
  than inside it so that no column name can clash with it, and so that it can outlive a
  deleted row as its tombstone for ``tombstone_ttl_s``: a late, older insert is then still
  refused. With ``ttl_s`` the version key expires with its row.
- ``<prefix>:__watermark__:<job>`` holds a job's watermark LSN (20 digits), only increasing.

Row keys' second segment is a table id, which contains a dot; the other keys' does not,
so the namespaces cannot collide. A table that is no table id (no ``.``, two of them, or a
``:``) is refused.

Every write goes through one Lua script (:data:`sinks.cache_script.SCRIPT`; loaded once,
then EVALSHA, one pipeline per ``apply``) that compares the incoming version with the stored one and writes only if it is
newer. Running a batch again is therefore harmless.

Unchanged TOAST columns: in hash mode the script writes only the provided fields, keeping
the held ones. In JSON mode the merge happens here, not in Lua: Lua's cjson turns numbers
into doubles and prints them with 14 digits, which would corrupt int64 and numeric values.
The sink reads the held row and version, merges, and the script writes only if the version
is still the one read (else the merge is redone).

Redis Cluster: with ``cluster`` (the ``redis.cluster`` setting, or ``cluster=true`` in the
URL's query) the sink talks through ``redis.cluster.RedisCluster``, which routes each script
call to the node owning its slot and loads the script on every primary.

Redis must not evict version keys on its own (``maxmemory-policy`` ``noeviction`` or a
``volatile-*`` policy with ``ttl_s``), or stale writes could get through.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import orjson
import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from pgcdc.core.contract import VersionOrder, redis_watermark_key
from pgcdc.core.errors import ConfigError, RetryableSinkError, SinkError
from pgcdc.core.follower_clients import redis_cluster_url, redis_options
from pgcdc.core.settings import RedisSettings
from sinks import cache_keys
from sinks.base import (
    ApplyResult,
    BatchOutcomes,
    Change,
    Outcome,
    chunks_by_bytes,
    split_unchanged,
)
from sinks.cache_script import SCRIPT, Reply, parse_version, version_string, watermark_string

__all__ = ["CacheSink"]

log = logging.getLogger(__name__)

_MERGE_ATTEMPTS: Final = 5

# A script call waiting to be sent: the input slot it answers for, its change, KEYS, ARGV.
_Call = tuple[int, Change, list[str], list[str]]


class CacheSink:
    """Applies changes to Redis with compare-and-set on each row's version."""

    def __init__(
        self,
        url: str,
        key_prefix: str,
        value_mode: str = "hash",
        ttl_s: int | None = None,
        tombstone_ttl_s: int = 3600,
        *,
        retries: int = 5,
        backoff_s: float = 0.05,
        max_backoff_s: float = 2.0,
        client: redis.Redis | RedisCluster | None = None,
        client_options: Mapping[str, Any] | None = None,
        cluster: bool = False,
        pipeline_max_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        """``client_options`` are more keyword arguments of ``redis.Redis.from_url`` (TLS
        files: :func:`pgcdc.core.follower_clients.redis_options`). ``cluster`` (or
        ``cluster=true`` in the URL's query): talk to a Redis Cluster.
        ``pipeline_max_bytes`` caps the script arguments one pipeline carries."""
        self.pipeline_max_bytes = pipeline_max_bytes
        if value_mode not in ("hash", "json"):
            raise ConfigError(f"value_mode must be 'hash' or 'json', not {value_mode!r}")
        if not key_prefix:
            raise ConfigError("the Redis key prefix must not be empty")
        cache_keys.check_prefix(key_prefix)
        if ttl_s is not None and ttl_s < 1:
            raise ConfigError("ttl_s must be at least 1 second")
        if tombstone_ttl_s < 1:
            raise ConfigError("tombstone_ttl_s must be at least 1 second")
        self.key_prefix = key_prefix
        self.value_mode = value_mode
        self.ttl_s = ttl_s
        self.tombstone_ttl_s = tombstone_ttl_s
        url, in_url = redis_cluster_url(url)
        self.cluster = cluster or in_url
        # The script is idempotent, so commands may be sent again after a lost connection.
        retry = Retry(ExponentialBackoff(cap=max_backoff_s, base=backoff_s), retries)
        self.client: redis.Redis | RedisCluster
        if client is not None:
            self.client = client
        elif self.cluster:
            try:  # the cluster client asks a node for the slot map right away
                self.client = RedisCluster.from_url(url, retry=retry, **(client_options or {}))
            except RedisClusterException as e:
                raise RetryableSinkError(f"Redis Cluster unreachable: {e}") from e
        else:
            self.client = redis.Redis.from_url(
                url,
                retry=retry,
                retry_on_error=[RedisConnectionError, RedisTimeoutError],
                **(client_options or {}),
            )
        self._sha: str | None = None

    @classmethod
    def from_settings(cls, settings: RedisSettings, **kwargs: Any) -> CacheSink:
        """A sink for the ``redis`` section of the settings."""
        return cls(
            settings.url.get_secret_value(),
            settings.key_prefix,
            settings.value_mode,
            settings.ttl_s,
            settings.tombstone_ttl_s,
            **{
                "client_options": redis_options(settings),
                "cluster": settings.cluster,
                "pipeline_max_bytes": settings.pipeline_max_bytes,
                **kwargs,
            },
        )

    # -- keys ----------------------------------------------------------------------------

    def row_key(self, table: str, key: str) -> str:
        """``<prefix>:<table>:<key>``."""
        _check_table(table)
        return f"{self.key_prefix}:{table}:{key}"

    def version_key(self, table: str, key: str) -> str:
        """``<prefix>:__v__:{<tag>}:<table>:<key>``, in the row key's cluster slot."""
        return cache_keys.version_key(self.key_prefix, self.row_key(table, key), table, key)

    def watermark_key(self, job: str) -> str:
        """The key of ``job``'s watermark (the contract's :func:`redis_watermark_key`)."""
        return redis_watermark_key(self.key_prefix, job)

    def register_schema(self, table: str, value_schema: Mapping[str, Any]) -> None:
        """Nothing to learn: Redis rows keep each value's JSON type, with no schema."""

    # -- apply ---------------------------------------------------------------------------

    def apply(self, changes: Sequence[Change]) -> list[ApplyResult]:
        """Apply a batch in one pipeline; one result per change, in the order given.

        Stale changes are ``skipped``; changes that cannot be stored (values that are not
        JSON, a table name with ``:``, a command Redis refuses) are ``failed`` with
        ``retryable=False``. Raises :class:`RetryableSinkError` if Redis stays unreachable
        through every retry, :class:`SinkError` if it refuses the connection for another
        reason (e.g. authentication). Applying a batch again is safe.
        """
        outcomes = BatchOutcomes(changes)
        calls: list[_Call] = []
        merges: list[tuple[int, Change]] = []
        for slot, change in outcomes.one_per_key():
            try:
                keys = self._keys(change)
                version = version_string(change.version_order)
                if change.doc is None:
                    args = self._args("d", version)
                elif self.value_mode == "hash":
                    args = self._hash_args(change, version)
                else:
                    values, held = split_unchanged(change)
                    if held:
                        merges.append((slot, change))
                        continue
                    args = self._args("j", version, "*", orjson.dumps(values).decode())
            except (SinkError, ValueError, TypeError) as e:
                outcomes.set(slot, Outcome.FAILED, str(e))
                continue
            calls.append((slot, change, keys, args))

        self._run(calls, outcomes)
        for _ in range(_MERGE_ATTEMPTS):
            if not merges:
                break
            merges = self._merge_json(merges, outcomes)
        for slot, _change in merges:
            outcomes.set(
                slot, Outcome.FAILED, "the held row kept changing during the merge", retryable=True
            )
        return outcomes.results()

    def _keys(self, change: Change) -> list[str]:
        """The script's KEYS for a row write: the row key and its version key."""
        return [self.row_key(change.table, change.key), self.version_key(change.table, change.key)]

    def _args(self, op: str, version: str, expected: str = "*", *payload: str) -> list[str]:
        """The script's ARGV (see :data:`sinks.cache_script.SCRIPT`)."""
        return [op, version, str(self.ttl_s or 0), str(self.tombstone_ttl_s), expected, *payload]

    def _hash_args(self, change: Change, version: str) -> list[str]:
        values, held = split_unchanged(change)
        fields = {column: orjson.dumps(value).decode() for column, value in values.items()}
        return self._args("hp" if held else "h", version, "*", orjson.dumps(fields).decode())

    def _merge_json(
        self, merges: list[tuple[int, Change]], outcomes: BatchOutcomes
    ) -> list[tuple[int, Change]]:
        """Merge JSON rows with their held values; return the merges that raced."""
        pipe = self.client.pipeline(transaction=False)
        for _, change in merges:
            for key in self._keys(change):
                pipe.get(key)
        held_state = self._execute(pipe, raise_on_error=False)
        calls: list[_Call] = []
        for n, (slot, change) in enumerate(merges):
            row_raw, held_version = held_state[2 * n], held_state[2 * n + 1]
            refused = next((r for r in (row_raw, held_version) if isinstance(r, Exception)), None)
            if refused is not None:
                outcomes.set(slot, Outcome.FAILED, f"Redis refused the read: {refused}")
                continue
            values, held = split_unchanged(change)
            try:
                held_row = orjson.loads(row_raw) if row_raw is not None else {}
                merged = dict(values)
                for column in held:
                    if column in held_row:
                        merged[column] = held_row[column]
                expected = held_version.decode() if held_version is not None else ""
                version = version_string(change.version_order)
                args = self._args("jp", version, expected, orjson.dumps(merged).decode())
                keys = self._keys(change)
            except (SinkError, ValueError, TypeError) as e:
                outcomes.set(slot, Outcome.FAILED, str(e))
                continue
            calls.append((slot, change, keys, args))
        return self._run(calls, outcomes)

    def _run(self, calls: list[_Call], outcomes: BatchOutcomes) -> list[tuple[int, Change]]:
        """Send the script calls in pipelines of at most ``pipeline_max_bytes``; return JSON
        merges that raced."""
        raced: list[tuple[int, Change]] = []
        for run in chunks_by_bytes(calls, _call_bytes, self.pipeline_max_bytes):
            raced.extend(self._run_pipeline(run, outcomes))
        return raced

    def _run_pipeline(
        self, calls: list[_Call], outcomes: BatchOutcomes
    ) -> list[tuple[int, Change]]:
        """Send the script calls in one pipeline; return JSON merges that raced."""
        raced: list[tuple[int, Change]] = []
        pending = calls
        while pending:
            sha = self._script_sha()
            pipe = self.client.pipeline(transaction=False)
            for _, _, keys, args in pending:
                # execute_command: the cluster pipeline blocks its evalsha() wrapper, but
                # routes EVALSHA by its keys (one slot per call, see sinks.cache_keys).
                pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args)
            replies = self._execute(pipe, raise_on_error=False)
            lost: list[_Call] = []
            for call, reply in zip(pending, replies, strict=True):
                slot, change, _, _ = call
                if isinstance(reply, NoScriptError):
                    lost.append(call)
                elif isinstance(reply, Exception):
                    outcomes.set(slot, Outcome.FAILED, f"Redis refused the write: {reply}")
                    log.warning("write refused: %s", reply, extra={"table": change.table})
                elif reply == Reply.SKIPPED:
                    outcomes.set(slot, Outcome.SKIPPED, "a newer version is held")
                elif reply == Reply.APPLIED:
                    outcomes.set(slot, Outcome.APPLIED)
                elif reply == Reply.APPLIED_WITHOUT_HELD:
                    held = sorted(split_unchanged(change)[1])
                    outcomes.set(
                        slot,
                        Outcome.APPLIED,
                        f"unchanged columns {held} not held by the follower: left out",
                    )
                elif reply == Reply.CONFLICT:
                    raced.append((slot, change))
                else:
                    outcomes.set(slot, Outcome.FAILED, f"unexpected script reply {reply!r}")
            if lost:
                # Redis lost its scripts (restart, SCRIPT FLUSH): those calls did not run.
                self._sha = None
            pending = lost
        return raced

    def _script_sha(self) -> str:
        if self._sha is None:
            try:
                self._sha = str(self.client.script_load(SCRIPT))
            except (RedisConnectionError, RedisTimeoutError) as e:
                raise RetryableSinkError(f"Redis unreachable: {e}") from e
            except RedisError as e:
                raise SinkError(f"Redis refused the write script: {e}") from e
        return self._sha

    def _execute(self, pipe: Any, raise_on_error: bool = True) -> list[Any]:
        try:
            return list(pipe.execute(raise_on_error=raise_on_error))
        except (RedisConnectionError, RedisTimeoutError, RedisClusterException) as e:
            raise RetryableSinkError(f"Redis unreachable: {e}") from e
        except RedisError as e:
            raise SinkError(f"Redis refused the pipeline: {e}") from e

    # -- watermarks ----------------------------------------------------------------------

    def record_watermark(self, job: str, lsn: int) -> None:
        """Record ``lsn`` for ``job``; an older ``lsn`` than the recorded one is ignored."""
        stored = watermark_string(lsn)
        pipe = self.client.pipeline(transaction=False)
        sha = self._script_sha()
        pipe.execute_command("EVALSHA", sha, 1, self.watermark_key(job), "w", stored)
        reply = self._execute(pipe, raise_on_error=False)[0]
        if isinstance(reply, NoScriptError):
            self._sha = None
            self.record_watermark(job, lsn)
        elif isinstance(reply, Exception):
            raise SinkError(f"Redis refused the watermark of {job}: {reply}") from reply

    def read_watermark(self, job: str) -> int | None:
        """The recorded watermark of ``job``, or None."""
        raw = self._read(lambda: self.client.get(self.watermark_key(job)))
        return int(raw) if raw is not None else None

    # -- readers -------------------------------------------------------------------------

    def read_row(self, table: str, key: str) -> dict[str, Any] | None:
        """The row held for ``key``, decoded, or None if none is held."""
        row_key = self.row_key(table, key)
        if self.value_mode == "hash":
            fields = self._read(lambda: self.client.hgetall(row_key))
            if not fields:
                return None
            return {k.decode(): orjson.loads(v) for k, v in fields.items()}
        raw = self._read(lambda: self.client.get(row_key))
        if raw is None:
            return None
        row = orjson.loads(raw)
        if not isinstance(row, dict):
            raise SinkError(f"{row_key} does not hold a JSON object")
        return row

    def read_version(self, table: str, key: str) -> VersionOrder | None:
        """The version held for ``key`` (a live row or a tombstone), or None."""
        raw = self._read(lambda: self.client.get(self.version_key(table, key)))
        return parse_version(raw) if raw is not None else None

    def close(self) -> None:
        """Close the connection pool."""
        self.client.close()

    def _read(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except (RedisConnectionError, RedisTimeoutError) as e:
            raise RetryableSinkError(f"Redis unreachable: {e}") from e
        except RedisError as e:
            raise SinkError(f"Redis refused a read: {e}") from e


def _call_bytes(call: _Call) -> int:
    """What a script call weighs in a pipeline: its keys' and arguments' characters."""
    return sum(map(len, call[2])) + sum(map(len, call[3]))


def _check_table(table: str) -> None:
    if ":" in table or table.count(".") != 1:
        raise SinkError(f"table {table!r} must be a table id <schema>.<table> without ':'")
