"""TCP ports for the servers a test starts of its own (a proxied broker, a throwaway
PostgreSQL, a job's health endpoint, a container's host port).

A port the kernel hands out for ``bind(("127.0.0.1", 0))`` is free only when asked: it lies
in the ephemeral range, from which the kernel also gives every client connection its own end
and every other ``bind(0)`` (Spark's services, the other test workers' servers) its port. A
job that binds it twenty seconds later may find it taken (a documents job's health port
was, in a fresh-clone run). These come from below that range, where only an explicit bind
takes a port: each pytest-xdist worker draws from a slice of its own, none of the stack's
fixed ports (:data:`pgcdc.core.ports.ALL_PORTS`), none handed out before in this process,
and each bindable when drawn.
"""

from __future__ import annotations

import os
import random
import socket

from pgcdc.core.ports import ALL_PORTS, HOST

__all__ = ["free_port"]

_FIRST, _LAST = 20_000, 32_000  # below Linux's default ephemeral range (32768-60999)
_SLICES = 8
_given: set[int] = set()


def _ephemeral_floor() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port() -> int:
    """A TCP port nothing is bound to at 127.0.0.1 now, outside the ephemeral range."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    last = min(_LAST, _ephemeral_floor() - 1)
    span = (last - _FIRST) // _SLICES
    start = _FIRST + (index % _SLICES) * span
    fixed = set(ALL_PORTS)
    for _ in range(1_000):
        port = start + random.randrange(span)
        if port in fixed or port in _given:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError(f"no free TCP port in {start}-{start + span - 1}")
