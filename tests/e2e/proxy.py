"""A TCP proxy a test controls: put it between a job and a server, then cut it to make the
server unreachable from the job's side without touching the (shared) server itself.

While cut, the proxy accepts connections and closes them at once (the client sees a reset)
and counts them: proof the client kept trying. Established connections are closed when the
cut starts.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class Proxy:
    """Forwards 127.0.0.1:<port> to ``target`` until closed."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self.refused = 0  # connections turned away while cut
        self.forwarded = 0  # connections forwarded
        threading.Thread(target=self._accept, name="proxy", daemon=True).start()

    def url(self, scheme: str) -> str:
        return f"{scheme}://127.0.0.1:{self.port}"

    def cut(self) -> None:
        """Make the server unreachable: drop every connection, refuse new ones."""
        self._cut.set()  # before the lock: a connection made meanwhile sees it (_accept)
        with self._lock:
            for s in list(self._open):
                _close(s)
            self._open.clear()

    def restore(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self._closed.set()
        self.cut()
        _close(self._listener)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                self.refused += 1
                client.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                )
                _close(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                # A cut that began while this connection was being made has already closed
                # what was open: this one must not outlive it.
                if self._cut.is_set():
                    self.refused += 1
                    _close(client)
                    _close(upstream)
                    continue
                self.forwarded += 1
                self._open.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(src)
                self._open.discard(dst)
            _close(src)
            _close(dst)


def _close(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        s.close()
