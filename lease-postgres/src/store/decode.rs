//! Reading rows: records, leases, verdicts and the columns the statements take.

use super::*;

/// Whether `e` is the driver's unique violation (23505), folded into this adapter's error.
pub(crate) fn is_duplicate_key(e: &Error) -> bool {
    matches!(e, Error::Backend { detail, .. } if detail.to_string().contains("journal_idem_key"))
}

/// What a refused claim or fenced write is judged against.
pub(crate) struct Explained {
    pub(crate) state: RunState,
    pub(crate) owner: Option<WorkerId>,
    pub(crate) fence: Fence,
    pub(crate) remaining: Option<Duration>,
    pub(crate) delay: Option<Duration>,
}

impl Explained {
    pub(crate) fn from_row(row: &PgRow) -> Result<Explained, PgError> {
        let remaining: Option<i64> = get(row, "remaining_us")?;
        let delay: Option<i64> = get(row, "delay_us")?;
        Ok(Explained {
            state: state(get(row, "state")?)?,
            owner: worker(get(row, "lease_owner")?)?,
            fence: fence(get(row, "fence")?)?,
            remaining: remaining.map(|us| Duration::from_micros(us.max(0) as u64)),
            delay: delay.map(|us| Duration::from_micros(us.max(0) as u64)),
        })
    }
}

/// The verdict on `lease` of a row holding its run's `fence`, `state` and `lease_owner`:
/// `Ok(Err(refusal))`, or `Ok(Ok(()))` when the row allows the lease's writes.
pub(crate) fn row_verdict(lease: &Lease, row: &PgRow) -> Result<Result<()>, PgError> {
    Ok(count_stale(fenced_verdict(
        lease.run(),
        lease.fence(),
        fence(get(row, "fence")?)?,
        state(get(row, "state")?)?,
        get::<Option<String>>(row, "lease_owner")?.is_some(),
    )))
}

pub(crate) fn get<'r, T>(row: &'r PgRow, column: &str) -> Result<T, PgError>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(column).map_err(PgError::from)
}

pub(crate) fn corrupt(why: impl fmt::Display) -> PgError {
    PgError::Corrupt {
        table: "runs",
        why: why.to_string(),
    }
}

/// A run id read from the store.
pub(crate) fn run_id(value: String) -> Result<RunId, PgError> {
    RunId::new(value).map_err(corrupt)
}

pub(crate) fn fence(value: i64) -> Result<Fence, PgError> {
    u64::try_from(value)
        .ok()
        .and_then(|v| Fence::new(v).ok())
        .ok_or_else(|| corrupt(format!("fence {value} out of range")))
}

pub(crate) fn store_time(micros: i64) -> Result<StoreTime, PgError> {
    u64::try_from(micros)
        .map(StoreTime::from_micros)
        .map_err(|_| corrupt(format!("time {micros}us before the Unix epoch")))
}

pub(crate) fn state(name: String) -> Result<RunState, PgError> {
    name.parse().map_err(corrupt)
}

pub(crate) fn worker(owner: Option<String>) -> Result<Option<WorkerId>, PgError> {
    owner.map(WorkerId::new).transpose().map_err(corrupt)
}

pub(crate) fn fence_param(fence: Fence) -> i64 {
    fence.get() as i64 // at most Fence::MAX = i64::MAX
}

pub(crate) fn ttl_param(ttl: Ttl) -> i64 {
    ttl.as_millis() as i64 // at most one day
}

