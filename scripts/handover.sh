#!/usr/bin/env bash
# Measures daemon-level handover with two outboxd processes on localhost:
# graceful (SIGTERM the leader: its "lock released" to the standby's "lock
# acquired") and crash (kill -9 the leader: the kill to "lock acquired").
# Usage: scripts/handover.sh [runs] [lock_ttl]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5} ttl=${2:-5s}
scripts/services.sh
mkdir -p bin .tmp
go build -o bin/outboxd ./cmd/outboxd
go build -o bin/outboxd-demo ./cmd/outboxd-demo
export OUTBOXD_POSTGRES_DSN="postgres://postgres@127.0.0.1:5432/outboxd_handover?sslmode=disable"
export OUTBOXD_REDIS_KEY_PREFIX="handover:$$:" OUTBOXD_POLLER_LOCK_TTL=$ttl OUTBOXD_DISPATCH_SINK=noop
bin/outboxd-demo createdb -dsn "$OUTBOXD_POSTGRES_DSN"
bin/outboxd migrate >/dev/null

start() { OUTBOXD_HTTP_ADDR=127.0.0.1:$1 bin/outboxd run > ".tmp/handover-$1.log" 2>&1 & echo $!; }
ms() { python3 -c 'import sys,datetime as d; print(int(d.datetime.fromisoformat(sys.argv[1][:26]).timestamp()*1000))' "$1"; }
acquired_at() { grep '"lock acquired"' "$1" | grep -m1 outbox:poller | python3 -c 'import sys,json; print(json.loads(sys.stdin.readline())["time"])'; }

for kind in graceful crash; do
  for run in $(seq 1 "$runs"); do
    a=$(start 9181); sleep 1.5; b=$(start 9182); sleep 1
    if [ "$kind" = graceful ]; then
      kill -TERM "$a"; wait "$a" || true
      t0=$(grep '"lock released"' .tmp/handover-9181.log | grep -m1 outbox:poller | python3 -c 'import sys,json; print(json.loads(sys.stdin.readline())["time"])')
      t0=$(ms "$t0")
    else
      t0=$(python3 -c 'import time; print(int(time.time()*1000))'); kill -9 "$a"; wait "$a" 2>/dev/null || true
    fi
    for _ in $(seq 1 400); do grep -q '"lock acquired"' .tmp/handover-9182.log && break; sleep 0.05; done
    t1=$(ms "$(acquired_at .tmp/handover-9182.log)")
    echo "$kind run $run: $((t1 - t0)) ms"
    kill -TERM "$b"; wait "$b" || true
  done
done
