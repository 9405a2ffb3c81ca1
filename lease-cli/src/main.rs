//! `lease`: the operator's command. The fencing demo, commands that show and change runs, and
//! `lease run -- CMD`, which runs a command while holding a run's lease.

use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};
use distribution::RunState;
use lease_cli::{run_id, usage, Failure, StoreArgs};

use output::Format;

mod demo;
mod history;
mod ops;
mod output;
mod purger;
mod run;
mod schedule;
mod ui;
mod worker;

#[derive(Parser)]
#[command(
    name = "lease",
    version,
    about = "TTL leases on runs, guarded by fencing tokens"
)]
struct Cli {
    #[command(flatten)]
    store: StoreArgs,
    /// Output format of the commands that print records or results: text (tables and
    /// sentences) or json (one object; list and journal print one object per line, NDJSON).
    /// Each command's --json, deprecated, is an alias of -o json.
    #[arg(
        short = 'o',
        long = "output",
        global = true,
        value_name = "FORMAT",
        default_value = "text"
    )]
    output: Format,
    #[command(subcommand)]
    command: Command,
}

/// `lease queue …`.
#[derive(Subcommand)]
pub(crate) enum QueueAction {
    /// Pause QUEUE, fleet-wide: no worker claims its runs until it is resumed. Prints its
    /// state.
    Pause {
        /// The queue.
        queue: String,
    },
    /// Resume QUEUE: workers claim its runs again (idle ones are woken). Prints its
    /// state.
    Resume {
        /// The queue.
        queue: String,
    },
    /// List the queues that have runnable runs or were ever paused or resumed, with their
    /// state.
    List,
}

