//! `lease-test-worker worker`: the reference worker, and the program the whole-system tests drive.
//!
//! With `--pool N` it is a fleet worker built on the library's `Worker` (see [`crate::pool`]).
//! Otherwise it claims one run, drives it with a `RunScope`, and executes the steps it is sent
//! on stdin.
//! Every step's side effect goes to an external ledger **under the fence**, so after a takeover
//! the store refuses it. It prints one JSON event per line on stdout.
//!
//! Commands (one per line on stdin):
//!
//! | command | does |
//! |---|---|
//! | `step EFFECT` | records EFFECT in the ledger under the fence, in the background (the call may hang in a partition while later commands run) |
//! | `step-after MS EFFECT` | decides EFFECT now, under the current lease, and records it MS later |
//! | `tx-step MS EFFECT` | (Postgres) opens a fenced transaction, writes EFFECT in it, prints `tx_open` (with the server's `bound_ms`), and commits MS later |
//! | `wait` | waits for every step sent so far, then prints `idle` |
//! | `suspend`, `complete`, `release` | ends the lease through the scope |
//! | `exit` | waits for steps in flight, then exits (also on end of input) |

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distribution::{
    connect_store, CancelReason, CancellationToken, Config, Error, Lease, LeaseStore,
    LeaseStoreExt, RunScope, ScopeConfig, WorkerId,
};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::task::JoinSet;

use crate::ledger::Ledger;
use lease_cli::{run_id, usage, Failure};

/// Arguments of `lease-test-worker worker`.
#[derive(clap::Args)]
pub(crate) struct WorkerArgs {
    /// This worker's id, recorded as the lease owner.
    #[arg(long = "id")]
    id: String,
    /// The run to claim.
    #[arg(long, conflicts_with_all = ["next", "pool"])]
    run: Option<String>,
    /// Claim the next claimable run instead of a named one.
    #[arg(long, conflicts_with = "pool")]
    next: bool,
    /// Run the library's `Worker` with up to N jobs at once, until SIGINT or SIGTERM (then
    /// release what it holds); each job writes its effect and completes in one write.
    #[arg(long, value_name = "N")]
    pub(crate) pool: Option<usize>,
    #[command(flatten)]
    pub(crate) pool_args: crate::pool::PoolArgs,
    /// Create the run first if it does not exist.
    #[arg(long)]
    create: bool,
    /// Keep trying to claim for up to this many milliseconds while the run is held.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    wait_ms: u64,
    /// Serve the library's metrics in Prometheus text format on this address (for example
    /// 127.0.0.1:9464; port 0 picks one and the `metrics` event says which).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Safety margin of the local deadline in milliseconds (default TTL/10).
    #[arg(long, value_name = "MS")]
    margin_ms: Option<u64>,
}

/// Prints events as JSON lines, each stamped with the wall clock in microseconds (for ordering
/// events of several processes on one machine; never used for lease decisions).
#[derive(Clone)]
pub(crate) struct Events(Arc<Mutex<std::io::Stdout>>);

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

impl Events {
    pub(crate) fn stdout() -> Events {
        Events(Arc::new(Mutex::new(std::io::stdout())))
    }

    pub(crate) fn emit(&self, event: &str, mut fields: Value) {
        fields["event"] = json!(event);
        fields["at_us"] = json!(now_us());
        let mut out = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // A closed stdout means nobody listens; the worker carries on regardless.
        let _ = writeln!(out, "{fields}");
        let _ = out.flush();
    }
}

/// The JSON description of a refusal: its kind and, for fences, both numbers.
pub(crate) fn rejection(e: &Error) -> Value {
    match e {
        Error::StaleFence {
            presented, current, ..
        } => {
            json!({"reason": "stale_fence", "presented": presented, "current": current, "message": e.to_string()})
        }
        Error::LeaseEnded { fence, ended, .. } => json!({
            "reason": "lease_ended",
            "ended": ended.to_string(),
            "presented": fence, "current": fence, "message": e.to_string()
        }),
        Error::FenceAhead {
            presented, current, ..
        } => {
            json!({"reason": "fence_ahead", "presented": presented, "current": current, "message": e.to_string()})
        }
        other => {
            json!({"reason": if other.is_retryable() { "unavailable" } else { "other" }, "message": other.to_string()})
        }
    }
}

