#!/usr/bin/env bash
# The project's test command: installs what the tests need when it is missing (PostgreSQL,
# Redis, iptables, etcd, protoc: scripts/install-deps.sh), starts one private PostgreSQL and one private Redis on free loopback ports,
# exports DATABASE_URL and REDIS_URL for the test fixtures, runs the whole workspace's tests, and
# stops the servers however it exits. Extra arguments go to `cargo test`.
#
#   bash scripts/test.sh                 # everything
#   bash scripts/test.sh -p lease-redis  # arguments are passed to `cargo test`
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '==> %s\n' "$*" >&2; }

# --- install what is missing ------------------------------------------------------------------
bash scripts/install-deps.sh
pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

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
if [ $# -gt 0 ]; then
  log "cargo test $*"
  cargo test "$@"
else
  log "cargo test --workspace --exclude distribution --exclude lease-etcd"
  cargo test --workspace --exclude distribution --exclude lease-etcd
  log "cargo test -p lease-core --features serde --test args (typed run arguments)"
  cargo test -p lease-core --features serde --test args
  # etcd: the suite and the model on a private three-member cluster. Its scenarios mostly wait
  # out whole-second leases, so they run three at a time (more, and the three members on two
  # cores starve the heartbeat scenarios' margins); the fault tests (SIGKILL of the leader,
  # iptables cuts) one at a time.
  log "cargo test -p lease-etcd (three-member cluster)"
  cargo test -p lease-etcd --lib --test conformance --test model -- --test-threads=3
  cargo test -p lease-etcd --test faults --test operations --test wake -- --test-threads=1
  # The examples are checks too: each runs against the servers above and exits 0 only if what
  # it demonstrates held. postgres_worker runs twice: stopped by SIGTERM once its first
  # payments committed (it must shut down gracefully and exit 0), then to completion (it also
  # finishes the runs the first one left, and finds no run paid twice).
  log "examples"
  cargo build -p distribution --examples
  cargo run -q -p distribution --example custom_backend
  cargo run -q -p distribution --example redis_fenced_script
  cargo run -q -p distribution --example metrics
  log "example postgres_worker, stopped by SIGTERM mid-way"
  out="$work/postgres_worker.out"
  cargo run -q -p distribution --example postgres_worker >"$out" 2>&1 &
  example=$!
  for _ in $(seq 600); do
    grep -q '^ready:' "$out" && break
    kill -0 "$example" 2>/dev/null || break
    sleep 0.05
  done
  kill -TERM "$example" 2>/dev/null || true
  rc=0
  wait "$example" || rc=$?
  cat "$out"
  if [ "$rc" -ne 0 ] || ! grep -q '^stopped by SIGTERM' "$out"; then
    log "postgres_worker did not stop gracefully on SIGTERM (exit $rc)"
    exit 1
  fi
  log "example postgres_worker, to completion"
  cargo run -q -p distribution --example postgres_worker
  log "cargo test -p distribution --example custom_backend (the conformance suite)"
  cargo test -p distribution --example custom_backend
  # The whole-system tests start worker processes and cut the network: one at a time.
  log "cargo test -p distribution -- --test-threads=1"
  cargo test -p distribution -- --test-threads=1
fi
