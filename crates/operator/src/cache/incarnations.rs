//! Detecting two live processes that use one candidate identity.
//!
//! Every agent stamps its candidate with its incarnation (a random id per process) whenever it
//! writes it: when it registers, refreshes, or answers a ping. A restarted agent changes the
//! stamp once (A, B). Two live agents sharing a name keep overwriting each other, so the stamp
//! returns to a value it had (A, B, A) within a short window: an agent that sees another
//! process's stamp on its candidate writes within seconds of its first sight of that process
//! ([`arbiter_candidate::REFRESH_ON_NEW_OTHER`]), then every 30 s instead of every 5 min
//! ([`arbiter_candidate::REFRESH_CONTESTED`]), so each writes at least once in the window. The
//! log is fed by the candidate watch, which sees every update in order.

use std::time::{Duration, Instant};

use kube::ResourceExt;

use crate::cache::candidate_index::PerCandidate;
use arbiter_api::LeaseCandidate;

const WINDOW: Duration = Duration::from_secs(120);

/// A candidate's recent stamps, oldest first, with when they were seen.
type Stamps = Vec<(String, Instant)>;

/// The recent incarnation stamps of every candidate, by (namespace, name).
#[derive(Clone, Default)]
pub struct IncarnationLog(PerCandidate<Stamps>);

impl IncarnationLog {
    /// Records the stamp on `c` (from a watch event).
    pub fn record(&self, c: &LeaseCandidate) {
        let Some(inc) = arbiter_api::incarnation(c) else {
            return;
        };
        self.record_at(
            &c.namespace().unwrap_or_default(),
            &c.name_any(),
            inc,
            Instant::now(),
        );
    }

    fn record_at(&self, ns: &str, name: &str, inc: &str, at: Instant) {
        let mut log = self.0.lock();
        let seen = log.entry((ns.to_string(), name.to_string())).or_default();
        seen.retain(|(_, t)| at.saturating_duration_since(*t) < WINDOW);
        if seen.last().map(|(i, _)| i.as_str()) != Some(inc) {
            seen.push((inc.to_string(), at));
        }
    }

    /// Forgets a deleted candidate.
    pub fn forget(&self, c: &LeaseCandidate) {
        self.0.forget(c);
    }

    /// Keeps only the candidates `exists` knows (after a relist, which reports no deletions).
    pub fn retain(&self, exists: impl Fn(&str, &str) -> bool) {
        self.0.retain(exists);
    }

    /// The distinct incarnations of `name`, if two processes are using it.
    pub fn duplicate(&self, ns: &str, name: &str) -> Option<Vec<String>> {
        let log = self.0.lock();
        let seen = log.get(&(ns.to_string(), name.to_string()))?;
        let returned = seen
            .iter()
            .enumerate()
            .any(|(i, (inc, _))| seen[..i].iter().any(|(j, _)| j == inc));
        returned.then(|| {
            let mut distinct: Vec<String> = seen.iter().map(|(i, _)| i.clone()).collect();
            distinct.sort();
            distinct.dedup();
            distinct
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_is_not_a_duplicate_but_a_return_is() {
        let log = IncarnationLog::default();
        let t = Instant::now();
        log.record_at("ns", "c", "a", t);
        log.record_at("ns", "c", "a", t + Duration::from_secs(1));
        log.record_at("ns", "c", "b", t + Duration::from_secs(2));
        assert_eq!(log.duplicate("ns", "c"), None, "a restart: a then b");
        log.record_at("ns", "c", "a", t + Duration::from_secs(3));
        assert_eq!(log.duplicate("ns", "c"), Some(vec!["a".into(), "b".into()]));
        assert_eq!(log.duplicate("ns", "other"), None);
        // Outside the window, the old stamps are forgotten.
        log.record_at("ns", "c", "b", t + WINDOW + Duration::from_secs(10));
        assert_eq!(log.duplicate("ns", "c"), None);
    }
}
