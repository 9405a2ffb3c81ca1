//! `lease run RUN -- CMD [ARGS…]`: runs a command while holding the run's lease, the way
//! `etcdctl lock NAME -- CMD` keeps a cron job a singleton across hosts.
//!
//! The lease is driven by a [`RunScope`]. **The safety rule:** the command must be dead before
//! the lease can expire on the store's clock, so that another holder's command never overlaps
//! it. The scope cancels at its local deadline, `send + TTL − margin`, where `send` is the
//! instant the last successful renewal (or the claim) was sent; the store's expiry is never
//! earlier than `send + TTL`. The margin here is [`min_margin`]`(TTL)` **plus the kill grace**:
//! SIGTERM goes out at the deadline, SIGKILL one grace later, so the command is killed (and
//! reaped) by `send + TTL − min_margin` at the latest, leaving `min_margin` for timer lateness
//! and the kernel to finish the kill. A renewal the store rejects cancels the scope at once,
//! and the same grace applies from then.
//!
//! The command runs in a process group of its own, and signals go to the whole group, so what
//! it started dies with it (`sh -c` loops, pipelines).

use std::ffi::OsString;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use distribution::{
    connect, min_margin, Backend, CancelReason, Config, Error, LeaseStore, LeaseStoreExt, RunId,
    RunScope, ScopeConfig, WorkerId,
};
use lease_cli::{exit, run_id, usage, without_store_env, Failure};
use rustix::process::{kill_process_group, Pid, Signal};
use tokio::process::Child;
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::{sleep, sleep_until, Instant};

/// Arguments of `lease run`.
#[derive(clap::Args)]
pub(crate) struct RunArgs {
    /// The run whose lease the command runs under.
    run: String,
    /// Create the run first if it does not exist.
    #[arg(long)]
    create: bool,
    /// Complete the run when the command exits 0, instead of releasing it (a completed run is
    /// never claimed again: use it for a job that must run once, not for a recurring one).
    #[arg(long)]
    complete: bool,
    /// While another holder has the run, keep trying to claim it for up to this many
    /// milliseconds (it is claimable when that lease expires or is released); 0 refuses at once.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    wait_ms: u64,
    /// The grace between SIGTERM and SIGKILL when the lease is lost or `lease run` is told to
    /// stop, in milliseconds; less than half the TTL. Default TTL/10.
    #[arg(long, value_name = "MS")]
    kill_after_ms: Option<u64>,
    /// The worker id recorded as the lease's owner; default HOST:PID.
    #[arg(long = "id", value_name = "WORKER")]
    id: Option<String>,
    /// The run's attempt budget: a run claimed after N attempts that failed (a non-zero exit,
    /// a timeout, a lost lease, a crash of `lease run` itself) is failed instead of run again
    /// (exit 4); `lease resume RUN` gives it a fresh budget. Unlimited by default.
    #[arg(long, value_name = "N")]
    max_attempts: Option<u64>,
    /// The attempt's deadline: SIGTERM to the command after MS milliseconds, SIGKILL one
    /// grace later; the attempt counts as failed, the run is given back, and `lease run`
    /// exits 124. Off by default.
    #[arg(long, value_name = "MS")]
    attempt_timeout_ms: Option<u64>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// How the lease is kept for the command: the kill grace, and the scope's timing built on it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Timing {
    pub(crate) grace: Duration,
    pub(crate) margin: Duration,
    pub(crate) heartbeat: Duration,
}

/// The scope's timing for `ttl`, so that SIGKILL is sent no later than `send + TTL −
/// min_margin(TTL)`: the margin is `min_margin + grace`. The heartbeat defaults to a third of
/// what is left of the TTL after the margin.
pub(crate) fn timing(
    ttl: Duration,
    kill_after_ms: Option<u64>,
    heartbeat: Option<Duration>,
) -> Result<Timing, Failure> {
    let grace = kill_after_ms.map_or(ttl / 10, Duration::from_millis);
    if grace.checked_mul(2).is_none_or(|twice| twice >= ttl) {
        return Err(usage(format!(
            "--kill-after-ms {} does not fit in the TTL of {} ms: the grace between SIGTERM and \
             SIGKILL must be less than half the TTL, so the command is killed before the lease \
             can expire",
            grace.as_millis(),
            ttl.as_millis()
        )));
    }
    let margin = min_margin(ttl) + grace;
    let heartbeat = heartbeat.unwrap_or_else(|| (ttl - margin) / 3);
    Ok(Timing {
        grace,
        margin,
        heartbeat,
    })
}

