#!/bin/sh
# Initialise an empty data folder the way the official image does (POSTGRES_USER, a password
# for TCP, POSTGRES_DB), then run the server with logical decoding on. Runs as postgres.
set -eu
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
if [ "${1:-postgres}" != postgres ]; then
  case "$1" in -*) set -- postgres "$@" ;; *) exec "$@" ;; esac
fi
[ $# -gt 0 ] && shift

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "pgcdc-postgres: set POSTGRES_PASSWORD (clients connect over TCP with a password)" >&2
    exit 1
  fi
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" -E UTF8 --locale=C.UTF-8 \
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  {
    echo "host all         all all scram-sha-256"
    echo "host replication all all scram-sha-256"
  } >> "$PGDATA/pg_hba.conf"
  if [ "$POSTGRES_DB" != postgres ]; then
    pg_ctl -D "$PGDATA" -w -o "-c listen_addresses='' -c unix_socket_directories=/var/run/postgresql" start >/dev/null
    # From stdin: psql interpolates :"db" (quoted as an identifier) there, not in -c.
    echo 'CREATE DATABASE :"db"' | psql -h /var/run/postgresql -U "$POSTGRES_USER" -d postgres \
      -v ON_ERROR_STOP=1 -q -v db="$POSTGRES_DB"
    pg_ctl -D "$PGDATA" -w -m fast stop >/dev/null
  fi
  echo "pgcdc-postgres: initialised $PGDATA (superuser $POSTGRES_USER, database $POSTGRES_DB)"
fi

# The reader's least-privilege role (docs/own-postgres.md), at every start so that a data
# folder made before it gets it too: LOGIN REPLICATION, SELECT on the tables of schema public
# (now and, by default privileges, those POSTGRES_USER creates later), and the publication
# of every table made by the superuser, since the role may not create one.
if [ -n "${POSTGRES_READER_PASSWORD:-}" ]; then
  : "${POSTGRES_READER_USER:=cdc_reader}" "${POSTGRES_READER_PUBLICATION:=cdc_pub}"
  pg_ctl -D "$PGDATA" -w -o "-c listen_addresses='' -c unix_socket_directories=/var/run/postgresql" start >/dev/null
  psql -h /var/run/postgresql -U "$POSTGRES_USER" -d "$POSTGRES_DB" -v ON_ERROR_STOP=1 -q \
    -v role="$POSTGRES_READER_USER" -v pw="$POSTGRES_READER_PASSWORD" \
    -v owner="$POSTGRES_USER" -v pub="$POSTGRES_READER_PUBLICATION" <<'SQL'
SELECT format('CREATE ROLE %I LOGIN REPLICATION PASSWORD %L', :'role', :'pw')
  WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'role') \gexec
SELECT format('CREATE PUBLICATION %I FOR ALL TABLES', :'pub')
  WHERE NOT EXISTS (SELECT FROM pg_publication WHERE pubname = :'pub') \gexec
GRANT USAGE ON SCHEMA public TO :"role";
GRANT SELECT ON ALL TABLES IN SCHEMA public TO :"role";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA public GRANT SELECT ON TABLES TO :"role";
SQL
  pg_ctl -D "$PGDATA" -w -m fast stop >/dev/null
  echo "pgcdc-postgres: reader role $POSTGRES_READER_USER (REPLICATION, SELECT on public) and publication $POSTGRES_READER_PUBLICATION ready"
fi

# The pipeline's needs first; `-c` arguments given to the container come after and win.
exec postgres -D "$PGDATA" \
  -c listen_addresses='*' \
  -c unix_socket_directories=/var/run/postgresql \
  -c wal_level=logical \
  -c max_replication_slots=20 \
  -c max_wal_senders=20 \
  -c max_connections=150 \
  -c shared_buffers=64MB \
  -c jit=off \
  "$@"
