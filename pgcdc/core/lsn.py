"""``Lsn``: a position in PostgreSQL's write-ahead log, as an immutable comparable value."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pgcdc.core.errors import DecodeError

_MAX: Final = 1 << 64
_new_object = object.__new__
_set_attribute = object.__setattr__
_HEX: Final = frozenset("0123456789abcdefABCDEF")


class LsnFormatError(DecodeError, ValueError):
    """A text LSN is not of the form ``XXXXXXXX/XXXXXXXX``.

    A ValueError too, so callers that validate user input can catch either.
    """


@dataclass(frozen=True, order=True, slots=True)
class Lsn:
    """A WAL position: a 64-bit unsigned byte offset, written ``16/B374D848``."""

    value: int

    def __post_init__(self) -> None:
        # Built for every replicated frame: keep the check to one cheap test.
        v = self.value
        if type(v) is not int or not 0 <= v < _MAX:
            if type(v) is not int:
                raise TypeError(f"Lsn value must be an int, not {type(v).__name__}")
            raise ValueError(f"Lsn value {v} is outside 0 .. 2**64-1")

    @classmethod
    def from_wire(cls, value: int) -> Lsn:
        """An LSN unpacked from the replication protocol (an unsigned 64-bit field, so
        always in range): built without the check, since the stream builds several per
        frame. Equal to ``Lsn(value)``."""
        lsn = _new_object(cls)
        _set_attribute(lsn, "value", value)
        return lsn

    @classmethod
    def parse(cls, text: str) -> Lsn:
        """Parse PostgreSQL's text form, two hex numbers of up to 8 digits: ``16/B374D848``."""
        hi, sep, lo = text.strip().partition("/")
        if (
            not sep
            or not 0 < len(hi) <= 8
            or not 0 < len(lo) <= 8
            or not _HEX.issuperset(hi)
            or not _HEX.issuperset(lo)
        ):
            raise LsnFormatError(
                f"invalid LSN {text!r}: expected two hex numbers like '16/B374D848'"
            )
        return cls((int(hi, 16) << 32) | int(lo, 16))

    def __str__(self) -> str:
        return f"{self.value >> 32:X}/{self.value & 0xFFFFFFFF:X}"

    def __sub__(self, other: Lsn) -> int:
        """Bytes of WAL between two positions (negative if ``other`` is ahead)."""
        if not isinstance(other, Lsn):
            return NotImplemented
        return self.value - other.value

    def __add__(self, n: int) -> Lsn:
        """The position ``n`` bytes further on."""
        if not isinstance(n, int) or isinstance(n, bool):
            return NotImplemented
        return Lsn(self.value + n)


ZERO: Final = Lsn(0)