/// This host's name and the process id, the default lease owner.
pub(crate) fn default_worker() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}:{}", std::process::id())
}

/// The longest `--wait-ms`: a year.
const MAX_WAIT_MS: u64 = 365 * 86_400 * 1_000;

pub(crate) async fn run(config: &Config, args: RunArgs) -> Result<u8, Failure> {
    if config.backend()? == Backend::Memory {
        return Err(usage(
            "lease run keeps a command to one host at a time through a store every host shares; \
             memory: lives inside this one process, so every host would run the command: name a \
             shared store with --store or LEASE_STORE (postgres://, redis:// or etcd://)",
        ));
    }
    let run = run_id(&args.run)?;
    if args.wait_ms > MAX_WAIT_MS {
        return Err(usage(format!(
            "--wait-ms {} is longer than a year ({MAX_WAIT_MS} ms); give a shorter wait",
            args.wait_ms
        )));
    }
    let attempt_timeout = match args.attempt_timeout_ms {
        Some(0) => return Err(usage("--attempt-timeout-ms must be at least 1")),
        Some(ms) if ms > MAX_WAIT_MS => {
            return Err(usage(format!(
                "--attempt-timeout-ms {ms} is longer than a year ({MAX_WAIT_MS} ms); give a \
                 shorter deadline"
            )))
        }
        other => other.map(Duration::from_millis),
    };
    if args.max_attempts == Some(0) {
        return Err(usage("--max-attempts must be at least 1"));
    }
    let worker = WorkerId::new(args.id.clone().unwrap_or_else(default_worker))?;
    let timing = timing(
        config.ttl.as_duration(),
        args.kill_after_ms,
        config.heartbeat,
    )?;
    let mut scope_config = ScopeConfig::default()
        .with_heartbeat(timing.heartbeat)
        .with_margin(timing.margin);
    if let Some(n) = args.max_attempts {
        scope_config = scope_config.with_max_attempts(n);
    }
    let store = connect(config).await?;
    if args.create {
        store.ensure(&run).await?;
    }
    let scope = claim(store, &run, &worker, config, scope_config, args.wait_ms).await?;
    tracing::info!(%run, fence = %scope.fence(), %worker, "claimed; starting the command");

    // Installed before the command starts: a signal from now on is the command's to receive.
    let mut signals = Signals::new()?;
    let mut command = tokio::process::Command::new(&args.command[0]);
    without_store_env(&mut command)
        .args(&args.command[1..])
        .env("LEASE_RUN", run.as_str())
        .env("LEASE_FENCE", scope.fence().get().to_string())
        .process_group(0);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                exit::COMMAND_NOT_FOUND
            } else {
                exit::COMMAND_NOT_STARTED
            };
            let _ = end(
                &scope,
                Outcome::Failed(format!("the command could not start: {e}")),
            )
            .await;
            return Err(Failure {
                code,
                message: format!("cannot start {}: {e}", args.command[0].to_string_lossy()),
            });
        }
    };
    let group = child.id().and_then(|id| Pid::from_raw(id as i32));

    // Until the command exits or the lease is lost: forward stop signals, and SIGKILL one
    // grace after the first; at the attempt's deadline, SIGTERM, then SIGKILL one grace later.
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    let mut stopped_by_signal = false;
    let deadline = attempt_timeout.map(|d| Instant::now() + d);
    let mut timed_out = false;
    let status = loop {
        tokio::select! {
            biased;
            status = child.wait() => break Some(status),
            _ = scope.cancelled() => break None,
            Some(sig) = signals.next() => {
                tracing::info!(signal = ?sig, "forwarding to the command");
                send(group, sig);
                stopped_by_signal = true;
                kill_at.get_or_insert(Instant::now() + timing.grace);
            }
            _ = sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() && !timed_out => {
                tracing::warn!(timeout = ?attempt_timeout, "attempt deadline passed; stopping the command");
                timed_out = true;
                send(group, Signal::TERM);
                kill_at = Some(kill_at.map_or(Instant::now() + timing.grace, |at| at.min(Instant::now() + timing.grace)));
            }
            _ = sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() && !killed => {
                send(group, Signal::KILL);
                killed = true;
            }
        }
    };
    let Some(status) = status else {
        return lost(&scope, &mut child, group, timing.grace, kill_at).await;
    };
    // Whatever the command left behind in its group runs under the lease no longer.
    send(group, Signal::KILL);
    let status = status.map_err(|e| Failure {
        code: exit::FAILURE,
        message: format!("cannot wait for the command: {e}"),
    })?;
    let code = exit_code(status);
    let outcome = if timed_out {
        Outcome::Failed(format!(
            "attempt timed out after {} ms; the command was stopped",
            attempt_timeout.unwrap_or_default().as_millis()
        ))
    } else if status.success() {
        if args.complete {
            Outcome::Complete
        } else {
            Outcome::Release
        }
    } else if stopped_by_signal {
        // Told to stop (a deploy, an operator): the run is handed back, no attempt used.
        Outcome::Release
    } else {
        Outcome::Failed(format!("the command exited with {code}"))
    };
    let completing = matches!(outcome, Outcome::Complete);
    match end(&scope, outcome).await {
        Ok(()) if timed_out => Err(Failure {
            code: exit::ATTEMPT_TIMEOUT,
            message: format!(
                "the command outlived --attempt-timeout-ms {} and was stopped (its code {code}); \
                 run {run} is given back with the attempt counted",
                attempt_timeout.unwrap_or_default().as_millis()
            ),
        }),
        Ok(()) => Ok(code),
        Err(e) if completing => Err(Failure {
            message: format!("the command succeeded, but completing run {run} failed: {e}"),
            ..Failure::from(e)
        }),
        Err(e) => {
            eprintln!(
                "lease: the command exited; ending the lease on run {run} failed ({e}), so it \
                 expires by its TTL"
            );
            Ok(if timed_out {
                exit::ATTEMPT_TIMEOUT
            } else {
                code
            })
        }
    }
}

