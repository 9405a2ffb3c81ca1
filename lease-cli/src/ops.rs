//! Operator commands: create, inspect, list, journal, resume, release --force, purge, migrate,
//! queue.

use distribution::{connect, Config, ListFilter, RunId, RunState};

use crate::output::{print_journal, print_record, Format, RecordStream};
use lease_cli::{usage, Failure};

pub(crate) async fn create(
    config: &Config,
    new: &distribution::NewRun,
    format: Format,
) -> Result<(), Failure> {
    new.check()?;
    let store = connect(config).await?;
    let (record, duplicate) = match store.create_with(new).await {
        Ok(record) => (record, false),
        // The live run holding the unique key: the answer, not a failure.
        Err(distribution::Error::AlreadyExists { run })
            if new.unique_key().is_some() && &run != new.run() =>
        {
            (store.inspect(&run).await?, true)
        }
        Err(e) => return Err(e.into()),
    };
    crate::output::print_created(&record, duplicate, new.unique_key(), format);
    Ok(())
}

/// The payload `lease create` was given: `--payload TEXT` as its UTF-8 bytes, or the bytes of
/// `--payload-file FILE` (`-`: standard input). A file is read up to one byte past the bound,
/// so a huge one is refused without being loaded; the bound itself is checked with the rest of
/// the run, before the store is contacted.
pub(crate) fn payload_arg(
    text: Option<String>,
    file: Option<&std::path::Path>,
) -> Result<Option<Vec<u8>>, Failure> {
    use std::io::Read;
    if let Some(text) = text {
        return Ok(Some(text.into_bytes()));
    }
    let Some(path) = file else {
        return Ok(None);
    };
    let limit = distribution::MAX_RUN_PAYLOAD_BYTES as u64 + 1;
    let mut bytes = Vec::new();
    let read = if path.as_os_str() == "-" {
        std::io::stdin().lock().take(limit).read_to_end(&mut bytes)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(limit).read_to_end(&mut bytes))
    };
    read.map_err(|e| {
        crate::usage(format!(
            "cannot read --payload-file {}: {e}",
            path.display()
        ))
    })?;
    Ok(Some(bytes))
}

/// A store for a read-only command: connecting runs no DDL (`migrate=false`), and a Postgres
/// schema without this release's migrations is refused, naming `lease migrate`.
pub(crate) async fn read_only(
    config: &Config,
) -> Result<std::sync::Arc<dyn distribution::LeaseStore>, Failure> {
    Ok(connect(&config.clone().with_migrations(false)).await?)
}

pub(crate) async fn inspect(config: &Config, run: &RunId, format: Format) -> Result<(), Failure> {
    let store = read_only(config).await?;
    let record = store.inspect(run).await?;
    print_record(&record, format);
    Ok(())
}

/// How many records `lease list` asks the store for at a time; each page is printed as it
/// arrives.
const LIST_PAGE: usize = 1_000;

/// A `lease list` filter on how long runs have been held or waited, on the store's clock.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Age {
    /// `--held-longer-than`: held runs claimed at least this long before the read.
    Held(std::time::Duration),
    /// `--waiting-longer-than`: claimable runs that have waited at least this long.
    Waiting(std::time::Duration),
}

impl Age {
    pub(crate) fn flag(self) -> &'static str {
        match self {
            Age::Held(_) => "--held-longer-than",
            Age::Waiting(_) => "--waiting-longer-than",
        }
    }

    fn keeps(self, record: &distribution::RunRecord) -> bool {
        match self {
            Age::Held(age) => record.held_for().is_some_and(|held| held >= age),
            Age::Waiting(age) => record.waiting_for().is_some_and(|waited| waited >= age),
        }
    }
}

