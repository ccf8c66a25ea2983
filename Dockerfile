# The pipeline: the reader (`cdc run`, `cdc status`, ...) and the Spark sync jobs
# (`scripts/spark-submit spark_jobs/<job>.py`) with the Spark Kafka connector jars baked in,
# run as the non-root user cdc. Versions: pgcdc/stack/versions.py and constraints.txt
# (tests/unit/test_docker_versions.py holds the defaults below to them).
ARG DEBIAN_SUITE=bookworm

# The virtualenv of the dependencies (a layer that changes only with constraints.txt or
# pyproject.toml's dependencies) and the Spark connector jars; the code is copied last, so
# a change to it rebuilds only small layers.
FROM pgcdc/base:${DEBIAN_SUITE} AS venv
RUN set -eu; \
    apt-get update -q; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3 python3-venv curl; \
    rm -rf /var/lib/apt/lists/*
WORKDIR /app
# pip trusts the system's certificates (with the extra ones above), not only its own bundle.
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
COPY pyproject.toml constraints.txt ./
# docker/wheels/ may hold wheels of these pins (`scripts/docker images` fills it from the
# host's pip cache, to skip downloading and building them again); PyPI has the rest.
COPY docker/wheels/ /tmp/wheels/
RUN set -eu; \
    python3 -m venv .venv; \
    .venv/bin/pip install -q --find-links /tmp/wheels -U pip setuptools wheel; \
    python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' > /tmp/requirements.txt; \
    .venv/bin/pip install -q --find-links /tmp/wheels -c constraints.txt -r /tmp/requirements.txt; \
    echo /app > "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/pgcdc-source.pth"; \
    printf '#!/app/.venv/bin/python\nimport sys\nfrom cdc.cli import main\nsys.exit(main())\n' > .venv/bin/cdc; \
    chmod 755 .venv/bin/cdc
# The project's packages come from /app (the .pth above) and `cdc` is its console script.
COPY pgcdc/__init__.py pgcdc/
# What pgcdc.stack imports of pgcdc.core (the stack's paths and ports), not all of it: the
# jars' layer below stays cached while the rest of the code changes.
COPY pgcdc/core/__init__.py pgcdc/core/ports.py pgcdc/core/local_stack.py pgcdc/core/
COPY pgcdc/stack pgcdc/stack
RUN CACHE_DIR=/app/.cache .venv/bin/python -c 'from pgcdc.stack import common, sparkjars; sparkjars.ensure(common.paths())' \
    && .venv/bin/python -m pgcdc.stack.pyspark_bytecode

FROM pgcdc/base:${DEBIAN_SUITE}
ARG JAVA_MAJOR=17
# The same step in the Kafka, OpenSearch and pipeline images (one cached layer for all).
RUN set -eu; \
    apt-get update -q; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "openjdk-${JAVA_MAJOR}-jre-headless"; \
    rm -rf /var/lib/apt/lists/*
RUN set -eu; \
    apt-get update -q; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3 curl procps; \
    rm -rf /var/lib/apt/lists/*; \
    useradd --uid 10001 --create-home --home-dir /home/cdc --shell /bin/bash cdc; \
    mkdir -p /var/lib/pgcdc/checkpoints; chown -R cdc:cdc /var/lib/pgcdc
COPY --from=venv /app/.venv /app/.venv
COPY --from=venv --chown=cdc:cdc /app/.cache /app/.cache
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY pgcdc pgcdc
COPY cdc cdc
COPY schemas schemas
COPY sinks sinks
COPY spark_jobs spark_jobs
COPY benchmarks benchmarks
COPY demo demo
COPY scripts scripts
ENV PATH=/app/.venv/bin:$PATH \
    CACHE_DIR=/app/.cache \
    CDC_SPARK__CHECKPOINT_DIR=/var/lib/pgcdc/checkpoints \
    PYTHONDONTWRITEBYTECODE=1
USER cdc
VOLUME /var/lib/pgcdc/checkpoints
CMD ["cdc", "--help"]
