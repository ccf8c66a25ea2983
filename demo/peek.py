"""Print the last events of a topic: ``python -m demo.peek <topic> [n]`` (default 3).

Shows each record's key and the Debezium payload's op, before and after (long values cut).
"""

from __future__ import annotations

import json
import sys

from confluent_kafka import Consumer, TopicPartition

from pgcdc.core.settings import load_settings


def _short(v: object) -> object:
    if isinstance(v, dict):
        return {k: _short(x) for k, x in v.items()}
    if isinstance(v, str) and len(v) > 60:
        return v[:57] + "..."
    return v


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    topic, n = argv[0], int(argv[1]) if len(argv) > 1 else 3
    settings = load_settings()
    c = Consumer(
        {
            "bootstrap.servers": settings.kafka.bootstrap_servers,
            "group.id": "demo-peek",
            "enable.auto.commit": False,
        }
    )
    try:
        md = c.list_topics(topic, timeout=10).topics.get(topic)
        if md is None or md.error is not None:
            print(f"error: no topic {topic}", file=sys.stderr)
            return 1
        parts = []
        for p in md.partitions:
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            parts.append(TopicPartition(topic, p, max(low, high - n)))
        c.assign(parts)
        wanted = sum(min(n, c.get_watermark_offsets(tp, timeout=10)[1] - tp.offset) for tp in parts)
        got = 0
        while got < wanted:
            msg = c.poll(10)
            if msg is None:
                break
            if msg.error():
                print(f"error: {msg.error()}", file=sys.stderr)
                return 1
            got += 1
            raw_key, raw_value = msg.key(), msg.value()
            key = json.loads(raw_key) if raw_key else None
            value = json.loads(raw_value) if raw_value else None
            payload = value.get("payload", value) if isinstance(value, dict) else value
            shown = (
                "tombstone"
                if payload is None
                else {k: _short(payload.get(k)) for k in ("op", "before", "after")}
            )
            key_payload = key.get("payload", key) if isinstance(key, dict) else key
            print(f"offset {msg.offset()} key {json.dumps(key_payload)}: {json.dumps(shown)}")
        return 0
    finally:
        c.close()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
