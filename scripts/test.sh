#!/usr/bin/env bash
# Runs the whole test suite against real Postgres and Redis (started or
# installed by scripts/services.sh when they are not already reachable).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${OUTBOXD_TEST_POSTGRES_DSN:-}${OUTBOXD_TEST_REDIS_ADDR:-}" ]; then
  scripts/services.sh
fi
go vet ./...
go test -race -count=1 -timeout 20m "$@" ./...