pub(crate) fn record(row: &PgRow) -> Result<RunRecord, PgError> {
    let expires: Option<i64> = get(row, "expires_us")?;
    let heartbeats: i64 = get(row, "heartbeats")?;
    let mut record = RunRecord::new(
        RunId::new(get::<String>(row, "run_id")?).map_err(corrupt)?,
        state(get(row, "state")?)?,
        fence(get(row, "fence")?)?,
        store_time(get(row, "observed_us")?)?,
    )
    .with_heartbeats(u64::try_from(heartbeats).map_err(corrupt)?)
    .with_not_before(
        get::<Option<i64>>(row, "not_before_us")?
            .map(store_time)
            .transpose()?,
    )
    .with_failure(get(row, "failure")?)
    .with_attempts(count(get(row, "attempts")?)?);
    record.owner = worker(get(row, "lease_owner")?)?;
    record.expires_at = expires.map(store_time).transpose()?;
    // The statements that read the payload (create, inspect) return it; the others have no
    // such column, and leave it None.
    if row.try_column("payload").is_ok() {
        record.payload = get(row, "payload")?;
    }
    if row.try_column("trace_parent").is_ok() {
        record.trace_parent = trace_parent(row)?;
    }
    // Every statement that returns a record returns its kind, but an older statement text (a
    // test's own query) may not.
    if row.try_column("kind").is_ok() {
        record.kind = kind(row)?;
    }
    record.wait = wait(row)?;
    record.resumed = resumed(row)?;
    if row.try_column("queue").is_ok() {
        record.queue = queue(row)?;
    }
    if row.try_column("priority").is_ok() {
        record.priority = priority(row)?;
    }
    if row.try_column("created_us").is_ok() {
        let time = |column: &str| get::<Option<i64>>(row, column)?.map(store_time).transpose();
        record = record.with_times(lease_core::RunTimes {
            created_at: time("created_us")?,
            claimed_at: time("claimed_us")?,
            renewed_at: time("renewed_us")?,
            ended_at: time("ended_us")?,
        });
    }
    if row.try_column("claimable_since_us").is_ok() {
        record = record.with_claimable_since(
            get::<Option<i64>>(row, "claimable_since_us")?
                .map(store_time)
                .transpose()?,
        );
    }
    // inspect returns the attempt history, one array per field.
    if row.try_column("h_outcome").is_ok() {
        record = record.with_history(history(row)?);
    }
    Ok(record)
}

/// The ended attempts in `h_*` columns of `row` (null arrays: none).
pub(crate) fn history(row: &PgRow) -> Result<Vec<lease_core::Attempt>, PgError> {
    let outcomes: Vec<String> = get::<Option<_>>(row, "h_outcome")?.unwrap_or_default();
    let n = outcomes.len();
    let column = |name: &str| -> Result<Vec<Option<i64>>, PgError> {
        let v: Vec<Option<i64>> = get::<Option<_>>(row, name)?.unwrap_or_default();
        if v.len() == n {
            Ok(v)
        } else {
            Err(corrupt(format!(
                "history column {name} has {} entries, not {n}",
                v.len()
            )))
        }
    };
    let (attempts, fences) = (column("h_attempt")?, column("h_fence")?);
    let (claimed, ended) = (column("h_claimed_us")?, column("h_ended_us")?);
    let workers: Vec<Option<String>> = get::<Option<_>>(row, "h_worker")?.unwrap_or_default();
    let errors: Vec<Option<String>> = get::<Option<_>>(row, "h_error")?.unwrap_or_default();
    if workers.len() != n || errors.len() != n {
        return Err(corrupt("history columns of different lengths"));
    }
    let mut out = Vec::with_capacity(n);
    for (i, outcome) in outcomes.iter().enumerate() {
        let outcome: lease_core::AttemptOutcome = outcome.parse().map_err(corrupt)?;
        let number = count(attempts[i].ok_or_else(|| corrupt("history entry without n"))?)?;
        let fence = Fence::new(count(fences[i].unwrap_or(0))?).map_err(corrupt)?;
        let worker =
            worker(workers[i].clone())?.ok_or_else(|| corrupt("history entry without w"))?;
        let at = |us: Option<i64>| us.map(store_time).transpose();
        out.push(
            lease_core::Attempt::new(number, fence, worker, outcome)
                .with_times(at(claimed[i])?, at(ended[i])?)
                .with_error(errors[i].clone()),
        );
    }
    Ok(out)
}

