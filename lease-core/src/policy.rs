//! How long ended runs are kept, state by state: [`EndedStates`] (which ended states a
//! [`purge_ended`](crate::LeaseStore::purge_ended) removes) and [`Retention`] (the ages a
//! `Purger` and a `Worker` of `lease-runtime` purge at).

use std::time::Duration;

use crate::error::InvalidInput;
use crate::types::{check_purge, RunState};

/// A non-empty set of ended states (completed, failed, cancelled), built from the constants
/// with `|`.
///
/// ```
/// use lease_core::{EndedStates, RunState};
/// let kept_longer = EndedStates::FAILED | EndedStates::CANCELLED;
/// assert!(kept_longer.contains(RunState::Cancelled));
/// assert!(!kept_longer.contains(RunState::Completed));
/// assert_eq!(kept_longer.states().count(), 2);
/// assert_eq!(EndedStates::COMPLETED | kept_longer, EndedStates::ALL);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct EndedStates(u8);

impl EndedStates {
    /// Completed runs.
    pub const COMPLETED: EndedStates = EndedStates(1);
    /// Failed runs.
    pub const FAILED: EndedStates = EndedStates(2);
    /// Cancelled runs.
    pub const CANCELLED: EndedStates = EndedStates(4);
    /// Every ended run: what [`purge`](crate::LeaseStore::purge) removes.
    pub const ALL: EndedStates = EndedStates(7);

    /// The set of one ended state; `None` for a state that is not an end.
    pub fn of(state: RunState) -> Option<EndedStates> {
        match state {
            RunState::Completed => Some(EndedStates::COMPLETED),
            RunState::Failed => Some(EndedStates::FAILED),
            RunState::Cancelled => Some(EndedStates::CANCELLED),
            _ => None,
        }
    }

    /// Whether `state` is in the set.
    pub fn contains(self, state: RunState) -> bool {
        EndedStates::of(state).is_some_and(|one| self.0 & one.0 != 0)
    }

    /// The states of the set: completed, failed, cancelled, in that order.
    pub fn states(self) -> impl Iterator<Item = RunState> {
        [RunState::Completed, RunState::Failed, RunState::Cancelled]
            .into_iter()
            .filter(move |s| self.contains(*s))
    }

    /// The states' names as the stores write them (`completed`, `failed`, `cancelled`).
    pub fn names(self) -> Vec<&'static str> {
        self.states().map(RunState::as_str).collect()
    }

    /// The set as a number from 1 to 7 (completed 1, failed 2, cancelled 4), for a backend
    /// that keys something by it.
    pub fn bits(self) -> u8 {
        self.0
    }
}

impl std::ops::BitOr for EndedStates {
    type Output = EndedStates;
    fn bitor(self, other: EndedStates) -> EndedStates {
        EndedStates(self.0 | other.0)
    }
}

impl std::fmt::Debug for EndedStates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.names()).finish()
    }
}

/// How long a `Purger` keeps ended runs, per ended state; `None` keeps that
/// state's runs for good. The [`Default`], as River keeps jobs: completed runs for 24 hours,
/// failed and cancelled ones for 7 days (long enough to look at why).
///
/// ```
/// use std::time::Duration;
/// use lease_core::{EndedStates, Retention};
/// let day = Duration::from_secs(86_400);
/// let default = Retention::default();
/// assert_eq!(default.completed(), Some(day));
/// assert_eq!(
///     default.groups(),
///     vec![(EndedStates::COMPLETED, day), (EndedStates::FAILED | EndedStates::CANCELLED, 7 * day)]
/// );
/// let keep_failures = Retention::all(day).with_failed(None)?;
/// assert_eq!(keep_failures.groups(), vec![(EndedStates::COMPLETED | EndedStates::CANCELLED, day)]);
/// # Ok::<(), lease_core::InvalidInput>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    completed: Option<Duration>,
    failed: Option<Duration>,
    cancelled: Option<Duration>,
}

/// How long [`Retention::default`] keeps completed runs: 24 hours.
pub const DEFAULT_COMPLETED_RETENTION: Duration = Duration::from_secs(86_400);

/// How long [`Retention::default`] keeps failed and cancelled runs: 7 days.
pub const DEFAULT_FAILED_RETENTION: Duration = Duration::from_secs(7 * 86_400);

impl Default for Retention {
    fn default() -> Retention {
        Retention {
            completed: Some(DEFAULT_COMPLETED_RETENTION),
            failed: Some(DEFAULT_FAILED_RETENTION),
            cancelled: Some(DEFAULT_FAILED_RETENTION),
        }
    }
}