/// How the lease ends after the command.
enum Outcome {
    /// `--complete` and exit 0.
    Complete,
    /// Exit 0, or `lease run` was told to stop: handed back, no attempt used.
    Release,
    /// A non-zero exit, a timeout, a command that could not start: the attempt counts.
    Failed(String),
}

/// Claims `run`, waiting up to `wait_ms` while another holder has it.
async fn claim(
    store: Arc<dyn LeaseStore>,
    run: &RunId,
    worker: &WorkerId,
    config: &Config,
    scope_config: ScopeConfig,
    wait_ms: u64,
) -> Result<RunScope, Failure> {
    let give_up = Instant::now() + Duration::from_millis(wait_ms);
    let mut said = false;
    loop {
        let attempt =
            RunScope::claim(store.clone(), run, worker, config.ttl, scope_config.clone()).await;
        let retry_in = match &attempt {
            Err(Error::Held { remaining, .. } | Error::Delayed { remaining, .. }) => *remaining,
            // A failover or a lock held by a frozen client: a retry may succeed, within the
            // same patience.
            Err(e) if e.is_retryable() && wait_ms > 0 => Duration::from_millis(100),
            _ => return attempt.map_err(Failure::from),
        };
        let e = attempt.expect_err("a refusal");
        let now = Instant::now();
        if now >= give_up {
            return Err(Failure {
                message: if wait_ms == 0 {
                    format!("{e} (--wait-ms MS waits for it)")
                } else {
                    format!("{e}, still, after waiting {wait_ms} ms")
                },
                ..Failure::from(e)
            });
        }
        if !said {
            tracing::info!(%run, error = %e, wait_ms, "waiting to claim");
            said = true;
        }
        // Poll at least every 100 ms: a release makes the run claimable before its expiry.
        let pause = retry_in
            .clamp(Duration::from_millis(5), Duration::from_millis(100))
            .min(give_up - now);
        sleep(pause).await;
    }
}

