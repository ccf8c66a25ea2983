"""The ``CDC_*`` settings that point the project at the stack's secured endpoints.

``scripts/stack env --secure`` prints them: PostgreSQL over TLS with ``verify-full``,
Kafka over SASL_SSL (SCRAM-SHA-512), Redis over TLS as an ACL user. OpenSearch stays plain
HTTP: the stack's distribution has no security plugin, so neither TLS nor basic auth.
"""

from __future__ import annotations

from urllib.parse import quote

from pgcdc.core.ports import HOST, OPENSEARCH_URL, PORTS, SECURE_PORTS
from pgcdc.stack import common, credentials, kafka_secure, tls


def env_vars(paths: common.Paths) -> dict[str, str]:
    """Every ``CDC_*`` variable for the secured endpoints (certificates made if missing)."""
    pki = tls.ensure(paths)
    creds = credentials.load(paths)
    ca = str(pki.ca_cert)
    return {
        "CDC_POSTGRES__DSN": (
            f"postgresql://cdc:cdc@{HOST}:{PORTS['postgres']}/cdc"
            f"?sslmode=verify-full&sslrootcert={quote(ca)}"
        ),
        "CDC_KAFKA__BOOTSTRAP_SERVERS": f"{HOST}:{SECURE_PORTS['kafka-secure']}",
        "CDC_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
        "CDC_KAFKA__SASL_MECHANISM": kafka_secure.MECHANISM,
        "CDC_KAFKA__SASL_USERNAME": credentials.KAFKA_USER,
        "CDC_KAFKA__SASL_PASSWORD": creds.kafka_password,
        "CDC_KAFKA__SSL_CA_LOCATION": ca,
        "CDC_REDIS__URL": (
            f"rediss://{credentials.REDIS_USER}:{quote(creds.redis_password, safe='')}"
            f"@{HOST}:{SECURE_PORTS['redis-secure']}/0"
        ),
        "CDC_REDIS__SSL_CA_LOCATION": ca,
        "CDC_SEARCH__URL": OPENSEARCH_URL,
    }
