#!/bin/sh
# Creates the two Temporal databases on PostgreSQL and brings both schemas up to
# the version shipped in this admin-tools image, then exits. Running it again is
# safe: "create" and "setup-schema" fail harmlessly on an existing database, and
# "update-schema" applies only what is missing (which is how upgrades migrate).
set -eu

HOST="${POSTGRES_SEEDS:-postgresql}"
PORT="${DB_PORT:-5432}"
USER_NAME="${POSTGRES_USER:-temporal}"
export SQL_PASSWORD="${POSTGRES_PWD:-temporal}"
SCHEMA_DIR=/etc/temporal/schema/postgresql/v12

echo "waiting for PostgreSQL at ${HOST}:${PORT}"
until nc -z -w 5 "$HOST" "$PORT"; do sleep 1; done

sql() {
  temporal-sql-tool --plugin postgres12 --ep "$HOST" -p "$PORT" -u "$USER_NAME" "$@"
}

for db in temporal temporal_visibility; do
  dir=temporal
  [ "$db" = temporal_visibility ] && dir=visibility
  sql --db "$db" create || echo "database $db exists"
  sql --db "$db" setup-schema -v 0.0 || echo "schema of $db already set up"
  sql --db "$db" update-schema -d "$SCHEMA_DIR/$dir/versioned"
done
echo "PostgreSQL schema setup complete"
