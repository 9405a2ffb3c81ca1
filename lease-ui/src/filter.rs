//! A set of runs as an operator names it: a state, a kind, a queue and an age (created more
//! than N minutes, hours or days ago, on the store's clock), read from a query or a form, shown
//! back as text, as a query string and as hidden fields, and found in the store by paging
//! [`list`](lease_core::LeaseStore::list) (the store filters state, kind and queue; the age is
//! judged here on each record).

use std::fmt::Write;
use std::time::Duration;

use lease_core::{Error, Kind, LeaseStore, ListFilter, Queue, RunId, RunRecord, RunState};
use serde::Deserialize;

use crate::html::{esc, segment};

/// How many runs one `list` call of a search reads when an age is judged here.
const SCAN_PAGE: usize = 1_000;
/// How many runs of one state a search reads at most before it stops and says so.
pub(crate) const SCAN_MAX: usize = 20_000;
/// The largest age a filter takes: ten years.
const MAX_AGE_DAYS: u64 = 3_650;

/// The unit of a filter's age.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unit {
    Minutes,
    Hours,
    Days,
}

impl Unit {
    pub(crate) const ALL: [Unit; 3] = [Unit::Minutes, Unit::Hours, Unit::Days];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Unit::Minutes => "minutes",
            Unit::Hours => "hours",
            Unit::Days => "days",
        }
    }

    fn secs(self) -> u64 {
        match self {
            Unit::Minutes => 60,
            Unit::Hours => 3_600,
            Unit::Days => 86_400,
        }
    }
}

/// A filter's fields as a query or a form sends them: each optional, an empty one unset.
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct FilterFields {
    #[serde(default)]
    pub(crate) state: Option<String>,
    #[serde(default)]
    pub(crate) kind: Option<String>,
    #[serde(default)]
    pub(crate) queue: Option<String>,
    #[serde(default)]
    pub(crate) age: Option<String>,
    #[serde(default)]
    pub(crate) unit: Option<String>,
}

/// Which runs: every field that is set must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RunFilter {
    pub(crate) state: Option<RunState>,
    pub(crate) kind: Option<Kind>,
    pub(crate) queue: Option<Queue>,
    /// Created at least this many units ago.
    pub(crate) age: Option<(u64, Unit)>,
}

fn set(field: Option<&String>) -> Option<&str> {
    field.map(|s| s.trim()).filter(|s| !s.is_empty())
}

impl RunFilter {
    /// The filter the fields name, or what is wrong with them.
    pub(crate) fn parse(fields: &FilterFields) -> Result<RunFilter, String> {
        let state = set(fields.state.as_ref())
            .map(str::parse::<RunState>)
            .transpose()
            .map_err(|e| e.to_string())?;
        let kind = set(fields.kind.as_ref())
            .map(Kind::new)
            .transpose()
            .map_err(|e| e.to_string())?;
        let queue = set(fields.queue.as_ref())
            .map(Queue::new)
            .transpose()
            .map_err(|e| e.to_string())?;
        let age = match (set(fields.age.as_ref()), set(fields.unit.as_ref())) {
            (None, _) => None,
            (Some(n), unit) => {
                let unit = Unit::ALL
                    .into_iter()
                    .find(|u| Some(u.as_str()) == unit)
                    .ok_or("an age needs its unit: minutes, hours or days")?;
                let n: u64 = n
                    .parse()
                    .map_err(|_| format!("age {n:?} is not a whole number"))?;
                if n == 0
                    || n.checked_mul(unit.secs())
                        .is_none_or(|s| s > MAX_AGE_DAYS * 86_400)
                {
                    return Err(format!(
                        "an age is from 1 minute to {MAX_AGE_DAYS} days, not {n} {}",
                        unit.as_str()
                    ));
                }
                Some((n, unit))
            }
        };
        Ok(RunFilter {
            state,
            kind,
            queue,
            age,
        })
    }

    /// The age as a duration.
    pub(crate) fn older_than(&self) -> Option<Duration> {
        self.age
            .map(|(n, unit)| Duration::from_secs(n * unit.secs()))
    }

    /// Whether `record` (already of the state, kind and queue the store was asked for) is old
    /// enough. A run whose creation time the store does not keep never matches an age.
    pub(crate) fn old_enough(&self, record: &RunRecord) -> bool {
        self.older_than().is_none_or(|age| {
            record
                .created_at
                .is_some_and(|at| record.observed_at.saturating_since(at) >= age)
        })
    }

