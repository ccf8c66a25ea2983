"""The test servers' ports (:mod:`tests.ports`): outside the kernel's ephemeral range, none of
the stack's, never handed out twice, bindable when handed out."""

from __future__ import annotations

import socket

import pytest

from pgcdc.core.ports import ALL_PORTS, HOST
from tests.ports import _ephemeral_floor, free_port

pytestmark = pytest.mark.unit


def test_ports_come_from_below_the_ephemeral_range_once_each() -> None:
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(20_000 <= p < _ephemeral_floor() for p in ports)
    assert not set(ports) & set(ALL_PORTS)
    with socket.socket() as s:
        s.bind((HOST, ports[-1]))  # free when handed out


def test_each_xdist_worker_draws_from_a_slice_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        seen[worker] = {free_port() for _ in range(20)}
    assert max(seen["gw0"]) < min(seen["gw1"]) and max(seen["gw1"]) < min(seen["gw2"])
