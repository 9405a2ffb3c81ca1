#!/usr/bin/env bash
# The project's test command: installs what the tests need when it is missing (PostgreSQL,
# Redis, iptables, etcd: scripts/install-deps.sh), starts one private PostgreSQL and one private
# Redis on free loopback ports, exports DATABASE_URL and REDIS_URL for the test fixtures, runs
# the tests (scripts/run-tests.sh: one build, then the binaries in parallel by cost group, with a
# table of where the time went), and stops the servers however it exits.
#
#   bash scripts/test.sh                 # everything: unit, store and fault tests, and examples
#   bash scripts/test.sh --quick         # unit and store tests: the edit-test loop
#   bash scripts/test.sh -p lease-redis  # other arguments are passed to `cargo test`
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '==> %s\n' "$*" >&2; }

# --- install what is missing ------------------------------------------------------------------
bash scripts/install-deps.sh
pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)

# A free port below the fixtures' range (20000-32767) and below Linux's ephemeral range, where no
# outgoing connection takes it as its source port.
free_port() {
  python3 -c '
import random, socket
for port in random.sample(range(15000, 20000), 5000):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
'
}

work=$(mktemp -d /tmp/lease-test.XXXXXX)
chmod 755 "$work"
pg_data="$work/pg"
pids=()
cleanup() {
  status=$?
  if [ -f "$pg_data/postmaster.pid" ]; then
    as_pg "$pg_bin/pg_ctl" -D "$pg_data" -m immediate stop >/dev/null 2>&1 || true
  fi
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  # A server may still be writing its files as it stops: wait for it before removing them.
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work" 2>/dev/null || { sleep 1; rm -rf "$work" || true; }
  exit $status
}
trap cleanup EXIT INT TERM

# PostgreSQL refuses to run as root: run it as the `postgres` OS user then.
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# --- PostgreSQL -------------------------------------------------------------------------------
if [ -z "${DATABASE_URL:-}" ] && [ -n "$pg_bin" ]; then
  pg_port=$(free_port)
  mkdir -p "$pg_data"
  [ "$(id -u)" -eq 0 ] && chown postgres: "$pg_data"
  as_pg "$pg_bin/initdb" -D "$pg_data" -U postgres --auth=trust -E UTF8 >"$work/initdb.log" 2>&1
  as_pg "$pg_bin/pg_ctl" -D "$pg_data" -l "$pg_data/server.log" -w -t 60 start \
    -o "-p $pg_port -k $pg_data -c listen_addresses=127.0.0.1,127.0.0.2,127.0.0.3 -c max_connections=400 -c fsync=off" >/dev/null
  # fsync=off for speed, which the store refuses unless told: the tests accept it explicitly.
  export DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/postgres?volatile=true"
  log "PostgreSQL on 127.0.0.1:$pg_port"
fi

# --- Redis ------------------------------------------------------------------------------------
if [ -z "${REDIS_URL:-}" ] && command -v redis-server >/dev/null; then
  redis_port=$(free_port)
  mkdir -p "$work/redis"
  redis-server --port "$redis_port" --bind "127.0.0.1 127.0.0.2 127.0.0.3" --dir "$work/redis" \
    --appendonly yes --appendfsync always --save '' --daemonize no --logfile "$work/redis/server.log" &
  pids+=($!)
  for _ in $(seq 100); do
    redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  export REDIS_URL="redis://127.0.0.1:$redis_port"
  log "Redis on 127.0.0.1:$redis_port"
fi

# --- tests ------------------------------------------------------------------------------------
quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi
if [ $# -gt 0 ]; then
  log "cargo test $*"
  cargo test "$@"
  exit
fi
# One build of every test binary and example, then the binaries in parallel by cost group
# (scripts/tests.list): --quick runs the unit and store groups, the full command the fault
# group too.
export LEASE_TEST_LOGS="$work/logs"
if [ "$quick" -eq 1 ]; then
  bash scripts/run-tests.sh unit store
  exit
fi
bash scripts/run-tests.sh unit store fault
