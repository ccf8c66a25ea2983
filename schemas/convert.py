"""PostgreSQL text output → Connect values, one function per kind of value.

These are the converters :mod:`schemas.typemap` hands out per column; the row functions
generated in :mod:`schemas.rowfuncs` recognise a few of them (``to_bool``, ``to_float``,
``to_epoch_days``) by identity and inline their common case.
"""

from __future__ import annotations

import base64
import struct
from datetime import date, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

from pgcdc.core.errors import SchemaError
from schemas.connect import Converter, NonFiniteFloat
from schemas.pgtext import (
    days_from_civil,
    format_utc_time,
    format_utc_timestamp,
    parse_date,
    parse_hstore,
    parse_interval,
    parse_time,
    parse_timestamp,
    parse_timetz,
)

# +/-infinity for TIMESTAMP, as Debezium (and pgjdbc's PGStatement) write them, in µs.
TIMESTAMP_POSITIVE_INFINITY_MICROS = 9223372036825200000
TIMESTAMP_NEGATIVE_INFINITY_MICROS = -9223372036832400000
# +/-infinity for DATE: pgjdbc's LocalDate for infinity is -5877611-06-21 (and -22 for
# -infinity); Debezium passes those through, so the epoch days are these.
DATE_POSITIVE_INFINITY_DAYS = days_from_civil(-5877611, 6, 21)
DATE_NEGATIVE_INFINITY_DAYS = days_from_civil(-5877611, 6, 22)
_DAYS_PER_MONTH_AVG = 365.25 / 12.0
_MICROS_PER_DAY = 86_400_000_000
# Connect's INT64 range: a value beyond it is capped (Java's saturating conversions).
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def cap_int64(value: int) -> int:
    """``value`` within the int64 range, capped at its ends."""
    return INT64_MIN if value < INT64_MIN else INT64_MAX if value > INT64_MAX else value


# --- numbers -----------------------------------------------------------------------------


def to_float(text: str) -> float:
    """float4/float8 text; NaN and ±Infinity as :class:`NonFiniteFloat`."""
    v = float(text)
    return v if v - v == 0 else NonFiniteFloat(v)


def to_bool(text: str) -> bool:
    """bool text: the output function's ``t``/``f``, or a ``::text`` cast's ``true``/``false``."""
    if text == "t" or text == "true":
        return True
    if text == "f" or text == "false":
        return False
    raise SchemaError(f"not a boolean: {text!r}")


