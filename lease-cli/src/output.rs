//! Table and JSON renderings of run records and journal entries (`-o text|json`).

use std::io::{self, Write};

use distribution::{JournalEntry, RunId, RunRecord, RunState};
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
    /// The attempt budget's counter: claims since create or resume, less voluntary ends.
    attempts: u64,
    heartbeats: u64,
    /// A delayed run's end of delay on the store's clock, microseconds.
    not_before_us: Option<u64>,
    /// Time left before a delayed run is claimable, milliseconds.
    claimable_in_ms: Option<i64>,
    /// A failed run's reason (as `reason`; kept for scripts written before cancel).
    failure: Option<String>,
    /// Why the run ended: a failed run's reason, or the reason given to cancel it.
    reason: Option<String>,
    /// The run's payload as text, when it is UTF-8 (`inspect`; null otherwise).
    payload: Option<String>,
    /// The run's payload in lower-case hex, when it is not UTF-8.
    payload_hex: Option<String>,
    /// The payload's size in bytes (null: the run has no payload, or the command does not
    /// read it: `list`).
    payload_bytes: Option<usize>,
    /// The run's kind (`default` for a run created without one).
    kind: String,
    /// The run's queue (`default` for a run created without one).
    queue: String,
    /// The run's priority within its kind (0 for a run created without one).
    priority: u8,
    /// When the run was created, on the store's clock, microseconds (null: unknown, for a run
    /// created before its store kept times).
    created_at_us: Option<u64>,
    /// When its latest claim took it, microseconds (null: never claimed).
    claimed_at_us: Option<u64>,
    /// When that claim's lease was last renewed, microseconds (null: not renewed).
    renewed_at_us: Option<u64>,
    /// When it ended (completed, failed or cancelled), microseconds (null: not ended).
    ended_at_us: Option<u64>,
    /// How long its holder has held it, from the claim to the read, milliseconds (null: not
    /// held).
    held_for_ms: Option<u64>,
    /// Since when an unowned runnable run has been claimable, microseconds (null: not
    /// waiting, or the store cannot tell).
    claimable_since_us: Option<u64>,
    /// How long a run a claim could take has waited (since `claimable_since_us`, or since an
    /// expired lease's expiry), milliseconds (null: not waiting, or the store cannot tell).
    waiting_for_ms: Option<u64>,
    /// The run's last attempts, oldest first, the held one included (`inspect`; null when
    /// not read: `list`).
    history: Option<Vec<crate::history::AttemptView>>,
    /// The signal a suspended run waits for (null: it does not wait).
    wait_signal: Option<String>,
    /// Its wait's deadline on the store's clock, microseconds (null: none, or not waiting).
    wait_deadline_us: Option<u64>,
    /// The fence of the wait, which a signal's token names.
    wait_fence: Option<u64>,
    /// How the run's last wait ended: `signalled` or `timed_out` (null: it never waited, it
    /// waits, or the command does not read it: `list`).
    resumed: Option<&'static str>,
    /// The W3C traceparent the run was enqueued under (null: none, or not read: `list`).
    trace_parent: Option<String>,
    /// The store's clock when read, microseconds.
    observed_at_us: u64,
}

/// A payload as the CLI shows it: `(text, hex)`, one of them set.
fn shown_payload(payload: Option<&[u8]>) -> (Option<String>, Option<String>) {
    match payload.map(std::str::from_utf8) {
        None => (None, None),
        Some(Ok(text)) => (Some(text.to_owned()), None),
        Some(Err(_)) => (None, Some(hex(payload.unwrap_or_default()))),
    }
}

/// `bytes` in lower-case hexadecimal.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
            attempts: r.attempts,
            heartbeats: r.heartbeats,
            not_before_us: r.not_before.map(|t| t.as_micros()),
            claimable_in_ms: r
                .not_before
                .map(|t| (t.as_micros() as i64 - observed) / 1000),
            failure: r.failure.clone().filter(|_| r.state == RunState::Failed),
            reason: r.failure.clone(),
            payload: shown_payload(r.payload.as_deref()).0,
            payload_hex: shown_payload(r.payload.as_deref()).1,
            payload_bytes: r.payload.as_ref().map(Vec::len),
            wait_signal: r.wait.as_ref().map(|w| w.name.to_string()),
            wait_deadline_us: r
                .wait
                .as_ref()
                .and_then(|w| w.deadline)
                .map(|t| t.as_micros()),
            wait_fence: r.wait.as_ref().map(|w| w.fence.get()),
            trace_parent: r.trace_parent.as_ref().map(|p| p.to_string()),
            resumed: r.resumed.as_ref().map(|e| match e.signal() {
                Some(_) => "signalled",
                None => "timed_out",
            }),
            kind: r.kind.to_string(),
            queue: r.queue.to_string(),
            priority: r.priority,
            created_at_us: r.created_at.map(|t| t.as_micros()),
            claimed_at_us: r.claimed_at.map(|t| t.as_micros()),
            renewed_at_us: r.renewed_at.map(|t| t.as_micros()),
            ended_at_us: r.ended_at.map(|t| t.as_micros()),
            held_for_ms: r
                .held_for()
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            claimable_since_us: r.claimable_since.map(|t| t.as_micros()),
            waiting_for_ms: r
                .waiting_for()
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            history: crate::history::views(r),
            observed_at_us: r.observed_at.as_micros(),
        }
    }
}

