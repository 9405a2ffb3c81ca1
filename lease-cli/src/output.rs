//! Table and JSON renderings of run records.

use distribution::RunRecord;
use serde::Serialize;

/// A run record as the CLI prints it.
#[derive(Serialize)]
pub(crate) struct RecordView {
    run: String,
    state: &'static str,
    owner: Option<String>,
    /// Expiry on the store's clock, microseconds.
    expires_at_us: Option<u64>,
    /// Time left on the lease by the store's clock, milliseconds (negative: expired).
    remaining_ms: Option<i64>,
    fence: u64,
    heartbeats: u64,
    /// The store's clock when read, microseconds.
    observed_at_us: u64,
}

impl From<&RunRecord> for RecordView {
    fn from(r: &RunRecord) -> RecordView {
        let observed = r.observed_at.as_micros() as i64;
        RecordView {
            run: r.run.to_string(),
            state: r.state.as_str(),
            owner: r.owner.as_ref().map(ToString::to_string),
            expires_at_us: r.expires_at.map(|t| t.as_micros()),
            remaining_ms: r
                .expires_at
                .map(|t| (t.as_micros() as i64 - observed) / 1000),
            fence: r.fence.get(),
            heartbeats: r.heartbeats,
            observed_at_us: r.observed_at.as_micros(),
        }
    }
}

/// Prints records as a JSON array (or one object) or as an aligned table.
pub(crate) fn print_records(records: &[RunRecord], json: bool, single: bool) {
    let views: Vec<RecordView> = records.iter().map(RecordView::from).collect();
    if json {
        let text = if single && views.len() == 1 {
            serde_json::to_string_pretty(&views[0])
        } else {
            serde_json::to_string_pretty(&views)
        };
        println!("{}", text.expect("records serialize"));
        return;
    }
    let rows: Vec<[String; 6]> = views
        .iter()
        .map(|v| {
            [
                v.run.clone(),
                v.state.to_string(),
                v.owner.clone().unwrap_or_else(|| "-".into()),
                match v.remaining_ms {
                    Some(ms) if ms <= 0 => format!("expired {}ms ago", -ms),
                    Some(ms) => format!("in {ms}ms"),
                    None => "-".into(),
                },
                v.fence.to_string(),
                v.heartbeats.to_string(),
            ]
        })
        .collect();
    let header = [
        "RUN",
        "STATE",
        "OWNER",
        "EXPIRES (store clock)",
        "FENCE",
        "HEARTBEATS",
    ];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    println!("{}", line(&header.map(String::from)));
    for row in &rows {
        println!("{}", line(row));
    }
    if rows.is_empty() {
        println!("(no runs)");
    }
}
