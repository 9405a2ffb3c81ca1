//! The dashboard's HTML: escaping, the page frame, and the small pieces every page uses.
//!
//! Every value that comes from the store (ids, owners, kinds, reasons, payloads) reaches the
//! page through [`esc`], and every id in a link through [`href_id`]: a run named
//! `<script>` is shown as text and linked as `%3Cscript%3E`.

use std::fmt::Write;
use std::time::Duration;

use lease_core::{RunRecord, StoreTime};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// `text` with the five characters that matter in HTML text and quoted attributes escaped.
pub(crate) fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// What a path segment keeps unencoded: letters, digits and `-._~` (RFC 3986's unreserved).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A run id as one percent-encoded path segment (a `/` or `?` in an id stays inside it).
pub(crate) fn segment(id: &str) -> String {
    utf8_percent_encode(id, SEGMENT).to_string()
}

/// The link to a run's page, escaped for an attribute.
pub(crate) fn href_id(id: &str) -> String {
    esc(&format!("runs/{}", segment(id)))
}

/// A link to a run's page showing its id.
pub(crate) fn run_link(id: &str) -> String {
    format!("<a href=\"{}\">{}</a>", href_id(id), esc(id))
}

/// `text` cut to at most `max` characters, with an ellipsis and the full length when cut.
pub(crate) fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_owned(),
        Some((at, _)) => format!("{}… ({} bytes in all)", &text[..at], text.len()),
    }
}

/// A store time as an RFC 3339 instant in UTC, to the millisecond.
pub(crate) fn instant(t: StoreTime) -> String {
    rfc3339(t, chrono::SecondsFormat::Millis)
}

/// A duration for people: `850 ms`, `12.4 s`, `3 min 05 s`, `2 h 07 min`, `3 d 4 h`.
pub(crate) fn span(d: Duration) -> String {
    let ms = d.as_millis();
    let s = d.as_secs();
    if ms < 1_000 {
        format!("{ms} ms")
    } else if s < 60 {
        format!("{:.1} s", d.as_secs_f64())
    } else if s < 3_600 {
        format!("{} min {:02} s", s / 60, s % 60)
    } else if s < 86_400 {
        format!("{} h {:02} min", s / 3_600, s % 3_600 / 60)
    } else {
        format!("{} d {} h", s / 86_400, s % 86_400 / 3_600)
    }
}

/// `at` relative to when `record` was read: `in 4.2 s` or `1.3 s ago`.
pub(crate) fn relative(record: &RunRecord, at: StoreTime) -> String {
    let now = record.observed_at;
    if at >= now {
        format!("in {}", span(at.saturating_since(now)))
    } else {
        format!("{} ago", span(now.saturating_since(at)))
    }
}

/// How long ago the run was created, when the record was read (the instant in its title);
/// empty where the store keeps no creation time.
pub(crate) fn age(record: &RunRecord) -> String {
    record.created_at.map_or_else(String::new, |at| {
        format!(
            "<span class=\"age\" title=\"{}\">{} ago</span>",
            instant(at),
            span(record.observed_at.saturating_since(at))
        )
    })
}

