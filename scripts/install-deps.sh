#!/usr/bin/env bash
# Installs what outboxchat's lab and tests need when it is missing:
# PostgreSQL server binaries (initdb, postgres) and redis-server (what
# `make demo` and `make up` need); with --test also pgbouncer (the
# connection-pooler tests) and promtool (from Debian's prometheus package:
# the deploy/ rules test runs `promtool check rules` and `promtool test
# rules`) and libfaketime (the clock-step test preloads it into a private
# Postgres to step that server's wall clock) and nats-server (the NATS
# JetStream broker's tests, natsq); with --browser Chromium for the browser test. `make test` and
# `make deps` pass both flags. Debian/Ubuntu only (apt-get); elsewhere it
# says what to install. It never starts or touches a system server: the
# tests and the lab run private servers on free ports.
set -euo pipefail

want_browser=0
want_test=0
for arg in "$@"; do
  case "$arg" in
    --browser) want_browser=1 ;;
    --test) want_test=1 ;;
    *) echo "usage: $0 [--test] [--browser]" >&2; exit 2 ;;
  esac
done

have_pg() {
  command -v initdb >/dev/null 2>&1 && command -v postgres >/dev/null 2>&1 && return 0
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1
}
have_redis() { command -v redis-server >/dev/null 2>&1; }
have_pgbouncer() { command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; }
have_promtool() { command -v promtool >/dev/null 2>&1; }
have_nats() { command -v nats-server >/dev/null 2>&1 || [ -x /usr/sbin/nats-server ]; }
have_faketime() { ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1; }
have_chromium() { command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || command -v google-chrome >/dev/null 2>&1; }

pkgs=()
have_pg || pkgs+=(postgresql)
have_redis || pkgs+=(redis-server)
if [ "$want_test" = 1 ]; then
  have_pgbouncer || pkgs+=(pgbouncer)
  have_promtool || pkgs+=(prometheus)
  have_faketime || pkgs+=(libfaketime)
  have_nats || pkgs+=(nats-server)
fi
if [ "$want_browser" = 1 ] && ! have_chromium; then pkgs+=(chromium); fi
[ ${#pkgs[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
  echo "outboxchat needs: ${pkgs[*]} (Debian names: postgresql = PostgreSQL 15+ server binaries, redis-server = Redis 7+, prometheus for its promtool, libfaketime, pgbouncer, nats-server, chromium). Install them with your package manager and run again." >&2
  exit 1
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "need root or sudo to apt-get install ${pkgs[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "installing ${pkgs[*]} with apt-get…" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# The prometheus package's maintainer scripts would start a Prometheus
# server where an init system runs: policy-rc.d (exit 101) tells
# invoke-rc.d not to start any service during this install. Only promtool
# is used.
prc=/usr/sbin/policy-rc.d
made_prc=0
if [ ! -e "$prc" ]; then
  printf '#!/bin/sh\nexit 101\n' | $sudo tee "$prc" >/dev/null && $sudo chmod +x "$prc" && made_prc=1
fi
trap 'if [ "$made_prc" = 1 ]; then $sudo rm -f "$prc"; fi' EXIT
$sudo apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
