"""How long, for a person: one form for every line that says a duration."""

from __future__ import annotations


def duration(seconds: float) -> str:
    """``42s``, ``12m 05s``, ``3h 02m`` (rounded to the second)."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"