fn cancel_event(reason: &CancelReason) -> Value {
    match reason {
        CancelReason::Rejected(e) => {
            let mut v = rejection(e);
            v["cancel"] = json!("rejected");
            v
        }
        CancelReason::DeadlineExceeded { last_error, .. } => {
            json!({"cancel": "deadline", "message": reason.to_string(), "last_error": last_error})
        }
        CancelReason::Released => json!({"cancel": "released"}),
        CancelReason::Suspended => json!({"cancel": "suspended"}),
        CancelReason::Completed => json!({"cancel": "completed"}),
        _ => json!({"cancel": "shutdown", "message": reason.to_string()}),
    }
}

/// One line of the reference worker's stdin, parsed (see the module's table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Line<'a> {
    /// A blank line: nothing to do.
    Blank,
    /// `step EFFECT` (`delay_ms` 0) or `step-after MS EFFECT`.
    Step { delay_ms: u64, effect: &'a str },
    /// `tx-step MS EFFECT`.
    TxStep { hold_ms: u64, effect: &'a str },
    /// `wait`.
    Wait,
    /// `suspend`, `complete` or `release`: the command word.
    End(&'a str),
    /// `exit`.
    Exit,
    /// Not a command: what the `unknown_command` event quotes (the whole line for a command
    /// whose arguments do not parse, the first word otherwise).
    Unknown(&'a str),
}

/// Parses one line of stdin. Pure and total: any text gives a [`Line`].
///
/// The line is trimmed and split at its first space into a command word and the rest; words
/// after `wait`, `suspend`, `complete`, `release` and `exit` are ignored; the effect of
/// `step` is the rest as written (possibly empty); `step-after` and `tx-step` need a whole
/// number of milliseconds, a space, and the effect.
pub(crate) fn parse_line(line: &str) -> Line<'_> {
    let line = line.trim();
    let (command, rest) = line.split_once(' ').unwrap_or((line, ""));
    let ms_effect = || match rest.split_once(' ') {
        Some((ms, effect)) => ms.parse::<u64>().ok().map(|ms| (ms, effect)),
        None => None,
    };
    match command {
        "" => Line::Blank,
        "step" => Line::Step {
            delay_ms: 0,
            effect: rest,
        },
        "step-after" => match ms_effect() {
            Some((delay_ms, effect)) => Line::Step { delay_ms, effect },
            None => Line::Unknown(line),
        },
        "tx-step" => match ms_effect() {
            Some((hold_ms, effect)) => Line::TxStep { hold_ms, effect },
            None => Line::Unknown(line),
        },
        "wait" => Line::Wait,
        "suspend" | "complete" | "release" => Line::End(command),
        "exit" => Line::Exit,
        other => Line::Unknown(other),
    }
}

async fn claim(
    store: Arc<dyn LeaseStore>,
    args: &WorkerArgs,
    worker: &WorkerId,
    config: &Config,
    scope_config: ScopeConfig,
    events: &Events,
) -> Result<RunScope, Failure> {
    let give_up = tokio::time::Instant::now() + Duration::from_millis(args.wait_ms);
    loop {
        let attempt = if args.next {
            RunScope::claim_next(store.clone(), worker, config.ttl, 1, scope_config.clone())
                .await
                .map(|mut scopes| scopes.pop())
        } else {
            let run = run_id(args.run.as_deref().unwrap_or_default())?;
            RunScope::claim(
                store.clone(),
                &run,
                worker,
                config.ttl,
                scope_config.clone(),
            )
            .await
            .map(Some)
        };
        let retry_in = match attempt {
            Ok(Some(scope)) => return Ok(scope),
            Ok(None) => {
                events.emit("refused", json!({"reason": "none_claimable"}));
                Duration::from_millis(50)
            }
            Err(Error::Held {
                owner, remaining, ..
            }) => {
                events.emit(
                    "refused",
                    json!({"reason": "held", "owner": owner.as_str(), "remaining_ms": remaining.as_millis() as u64}),
                );
                remaining.min(Duration::from_millis(100))
            }
            // The store could not answer in time (a row lock held by a frozen holder, a failover):
            // a retry may succeed, within the same patience.
            Err(e) if e.is_retryable() && args.wait_ms > 0 => {
                events.emit(
                    "refused",
                    json!({"reason": "unavailable", "message": e.to_string()}),
                );
                Duration::from_millis(50)
            }
            Err(e) => return Err(e.into()),
        };
        if tokio::time::Instant::now() + retry_in > give_up {
            return Err(Failure {
                code: lease_cli::exit::REFUSED,
                message: "no run could be claimed in time".to_string(),
            });
        }
        tokio::time::sleep(retry_in).await;
    }
}

pub(crate) async fn run(config: &Config, args: WorkerArgs) -> Result<(), Failure> {
    let worker = WorkerId::new(&args.id)?;
    // The lease_runs gauge, every 5 s, on a connection of its own (a memory: store would be
    // another, empty store, so none there); refreshed while this function runs.
    let mut _counts = None;
    if let Some(addr) = &args.metrics {
        let bound = lease_cli::metrics::serve("--metrics", addr).await?;
        Events::stdout().emit(
            "metrics",
            json!({"addr": bound.to_string(), "path": "/metrics"}),
        );
        if config.backend()? != distribution::Backend::Memory {
            let counter = connect_store(config).await?.as_dyn();
            _counts = Some(distribution::observe::spawn_counts(
                counter,
                std::time::Duration::from_secs(5),
            ));
        }
    }
    if let Some(n) = args.pool {
        return crate::pool::run(config, worker, n, &args.pool_args, args.margin_ms).await;
    }
    if args.run.is_none() && !args.next {
        return Err(usage(
            "lease-test-worker worker needs --run RUN, --next or --pool N",
        ));
    }
    let events = Events(Arc::new(Mutex::new(std::io::stdout())));
    let connected = connect_store(config).await?;
    let store = connected.as_dyn();
    let ledger = Arc::new(Ledger::new(connected, &config.store).await?);
    if args.create {
        store
            .ensure(&run_id(args.run.as_deref().unwrap_or_default())?)
            .await?;
    }
    let mut scope_config = ScopeConfig::default();
    if let Some(hb) = config.heartbeat {
        scope_config = scope_config.with_heartbeat(hb);
    }
    if let Some(ms) = args.margin_ms {
        scope_config = scope_config.with_margin(Duration::from_millis(ms));
    }
    let scope = Arc::new(claim(store, &args, &worker, config, scope_config, &events).await?);
    events.emit(
        "claimed",
        json!({"worker": worker.as_str(), "run": scope.run().as_str(), "fence": scope.fence().get(), "ttl_ms": config.ttl.as_millis()}),
    );

    // Report heartbeats and the cancellation as they happen, until the scope ends or we exit.
    let exiting = CancellationToken::new();
    let watcher = {
        let (scope, events, exiting) = (scope.clone(), events.clone(), exiting.clone());
        tokio::spawn(async move {
            let mut seen = 0;
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            loop {
                tokio::select! {
                    _ = scope.cancelled() => break,
                    _ = exiting.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let renewals = scope.renewals();
                if renewals > seen {
                    seen = renewals;
                    events.emit(
                        "heartbeat",
                        json!({"renewals": renewals, "fence": scope.fence().get()}),
                    );
                }
            }
            if let Some((_, reason)) = scope.cancel_reason() {
                events.emit("cancelled", cancel_event(&reason));
            }
        })
    };

    let mut steps = JoinSet::new();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines
        .next_line()
        .await
        .map_err(|e| usage(format!("reading stdin: {e}")))?
    {
        match parse_line(&line) {
            Line::Blank => {}
            Line::Step { delay_ms, effect } => {
                // `step-after MS EFFECT`: the effect is decided now, under the current lease, and
                // written MS later, as a long computation would (or a process paused mid-step).
                let (delay, effect) = (delay_ms, effect.to_string());
                let lease: Lease = scope.lease();
                let (ledger, events) = (ledger.clone(), events.clone());
                if delay > 0 {
                    events.emit(
                        "step_planned",
                        json!({"effect": effect, "fence": lease.fence().get(), "delay_ms": delay}),
                    );
                }
                steps.spawn(async move {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    events.emit("write_sent", json!({"effect": effect, "fence": lease.fence().get()}));
                    match ledger.record(&lease, &effect).await {
                        Ok(()) => events.emit("write_accepted", json!({"effect": effect, "fence": lease.fence().get()})),
                        Err(e) if e.is_verdict() => {
                            let mut v = rejection(&e);
                            v["effect"] = json!(effect);
                            events.emit("write_rejected", v);
                        }
                        Err(e) => events.emit(
                            "write_failed",
                            json!({"effect": effect, "fence": lease.fence().get(), "retryable": e.is_retryable(), "message": e.to_string()}),
                        ),
                    }
                });
            }
            Line::TxStep { hold_ms, effect } => {
                let (hold, effect) = (hold_ms, effect.to_string());
                let lease: Lease = scope.lease();
                let (ledger, events) = (ledger.clone(), events.clone());
                steps.spawn(async move {
                    let fence = lease.fence().get();
                    events.emit("write_sent", json!({"effect": effect, "fence": fence}));
                    let opened = |bound: Duration| {
                        events.emit(
                            "tx_open",
                            json!({"effect": effect, "fence": fence, "bound_ms": bound.as_millis() as u64, "hold_ms": hold}),
                        )
                    };
                    let outcome = ledger
                        .record_held(&lease, &effect, Duration::from_millis(hold), opened)
                        .await;
                    match outcome {
                        Ok(()) => events.emit("write_accepted", json!({"effect": effect, "fence": fence})),
                        Err(e) if e.is_verdict() => {
                            let mut v = rejection(&e);
                            v["effect"] = json!(effect);
                            events.emit("write_rejected", v);
                        }
                        Err(e) => events.emit(
                            "write_failed",
                            json!({"effect": effect, "fence": fence, "retryable": e.is_retryable(), "message": e.to_string()}),
                        ),
                    }
                });
            }
            Line::Wait => {
                while steps.join_next().await.is_some() {}
                events.emit("idle", json!({}));
            }
            Line::End(command) => {
                let result = match command {
                    "suspend" => scope.suspend().await,
                    "complete" => scope.complete().await,
                    _ => scope.release().await,
                };
                let fence = scope.fence().get();
                match result {
                    Ok(()) => events.emit(
                        match command {
                            "suspend" => "suspended",
                            "complete" => "completed",
                            _ => "released",
                        },
                        json!({"run": scope.run().as_str(), "fence": fence}),
                    ),
                    Err(e) => {
                        let mut v = rejection(&e);
                        v["command"] = json!(command);
                        events.emit("end_failed", v);
                    }
                }
            }
            Line::Exit => break,
            Line::Unknown(quoted) => events.emit("unknown_command", json!({"command": quoted})),
        }
    }
    while steps.join_next().await.is_some() {}
    exiting.cancel();
    let _ = watcher.await;
    // The last reference: dropping the scope stops its heartbeat. The lease is not released;
    // it expires by its TTL, as a crashed worker's would.
    drop(scope);
    events.emit("exited", json!({}));
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{parse_line, Line};

    /// The parser as it was written inline in the stdin loop before it became `parse_line`,
    /// kept as the oracle that the refactoring changed nothing.
    fn inline_parser(line: &str) -> Line<'_> {
        let line = line.trim();
        let (command, rest) = line.split_once(' ').unwrap_or((line, ""));
        match command {
            "" => Line::Blank,
            "step" | "step-after" => match command {
                "step" => Line::Step {
                    delay_ms: 0,
                    effect: rest,
                },
                _ => match rest.split_once(' ').map(|(ms, e)| (ms.parse::<u64>(), e)) {
                    Some((Ok(ms), e)) => Line::Step {
                        delay_ms: ms,
                        effect: e,
                    },
                    _ => Line::Unknown(line),
                },
            },
            "tx-step" => match rest.split_once(' ').map(|(ms, e)| (ms.parse::<u64>(), e)) {
                Some((Ok(hold), effect)) => Line::TxStep {
                    hold_ms: hold,
                    effect,
                },
                _ => Line::Unknown(line),
            },
            "wait" => Line::Wait,
            "suspend" | "complete" | "release" => Line::End(command),
            "exit" => Line::Exit,
            other => Line::Unknown(other),
        }
    }

    #[test]
    fn commands_and_their_malformed_neighbours() {
        let cases: &[(&str, Line<'_>)] = &[
            ("", Line::Blank),
            ("  \t ", Line::Blank),
            (
                "step charge card",
                Line::Step {
                    delay_ms: 0,
                    effect: "charge card",
                },
            ),
            (
                "step",
                Line::Step {
                    delay_ms: 0,
                    effect: "",
                },
            ),
            (
                " step-after 250 e ",
                Line::Step {
                    delay_ms: 250,
                    effect: "e",
                },
            ),
            ("step-after 250", Line::Unknown("step-after 250")),
            ("step-after -1 e", Line::Unknown("step-after -1 e")),
            (
                "step-after 18446744073709551616 e",
                Line::Unknown("step-after 18446744073709551616 e"),
            ),
            (
                "step-after 18446744073709551615 e",
                Line::Step {
                    delay_ms: u64::MAX,
                    effect: "e",
                },
            ),
            ("step-after  5 e", Line::Unknown("step-after  5 e")),
            (
                "tx-step 10 e f",
                Line::TxStep {
                    hold_ms: 10,
                    effect: "e f",
                },
            ),
            ("tx-step x e", Line::Unknown("tx-step x e")),
            ("wait now", Line::Wait),
            ("complete", Line::End("complete")),
            ("release please", Line::End("release")),
            ("exit", Line::Exit),
            ("STEP x", Line::Unknown("STEP")),
            ("step\tx", Line::Unknown("step\tx")),
        ];
        for (line, expected) in cases {
            assert_eq!(parse_line(line), *expected, "{line:?}");
            assert_eq!(inline_parser(line), *expected, "{line:?}");
        }
    }

    /// Lines near the valid ones: a command word (or a near miss), separators, a number of
    /// milliseconds (or a near miss) and an effect.
    fn near_valid() -> impl Strategy<Value = String> {
        let word = prop::sample::select(vec![
            "step",
            "step-after",
            "tx-step",
            "wait",
            "suspend",
            "complete",
            "release",
            "exit",
            "",
            "Step",
            "step-afte",
            "tx_step",
            "exit\u{0}",
        ]);
        let sep = prop::sample::select(vec![" ", "  ", "\t", "", " \u{a0}", "\r\n"]);
        let ms = prop_oneof![
            any::<u64>().prop_map(|n| n.to_string()),
            Just("18446744073709551616".to_owned()),
            Just("-1".to_owned()),
            Just("+5".to_owned()),
            Just("1e3".to_owned()),
            Just(String::new()),
            "[0-9]{1,30}",
            ".{0,4}",
        ];
        (word, sep.clone(), ms, sep, any::<String>(), ".{0,3}").prop_map(
            |(word, s1, ms, s2, effect, tail)| format!("{word}{s1}{ms}{s2}{effect}{tail}"),
        )
    }

    fn check(line: &str) -> Result<(), TestCaseError> {
        let parsed = parse_line(line);
        prop_assert_eq!(parsed, inline_parser(line));
        let trimmed = line.trim();
        match parsed {
            Line::Blank => prop_assert!(trimmed.is_empty()),
            Line::Step { effect, .. } | Line::TxStep { effect, .. } => {
                prop_assert!(trimmed.ends_with(effect));
            }
            Line::Unknown(quoted) => {
                prop_assert!(trimmed.starts_with(quoted) && !quoted.is_empty())
            }
            Line::Wait | Line::End(_) | Line::Exit => {}
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 2_000,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Any text parses to a command or an `Unknown` naming it, never a panic, exactly as
        /// the inline parser did.
        #[test]
        fn any_line_parses_without_panicking(line in any::<String>()) {
            check(&line)?;
        }

        /// Bytes off the wire are read as lines of (lossy) UTF-8 text first.
        #[test]
        fn any_bytes_parse_without_panicking(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            check(&String::from_utf8_lossy(&bytes))?;
        }

        #[test]
        fn near_valid_lines_parse_without_panicking(line in near_valid()) {
            check(&line)?;
        }
    }
}
