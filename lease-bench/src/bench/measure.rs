//! One measured operation: the library and the raw path interleaved, timed, then validated
//! against the store, and the table of results.

use super::*;

/// Performs operation `k` of `op` on `path` for one client (the caller times it). `batch` is the
/// client's leases as raw tuples, built before timing starts.
#[allow(clippy::too_many_arguments)]
pub(super) async fn one(
    op: Op,
    path: Path,
    k: usize,
    client: &ClientWork,
    batch: &[(&str, u64, u64)],
    ttl: Ttl,
    lib: &Arc<dyn LeaseStore>,
    raw: &Raw,
    claimed: &mut Vec<(String, u64)>,
) -> Result<(), BenchError> {
    match (op, path) {
        (Op::Claim, Path::Lib) => {
            let lease = lib.claim(&client.runs[k], &client.worker, ttl).await?;
            if lease.fence().get() != 1 {
                return Err(BenchError::wrong("claim of a fresh run: fence 1"));
            }
        }
        (Op::Claim, Path::Raw) => {
            let run = client.runs[k].as_str();
            let fence = if raw.is_best() {
                raw.best_claim(run, client.worker.as_str(), TTL_MS).await?
            } else {
                raw.claim(run, client.worker.as_str(), TTL_MS).await?
            };
            if fence != 1 {
                return Err(BenchError::wrong("raw claim of a fresh run: fence 1"));
            }
        }
        (Op::Renew, Path::Lib) => drop(lib.renew(&client.leases[0]).await?),
        (Op::Renew, Path::Raw) if raw.is_best() => {
            let (run, fence, ttl) = batch[0];
            raw.best_renew(run, fence, ttl).await?
        }
        (Op::Renew, Path::Raw) => {
            let (run, fence, ttl) = batch[0];
            raw.renew(run, fence, ttl).await?
        }
        (Op::Append, Path::Lib) => {
            if lib.append(&client.leases[0], PAYLOAD).await?.seq == 0 {
                return Err(BenchError::wrong("append: seq from 1"));
            }
        }
        (Op::Append, Path::Raw) => {
            let (run, fence, _) = batch[0];
            if raw.append(run, fence, PAYLOAD).await? == 0 {
                return Err(BenchError::wrong("raw append: seq from 1"));
            }
        }
        (Op::Complete, Path::Lib) => lib.complete(&client.leases[k]).await?,
        (Op::Complete, Path::Raw) => {
            let (run, fence, _) = batch[k];
            raw.complete(run, fence).await?
        }
        (Op::ClaimNext, Path::Lib) => {
            let got = lib.claim_next(&client.worker, ttl, 1).await?;
            let [lease] = got.as_slice() else {
                return Err(BenchError::wrong("claim_next(1) returned no run"));
            };
            claimed.push((lease.run().as_str().to_owned(), lease.fence().get()));
        }
        (Op::ClaimNext, Path::Raw) => {
            let got = raw.claim_next(client.worker.as_str(), TTL_MS, 1).await?;
            if got.len() != 1 {
                return Err(BenchError::wrong("raw claim_next(1) returned no run"));
            }
            claimed.extend(got);
        }
        (Op::RenewMany, Path::Lib) => {
            for result in lib.renew_many(&client.leases).await? {
                result?;
            }
        }
        (Op::RenewMany, Path::Raw) if raw.is_best() => raw.best_renew_many(batch).await?,
        (Op::RenewMany, Path::Raw) => raw.renew_many(batch).await?,
        (Op::ClaimNextBatch, Path::Lib) => {
            let got = lib
                .claim_next(&client.worker, ttl, CLAIM_NEXT_BATCH)
                .await?;
            if got.len() != CLAIM_NEXT_BATCH {
                return Err(BenchError::wrong(format!(
                    "claim_next({CLAIM_NEXT_BATCH}) returned {} runs",
                    got.len()
                )));
            }
            claimed.extend(
                got.iter()
                    .map(|l| (l.run().as_str().to_owned(), l.fence().get())),
            );
        }
        (Op::ClaimNextBatch, Path::Raw) => {
            let worker = client.worker.as_str();
            let got = if raw.is_best() {
                raw.best_claim_next(worker, TTL_MS, CLAIM_NEXT_BATCH)
                    .await?
            } else {
                raw.claim_next(worker, TTL_MS, CLAIM_NEXT_BATCH).await?
            };
            if got.len() != CLAIM_NEXT_BATCH {
                return Err(BenchError::wrong(format!(
                    "raw claim_next({CLAIM_NEXT_BATCH}) returned {} runs",
                    got.len()
                )));
            }
            claimed.extend(got);
        }
        (Op::EndMany, Path::Lib) => {
            let ends = &client.endings[k * END_MANY..(k + 1) * END_MANY];
            for result in lib.end_many(ends).await? {
                result?;
            }
        }
        (Op::EndMany, Path::Raw) => {
            if !raw.is_best() {
                return Err(BenchError::setup(
                    "end_many is measured against the best statement only (--parts best)",
                ));
            }
            raw.best_end_many(&batch[k * END_MANY..(k + 1) * END_MANY], PAYLOAD)
                .await?
        }
    }
    Ok(())
}

