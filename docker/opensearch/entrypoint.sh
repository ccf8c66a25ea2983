#!/bin/sh
# Every variable with a dot in its name is an OpenSearch setting (-E name=value), as in the
# official image; DISABLE_SECURITY_PLUGIN is accepted and means nothing here (the
# integ-test distribution has no security plugin).
set -eu
set --
for name in $(env | awk -F= '$1 ~ /\./ { print $1 }'); do
  set -- "$@" -E "$name=$(printenv "$name")"
done
cd /opt/opensearch
exec bin/opensearch "$@"
