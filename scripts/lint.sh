#!/usr/bin/env bash
# Runs golangci-lint (configuration: .golangci.yaml) on the whole module and,
# with no arguments, on the bench module (bench/) too.
# Needs only Go: `go run pkg@version` fetches the pinned release through the
# module proxy and builds it outside our go.mod, so its dependencies stay out
# of the project; the built binary is cached (first run about 4 min on 2 cores,
# later runs start in seconds).
# Arguments go to `golangci-lint run`, e.g. scripts/lint.sh ./poller/...
set -euo pipefail
cd "$(dirname "$0")/.."
GOLANGCI_LINT=github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0
if [ "$#" -gt 0 ]; then
  exec go run "$GOLANGCI_LINT" run "$@"
fi
go run "$GOLANGCI_LINT" run ./...
cd bench
exec go run "$GOLANGCI_LINT" run --config ../.golangci.yaml ./...
