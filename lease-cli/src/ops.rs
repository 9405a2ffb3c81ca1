//! Operator commands: create, inspect, list, resume, release --force, migrate.

use distribution::{connect, Config, ListFilter, RunId, RunState};

use crate::output::{print_records, RecordStream};
use crate::{usage, Failure};

pub(crate) async fn create(config: &Config, run: &RunId, json: bool) -> Result<(), Failure> {
    let store = connect(config).await?;
    let record = store.create(run).await?;
    print_records(&[record], json, true);
    Ok(())
}

pub(crate) async fn inspect(config: &Config, run: &RunId, json: bool) -> Result<(), Failure> {
    let store = connect(config).await?;
    let record = store.inspect(run).await?;
    print_records(&[record], json, true);
    Ok(())
}

/// How many records `lease list` asks the store for at a time; each page is printed as it
/// arrives.
const LIST_PAGE: usize = 1_000;

/// Streams the runs that match, ordered by id, page by page (paging with
/// [`ListFilter::after`]), until `limit` records were printed or the store has no more.
pub(crate) async fn list(
    config: &Config,
    state: Option<RunState>,
    expired: bool,
    limit: usize,
    json: bool,
) -> Result<(), Failure> {
    if limit == 0 {
        return Err(usage("--limit must be at least 1"));
    }
    let store = connect(config).await?;
    let mut stream = RecordStream::new(json);
    let mut out = std::io::stdout();
    let mut after = None;
    while stream.printed() < limit {
        let filter = ListFilter {
            state,
            expired,
            after: after.take(),
            limit: (limit - stream.printed()).min(LIST_PAGE),
        };
        let page = store.list(&filter).await?;
        stream.page(&mut out, &page).map_err(closed_stdout)?;
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
        code: crate::exit::FAILURE,
        message: format!("cannot write the listing to stdout: {e}"),
    }
}

pub(crate) async fn resume(config: &Config, run: &RunId, json: bool) -> Result<(), Failure> {
    let store = connect(config).await?;
    let record = store.resume(run).await?;
    print_records(&[record], json, true);
    Ok(())
}

pub(crate) async fn force_release(config: &Config, run: &RunId, json: bool) -> Result<(), Failure> {
    let store = connect(config).await?;
    let before = store.inspect(run).await?;
    let record = store.force_release(run).await?;
    if !json {
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
    print_records(&[record], json, true);
    Ok(())
}

pub(crate) async fn migrate(config: &Config) -> Result<(), Failure> {
    match config.backend()? {
        distribution::Backend::Postgres => {
            // Connecting runs the embedded migrations under the advisory lock.
            connect(config).await?;
            println!("schema is up to date");
            Ok(())
        }
        _ => Err(usage("migrate applies to a postgres:// store only")),
    }
}

pub(crate) async fn ledger(config: &Config, run: &RunId, json: bool) -> Result<(), Failure> {
    let connected = distribution::connect_store(config).await?;
    let ledger = crate::ledger::Ledger::new(connected, &config.store).await?;
    let entries = ledger.entries(run).await?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&entries).expect("entries serialize")
        );
    } else {
        for e in &entries {
            println!("fence {}  {}  {}", e.fence, e.worker, e.effect);
        }
        println!("({} entries)", entries.len());
    }
    Ok(())
}
