"""Followers that fell behind the shared job (spark_jobs/sync.py), and the Kafka range each
must catch up on.

The rule: a follower left out of batch ``b`` (it stayed unreachable for
``spark.follower_behind_after_s`` while another follower applied ``b``) is *behind since*
``b``'s start offsets, and leaves out every later batch until it answers again. Then, before
batch ``c`` applies to it, it replays the Kafka range [behind-since, ``c``'s start) alone;
with ``c`` it has every record before ``c``'s end again, and its watermark may advance.
A long range is read in steps of a batch's size (:func:`catch_up_step`), one a batch, so the
other followers wait for one step at a time; the behind-since offsets move on after each.

Why nothing is lost. Batch ``c`` starts at ``c - 1``'s end offsets, which Spark wrote to the
checkpoint's offsets log (``offsets/<c-1>``; ``sources/0/0``, the query's initial offsets,
for ``c = 0``) before it ran ``c - 1``: read from there, the offsets are the ones the
stream used, exactly, after a restart too. Batches are contiguous, so [since, ``c``'s start)
is every batch the follower missed. A partition new since then starts at its earliest
offset (it held nothing before); a compacted record gone from the range was superseded by
a newer one of its key, which the range or a later batch holds. Replaying a record the
follower already has is harmless: every write carries its LSN-derived version.

The state lives in ``<checkpoint>/followers-behind.json`` (written whole to a temporary file,
then renamed over the old one), so a restart still knows who is behind since where. The
checkpoint directory must be a local path for it (``file:`` URIs too).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from pgcdc.core.errors import ConfigError

# topic -> partition (as Spark writes it: a string) -> offset
Offsets = dict[str, dict[str, int]]

STATE_FILE = "followers-behind.json"
EARLIEST = -2  # Spark's Kafka source: the partition's earliest offset


@dataclass(frozen=True)
class Behind:
    """A follower left out since batch ``since_batch``, which started at ``offsets``."""

    since_batch: int
    offsets: Offsets


def local_dir(checkpoint: str) -> Path:
    """The checkpoint as a local directory (``file:`` URIs too); ConfigError for others."""
    if checkpoint.startswith("file:"):
        checkpoint = checkpoint[len("file:") :]
        while checkpoint.startswith("//"):
            checkpoint = checkpoint[1:]
    elif "://" in checkpoint:
        raise ConfigError(
            f"the checkpoint {checkpoint} is not a local directory: spark_jobs/sync.py with "
            "several followers keeps who is behind there (give --checkpoint a local or "
            "mounted path)"
        )
    return Path(checkpoint)


def load(checkpoint: Path) -> dict[str, Behind]:
    """The followers behind, by job name (none when the file is missing)."""
    try:
        raw = orjson.loads((checkpoint / STATE_FILE).read_bytes())
    except FileNotFoundError:
        return {}
    return {job: Behind(int(b["since_batch"]), _offsets(b["offsets"])) for job, b in raw.items()}


def save(checkpoint: Path, state: dict[str, Behind]) -> None:
    """Write ``state`` atomically (a reader sees the old file or the new one, whole)."""
    checkpoint.mkdir(parents=True, exist_ok=True)
    body = orjson.dumps(
        {job: {"since_batch": b.since_batch, "offsets": b.offsets} for job, b in state.items()},
        option=orjson.OPT_SORT_KEYS,
    )
    fd, tmp = tempfile.mkstemp(dir=checkpoint, prefix=f".{STATE_FILE}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, checkpoint / STATE_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def logged_offsets(text: str) -> Offsets:
    """The Kafka offsets of one entry of Spark's offsets log (``offsets/<n>``: ``v1``, the
    batch's metadata, then a line per source) or of the initial offsets (``sources/0/0``:
    a NUL, ``v1``, the offsets). The jobs read one source."""
    lines = [line for line in text.lstrip("\x00").splitlines() if line.strip()]
    if not lines or not lines[0].startswith("v"):
        raise ValueError("not a Spark offsets log entry")
    last = orjson.loads(lines[-1])
    if not isinstance(last, dict):
        raise ValueError("the entry holds no Kafka offsets")
    return _offsets(last)


def batch_start(checkpoint: Path, batch_id: int, read_from: Offsets | None = None) -> Offsets:
    """The offsets batch ``batch_id`` of the query checkpointed at ``checkpoint`` starts
    at: the previous batch's end, or the query's initial offsets for the first. Only the
    Kafka source writes those (``sources/0/0``); with the direct read the first batch's
    start is its end (``offsets/0``) where it read nothing, and where it read, the ranges'
    starts (``read_from``); without those, every partition's earliest offset (none given:
    see :func:`catch_up_range`), which holds at least what it read."""
    if batch_id == 0:
        initial = checkpoint / "sources" / "0" / "0"
        if initial.exists():
            return logged_offsets(initial.read_text(errors="replace"))
        if read_from is None:
            return {}
        end = logged_offsets((checkpoint / "offsets" / "0").read_text(errors="replace"))
        return {t: {**parts, **read_from.get(t, {})} for t, parts in end.items()}
    entry = checkpoint / "offsets" / str(batch_id - 1)
    return logged_offsets(entry.read_text(errors="replace"))


def catch_up_range(since: Offsets, until: Offsets) -> tuple[Offsets, Offsets] | None:
    """(starting, ending) offsets of the records at or after ``since`` and before
    ``until``, over ``until``'s partitions (a partition ``since`` lacks starts at its
    earliest offset); None when the range is empty."""
    start: Offsets = {}
    end: Offsets = {}
    for topic, parts in until.items():
        for part, last in parts.items():
            first = since.get(topic, {}).get(part, EARLIEST)
            if first != EARLIEST and first >= last:
                continue
            start.setdefault(topic, {})[part] = first
            end.setdefault(topic, {})[part] = last
    return (start, end) if end else None


def catch_up_step(start: Offsets, end: Offsets, most: int) -> Offsets:
    """Where the first step of the range [``start``, ``end``) stops so that it reads about
    ``most`` records at most: each partition's share (``most`` split evenly, at least one
    record). A partition starting at its earliest offset is read whole (its first offset
    is not known here)."""
    parts = sum(len(p) for p in end.values())
    share = max(1, most // max(1, parts))
    return {
        topic: {
            part: last if start[topic][part] == EARLIEST else min(last, start[topic][part] + share)
            for part, last in ps.items()
        }
        for topic, ps in end.items()
    }


def advanced(since: Offsets, reached: Offsets) -> Offsets:
    """``since`` moved on to ``reached`` where that says (a step of the catch-up done)."""
    out = {topic: dict(parts) for topic, parts in since.items()}
    for topic, parts in reached.items():
        out.setdefault(topic, {}).update(parts)
    return out


def records_between(start: Offsets, end: Offsets) -> int | None:
    """How many offsets lie in [``start``, ``end``) (None if a start is the earliest)."""
    total = 0
    for topic, parts in end.items():
        for part, last in parts.items():
            first = start.get(topic, {}).get(part, EARLIEST)
            if first == EARLIEST:
                return None
            total += max(0, last - first)
    return total


def _offsets(raw: Any) -> Offsets:
    return {str(t): {str(p): int(o) for p, o in parts.items()} for t, parts in raw.items()}
