#!/bin/sh
# Apicurio Registry's Quarkus application; its settings come from the environment
# (the image's defaults, compose's), the JVM's flags from REGISTRY_JAVA_OPTS.
set -eu
# shellcheck disable=SC2086
exec java ${REGISTRY_JAVA_OPTS:-} -jar /opt/apicurio-registry/quarkus-run.jar "$@"
