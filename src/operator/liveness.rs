//! The evidence of each candidate's liveness, as this process observed it: the versions its
//! candidate watch delivers and the pings its workers write, fed to the pure
//! [`crate::election::heard::Heard`] on this process's clocks.
//!
//! A candidate recreated under the same name is another candidate: what was heard from the old
//! one is dropped with it.

use std::time::{Duration, Instant};

use kube::ResourceExt;

use super::index::PerCandidate;
use crate::api::LeaseCandidate;
use crate::election::heard::{Heard, Judged, Version};

/// What was heard from every candidate, by (namespace, name), with its uid.
#[derive(Clone, Default)]
pub struct Liveness(PerCandidate<(String, Heard)>);

fn version(c: &LeaseCandidate) -> Version {
    Version {
        resource_version: c
            .metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse().ok()),
        renew: c.spec.renew_time.as_ref().map(|t| t.0),
    }
}

impl Liveness {
    fn with(&self, c: &LeaseCandidate, f: impl FnOnce(&mut Heard)) {
        let key = (c.namespace().unwrap_or_default(), c.name_any());
        let uid = c.uid().unwrap_or_default();
        let mut all = self.0.lock();
        let entry = all
            .entry(key)
            .or_insert_with(|| (uid.clone(), Heard::default()));
        if entry.0 != uid {
            *entry = (uid, Heard::default());
        }
        f(&mut entry.1);
    }

    /// A candidate from the watch: `live` for an event as it happened, not for a (re)list.
    pub fn observe(&self, c: &LeaseCandidate, live: bool) {
        let (now, wall) = (Instant::now(), jiff::Timestamp::now());
        self.with(c, |h| h.delivered(version(c), now, live, wall));
    }

    /// This process pinged the candidate, sent at `at`; `answer` is the write's answer.
    pub fn pinged(&self, answer: &LeaseCandidate, at: Instant) {
        self.with(answer, |h| h.pinged(version(answer), at));
    }

    /// Forgets a deleted candidate.
    pub fn forget(&self, c: &LeaseCandidate) {
        self.0.forget(c);
    }

    /// Keeps only the candidates `exists` knows (after a relist, which reports no deletions).
    pub fn retain(&self, exists: impl Fn(&str, &str) -> bool) {
        self.0.retain(exists);
    }

    /// What the election needs of `c` now: this process's last ping to it, and whether a
    /// renewal of its own seen within `valid` proves it alive.
    pub fn judge(&self, c: &LeaseCandidate, valid: Duration) -> Judged {
        let key = (c.namespace().unwrap_or_default(), c.name_any());
        let all = self.0.lock();
        match all.get(&key) {
            Some((uid, h)) if c.uid().as_deref() == Some(uid.as_str()) => {
                h.judge(Instant::now(), jiff::Timestamp::now(), valid)
            }
            _ => Judged::default(),
        }
    }
}