pub(super) fn raw_batch(client: &ClientWork) -> Vec<(&str, u64, u64)> {
    client
        .leases
        .iter()
        .map(|l| (l.run().as_str(), l.fence().get(), l.ttl().as_millis()))
        .collect()
}

/// What one round of both paths measured.
pub(super) struct PairRound {
    pub(crate) lib_work: Vec<ClientWork>,
    pub(crate) raw_work: Vec<ClientWork>,
    pub(crate) lib_lat: Vec<u64>,
    pub(crate) raw_lat: Vec<u64>,
}

/// Runs round `round` of both paths at once: every client does `per_round` operations on each
/// path, **alternating library and raw call by call** (and which of the two goes first), so a
/// stall of the server or the machine (an AOF fsync, autovacuum, a scheduler hiccup) falls on
/// both paths alike instead of on whichever round it happens to hit.
pub(super) async fn round_pair(
    op: Op,
    per_round: usize,
    round: usize,
    lib_work: Vec<ClientWork>,
    raw_work: Vec<ClientWork>,
    lib: &Arc<dyn LeaseStore>,
    raw: &Arc<Raw>,
) -> Result<PairRound, BenchError> {
    let start = Arc::new(Barrier::new(lib_work.len() + 1));
    let mut tasks = Vec::with_capacity(lib_work.len());
    for (mut lib_client, mut raw_client) in lib_work.into_iter().zip(raw_work) {
        let (start, lib, raw) = (start.clone(), lib.clone(), raw.clone());
        tasks.push(tokio::spawn(async move {
            let ttl = Ttl::from_millis(TTL_MS)?;
            let (mut lib_lat, mut raw_lat) =
                (Vec::with_capacity(per_round), Vec::with_capacity(per_round));
            let (mut lib_claimed, mut raw_claimed) = (Vec::new(), Vec::new());
            let lib_batch = raw_batch(&lib_client);
            let raw_batch = raw_batch(&raw_client);
            start.wait().await;
            for k in round * per_round..(round + 1) * per_round {
                let order = if k % 2 == 0 {
                    [Path::Lib, Path::Raw]
                } else {
                    [Path::Raw, Path::Lib]
                };
                for path in order {
                    let (client, batch, claimed, lat) = match path {
                        Path::Lib => (&lib_client, &lib_batch, &mut lib_claimed, &mut lib_lat),
                        Path::Raw => (&raw_client, &raw_batch, &mut raw_claimed, &mut raw_lat),
                    };
                    let t0 = Instant::now();
                    one(op, path, k, client, batch, ttl, &lib, &raw, claimed).await?;
                    lat.push(t0.elapsed().as_nanos() as u64);
                }
            }
            drop((lib_batch, raw_batch));
            lib_client.done += per_round;
            raw_client.done += per_round;
            lib_client.claimed.extend(lib_claimed);
            raw_client.claimed.extend(raw_claimed);
            Ok::<_, BenchError>((lib_client, raw_client, lib_lat, raw_lat))
        }));
    }
    start.wait().await;
    let mut out = PairRound {
        lib_work: Vec::with_capacity(tasks.len()),
        raw_work: Vec::with_capacity(tasks.len()),
        lib_lat: Vec::new(),
        raw_lat: Vec::new(),
    };
    for task in tasks {
        let (l, r, ll, rl) = task.await.map_err(|e| BenchError::setup(e.to_string()))??;
        out.lib_work.push(l);
        out.raw_work.push(r);
        out.lib_lat.extend(ll);
        out.raw_lat.extend(rl);
    }
    Ok(out)
}

