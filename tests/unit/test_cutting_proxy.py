"""The tests' TCP proxy (:mod:`tests.e2e.proxy`): a cut drops every connection, including one
the proxy was still making when the cut began."""

from __future__ import annotations

import socket
import threading

import pytest

from tests.e2e.proxy import Proxy

pytestmark = pytest.mark.unit


def _echo_server() -> tuple[socket.socket, threading.Event]:
    """A server on 127.0.0.1 that echoes each connection's bytes back until it closes."""
    server = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return server, done


def _echo(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(1024):
            conn.sendall(data)


def _closed_by_peer(client: socket.socket) -> bool:
    """The proxy closed this connection (a read returns end of stream or a reset)."""
    client.settimeout(5)
    try:
        client.sendall(b"ping")
        return client.recv(1024) == b""
    except OSError:
        return True


def test_a_connection_made_while_the_cut_begins_is_dropped_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, done = _echo_server()
    proxy = Proxy(*server.getsockname()[:2])
    real_connect = socket.create_connection
    cuts_during_connect = []

    def connect_then_cut(address: tuple[str, int], timeout: float) -> socket.socket:
        upstream = real_connect(address, timeout)
        proxy.cut()  # the cut lands between the proxy's check and its forwarding
        cuts_during_connect.append(address)
        return upstream

    try:
        with socket.create_connection(("127.0.0.1", proxy.port), 5) as before:
            before.settimeout(5)
            before.sendall(b"hi")
            assert before.recv(1024) == b"hi"  # forwarded while not cut
            # The proxy's connection upstream (the test's own connections use real_connect).
            monkeypatch.setattr(socket, "create_connection", connect_then_cut)
            with real_connect(("127.0.0.1", proxy.port), 5) as during:
                assert _closed_by_peer(during)
            assert cuts_during_connect, "the cut did not land while a connection was made"
            assert _closed_by_peer(before)
        assert proxy.forwarded == 1
        assert proxy.refused == 1
    finally:
        proxy.close()
        done.set()
        server.close()
