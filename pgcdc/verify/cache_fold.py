"""A table's rows as Redis holds them, put together inside Redis and folded here.

One Lua script scans the table's row keys and, given the table's columns (sorted, with each
name's JSON text), puts each row's hash fields together as ``{"a":<a's field>,…}``: the
bytes ``orjson.dumps`` gives the sorted document (:func:`pgcdc.core.row_digest.canonical`), as
each field holds ``orjson.dumps`` of its column's value. A field that is missing, one too
many (``HLEN``) or a key that is no hash mark the text with a byte no JSON holds
(``\\xff``), so such a row never folds like PostgreSQL's. The digest is computed here from
what Redis holds, not kept beside it: a field changed by another client is seen.

Why the split: the fields are put together where they are (one reply of a few thousand
rows' texts a call, instead of a reply per row to parse), and hashed here, where SHA-1 is
OpenSSL's (several times faster than the script's ``redis.sha1hex``; Redis's one thread
serves the cache meanwhile). Each call scans until ``budget`` keys were looked at, a few
milliseconds of Redis's time, and answers ``cursor, keys looked at`` then ``id, text`` per
row: every row (a fold), or those in the buckets marked ``1`` in a map of a byte per bucket
(the rows of differing buckets; the script hashes the ids to tell).

``SCAN`` may return a key twice: a fold then differs, and the row-by-row comparison of that
bucket (ids deduplicated) finds the rows equal. Standalone Redis only: in Redis Cluster a
script may touch only the keys it is given (the caller reads rows back instead).
"""

from __future__ import annotations

import hashlib
import queue
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any, Final

import orjson
from redis.exceptions import NoScriptError

from pgcdc.core import native
from pgcdc.core.row_digest import BUCKET_BITS, Folds, fold_into, folded_text

SCRIPT: Final = r"""
local cursor, match, count, budget = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local plen, map, n, div = tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])
local names, pre = {}, {}
for i = 1, n do
  names[i] = ARGV[8 + i]
  pre[i] = (i > 1 and ',' or '{') .. ARGV[8 + n + i] .. ':'
end
local parts, out, j, seen = {}, {0, 0}, 2, 0
repeat
  local got = redis.call('SCAN', cursor, 'MATCH', match, 'COUNT', count)
  cursor = got[1]
  for _, k in ipairs(got[2]) do
    seen = seen + 1
    local id = string.sub(k, plen + 1)
    if map == '' or
        string.byte(map, math.floor(tonumber(string.sub(redis.sha1hex(id), 1, 8), 16) / div) + 1)
        == 49 then
      local text
      if n == 0 then
        local len = redis.pcall('HLEN', k)
        if type(len) == 'number' and len == 0 then text = '{}' else text = '{}\255' end
      else
        local vals = redis.pcall('HMGET', k, unpack(names))
        if type(vals) ~= 'table' or vals.err then
          text = '\255'
        else
          local m = 0
          for i = 1, n do
            parts[m + 1] = pre[i]
            parts[m + 2] = vals[i] or '\255'
            m = m + 2
          end
          parts[m + 1] = '}'
          text = table.concat(parts, '', 1, m + 1)
          if redis.call('HLEN', k) ~= n then text = text .. '\255' end
        end
      end
      out[j + 1] = id
      out[j + 2] = text
      j = j + 2
    end
  end
until cursor == '0' or seen >= budget
out[1] = cursor
out[2] = seen
return out
"""
SCRIPT_SHA: Final = hashlib.sha1(SCRIPT.encode(), usedforsecurity=False).hexdigest()

BUDGET: Final = 2000  # keys a call looks at, at least (a few ms of Redis's time)
SCAN_COUNT: Final = 1000


def glob(text: str) -> str:
    """``text`` as a literal ``SCAN MATCH`` pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _marks(buckets: frozenset[int] | None) -> bytes:
    """A byte a bucket, ``1`` for those in ``buckets`` (empty for None: every row)."""
    if buckets is None:
        return b""
    chosen = bytearray(b"0" * (1 << BUCKET_BITS))
    for b in buckets:
        chosen[b] = ord("1")
    return bytes(chosen)


def _args(prefix: str, names: Sequence[str], buckets: frozenset[int] | None) -> list[Any]:
    ordered = sorted(names)
    return [
        glob(prefix) + "*",
        SCAN_COUNT,
        BUDGET,
        len(prefix.encode()),
        _marks(buckets),
        len(ordered),
        1 << (32 - BUCKET_BITS),
        *ordered,
        *(orjson.dumps(n) for n in ordered),
    ]


def _calls(client: Any, args: list[Any]) -> Iterator[list[Any]]:
    """The script's answers, call after call, until the scan ends."""
    cursor: Any = b"0"
    first = True
    while first or cursor not in (b"0", "0", 0):
        first = False
        try:
            got = client.evalsha(SCRIPT_SHA, 0, cursor, *args)
        except NoScriptError:  # load it once, then call again
            client.script_load(SCRIPT)
            got = client.evalsha(SCRIPT_SHA, 0, cursor, *args)
        cursor = got[0]
        yield got


