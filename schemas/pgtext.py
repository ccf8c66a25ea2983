"""Parsers for PostgreSQL's text output of values (what pgoutput and COPY text send).

Pure functions, no I/O. They follow the server's output functions with the default
settings DateStyle=ISO and IntervalStyle=postgres, which the reader's sessions use.
"""

from __future__ import annotations

import re
from decimal import Decimal

from pgcdc.core.errors import SchemaError

_MICROS_PER_DAY = 86_400_000_000


def days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (astronomical year numbering)."""
    # Howard Hinnant's algorithm: exact for any year, including far negative ones.
    y = year - (month <= 2)
    era = y // 400  # floor division, so no C-style adjustment
    yoe = y - era * 400
    mp = (month + 9) % 12
    doy = (153 * mp + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def civil_from_days(days: int) -> tuple[int, int, int]:
    """Inverse of :func:`days_from_civil`."""
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    y = yoe + era * 400
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    return y + (m <= 2), m, d


_DATE = re.compile(r"(\d{4,})-(\d\d)-(\d\d)")
_TIME = re.compile(r"(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?")
_OFFSET = re.compile(r"([+-])(\d\d)(?::?(\d\d))?(?::?(\d\d))?")
_TS = re.compile(
    r"(\d{4,})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?"
    r"(?:([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?)?( BC)?"
)


def _fraction_micros(frac: str | None) -> int:
    return int((frac + "00000")[:6]) if frac else 0


def _astronomical(year: int, bc: bool) -> int:
    # 1 BC is year 0, 2 BC is year -1.
    return 1 - year if bc else year


def parse_date(text: str) -> int:
    """``date`` text → days since the epoch."""
    bc = text.endswith(" BC")
    m = _DATE.fullmatch(text[:-3] if bc else text)
    if m is None:
        raise SchemaError(f"not a date: {text!r}")
    return days_from_civil(_astronomical(int(m[1]), bc), int(m[2]), int(m[3]))


def parse_time(text: str) -> int:
    """``time`` text → microseconds past midnight (24:00:00 is 86,400,000,000)."""
    m = _TIME.fullmatch(text)
    if m is None:
        raise SchemaError(f"not a time: {text!r}")
    return (int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3])) * 1_000_000 + _fraction_micros(m[4])


def _offset_seconds(sign: str | None, hh: str | None, mm: str | None, ss: str | None) -> int:
    if sign is None or hh is None:
        return 0
    secs = int(hh) * 3600 + int(mm or 0) * 60 + int(ss or 0)
    return -secs if sign == "-" else secs


def parse_timetz(text: str) -> tuple[int, int]:
    """``timetz`` text → (microseconds past midnight, offset seconds east of UTC)."""
    m = _TIME.match(text)
    if m is None:
        raise SchemaError(f"not a time with time zone: {text!r}")
    o = _OFFSET.fullmatch(text, m.end())
    if o is None:
        raise SchemaError(f"not a time with time zone: {text!r}")
    micros = (int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3])) * 1_000_000 + _fraction_micros(m[4])
    return micros, _offset_seconds(o[1], o[2], o[3], o[4])


def parse_timestamp(text: str) -> int:
    """``timestamp`` or ``timestamptz`` text → microseconds since the epoch (UTC).

    Infinity is not handled here; callers map it first.
    """
    m = _TS.fullmatch(text)
    if m is None:
        raise SchemaError(f"not a timestamp: {text!r}")
    days = days_from_civil(_astronomical(int(m[1]), m[12] is not None), int(m[2]), int(m[3]))
    secs = int(m[4]) * 3600 + int(m[5]) * 60 + int(m[6]) - _offset_seconds(m[8], m[9], m[10], m[11])
    return days * _MICROS_PER_DAY + secs * 1_000_000 + _fraction_micros(m[7])


def iso_year(year: int) -> str:
    """A year the way java.time's ISO formatters print it (sign beyond 4 digits)."""
    if year > 9999:
        return f"+{year}"
    if year < 0:
        return f"-{-year:04d}"
    return f"{year:04d}"


def format_fraction(micros: int, width: int | None) -> str:
    """The fraction of a second: exactly ``width`` digits, or the fewest (none for zero)."""
    if width is not None and width > 0:
        return "." + f"{micros:06d}"[:width].ljust(width, "0")
    if micros == 0:
        return ""
    return "." + f"{micros:06d}".rstrip("0")


def format_utc_timestamp(epoch_micros: int, width: int | None) -> str:
    """Epoch microseconds → ISO-8601 UTC like Debezium's ZonedTimestamp."""
    days, rem = divmod(epoch_micros, _MICROS_PER_DAY)
    y, mo, d = civil_from_days(days)
    secs, micros = divmod(rem, 1_000_000)
    h, rest = divmod(secs, 3600)
    mi, s = divmod(rest, 60)
    return (
        f"{iso_year(y)}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}{format_fraction(micros, width)}Z"
    )


