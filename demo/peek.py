"""Print the last events of a topic: ``python -m demo.peek <topic> [n]`` (default 3).

The newest ``n`` of the whole topic, oldest first (``cdc topic tail`` reads them: the last
``n`` of each partition, the newest ``n`` of those kept). Shows each record's partition,
offset, key and the Debezium payload's op, before and after (long values cut).
"""

from __future__ import annotations

import json
import sys

from cdc.topics import TopicRecord, tail
from pgcdc.core.settings import load_settings


def _short(v: object) -> object:
    if isinstance(v, dict):
        return {k: _short(x) for k, x in v.items()}
    if isinstance(v, str) and len(v) > 60:
        return v[:57] + "..."
    return v


def _line(record: TopicRecord) -> str:
    """One line: where the record is, its key, and what the change did."""
    key = json.loads(record.key) if record.key else None
    value = json.loads(record.value) if record.value else None
    payload = value.get("payload", value) if isinstance(value, dict) else value
    shown = (
        "tombstone"
        if payload is None
        else {k: _short(payload.get(k)) for k in ("op", "before", "after")}
    )
    key_payload = key.get("payload", key) if isinstance(key, dict) else key
    where = f"partition {record.partition} offset {record.offset}"
    return f"{where} key {json.dumps(key_payload)}: {json.dumps(shown)}"


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    topic, n = argv[0], int(argv[1]) if len(argv) > 1 else 3
    found = tail(load_settings().kafka, topic, n)
    if not found.exists:
        print(f"error: no topic {topic}", file=sys.stderr)
        return 1
    for record in found.records:
        print(_line(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
