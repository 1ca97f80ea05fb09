#!/usr/bin/env bash
# The relay end to end: Postgres + Redis up, migrations applied, outboxd
# running, a producer writing events and a local receiver printing them.
# DEMO_SECONDS (default 15) is how long the producer writes; 0 = until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh

mkdir -p bin .tmp
go build -o bin/outboxd ./cmd/outboxd
go build -o bin/outboxd-demo ./cmd/outboxd-demo

export OUTBOXD_POSTGRES_DSN="postgres://postgres@127.0.0.1:5432/outboxd_demo?sslmode=disable"
export OUTBOXD_REDIS_KEY_PREFIX="demo:"
export OUTBOXD_DISPATCH_WEBHOOK_URL="http://127.0.0.1:8081/events"
export OUTBOXD_DISPATCH_WEBHOOK_SECRET="demo-secret"
export OUTBOXD_POLLER_POLL_INTERVAL=100ms

pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

bin/outboxd-demo createdb -dsn "$OUTBOXD_POSTGRES_DSN"
bin/outboxd migrate --config config.yaml
bin/outboxd-demo receive -addr 127.0.0.1:8081 -secret demo-secret & pids+=($!)
bin/outboxd run --config config.yaml & pids+=($!)
outboxd_pid=$!
sleep 1

secs=${DEMO_SECONDS:-15}
echo "--- producing events for ${secs}s (0 = until Ctrl-C); each line below is one delivery ---"
bin/outboxd-demo produce -dsn "$OUTBOXD_POSTGRES_DSN" -rate 10 -for "${secs}s" || true
sleep 2
echo "--- outboxd status ---"
bin/outboxd status --config config.yaml
echo "--- stopping outboxd (SIGTERM: finish in flight, release the lock) ---"
kill -TERM "$outboxd_pid"; wait "$outboxd_pid" || true
