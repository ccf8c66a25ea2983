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


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds of ``30s``, ``10m``, ``1h``, ``1h30m``, ``500ms`` or a bare number of seconds;
    ValueError (saying what is accepted) for anything else, or for no time at all."""
    import re

    t = text.strip().lower()
    try:
        seconds = float(t)
    except ValueError:
        parts = re.findall(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)", t)
        if not parts or re.sub(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)|\s", "", t):
            raise ValueError(
                f"{text!r} is not a duration: a number and a unit (ms, s, m, h, d), "
                "e.g. 30s, 10m, 1h, 1h30m"
            ) from None
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"{text!r} is not a duration above zero")
    return seconds