/// How a command prints its results: `-o text` (tables and sentences, the default) or
/// `-o json` (one JSON object per record; a stream is NDJSON, one object per line).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// Tables and sentences for people.
    Text,
    /// JSON: one object for a single record, one object per line (NDJSON) for a stream.
    Json,
}

/// Prints one record: a pretty-printed JSON object, or a one-row table.
/// What `lease create` prints: the run's id alone (`id=$(lease create ...)`), and with a
/// unique key a live run held, that run's id and a note on standard error; `-o json`: the run's
/// record with `"duplicate"`.
pub(crate) fn print_created(
    record: &RunRecord,
    duplicate: bool,
    unique_key: Option<&str>,
    format: Format,
) {
    match format {
        Format::Json => {
            let mut view =
                serde_json::to_value(RecordView::from(record)).expect("records serialize");
            view["duplicate"] = serde_json::Value::Bool(duplicate);
            let text = serde_json::to_string_pretty(&view).expect("records serialize");
            println!("{text}");
        }
        Format::Text => {
            println!("{}", record.run);
            if let (true, Some(key)) = (duplicate, unique_key) {
                eprintln!(
                    "lease: run {} holds unique key {key:?}: nothing was created",
                    record.run
                );
            }
        }
    }
}

pub(crate) fn print_record(record: &RunRecord, format: Format) {
    match format {
        Format::Json => {
            let text = serde_json::to_string_pretty(&RecordView::from(record));
            println!("{}", text.expect("records serialize"));
        }
        Format::Text => {
            let mut out = std::io::stdout().lock();
            let mut stream = RecordStream::new(Format::Text);
            // A closed stdout (`| head`) ends the output early; nothing else is left to do.
            let _ = stream
                .page(&mut out, std::slice::from_ref(record))
                .and_then(|()| stream.finish(&mut out))
                .and_then(|()| kind_line(&mut out, record))
                .and_then(|()| times_lines(&mut out, record))
                .and_then(|()| payload_line(&mut out, record.payload.as_deref()))
                .and_then(|()| crate::history::lines(&mut out, record));
        }
    }
}

/// The kind, queue and priority under a single record's table, unless they are the defaults.
fn kind_line(out: &mut impl Write, record: &RunRecord) -> io::Result<()> {
    if !record.kind.is_default() {
        writeln!(out, "kind: {}", record.kind)?;
    }
    if !record.queue.is_default() {
        writeln!(out, "queue: {}", record.queue)?;
    }
    if record.priority > 0 {
        writeln!(out, "priority: {}", record.priority)?;
    }
    if let Some(parent) = &record.trace_parent {
        writeln!(
            out,
            "enqueued in trace {} (traceparent {parent})",
            parent.trace_id()
        )?;
    }
    if let Some(wait) = &record.wait {
        let until = match wait.deadline {
            Some(d) if d <= record.observed_at => {
                "its deadline has passed: the next claim takes it".to_owned()
            }
            Some(d) => format!(
                "for another {:?}",
                std::time::Duration::from_millis(
                    d.saturating_since(record.observed_at).as_millis() as u64
                )
            ),
            None => "without a timeout".to_owned(),
        };
        writeln!(
            out,
            "waits for signal {} (wait of fence {}), {until}",
            wait.name, wait.fence
        )?;
    }
    match &record.resumed {
        Some(distribution::WaitEnd::Signalled(s)) => writeln!(
            out,
            "last wait: signal {} arrived ({} bytes) for the wait of fence {}",
            s.name,
            s.payload().len(),
            s.fence
        )?,
        Some(distribution::WaitEnd::TimedOut { name, fence, .. }) => writeln!(
            out,
            "last wait: for signal {name} (fence {fence}), timed out"
        )?,
        _ => {}
    }
    Ok(())
}

