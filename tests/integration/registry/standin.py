"""A stand-in for a schema registry: the part of Confluent's REST API the tests use.

Only for when no real registry is given (``PGCDC_TEST_REGISTRY_URL`` unset): none installs
from the package registries this project reaches. Karapace is not on PyPI; Confluent's
registry is not on Maven Central; Apicurio Registry publishes only its application jar there,
and building a runnable Quarkus app from it needs module jars (e.g.
``apicurio-registry-schema-util-provider``) and Quarkus parent poms that are not served here. It speaks the same wire API as a real registry (``POST /subjects/<s>/versions``,
``GET /schemas/ids/<id>``, basic auth), so the client, the serializer framing and the
library's ``AvroDeserializer`` are exercised unchanged; pointing the tests at a real registry
takes only the environment variable.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class Store:
    """Schemas by id (one id per distinct text, as Confluent's registry does) and subjects."""

    def __init__(self, user_info: str) -> None:
        self.user_info = user_info
        self.lock = threading.Lock()
        self.ids: dict[str, int] = {}
        self.texts: dict[int, str] = {}
        self.subjects: dict[str, list[int]] = {}

    def register(self, subject: str, text: str) -> int:
        with self.lock:
            schema_id = self.ids.setdefault(text, len(self.ids) + 1)
            self.texts[schema_id] = text
            versions = self.subjects.setdefault(subject, [])
            if schema_id not in versions:
                versions.append(schema_id)
            return schema_id


def handler_for(store: Store) -> type[BaseHTTPRequestHandler]:
    """A request handler class bound to ``store``."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep the test output quiet

        def _reply(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorised(self) -> bool:
            expected = "Basic " + base64.b64encode(store.user_info.encode()).decode()
            if self.headers.get("Authorization") == expected:
                return True
            self._reply(401, {"error_code": 401, "message": "Unauthorized"})
            return False

        def do_POST(self) -> None:
            if not self._authorised():
                return
            parts = urllib.parse.urlparse(self.path).path.strip("/").split("/")
            if len(parts) != 3 or parts[0] != "subjects" or parts[2] != "versions":
                self._reply(404, {"error_code": 404, "message": f"no route {self.path}"})
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if body.get("schemaType", "AVRO") != "AVRO":
                self._reply(422, {"error_code": 42201, "message": "only Avro here"})
                return
            subject = urllib.parse.unquote(parts[1])
            self._reply(200, {"id": store.register(subject, body["schema"])})

        def do_GET(self) -> None:
            if not self._authorised():
                return
            parts = urllib.parse.urlparse(self.path).path.strip("/").split("/")
            if len(parts) == 3 and parts[:2] == ["schemas", "ids"] and parts[2].isdigit():
                text = store.texts.get(int(parts[2]))
                if text is not None:
                    self._reply(200, {"schema": text})
                    return
                self._reply(404, {"error_code": 40403, "message": "Schema not found"})
                return
            if parts == ["subjects"]:
                self._reply(200, sorted(store.subjects))
                return
            self._reply(404, {"error_code": 404, "message": f"no route {self.path}"})

    return Handler


@contextmanager
def standin_registry(user_info: str) -> Iterator[tuple[str, Store]]:
    """Serve a stand-in registry on a free 127.0.0.1 port; yields its URL and its store."""
    store = Store(user_info)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(store))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", store
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@contextmanager
def registry_for_tests(user_info: str) -> Iterator[tuple[str, str]]:
    """The registry the tests use: ``PGCDC_TEST_REGISTRY_URL`` (with
    ``PGCDC_TEST_REGISTRY_USER_INFO``) when set, else the stand-in with ``user_info``; yields
    (URL, basic-auth user info)."""
    url = os.environ.get("PGCDC_TEST_REGISTRY_URL")
    if url:
        yield url, os.environ.get("PGCDC_TEST_REGISTRY_USER_INFO", "")
        return
    with standin_registry(user_info) as (standin_url, _store):
        yield standin_url, user_info


def registry_env(url: str, user_info: str) -> dict[str, str]:
    """The reader's (and the jobs') settings for Avro through that registry."""
    env = {"CDC_SCHEMA__VALUE_FORMAT": "avro", "CDC_SCHEMA__REGISTRY_URL": url}
    if user_info:
        env["CDC_SCHEMA__REGISTRY_BASIC_AUTH_USER_INFO"] = user_info
    return env
