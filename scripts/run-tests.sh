#!/usr/bin/env bash
# Runs the workspace's test binaries, built once, in parallel by cost group (scripts/tests.list),
# each binary's output kept in its own log, and prints a table of where the time went.
#
#   bash scripts/run-tests.sh GROUP...        # unit, store, fault (benchmarks never run here)
#
# Called by scripts/test.sh after it has started the servers and exported their URLs; it can be
# run on its own against DATABASE_URL / REDIS_URL. Environment:
#   LEASE_TEST_JOBS   unit and store binaries run at once (default 3), beside one fault binary
#   LEASE_TEST_LOGS   where the logs go (default: a temporary folder, kept when a test fails)
#   LEASE_TEST_CARGO  extra arguments for the one `cargo test --no-run` (default none)
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '==> %s\n' "$*" >&2; }
[ $# -gt 0 ] || { echo "usage: run-tests.sh GROUP... (unit, store, fault)" >&2; exit 2; }
groups=" $* "
jobs=${LEASE_TEST_JOBS:-3}
logs=${LEASE_TEST_LOGS:-$(mktemp -d /tmp/lease-tests.XXXXXX)}
mkdir -p "$logs"

# --- one build: every test binary of the workspace with one feature set ------------------------
# Features of the whole suite: the facade with every backend, typed arguments and cron. The
# examples are built in the same pass (same features, so nothing is compiled twice), and the
# custom_backend example's conformance tests with the tests.
features="distribution/etcd distribution/serde distribution/cron distribution/otel"
log "cargo test --workspace --features \"$features\" --no-run (and the examples)"
# shellcheck disable=SC2086
cargo test --workspace --features "$features" --no-run --lib --bins --tests \
  --example custom_backend --message-format=json-render-diagnostics ${LEASE_TEST_CARGO:-} \
  >"$logs/build.json"
# shellcheck disable=SC2086
cargo build --workspace --features "$features" --examples --quiet ${LEASE_TEST_CARGO:-}
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
profile=debug
case " ${LEASE_TEST_CARGO:-} " in *" --release "*) profile=release ;; esac
# The whole-system tests start these binaries (tests/support/worker.rs), built above.
export LEASE_TEST_BIN_DIR="$target_dir/$profile"
export LEASE_EXAMPLES_DIR="$target_dir/$profile/examples"
# package<TAB>target<TAB>executable, for every test binary (libraries' unit tests included).
python3 - "$logs/build.json" >"$logs/binaries.tsv" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        t = m["target"]
        manifest = m["manifest_path"]
        pkg = m["package_id"].split("#")[0].rsplit("/", 1)[-1]
        kind = t["kind"][0]
        name = "lib" if kind in ("lib", "proc-macro") else t["name"]
        if kind in ("bin", "example"):
            name = kind + ":" + t["name"]
        print(f"{manifest}\t{name}\t{m['executable']}")
EOF

# --- the cost groups --------------------------------------------------------------------------
# scripts/tests.list: `group  package-dir  target  [test-binary arguments]`, one binary a line.
declare -A group_of args_of exe_of
order=()
while read -r group dir target rest; do
  case "$group" in ''|'#'*) continue ;; esac
  group_of["$dir/$target"]=$group
  args_of["$dir/$target"]=$rest
  order+=("$dir/$target")
done <scripts/tests.list
# Two entries are commands rather than binaries: the doc tests and the examples.
exe_of[./doc]=@doc
exe_of[./examples]=@examples

unlisted=()
while IFS=$'\t' read -r manifest target exe; do
  dir=$(dirname "$manifest")
  dir=${dir#"$PWD"}
  dir=${dir#/}
  dir=${dir:-.}
  key="$dir/$target"
  [ -n "${group_of[$key]:-}" ] || unlisted+=("$key")
  exe_of[$key]=$exe
done <"$logs/binaries.tsv"
if [ ${#unlisted[@]} -gt 0 ]; then
  log "test binaries with no cost group in scripts/tests.list: ${unlisted[*]}"
  exit 1
fi
queue=()
for key in "${order[@]}"; do
  group=${group_of[$key]}
  case "$groups" in *" $group "*) ;; *) continue ;; esac
  exe=${exe_of[$key]:-}
  if [ -z "$exe" ]; then
    log "scripts/tests.list names $key, which the build did not produce"
    exit 1
  fi
  queue+=("$group|$key|$exe")
done

# --- run them ---------------------------------------------------------------------------------
# Fault tests last and at most two at a time (they kill servers and cut links, and their margins
# are wider than a loaded machine's stalls only within limits); the rest in any order.
results="$logs/results.tsv"
: >"$results"
run_one() {
  local group=$1 key=$2 exe=$3
  local dir=${key%/*} target=${key##*/}
  local out
  out="$logs/$(printf '%s' "$key" | tr '/:' '__').log"
  local start end rc=0
  start=$(date +%s.%N)
  case "$exe" in
    @doc)
      # shellcheck disable=SC2086
      cargo test --workspace --features "$features" --doc ${LEASE_TEST_CARGO:-} >"$out" 2>&1 || rc=$?
      ;;
    @examples) run_examples >"$out" 2>&1 || rc=$? ;;
    *)
      # shellcheck disable=SC2086
      (cd "$dir" && exec "$exe" ${args_of[$key]}) >"$out" 2>&1 || rc=$?
      ;;
  esac
  end=$(date +%s.%N)
  local passed failed ignored
  passed=$(sed -n 's/^test result: .* \([0-9]*\) passed.*/\1/p' "$out" | awk '{s+=$1} END {print s+0}')
  failed=$(sed -n 's/^test result: .* \([0-9]*\) failed.*/\1/p' "$out" | awk '{s+=$1} END {print s+0}')
  ignored=$(sed -n 's/^test result: .* \([0-9]*\) ignored.*/\1/p' "$out" | awk '{s+=$1} END {print s+0}')
  printf '%s\t%s\t%s\t%.1f\t%s\t%s\t%s\t%s\n' "$group" "$dir" "$target" \
    "$(awk -v a="$start" -v b="$end" 'BEGIN {print b - a}')" "$rc" "$passed" "$failed" "$ignored" >>"$results"
  if [ "$rc" -ne 0 ]; then
    log "FAILED $key (exit $rc): $out"
  fi
}

