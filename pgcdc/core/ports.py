"""The one table of host ports and URLs for the local stack.

``scripts/stack`` (native servers) and ``docker-compose.yml`` (containers) both expose these
ports on 127.0.0.1, and the defaults in ``cdc/config.py`` point at them. Tests import this
module instead of repeating the numbers.
"""

from __future__ import annotations

HOST = "127.0.0.1"

# Client-facing port of each service, keyed by the service name used everywhere
# (``scripts/stack up <name>``, compose service names, ``.stack/logs/<name>.log``).
PORTS: dict[str, int] = {
    "postgres": 55432,
    "redis": 56379,
    "kafka": 19092,
    "opensearch": 19200,
}

# Ports that only the servers talk on; bound to 127.0.0.1 too.
KAFKA_CONTROLLER_PORT = 19093
OPENSEARCH_TRANSPORT_PORT = 19300

SERVICES: tuple[str, ...] = ("postgres", "redis", "kafka", "opensearch")

# Secured servers started only on demand (``scripts/stack up kafka-secure redis-secure``),
# beside the plaintext ones above, never instead of them. PostgreSQL needs no second server:
# the one above also accepts TLS (``sslmode=verify-full`` with the stack's CA).
SECURE_PORTS: dict[str, int] = {
    "kafka-secure": 19094,  # SASL_SSL, SCRAM-SHA-512 over TLS
    "redis-secure": 56380,  # TLS only, an ACL user; the default user is off
}
KAFKA_SECURE_CONTROLLER_PORT = 19095
SECURE_SERVICES: tuple[str, ...] = tuple(SECURE_PORTS)

# Servers started only when asked for (``scripts/stack up --registry`` or ``up registry``),
# because only some users need them: the schema registry for Avro (Apicurio Registry, with
# Confluent's API under ``/apis/ccompat/v7``); its health checks answer on the management port.
OPTIONAL_PORTS: dict[str, int] = {"registry": 18081}
REGISTRY_MANAGEMENT_PORT = 18082
OPTIONAL_SERVICES: tuple[str, ...] = tuple(OPTIONAL_PORTS)

# Clusters started only on demand (``scripts/stack up kafka-cluster redis-cluster``, tests,
# benchmarks), beside the single servers above, never instead of them. Node i (1-based) of
# each cluster uses the i-th port of its tuple.
KAFKA_CLUSTER_PORTS: tuple[int, ...] = (19101, 19102, 19103)  # brokers (PLAINTEXT)
KAFKA_CLUSTER_CONTROLLER_PORTS: tuple[int, ...] = (19111, 19112, 19113)
REDIS_CLUSTER_PORTS: tuple[int, ...] = (17001, 17002, 17003)  # three masters
REDIS_CLUSTER_BUS_PORTS: tuple[int, ...] = (17101, 17102, 17103)  # their cluster bus
# A Spark standalone cluster (pgcdc.stack.spark_cluster): the master, its web UI, and the
# workers' own ports and web UIs.
SPARK_MASTER_PORT = 17077
SPARK_MASTER_UI_PORT = 17080
SPARK_WORKER_PORTS: tuple[int, ...] = (17078, 17079)
SPARK_WORKER_UI_PORTS: tuple[int, ...] = (17081, 17082)
CLUSTER_SERVICES: tuple[str, ...] = ("kafka-cluster", "redis-cluster")

# Every port above, for ``net.ipv4.ip_local_reserved_ports`` (see pgcdc.stack.common).
ALL_PORTS: tuple[int, ...] = (
    *PORTS.values(),
    KAFKA_CONTROLLER_PORT,
    OPENSEARCH_TRANSPORT_PORT,
    *SECURE_PORTS.values(),
    KAFKA_SECURE_CONTROLLER_PORT,
    *OPTIONAL_PORTS.values(),
    REGISTRY_MANAGEMENT_PORT,
    *KAFKA_CLUSTER_PORTS,
    *KAFKA_CLUSTER_CONTROLLER_PORTS,
    *REDIS_CLUSTER_PORTS,
    *REDIS_CLUSTER_BUS_PORTS,
    SPARK_MASTER_PORT,
    SPARK_MASTER_UI_PORT,
    *SPARK_WORKER_PORTS,
    *SPARK_WORKER_UI_PORTS,
)


# Where each service of the stack answers, as the clients' default settings.
POSTGRES_DSN = f"postgresql://cdc:cdc@{HOST}:{PORTS['postgres']}/cdc"
# The least-privilege role the demo and compose run the reader as: LOGIN REPLICATION and
# SELECT on the captured tables, nothing more (docs/own-postgres.md); the superuser cdc
# above stays for tests and tools.
READER_ROLE = "cdc_reader"
READER_PASSWORD = "cdc_reader"
KAFKA_BOOTSTRAP = f"{HOST}:{PORTS['kafka']}"
REDIS_URL = f"redis://{HOST}:{PORTS['redis']}/0"
KAFKA_CLUSTER_BOOTSTRAP = ",".join(f"{HOST}:{p}" for p in KAFKA_CLUSTER_PORTS)
REDIS_CLUSTER_URL = f"redis://{HOST}:{REDIS_CLUSTER_PORTS[0]}/0?cluster=true"
SPARK_MASTER_URL = f"spark://{HOST}:{SPARK_MASTER_PORT}"
OPENSEARCH_URL = f"http://{HOST}:{PORTS['opensearch']}"
# Confluent's schema registry API of the stack's registry: what ``schema.registry_url`` takes.
REGISTRY_URL = f"http://{HOST}:{OPTIONAL_PORTS['registry']}/apis/ccompat/v7"


def env_vars() -> dict[str, str]:
    """Return the ``CDC_*`` variables that point the project at the stack."""
    return {
        "CDC_POSTGRES__DSN": POSTGRES_DSN,
        "CDC_KAFKA__BOOTSTRAP_SERVERS": KAFKA_BOOTSTRAP,
        "CDC_REDIS__URL": REDIS_URL,
        "CDC_SEARCH__URL": OPENSEARCH_URL,
    }


def registry_env_vars() -> dict[str, str]:
    """The ``CDC_*`` variables that make the reader write, and the jobs read, Avro framed
    through the stack's schema registry."""
    return {"CDC_SCHEMA__VALUE_FORMAT": "avro", "CDC_SCHEMA__REGISTRY_URL": REGISTRY_URL}
