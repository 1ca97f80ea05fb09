#!/usr/bin/env bash
# Checks that go.mod is tidy, runs go vet, the linters (scripts/lint.sh) and
# the whole test suite against real Postgres and Redis (started or installed
# by scripts/services.sh when they are not already reachable), with
# kinesalite installed (scripts/kinesalite.sh), Chromium for the console's
# browser tests (scripts/chromium.sh), then the Helm chart's checks
# (deploy/helm/chartcheck, a module of its own). Any failure fails CI.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${OUTBOXD_TEST_POSTGRES_DSN:-}${OUTBOXD_TEST_REDIS_ADDR:-}" ]; then
  scripts/services.sh
fi
scripts/kinesalite.sh
scripts/chromium.sh
# go.mod and go.sum are what `go mod tidy` makes them, here, in bench/ and
# in deploy/helm/chartcheck/ (modules of their own): -diff prints what tidy
# would change and fails, changing nothing.
go mod tidy -diff
(cd bench && go mod tidy -diff)
(cd deploy/helm/chartcheck && go mod tidy -diff)
go vet ./...
scripts/lint.sh
go test -race -count=1 -timeout 20m "$@" ./...
# The chart renders with the Helm SDK for every lease backend and equals
# deploy/kubernetes (its Kubernetes modules stay out of the main go.mod).
(cd deploy/helm/chartcheck && go vet ./... && go test -count=1 ./...)
