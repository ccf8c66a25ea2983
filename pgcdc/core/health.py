"""A liveness and readiness HTTP endpoint for a long-running process (standard library only).

``GET /healthz`` answers 200 while the process serves requests at all (liveness).
``GET /readyz`` answers 200 when the process's own check says it is doing its work, else 503;
the body is one line saying why. The reader and the sync jobs each pass their check.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)

# (ready, one line saying why)
ReadyCheck = Callable[[], tuple[bool, str]]


class HealthServer:
    """Serves ``/healthz`` and ``/readyz`` on a daemon thread until :meth:`close`."""

    def __init__(
        self,
        ready: ReadyCheck,
        port: int,
        host: str = "127.0.0.1",
        metrics: Callable[[], bytes] | None = None,
    ) -> None:
        """``metrics``: also serve ``GET /metrics`` (Prometheus text) from this call."""
        check = ready

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/healthz":
                    self._answer(200, "alive")
                elif self.path == "/readyz":
                    try:
                        ok, why = check()
                    except Exception as e:  # a failing check means not ready, said so
                        ok, why = False, f"readiness check failed: {type(e).__name__}: {e}"
                    self._answer(200 if ok else 503, why)
                elif self.path == "/metrics" and metrics is not None:
                    body = metrics()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    self._answer(404, "not found: /healthz or /readyz")

            def _answer(self, status: int, text: str) -> None:
                body = (text + "\n").encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # a probe every few seconds is not worth a log line

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="health", daemon=True
        )

    @property
    def port(self) -> int:
        """The bound port (useful when 0 asked for any free one)."""
        return int(self._server.server_address[1])

    def start(self) -> HealthServer:
        """Start serving; returns self."""
        self._thread.start()
        host = self._server.server_address[0]
        log.info("health on http://%s:%d/healthz and /readyz", host, self.port)
        return self

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
