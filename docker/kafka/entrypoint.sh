#!/bin/sh
# One KRaft node (broker and controller), as pgcdc/stack/kafka.py runs it natively: the
# image's server.properties, then every KAFKA_* variable as a property (the apache/kafka
# image's convention: KAFKA_LOG_DIRS -> log.dirs, "__" -> "_", "___" -> "-"); storage is
# formatted on the first start (KAFKA_CLUSTER_ID, else a random id).
set -euf  # -f: the classpath "lib/*" is for java, not the shell
home=/var/lib/kafka
conf=$home/server.properties
{
  cat /opt/kafka/config/server.properties
  echo "# from the environment"
  env | awk -F= '
    /^KAFKA_[A-Z0-9_]+=/ {
      name = substr($1, 7)
      if (name ~ /^(HEAP_OPTS|OPTS|JVM_PERFORMANCE_OPTS|GC_LOG_OPTS|LOG4J_OPTS|JMX_OPTS|CLUSTER_ID|VERSION|HOME)$/) next
      value = substr($0, length($1) + 2)
      name = tolower(name)
      gsub(/___/, "-", name); gsub(/__/, "@", name); gsub(/_/, ".", name); gsub(/@/, "_", name)
      print name "=" value
    }'
} > "$conf"

java="java ${KAFKA_HEAP_OPTS:--Xms128m -Xmx512m} -XX:+UseG1GC -Djava.awt.headless=true \
  -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties ${KAFKA_OPTS:-} -cp /opt/kafka/lib/*"

data=$(awk -F= '$1 == "log.dirs" { v = $2 } END { print v }' "$conf")
if [ ! -f "$data/meta.properties" ]; then
  id=${KAFKA_CLUSTER_ID:-$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')}
  # --standalone makes this node the whole controller quorum; with controller.quorum.voters
  # given, the voters are named instead.
  standalone=--standalone
  grep -q '^controller.quorum.voters=' "$conf" && standalone=
  echo "pgcdc-kafka: formatting $data (cluster $id)"
  # shellcheck disable=SC2086
  $java kafka.tools.StorageTool format $standalone "--cluster-id=$id" -c "$conf"
fi
# shellcheck disable=SC2086
exec $java kafka.Kafka "$conf"
