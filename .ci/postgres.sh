#!/usr/bin/env bash
# A throwaway PostgreSQL server on loopback for the tests that run against both SQLite and
# PostgreSQL (tests/support/databases.py). Source it from .ci/run:
#     . .ci/postgres.sh     # exports A2A_TUNE_TEST_POSTGRES_URL; the server stops at exit
# Installs Debian's postgresql package when no server binaries are present (CI runs as root
# on a clean machine). The server listens on 127.0.0.1 only, password auth (scram), no fsync.
set -euo pipefail
if ! ls -d /usr/lib/postgresql/*/bin >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
_pg_bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
_pg_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
_pg_dir=$(mktemp -d /tmp/a2a-tune-pg.XXXXXX)
_pg_password=$(python3 -c 'import secrets; print(secrets.token_hex(12))')
echo "$_pg_password" >"$_pg_dir/pw"
_pg() {  # initdb and the server refuse to run as root
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
if [ "$(id -u)" = 0 ]; then chown -R postgres "$_pg_dir"; fi
_pg "$_pg_bin/initdb" -D "$_pg_dir/data" -U postgres --auth=scram-sha-256 --pwfile="$_pg_dir/pw" \
    --no-sync -E UTF8 >/dev/null
_pg "$_pg_bin/pg_ctl" -D "$_pg_dir/data" -l "$_pg_dir/log" -w \
    -o "-p $_pg_port -k $_pg_dir -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null
trap '_pg "$_pg_bin/pg_ctl" -D "$_pg_dir/data" -m fast stop >/dev/null 2>&1 || true; rm -rf "$_pg_dir"' EXIT
export A2A_TUNE_TEST_POSTGRES_URL="postgresql://postgres:$_pg_password@127.0.0.1:$_pg_port/postgres"
echo "PostgreSQL $("$_pg_bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$_pg_port for the store tests"