/// Streams the runs that match, ordered by id, page by page (paging with
/// [`ListFilter::after`]), until `limit` records were printed or the store has no more. With
/// `age`, only the runs held or waiting at least that long when each page was read are
/// printed; pages are then read whole.
pub(crate) async fn list(
    config: &Config,
    base: ListFilter,
    limit: usize,
    age: Option<Age>,
    format: Format,
) -> Result<(), Failure> {
    if limit == 0 {
        return Err(usage("--limit must be at least 1"));
    }
    if matches!(age, Some(Age::Waiting(_))) && config.backend()? == distribution::Backend::Etcd {
        return Err(usage(
            "--waiting-longer-than needs the store's own clock, which etcd does not have: \
             `lease stats` cannot tell etcd's queue lag either",
        ));
    }
    let store = read_only(config).await?;
    let mut stream = RecordStream::new(format);
    let mut out = std::io::stdout();
    let mut after = None;
    while stream.printed() < limit {
        let wanted = if age.is_some() {
            LIST_PAGE
        } else {
            (limit - stream.printed()).min(LIST_PAGE)
        };
        let filter = base.clone().with_after(after.take()).with_limit(wanted);
        let page = store.list(&filter).await?;
        match age {
            None => stream.page(&mut out, &page),
            Some(age) => {
                let kept: Vec<_> = page
                    .iter()
                    .filter(|r| age.keeps(r))
                    .take(limit - stream.printed())
                    .cloned()
                    .collect();
                stream.page(&mut out, &kept)
            }
        }
        .map_err(closed_stdout)?;
        // A short page is the last: `list` returns fewer than asked only at the end.
        if page.len() < filter.limit {
            break;
        }
        after = page.last().map(|r| r.run.clone());
    }
    stream.finish(&mut out).map_err(closed_stdout)
}

fn closed_stdout(e: std::io::Error) -> Failure {
    Failure {
        code: lease_cli::exit::FAILURE,
        message: format!("cannot write the listing to stdout: {e}"),
    }
}

/// `lease journal RUN`: the run's journal in order, each entry with the fence it was written
/// under, printed entry by entry.
pub(crate) async fn journal(config: &Config, run: &RunId, format: Format) -> Result<(), Failure> {
    let store = read_only(config).await?;
    let entries = store.journal(run).await?;
    print_journal(&mut std::io::stdout().lock(), run, &entries, format).map_err(closed_stdout)
}

pub(crate) async fn resume(config: &Config, run: &RunId, format: Format) -> Result<(), Failure> {
    let store = connect(config).await?;
    let record = store.resume(run).await?;
    print_record(&record, format);
    Ok(())
}

/// `lease signal TOKEN`: the signalled run, and whether this delivery had been made before.
pub(crate) async fn signal(
    config: &Config,
    token: &distribution::SignalToken,
    payload: &[u8],
    format: Format,
) -> Result<(), Failure> {
    use distribution::SignalExt as _;
    let store = connect(config).await?;
    let signalled = store.signal(token, payload).await?;
    match format {
        Format::Json => println!(
            "{}",
            serde_json::json!({
                "run": token.run().as_str(),
                "signal": token.name().as_str(),
                "wait_fence": token.fence().get(),
                "duplicate": signalled.duplicate,
            })
        ),
        Format::Text if signalled.duplicate => println!(
            "{} had this signal {} already (the wait of fence {}); nothing changed",
            token.run(),
            token.name(),
            token.fence()
        ),
        Format::Text => println!(
            "signalled {} with {} ({} bytes, the wait of fence {}); it is claimable",
            token.run(),
            token.name(),
            payload.len(),
            token.fence()
        ),
    }
    Ok(())
}

/// `lease cancel RUN --reason TEXT`: the run's record once cancelled; for text, a sentence
/// naming the holder that was fenced out, if any.
pub(crate) async fn cancel(
    config: &Config,
    run: &RunId,
    reason: &str,
    format: Format,
) -> Result<(), Failure> {
    let store = connect(config).await?;
    let before = store.inspect(run).await?;
    let record = store.cancel(run, reason).await?;
    if format == Format::Text {
        match (&before.state, &before.owner) {
            (RunState::Cancelled, _) => println!("{run} was already cancelled; nothing changed"),
            (RunState::Runnable, Some(owner)) if !before.is_expired() => println!(
                "cancelled {run}; its holder {owner} (fence {}) is fenced out: its next write, \
                 end or renewal is refused",
                before.fence
            ),
            (state, _) => println!("cancelled {run} (it was {state})"),
        }
    }
    print_record(&record, format);
    Ok(())
}

pub(crate) async fn force_release(
    config: &Config,
    run: &RunId,
    format: Format,
) -> Result<(), Failure> {
    let store = connect(config).await?;
    let before = store.inspect(run).await?;
    let record = store.force_release(run).await?;
    if format == Format::Text {
        match &before.owner {
            Some(owner) if before.fence >= distribution::Fence::MAX => println!(
                "released {run} from {owner} (fence {}, the last fence there is); the run can \
                 never be claimed again (the next claim is refused as FenceExhausted), and \
                 {owner}'s writes are refused as LeaseEnded",
                before.fence
            ),
            Some(owner) => println!(
                "released {run} from {owner} (fence {}); the next claim takes fence {} and fences {owner} out",
                before.fence,
                before.fence.get() + 1
            ),
            None => println!("{run} had no holder; nothing to release"),
        }
    }
    print_record(&record, format);
    Ok(())
}

