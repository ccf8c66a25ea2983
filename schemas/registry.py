"""The schema registry, through ``confluent_kafka.schema_registry``: register a schema, fetch one.

The only module under schemas/ that does I/O; it is used only when
``SchemaSettings.registry_url`` is set. The library does the HTTP, retries, basic auth and
TLS; this module maps its settings and its errors onto ours.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry import SchemaRegistryClient as ConfluentClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from httpx2 import HTTPError

from pgcdc.core.errors import ConnectionFailed, SchemaError
from pgcdc.core.settings import SchemaSettings

log = logging.getLogger(__name__)
# What the library raises: the registry's answers, and HTTP/TLS/socket failures.
REGISTRY_ERRORS = (SchemaRegistryError, HTTPError, OSError)
# Confluent's answer (and Apicurio's) to a schema its compatibility rule refuses.
INCOMPATIBLE = 409


def client_config(settings: SchemaSettings) -> dict[str, Any]:
    """The ``SchemaRegistryClient`` configuration the settings describe (URL, auth, TLS)."""
    if not settings.registry_url:
        raise SchemaError("schema.registry_url is not set")
    conf: dict[str, Any] = {"url": settings.registry_url}
    if settings.registry_basic_auth_user_info is not None:
        conf["basic.auth.user.info"] = settings.registry_basic_auth_user_info.get_secret_value()
    optional = {
        "ssl.ca.location": settings.registry_ssl_ca_location,
        "ssl.certificate.location": settings.registry_ssl_certificate_location,
        "ssl.key.location": settings.registry_ssl_key_location,
    }
    conf.update({k: v for k, v in optional.items() if v})
    return conf


class SchemaRegistryClient:
    """Registers Avro schemas under subjects (``<topic>-key``/``<topic>-value``), with ids."""

    def __init__(self, settings: SchemaSettings) -> None:
        self.url = settings.registry_url or ""
        self.client = ConfluentClient(client_config(settings))
        self._ids: dict[tuple[str, str], int] = {}

    def register(self, subject: str, schema: Any) -> int:
        """Register ``schema`` (an Avro schema as JSON-like data) under ``subject``; its id."""
        text = json.dumps(schema, separators=(",", ":"))
        cached = self._ids.get((subject, text))
        if cached is not None:
            return cached
        try:
            schema_id = self.client.register_schema(subject, Schema(text, "AVRO"))
        except REGISTRY_ERRORS as e:
            failure = self._failure(f"register a schema under {subject}", e)
            if isinstance(e, SchemaRegistryError) and e.http_status_code == INCOMPATIBLE:
                failure = SchemaError(f"{failure}; {self._way_past(subject)}")
            raise failure from e
        self._ids[(subject, text)] = schema_id
        log.info("registered schema", extra={"subject": subject, "schema_id": schema_id})
        return schema_id

    def schema_by_id(self, schema_id: int) -> Any:
        """The Avro schema registered with ``schema_id``."""
        try:
            found = self.client.get_schema(schema_id)
        except REGISTRY_ERRORS as e:
            raise self._failure(f"fetch schema id {schema_id}", e) from e
        if found.schema_str is None:
            raise SchemaError(f"schema registry {self.url}: schema id {schema_id} has no text")
        return json.loads(found.schema_str)

    def _way_past(self, subject: str) -> str:
        """What lets a change the subject's compatibility rule refuses through."""
        return (
            "the subject's compatibility rule refuses this schema change (docs/avro.md); to "
            f"let it through, relax the rule for the subject (PUT {self.url}/config/{subject} "
            'with {"compatibility": "NONE"}) and run the reader again: nothing from this '
            "change on was acknowledged"
        )

    def _failure(self, what: str, e: Exception) -> SchemaError | ConnectionFailed:
        # 4xx: the registry refused (incompatible schema, bad credentials): a schema error.
        # 5xx, unreachable, TLS failures: the registry is not available (may be retried).
        if isinstance(e, SchemaRegistryError) and 400 <= e.http_status_code < 500:
            return SchemaError(
                f"schema registry {self.url} refused to {what}: HTTP {e.http_status_code}: "
                f"{e.error_message}"
            )
        return ConnectionFailed(f"schema registry {self.url}: cannot {what}: {e}")
