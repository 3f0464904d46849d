#!/bin/bash
# The public postgres image's start-up, reduced to what docker-compose.yml relies on: as root, hand the data
# folder to the postgres user and start again as that user; on the first start (an empty data folder) initdb with
# POSTGRES_USER as the superuser (password POSTGRES_PASSWORD, required; scram-sha-256 over TCP, trust over the
# local socket) and create POSTGRES_DB; then exec the command (`postgres ...`); it listens on every address unless the command says otherwise.
set -euo pipefail
if [ "${1:-}" != postgres ]; then
    exec "$@"
fi
if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ]; then
        echo "docker-entrypoint: POSTGRES_PASSWORD is not set (docker-compose.yml reads it from .env)" >&2
        exit 1
    fi
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb --username="$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 -D "$PGDATA" >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"  # `-c listen_addresses=...` in the command wins
    if [ "$db" != postgres ]; then
        echo "CREATE DATABASE \"$db\" OWNER \"$user\"" | postgres --single -D "$PGDATA" -j postgres >/dev/null
    fi
    echo "docker-entrypoint: initialized $PGDATA (role $user, database $db)"
fi
exec "$@"