pub(crate) async fn migrate(config: &Config, format: Format) -> Result<(), Failure> {
    match config.backend()? {
        distribution::Backend::Postgres => {
            // Connecting runs the embedded migrations under the advisory lock.
            connect(config).await?;
            match format {
                Format::Text => println!("schema is up to date"),
                Format::Json => println!("{}", serde_json::json!({"schema": "up to date"})),
            }
            Ok(())
        }
        _ => Err(usage("migrate applies to a postgres:// store only")),
    }
}

/// `lease etcd-rebind`: the operator's decision after an etcd restore.
pub(crate) async fn etcd_rebind(config: &Config, format: Format) -> Result<(), Failure> {
    match config.backend()? {
        #[cfg(feature = "etcd")]
        distribution::Backend::Etcd => {
            let mut etcd = distribution::etcd::EtcdConfig::from_url(&config.store)?;
            if let Some(ns) = &config.namespace {
                etcd = etcd.with_prefix(ns.clone());
            }
            let prefix = etcd.prefix().to_owned();
            let rebound = distribution::etcd::EtcdLeaseStore::rebind(etcd).await?;
            let (cluster, index) = rebound.after;
            match format {
                Format::Text => match rebound.before {
                    Some((was, at)) => println!(
                        "prefix {prefix:?} rebound from cluster {was} (Raft index {at}) to \
                         cluster {cluster} (Raft index {index})"
                    ),
                    None => println!(
                        "prefix {prefix:?} bound to cluster {cluster} (Raft index {index})"
                    ),
                },
                Format::Json => println!(
                    "{}",
                    serde_json::json!({
                        "prefix": prefix,
                        "before": rebound.before.map(|(c, i)| serde_json::json!({"cluster": c, "raft_index": i})),
                        "after": {"cluster": cluster, "raft_index": index},
                    })
                ),
            }
            Ok(())
        }
        _ => Err(usage("etcd-rebind applies to an etcd:// store only")),
    }
}

/// `lease pg-rebind`: the operator's decision after a Postgres restore.
pub(crate) async fn pg_rebind(config: &Config, format: Format) -> Result<(), Failure> {
    match config.backend()? {
        distribution::Backend::Postgres => {
            let pg = config.postgres_config();
            let schema = pg.schema().to_owned();
            let rebound = distribution::postgres::PostgresLeaseStore::rebind(pg).await?;
            let (system, timeline) = rebound.after;
            match format {
                Format::Text => {
                    match rebound.before {
                        Some((was, on)) => println!(
                            "schema {schema:?} rebound from system identifier {was} (timeline                              {on}) to {system} (timeline {timeline})"
                        ),
                        None => println!(
                            "schema {schema:?} bound to system identifier {system} (timeline                              {timeline})"
                        ),
                    }
                    println!(
                        "{} run(s) had their fence raised by 2^32; the fence floor is now {}",
                        rebound.runs, rebound.floor
                    );
                }
                Format::Json => println!(
                    "{}",
                    serde_json::json!({
                        "schema": schema,
                        "before": rebound.before.map(|(s, t)| serde_json::json!({"system_identifier": s, "timeline": t})),
                        "after": {"system_identifier": system, "timeline": timeline},
                        "runs_raised": rebound.runs,
                        "fence_floor": rebound.floor,
                    })
                ),
            }
            Ok(())
        }
        _ => Err(usage("pg-rebind applies to a postgres:// store only")),
    }
}

