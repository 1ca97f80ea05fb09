#!/usr/bin/env bash
# Checks that go.mod is tidy, runs go vet, the linters (scripts/lint.sh) and
# the whole test suite against real Postgres and Redis (started or installed
# by scripts/services.sh when they are not already reachable), with
# kinesalite installed (scripts/kinesalite.sh) and Chromium for the
# console's browser tests (scripts/chromium.sh). Any failure fails CI.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${OUTBOXD_TEST_POSTGRES_DSN:-}${OUTBOXD_TEST_REDIS_ADDR:-}" ]; then
  scripts/services.sh
fi
scripts/kinesalite.sh
scripts/chromium.sh
# go.mod and go.sum are what `go mod tidy` makes them, here and in bench/
# (its own module): -diff prints what tidy would change and fails, changing
# nothing.
go mod tidy -diff
(cd bench && go mod tidy -diff)
go vet ./...
scripts/lint.sh
go test -race -count=1 -timeout 20m "$@" ./...
