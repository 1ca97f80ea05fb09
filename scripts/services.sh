#!/usr/bin/env bash
# Makes Postgres and Redis available on localhost for outboxd's demo and tests.
#   1. reachable already (127.0.0.1:5432 with user postgres, 127.0.0.1:6379)? use them;
#   2. else a Docker engine answers? start postgres:15 / redis:7 containers;
#   3. else Debian/Ubuntu as root? apt-get install and start them;
#   4. else say precisely what to install.
# It also installs faketime (Debian/Ubuntu as root) when missing.
# Idempotent: run it as often as you like.
set -euo pipefail

PG_HOST=127.0.0.1 PG_PORT=5432 REDIS_PORT=6379
say() { printf 'services: %s\n' "$*" >&2; }

pg_up() {
  if command -v pg_isready >/dev/null; then
    pg_isready -q -h "$PG_HOST" -p "$PG_PORT" -U postgres
  else
    (exec 3<>"/dev/tcp/$PG_HOST/$PG_PORT") 2>/dev/null
  fi
}
redis_up() {
  if command -v redis-cli >/dev/null; then
    [ "$(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ]
  else
    (exec 3<>"/dev/tcp/127.0.0.1/$REDIS_PORT" && printf 'PING\r\n' >&3 && read -r -t 2 line <&3 && [[ $line == +PONG* ]]) 2>/dev/null
  fi
}
wait_for() { # name check
  for _ in $(seq 1 60); do "$2" && return 0; sleep 0.5; done
  say "$1 did not come up"; return 1
}

start_pg_debian() {
  local ver; ver=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -1)
  [ -n "$ver" ] || { say "no PostgreSQL cluster under /etc/postgresql"; return 1; }
  local hba="/etc/postgresql/$ver/main/pg_hba.conf"
  # A fresh local dev cluster: let user postgres in over loopback without a password.
  if ! grep -q '# outboxd-dev' "$hba"; then
    sed -i '1i host all postgres 127.0.0.1/32 trust # outboxd-dev\nhost all postgres ::1/128 trust # outboxd-dev' "$hba"
  fi
  pg_ctlcluster --skip-systemctl-redirect "$ver" main start 2>/dev/null || pg_ctlcluster --skip-systemctl-redirect "$ver" main reload
}
start_redis_debian() {
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
}

# Tests run private Postgres servers whose clock is offset (libfaketime,
# preloaded; internal/testenv StartPostgresServerClock).
if [ -z "$(ls /usr/lib/*/faketime/libfaketime.so.1 /usr/lib/faketime/libfaketime.so.1 2>/dev/null)" ] &&
  command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  say "installing faketime with apt-get"
  { DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime; } >/dev/null ||
    say "faketime could not be installed: the tests of a Postgres clock apart from the relay's will fail"
fi

# PgBouncer: the tests start their own (transaction pooling) in front of Postgres.
if [ ! -x /usr/sbin/pgbouncer ] && ! command -v pgbouncer >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    say "installing pgbouncer with apt-get"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >/dev/null
    # The package's own service is not needed: the tests run theirs.
    { systemctl disable --now pgbouncer || service pgbouncer stop; } >/dev/null 2>&1 || true
  else
    say "pgbouncer is missing (the pooler tests need /usr/sbin/pgbouncer): install it"
  fi
fi

# etcd: the fault tests of lock.backend etcd start their own members
# (test/fault/etcd_test.go) from Debian's etcd-server.
if ! command -v etcd >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    say "installing etcd-server with apt-get"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null
    # The package's own service is not needed: the tests run theirs.
    { systemctl disable --now etcd || service etcd stop; } >/dev/null 2>&1 || true
  else
    say "etcd is missing (the etcd fault tests need it): install Debian's etcd-server"
  fi
fi

if pg_up && redis_up; then say "Postgres and Redis are up"; exit 0; fi

# Installed but stopped (a fresh session, a reboot)?
if ! pg_up && ls /etc/postgresql/*/main >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  say "starting the installed PostgreSQL"; start_pg_debian || true
fi
if ! redis_up && command -v redis-server >/dev/null && [ "$(id -u)" = 0 ]; then
  say "starting the installed Redis"; start_redis_debian || true
fi
if pg_up && redis_up; then wait_for Postgres pg_up; say "Postgres and Redis are up"; exit 0; fi

if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  if ! pg_up; then
    say "starting Postgres in Docker (outboxd-postgres)"
    docker rm -f outboxd-postgres >/dev/null 2>&1 || true
    docker run -d --name outboxd-postgres -p "$PG_HOST:$PG_PORT:5432" -e POSTGRES_HOST_AUTH_METHOD=trust postgres:15-alpine >/dev/null
  fi
  if ! redis_up; then
    say "starting Redis in Docker (outboxd-redis)"
    docker rm -f outboxd-redis >/dev/null 2>&1 || true
    docker run -d --name outboxd-redis -p "127.0.0.1:$REDIS_PORT:6379" redis:7-alpine >/dev/null
  fi
  wait_for Postgres pg_up; wait_for Redis redis_up; say "Postgres and Redis are up (Docker)"; exit 0
fi

if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  pkgs=()
  pg_up || command -v pg_ctlcluster >/dev/null || pkgs+=(postgresql postgresql-client)
  redis_up || command -v redis-server >/dev/null || pkgs+=(redis-server)
  if [ ${#pkgs[@]} -gt 0 ]; then
    say "installing ${pkgs[*]} with apt-get"
    apt-get update -qq >/dev/null
    apt-get install -y -qq "${pkgs[@]}" >/dev/null
  fi
  pg_up || start_pg_debian
  redis_up || start_redis_debian
  wait_for Postgres pg_up; wait_for Redis redis_up; say "Postgres and Redis are up"; exit 0
fi

say "Postgres on $PG_HOST:$PG_PORT (user postgres, no password) and Redis on 127.0.0.1:$REDIS_PORT are needed."
say "Install PostgreSQL 14+ and Redis 7+ (or Docker), or run this script as root on Debian/Ubuntu,"
say "or point OUTBOXD_TEST_POSTGRES_DSN / OUTBOXD_TEST_REDIS_ADDR at running servers."
exit 1
