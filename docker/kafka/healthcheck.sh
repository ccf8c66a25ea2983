#!/bin/bash
# Healthy when the broker answers an ApiVersions request (v0) with error code 0, as
# pgcdc/stack/kafka.py's probe asks the native broker (bash's /dev/tcp: no client in the image).
set -eu
port=${1:-9092}
exec 3<>"/dev/tcp/127.0.0.1/$port"
# size 12 | api_key 18 | version 0 | correlation id 1 | client id "hc"
printf '\x00\x00\x00\x0c\x00\x12\x00\x00\x00\x00\x00\x01\x00\x02hc' >&3
answer=$(timeout 5 head -c 10 <&3 | od -An -tx1 | tr -d ' \n')
# size (4 bytes, any), correlation id 1, error code 0
[ "${answer:8:12}" = "000000010000" ]
