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
- ``<prefix>:__watermark__:<job>`` holds a job's watermark LSN (20 digits), only increasing;
  ``<prefix>:__watermark_at__:<job>`` when it last advanced (Unix milliseconds).

Row keys' second segment is a table id, which contains a dot; the other keys' does not,
so the namespaces cannot collide. A table that is no table id (no ``.``, two of them, or a
``:``) is refused.

Every write goes through one Lua script (:data:`sinks.cache_script.SCRIPT`; loaded once,
then EVALSHA of up to ``_ROWS_PER_CALL`` rows a call, pipelined: one write of at most
``pipeline_max_bytes`` of arguments, packed by :mod:`sinks.cache_resp`) that compares each
row's incoming version with the stored one and writes only if it is newer. Running a batch
again is therefore harmless.

Unchanged TOAST columns: in hash mode the script writes only the provided fields, keeping
the held ones. In JSON mode the merge happens here, not in Lua: Lua's cjson turns numbers
into doubles and prints them with 14 digits, which would corrupt int64 and numeric values.
The sink reads the held row and version, merges, and the script writes only if the version
is still the one read (else the merge is redone).

Redis Cluster: with ``cluster`` (the ``redis.cluster`` setting, or ``cluster=true`` in the
URL's query) the sink talks through ``redis.cluster.RedisCluster``'s pipeline, which routes
each script call to the node owning its slot and loads the script on every primary.

Redis must not evict version keys on its own (``maxmemory-policy`` ``noeviction`` or a
``volatile-*`` policy with ``ttl_s``), or stale writes could get through.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, NamedTuple, cast

import orjson
import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from pgcdc.core import native
from pgcdc.core.contract import VersionOrder, redis_watermark_key, redis_watermark_time_key
from pgcdc.core.errors import ConfigError, RetryableSinkError, SinkError
from pgcdc.core.follower_clients import redis_cluster_url, redis_options
from pgcdc.core.settings import RedisSettings
from sinks import cache_keys, cache_resp
from sinks.base import (
    ApplyResult,
    BatchOutcomes,
    Change,
    OnePerKey,
    Outcome,
    chunks_by_bytes,
    split_unchanged,
)
from sinks.cache_script import (
    MAX_LSN,
    MAX_ORDER,
    SCRIPT,
    SCRIPT_SHA,
    VERSION_FORMAT,
    VERSION_LENGTH,
    Reply,
    parse_version,
    version_bytes,
    watermark_string,
)

__all__ = ["CacheSink"]

log = logging.getLogger(__name__)

_MERGE_ATTEMPTS: Final = 5
# Rows a script call writes (one Redis Cluster slot a call: one row there). Redis runs a call
# alone, so this bounds how long one holds it: a few milliseconds.
_ROWS_PER_CALL: Final = 200

# A row write waiting to be sent: the input slot it answers for, its change, and the row's
# script arguments: its two KEYS (row key, version key), its first four ARGV (op, version,
# expected version, how many follow; see sinks.cache_script), then the ARGV that follow,
# framed as RESP bulk strings in one bytes (what the native path renders: sinks.base).
_Call = tuple[int, Change, list[bytes]]
# Rendered rows' script calls (CacheSink._rendered_calls): each pipeline's calls, each call's
# rows (from start to end), and the pipeline's bytes.
_Pipelines = list[tuple[list[tuple[int, int]], bytes]]


class _Layout(NamedTuple):
    """How a table's rendered rows are packed (CacheSink._rendered_layout): a row's two KEYS
    as a bytes format (``% (row key's length, key, version key's length, key, key)``), the
    row key's and the version key's lengths without the key, and the native module's packer
    of them (``pgcdc_native.CacheCalls``), None without the module."""

    keys: bytes
    row: int
    version: int
    native: Any


# A call packed with bytes formats: the command head, and each row's keys and ARGV.
_BULK: Final = cache_resp.BULK
_HEAD: Final = _BULK % (7, b"EVALSHA") + _BULK % (40, SCRIPT_SHA.encode())
_ROW_KEYS: Final = _BULK * 2
_ROW_ARGV: Final = _BULK * 4
_FIELD: Final = _BULK * 2
_SKIPPED: Final = int(Reply.SKIPPED)
_APPLIED: Final = int(Reply.APPLIED)
_APPLIED_WITHOUT_HELD: Final = int(Reply.APPLIED_WITHOUT_HELD)
_CONFLICT: Final = int(Reply.CONFLICT)
_REFUSED: Final = int(Reply.REFUSED)
# A row's first four ARGV in a call of rendered rows (CacheSink._rendered_layout): ``% (op,
# commit LSN, order, count's length, count)``, the expected version ``*``.
_RENDERED_ARGV: Final = b"".join(
    [
        b"$1\r\n%b\r\n",
        b"$%d\r\n" % VERSION_LENGTH,
        VERSION_FORMAT,
        b"\r\n$1\r\n*\r\n$%d\r\n%b\r\n",
    ]
)
# Codes of a call whose rows each were applied or skipped (bytes.translate deletes them).
_PLAIN_CODES: Final = bytes([_APPLIED, _SKIPPED])
_APPLIED_OUTCOME: Final = Outcome.APPLIED
_SKIPPED_OUTCOME: Final = Outcome.SKIPPED
_HELD_NEWER: Final = "a newer version is held"
_new_result: Final = tuple.__new__


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
        self._ttls = (str(ttl_s or 0).encode(), str(tombstone_ttl_s).encode())
        self._ttl_argv = b"".join(_BULK % (len(t), t) for t in self._ttls)  # ARGV[1], [2]
        self._tables: set[str] = set()  # table ids already checked
        # Each table's bytes formats of its rendered rows (_rendered_layout).
        self._layouts: dict[str, _Layout | None] = {}
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
        self._script_loaded = False
        self.script_loads = 0  # how many times the script was loaded (again after a flush)
        self.rendered_batches = 0  # batches written the rendered way (_apply_rendered)

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

    def register_schema(
        self, table: str, value_schema: Mapping[str, Any], since_lsn: int | None = None
    ) -> None:
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
        rendered = self._apply_rendered(changes)
        if rendered is not None:
            return rendered
        outcomes = BatchOutcomes(changes)
        calls: list[_Call] = []
        merges: list[tuple[int, Change]] = []
        for slot, change in outcomes.one_per_key():
            try:
                args = self._write_args(change)
            except (SinkError, ValueError, TypeError) as e:
                outcomes.set(slot, Outcome.FAILED, str(e))
                continue
            if args is None:
                merges.append((slot, change))
            else:
                calls.append((slot, change, args))

        self._run(calls, outcomes)
        self._merge(merges, outcomes)
        return outcomes.results()

    def _merge(self, merges: list[tuple[int, Change]], outcomes: BatchOutcomes) -> None:
        """Merge partial JSON rows with the held ones (:meth:`_merge_json`), again while
        they race, at most :data:`_MERGE_ATTEMPTS` times."""
        for _ in range(_MERGE_ATTEMPTS):
            if not merges:
                break
            merges = self._merge_json(merges, outcomes)
        for slot, _change in merges:
            outcomes.set(
                slot, Outcome.FAILED, "the held row kept changing during the merge", retryable=True
            )

    def _apply_rendered(self, changes: Sequence[Change]) -> list[ApplyResult] | None:
        """The native path's common batch written with no bookkeeping a change: one change
        a key of one table (:class:`~sinks.base.OnePerKey`), each a whole document rendered
        with it (:data:`sinks.base.Rendered`) or a delete, no brace in its row key, a client
        of one Redis. Its calls are what :meth:`_pack` makes of the same rows, a row's keys
        and its arguments one bytes format each (:meth:`_rendered_calls`). Each change's
        result, or None: the batch is not that one, and nothing was sent.

        Each outcome is the general way's: a call whose rows were each applied or skipped
        answers for them here; a call with any other reply (an error, a refused row, Redis
        without the script) is settled the general way from that reply on
        (:meth:`_settle_odd`)."""
        if type(changes) is not OnePerKey or not changes:
            return None
        if not isinstance(self.client, redis.Redis):
            return None
        pipelines = self._rendered_calls(changes)
        if pipelines is None:
            return None
        self.rendered_batches += 1
        results: list[ApplyResult | None] = [None] * len(changes)
        odd: list[tuple[int, int, Any]] = []
        for calls, payload in pipelines:
            self._load_script()
            replies = self._send_packed(payload, len(calls))
            odd += self._plain(changes, calls, replies, results)
            if any(isinstance(reply, NoScriptError) for reply in replies):
                self._script_loaded = False  # loaded again before the next pipeline
        if odd:
            self._settle_odd(changes, odd, results)
        return results  # type: ignore[return-value]  # every slot is set

    @staticmethod
    def _plain(
        changes: Sequence[Change],
        calls: Sequence[tuple[int, int]],
        replies: Sequence[Any],
        results: list[ApplyResult | None],
    ) -> list[tuple[int, int, Any]]:
        """The results of ``calls`` whose reply says each row was applied or skipped, set
        in ``results``; the other calls' rows (from ``start`` to ``end``) and replies."""
        table = changes[0].table
        new = _new_result
        odd: list[tuple[int, int, Any]] = []
        for (start, end), reply in zip(calls, replies, strict=True):
            codes = reply[0] if isinstance(reply, list) and len(reply) == 2 else None
            if (
                not isinstance(codes, bytes)
                or len(codes) != end - start
                or codes.translate(None, _PLAIN_CODES)
            ):
                odd.append((start, end, reply))
                continue
            results[start:end] = [
                new(ApplyResult, (c.key, table, _APPLIED_OUTCOME, None, False))
                if code == _APPLIED
                else new(ApplyResult, (c.key, table, _SKIPPED_OUTCOME, _HELD_NEWER, False))
                for c, code in zip(changes[start:end], codes, strict=True)
            ]
        return odd

    def _settle_odd(
        self,
        changes: Sequence[Change],
        odd: Sequence[tuple[int, int, Any]],
        results: list[ApplyResult | None],
    ) -> None:
        """The results of :meth:`_apply_rendered`'s calls whose reply was not each row
        applied or skipped (``odd``: each such call's rows, from ``start`` to ``end``, and
        its reply), settled the general way from that reply on (:meth:`_settle`)."""
        outcomes = BatchOutcomes(changes)
        lost: list[_Call] = []
        raced: list[tuple[int, Change]] = []
        for start, end, reply in odd:
            group: list[_Call] = []
            for slot in range(start, end):
                args = self._write_args(changes[slot])
                assert args is not None  # a whole row or a delete
                group.append((slot, changes[slot], args))
            self._settle(group, reply, outcomes, raced, lost)
        if lost:  # Redis lost its scripts (restart, SCRIPT FLUSH): those calls did not run
            self._script_loaded = False
            self._run(lost, outcomes)
        # No row here is a partial JSON row, the only one whose write races (as in apply).
        general = outcomes.results()
        for start, end, _ in odd:
            results[start:end] = general[start:end]

    def _rendered_calls(self, changes: Sequence[Change]) -> _Pipelines | None:
        """:meth:`_apply_rendered`'s script calls in pipelines: each pipeline's calls' rows
        (from ``start`` to ``end``) and its bytes; None when a change is not the common
        case. Packed by the native module's ``CacheCalls`` when it is built, else by its
        Python twin (:meth:`_python_calls`), byte for byte the same."""
        layout = self._rendered_layout(changes[0].table)
        if layout is None:
            return None
        if layout.native is not None:
            return cast("_Pipelines | None", layout.native.calls(changes))
        return self._python_calls(changes, layout)

    def _python_calls(self, changes: Sequence[Change], layout: _Layout) -> _Pipelines | None:
        """:meth:`_rendered_calls` in Python."""
        table = changes[0].table
        keys_format, row_bytes, version_bytes_ = layout.keys, layout.row, layout.version
        argv_format = _RENDERED_ARGV
        hash_mode = self.value_mode == "hash"
        keys: list[bytes] = []
        argv: list[bytes] = []
        follow: list[int] = []
        try:
            for c in changes:
                lsn, order, rendered = c.commit_lsn, c.order, c.rendered
                if c.table != table or c.unchanged or not (0 <= lsn <= MAX_LSN):
                    return None
                if not 0 <= order <= MAX_ORDER:
                    return None
                k = c.key.encode()
                if b"{" in k or b"}" in k:
                    return None
                n = len(k)
                keys.append(keys_format % (row_bytes + n, k, version_bytes_ + 2 * n, k, k))
                if rendered is None:
                    if c.doc is not None:
                        return None
                    argv += (argv_format % (b"d", lsn, order, 1, b"0"), b"")
                    follow.append(0)
                elif hash_mode:
                    count = 2 * len(c.doc)  # type: ignore[arg-type]  # a whole document
                    counted = b"%d" % count
                    argv += (argv_format % (b"h", lsn, order, len(counted), counted), rendered[1])
                    follow.append(count)
                else:
                    argv += (argv_format % (b"j", lsn, order, 1, b"1"), _framed(rendered[0]))
                    follow.append(1)
        except UnicodeEncodeError:  # a key with no UTF-8 form: the general way fails it
            return None
        return self._packed_calls(keys, argv, follow)

    def _rendered_layout(self, table: str) -> _Layout | None:
        """How :meth:`_rendered_calls` packs ``table``'s rows; None when the table is
        refused, or its row keys hold a brace (:mod:`sinks.cache_keys` then tags them
        otherwise)."""
        if table in self._layouts:
            return self._layouts[table]
        layout: _Layout | None = None
        try:
            row = f"{self.key_prefix}:{table}:".encode()
        except UnicodeEncodeError:
            row = b"{"  # no UTF-8 form: the general way fails its rows
        if not _refused(table) and b"{" not in row and b"}" not in row:
            # <prefix>:__v__:{<row key>}:<table>:<key>, as _keys makes it
            before = f"{self.key_prefix}:__v__:{{".encode() + row
            after = f"}}:{table}:".encode()
            keys_format = b"".join(
                [
                    b"$%d\r\n",
                    row.replace(b"%", b"%%"),
                    b"%b\r\n$%d\r\n",
                    before.replace(b"%", b"%%"),
                    b"%b",
                    after.replace(b"%", b"%%"),
                    b"%b\r\n",
                ]
            )
            mod = native.module()
            packer = None
            if mod is not None:
                packer = mod.CacheCalls(
                    table,
                    row,
                    before,
                    after,
                    self.value_mode == "hash",
                    _HEAD,
                    self._ttl_argv,
                    self.pipeline_max_bytes,
                    _ROWS_PER_CALL,
                )
            layout = _Layout(keys_format, len(row), len(before) + len(after), packer)
        self._layouts[table] = layout
        return layout

    def _packed_calls(
        self, keys: Sequence[bytes], argv: Sequence[bytes], follow: Sequence[int]
    ) -> _Pipelines:
        """Rows' framed KEYS and ARGV (each row's ARGV two bytes, its first four and then
        the ``follow`` that follow them) packed as :meth:`_pack` packs them, in calls of at
        most :data:`_ROWS_PER_CALL` rows, in pipelines of at most ``pipeline_max_bytes`` of
        rows (each weighed by its framed keys and arguments; a row heavier alone is a
        pipeline of its own): each pipeline's calls' rows (from ``start`` to ``end``) and
        the pipeline's bytes."""
        pipelines: _Pipelines = []
        calls: list[tuple[int, int]] = []
        parts: list[bytes] = []

        def call(start: int, end: int) -> None:
            count = b"%d" % (2 * (end - start))
            arguments = 5 + 6 * (end - start) + sum(follow[start:end])
            parts.extend((b"*%d\r\n" % arguments, _HEAD, _BULK % (len(count), count)))
            parts.extend(keys[start:end])
            parts.append(self._ttl_argv)
            parts.extend(argv[2 * start : 2 * end])
            calls.append((start, end))

        most = self.pipeline_max_bytes
        start = size = 0
        for i, k in enumerate(keys):
            n = len(k) + len(argv[2 * i]) + len(argv[2 * i + 1])
            if size and size + n > most:
                call(start, i)
                pipelines.append((calls, b"".join(parts)))
                calls, parts, start, size = [], [], i, 0
            elif i - start == _ROWS_PER_CALL:
                call(start, i)
                start = i
            size += n
        call(start, len(keys))
        pipelines.append((calls, b"".join(parts)))
        return pipelines

    def _write_args(self, change: Change) -> list[bytes] | None:
        """The row's script arguments that write ``change`` (:data:`_Call`), or None for a
        partial JSON row, which is first merged with the held one (:meth:`_merge_json`)."""
        version = version_bytes(change.commit_lsn, change.order)
        if change.doc is None:
            return self._args(change, b"d", version, 0)
        rendered = change.rendered
        if rendered is not None:  # made with the change, from the whole document
            if self.value_mode == "hash":
                return self._args(change, b"h", version, 2 * len(change.doc), rendered[1])
            return self._args(change, b"j", version, 1, _framed(rendered[0]))
        values, held = split_unchanged(change)
        if self.value_mode == "hash":
            return self._args(
                change, b"hp" if held else b"h", version, 2 * len(values), hash_fields(values)
            )
        if held:
            return None
        return self._args(change, b"j", version, 1, _framed(orjson.dumps(values)))

    def _keys(self, table: str, key: str) -> tuple[bytes, bytes]:
        """The script's KEYS for a row write: the row key and its version key (as
        :meth:`row_key` and :meth:`version_key`, checking each table id once)."""
        if table not in self._tables:
            _check_table(table)
            self._tables.add(table)
        row_key = f"{self.key_prefix}:{table}:{key}"
        if "{" in row_key or "}" in row_key:  # see sinks.cache_keys
            version_key = cache_keys.version_key(self.key_prefix, row_key, table, key)
        else:  # no braces: Redis Cluster hashes the whole row key, which is the tag
            version_key = f"{self.key_prefix}:__v__:{{{row_key}}}:{table}:{key}"
        return row_key.encode(), version_key.encode()

    def _args(
        self,
        change: Change,
        op: bytes,
        version: bytes,
        count: int,
        framed: bytes = b"",
        expected: bytes = b"*",
    ) -> list[bytes]:
        """A row's script arguments (:data:`_Call`): its KEYS, its first four ARGV, then
        ``framed``, the ``count`` ARGV that follow, as RESP bulk strings."""
        row_key, version_key = self._keys(change.table, change.key)
        return [row_key, version_key, op, version, expected, b"%d" % count, framed]

    def script_args(self, rows: Sequence[Sequence[bytes]]) -> list[bytes]:
        """EVALSHA's arguments after its key count (``2 * len(rows)``) for ``rows`` (each a
        row's script arguments, :meth:`_args`): every row's KEYS, then the TTLs and every
        row's ARGV (see :data:`sinks.cache_script.SCRIPT`)."""
        keys = [k for row in rows for k in row[:2]]
        argv = [a for row in rows for a in (*row[2:6], *cache_resp.unframed(row[6]))]
        return [*keys, *self._ttls, *argv]

    def _pack(self, calls: Sequence[_Call]) -> bytes:
        """The EVALSHA of ``calls``' rows in RESP: byte for byte redis-py's packing of
        ``EVALSHA <sha> <2 * rows> *script_args(rows)``, with one bytes format a row."""
        count = b"%d" % (2 * len(calls))
        keys = _ROW_KEYS
        argv = _ROW_ARGV
        parts = [_HEAD, _BULK % (len(count), count)]
        parts += [keys % (len(a[0]), a[0], len(a[1]), a[1]) for _, _, a in calls]
        parts.append(self._ttl_argv)
        parts += [
            argv % (len(a[2]), a[2], len(a[3]), a[3], len(a[4]), a[4], len(a[5]), a[5]) + a[6]
            for _, _, a in calls
        ]
        follow = sum([int(a[5]) for _, _, a in calls])
        return cache_resp.command(5 + 6 * len(calls) + follow, parts)

    def _merge_json(
        self, merges: list[tuple[int, Change]], outcomes: BatchOutcomes
    ) -> list[tuple[int, Change]]:
        """Merge JSON rows with their held values; return the merges that raced."""
        pipe = self.client.pipeline(transaction=False)
        for _, change in merges:
            for key in self._keys(change.table, change.key):
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
                expected = held_version if held_version is not None else b""
                version = version_bytes(change.commit_lsn, change.order)
                args = self._args(
                    change, b"jp", version, 1, _framed(orjson.dumps(merged)), expected
                )
            except (SinkError, ValueError, TypeError) as e:
                outcomes.set(slot, Outcome.FAILED, str(e))
                continue
            calls.append((slot, change, args))
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
        """Send the rows in one pipeline of script calls; return JSON merges that raced."""
        raced: list[tuple[int, Change]] = []
        pending = calls
        while pending:
            self._load_script()
            # A cluster's call stays in one slot: one row.
            per_call = _ROWS_PER_CALL if isinstance(self.client, redis.Redis) else 1
            groups = [pending[i : i + per_call] for i in range(0, len(pending), per_call)]
            replies = self._send(groups)
            lost: list[_Call] = []
            for group, reply in zip(groups, replies, strict=True):
                self._settle(group, reply, outcomes, raced, lost)
            if lost:
                # Redis lost its scripts (restart, SCRIPT FLUSH): those calls did not run.
                self._script_loaded = False
            pending = lost
        return raced

    @classmethod
    def _settle(
        cls,
        group: list[_Call],
        reply: Any,
        outcomes: BatchOutcomes,
        raced: list[tuple[int, Change]],
        lost: list[_Call],
    ) -> None:
        """The outcomes of ``group``'s call from its reply: its rows join ``lost`` when Redis
        did not hold the script (the call did not run), ``raced`` when a JSON merge raced."""
        if isinstance(reply, NoScriptError):
            lost += group
        elif isinstance(reply, Exception):
            for slot, change, _ in group:
                outcomes.set(slot, Outcome.FAILED, f"Redis refused the write: {reply}")
                log.warning("write refused: %s", reply, extra={"table": change.table})
        else:
            cls._outcomes(group, reply, outcomes, raced)

    @staticmethod
    def _outcomes(
        group: list[_Call],
        reply: Any,
        outcomes: BatchOutcomes,
        raced: list[tuple[int, Change]],
    ) -> None:
        """Each row's outcome from its call's reply (codes, errors; see SCRIPT)."""
        codes, errors = reply if isinstance(reply, list) and len(reply) == 2 else (None, None)
        if not isinstance(codes, bytes) or len(codes) != len(group):
            for slot, _change, _ in group:
                outcomes.set(slot, Outcome.FAILED, f"unexpected script reply {reply!r}")
            return
        refusals = iter(errors if isinstance(errors, list) else ())
        for (slot, change, _), code in zip(group, codes, strict=True):
            if code == _APPLIED:
                outcomes.set(slot, Outcome.APPLIED)
            elif code == _SKIPPED:
                outcomes.set(slot, Outcome.SKIPPED, _HELD_NEWER)
            elif code == _APPLIED_WITHOUT_HELD:
                held = sorted(split_unchanged(change)[1])
                outcomes.set(
                    slot,
                    Outcome.APPLIED,
                    f"unchanged columns {held} not held by the follower: left out",
                )
            elif code == _CONFLICT:
                raced.append((slot, change))
            elif code == _REFUSED:
                error = next(refusals, b"")
                text = error.decode(errors="replace") if isinstance(error, bytes) else error
                outcomes.set(slot, Outcome.FAILED, f"Redis refused the write: {text}")
                log.warning("write refused: %s", text, extra={"table": change.table})
            else:
                outcomes.set(slot, Outcome.FAILED, f"unexpected script reply {reply!r}")

    def _send(self, groups: list[list[_Call]]) -> list[Any]:
        """The script's replies to each group's call, in order; a refused call's reply is
        its error."""
        if isinstance(self.client, redis.Redis):
            packed = [self._pack(group) for group in groups]
            return self._send_packed(b"".join(packed), len(packed))
        cluster: Any = self.client
        pipe = cluster.pipeline(transaction=False)
        for group in groups:
            args = self.script_args([a for _, _, a in group])
            keys = len(group) * 2
            # execute_command: the cluster pipeline blocks its evalsha() wrapper. Left to
            # route EVALSHA itself, it asks a node for each call's keys (COMMAND GETKEYS,
            # one round trip per call): the call goes to its row key's primary instead (the
            # version key shares the slot, see sinks.cache_keys). Redirected calls (MOVED,
            # ASK) are sent again by the client, routed by their keys.
            try:
                node = cluster.get_node_from_key(args[0])
            except RedisClusterException:  # no node for the slot: the client finds one
                pipe.execute_command("EVALSHA", SCRIPT_SHA, keys, *args)
            else:
                pipe.execute_command("EVALSHA", SCRIPT_SHA, keys, *args, target_nodes=node)
        return self._execute(pipe, raise_on_error=False)

    def _send_packed(self, payload: bytes, count: int) -> list[Any]:
        """The replies to the ``count`` calls packed in ``payload``, sent in one pipeline to
        a Redis of one node; a refused call's reply is its error."""
        assert isinstance(self.client, redis.Redis)
        try:
            return cache_resp.send_payload(self.client, payload, count)
        except (RedisConnectionError, RedisTimeoutError) as e:
            raise RetryableSinkError(f"Redis unreachable: {e}") from e
        except RedisError as e:
            raise SinkError(f"Redis refused the pipeline: {e}") from e

    def _load_script(self) -> None:
        if not self._script_loaded:
            self._script_sha()

    def _script_sha(self) -> str:
        """Load the script (on every primary of a cluster); its SHA-1, which names it."""
        try:
            sha = str(self.client.script_load(SCRIPT))
        except (RedisConnectionError, RedisTimeoutError) as e:
            raise RetryableSinkError(f"Redis unreachable: {e}") from e
        except RedisError as e:
            raise SinkError(f"Redis refused the write script: {e}") from e
        if sha != SCRIPT_SHA:
            raise SinkError(f"Redis names the write script {sha}, not its SHA-1 {SCRIPT_SHA}")
        self._script_loaded = True
        self.script_loads += 1
        return sha

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
        self._load_script()
        pipe.execute_command("EVALSHA", SCRIPT_SHA, 1, self.watermark_key(job), "w", stored)
        reply = self._execute(pipe, raise_on_error=False)[0]
        if isinstance(reply, NoScriptError):
            self._script_loaded = False
            self.record_watermark(job, lsn)
        elif isinstance(reply, Exception):
            raise SinkError(f"Redis refused the watermark of {job}: {reply}") from reply
        elif reply == 1:  # it advanced: a second key, as the watermark's holds only digits
            at_ms = int(time.time() * 1000)
            key = redis_watermark_time_key(self.key_prefix, job)
            self._read(lambda: self.client.set(key, str(at_ms)))

    def read_watermark(self, job: str) -> int | None:
        """The recorded watermark of ``job``, or None."""
        raw = self._read(lambda: self.client.get(self.watermark_key(job)))
        return int(raw) if raw is not None else None

    def read_watermark_time(self, job: str) -> float | None:
        """When ``job``'s watermark last advanced (Unix seconds), or None."""
        key = redis_watermark_time_key(self.key_prefix, job)
        raw = self._read(lambda: self.client.get(key))
        return int(raw) / 1000 if raw is not None else None

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


def hash_fields(values: Mapping[str, Any]) -> bytes:
    """A row's hash fields as the script takes them (:data:`_Call`): each column's name then
    its value as JSON text, framed as RESP bulk strings; what the native path renders of a
    document (:data:`sinks.base.Rendered`) is the same bytes."""
    dumps = orjson.dumps
    pairs = []
    for name, value in values.items():
        n, v = name.encode(), dumps(value)
        pairs.append(_FIELD % (len(n), n, len(v), v))
    return b"".join(pairs)


def _framed(data: bytes) -> bytes:
    """One argument framed as a RESP bulk string."""
    return _BULK % (len(data), data)


def _call_bytes(call: _Call) -> int:
    """What a script call weighs in a pipeline: its keys' and arguments' bytes."""
    return sum(map(len, call[2]))


def _refused(table: str) -> bool:
    """Whether ``table`` is no table id this follower takes (see the module's layout)."""
    return ":" in table or table.count(".") != 1


def _check_table(table: str) -> None:
    if _refused(table):
        raise SinkError(f"table {table!r} must be a table id <schema>.<table> without ':'")