/// `lease redis-rebind`: the operator's decision after a Redis restore.
pub(crate) async fn redis_rebind(config: &Config, format: Format) -> Result<(), Failure> {
    match config.backend()? {
        distribution::Backend::Redis => {
            let redis = config.redis_config();
            let namespace = redis.namespace().to_owned();
            let rebound = distribution::redis::RedisLeaseStore::rebind(redis).await?;
            match format {
                Format::Text => {
                    match &rebound.marker {
                        Some(why) => {
                            println!("namespace {namespace:?} was marked restored: {why}")
                        }
                        None => println!("namespace {namespace:?} was not marked restored"),
                    }
                    println!(
                        "{} run record(s) had their fence raised by 2^32; the fence floor is                          now {}; the namespace is served again",
                        rebound.runs, rebound.floor
                    );
                }
                Format::Json => println!(
                    "{}",
                    serde_json::json!({
                        "namespace": namespace,
                        "marker": rebound.marker,
                        "runs_raised": rebound.runs,
                        "fence_floor": rebound.floor,
                        "epoch": rebound.epoch,
                    })
                ),
            }
            Ok(())
        }
        _ => Err(usage("redis-rebind applies to a redis:// store only")),
    }
}

/// How many runs one `purge` call removes at most.
const PURGE_BATCH: usize = 1_000;

/// `lease purge --older-than AGE [--dry-run]`: removes ended runs older than `age` in batches
/// of [`PURGE_BATCH`] (each store call bounded), or only counts them.
pub(crate) async fn purge(
    config: &Config,
    age: std::time::Duration,
    dry_run: bool,
    format: Format,
) -> Result<(), Failure> {
    let store = connect(config).await?;
    let shown = humantime(age);
    if dry_run {
        let n = store.count_purgeable(age).await?;
        if format == Format::Json {
            println!(
                "{}",
                serde_json::json!({"dry_run": true, "older_than_ms": age.as_millis() as u64, "would_purge": n})
            );
        } else {
            println!("{n} completed or failed runs ended more than {shown} ago (dry run: nothing removed)");
        }
        return Ok(());
    }
    let mut purged: u64 = 0;
    loop {
        let batch = store.purge(age, PURGE_BATCH).await?;
        purged += batch.len() as u64;
        if batch.len() < PURGE_BATCH {
            break;
        }
    }
    if format == Format::Json {
        println!(
            "{}",
            serde_json::json!({"dry_run": false, "older_than_ms": age.as_millis() as u64, "purged": purged})
        );
    } else {
        println!("purged {purged} completed or failed runs ended more than {shown} ago");
    }
    Ok(())
}

/// `lease stats`: the runs in each state and the queue's lag, from one `count`, then the
/// runnable runs of each kind with its lag, from one `count_kinds`.
pub(crate) async fn stats(config: &Config, format: Format) -> Result<(), Failure> {
    let store = connect(config).await?;
    let counts = store.count().await?;
    // By kind where the store counts by kind (etcd does not: no table, "kinds": null).
    let kinds = match store.count_kinds().await {
        Ok(kinds) => Some(kinds),
        Err(distribution::Error::InvalidInput(distribution::InvalidInput::Unsupported {
            ..
        })) => None,
        Err(e) => return Err(e.into()),
    };
    let figures = counts.by_state();
    let micros = |age: std::time::Duration| u64::try_from(age.as_micros()).unwrap_or(u64::MAX);
    let lag_us = counts.oldest_claimable_age.map(micros);
    if format == Format::Json {
        let mut json = serde_json::Map::new();
        for (state, n) in figures {
            json.insert(state.to_owned(), n.into());
        }
        json.insert("oldest_claimable_age_us".to_owned(), lag_us.into());
        json.insert(
            "longest_held_us".to_owned(),
            counts.longest_held.map(micros).into(),
        );
        json.insert("max_count".to_owned(), distribution::MAX_COUNT.into());
        let kinds = kinds.map(|kinds| {
            kinds
                .iter()
                .map(|k| {
                    serde_json::json!({
                        "kind": k.kind.as_str(),
                        "runnable": k.runnable,
                        "claimable": k.claimable,
                        "oldest_claimable_age_us": k.oldest_claimable_age.map(micros),
                    })
                })
                .collect::<Vec<_>>()
        });
        json.insert("kinds".to_owned(), kinds.into());
        println!("{}", serde_json::Value::Object(json));
        return Ok(());
    }
    for (state, n) in figures {
        let at_least = if n >= distribution::MAX_COUNT {
            " (at least)"
        } else {
            ""
        };
        println!("{state:<10} {n}{at_least}");
    }
    match (counts.oldest_claimable_age, counts.claimable) {
        (_, 0) => println!("no run waits to be claimed"),
        (Some(age), _) => println!(
            "the longest-waiting claimable run has waited {:.3} s",
            age.as_secs_f64()
        ),
        (None, _) => println!("this store cannot tell how long runs have waited"),
    }
    match (counts.longest_held, counts.held) {
        (_, 0) => println!("no lease is held"),
        (Some(held), _) => println!(
            "the lease held longest has been held {:.3} s (lease list --held-longer-than finds it)",
            held.as_secs_f64()
        ),
        (None, _) => println!("this store cannot tell how long leases have been held"),
    }
    if let Some(kinds) = kinds.filter(|k| !k.is_empty()) {
        println!();
        println!(
            "{:<24} {:>9} {:>9}  longest wait",
            "kind", "runnable", "claimable"
        );
        for k in &kinds {
            let wait = k.oldest_claimable_age.map_or_else(
                || "-".to_owned(),
                |age| format!("{:.3} s", age.as_secs_f64()),
            );
            println!(
                "{:<24} {:>9} {:>9}  {wait}",
                k.kind.as_str(),
                k.runnable,
                k.claimable
            );
        }
    }
    Ok(())
}

