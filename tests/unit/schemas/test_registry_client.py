"""The registry client's configuration and error mapping (no registry needed)."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from pgcdc.core.errors import ConnectionFailed, SchemaError
from pgcdc.core.settings import SchemaSettings
from schemas.registry import SchemaRegistryClient, client_config

pytestmark = pytest.mark.unit


def test_client_config_maps_url_auth_and_tls() -> None:
    settings = SchemaSettings(
        registry_url="https://registry.example:8081",
        registry_basic_auth_user_info=SecretStr("svc:s3cret-pw"),
        registry_ssl_ca_location="/etc/ca.crt",
        registry_ssl_certificate_location="/etc/client.crt",
        registry_ssl_key_location="/etc/client.key",
    )
    assert client_config(settings) == {
        "url": "https://registry.example:8081",
        "basic.auth.user.info": "svc:s3cret-pw",
        "ssl.ca.location": "/etc/ca.crt",
        "ssl.certificate.location": "/etc/client.crt",
        "ssl.key.location": "/etc/client.key",
    }
    # The password never shows in the settings' text (logs, `cdc config show`).
    assert "s3cret-pw" not in repr(settings) and "s3cret-pw" not in str(settings.model_dump())


def test_client_config_minimal_and_missing_url() -> None:
    assert client_config(SchemaSettings(registry_url="http://r:1")) == {"url": "http://r:1"}
    with pytest.raises(SchemaError, match="registry_url"):
        client_config(SchemaSettings())


def test_unreachable_registry_is_connection_failed() -> None:
    client = SchemaRegistryClient(SchemaSettings(registry_url="http://127.0.0.1:9"))
    with pytest.raises(ConnectionFailed, match="cannot register a schema under t-value"):
        client.register("t-value", {"type": "string"})
