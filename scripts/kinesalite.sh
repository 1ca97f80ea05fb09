#!/usr/bin/env bash
# Installs kinesalite (npm: the Kinesis emulator the tests and the benchmark
# run) where internal/testenv looks for it: $OUTBOXD_TEST_KINESALITE_DIR, or
# ~/.cache/outboxd/kinesalite. Installs npm with apt-get first when it is
# missing (Debian/Ubuntu, as root). Idempotent; fails, saying why, when it
# cannot install: the Kinesis tests fail without kinesalite.
set -euo pipefail
VERSION=3.3.3 # internal/testenv.KinesaliteVersion
dir=${OUTBOXD_TEST_KINESALITE_DIR:-$HOME/.cache/outboxd/kinesalite}
say() { printf 'kinesalite: %s\n' "$*" >&2; }

if [ -x "$dir/node_modules/.bin/kinesalite" ]; then
  exit 0
fi
if ! command -v npm >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  say "installing nodejs and npm with apt-get"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi
if ! command -v npm >/dev/null; then
  say "npm is needed to install kinesalite@$VERSION (the Kinesis tests run it): install Node.js and npm"
  exit 1
fi
say "installing kinesalite@$VERSION into $dir"
npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "kinesalite@$VERSION" >&2