impl Retention {
    /// Every ended run kept for `age`, whatever its state. An age over
    /// [`MAX_PURGE_AGE`](crate::MAX_PURGE_AGE) is refused where the policy is used
    /// (`Purger::with_retention`).
    pub fn all(age: Duration) -> Retention {
        Retention {
            completed: Some(age),
            failed: Some(age),
            cancelled: Some(age),
        }
    }

    /// Completed runs kept for `age` (`None`: for good).
    ///
    /// # Errors
    /// [`InvalidInput::PurgeAgeTooLong`] over [`MAX_PURGE_AGE`](crate::MAX_PURGE_AGE).
    pub fn with_completed(mut self, age: Option<Duration>) -> Result<Retention, InvalidInput> {
        self.completed = checked(age)?;
        Ok(self)
    }

    /// Failed runs kept for `age` (`None`: for good).
    ///
    /// # Errors
    /// [`InvalidInput::PurgeAgeTooLong`] over [`MAX_PURGE_AGE`](crate::MAX_PURGE_AGE).
    pub fn with_failed(mut self, age: Option<Duration>) -> Result<Retention, InvalidInput> {
        self.failed = checked(age)?;
        Ok(self)
    }

    /// Cancelled runs kept for `age` (`None`: for good).
    ///
    /// # Errors
    /// [`InvalidInput::PurgeAgeTooLong`] over [`MAX_PURGE_AGE`](crate::MAX_PURGE_AGE).
    pub fn with_cancelled(mut self, age: Option<Duration>) -> Result<Retention, InvalidInput> {
        self.cancelled = checked(age)?;
        Ok(self)
    }

    /// How long completed runs are kept.
    pub fn completed(&self) -> Option<Duration> {
        self.completed
    }

    /// How long failed runs are kept.
    pub fn failed(&self) -> Option<Duration> {
        self.failed
    }

    /// How long cancelled runs are kept.
    pub fn cancelled(&self) -> Option<Duration> {
        self.cancelled
    }

    /// The purges the policy makes: the states kept equally long together, shortest age first.
    /// Empty when every state is kept for good.
    pub fn groups(&self) -> Vec<(EndedStates, Duration)> {
        let mut groups: Vec<(EndedStates, Duration)> = Vec::new();
        for (state, age) in [
            (EndedStates::COMPLETED, self.completed),
            (EndedStates::FAILED, self.failed),
            (EndedStates::CANCELLED, self.cancelled),
        ] {
            let Some(age) = age else { continue };
            match groups.iter_mut().find(|(_, a)| *a == age) {
                Some((states, _)) => *states = *states | state,
                None => groups.push((state, age)),
            }
        }
        groups.sort_by_key(|(_, age)| *age);
        groups
    }

    /// Refuses an age over [`MAX_PURGE_AGE`](crate::MAX_PURGE_AGE) (one set with
    /// [`Retention::all`]).
    ///
    /// # Errors
    /// [`InvalidInput::PurgeAgeTooLong`].
    pub fn check(&self) -> Result<(), InvalidInput> {
        for age in [self.completed, self.failed, self.cancelled] {
            checked(age)?;
        }
        Ok(())
    }
}

fn checked(age: Option<Duration>) -> Result<Option<Duration>, InvalidInput> {
    if let Some(age) = age {
        check_purge(age, 1)?;
    }
    Ok(age)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_merge_equal_ages_and_skip_states_kept_for_good() {
        let hour = Duration::from_secs(3600);
        assert_eq!(
            Retention::all(hour).groups(),
            vec![(EndedStates::ALL, hour)]
        );
        let r = Retention::all(hour)
            .with_completed(None)
            .and_then(|r| r.with_cancelled(Some(Duration::ZERO)))
            .unwrap();
        assert_eq!(
            r.groups(),
            vec![
                (EndedStates::CANCELLED, Duration::ZERO),
                (EndedStates::FAILED, hour)
            ]
        );
        let none = r
            .with_failed(None)
            .and_then(|r| r.with_cancelled(None))
            .unwrap();
        assert!(none.groups().is_empty());
        let e = Retention::default()
            .with_failed(Some(crate::MAX_PURGE_AGE + hour))
            .unwrap_err();
        assert!(matches!(e, InvalidInput::PurgeAgeTooLong { .. }), "{e}");
        assert!(Retention::all(crate::MAX_PURGE_AGE + hour).check().is_err());
        assert_eq!(
            format!("{:?}", EndedStates::FAILED | EndedStates::CANCELLED),
            r#"{"failed", "cancelled"}"#
        );
        assert_eq!(EndedStates::of(RunState::Runnable), None);
    }
}
