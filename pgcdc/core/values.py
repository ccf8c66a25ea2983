"""Values shared by the decoder, the snapshotter and the envelope builder."""

from __future__ import annotations

from typing import Final, TypeAlias


class _UnchangedToast:
    """An UPDATE left a TOASTed column untouched, so pgoutput did not send its value.

    It is a value in its own right, never a null: followers must keep what they hold.
    """

    __slots__ = ()
    _instance: _UnchangedToast | None = None

    def __new__(cls) -> _UnchangedToast:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Final = _UnchangedToast()

# One column's value as PostgreSQL sent it: text (pgoutput and COPY text format), raw bytes
# (binary format), None for SQL NULL, or UNCHANGED_TOAST.
RawValue: TypeAlias = "str | bytes | _UnchangedToast | None"
