"""A small Confluent Schema Registry client (urllib): register a schema, fetch one by id.

The only module under schemas/ that does I/O; it is used only when
``SchemaSettings.registry_url`` is set.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from pgcdc.core.errors import ConnectionFailed, SchemaError

log = logging.getLogger(__name__)
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class SchemaRegistryClient:
    """Registers Avro schemas under subjects and remembers their ids."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._ids: dict[tuple[str, str], int] = {}

    def register(self, subject: str, schema: Any) -> int:
        """Register ``schema`` (an Avro schema as JSON-like data) under ``subject``; its id."""
        text = json.dumps(schema, separators=(",", ":"))
        cached = self._ids.get((subject, text))
        if cached is not None:
            return cached
        path = f"/subjects/{urllib.parse.quote(subject, safe='')}/versions"
        body = self._request("POST", path, {"schema": text, "schemaType": "AVRO"})
        if not isinstance(body, dict) or not isinstance(body.get("id"), int):
            raise SchemaError(f"schema registry answered {body!r} to a registration")
        self._ids[(subject, text)] = body["id"]
        log.info("registered schema", extra={"subject": subject, "schema_id": body["id"]})
        return int(body["id"])

    def schema_by_id(self, schema_id: int) -> Any:
        """The Avro schema registered with ``schema_id``."""
        body = self._request("GET", f"/schemas/ids/{schema_id}", None)
        if not isinstance(body, dict) or "schema" not in body:
            raise SchemaError(f"schema registry answered {body!r} for id {schema_id}")
        return json.loads(body["schema"])

    def _request(self, method: str, path: str, payload: Any) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Content-Type": CONTENT_TYPE, "Accept": CONTENT_TYPE},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:500]
            if e.code >= 500:
                raise ConnectionFailed(
                    f"schema registry {self.url}: HTTP {e.code}: {detail}"
                ) from e
            raise SchemaError(
                f"schema registry {self.url} refused {method} {path}: HTTP {e.code}: {detail}"
            ) from e
        except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
            raise ConnectionFailed(f"schema registry {self.url} unreachable: {e}") from e
