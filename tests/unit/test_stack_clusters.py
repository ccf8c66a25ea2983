"""The clusters of the local stack: their own ports, and each node's configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgcdc.core import ports
from pgcdc.stack import cli, common
from pgcdc.stack.kafka_cluster import KafkaClusterService, voters
from pgcdc.stack.redis_cluster import RedisClusterService

pytestmark = pytest.mark.unit


def _paths(tmp_path: Path) -> common.Paths:
    return common.Paths(stack=tmp_path / "stack", cache=tmp_path / "cache")


def test_cluster_ports_clash_with_nothing() -> None:
    taken = [
        *ports.PORTS.values(),
        ports.KAFKA_CONTROLLER_PORT,
        ports.OPENSEARCH_TRANSPORT_PORT,
        *ports.SECURE_PORTS.values(),
        ports.KAFKA_SECURE_CONTROLLER_PORT,
    ]
    ours = [
        *ports.KAFKA_CLUSTER_PORTS,
        *ports.KAFKA_CLUSTER_CONTROLLER_PORTS,
        *ports.REDIS_CLUSTER_PORTS,
        *ports.REDIS_CLUSTER_BUS_PORTS,
        ports.SPARK_MASTER_PORT,
        ports.SPARK_MASTER_UI_PORT,
        *ports.SPARK_WORKER_PORTS,
        *ports.SPARK_WORKER_UI_PORTS,
    ]
    assert len(set(ours)) == len(ours)
    assert not set(ours) & set(taken)


def test_kafka_nodes_form_one_replicated_cluster(tmp_path: Path) -> None:
    kafka = KafkaClusterService(_paths(tmp_path))
    for i, node in enumerate(kafka.nodes, start=1):
        props = dict(line.split("=", 1) for line in node._properties().splitlines() if "=" in line)
        assert props["node.id"] == str(i)
        assert props["controller.quorum.voters"] == voters()
        assert "controller.quorum.bootstrap.servers" not in props
        assert props["default.replication.factor"] == "3"
        assert props["min.insync.replicas"] == "2"
        assert props["offsets.topic.replication.factor"] == "3"
        assert f"127.0.0.1:{ports.KAFKA_CLUSTER_PORTS[i - 1]}" in props["listeners"]
        assert "-Xmx256m" in node._java()
    assert kafka.bootstrap_servers == ports.KAFKA_CLUSTER_BOOTSTRAP


def test_clusters_start_only_when_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STACK_DIR", str(tmp_path))
    assert [s.name for s in cli._services([])] == list(ports.SERVICES)
    named = cli._services(["kafka-cluster", "redis-cluster"])
    assert [type(s) for s in named] == [KafkaClusterService, RedisClusterService]
    everything = {s.name for s in cli._services([], secure=True, clusters=True)}
    assert set(ports.CLUSTER_SERVICES) <= everything
    assert RedisClusterService(_paths(tmp_path)).url == ports.REDIS_CLUSTER_URL


def test_spark_cluster_status_says_when_no_master_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A port nothing listens on stands for the master's: status says none runs (it said
    "0 workers alive", as if a master had answered)."""
    import socket

    from pgcdc.stack import spark_cluster

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    monkeypatch.setattr(spark_cluster, "SPARK_MASTER_PORT", free)
    assert spark_cluster.main(["status"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("no Spark master is running at spark://127.0.0.1:")
    assert "python -m pgcdc.stack.spark_cluster up" in out and "workers alive" not in out