/// The lease was lost: SIGTERM now, SIGKILL one grace after the scope was cancelled (or its
/// local deadline passed, whichever was first), then report.
async fn lost(
    scope: &RunScope,
    child: &mut Child,
    group: Option<Pid>,
    grace: Duration,
    stopping: Option<Instant>,
) -> Result<u8, Failure> {
    let (cancelled_at, reason) = scope
        .cancel_reason()
        .unwrap_or((Instant::now(), CancelReason::Shutdown));
    let mut kill_at = cancelled_at.min(scope.deadline()) + grace;
    if let Some(earlier) = stopping {
        kill_at = kill_at.min(earlier);
    }
    send(group, Signal::TERM);
    let how = tokio::select! {
        _ = child.wait() => "SIGTERM",
        _ = sleep_until(kill_at) => {
            send(group, Signal::KILL);
            let _ = child.wait().await;
            "SIGKILL"
        }
    };
    send(group, Signal::KILL);
    Err(Failure {
        code: exit::LEASE_LOST,
        message: format!(
            "lost the lease on run {} under fence {} ({reason}); the command was stopped with {how}",
            scope.run(),
            scope.fence()
        ),
    })
}

/// Ends the lease after the command as `outcome` says.
async fn end(scope: &RunScope, outcome: Outcome) -> distribution::Result<()> {
    match outcome {
        Outcome::Complete => scope.complete().await,
        Outcome::Release => scope.release().await,
        Outcome::Failed(reason) => {
            scope
                .attempt_failed(Duration::ZERO, &distribution::sanitize_reason(&reason))
                .await
        }
    }
}

/// Sends `signal` to the command's process group; a group that is gone is fine.
fn send(group: Option<Pid>, signal: Signal) {
    if let Some(group) = group {
        let _ = kill_process_group(group, signal);
    }
}

/// The command's exit code, or 128 + the signal that ended it (as a shell reports it).
pub(crate) fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => (128 + signal) as u8,
        (None, None) => exit::FAILURE,
    }
}

/// SIGINT, SIGTERM and SIGHUP to `lease run`, to be forwarded to the command.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Signals, Failure> {
        let on = |kind: SignalKind| {
            signal(kind).map_err(|e| Failure {
                code: exit::FAILURE,
                message: format!("cannot install a signal handler: {e}"),
            })
        };
        Ok(Signals {
            int: on(SignalKind::interrupt())?,
            term: on(SignalKind::terminate())?,
            hup: on(SignalKind::hangup())?,
        })
    }

    /// The next signal received. Cancel safe.
    async fn next(&mut self) -> Option<Signal> {
        tokio::select! {
            Some(()) = self.int.recv() => Some(Signal::INT),
            Some(()) = self.term.recv() => Some(Signal::TERM),
            Some(()) = self.hup.recv() => Some(Signal::HUP),
            else => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_margin_covers_the_grace_so_sigkill_precedes_the_store_expiry() {
        let ttl = Duration::from_millis(1_500);
        let t = timing(ttl, Some(300), None).unwrap_or_else(|f| panic!("{}", f.message));
        assert_eq!(t.grace, Duration::from_millis(300));
        assert_eq!(t.margin, min_margin(ttl) + t.grace);
        // SIGTERM at send + TTL − margin, SIGKILL one grace later: min_margin before expiry.
        assert_eq!(ttl - t.margin + t.grace, ttl - min_margin(ttl));
        assert_eq!(t.heartbeat, (ttl - t.margin) / 3);
        // The scope accepts it (heartbeat well inside the window).
        let defaults =
            timing(Duration::from_secs(30), None, None).unwrap_or_else(|f| panic!("{}", f.message));
        assert_eq!(defaults.grace, Duration::from_secs(3));
    }

    #[test]
    fn a_grace_of_half_the_ttl_or_more_is_refused_with_one_sentence() {
        let ttl = Duration::from_millis(1_500);
        for ms in [750, 2_000, u64::from(u32::MAX), u64::MAX] {
            let failure = timing(ttl, Some(ms), None).expect_err("refused");
            assert_eq!(failure.code, exit::USAGE);
            assert!(
                failure.message.starts_with(&format!(
                    "--kill-after-ms {ms} does not fit in the TTL of 1500 ms"
                )),
                "{}",
                failure.message
            );
        }
        assert!(timing(ttl, Some(749), None).is_ok());
        assert!(timing(ttl, Some(0), None).is_ok());
    }

    #[test]
    fn a_signal_death_is_reported_as_128_plus_the_signal() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 137);
        assert_eq!(exit_code(ExitStatus::from_raw(15)), 143);
    }
}