def unscaled_bytes(unscaled: int) -> bytes:
    """Big-endian two's complement, fewest bytes (java.math.BigInteger.toByteArray).

    Java counts the bits of a negative number without its sign (``-128`` takes 7 bits, so
    one byte ``80``): that is ``~n``'s bit length.
    """
    bits = unscaled.bit_length() if unscaled >= 0 else (~unscaled).bit_length()
    return unscaled.to_bytes(bits // 8 + 1, "big", signed=True)


def bytes_to_unscaled(data: bytes) -> int:
    """The integer of :func:`unscaled_bytes`' bytes."""
    return int.from_bytes(data, "big", signed=True)


def to_decimal(text: str) -> Decimal:
    """numeric text as a Decimal, with a SchemaError for anything else."""
    try:
        return Decimal(text)
    except InvalidOperation as e:
        raise SchemaError(f"not a numeric: {text!r}") from e


def numeric_typmod(typmod: int) -> tuple[int, int] | None:
    """(precision, scale) of a numeric type modifier, None when unconstrained."""
    if typmod < 4:
        return None
    t = typmod - 4
    scale = ((t & 0x7FF) ^ 1024) - 1024  # 11-bit signed since PostgreSQL 15
    return (t >> 16) & 0xFFFF, scale


def decimal_digits(text: str) -> tuple[int, str, int]:
    """(sign, digit string, exponent) of a decimal's text, exactly (no context rounding)."""
    t = to_decimal(text).as_tuple()
    if not isinstance(t.exponent, int):
        raise SchemaError(f"not a finite numeric: {text!r}")
    return t.sign, "".join(map(str, t.digits)) or "0", t.exponent


def scaled_integer(text: str, scale: int) -> int:
    """The unscaled integer of a decimal's text at ``scale``, rounding half up if needed."""
    dot = text.find(".")
    if scale > 0 and dot > 0 and len(text) - dot - 1 == scale and "e" not in text:
        return int(text[:dot] + text[dot + 1 :])  # PostgreSQL renders exactly `scale` digits
    if scale == 0 and dot < 0 and "e" not in text:
        return int(text)
    sign, digits, exp = decimal_digits(text)
    shift = exp + scale
    if shift >= 0:
        unscaled = int(digits) * int(10**shift)
    else:  # more fraction digits than the scale: round half up, like BigDecimal.setScale
        q, r = divmod(int(digits), 10**-shift)
        unscaled = q + (1 if 2 * r >= 10**-shift else 0)
    return -unscaled if sign else unscaled


def variable_scale_digits(text: str) -> tuple[int, int]:
    """(unscaled, scale) of an unconstrained numeric as Debezium's VariableScaleDecimal holds
    it: trailing zeros stripped, the scale never negative, zero at scale 0."""
    sign, digits, exp = decimal_digits(text)
    stripped = digits.rstrip("0")
    if not stripped:
        return 0, 0
    exp += len(digits) - len(stripped)
    unscaled = int(stripped) * 10**exp if exp > 0 else int(stripped)
    return (-unscaled if sign else unscaled), max(0, -exp)


def money_amount(text: str) -> Decimal:
    """money text (lc_monetary=C renders "$1,234.56" and "-$1,234.56") as a Decimal."""
    neg = text.startswith("-") or text.startswith("(")
    digits = "".join(c for c in text if c.isdigit() or c == ".")
    d = to_decimal(digits)
    return -d if neg else d


# --- binary ------------------------------------------------------------------------------


def bit_flag(text: str) -> bool:
    """bit(1) text (``0`` or ``1``) as a boolean, like Debezium."""
    if text == "1":
        return True
    if text == "0":
        return False
    raise SchemaError(f"not a bit(1): {text!r}")


def bits_bytes(text: str) -> bytes:
    """bit(n) / bit varying text as io.debezium.data.Bits: the bit string's number, little
    endian, in the fewest bytes (java.util.BitSet.toByteArray; none when no bit is set)."""
    if text.strip("01"):
        raise SchemaError(f"not a bit string: {text!r}")
    n = int(text, 2) if text else 0
    return n.to_bytes((n.bit_length() + 7) // 8, "little")


def bytea_bytes(text: str) -> bytes:
    """bytea text (hex output) as its bytes."""
    if text.startswith("\\x"):
        return bytes.fromhex(text[2:])
    raise SchemaError("bytea must be rendered with bytea_output=hex (as Debezium requires)")


def bytea_base64(text: str) -> str:
    """bytea text as base64 text (binary.handling.mode=base64)."""
    return base64.b64encode(bytea_bytes(text)).decode("ascii")


def bytea_hex(text: str) -> str:
    """bytea text as plain hex (binary.handling.mode=hex)."""
    return bytea_bytes(text).hex()


# --- time --------------------------------------------------------------------------------

EPOCH_ORDINAL = date(1970, 1, 1).toordinal()


def to_epoch_days(text: str) -> int:
    """date text as days since 1970-01-01 (io.debezium.time.Date)."""
    if len(text) == 10 and text[4] == "-" and text[7] == "-":
        try:  # the common case, in C; anything it refuses takes the exact parser below
            return date.fromisoformat(text).toordinal() - EPOCH_ORDINAL
        except ValueError:
            pass
    if text == "infinity":
        return DATE_POSITIVE_INFINITY_DAYS
    if text == "-infinity":
        return DATE_NEGATIVE_INFINITY_DAYS
    return parse_date(text)


_EPOCH = datetime(1970, 1, 1)
_MICROSECOND = timedelta(microseconds=1)


def _epoch_micros(text: str) -> int:
    """timestamp text as µs since the epoch, exactly (beyond int64 for the last years)."""
    if text == "infinity":
        return TIMESTAMP_POSITIVE_INFINITY_MICROS
    if text == "-infinity":
        return TIMESTAMP_NEGATIVE_INFINITY_MICROS
    if len(text) < 27 and text[4] == "-":  # common case: the C parser
        try:
            return (datetime.fromisoformat(text) - _EPOCH) // _MICROSECOND
        except ValueError:
            pass
    return parse_timestamp(text)


def timestamp_micros(text: str) -> int:
    """timestamp text as µs since the epoch (io.debezium.time.MicroTimestamp); beyond the
    int64 range (after 294247-01-10) capped, as Debezium caps its epoch seconds."""
    return cap_int64(_epoch_micros(text))


def timestamp_millis(text: str) -> int:
    """timestamp text as ms since the epoch (io.debezium.time.Timestamp)."""
    return _epoch_micros(text) // 1000


def time_millis(text: str) -> int:
    """time text as ms since midnight (io.debezium.time.Time)."""
    return parse_time(text) // 1000


def timestamptz_converter(width: int) -> Converter:
    """timestamptz text → ISO-8601 UTC text with ``width`` fraction digits (ZonedTimestamp)."""

    def convert(text: str) -> str:
        n = len(text)
        # Microseconds in full, already UTC: the most common layout, sliced in one go.
        if (
            n == 29
            and width == 6
            and text[19] == "."
            and text.endswith("+00")
            and text[4] == "-"
            and text[10] == " "
        ):
            return f"{text[:10]}T{text[11:26]}Z"
        if text.endswith("+00") and n >= 22 and text[4] == "-" and text[10] == " ":
            # Already UTC (the session's TimeZone): only the layout changes.
            frac = text[20:-3] if n > 22 else ""
            if width > 0:
                frac = "." + (frac + "000000")[:width]
            elif frac:
                frac = "." + frac
            return f"{text[:10]}T{text[11:19]}{frac}Z"
        if text == "infinity" or text == "-infinity":
            return text
        return format_utc_timestamp(parse_timestamp(text), width)

    return convert


def timetz_utc(text: str) -> str:
    """timetz text as UTC time text (io.debezium.time.ZonedTime); ``24:00:00`` is a time of
    day like any other to java.time's OffsetTime, so it wraps to ``00:00:00Z``."""
    micros, offset = parse_timetz(text)
    return format_utc_time((micros - offset * 1_000_000) % _MICROS_PER_DAY)


def interval_micros(text: str) -> int:
    """interval text as µs, months of 30.4375 days (io.debezium.time.MicroDuration)."""
    y, mo, d, h, mi, s = parse_interval(text)
    days = (y * 12 + mo) * _DAYS_PER_MONTH_AVG + d
    secs = ((days * 24.0 + h) * 60.0 + mi) * 60.0 + float(s)
    # Truncated toward zero and capped at the int64 range, like Java's (long) cast.
    return cap_int64(int(secs * 1_000_000.0))


def interval_iso(text: str) -> str:
    """interval text as ISO-8601 duration text (io.debezium.time.Interval)."""
    y, mo, d, h, mi, s = parse_interval(text)
    secs = format(s.normalize(), "f") if s else "0"
    return f"P{y}Y{mo}M{d}DT{h}H{mi}M{secs}S"


# --- other types -------------------------------------------------------------------------


def point_struct(text: str) -> dict[str, Any]:
    """point text as Debezium's Point struct (x, y, and the point's OGC WKB)."""
    if not (text.startswith("(") and text.endswith(")")):
        raise SchemaError(f"not a point: {text!r}")
    xs, ys = text[1:-1].split(",")
    x, y = float(xs), float(ys)
    # Debezium's Point carries the OGC WKB of the point too (little endian, type 1).
    return {"x": x, "y": y, "wkb": struct.pack("<BIdd", 1, 1, x, y), "srid": None}


def hstore_json(text: str) -> str:
    """hstore text as a JSON object's text (hstore.handling.mode=json)."""
    return orjson.dumps(dict(parse_hstore(text))).decode()


def hstore_map(text: str) -> dict[str, str | None]:
    """hstore text as a Connect map of strings (hstore.handling.mode=map)."""
    return dict(parse_hstore(text))