def format_utc_time(micros_of_day: int) -> str:
    """Microseconds past midnight (UTC) → ``HH:MM:SS[.f]Z`` like java's ISO_OFFSET_TIME."""
    secs, micros = divmod(micros_of_day, 1_000_000)
    h, rest = divmod(secs, 3600)
    mi, s = divmod(rest, 60)
    return f"{h:02d}:{mi:02d}:{s:02d}{format_fraction(micros, None)}Z"


# The element delimiter of every built-in type's arrays but box's (pg_type.typdelim).
ARRAY_DELIMITER = ","
BOX_ARRAY_DELIMITER = ";"  # a box's own text holds commas: "(1,1),(0,0)"


def parse_array(text: str, delimiter: str = ARRAY_DELIMITER) -> list[object]:
    """An array literal (``{1,2,NULL}``, ``{{"a b",c}}``) → nested lists of ``str | None``.

    ``delimiter`` is the element type's ``typdelim``: ``;`` for ``box``, ``,`` otherwise.
    """
    if text.startswith("["):  # explicit bounds, e.g. "[0:1]={1,2}"
        text = text[text.index("=") + 1 :]
    pos, out = _parse_array_at(text, 0, delimiter)
    if pos != len(text):
        raise SchemaError(f"trailing characters after array literal: {text!r}")
    return out


def _parse_array_at(text: str, pos: int, delimiter: str) -> tuple[int, list[object]]:
    if pos >= len(text) or text[pos] != "{":
        raise SchemaError(f"not an array literal: {text!r}")
    pos += 1
    items: list[object] = []
    if text[pos : pos + 1] == "}":
        return pos + 1, items
    n = len(text)
    stops = (delimiter, "}")
    while pos < n:
        c = text[pos]
        if c == "{":
            pos, sub = _parse_array_at(text, pos, delimiter)
            items.append(sub)
        elif c == '"':
            pos += 1
            buf: list[str] = []
            while pos < n and text[pos] != '"':
                if text[pos] == "\\":
                    pos += 1
                buf.append(text[pos])
                pos += 1
            pos += 1
            items.append("".join(buf))
        else:
            end = pos
            while end < n and text[end] not in stops:
                end += 1
            token = text[pos:end]
            items.append(None if token == "NULL" else token)
            pos = end
        if pos >= n:
            break
        if text[pos] == delimiter:
            pos += 1
        elif text[pos] == "}":
            return pos + 1, items
        else:
            raise SchemaError(f"malformed array literal: {text!r}")
    raise SchemaError(f"unterminated array literal: {text!r}")


def parse_hstore(text: str) -> list[tuple[str, str | None]]:
    """``hstore`` text (``"a"=>"1", "b"=>NULL``) → pairs in the server's order."""
    pairs: list[tuple[str, str | None]] = []
    pos, n = 0, len(text)

    def quoted(p: int) -> tuple[int, str]:
        buf: list[str] = []
        p += 1
        while p < n and text[p] != '"':
            if text[p] == "\\":
                p += 1
            buf.append(text[p])
            p += 1
        if p >= n:
            raise SchemaError(f"unterminated hstore string: {text!r}")
        return p + 1, "".join(buf)

    while pos < n:
        while pos < n and text[pos] in " ,":
            pos += 1
        if pos >= n:
            break
        if text[pos] != '"':
            raise SchemaError(f"malformed hstore: {text!r}")
        pos, key = quoted(pos)
        if text[pos : pos + 2] != "=>":
            raise SchemaError(f"malformed hstore: {text!r}")
        pos += 2
        if text.startswith("NULL", pos):
            pairs.append((key, None))
            pos += 4
        else:
            pos, val = quoted(pos)
            pairs.append((key, val))
    return pairs


_INTERVAL_UNIT = re.compile(r"([+-]?\d+) (years|year|mons|mon|days|day)")
_INTERVAL_TIME = re.compile(r"([+-])?(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?")


def parse_interval(text: str) -> tuple[int, int, int, int, int, Decimal]:
    """``interval`` text (IntervalStyle=postgres) → (years, months, days, hours, minutes, seconds).

    Like the JDBC driver's PGInterval: the time part's sign applies to hours, minutes, seconds.
    """
    years = months = days = hours = minutes = 0
    seconds = Decimal(0)
    pos, n = 0, len(text)
    while pos < n:
        if text[pos] == " ":
            pos += 1
            continue
        m = _INTERVAL_UNIT.match(text, pos)
        if m is not None:
            v, unit = int(m[1]), m[2]
            if unit.startswith("year"):
                years = v
            elif unit.startswith("mon"):
                months = v
            else:
                days = v
            pos = m.end()
            continue
        t = _INTERVAL_TIME.match(text, pos)
        if t is None:
            raise SchemaError(f"not an interval (IntervalStyle postgres expected): {text!r}")
        sign = -1 if t[1] == "-" else 1
        hours = sign * int(t[2])
        minutes = sign * int(t[3])
        seconds = sign * Decimal(f"{t[4]}.{t[5] or '0'}")
        pos = t.end()
    return years, months, days, hours, minutes, seconds