/// A table with these column headings and pre-rendered (already escaped) rows; `empty` is
/// shown instead when there are no rows.
pub(crate) fn table(headings: &[&str], rows: &[Vec<String>], empty: &str) -> String {
    if rows.is_empty() {
        return format!("<p class=\"empty\">{}</p>", esc(empty));
    }
    let mut out = String::from("<table><thead><tr>");
    for h in headings {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    out
}

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:78em;\
padding:0 1em;color:#1d2330}h1{font-size:1.3em}h2{font-size:1.1em;margin-top:1.6em}\
header{display:flex;flex-wrap:wrap;gap:.4em 1.5em;align-items:baseline;\
border-bottom:1px solid #ccd;padding-bottom:.4em}header h1{white-space:nowrap;margin:.3em 0}header a{text-decoration:none}small,.empty{color:#667}\
table{border-collapse:collapse;margin:.4em 0}th,td{border:1px solid #d6dae3;\
padding:.25em .6em;text-align:left;vertical-align:top}th{background:#f1f3f8}\
td.n{text-align:right;font-variant-numeric:tabular-nums}pre{white-space:pre-wrap;\
word-break:break-all;background:#f6f7fa;padding:.5em;margin:0}\
.state-failed,.state-cancelled{color:#a11}.state-held{color:#064}.lag{font-weight:600}\
.outcome.failed,.outcome.cancelled,.outcome.expired{color:#a11}.outcome.retried{color:#a50}\
.outcome.completed,.outcome.held{color:#064}\
form.action{display:inline-block;margin-right:1em}nav{display:flex;gap:1em}\
.notice{background:#fff4d6;border:1px solid #e0c060;padding:.4em .6em}\
.paused,.not-live,.overdue,.timed-out{color:#a11}.running,.live{color:#064}\
form.filter input,form.filter select{margin-right:.3em}form.bulk{margin:1em 0}\
#confirm{font-weight:600}";

/// The whole page: head (title, refresh, style), the navigation, then `body`.
/// Links are relative to `<base href="{base}/">`: `base` is where the router is nested
/// (empty at the root).
pub(crate) fn page(title: &str, refresh: u32, store: &str, base: &str, body: &str) -> String {
    let refresh = if refresh > 0 {
        format!("<meta http-equiv=\"refresh\" content=\"{refresh}\">")
    } else {
        String::new()
    };
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">{refresh}\
         <meta name=\"viewport\" content=\"width=device-width\"><base href=\"{base}/\">\
         <title>{title} · lease ui</title><style>{STYLE}</style></head><body>\
         <header><h1><a href=\"{home}\">lease ui</a></h1><span>store <code id=\"store\">{store}</code></span>\
         <nav><a href=\"runs\">runs</a><a href=\"runs?state=failed\">failed</a>\
         <a href=\"runs?state=suspended\">suspended</a><a href=\"queues\">queues</a>\
         <a href=\"schedules\">schedules</a><a href=\"workers\">workers</a></nav></header>\
         {body}</body></html>",
        title = esc(title),
        store = esc(store),
        base = esc(base),
        // The router's own root: `/admin` when nested there (axum routes no `/admin/`).
        home = esc(if base.is_empty() { "/" } else { base }),
    )
}

/// A store time as RFC 3339 in UTC, to `precision`; its microseconds when out of range.
pub(crate) fn rfc3339(t: StoreTime, precision: chrono::SecondsFormat) -> String {
    i64::try_from(t.as_micros())
        .ok()
        .and_then(chrono::DateTime::from_timestamp_micros)
        .map_or_else(
            || format!("{} µs", t.as_micros()),
            |at| at.to_rfc3339_opts(precision, true),
        )
}

/// `bytes` in lower-case hexadecimal.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_encodes_ids_in_links() {
        assert_eq!(
            esc("<script>alert('x') & \"y\"</script>"),
            "&lt;script&gt;alert(&#39;x&#39;) &amp; &quot;y&quot;&lt;/script&gt;"
        );
        assert_eq!(
            run_link("a/b?c=<d>"),
            "<a href=\"runs/a%2Fb%3Fc%3D%3Cd%3E\">a/b?c=&lt;d&gt;</a>"
        );
        assert_eq!(segment("order-7_x.y~z"), "order-7_x.y~z");
        assert_eq!(segment("é"), "%C3%A9");
    }

    #[test]
    fn clips_long_text_on_a_character_boundary() {
        assert_eq!(clip("short", 10), "short");
        assert_eq!(clip("ééééé", 2), "éé… (10 bytes in all)");
    }

    #[test]
    fn spans_and_instants_read_as_people_write_them() {
        assert_eq!(span(Duration::from_millis(850)), "850 ms");
        assert_eq!(span(Duration::from_millis(12_400)), "12.4 s");
        assert_eq!(span(Duration::from_secs(185)), "3 min 05 s");
        assert_eq!(span(Duration::from_secs(2 * 3600 + 7 * 60)), "2 h 07 min");
        assert_eq!(span(Duration::from_secs(3 * 86_400 + 4 * 3600)), "3 d 4 h");
        assert_eq!(
            instant(StoreTime::from_micros(1_796_000_000_123_456)),
            "2026-11-30T00:53:20.123Z"
        );
    }
}
