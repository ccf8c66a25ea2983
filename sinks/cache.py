"""The Redis follower's writer.

Layout (``table`` is ``schema.table``):

- ``<prefix>:<table>:<key>`` holds the row. ``value_mode="hash"``: a hash with one field per
  column whose value is the column's value as JSON, so types round-trip and SQL NULL is the
  field ``null`` (a column is absent only if the follower never got a value for it).
  ``value_mode="json"``: a string holding the row as one JSON object.
- ``<prefix>:__v__:<table>:<key>`` holds the row's version: the commit LSN as 20 decimal
  digits then the ordinal as 10, so versions compare exactly (Lua numbers are doubles and
  hold only 53 bits; the script compares 15 digits at a time). Kept beside the row rather
  than inside it so that no column name can clash with it, and so that it can outlive a
  deleted row as its tombstone for ``tombstone_ttl_s``: a late, older insert is then still
  refused. With ``ttl_s`` the version key expires with its row.
- ``<prefix>:__watermark__:<job>`` holds a job's watermark LSN (20 digits), only increasing.

Row keys' second segment is a table name, which contains a dot; the other keys' does not,
so the namespaces cannot collide. Tables whose names contain ``:`` are refused.

Every write goes through one Lua script (loaded once, then EVALSHA, one pipeline per
``apply``) that compares the incoming version with the stored one and writes only if it is
newer. Running a batch again is therefore harmless.

Unchanged TOAST columns: in hash mode the script writes only the provided fields, keeping
the held ones. In JSON mode the merge happens here, not in Lua: Lua's cjson turns numbers
into doubles and prints them with 14 digits, which would corrupt int64 and numeric values.
The sink reads the held row and version, merges, and the script writes only if the version
is still the one read (else the merge is redone).

Redis must not evict version keys on its own (``maxmemory-policy`` ``noeviction`` or a
``volatile-*`` policy with ``ttl_s``), or stale writes could get through.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final

import orjson
import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from pgcdc.core.contract import redis_watermark_key
from pgcdc.core.errors import ConfigError, RetryableSinkError, SinkError
from pgcdc.core.settings import RedisSettings
from sinks.base import (
    APPLIED,
    FAILED,
    SKIPPED,
    ApplyResult,
    Change,
    reduce_batch,
    split_unchanged,
)

__all__ = ["CacheSink"]

log = logging.getLogger(__name__)

_LSN_DIGITS: Final = 20
_ORDER_DIGITS: Final = 10
_MAX_LSN: Final = (1 << 64) - 1
_MAX_ORDER: Final = 10**_ORDER_DIGITS - 1
_MERGE_ATTEMPTS: Final = 5

# Script results.
_SKIPPED: Final = 0
_APPLIED: Final = 1
_APPLIED_WITHOUT_HELD: Final = 2  # partial change, but no row was held
_CONFLICT: Final = 3  # JSON merge raced with another write

# KEYS[1] row key (the watermark key for op 'w'), KEYS[2] version key.
# ARGV[1] op: 'h' hash row, 'hp' hash partial, 'j' JSON row, 'jp' JSON merged row,
#             'd' delete, 'w' watermark.
# ARGV[2] version, ARGV[3] row TTL (0 = none), ARGV[4] tombstone TTL,
# ARGV[5] for 'jp' the held version the merge used ('' = none), else '*',
# ARGV[6] for hash ops a JSON object of column -> the column's value as JSON text (strings
#         only, so cjson's doubles never touch a value), else the row as JSON.
# One argument instead of a pair per column: packing arguments is the client's main cost.
_SCRIPT: Final = """
local function newer(a, b)
  if not b then return true end
  if #a ~= #b then return #a > #b end
  for i = 1, #a, 15 do
    local x = tonumber(string.sub(a, i, i + 14))
    local y = tonumber(string.sub(b, i, i + 14))
    if x ~= y then return x > y end
  end
  return false
end

local op, version = ARGV[1], ARGV[2]
if op == 'w' then
  if newer(version, redis.call('GET', KEYS[1])) then
    redis.call('SET', KEYS[1], version)
    return 1
  end
  return 0
end