def _rows(client: Any, args: list[Any], took: Any) -> Iterator[tuple[bytes, bytes]]:
    """Each row's id and text, as the script gives them, until the scan ends. The next call
    is made by a thread of its own while this one's rows are hashed, so Redis does not wait
    for the hashing (nor the hashing for Redis)."""
    answers: queue.Queue[Any] = queue.Queue(maxsize=2)
    stop = threading.Event()

    def fetch() -> None:
        try:
            for got in _calls(client, args):
                while not stop.is_set():
                    try:
                        answers.put(got, timeout=0.5)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            answers.put(None)
        except BaseException as e:  # raised by the reader below
            answers.put(e)

    fetcher = threading.Thread(target=fetch, name="verify-cache-scan", daemon=True)
    fetcher.start()
    try:
        while (got := answers.get()) is not None:
            if isinstance(got, BaseException):
                raise got
            if took is not None:
                took(int(got[1]))
            it = iter(got[2:])
            yield from zip(it, it, strict=True)
    finally:
        stop.set()
        fetcher.join(timeout=5)


def _native_pass(
    client: Any, prefix: str, names: Sequence[str], buckets: frozenset[int] | None, took: Any
) -> Any:
    """The pass done by the native module (:mod:`pgcdc.core.native`), on a connection of its
    own: ``SCAN`` and an ``HGETALL`` of each key it gives, pipelined (each request holds the
    next ``SCAN`` first, so its reply comes back while Redis still answers the last
    request's ``HGETALL``: Redis always has the next request waiting), each reply parsed,
    put together as the script puts it, hashed and folded in Rust. Redis spends half the
    time the script costs it (no Lua), and the parse here a tenth of what Python's would.
    Answers the module's ``CacheFold``, done."""
    mod = native.module()
    assert mod is not None
    ordered = sorted(names)
    marks = _marks(buckets)
    state = mod.CacheFold(
        len(prefix.encode()),
        [n.encode() for n in ordered],
        [orjson.dumps(n) for n in ordered],
        (glob(prefix) + "*").encode(),
        SCAN_COUNT,
        marks or None,
    )
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        sock = conn._sock

        def more() -> None:
            data = sock.recv(1 << 20)
            if not data:
                raise ConnectionError("Redis closed the connection in the middle of a scan")
            state.feed(data)

        sock.sendall(state.first())
        expected: deque[tuple[bool, int]] = deque([(True, 0)])
        while expected:
            scans, rows = expected.popleft()
            if scans:
                while (got := state.scan()) is None:
                    more()
                request, scans_next, keys = got
                if took is not None:
                    took(keys)
                if request:
                    sock.sendall(request)
                    expected.append((scans_next, keys))
            while rows:
                rows -= state.rows(rows)
                if rows:
                    more()
    finally:
        # Whatever the conversation left unread goes with the connection.
        conn.disconnect()
        pool.release(conn)
    return state


def _native(client: Any) -> bool:
    """Whether the native pass serves ``client``: the module is installed and the client is
    one standalone server's (a cluster's keys are not one ``SCAN``'s)."""
    return native.module() is not None and hasattr(client, "connection_pool")


def fold(client: Any, prefix: str, names: Sequence[str], took: Any = None) -> Folds:
    """Every row under ``prefix`` (``<key prefix>:<table>:``) folded by bucket; ``took``, if
    given, is told how many keys each call looked at (the pacer)."""
    if _native(client):
        got: Folds = _native_pass(client, prefix, names, None, took).folds()
        return got
    out: Folds = {}
    for key, text in _rows(client, _args(prefix, names, None), took):
        fold_into(out, *folded_text(key, text))
    return out


def rows(
    client: Any, prefix: str, names: Sequence[str], buckets: frozenset[int], took: Any = None
) -> dict[str, int]:
    """Each row id in ``buckets`` and its 60-bit digest (an id that is no UTF-8, which no
    PostgreSQL key gives, with its bytes escaped)."""
    if _native(client):
        state = _native_pass(client, prefix, names, buckets, took)
        return {k.decode(errors="surrogateescape"): d for k, d in state.digests()}
    out: dict[str, int] = {}
    for key, text in _rows(client, _args(prefix, names, buckets), took):
        _b, h1, h2, h3 = folded_text(key, text)
        out[key.decode(errors="surrogateescape")] = (h1 << 40) | (h2 << 20) | h3
    return out