    /// The filter in words (plain text: escape it to show it).
    pub(crate) fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(s) = self.state {
            parts.push(format!("state {}", s.as_str()));
        }
        if let Some(k) = &self.kind {
            parts.push(format!("kind {}", k.as_str()));
        }
        if let Some(q) = &self.queue {
            parts.push(format!("queue {}", q.as_str()));
        }
        if let Some((n, unit)) = self.age {
            parts.push(format!("created more than {n} {} ago", unit.as_str()));
        }
        if parts.is_empty() {
            "every run".to_owned()
        } else {
            parts.join(", ")
        }
    }

    /// The filter as a query string (without `?`), each value percent-encoded.
    pub(crate) fn query(&self) -> String {
        let mut q = Vec::new();
        if let Some(s) = self.state {
            q.push(format!("state={}", s.as_str()));
        }
        if let Some(k) = &self.kind {
            q.push(format!("kind={}", segment(k.as_str())));
        }
        if let Some(qu) = &self.queue {
            q.push(format!("queue={}", segment(qu.as_str())));
        }
        if let Some((n, unit)) = self.age {
            q.push(format!("age={n}&unit={}", unit.as_str()));
        }
        q.join("&")
    }

    /// The filter as a form's hidden fields.
    pub(crate) fn hidden(&self) -> String {
        let mut out = String::new();
        let mut field = |name: &str, value: &str| {
            let _ = write!(
                out,
                "<input type=\"hidden\" name=\"{name}\" value=\"{}\">",
                esc(value)
            );
        };
        if let Some(s) = self.state {
            field("state", s.as_str());
        }
        if let Some(k) = &self.kind {
            field("kind", k.as_str());
        }
        if let Some(q) = &self.queue {
            field("queue", q.as_str());
        }
        if let Some((n, unit)) = self.age {
            field("age", &n.to_string());
            field("unit", unit.as_str());
        }
        out
    }
}

/// What a search found.
pub(crate) struct Found {
    /// The matching runs by id, at most the number asked for.
    pub(crate) runs: Vec<RunRecord>,
    /// More than that matched.
    pub(crate) more: bool,
    /// The search of a state stopped after [`SCAN_MAX`] runs without finding enough: more may
    /// match beyond.
    pub(crate) cut: bool,
}

/// The first `want` runs by id after `after` that match `filter` and are in one of `states`
/// (`None`: any state), paging through `list`.
pub(crate) async fn find(
    store: &dyn LeaseStore,
    filter: &RunFilter,
    states: &[Option<RunState>],
    after: Option<&RunId>,
    want: usize,
) -> Result<Found, Error> {
    // Without an age, the store filters everything: one call reads just one more than wanted.
    let page = if filter.age.is_some() {
        SCAN_PAGE
    } else {
        (want + 1).min(lease_core::MAX_LIST)
    };
    let mut runs = Vec::new();
    let mut cut = false;
    for state in states {
        let (mut kept, mut read, mut from) = (0, 0, after.cloned());
        loop {
            let list = ListFilter::new()
                .with_state(*state)
                .with_kind(filter.kind.clone())
                .with_queue(filter.queue.clone())
                .with_after(from.take())
                .with_limit(page);
            let records = store.list(&list).await?;
            let full = records.len() == page;
            read += records.len();
            from = records.last().map(|r| r.run.clone());
            for record in records {
                if filter.old_enough(&record) {
                    kept += 1;
                    runs.push(record);
                }
            }
            if kept > want || !full {
                break;
            }
            if read >= SCAN_MAX {
                cut = true;
                break;
            }
        }
    }
    runs.sort_by(|a, b| a.run.cmp(&b.run));
    // A run that changed state between two lists may have been read twice.
    runs.dedup_by(|a, b| a.run == b.run);
    let more = runs.len() > want;
    runs.truncate(want);
    Ok(Found { runs, more, cut })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &str)]) -> FilterFields {
        let get = |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        };
        FilterFields {
            state: get("state"),
            kind: get("kind"),
            queue: get("queue"),
            age: get("age"),
            unit: get("unit"),
        }
    }

    #[test]
    fn a_filter_reads_back_as_words_query_and_fields() {
        let f = RunFilter::parse(&fields(&[
            ("state", "failed"),
            ("kind", "mail <x>"),
            ("queue", ""),
            ("age", "2"),
            ("unit", "hours"),
        ]))
        .unwrap();
        assert_eq!(f.state, Some(RunState::Failed));
        assert_eq!(f.queue, None, "an empty field is unset");
        assert_eq!(f.older_than(), Some(Duration::from_secs(7_200)));
        assert_eq!(
            f.describe(),
            "state failed, kind mail <x>, created more than 2 hours ago"
        );
        assert_eq!(
            f.query(),
            "state=failed&kind=mail%20%3Cx%3E&age=2&unit=hours"
        );
        assert!(f
            .hidden()
            .contains("name=\"kind\" value=\"mail &lt;x&gt;\""));
        assert_eq!(
            RunFilter::parse(&fields(&[])).unwrap().describe(),
            "every run"
        );
    }

    #[test]
    fn a_bad_filter_says_why() {
        for (pairs, why) in [
            (&[("state", "sideways")][..], "sideways"),
            (&[("age", "3")][..], "needs its unit"),
            (&[("age", "x"), ("unit", "days")][..], "not a whole number"),
            (&[("age", "0"), ("unit", "days")][..], "from 1 minute"),
            (&[("age", "3651"), ("unit", "days")][..], "from 1 minute"),
            (
                &[("age", "99999999999999999"), ("unit", "days")][..],
                "from 1 minute",
            ),
            (&[("age", "1"), ("unit", "weeks")][..], "needs its unit"),
        ] {
            let e = RunFilter::parse(&fields(pairs)).unwrap_err();
            assert!(e.contains(why), "{pairs:?}: {e}");
        }
    }
}