/// The row's `priority` column.
pub(crate) fn priority(row: &PgRow) -> Result<u8, PgError> {
    let p: i16 = get(row, "priority")?;
    u8::try_from(p)
        .ok()
        .filter(|p| *p <= lease_core::MAX_PRIORITY)
        .ok_or_else(|| corrupt(format!("priority {p} out of range")))
}

/// The row's `queue` column.
pub(crate) fn queue(row: &PgRow) -> Result<lease_core::Queue, PgError> {
    lease_core::Queue::new(get::<String>(row, "queue")?).map_err(corrupt)
}

/// A queue's row, as `sql/pause_queue.sql` and `sql/queues.sql` return it.
pub(crate) fn queue_state(row: &PgRow) -> Result<lease_core::QueueState, PgError> {
    let changed: Option<i64> = get(row, "changed_us")?;
    Ok(lease_core::QueueState::new(
        queue(row)?,
        get(row, "paused")?,
        changed.map(store_time).transpose()?,
    ))
}

/// The row's `kind` column.
pub(crate) fn kind(row: &PgRow) -> Result<Kind, PgError> {
    Kind::new(get::<String>(row, "kind")?).map_err(corrupt)
}

/// A non-negative counter column.
pub(crate) fn count(value: i64) -> Result<u64, PgError> {
    u64::try_from(value).map_err(|_| corrupt(format!("counter {value} below zero")))
}

pub(crate) fn leased(
    run: &RunId,
    owner: &WorkerId,
    fence: Fence,
    ttl: Ttl,
    expires_at: StoreTime,
    attempt: u64,
) -> Result<Lease> {
    Ok(
        Lease::new(run.clone(), owner.clone(), fence, ttl, expires_at)
            .map_err(corrupt)?
            .with_attempt(attempt),
    )
}

/// The renewed lease: the same, to a new expiry (the payload carried over: it never changes).
pub(crate) fn renewed(lease: &Lease, expires_at: StoreTime) -> Result<Lease> {
    Ok(leased(
        lease.run(),
        lease.owner(),
        lease.fence(),
        lease.ttl(),
        expires_at,
        lease.attempt(),
    )?
    .carrying(lease))
}

/// A row's `trace_parent` column.
pub(crate) fn trace_parent(row: &PgRow) -> Result<Option<lease_core::TraceParent>, PgError> {
    get::<Option<String>>(row, "trace_parent")?
        .map(lease_core::TraceParent::new)
        .transpose()
        .map_err(corrupt)
}

/// A claim row's payload column, shared.
pub(crate) fn payload(row: &PgRow) -> Result<Option<std::sync::Arc<[u8]>>, PgError> {
    Ok(get::<Option<Vec<u8>>>(row, "payload")?.map(std::sync::Arc::from))
}

/// A start delay as the statements take it: whole milliseconds, rounded up (checked, so at
/// most 366 days).
pub(crate) fn millis(new: &NewRun) -> i64 {
    i64::try_from(new.delay_millis()).unwrap_or(i64::MAX)
}

/// `sql/create.sql`'s arguments after the run id (`$2` to `$8`), bound to `query`.
pub(crate) fn bind_create<'q>(
    query: Query<'q, Postgres, PgArguments>,
    new: &'q NewRun,
) -> Query<'q, Postgres, PgArguments> {
    query
        .bind(millis(new))
        .bind(new.payload())
        .bind(new.kind().as_str())
        .bind(new.run_at_micros())
        .bind(i16::from(new.priority()))
        .bind(new.unique_key())
        .bind(new.queue().as_str())
        .bind(new.trace_parent().map(lease_core::TraceParent::as_str))
}

