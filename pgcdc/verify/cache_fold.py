"""A table's rows folded inside Redis: one Lua script that scans the table's row keys and
computes each row's digest (:mod:`pgcdc.core.row_digest`) from the hash fields Redis holds.

Given the table's columns (sorted, with each name's JSON text), the script puts a row's
fields together as ``{"a":<a's field>,"b":<b's field>,…}``: the bytes ``orjson.dumps`` gives
the sorted document, as each field holds ``orjson.dumps`` of its column's value. A field that
is missing, one too many (``HLEN``) or a key that is no hash mark the text with a byte no
JSON holds (``\\xff``), so such a row never folds like PostgreSQL's. The digest is computed
from what Redis holds, not kept beside it: a field changed by another client is seen.

Each call scans until ``budget`` keys were looked at (a few milliseconds of Redis's time,
which serves the cache in between) and answers:

- ``fold``: ``cursor`` then, per bucket the call met, ``bucket, count, s1, s2, s3`` (the sums
  of the digest parts, exact in a Lua number below 2**33 rows a call);
- ``rows``: ``cursor`` then ``id, digest`` (15 hex digits) of the rows in the buckets marked
  ``1`` in the given map (a byte per bucket).

``SCAN`` may return a key twice: a fold then differs, and the row-by-row comparison of that
bucket (ids deduplicated) finds the rows equal. Standalone Redis only: in Redis Cluster a
script may touch only the keys it is given (the caller reads rows back instead).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any, Final

import orjson
from redis.exceptions import NoScriptError

from pgcdc.core.row_digest import BUCKET_BITS

SCRIPT: Final = r"""
local cursor, match, count, budget = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local plen, mode, map, n = tonumber(ARGV[5]), ARGV[6], ARGV[7], tonumber(ARGV[8])
local div = tonumber(ARGV[9])
local names, pre = {}, {}
for i = 1, n do
  names[i] = ARGV[9 + i]
  pre[i] = (i > 1 and ',' or '{') .. ARGV[9 + n + i] .. ':'
end
local parts = {}
local out, cnt, s1, s2, s3, order, seen = {}, {}, {}, {}, {}, {}, 0
repeat
  local got = redis.call('SCAN', cursor, 'MATCH', match, 'COUNT', count)
  cursor = got[1]
  for _, k in ipairs(got[2]) do
    seen = seen + 1
    local id = string.sub(k, plen + 1)
    local b = math.floor(tonumber(string.sub(redis.sha1hex(id), 1, 8), 16) / div)
    if mode == 'fold' or string.byte(map, b + 1) == 49 then
      local text
      if n == 0 then
        local len = redis.pcall('HLEN', k)
        if type(len) == 'number' and len == 0 then text = '{}' else text = '{}\255' end
      else
        local vals = redis.pcall('HMGET', k, unpack(names))
        if type(vals) ~= 'table' or vals.err then
          text = '\255'
        else
          local j = 0
          for i = 1, n do
            parts[j + 1] = pre[i]
            parts[j + 2] = vals[i] or '\255'
            j = j + 2
          end
          parts[j + 1] = '}'
          text = table.concat(parts, '', 1, j + 1)
          if redis.call('HLEN', k) ~= n then text = text .. '\255' end
        end
      end
      local d = redis.sha1hex(id .. '\0' .. text)
      if mode == 'fold' then
        local c = cnt[b]
        if c == nil then
          cnt[b] = 1
          s1[b] = tonumber(string.sub(d, 1, 5), 16)
          s2[b] = tonumber(string.sub(d, 6, 10), 16)
          s3[b] = tonumber(string.sub(d, 11, 15), 16)
          order[#order + 1] = b
        else
          cnt[b] = c + 1
          s1[b] = s1[b] + tonumber(string.sub(d, 1, 5), 16)
          s2[b] = s2[b] + tonumber(string.sub(d, 6, 10), 16)
          s3[b] = s3[b] + tonumber(string.sub(d, 11, 15), 16)
        end
      else
        out[#out + 1] = id
        out[#out + 1] = string.sub(d, 1, 15)
      end
    end
  end
until cursor == '0' or seen >= budget
if mode == 'fold' then
  local j = 0
  for _, b in ipairs(order) do
    out[j + 1] = b
    out[j + 2] = cnt[b]
    out[j + 3] = s1[b]
    out[j + 4] = s2[b]
    out[j + 5] = s3[b]
    j = j + 5
  end
end
table.insert(out, 1, seen)
table.insert(out, 1, cursor)
return out
"""
SCRIPT_SHA: Final = hashlib.sha1(SCRIPT.encode(), usedforsecurity=False).hexdigest()

BUDGET: Final = 2000  # keys a call looks at, at least (a few ms of Redis's time)
SCAN_COUNT: Final = 1000

# bucket → [count, s1, s2, s3]
Folds = dict[int, list[int]]


def glob(text: str) -> str:
    """``text`` as a literal ``SCAN MATCH`` pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _args(
    prefix: str, names: Sequence[str], mode: str, buckets: frozenset[int] | None
) -> list[Any]:
    ordered = sorted(names)
    size = 1 << BUCKET_BITS
    marks = b""
    if buckets is not None:
        chosen = bytearray(b"0" * size)
        for b in buckets:
            chosen[b] = ord("1")
        marks = bytes(chosen)
    return [
        glob(prefix) + "*",
        SCAN_COUNT,
        BUDGET,
        len(prefix.encode()),
        mode,
        marks,
        len(ordered),
        1 << (32 - BUCKET_BITS),
        *ordered,
        *(orjson.dumps(n) for n in ordered),
    ]


def _calls(client: Any, args: list[Any]) -> Iterator[tuple[int, list[Any]]]:
    """Each call's (keys looked at, answer after the cursor), until the scan ends."""
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
        yield int(got[1]), got[2:]


def fold(client: Any, prefix: str, names: Sequence[str], took: Any = None) -> Folds:
    """Every row under ``prefix`` (``<key prefix>:<table>:``) folded by bucket; ``took``, if
    given, is told how many keys each call looked at (the pacer)."""
    out: Folds = {}
    for seen, flat in _calls(client, _args(prefix, names, "fold", None)):
        if took is not None:
            took(seen)
        it = iter(flat)  # integers: bucket, count, s1, s2, s3, …
        for b, c, s1, s2, s3 in zip(it, it, it, it, it, strict=True):
            got = out.get(b)
            if got is None:
                out[b] = [c, s1, s2, s3]
            else:
                got[0] += c
                got[1] += s1
                got[2] += s2
                got[3] += s3
    return out


def rows(
    client: Any, prefix: str, names: Sequence[str], buckets: frozenset[int], took: Any = None
) -> dict[str, int]:
    """Each row id in ``buckets`` and its 60-bit digest."""
    out: dict[str, int] = {}
    for seen, flat in _calls(client, _args(prefix, names, "rows", buckets)):
        if took is not None:
            took(seen)
        for i in range(0, len(flat), 2):
            key = flat[i].decode() if isinstance(flat[i], bytes) else flat[i]
            out[key] = int(flat[i + 1], 16)
    return out
