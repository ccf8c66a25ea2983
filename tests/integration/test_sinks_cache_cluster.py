"""The Redis follower's writer against a real three-master Redis Cluster (started for this
module in a temporary STACK_DIR): every write is one slot, replays and stale writes are
refused, tombstones hold, partial JSON rows merge, and a script lost on every node is loaded
again. Keys with braces in the pk spread over the nodes like any other."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from pgcdc.core.contract import UNAVAILABLE_VALUE_PLACEHOLDER
from pgcdc.core.ports import HOST, REDIS_CLUSTER_PORTS
from pgcdc.stack import common
from pgcdc.stack.redis_cluster import RedisClusterService
from sinks.base import Change
from sinks.cache import CacheSink
from sinks.cache_script import SCRIPT_SHA
from tests.conftest import unique

pytestmark = [pytest.mark.integration, pytest.mark.slow]

T = "public.orders"
# Plain keys, a pk with a whole tag, with a lone '}' (no tag: the slot-tag case), a lone '{'.
KEYS = [str(i) for i in range(60)] + ["{a}", "x}y", "}", "{", "{}", "a{b}c"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterService]:
    paths = common.Paths(stack=tmp_path_factory.mktemp("rc"), cache=common.paths().cache)
    service = RedisClusterService(paths)
    try:
        service.start()
        service.wait_ready()
        yield service
    finally:
        service.stop()


@pytest.fixture(params=["hash", "json"])
def sink(request: pytest.FixtureRequest, cluster: RedisClusterService) -> Iterator[CacheSink]:
    s = CacheSink(cluster.url, unique("rc"), value_mode=request.param, tombstone_ttl_s=600)
    assert isinstance(s.client, RedisCluster)
    yield s
    s.close()


def _rows(lsn: int, **extra: object) -> list[Change]:
    return [Change(T, k, lsn, 0, {"id": k, "v": lsn, **extra}) for k in KEYS]


def test_writes_replays_and_tombstones_on_the_cluster(sink: CacheSink) -> None:
    assert {r.outcome for r in sink.apply(_rows(100))} == {"applied"}
    for k in KEYS:
        assert key_slot(sink.row_key(T, k).encode()) == key_slot(sink.version_key(T, k).encode())
    # The rows are spread over the three masters.
    client = sink.client
    assert isinstance(client, RedisCluster)
    nodes = {client.get_node_from_key(sink.row_key(T, k)).name for k in KEYS}
    assert len(nodes) == 3
    # A replay and an older write change nothing.
    assert {r.outcome for r in sink.apply(_rows(100))} == {"skipped"}
    assert {r.outcome for r in sink.apply(_rows(50))} == {"skipped"}
    assert all(sink.read_row(T, k) == {"id": k, "v": 100} for k in KEYS)
    # Deletes leave tombstones that refuse a late, older insert.
    assert {r.outcome for r in sink.apply([Change(T, k, 200, 0, None) for k in KEYS])} == {
        "applied"
    }
    assert {r.outcome for r in sink.apply(_rows(150))} == {"skipped"}
    assert all(sink.read_row(T, k) is None for k in KEYS)
    assert all(sink.read_version(T, k) == (200, 0) for k in KEYS)
    # The client routed every EVALSHA by its keys itself, never asking a node for them.
    for port in REDIS_CLUSTER_PORTS:
        node = redis.Redis(host=HOST, port=port)
        try:
            stats = node.info("commandstats")
        finally:
            node.close()
        assert "cmdstat_command|getkeys" not in stats
        assert "cmdstat_evalsha" in stats  # every node ran its share


def test_partial_rows_keep_held_values_on_the_cluster(sink: CacheSink) -> None:
    sink.apply(_rows(100, big="held"))
    partial = [
        Change(T, k, 300, 0, {"id": k, "v": 300, "big": UNAVAILABLE_VALUE_PLACEHOLDER},
               frozenset({"big"}))
        for k in KEYS
    ]  # fmt: skip
    assert {r.outcome for r in sink.apply(partial)} == {"applied"}
    assert all(sink.read_row(T, k) == {"id": k, "v": 300, "big": "held"} for k in KEYS)


def test_the_script_is_loaded_again_after_a_flush_on_every_node(sink: CacheSink) -> None:
    sink.apply(_rows(100))
    sha = SCRIPT_SHA
    loads = sink.script_loads
    for port in REDIS_CLUSTER_PORTS:  # every node held the script; now every node forgets it
        node = redis.Redis(host=HOST, port=port)
        try:
            assert node.script_exists(sha) == [True]
            node.script_flush()
            assert node.script_exists(sha) == [False]
        finally:
            node.close()
    assert {r.outcome for r in sink.apply(_rows(400))} == {"applied"}
    assert sink.script_loads == loads + 1  # NOSCRIPT came back, and the script was reloaded
    sink.record_watermark("job", 12345)
    assert sink.read_watermark("job") == 12345


def test_a_call_sent_to_a_slots_old_owner_is_redirected(sink: CacheSink) -> None:
    """The sink sends each call to the node its slot map names: after a reshard it has not
    seen, that node answers MOVED and the client sends the call to the new owner."""
    client = sink.client
    assert isinstance(client, RedisCluster)
    pk = f"moved-{sink.value_mode}"
    row_key = sink.row_key(T, pk)
    assert sink.apply([Change(T, pk, 10, 0, {"id": pk, "v": 10})])[0].outcome == "applied"
    slot = key_slot(row_key.encode())
    owner = client.get_node_from_key(row_key)
    nodes = {port: redis.Redis(host=HOST, port=port) for port in REDIS_CLUSTER_PORTS}
    try:
        ids = {port: node.execute_command("CLUSTER MYID") for port, node in nodes.items()}
        old = nodes[owner.port]
        new_port = next(port for port in REDIS_CLUSTER_PORTS if port != owner.port)
        new = nodes[new_port]
        # Move the slot and its keys (the row's and its version's), as redis-cli --cluster
        # reshard does, behind the sink's back.
        new.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", ids[owner.port])
        old.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", ids[new_port])
        keys = old.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)
        assert len(keys) >= 2
        old.execute_command("MIGRATE", HOST, new_port, "", 0, 5000, "KEYS", *keys)
        for port in (new_port, owner.port, *(p for p in nodes if p not in (new_port, owner.port))):
            nodes[port].execute_command("CLUSTER SETSLOT", slot, "NODE", ids[new_port])
        moved_before = _errorstat(old, "MOVED")
        assert client.get_node_from_key(row_key).port == owner.port  # the sink's map is stale

        assert sink.apply([Change(T, pk, 20, 0, {"id": pk, "v": 20})])[0].outcome == "applied"
        assert _errorstat(old, "MOVED") > moved_before  # the old owner redirected the call
        assert old.execute_command("CLUSTER COUNTKEYSINSLOT", slot) == 0
        assert new.exists(row_key) == 1
        assert sink.read_row(T, pk) == {"id": pk, "v": 20}
        assert sink.read_version(T, pk) == (20, 0)
    finally:
        for node in nodes.values():
            node.close()


def _errorstat(node: redis.Redis, error: str) -> int:
    stats = node.info("errorstats").get(f"errorstat_{error}", {})
    return int(stats.get("count", 0)) if isinstance(stats, dict) else 0


def test_a_wrong_address_is_a_retryable_error(tmp_path: Path) -> None:
    from pgcdc.core.errors import RetryableSinkError

    with pytest.raises(RetryableSinkError, match="Redis Cluster unreachable"):
        CacheSink("redis://127.0.0.1:1/0?cluster=true", "x", retries=0)