/// The columns `sql/create_many.sql` takes for a batch: ids, start delays, payloads, kinds,
/// run_at times, priorities, unique keys, queues and trace parents.
pub(crate) type CreateColumns<'a> = (
    Vec<&'a str>,
    Vec<i64>,
    Vec<Option<&'a [u8]>>,
    Vec<&'a str>,
    Vec<Option<i64>>,
    Vec<i16>,
    Vec<Option<&'a str>>,
    Vec<&'a str>,
    Vec<Option<&'a str>>,
);

/// The columns of `runs` for `sql/create_many.sql`.
pub(crate) fn create_many_columns(runs: &[NewRun]) -> CreateColumns<'_> {
    (
        runs.iter().map(|n| n.run().as_str()).collect(),
        runs.iter().map(millis).collect(),
        runs.iter().map(NewRun::payload).collect(),
        runs.iter().map(|n| n.kind().as_str()).collect(),
        runs.iter().map(NewRun::run_at_micros).collect(),
        runs.iter().map(|n| i16::from(n.priority())).collect(),
        runs.iter().map(NewRun::unique_key).collect(),
        runs.iter().map(|n| n.queue().as_str()).collect(),
        runs.iter()
            .map(|n| n.trace_parent().map(lease_core::TraceParent::as_str))
            .collect(),
    )
}

/// `sql/create_many.sql`'s arguments, bound to `query`.
pub(crate) fn bind_create_many<'q>(
    query: Query<'q, Postgres, PgArguments>,
    columns: &'q CreateColumns<'q>,
) -> Query<'q, Postgres, PgArguments> {
    let (ids, delays, payloads, kinds, run_at, priorities, unique_keys, queues, traces) = columns;
    query
        .bind(ids)
        .bind(delays)
        .bind(payloads)
        .bind(kinds)
        .bind(run_at)
        .bind(priorities)
        .bind(unique_keys)
        .bind(queues)
        .bind(traces)
}

/// How the run's last wait ended, from a row's `resumed_name`, `resumed_fence`,
/// `resumed_at_us` and `resumed_payload` (a null payload: it timed out); `None` when the row has
/// no such columns or the run's last wait is forgotten.
pub(crate) fn resumed(row: &PgRow) -> Result<Option<lease_core::WaitEnd>, PgError> {
    if row.try_column("resumed_name").is_err() {
        return Ok(None);
    }
    let Some(name) = get::<Option<String>>(row, "resumed_name")? else {
        return Ok(None);
    };
    let name = lease_core::SignalName::new(name).map_err(corrupt)?;
    let fence = fence(
        get::<Option<i64>>(row, "resumed_fence")?
            .ok_or_else(|| corrupt("a wait end without its fence"))?,
    )?;
    let at = store_time(
        get::<Option<i64>>(row, "resumed_at_us")?
            .ok_or_else(|| corrupt("a wait end without its time"))?,
    )?;
    Ok(Some(
        match get::<Option<Vec<u8>>>(row, "resumed_payload")? {
            Some(payload) => {
                lease_core::WaitEnd::Signalled(lease_core::Signal::new(name, fence, at, payload))
            }
            None => lease_core::WaitEnd::TimedOut { name, fence, at },
        },
    ))
}

/// The run's wait, from a row's `wait_name`, `wait_deadline_us` and `wait_fence`; `None` when
/// the row has no such columns or the run does not wait.
pub(crate) fn wait(row: &PgRow) -> Result<Option<lease_core::Wait>, PgError> {
    if row.try_column("wait_name").is_err() {
        return Ok(None);
    }
    let Some(name) = get::<Option<String>>(row, "wait_name")? else {
        return Ok(None);
    };
    let name = lease_core::SignalName::new(name).map_err(corrupt)?;
    let deadline = get::<Option<i64>>(row, "wait_deadline_us")?
        .map(store_time)
        .transpose()?;
    let fence = fence(
        get::<Option<i64>>(row, "wait_fence")?
            .ok_or_else(|| corrupt("a wait without its fence"))?,
    )?;
    Ok(Some(lease_core::Wait::new(name, deadline, fence)))
}