/// Parses `--run-at`: an RFC 3339 time with its offset (`2026-12-24T09:00:00Z`).
pub(crate) fn parse_time(text: &str) -> Result<std::time::SystemTime, String> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(std::time::SystemTime::from)
        .map_err(|e| format!("{text:?} is not an RFC 3339 time such as 2026-12-24T09:00:00Z ({e})"))
}

/// Parses `7d`, `36h`, `90m`, `45s`, `500ms` (a whole number and a unit).
pub(crate) fn parse_age(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit: add ms, s, m, h or d (for example 7d)"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a whole number"))?;
    let ms_per = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => return Err(format!("unknown unit {other:?}: use ms, s, m, h or d")),
    };
    let ms = n
        .checked_mul(ms_per)
        .ok_or_else(|| format!("{text:?} is too long"))?;
    let age = std::time::Duration::from_millis(ms);
    if age > distribution::MAX_PURGE_AGE {
        return Err(format!("{text:?} is longer than the maximum of 100 years"));
    }
    Ok(age)
}

fn humantime(age: std::time::Duration) -> String {
    let ms = age.as_millis() as u64;
    for (unit, per) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms >= per && ms % per == 0 {
            return format!("{}{unit}", ms / per);
        }
    }
    format!("{ms}ms")
}

/// `lease queue pause|resume|list`: each queue on a line (`NAME paused|running since TIME`, or
/// `NAME running` for a queue never paused), or with `-o json` one object per queue (`queue`,
/// `paused`, `changed_at_us`: null for a queue never paused).
pub(crate) async fn queue(
    config: &Config,
    action: crate::QueueAction,
    format: Format,
) -> Result<(), Failure> {
    use crate::QueueAction;
    let name = |queue: &str| distribution::Queue::new(queue);
    let states = match action {
        QueueAction::Pause { queue } => {
            let queue = name(&queue)?;
            vec![connect(config).await?.pause_queue(&queue).await?]
        }
        QueueAction::Resume { queue } => {
            let queue = name(&queue)?;
            vec![connect(config).await?.resume_queue(&queue).await?]
        }
        QueueAction::List => connect(config).await?.queues().await?,
    };
    let mut out = std::io::stdout().lock();
    for state in &states {
        let changed_us = state.changed_at.map(distribution::StoreTime::as_micros);
        let line = match format {
            Format::Json => serde_json::json!({
                "queue": state.queue.as_str(),
                "paused": state.paused,
                "changed_at_us": changed_us,
            })
            .to_string(),
            Format::Text => format!(
                "{} {}{}",
                state.queue,
                if state.paused { "paused" } else { "running" },
                state
                    .changed_at
                    .map(|t| format!(
                        " since {}",
                        crate::output::rfc3339(t, chrono::SecondsFormat::Secs)
                    ))
                    .unwrap_or_default()
            ),
        };
        // A closed stdout (`| head`) ends the output early.
        if std::io::Write::write_all(&mut out, format!("{line}\n").as_bytes()).is_err() {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod age_tests {
    use super::parse_age;
    use std::time::Duration;

    #[test]
    fn ages_need_a_whole_number_and_a_unit() {
        assert_eq!(parse_age("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_age("36h"), Ok(Duration::from_secs(36 * 3_600)));
        assert_eq!(parse_age("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_age("0s"), Ok(Duration::ZERO));
        for bad in ["7", "d", "7 weeks", "-1d", "1.5h", "99999999999999999d"] {
            assert!(parse_age(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