# The examples are checks too: each runs against the servers and exits 0 only if what it
# demonstrates held. postgres_worker runs twice: stopped by SIGTERM once its first payments
# committed (it must shut down gracefully and exit 0), then to completion (it also finishes the
# runs the first one left, and finds no run paid twice).
run_examples() {
  set -e
  local bin=$LEASE_EXAMPLES_DIR
  echo "==> custom_backend"
  "$bin/custom_backend"
  echo "==> redis_fenced_script"
  "$bin/redis_fenced_script"
  echo "==> metrics"
  "$bin/metrics"
  echo "==> traces"
  "$bin/traces"
  echo "==> approval, on the embedded store and on Postgres"
  LEASE_STORE= "$bin/approval"
  LEASE_STORE="$DATABASE_URL" LEASE_NAMESPACE="example_approval_$$" "$bin/approval"
  echo "==> postgres_worker, stopped by SIGTERM mid-way"
  local out="$logs/postgres_worker.out"
  "$bin/postgres_worker" >"$out" 2>&1 &
  local example=$!
  for _ in $(seq 600); do
    grep -q '^ready:' "$out" && break
    kill -0 "$example" 2>/dev/null || break
    sleep 0.05
  done
  kill -TERM "$example" 2>/dev/null || true
  local rc=0
  wait "$example" || rc=$?
  cat "$out"
  if [ "$rc" -ne 0 ] || ! grep -q '^stopped by SIGTERM' "$out"; then
    echo "postgres_worker did not stop gracefully on SIGTERM (exit $rc)"
    return 1
  fi
  echo "==> postgres_worker, to completion"
  "$bin/postgres_worker"
}

run_queue() {
  local limit=$1
  shift
  local running=0
  for item in "$@"; do
    IFS='|' read -r group key exe <<<"$item"
    run_one "$group" "$key" "$exe" &
    running=$((running + 1))
    if [ "$running" -ge "$limit" ]; then
      wait -n || true
      running=$((running - 1))
    fi
  done
  wait || true
}

# Two lanes side by side: the fault tests one at a time (they kill servers, pause them and cut
# links; each is the only fault test running), and the rest $jobs at a time. Each lane takes its
# binaries in the order of scripts/tests.list, which lists the longest first.
first=()
faults=()
for item in "${queue[@]}"; do
  case "$item" in fault\|*) faults+=("$item") ;; *) first+=("$item") ;; esac
done
started=$(date +%s)
log "running ${#first[@]} binaries $jobs at a time, and beside them ${#faults[@]} fault binaries one at a time"
[ ${#first[@]} -gt 0 ] && run_queue "$jobs" "${first[@]}" &
lane=$!
[ ${#faults[@]} -gt 0 ] && run_queue 1 "${faults[@]}"
wait "$lane" || true
took=$(($(date +%s) - started))

# --- the table --------------------------------------------------------------------------------
echo
printf '%-6s %-34s %8s %6s %6s %7s  %s\n' group binary seconds passed failed ignored status
sort -t$'\t' -k4 -rn "$results" | while IFS=$'\t' read -r group dir target secs rc passed failed ignored; do
  status=ok
  [ "$rc" -ne 0 ] && status="FAILED (exit $rc)"
  printf '%-6s %-34s %8s %6s %6s %7s  %s\n' "$group" "$dir/$target" "$secs" "$passed" "$failed" "$ignored" "$status"
done
read -r total_passed total_failed total_ignored bad < <(awk -F'\t' '{p+=$6; f+=$7; i+=$8; if ($5 != 0) b++} END {print p+0, f+0, i+0, b+0}' "$results")
echo
echo "wall time of the runs: ${took} s; logs: $logs"
if [ "$bad" -gt 0 ]; then
  for f in $(awk -F'\t' '$5 != 0 {print $2 "/" $3}' "$results" | tr '/:' '__'); do
    echo "---- $logs/$f.log (last 60 lines)"
    tail -n 60 "$logs/$f.log"
  done
fi
echo "tests: $total_passed passed, $total_failed failed, $total_ignored skipped"
[ "$bad" -eq 0 ] && [ "$total_failed" -eq 0 ]
