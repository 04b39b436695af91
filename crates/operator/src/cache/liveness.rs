//! The evidence of each candidate's liveness, as this process observed it: the versions its
//! candidate watch delivers and the pings its workers write, fed to the pure
//! [`arbiter_election::heard::Heard`] on this process's clocks.
//!
//! A candidate recreated under the same name is another candidate: what was heard from the old
//! one is dropped with it. A new candidate, or a new process incarnation on one, delivered as it
//! happened is a registration ([`arbiter_election::heard::Judged::registered`]).

use std::time::{Duration, Instant};

use kube::ResourceExt;

use crate::cache::candidate_index::PerCandidate;
use arbiter_api::LeaseCandidate;
use arbiter_election::heard::{Heard, Judged, Version};

/// What was heard from every candidate, by (namespace, name), with its uid and the process
/// incarnation last seen on it. (Boxed: a map's spare buckets then cost a pointer each, not a
/// whole entry: at 30,000 candidates, 11 MiB instead of 19.)
#[derive(Clone, Default)]
pub struct Liveness(PerCandidate<Box<Entry>>);

struct Entry {
    uid: String,
    incarnation: Option<String>,
    heard: Heard,
}

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
    /// Runs `f` on what was heard from `c`; returns whether `c` is new to this process (first
    /// seen, another uid under its name, or another process incarnation on it).
    fn with(&self, c: &LeaseCandidate, f: impl FnOnce(&mut Heard)) -> bool {
        let key = (c.namespace().unwrap_or_default(), c.name_any());
        let uid = c.uid().unwrap_or_default();
        let incarnation = arbiter_api::incarnation(c).map(str::to_string);
        let mut all = self.0.lock();
        let mut new = false;
        let entry = all.entry(key).or_insert_with(|| {
            new = true;
            Box::new(Entry {
                uid: uid.clone(),
                incarnation: incarnation.clone(),
                heard: Heard::default(),
            })
        });
        if entry.uid != uid {
            entry.uid = uid;
            entry.heard = Heard::default();
            new = true;
        }
        if entry.incarnation != incarnation {
            entry.incarnation = incarnation;
            new = true;
        }
        f(&mut entry.heard);
        new
    }

    /// A candidate from the watch: `live` for an event as it happened, not for a (re)list. A
    /// new candidate, or a new process incarnation on one, seen live is a registration.
    pub fn delivered(&self, c: &LeaseCandidate, live: bool) {
        let (now, wall) = (Instant::now(), jiff::Timestamp::now());
        let new = self.with(c, |h| h.delivered(version(c), now, live, wall));
        if new && live {
            self.with(c, |h| h.registered(now));
        }
    }

    /// This process pinged the candidate, sent at `at`; `answer` is the write's answer. (A new
    /// process incarnation the answer shows first is a registration too: the watch, delivering
    /// it afterwards, would no longer see it as new.)
    pub fn pinged(&self, answer: &LeaseCandidate, at: Instant) {
        if self.with(answer, |h| h.pinged(version(answer), at)) {
            self.with(answer, |h| h.registered(Instant::now()));
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

    /// What the election needs of `c` now: this process's last ping to it, whether a renewal
    /// of its own seen within `valid` proves it alive, and when it registered.
    pub fn judge(&self, c: &LeaseCandidate, valid: Duration) -> Judged {
        let key = (c.namespace().unwrap_or_default(), c.name_any());
        let all = self.0.lock();
        match all.get(&key) {
            Some(e) if c.uid().as_deref() == Some(e.uid.as_str()) => {
                e.heard.judge(Instant::now(), jiff::Timestamp::now(), valid)
            }
            _ => Judged::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbiter_api::INCARNATION_ANNOTATION;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn candidate(uid: &str, incarnation: &str, rv: &str) -> LeaseCandidate {
        let mut c = crate::test_candidate("c", "l");
        c.metadata.namespace = Some("ns".into());
        c.metadata.uid = Some(uid.into());
        c.metadata.resource_version = Some(rv.into());
        c.metadata.annotations =
            Some([(INCARNATION_ANNOTATION.to_string(), incarnation.to_string())].into());
        c
    }

    #[test]
    fn a_pings_own_write_delivered_before_its_answer_answers_nothing() {
        let valid = Duration::from_secs(10);
        let l = Liveness::default();
        let mut listed = candidate("u", "p1", "5");
        listed.spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
        l.delivered(&listed, false);
        // The ping's write (pingTime set, renewTime as it was) is delivered by the watch before
        // the write's answer is taken in.
        let mut pinged = listed.clone();
        pinged.metadata.resource_version = Some("6".into());
        pinged.spec.ping_time = Some(MicroTime(jiff::Timestamp::now()));
        l.delivered(&pinged, true);
        l.pinged(&pinged, Instant::now());
        let judged = l.judge(&listed, valid);
        assert!(!judged.renewed_lately, "{judged:?}");
        assert!(!judged.ping.is_some_and(|p| p.answered), "{judged:?}");
    }

    #[test]
    fn a_registration_is_a_new_candidate_or_process_seen_live() {
        let valid = Duration::from_secs(10);
        let l = Liveness::default();
        l.delivered(&candidate("u1", "i1", "1"), false);
        assert_eq!(
            l.judge(&candidate("u1", "i1", "1"), valid).registered,
            None,
            "first seen in a list: may be old"
        );
        l.delivered(&candidate("u1", "i1", "2"), true);
        assert_eq!(
            l.judge(&candidate("u1", "i1", "2"), valid).registered,
            None,
            "a change of a known process"
        );
        l.delivered(&candidate("u1", "i2", "3"), true);
        assert!(
            l.judge(&candidate("u1", "i2", "3"), valid)
                .registered
                .is_some(),
            "a new process"
        );
        l.delivered(&candidate("u2", "i3", "4"), true);
        assert!(
            l.judge(&candidate("u2", "i3", "4"), valid)
                .registered
                .is_some(),
            "recreated"
        );
    }
}
