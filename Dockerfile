# The pipeline's image: the reader (`cdc run`) and the Spark sync jobs, for docker-compose.yml.
FROM python:3.11-slim-bookworm
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      openjdk-17-jre-headless curl ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY cdc cdc
COPY schemas schemas
COPY sinks sinks
COPY spark_jobs spark_jobs
COPY scripts scripts
RUN python -m venv .venv \
 && .venv/bin/pip install --no-cache-dir -c constraints.txt . \
 && python3 scripts/stack jars >/dev/null
ENV PATH=/app/.venv/bin:$PATH
CMD ["cdc", "--help"]
