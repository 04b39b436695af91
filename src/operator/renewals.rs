//! Proof of life without a ping: a candidate the arbiter saw renew lately.
//!
//! An agent writes its candidate's `renewTime` when it registers and refreshes it on its own
//! every 5 min ([`crate::candidate::REFRESH`]). When the candidate watch delivers such a write
//! as it happens (a live event that changed `renewTime`, or created the candidate; not a
//! relist, which may deliver writes of long ago), the arbiter notes when, on its monotonic
//! clock. For the ack validity after that (`--ack-valid-for`, 10 s by default), the candidate
//! counts as alive without a ping, as if it had answered one: provided its `renewTime` is also
//! that recent on the arbiter's own clock and not ahead of it by more than [`AHEAD`], so that a
//! watch which delivered an old write late does not pass for a fresh one (a candidate whose
//! clock runs further ahead is simply pinged).
//!
//! This saves the pings of a first election (every candidate just registered), and of any
//! election among candidates that refreshed lately (rare between elections: an agent
//! refreshes every 5 min, which at 30,000 candidates is 100 writes a second; every 30 s, as
//! before, it was 1,000, far more than the pings it saved). When thousands of candidates
//! register at once, their elections queue, and one reconciled later than the validity after
//! its candidates registered pings them all the same: a longer `--ack-valid-for` saves those.
//! It decides nothing about safety: a candidate that dies right after renewing may be elected,
//! as one that dies right after answering a ping may, and its lease then expires (the longer
//! the validity, the likelier). The stricter checks still need an answer
//! to a ping sent after the fact: the target of a handover, the next holder after a release.

use std::time::{Duration, Instant};

use jiff::Timestamp;
use kube::ResourceExt;

use super::index::PerCandidate;
use crate::api::LeaseCandidate;

/// How far ahead of the arbiter's clock a `renewTime` may be and still count.
pub const AHEAD: Duration = Duration::from_secs(1);

/// A candidate's last seen `renewTime`, and when the arbiter saw it written, if it saw that
/// live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seen {
    renew: Option<Timestamp>,
    live_at: Option<Instant>,
}

/// When each candidate was last seen renewing, by (namespace, name).
#[derive(Clone, Default)]
pub struct Renewals(PerCandidate<Seen>);

impl Renewals {
    /// A candidate from the watch: `live` for an event as it happened, not for a (re)list.
    pub fn observe(&self, c: &LeaseCandidate, live: bool) {
        let renew = c.spec.renew_time.as_ref().map(|t| t.0);
        self.observe_at(
            (c.namespace().unwrap_or_default(), c.name_any()),
            renew,
            live,
            Instant::now(),
        );
    }

    fn observe_at(&self, key: (String, String), renew: Option<Timestamp>, live: bool, at: Instant) {
        let mut seen = self.0.lock();
        let before = seen.get(&key).copied();
        let live_at = match before {
            // Unchanged: whatever was known (a relist of a write seen live keeps it).
            Some(b) if b.renew == renew => b.live_at,
            // Written since: live only if the event is.
            _ => (live && renew.is_some()).then_some(at),
        };
        seen.insert(key, Seen { renew, live_at });
    }

    /// Forgets a deleted candidate.
    pub fn forget(&self, c: &LeaseCandidate) {
        self.0.forget(c);
    }

    /// Keeps only the candidates `exists` knows (after a relist, which reports no deletions).
    pub fn retain(&self, exists: impl Fn(&str, &str) -> bool) {
        self.0.retain(exists);
    }

    /// Whether `name` renewed on its own within `window`, by both clocks: the arbiter saw the
    /// write live within `window` on its monotonic clock, and the `renewTime` it wrote is
    /// within `window` of `now` on the arbiter's wall clock.
    pub fn lately(&self, namespace: &str, name: &str, now: Timestamp, window: Duration) -> bool {
        let seen = self.0.lock();
        let Some(s) = seen.get(&(namespace.to_string(), name.to_string())) else {
            return false;
        };
        lately(s, Instant::now(), now, window)
    }
}

fn lately(s: &Seen, at: Instant, now: Timestamp, window: Duration) -> bool {
    let (Some(renew), Some(live_at)) = (s.renew, s.live_at) else {
        return false;
    };
    let age = now.duration_since(renew);
    let recent = age <= jiff::SignedDuration::try_from(window).unwrap_or(jiff::SignedDuration::MAX)
        && age >= -jiff::SignedDuration::try_from(AHEAD).unwrap_or_default();
    at.saturating_duration_since(live_at) <= window && recent
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(10);

    fn key() -> (String, String) {
        ("ns".into(), "c".into())
    }

    fn seen(r: &Renewals) -> Seen {
        *r.0.lock().get(&key()).unwrap()
    }

    #[test]
    fn a_live_write_counts_for_the_window_on_both_clocks() {
        let r = Renewals::default();
        let (t0, now) = (Instant::now(), Timestamp::now());
        r.observe_at(key(), Some(now), true, t0);
        let s = seen(&r);
        assert!(lately(&s, t0, now, WINDOW));
        assert!(lately(&s, t0 + WINDOW, now, WINDOW));
        assert!(
            !lately(&s, t0 + WINDOW + Duration::from_millis(1), now, WINDOW),
            "seen too long ago on the monotonic clock"
        );
        let later = now + jiff::SignedDuration::from_secs(11);
        assert!(
            !lately(&s, t0, later, WINDOW),
            "a renewTime that old on the arbiter's clock (an event delivered late)"
        );
        let slightly_behind = now - jiff::SignedDuration::from_millis(900);
        assert!(
            lately(&s, t0, slightly_behind, WINDOW),
            "a renewTime less than a second ahead of the arbiter's clock"
        );
        let behind = now - jiff::SignedDuration::from_secs(2);
        assert!(
            !lately(&s, t0, behind, WINDOW),
            "a renewTime two seconds ahead of the arbiter's clock"
        );
    }

    #[test]
    fn a_relist_or_a_write_that_did_not_renew_proves_nothing_new() {
        let r = Renewals::default();
        let (t0, now) = (Instant::now(), Timestamp::now());
        r.observe_at(key(), Some(now), false, t0);
        assert_eq!(seen(&r).live_at, None, "first seen in a list");
        r.observe_at(key(), Some(now), true, t0 + WINDOW);
        assert_eq!(
            seen(&r).live_at,
            None,
            "a live event that did not change renewTime (a ping, a status write)"
        );
        let renewed = now + jiff::SignedDuration::from_secs(30);
        r.observe_at(key(), Some(renewed), true, t0 + WINDOW);
        assert_eq!(seen(&r).live_at, Some(t0 + WINDOW), "a renew, live");
        r.observe_at(key(), Some(renewed), false, t0 + 2 * WINDOW);
        assert_eq!(
            seen(&r).live_at,
            Some(t0 + WINDOW),
            "a relist of the same write keeps when it was seen live"
        );
        let again = renewed + jiff::SignedDuration::from_secs(30);
        r.observe_at(key(), Some(again), false, t0 + 3 * WINDOW);
        assert_eq!(
            seen(&r).live_at,
            None,
            "a write first seen in a relist may be old"
        );
        r.observe_at(key(), None, true, t0 + 3 * WINDOW);
        assert_eq!(seen(&r).live_at, None, "no renewTime");
    }
}