local row, vkey = KEYS[1], KEYS[2]
local held = redis.call('GET', vkey)
if not newer(version, held) then return 0 end
if op == 'd' then
  redis.call('DEL', row)
  redis.call('SET', vkey, version, 'EX', ARGV[4])
  return 1
end
if ARGV[5] ~= '*' and ARGV[5] ~= (held or '') then return 3 end
local existed = redis.call('EXISTS', row)
if op == 'h' then
  redis.call('DEL', row)
end
if op == 'h' or op == 'hp' then
  local flat = {}
  for column, value in pairs(cjson.decode(ARGV[6])) do
    flat[#flat + 1] = column
    flat[#flat + 1] = value
  end
  if #flat > 0 then redis.call('HSET', row, unpack(flat)) end
else
  redis.call('SET', row, ARGV[6])
end
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  redis.call('EXPIRE', row, ttl)
  redis.call('SET', vkey, version, 'EX', ttl)
else
  redis.call('SET', vkey, version)
end
if (op == 'hp' or op == 'jp') and existed == 0 then return 2 end
return 1
"""


def version_string(commit_lsn: int, order: int) -> str:
    """The stored form of a version: 20-digit LSN then 10-digit ordinal."""
    if not 0 <= commit_lsn <= _MAX_LSN:
        raise ValueError(f"commit LSN {commit_lsn} is outside 0..2**64-1")
    if not 0 <= order <= _MAX_ORDER:
        raise ValueError(f"order {order} is outside 0..{_MAX_ORDER}")
    return f"{commit_lsn:0{_LSN_DIGITS}d}{order:0{_ORDER_DIGITS}d}"


def parse_version(stored: str | bytes) -> tuple[int, int]:
    """``(commit_lsn, order)`` from a stored version."""
    text = stored.decode() if isinstance(stored, bytes) else stored
    return int(text[:_LSN_DIGITS]), int(text[_LSN_DIGITS:])


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
        client: redis.Redis | None = None,
    ) -> None:
        if value_mode not in ("hash", "json"):
            raise ConfigError(f"value_mode must be 'hash' or 'json', not {value_mode!r}")
        if not key_prefix:
            raise ConfigError("the Redis key prefix must not be empty")
        if ttl_s is not None and ttl_s < 1:
            raise ConfigError("ttl_s must be at least 1 second")
        if tombstone_ttl_s < 1:
            raise ConfigError("tombstone_ttl_s must be at least 1 second")
        self.key_prefix = key_prefix
        self.value_mode = value_mode
        self.ttl_s = ttl_s
        self.tombstone_ttl_s = tombstone_ttl_s
        # The script is idempotent, so commands may be sent again after a lost connection.
        self.client: redis.Redis = client or redis.Redis.from_url(
            url,
            retry=Retry(ExponentialBackoff(cap=max_backoff_s, base=backoff_s), retries),
            retry_on_error=[RedisConnectionError, RedisTimeoutError],
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
            **kwargs,
        )

    # -- keys ----------------------------------------------------------------------------

    def row_key(self, table: str, key: str) -> str:
        """``<prefix>:<table>:<key>``."""
        _check_table(table)
        return f"{self.key_prefix}:{table}:{key}"

    def version_key(self, table: str, key: str) -> str:
        """``<prefix>:__v__:<table>:<key>``."""
        _check_table(table)
        return f"{self.key_prefix}:__v__:{table}:{key}"

    def watermark_key(self, job: str) -> str:
        """The key of ``job``'s watermark (the contract's :func:`redis_watermark_key`)."""
        return redis_watermark_key(self.key_prefix, job)

    # -- apply ---------------------------------------------------------------------------

    def apply(self, changes: Sequence[Change]) -> list[ApplyResult]:
        """Apply a batch in one pipeline; one result per change, in the order given.

        Stale changes are ``skipped``; changes that cannot be stored (values that are not
        JSON, a table name with ``:``, a command Redis refuses) are ``failed`` with
        ``retryable=False``. Raises :class:`RetryableSinkError` if Redis stays unreachable
        through every retry, :class:`SinkError` if it refuses the connection for another
        reason (e.g. authentication). Applying a batch again is safe.
        """
        results: list[ApplyResult | None] = [None] * len(changes)
        reduced = reduce_batch(changes)
        for i in reduced.superseded:
            results[i] = _result(changes[i], SKIPPED, "superseded by a newer change in the batch")

        calls: list[tuple[int, Change, list[str], list[str]]] = []
        merges: list[tuple[int, Change]] = []
        for slot, change in zip(reduced.index_of, reduced.winners, strict=True):
            try:
                keys = [
                    self.row_key(change.table, change.key),
                    self.version_key(change.table, change.key),
                ]
                version = version_string(change.commit_lsn, change.order)
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
                results[slot] = _result(change, FAILED, str(e))
                continue
            calls.append((slot, change, keys, args))

        self._run(calls, results)
        for _ in range(_MERGE_ATTEMPTS):
            if not merges:
                break
            merges = self._merge_json(merges, results)
        for slot, change in merges:
            results[slot] = _result(
                change, FAILED, "the held row kept changing during the merge", retryable=True
            )
        out: list[ApplyResult] = []
        for change, r in zip(changes, results, strict=True):
            out.append(r if r is not None else _result(change, FAILED, "no outcome (bug)"))
        return out

    def _args(self, op: str, version: str, expected: str = "*", *payload: str) -> list[str]:
        """The script's ARGV (see ``_SCRIPT``)."""
        return [op, version, str(self.ttl_s or 0), str(self.tombstone_ttl_s), expected, *payload]

    def _hash_args(self, change: Change, version: str) -> list[str]:
        values, held = split_unchanged(change)
        fields = {column: orjson.dumps(value).decode() for column, value in values.items()}
        return self._args("hp" if held else "h", version, "*", orjson.dumps(fields).decode())

    def _merge_json(
        self, merges: list[tuple[int, Change]], results: list[ApplyResult | None]
    ) -> list[tuple[int, Change]]:
        """Merge JSON rows with their held values; return the merges that raced."""
        pipe = self.client.pipeline(transaction=False)
        for _, change in merges:
            pipe.get(self.row_key(change.table, change.key))
            pipe.get(self.version_key(change.table, change.key))
        held_state = self._execute(pipe, raise_on_error=False)
        calls: list[tuple[int, Change, list[str], list[str]]] = []
        for n, (slot, change) in enumerate(merges):
            row_raw, held_version = held_state[2 * n], held_state[2 * n + 1]
            values, held = split_unchanged(change)
            for reply in (row_raw, held_version):
                if isinstance(reply, Exception):
                    results[slot] = _result(change, FAILED, f"Redis refused the read: {reply}")
                    break
            if results[slot] is not None:
                continue
            try:
                held_row = orjson.loads(row_raw) if row_raw is not None else {}
                merged = dict(values)
                for column in held:
                    if column in held_row:
                        merged[column] = held_row[column]
                expected = held_version.decode() if held_version is not None else ""
                version = version_string(change.commit_lsn, change.order)
                args = self._args("jp", version, expected, orjson.dumps(merged).decode())
                keys = [
                    self.row_key(change.table, change.key),
                    self.version_key(change.table, change.key),
                ]
            except (SinkError, ValueError, TypeError) as e:
                results[slot] = _result(change, FAILED, str(e))
                continue
            calls.append((slot, change, keys, args))
        return self._run(calls, results)

    def _run(
        self,
        calls: list[tuple[int, Change, list[str], list[str]]],
        results: list[ApplyResult | None],
    ) -> list[tuple[int, Change]]:
        """Send the script calls in one pipeline; return JSON merges that raced."""
        raced: list[tuple[int, Change]] = []
        pending = calls
        while pending:
            sha = self._script_sha()
            pipe = self.client.pipeline(transaction=False)
            for _, _, keys, args in pending:
                pipe.evalsha(sha, len(keys), *keys, *args)
            replies = self._execute(pipe, raise_on_error=False)
            lost: list[tuple[int, Change, list[str], list[str]]] = []
            for call, reply in zip(pending, replies, strict=True):
                slot, change, _, args = call
                if isinstance(reply, NoScriptError):
                    lost.append(call)
                elif isinstance(reply, Exception):
                    results[slot] = _result(change, FAILED, f"Redis refused the write: {reply}")
                    log.warning("write refused: %s", reply, extra={"table": change.table})
                elif reply == _SKIPPED:
                    results[slot] = _result(change, SKIPPED, "a newer version is held")
                elif reply == _APPLIED:
                    results[slot] = _result(change, APPLIED)
                elif reply == _APPLIED_WITHOUT_HELD:
                    held = sorted(split_unchanged(change)[1])
                    results[slot] = _result(
                        change,
                        APPLIED,
                        f"unchanged columns {held} not held by the follower: left out",
                    )
                elif reply == _CONFLICT:
                    raced.append((slot, change))
                else:
                    results[slot] = _result(change, FAILED, f"unexpected script reply {reply!r}")
            if lost:
                # Redis lost its scripts (restart, SCRIPT FLUSH): those calls did not run.
                self._sha = None
            pending = lost
        return raced

    def _script_sha(self) -> str:
        if self._sha is None:
            try:
                self._sha = str(self.client.script_load(_SCRIPT))
            except (RedisConnectionError, RedisTimeoutError) as e:
                raise RetryableSinkError(f"Redis unreachable: {e}") from e
            except RedisError as e:
                raise SinkError(f"Redis refused the write script: {e}") from e
        return self._sha

    def _execute(self, pipe: Any, raise_on_error: bool = True) -> list[Any]:
        try:
            return list(pipe.execute(raise_on_error=raise_on_error))
        except (RedisConnectionError, RedisTimeoutError) as e:
            raise RetryableSinkError(f"Redis unreachable: {e}") from e
        except RedisError as e:
            raise SinkError(f"Redis refused the pipeline: {e}") from e

    # -- watermarks ----------------------------------------------------------------------

    def record_watermark(self, job: str, lsn: int) -> None:
        """Record ``lsn`` for ``job``; an older ``lsn`` than the recorded one is ignored."""
        if not 0 <= lsn <= _MAX_LSN:
            raise ValueError(f"watermark LSN {lsn} is outside 0..2**64-1")
        pipe = self.client.pipeline(transaction=False)
        pipe.evalsha(self._script_sha(), 1, self.watermark_key(job), "w", f"{lsn:020d}")
        reply = self._execute(pipe, raise_on_error=False)[0]
        if isinstance(reply, NoScriptError):
            self._sha = None
            self.record_watermark(job, lsn)
        elif isinstance(reply, Exception):
            raise SinkError(f"Redis refused the watermark of {job}: {reply}") from reply

    def read_watermark(self, job: str) -> int | None:
        """The recorded watermark of ``job``, or None."""
        raw = self._call(lambda: self.client.get(self.watermark_key(job)))
        return int(raw) if raw is not None else None

    # -- readers -------------------------------------------------------------------------

    def read_row(self, table: str, key: str) -> dict[str, Any] | None:
        """The row held for ``key``, decoded, or None if none is held."""
        row_key = self.row_key(table, key)
        if self.value_mode == "hash":
            fields = self._call(lambda: self.client.hgetall(row_key))
            if not fields:
                return None
            return {k.decode(): orjson.loads(v) for k, v in fields.items()}
        raw = self._call(lambda: self.client.get(row_key))
        if raw is None:
            return None
        row = orjson.loads(raw)
        if not isinstance(row, dict):
            raise SinkError(f"{row_key} does not hold a JSON object")
        return row

    def read_version(self, table: str, key: str) -> tuple[int, int] | None:
        """``(commit_lsn, order)`` held for ``key`` (a live row or a tombstone), or None."""
        raw = self._call(lambda: self.client.get(self.version_key(table, key)))
        return parse_version(raw) if raw is not None else None

    def close(self) -> None:
        """Close the connection pool."""
        self.client.close()

    def _call(self, fn: Any) -> Any:
        try:
            return fn()
        except (RedisConnectionError, RedisTimeoutError) as e:
            raise RetryableSinkError(f"Redis unreachable: {e}") from e
        except RedisError as e:
            raise SinkError(f"Redis refused a read: {e}") from e


def _check_table(table: str) -> None:
    if ":" in table or "." not in table:
        raise SinkError(f"table {table!r} must be schema.table without ':'")


def _result(
    change: Change, outcome: str, reason: str | None = None, retryable: bool = False
) -> ApplyResult:
    return ApplyResult(change.key, change.table, outcome, reason, retryable)