/// The deprecated `--json` of each command: hidden, the same as `-o json`.
#[derive(clap::Args)]
struct JsonAlias {
    /// Deprecated alias of -o json.
    #[arg(long, hide = true)]
    json: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Show the guarantee: a partitioned worker's late write is rejected by fence. Runs on the
    /// embedded store unless --store names one.
    Demo,
    /// Create a runnable run, claimable at once or after --delay, with an optional payload.
    /// Prints the run's id (generated when none is given); -o json prints its record.
    Create {
        /// The run id (1 to 255 bytes); without it a UUIDv7 is generated.
        run: Option<String>,
        /// While a live run (waiting, scheduled, held, retrying or suspended) has this unique
        /// key, create nothing and print that run's id (exit 0, a note on standard error).
        #[arg(long, value_name = "KEY")]
        unique_key: Option<String>,
        /// Not claimable until this long after the create, on the store's clock (a number and
        /// a unit, ms, s, m, h or d; at most 366 days). Waiting uses no attempt.
        #[arg(long, value_name = "AGE", value_parser = ops::parse_age)]
        delay: Option<Duration>,
        /// Not claimable before this time, on the store's clock (RFC 3339, for example
        /// 2026-12-24T09:00:00Z or 2026-12-24T10:00:00+01:00; at most 366 days ahead). etcd, which
        /// has no clock of its own to compare it with, takes it as a delay on this host's clock.
        #[arg(long, value_name = "TIME", value_parser = ops::parse_time, conflicts_with = "delay")]
        run_at: Option<std::time::SystemTime>,
        /// The run's payload, as this text (at most 64 KiB; handed to each claim's handler,
        /// never changed).
        #[arg(long, value_name = "TEXT", conflicts_with = "payload_file")]
        payload: Option<String>,
        /// The run's payload, as the bytes of this file (`-`: standard input); at most 64 KiB.
        #[arg(long, value_name = "FILE")]
        payload_file: Option<std::path::PathBuf>,
        /// The run's kind (1 to 64 bytes): only a worker serving this kind claims it. Without
        /// it, the run is of the kind `default`.
        #[arg(long, value_name = "KIND")]
        kind: Option<String>,
        /// The run's priority within its kind, 0 (the default, the lowest) to 9: a claim takes
        /// the claimable runs of the highest priority first.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(0..=9))]
        priority: Option<u8>,
        /// The run's queue (1 to 64 bytes): only a worker serving this queue claims it, and
        /// none while the queue is paused. Without it, the run is in the queue `default`.
        #[arg(long, value_name = "QUEUE")]
        queue: Option<String>,
        #[command(flatten)]
        json: JsonAlias,
    },
    /// Pause, resume or list queues. A paused queue is claimed by no worker of the fleet
    /// until it is resumed (runs already held finish; creates still add runs to it).
    Queue {
        #[command(subcommand)]
        action: QueueAction,
    },
    /// Show a run's record: state, owner, expiry on the store's clock, fence, heartbeats.
    Inspect {
        /// The run id.
        run: String,
        #[command(flatten)]
        json: JsonAlias,
    },
    /// List runs, ordered by id, printing each page of 1,000 as it arrives (the store's work
    /// per call is bounded, so a long listing never stalls other clients). The table's columns
    /// widen when a later page has longer values; -o json prints one JSON object per line.
    List {
        /// Only runs in this state: runnable, suspended, completed, failed or cancelled.
        #[arg(long)]
        state: Option<RunState>,
        /// Only runs whose lease expired and was not reclaimed.
        #[arg(long)]
        expired: bool,
        /// At most this many runs in total (any number from 1).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Only runs of this kind (`default`: runs created without one).
        #[arg(long, value_name = "KIND")]
        kind: Option<String>,
        /// Only runs in this queue (`default`: runs created without one), such as what waits
        /// in a paused queue.
        #[arg(long, value_name = "QUEUE")]
        queue: Option<String>,
        /// Only held runs whose holder claimed them at least AGE ago on the store's clock (a
        /// number and a unit, ms, s, m, h or d): the runs to look at first when something is
        /// stuck. Reads the runnable runs page by page (each store call bounded) and keeps
        /// those.
        #[arg(long, value_name = "AGE", value_parser = ops::parse_age, conflicts_with = "expired")]
        held_longer_than: Option<Duration>,
        /// Only runs a claim could take that have waited at least AGE since they became
        /// claimable (created, released, past their delay, resumed, or their lease expired),
        /// on the store's clock: the queue's stragglers. Reads the runnable runs page by page
        /// (each store call bounded) and keeps those. Not on etcd, which cannot tell.
        #[arg(long, value_name = "AGE", value_parser = ops::parse_age, conflicts_with = "held_longer_than")]
        waiting_longer_than: Option<Duration>,
        #[command(flatten)]
        json: JsonAlias,
    },
    /// Show a run's journal in order: each entry's sequence number, the fence it was written
    /// under, when the store accepted it, and its payload; -o json prints one object per line.
    Journal {
        /// The run id.
        run: String,
        #[command(flatten)]
        json: JsonAlias,
    },
    /// Make a suspended or failed run runnable again; its next claim takes a higher fence.
    Resume {
        /// The run id.
        run: String,
        #[command(flatten)]
        json: JsonAlias,
    },
    /// Deliver a signal to the wait TOKEN names (the token a handler took with
    /// `RunContext::signal_token`): the run becomes claimable and its next attempt reads the
    /// payload. Refused, with nothing stored, when the run no longer waits in that wait (an
    /// earlier wait's token, a timeout, a cancel, another payload already delivered); the same
    /// delivery sent again changes nothing and says so. With LEASE_SIGNAL_SECRET set, the
    /// token's signature is checked.
    Signal {
        /// The wait's token (`lst1.…`).
        token: String,
        /// The payload, as this text (at most 64 KiB).
        #[arg(long, value_name = "TEXT", conflicts_with = "payload_file")]
        payload: Option<String>,
        /// The payload, as the bytes of this file (`-`: standard input); at most 64 KiB.
        #[arg(long, value_name = "PATH")]
        payload_file: Option<std::path::PathBuf>,
        #[command(flatten)]
        json: JsonAlias,
    },
    /// End a run for good, in any state but completed: it is never claimed again, and a
    /// holder it has is fenced out (its next write, end or renewal is refused as cancelled;
    /// a `lease run` holding it stops its command and exits non-zero). Cancelling a cancelled
    /// run changes nothing.
    Cancel {
        /// The run id.
        run: String,
        /// Why (kept in the record; at most 4,096 bytes, no control character but tab and
        /// line feed).
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        json: JsonAlias,
    },
    /// Take a run from its holder (administrative takeover). The next claim gets a higher fence,
    /// which fences the old holder out.
    Release {
        /// The run id.
        run: String,
        /// Required: this ignores the holder's fence.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        json: JsonAlias,
    },
    /// Retention: remove completed, failed and cancelled runs that ended longer ago than --older-than,
    /// with their journals, oldest first, 1,000 per store call. Nothing of them is kept but the
    /// store's fence floor, so an id created again never reuses a fence.
    Purge {
        /// The age: a number and a unit, ms, s, m, h or d (for example 7d, 36h, 90s).
        #[arg(long, value_name = "AGE", value_parser = ops::parse_age)]
        older_than: Duration,
        /// Only count what would be removed.
        #[arg(long, conflicts_with = "every")]
        dry_run: bool,
        /// Keep purging every AGE until SIGINT or SIGTERM, taking turns with the other
        /// purgers of the store (other `lease purge --every` and workers with retention)
        /// under one lease: the run lease-purger, of kind lease-purger.
        #[arg(long, value_name = "AGE", value_parser = ops::parse_age)]
        every: Option<Duration>,
        /// With --every: the worker id recorded as the purge lease's owner; default HOST:PID.
        #[arg(long = "id", value_name = "WORKER", requires = "every")]
        id: Option<String>,
        #[command(flatten)]
        json: JsonAlias,
    },
    /// How many runs are in each state, and the queue's lag: how long the run that has waited
    /// longest has been claimable, on the store's clock (etcd cannot tell). Bounded work: each
    /// figure counts up to a million.
    Stats {
        #[command(flatten)]
        json: JsonAlias,
    },
    /// Create or upgrade the Postgres schema.
    Migrate,
    /// Bind an etcd:// store's prefix to the cluster its endpoints reach now, at its current
    /// Raft index: after a snapshot restore, every store refuses the prefix (its fences may
    /// have gone back) until an operator runs this, which first raises every run's fence and
    /// the fence floor by 2^32. Prints what was replaced.
    EtcdRebind,
    /// Rebind a postgres:// store's schema after a restore (point-in-time recovery, a base
    /// backup, an asynchronous standby promoted): every store refuses a server whose system
    /// identifier or timeline is not the one the schema was bound to, until an operator runs
    /// this, which raises every run's fence and the fence floor by 2^32 (nothing the old
    /// history issued is issued again; its holders are fenced out) and records the server.
    /// Prints what was replaced.
    PgRebind,
    /// Rebind a redis:// store's namespace after a restore (an older RDB or AOF put back):
    /// once a store saw the namespace's epoch go back, every store refuses it until an
    /// operator runs this, which raises every run's fence and the fence floor by 2^32 and
    /// clears the mark. Prints what was done.
    RedisRebind,
    /// Run a command while holding the run's lease (a singleton job across hosts): claim the
    /// run, start CMD with LEASE_RUN and LEASE_FENCE in its environment (which is lease's own,
    /// less the store's settings: LEASE_STORE, LEASE_NAMESPACE, LEASE_TTL_MS,
    /// LEASE_HEARTBEAT_MS, LEASE_REPLICAS, LEASE_REPLICA_TIMEOUT_MS, LEASE_SYNC_REPLICAS,
    /// LEASE_MAX_CONNECTIONS, LEASE_MIGRATE, LEASE_SIGNAL_SECRET), heartbeat while it runs, and stop it (SIGTERM, then SIGKILL after --kill-after-ms) before the lease can
    /// expire on the store's clock if the lease is lost. Exits with the command's code.
    Run(run::RunArgs),
    /// Serve runs as a worker of the fleet, running CMD once per run claimed (with LEASE_RUN,
    /// LEASE_FENCE, LEASE_KIND and LEASE_ATTEMPT in its environment, which is lease's own less
    /// the store's settings as for `lease run`, and the run's payload on its standard input): exit 0 completes the run, any other exit fails the attempt
    /// (retried with backoff up to --max-attempts). Each command is stopped (SIGTERM, then
    /// SIGKILL after --kill-after-ms) before its lease can expire on the store's clock.
    /// Runs until SIGINT or SIGTERM, then lets the commands finish for --grace and gives back
    /// the runs of those that do not.
    Worker(worker::WorkerArgs),
    /// Enqueue one run per tick of a schedule, NAME@UNIX_SECONDS, while this process holds
    /// the schedule's lease (in the namespace NAMESPACE_schedules); start one on each of
    /// several hosts and they take turns, each tick enqueued once. Runs until SIGINT or
    /// SIGTERM, then hands the lease over.
    Schedule(schedule::ScheduleArgs),
    /// Serve a web dashboard of the store: runs by state and the queue's lag, the held runs
    /// (holder, fence, expiry on the store's clock), failed runs with their reasons, and each
    /// run's record and journal; pages refresh themselves. Read-only unless --allow-actions.
    /// Runs until SIGINT or SIGTERM.
    Ui(ui::UiArgs),
    /// Print a shell completion script (for example `lease completions bash >
    /// /etc/bash_completion.d/lease`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// `-o FORMAT`, or `-o json` if the command's deprecated `--json` was given.
fn format(global: Format, alias: &JsonAlias) -> Format {
    if alias.json {
        Format::Json
    } else {
        global
    }
}

/// Refuses `-o json` for a command whose output is not a record.
fn text_only(what: &str, format: Format) -> Result<(), Failure> {
    match format {
        Format::Text => Ok(()),
        Format::Json => Err(usage(format!(
            "-o json does not apply to lease {what}: its output is not a record"
        ))),
    }
}

async fn dispatch(cli: Cli) -> Result<u8, Failure> {
    let out = cli.output;
    if let Command::Completions { shell } = cli.command {
        text_only("completions", out)?;
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "lease", &mut script);
        // A closed stdout (`| head`) ends the output early; nothing else is left to do.
        let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), &script);
        return Ok(0);
    }
    if let Command::Demo = cli.command {
        text_only("demo", out)?;
        // The demo needs no server: the embedded store unless one is named.
        let mut config = cli.store.load()?;
        if config.store.trim().is_empty() {
            config = config.with_store("memory:");
        }
        config.backend()?;
        return demo::run(&config).await.map(|()| 0);
    }
    let config = cli.store.config()?;
    match cli.command {
        Command::Demo => unreachable!("answered before the store is required"),
        Command::Create {
            run,
            unique_key,
            delay,
            run_at,
            payload,
            payload_file,
            kind,
            priority,
            queue,
            json,
        } => {
            let id = match run {
                Some(run) => run_id(&run)?,
                None => distribution::new_run_id(),
            };
            let mut new = distribution::NewRun::new(id).with_delay(delay.unwrap_or_default());
            if let Some(key) = unique_key {
                new = new.with_unique_key(key);
            }
            if let Some(at) = run_at {
                new = new.with_run_at(at);
            }
            if let Some(kind) = kind {
                new = new.with_kind(distribution::Kind::new(kind)?);
            }
            if let Some(priority) = priority {
                new = new.with_priority(priority);
            }
            if let Some(queue) = queue {
                new = new.with_queue(distribution::Queue::new(queue)?);
            }
            if let Some(bytes) = ops::payload_arg(payload, payload_file.as_deref())? {
                new = new.with_payload(bytes);
            }
            ops::create(&config, &new, format(out, &json)).await
        }
        Command::Queue { action } => ops::queue(&config, action, out).await,
        Command::Inspect { run, json } => {
            ops::inspect(&config, &run_id(&run)?, format(out, &json)).await
        }
        Command::List {
            state,
            expired,
            limit,
            kind,
            queue,
            held_longer_than,
            waiting_longer_than,
            json,
        } => {
            let kind = kind.map(distribution::Kind::new).transpose()?;
            let queue = queue.map(distribution::Queue::new).transpose()?;
            let age = match (held_longer_than, waiting_longer_than) {
                (Some(age), _) => Some(ops::Age::Held(age)),
                (None, Some(age)) => Some(ops::Age::Waiting(age)),
                (None, None) => None,
            };
            if let Some(age) = age.filter(|_| state.is_some_and(|s| s != RunState::Runnable)) {
                return Err(usage(format!(
                    "{} lists runnable runs: drop --state or give --state runnable",
                    age.flag()
                )));
            }
            let state = if age.is_some() {
                Some(RunState::Runnable)
            } else {
                state
            };
            let filter = distribution::ListFilter::new()
                .with_state(state)
                .with_expired(expired)
                .with_kind(kind)
                .with_queue(queue);
            ops::list(&config, filter, limit, age, format(out, &json)).await
        }
        Command::Journal { run, json } => {
            ops::journal(&config, &run_id(&run)?, format(out, &json)).await
        }
        Command::Resume { run, json } => {
            ops::resume(&config, &run_id(&run)?, format(out, &json)).await
        }
        Command::Signal {
            token,
            payload,
            payload_file,
            json,
        } => {
            let token: distribution::SignalToken = token.parse()?;
            let payload = ops::payload_arg(payload, payload_file.as_deref())?.unwrap_or_default();
            ops::signal(&config, &token, &payload, format(out, &json)).await
        }
        Command::Cancel { run, reason, json } => {
            ops::cancel(&config, &run_id(&run)?, &reason, format(out, &json)).await
        }
        Command::Release { run, force, json } => {
            if !force {
                return Err(usage(
                    "release without a lease needs --force: it takes the run from its holder",
                ));
            }
            ops::force_release(&config, &run_id(&run)?, format(out, &json)).await
        }
        Command::Purge {
            older_than,
            every: Some(every),
            id,
            ..
        } => purger::purge_every(&config, older_than, every, id).await,
        Command::Purge {
            older_than,
            dry_run,
            json,
            ..
        } => ops::purge(&config, older_than, dry_run, format(out, &json)).await,
        Command::Stats { json } => ops::stats(&config, format(out, &json)).await,
        Command::Migrate => ops::migrate(&config, out).await,
        Command::EtcdRebind => ops::etcd_rebind(&config, out).await,
        Command::PgRebind => ops::pg_rebind(&config, out).await,
        Command::RedisRebind => ops::redis_rebind(&config, out).await,
        Command::Schedule(args) => {
            text_only("schedule", out)?;
            return schedule::schedule(&config, args).await.map(|()| 0);
        }
        Command::Ui(args) => {
            text_only("ui", out)?;
            ui::ui(&config, args).await
        }
        Command::Run(args) => {
            text_only("run", out)?;
            return run::run(&config, args).await;
        }
        Command::Worker(args) => {
            text_only("worker", out)?;
            worker::worker(&config, args).await
        }
        Command::Completions { .. } => unreachable!("answered before the configuration"),
    }
    .map(|()| 0)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    lease_cli::main_with("lease", dispatch(cli))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// `lease run --help` names every store setting its command does not get.
    #[test]
    fn run_help_names_the_variables_kept_from_the_command() {
        let mut cli = super::Cli::command();
        let help = cli
            .find_subcommand_mut("run")
            .expect("lease run")
            .render_long_help()
            .to_string();
        for var in distribution::Config::ENV_VARS {
            assert!(help.contains(var), "{var} missing from lease run --help");
        }
    }
}