/// A path's throughput time: the time its calls took, summed over clients and divided by the
/// client count (each client spends about half its wall time on each path).
pub(super) fn busy_secs(latencies_ns: &[u64], clients: usize) -> f64 {
    latencies_ns.iter().sum::<u64>() as f64 / 1e9 / clients as f64
}

/// Measures `op` at `clients` clients: a warm-up round, then `pairs` rounds in which every
/// client alternates library and raw calls.
pub(super) async fn measure(
    kind: Kind,
    op: Op,
    clients: usize,
    lib: &Arc<dyn LeaseStore>,
    raw: &Arc<Raw>,
    sizes: &Sizes,
) -> Result<OpResult, BenchError> {
    let total = op.calls(sizes.ops).max(clients);
    let per_round = total.div_ceil(clients).max(1);
    let rounds = sizes.pairs + 1;
    let mut lib_work = prepare(op, Path::Lib, clients, per_round, rounds, lib, raw).await?;
    let mut raw_work = prepare(op, Path::Raw, clients, per_round, rounds, lib, raw).await?;
    let (mut lib_lat, mut raw_lat) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        let pair = round_pair(op, per_round, r, lib_work, raw_work, lib, raw).await?;
        (lib_work, raw_work) = (pair.lib_work, pair.raw_work);
        // Round 0 warms both paths up (connections, prepared statements, script cache).
        if r > 0 {
            lib_lat.extend(pair.lib_lat);
            raw_lat.extend(pair.raw_lat);
        }
    }
    let (lib_secs, raw_secs) = (busy_secs(&lib_lat, clients), busy_secs(&raw_lat, clients));
    let mut checked = validate(op, &lib_work, raw).await?;
    checked += validate(op, &raw_work, raw).await?;
    if matches!(op, Op::ClaimNext | Op::ClaimNextBatch) {
        let mut all = std::collections::HashSet::new();
        for c in lib_work.iter().chain(&raw_work) {
            for (run, _) in &c.claimed {
                if !all.insert(run.clone()) {
                    return Err(BenchError::wrong(format!(
                        "claim_next handed out {run} twice"
                    )));
                }
            }
        }
    }
    Ok(OpResult {
        backend: kind,
        op,
        clients,
        lib: Summary::of(lib_lat, lib_secs),
        raw: Summary::of(raw_lat, raw_secs),
        validated: format!("{checked} effects checked"),
    })
}