/// The run's times under a single record's table, on the store's clock (RFC 3339, UTC), with
/// how long ago each was when the record was read.
fn times_lines(out: &mut impl Write, record: &RunRecord) -> io::Result<()> {
    let ago = |t: distribution::StoreTime| {
        let d = record.observed_at.saturating_since(t);
        format!("{:.3} s ago", d.as_secs_f64())
    };
    for (name, at) in times(record) {
        if let Some(t) = at {
            let at = rfc3339(t, chrono::SecondsFormat::Micros);
            writeln!(out, "{name}: {at} ({})", ago(t))?;
        }
    }
    if let Some(d) = record.held_for() {
        writeln!(out, "held for: {:.3} s", d.as_secs_f64())?;
    }
    if let Some(d) = record.waiting_for() {
        writeln!(
            out,
            "waiting for: {:.3} s (claimable, not claimed)",
            d.as_secs_f64()
        )?;
    }
    Ok(())
}

/// A record's times under the names `inspect` and the dashboard show them, in life order.
pub(crate) fn times(record: &RunRecord) -> [(&'static str, Option<distribution::StoreTime>); 4] {
    [
        ("created", record.created_at),
        ("claimed", record.claimed_at),
        ("renewed", record.renewed_at),
        ("ended", record.ended_at),
    ]
}

/// A store time as RFC 3339 in UTC, to `precision`; its microseconds when out of range.
pub(crate) fn rfc3339(t: distribution::StoreTime, precision: chrono::SecondsFormat) -> String {
    i64::try_from(t.as_micros())
        .ok()
        .and_then(chrono::DateTime::from_timestamp_micros)
        .map_or_else(
            || format!("{} µs", t.as_micros()),
            |at| at.to_rfc3339_opts(precision, true),
        )
}

/// The payload under a single record's table: its size, then the text quoted with control
/// characters escaped (so a payload cannot drive the terminal), or hex when not UTF-8.
fn payload_line(out: &mut impl Write, payload: Option<&[u8]>) -> io::Result<()> {
    let Some(bytes) = payload else {
        return Ok(());
    };
    match shown_payload(Some(bytes)) {
        (Some(text), _) => writeln!(out, "payload ({} bytes): {text:?}", bytes.len()),
        (_, Some(hex)) => writeln!(out, "payload ({} bytes, hex): {hex}", bytes.len()),
        _ => Ok(()),
    }
}

/// Prints records page by page, as they arrive, so a long listing shows its first page at once
/// and holds one page in memory.
///
/// As JSON, each record is one compact object on its own line (NDJSON), so a consumer can
/// process each as it arrives; no runs print nothing. The table prints its header with the
/// first page; each page is aligned as it arrives, and a page with longer values widens the
/// columns from there on (never narrows them).
pub(crate) struct RecordStream {
    format: Format,
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
    pub(crate) fn new(format: Format) -> RecordStream {
        RecordStream {
            format,
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
        if self.format == Format::Json {
            for record in records {
                let text =
                    serde_json::to_string(&RecordView::from(record)).expect("records serialize");
                writeln!(out, "{text}")?;
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

    /// Ends the output: a table with no rows says that there were no runs.
    pub(crate) fn finish(self, out: &mut impl Write) -> io::Result<()> {
        if self.format == Format::Text && self.printed == 0 {
            writeln!(out, "{}", line(&HEADER.map(String::from), self.widths))?;
            writeln!(out, "(no runs)")?;
        }
        out.flush()
    }
}

/// A journal entry as the CLI prints it.
#[derive(Serialize)]
pub(crate) struct EntryView {
    run: String,
    /// Position in the run's journal, from 1.
    seq: u64,
    /// The fence the entry was written under.
    fence: u64,
    /// When the store accepted it, on the store's clock, microseconds.
    written_at_us: u64,
    /// The payload as text, when it is UTF-8.
    payload: Option<String>,
    /// The payload in hexadecimal, when it is not UTF-8.
    payload_hex: Option<String>,
}

impl EntryView {
    pub(crate) fn new(run: &RunId, e: &JournalEntry) -> EntryView {
        let text = std::str::from_utf8(&e.payload).ok().map(str::to_owned);
        EntryView {
            run: run.to_string(),
            seq: e.seq,
            fence: e.fence.get(),
            written_at_us: e.written_at.as_micros(),
            payload_hex: text.is_none().then(|| hex(&e.payload)),
            payload: text,
        }
    }
}

/// Prints a run's journal entry by entry: NDJSON, or a table whose payload column shows text
/// with control characters escaped (hexadecimal for a payload that is not UTF-8).
pub(crate) fn print_journal(
    out: &mut impl Write,
    run: &RunId,
    entries: &[JournalEntry],
    format: Format,
) -> io::Result<()> {
    let views: Vec<EntryView> = entries.iter().map(|e| EntryView::new(run, e)).collect();
    if format == Format::Json {
        for view in &views {
            writeln!(
                out,
                "{}",
                serde_json::to_string(view).expect("entries serialize")
            )?;
        }
        return out.flush();
    }
    let rows: Vec<[String; 4]> = views
        .iter()
        .map(|v| {
            [
                v.seq.to_string(),
                v.fence.to_string(),
                v.written_at_us.to_string(),
                match (&v.payload, &v.payload_hex) {
                    (Some(text), _) => text.escape_debug().to_string(),
                    (None, Some(hex)) => format!("(not UTF-8) {hex}"),
                    (None, None) => String::new(),
                },
            ]
        })
        .collect();
    let header = ["SEQ", "FENCE", "WRITTEN (store clock, µs)", "PAYLOAD"].map(String::from);
    let mut widths = header.clone().map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let print = |out: &mut dyn Write, cells: &[String; 4]| {
        let text: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        writeln!(out, "{}", text.join("  ").trim_end())
    };
    print(out, &header)?;
    for row in &rows {
        print(out, row)?;
    }
    if rows.is_empty() {
        writeln!(out, "(no entries)")?;
    }
    out.flush()
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
    use distribution::{Fence, RunState, StoreTime, WorkerId};

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

    fn streamed(format: Format, pages: &[&[RunRecord]]) -> String {
        let mut out = Vec::new();
        let mut stream = RecordStream::new(format);
        for page in pages {
            stream.page(&mut out, page).unwrap();
        }
        stream.finish(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn json_pages_print_one_object_per_line_whatever_the_paging() {
        let all = records(5, 3);
        let expected: String = all
            .iter()
            .map(|r| format!("{}\n", serde_json::to_string(&RecordView::from(r)).unwrap()))
            .collect();
        assert_eq!(
            streamed(Format::Json, &[&all[..2], &all[2..], &[]]),
            expected
        );
        assert_eq!(streamed(Format::Json, &[&all]), expected);
        assert_eq!(streamed(Format::Json, &[&[]]), "");
        for line in expected.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            assert!(v["run"].as_str().unwrap().starts_with("run-"), "{line}");
        }
    }

    #[test]
    fn a_records_trace_parent_prints_in_json_and_under_its_table() {
        let parent = distribution::TraceParent::new(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .unwrap();
        let record = records(1, 1)
            .remove(0)
            .with_trace_parent(Some(parent.clone()));
        let json = serde_json::to_value(RecordView::from(&record)).unwrap();
        assert_eq!(json["trace_parent"], parent.as_str());
        let mut out = Vec::new();
        kind_line(&mut out, &record).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("enqueued in trace 4bf92f3577b34da6a3ce929d0e0e4736"),
            "{text}"
        );
        let untraced = serde_json::to_value(RecordView::from(&records(1, 1)[0])).unwrap();
        assert_eq!(untraced["trace_parent"], serde_json::Value::Null);
    }

    #[test]
    fn journal_entries_print_as_text_or_hex_and_as_ndjson() {
        let run = RunId::new("r").unwrap();
        let entries = [
            JournalEntry::new(
                1,
                Fence::new(1).unwrap(),
                b"step\tone".to_vec(),
                StoreTime::from_micros(5),
            ),
            JournalEntry::new(
                2,
                Fence::new(2).unwrap(),
                vec![0xff, 0x00],
                StoreTime::from_micros(9),
            ),
        ];
        let mut out = Vec::new();
        print_journal(&mut out, &run, &entries, Format::Json).unwrap();
        let lines: Vec<serde_json::Value> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["payload"], "step\tone");
        assert_eq!(lines[1]["payload"], serde_json::Value::Null);
        assert_eq!(lines[1]["payload_hex"], "ff00");
        assert_eq!(
            (lines[1]["seq"].as_u64(), lines[1]["fence"].as_u64()),
            (Some(2), Some(2))
        );
        let mut out = Vec::new();
        print_journal(&mut out, &run, &entries, Format::Text).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("SEQ"), "{text}");
        assert!(text.contains("step\\tone"), "{text}");
        assert!(text.contains("(not UTF-8) ff00"), "{text}");
    }

    #[test]
    fn a_table_prints_its_header_once_and_widens_for_later_pages() {
        let first = records(2, 1);
        let later = records(1, 20);
        let text = streamed(Format::Text, &[&first, &later]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[0].starts_with("RUN      STATE     OWNER  "), "{text}");
        assert_eq!(lines.iter().filter(|l| l.starts_with("RUN")).count(), 1);
        // The later page's longer owner pushes its columns right; the first page kept its own.
        let expires = |line: &str| line.find("in 1000ms").unwrap();
        assert!(expires(lines[3]) > expires(lines[1]), "{text}");
        assert_eq!(
            streamed(Format::Text, &[]).lines().nth(1),
            Some("(no runs)")
        );
    }
}
