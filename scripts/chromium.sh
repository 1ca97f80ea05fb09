#!/usr/bin/env bash
# Installs Debian's chromium, the headless browser the console's tests
# (test/blackbox, console_browser_test.go) drive, when it is missing
# (Debian/Ubuntu, as root). Idempotent; fails, saying why, when it cannot
# install: in CI the browser tests fail without it.
set -euo pipefail
say() { printf 'chromium: %s\n' "$*" >&2; }

for b in chromium chromium-browser; do
  if command -v "$b" >/dev/null; then exit 0; fi
done
if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  say "installing chromium with apt-get"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  exit 0
fi
say "the console's browser tests need Chromium: install Debian's chromium package (apt-get install chromium)"
exit 1
