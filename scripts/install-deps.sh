#!/usr/bin/env bash
# Installs what the build and the tests need when it is missing: PostgreSQL, Redis, iptables,
# etcd (server and etcdctl) and
# chromium (the browser test of `lease ui`). Needs
# root and apt-get to install; otherwise says what is missing. Stops the services Debian starts
# on install: the tests start private servers instead.
set -euo pipefail

log() { printf '==> %s\n' "$*" >&2; }

missing=()
pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
[ -n "$pg_bin" ] && [ -x "$pg_bin/initdb" ] || missing+=(postgresql)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v iptables >/dev/null || [ -x /usr/sbin/iptables ] || missing+=(iptables)
command -v etcd >/dev/null || missing+=(etcd-server)
command -v etcdctl >/dev/null || missing+=(etcd-client)
# The Postgres adapter's tests behind a transaction pooler start a private PgBouncer.
command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)

command -v chromium >/dev/null || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    log "missing ${missing[*]}: install them (apt-get install ${missing[*]}) or run as root"
  fi
fi
if command -v service >/dev/null && [ "$(id -u)" -eq 0 ]; then
  for s in redis-server postgresql etcd pgbouncer; do service "$s" stop >/dev/null 2>&1 || true; done
fi
