"""The Redis follower's stored versions and the compare-and-set script that writes rows.

A version is stored as the commit LSN in 20 decimal digits then the ordinal in 10, so that
stored versions compare exactly as text (Lua numbers are doubles and hold only 53 bits; the
script compares 15 digits at a time). See :mod:`sinks.cache` for the key layout.
"""

from __future__ import annotations

import hashlib
from enum import IntEnum
from typing import Final

from pgcdc.core.contract import VersionOrder

_LSN_DIGITS: Final = 20
_ORDER_DIGITS: Final = 10
MAX_LSN: Final = (1 << 64) - 1
MAX_ORDER: Final = 10**_ORDER_DIGITS - 1
# A version as the script gets it: ``% (commit LSN, order)``, each in range, makes
# VERSION_LENGTH bytes (:func:`version_bytes`).
VERSION_FORMAT: Final = b"%%0%dd%%0%dd" % (_LSN_DIGITS, _ORDER_DIGITS)
VERSION_LENGTH: Final = _LSN_DIGITS + _ORDER_DIGITS


class Reply(IntEnum):
    """What the script answers for a row write (one character each, see :data:`SCRIPT`)."""

    SKIPPED = ord("0")  # a newer (or the same) version is held
    APPLIED = ord("1")
    APPLIED_WITHOUT_HELD = ord("2")  # a partial change, but no row was held
    CONFLICT = ord("3")  # the JSON merge raced with another write
    REFUSED = ord("e")  # Redis refused a command of the write: its error is in the list


# Many rows a call: a row's write costs Redis little next to the call itself, and the client
# packs and reads one command and one reply instead of one a row.
#
# KEYS: each row's row key then its version key (the watermark key alone for 'w').
# ARGV[1] row TTL (0 = none), ARGV[2] tombstone TTL, then for each row:
#   op: 'h' hash row, 'hp' hash partial, 'j' JSON row, 'jp' JSON merged row, 'd' delete;
#   version;
#   for 'jp' the held version the merge used ('' = none), else '*';
#   n, how many of the row's arguments follow: for hash ops each column's name then its value
#   as JSON text (two a column), handed to HSET as they are; for JSON ops the row as JSON
#   (one); for 'd' none. Each its own argument, the script cuts nothing out of a payload
#   and decodes nothing (the names as a JSON array and the values after NUL bytes, cut apart
#   here, cost Redis 1.1 µs more a row of the benchmarks' 10 columns, 7.6 against 6.5).
# Answers {codes, errors}: a character per row (Reply), and the error of each refused row,
#   in order (a refused command fails its row alone, as it did with a call a row).
# The watermark: ARGV[1] 'w', ARGV[2] the LSN; answers 1 if it advanced, else 0.
SCRIPT: Final = """
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

if ARGV[1] == 'w' then
  if newer(ARGV[2], redis.call('GET', KEYS[1])) then
    redis.call('SET', KEYS[1], ARGV[2])
    return 1
  end
  return 0
end

local ttl, tombstone_ttl = tonumber(ARGV[1]), ARGV[2]

-- The row's n arguments after its first four are ARGV[at] .. ARGV[at + n - 1].
local function write(row, vkey, op, version, expected, at, n)
  local held = redis.call('GET', vkey)
  if not newer(version, held) then return '0' end
  if op == 'd' then
    redis.call('DEL', row)
    redis.call('SET', vkey, version, 'EX', tombstone_ttl)
    return '1'
  end
  if expected ~= '*' and expected ~= (held or '') then return '3' end
  local existed = 1  -- asked only where the answer tells: a partial row
  if op == 'hp' or op == 'jp' then existed = redis.call('EXISTS', row) end
  if op == 'h' then
    redis.call('DEL', row)
  end
  if op == 'h' or op == 'hp' then
    if n > 0 then redis.call('HSET', row, unpack(ARGV, at, at + n - 1)) end
  else
    redis.call('SET', row, ARGV[at])
  end
  if ttl > 0 then
    redis.call('EXPIRE', row, ttl)
    redis.call('SET', vkey, version, 'EX', ttl)
  else
    redis.call('SET', vkey, version)
  end
  if (op == 'hp' or op == 'jp') and existed == 0 then return '2' end
  return '1'
end

local codes, errors = {}, {}
local at = 3
for i = 1, #KEYS / 2 do
  local n = tonumber(ARGV[at + 3])
  local ok, result = pcall(
    write, KEYS[2 * i - 1], KEYS[2 * i], ARGV[at], ARGV[at + 1], ARGV[at + 2], at + 4, n)
  at = at + 4 + n
  if ok then
    codes[i] = result
  else
    codes[i] = 'e'
    errors[#errors + 1] = type(result) == 'table' and result.err or tostring(result)
  end
end
return {table.concat(codes), errors}
"""


# What EVALSHA names the script by (Redis's SHA-1 of its text): known without asking Redis,
# so a call can be packed before the script is loaded and sent again as it is after a reload.
SCRIPT_SHA: Final = hashlib.sha1(SCRIPT.encode()).hexdigest()


def version_string(version: VersionOrder) -> str:
    """The stored form of a version: 20-digit LSN then 10-digit ordinal."""
    return version_bytes(*version).decode()


def version_bytes(commit_lsn: int, order: int) -> bytes:
    """:func:`version_string` as the bytes the script gets."""
    if not 0 <= commit_lsn <= MAX_LSN:
        raise ValueError(f"commit LSN {commit_lsn} is outside 0..2**64-1")
    if not 0 <= order <= MAX_ORDER:
        raise ValueError(f"order {order} is outside 0..{MAX_ORDER}")
    return VERSION_FORMAT % (commit_lsn, order)


def parse_version(stored: str | bytes) -> VersionOrder:
    """The version held in a stored version string."""
    text = stored.decode() if isinstance(stored, bytes) else stored
    return VersionOrder(int(text[:_LSN_DIGITS]), int(text[_LSN_DIGITS:]))


def watermark_string(lsn: int) -> str:
    """The stored form of a watermark LSN: 20 digits, so the script compares it exactly."""
    if not 0 <= lsn <= MAX_LSN:
        raise ValueError(f"watermark LSN {lsn} is outside 0..2**64-1")
    return f"{lsn:0{_LSN_DIGITS}d}"