/// Checks in the store that every operation of `work` happened; returns how many were checked.
pub(super) async fn validate(op: Op, work: &[ClientWork], raw: &Raw) -> Result<usize, BenchError> {
    let mut checked = 0;
    for c in work {
        let worker = Some(c.worker.as_str().to_owned());
        let fail = |what: String| {
            Err(BenchError::wrong(format!(
                "{} {}: {what}",
                op.name(),
                c.worker
            )))
        };
        match op {
            Op::Claim => {
                let names: Vec<String> = c.runs.iter().map(|r| r.as_str().to_owned()).collect();
                for (run, seen) in names.iter().zip(raw.seen(&names).await?) {
                    if (seen.fence, &seen.owner) != (1, &worker) {
                        return fail(format!("run {run} not claimed once by us: {seen:?}"));
                    }
                    checked += 1;
                }
            }
            Op::ClaimNext | Op::ClaimNextBatch => {
                if c.claimed.len() != c.done * op.width() {
                    return fail(format!("{} claims for {} calls", c.claimed.len(), c.done));
                }
                let names: Vec<String> = c.claimed.iter().map(|(r, _)| r.clone()).collect();
                for ((run, fence), seen) in c.claimed.iter().zip(raw.seen(&names).await?) {
                    if (seen.fence, &seen.owner) != (*fence, &worker) || *fence != 1 {
                        return fail(format!("run {run} fence {fence}: store has {seen:?}"));
                    }
                    checked += 1;
                }
            }
            Op::Renew | Op::Append | Op::RenewMany | Op::Complete | Op::EndMany => {
                let names: Vec<String> = c
                    .leases
                    .iter()
                    .map(|l| l.run().as_str().to_owned())
                    .collect();
                let seen: Vec<Seen> = raw.seen(&names).await?;
                for (i, (run, s)) in names.iter().zip(seen).enumerate() {
                    let ok = match op {
                        Op::Renew => s.heartbeats == c.done as u64,
                        Op::RenewMany => s.heartbeats == c.done as u64,
                        Op::Append => s.journal == c.done as u64,
                        // Completed with its one journal entry, or untouched.
                        Op::EndMany => {
                            let ended = i < c.done * END_MANY;
                            ended == (s.state == "completed")
                                && s.journal == u64::from(ended)
                                && s.fence == c.leases[i].fence().get()
                        }
                        _ => (i < c.done) == (s.state == "completed"),
                    };
                    if !ok {
                        return fail(format!("run {run} after {} ops: {s:?}", c.done));
                    }
                    checked += match op {
                        Op::Complete => usize::from(i < c.done),
                        Op::EndMany => usize::from(i < c.done * END_MANY),
                        _ => c.done,
                    };
                }
            }
        }
    }
    Ok(checked)
}

/// Prints the rows against the identical statement (`versus` = "raw", with the targets) or
/// against the best statement for the job (`versus` = "best").
pub(super) fn print_table(rows: &[OpResult], versus: &str) {
    if rows.is_empty() {
        return;
    }
    let v = versus;
    println!(
        "| backend | operation | clients | lib ops/s | {v} ops/s | ops ratio | lib p50 µs | {v} p50 µs | lib p99 µs | {v} p99 µs | p99 ratio | lib p99.9 µs | {v} p99.9 µs | validated |"
    );
    println!("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {:.0} | {:.0} | {:.2} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.0} | {:.0} | {} |",
            r.backend.name(),
            r.op.name(),
            r.clients,
            r.lib.ops_per_s(),
            r.raw.ops_per_s(),
            r.ratio(),
            r.lib.p50_us,
            r.raw.p50_us,
            r.lib.p99_us,
            r.raw.p99_us,
            r.p99_ratio(),
            r.lib.p999_us,
            r.raw.p999_us,
            r.validated,
        );
    }
    if versus != "raw" {
        return;
    }
    let misses: Vec<String> = rows
        .iter()
        .filter(|r| r.ratio() < 0.9 || r.p99_ratio() > 1.2)
        .map(|r| format!("{} {} x{}", r.backend.name(), r.op.name(), r.clients))
        .collect();
    let mut by_backend: HashMap<&str, (f64, f64)> = HashMap::new();
    for r in rows {
        let e = by_backend
            .entry(r.backend.name())
            .or_insert((f64::MAX, 0.0));
        e.0 = e.0.min(r.ratio());
        e.1 = e.1.max(r.p99_ratio());
    }
    for (backend, (min_ratio, max_p99)) in by_backend {
        println!("\n{backend}: worst ops ratio {min_ratio:.2} (target ≥ 0.90), worst p99 ratio {max_p99:.2} (target ≤ 1.20)");
    }
    if misses.is_empty() {
        println!("every row meets the targets");
    } else {
        println!("rows missing a target: {}", misses.join(", "));
    }
}
