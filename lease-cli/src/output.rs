//! Table and JSON renderings of run records.

use std::io::{self, Write};

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
    /// Claims so far (the fence).
    attempts: u64,
    heartbeats: u64,
    /// A delayed run's end of delay on the store's clock, microseconds.
    not_before_us: Option<u64>,
    /// Time left before a delayed run is claimable, milliseconds.
    claimable_in_ms: Option<i64>,
    /// A failed run's reason.
    failure: Option<String>,
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
            attempts: r.attempts(),
            heartbeats: r.heartbeats,
            not_before_us: r.not_before.map(|t| t.as_micros()),
            claimable_in_ms: r
                .not_before
                .map(|t| (t.as_micros() as i64 - observed) / 1000),
            failure: r.failure.clone(),
            observed_at_us: r.observed_at.as_micros(),
        }
    }
}

/// Prints records as a JSON array (or one object) or as an aligned table.
pub(crate) fn print_records(records: &[RunRecord], json: bool, single: bool) {
    if json && single && records.len() == 1 {
        let text = serde_json::to_string_pretty(&RecordView::from(&records[0]));
        println!("{}", text.expect("records serialize"));
        return;
    }
    let mut out = std::io::stdout().lock();
    let mut stream = RecordStream::new(json);
    // A closed stdout (`| head`) ends the output early; nothing else is left to do.
    let _ = stream
        .page(&mut out, records)
        .and_then(|()| stream.finish(&mut out));
}

/// Prints records page by page, as they arrive, so a long listing shows its first page at once
/// and holds one page in memory.
///
/// With `json`, the pages form one JSON array, pretty-printed exactly as a whole array would
/// be (`[` before the first record, `]` after the last, in [`finish`](RecordStream::finish)):
/// a listing cut short by an error is not valid JSON, so it cannot pass for a complete one.
/// The table prints its header with the first page; each page is aligned as it arrives, and a
/// page with longer values widens the columns from there on (never narrows them).
pub(crate) struct RecordStream {
    json: bool,
    widths: [usize; 6],
    printed: usize,
}

const HEADER: [&str; 6] = [
    "RUN",
    "STATE",
    "OWNER",
    "EXPIRES (store clock)",
    "FENCE",
    "HEARTBEATS",
];

impl RecordStream {
    pub(crate) fn new(json: bool) -> RecordStream {
        RecordStream {
            json,
            widths: HEADER.map(str::len),
            printed: 0,
        }
    }

    /// How many records were printed so far.
    pub(crate) fn printed(&self) -> usize {
        self.printed
    }

    /// Prints one page and flushes it.
    pub(crate) fn page(&mut self, out: &mut impl Write, records: &[RunRecord]) -> io::Result<()> {
        if self.json {
            for record in records {
                let text = serde_json::to_string_pretty(&RecordView::from(record))
                    .expect("records serialize");
                out.write_all(if self.printed == 0 { b"[\n" } else { b",\n" })?;
                let indented: Vec<String> = text.lines().map(|l| format!("  {l}")).collect();
                out.write_all(indented.join("\n").as_bytes())?;
                self.printed += 1;
            }
            return out.flush();
        }
        let rows: Vec<[String; 6]> = records.iter().map(|r| row(&RecordView::from(r))).collect();
        for row in &rows {
            for (w, cell) in self.widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        if self.printed == 0 && !rows.is_empty() {
            writeln!(out, "{}", line(&HEADER.map(String::from), self.widths))?;
        }
        for row in &rows {
            writeln!(out, "{}", line(row, self.widths))?;
        }
        self.printed += rows.len();
        out.flush()
    }

    /// Ends the output: closes the JSON array, or says that there were no runs.
    pub(crate) fn finish(self, out: &mut impl Write) -> io::Result<()> {
        match (self.json, self.printed) {
            (true, 0) => writeln!(out, "[]")?,
            (true, _) => writeln!(out, "\n]")?,
            (false, 0) => {
                writeln!(out, "{}", line(&HEADER.map(String::from), self.widths))?;
                writeln!(out, "(no runs)")?;
            }
            (false, _) => {}
        }
        out.flush()
    }
}

fn row(v: &RecordView) -> [String; 6] {
    [
        v.run.clone(),
        v.state.to_string(),
        v.owner.clone().unwrap_or_else(|| "-".into()),
        match (v.remaining_ms, v.claimable_in_ms) {
            (Some(ms), _) if ms <= 0 => format!("expired {}ms ago", -ms),
            (Some(ms), _) => format!("in {ms}ms"),
            (None, Some(ms)) => format!("(retry in {ms}ms)"),
            (None, None) => "-".into(),
        },
        v.fence.to_string(),
        v.heartbeats.to_string(),
    ]
}

fn line(cells: &[String; 6], widths: [usize; 6]) -> String {
    cells
        .iter()
        .zip(widths)
        .map(|(c, w)| format!("{c:<w$}"))
        .collect::<Vec<_>>()
        .join("  ")
        .trim_end()
        .to_string()
}

#[cfg(test)]
mod tests {
    use distribution::{Fence, RunId, RunState, StoreTime, WorkerId};

    use super::*;

    fn records(n: usize, owner_len: usize) -> Vec<RunRecord> {
        (0..n)
            .map(|i| {
                RunRecord::new(
                    RunId::new(format!("run-{i:03}")).unwrap(),
                    RunState::Runnable,
                    Fence::new(u64::try_from(i).unwrap()).unwrap(),
                    StoreTime::from_micros(1_000_000),
                )
                .with_lease(
                    WorkerId::new("w".repeat(owner_len)).unwrap(),
                    StoreTime::from_micros(2_000_000),
                )
                .with_heartbeats(7)
            })
            .collect()
    }

    fn streamed(json: bool, pages: &[&[RunRecord]]) -> String {
        let mut out = Vec::new();
        let mut stream = RecordStream::new(json);
        for page in pages {
            stream.page(&mut out, page).unwrap();
        }
        stream.finish(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn json_pages_print_the_same_bytes_as_one_array() {
        let all = records(5, 3);
        let whole: Vec<RecordView> = all.iter().map(RecordView::from).collect();
        let expected = format!("{}\n", serde_json::to_string_pretty(&whole).unwrap());
        assert_eq!(streamed(true, &[&all[..2], &all[2..], &[]]), expected);
        assert_eq!(streamed(true, &[&all]), expected);
        assert_eq!(streamed(true, &[&[]]), "[]\n");
    }

    #[test]
    fn a_table_prints_its_header_once_and_widens_for_later_pages() {
        let first = records(2, 1);
        let later = records(1, 20);
        let text = streamed(false, &[&first, &later]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[0].starts_with("RUN      STATE     OWNER  "), "{text}");
        assert_eq!(lines.iter().filter(|l| l.starts_with("RUN")).count(), 1);
        // The later page's longer owner pushes its columns right; the first page kept its own.
        let expires = |line: &str| line.find("in 1000ms").unwrap();
        assert!(expires(lines[3]) > expires(lines[1]), "{text}");
        assert_eq!(streamed(false, &[]).lines().nth(1), Some("(no runs)"));
    }
}
