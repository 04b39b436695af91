//! When this process first saw each lease's record, and its term: the age of a record on the
//! arbiter's own clock (from its delivery, never from a timestamp someone wrote).

use std::time::{Duration, Instant};

/// A lease's record as this process first saw it (`Sighting`, not the memory of holders'
/// [`crate::term::held::Seen`]).
pub(crate) struct Sighting {
    fingerprint: String,
    since: Instant,
    /// When this process first saw the lease (since it led): no record is older than that.
    first: Instant,
    /// The holder and term of the current record, and when this process first saw a record
    /// of them: the term began no later.
    term: (Option<String>, i32),
    pub(crate) term_since: Instant,
}

impl Sighting {
    /// Before the first sight.
    pub(crate) fn first() -> Sighting {
        let now = Instant::now();
        Sighting {
            fingerprint: String::new(),
            since: now,
            first: now,
            term: (None, 0),
            term_since: now,
        }
    }

    /// The record with `fingerprint` naming `holder` at `term`, first delivered at `delivered`
    /// (if the watch stamped it): how long it has been unchanged. [`Sighting::term_since`] then
    /// says since when its term is known.
    pub(crate) fn sighted(
        &mut self,
        fingerprint: String,
        holder: Option<String>,
        term: i32,
        delivered: Option<Instant>,
        now: Instant,
    ) -> Duration {
        let key = (holder, term);
        if self.fingerprint.is_empty() {
            // First sight since this process led (after a start, or taking over from another
            // replica: its caches may be warm, but nobody renewed single-active leases
            // meanwhile): a full duration from now, as documented.
            *self = Sighting {
                fingerprint,
                since: now,
                first: now,
                term: key,
                term_since: now,
            };
        } else if self.fingerprint != fingerprint {
            // A record the watch has not stamped yet (the cache is a step ahead of it, or the
            // worker's own write) is as old as this sight of it. Never older than the first
            // sight: the view may go back from the worker's own write to a record the cache
            // still shows ([`crate::cache::written`]), delivered before this process led.
            let since = delivered.unwrap_or(now).max(self.first);
            let (term, term_since) = if self.term == key {
                (key, self.term_since)
            } else {
                (key, since)
            };
            *self = Sighting {
                fingerprint,
                since,
                first: self.first,
                term,
                term_since,
            };
        } else if let Some(d) = delivered {
            // The same record delivered again since (an earlier record restored by hand after
            // renewals no worker reconciled, or rewritten while the watch was down): as old as
            // its last delivery, never older.
            self.since = self.since.max(d);
        }
        now.saturating_duration_since(self.since)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_record_is_as_old_as_its_delivery_but_a_first_sight_counts_from_now() {
        let t0 = Instant::now();
        let mut seen = Sighting::first();
        let a = Some("a".to_string());
        // Delivered long before this process led (a warm standby): a full duration from now.
        let age = seen.sighted("s1".into(), a.clone(), 1, t0.checked_sub(60 * S), t0);
        assert_eq!(age, Duration::ZERO);
        // A renewal, delivered at t0 + 5 s, looked at 3 s later: as old as its delivery.
        let age = seen.sighted("s2".into(), a.clone(), 1, Some(t0 + 5 * S), t0 + 8 * S);
        assert_eq!(age, 3 * S);
        // Not yet stamped (the cache ahead of the watch's handler): from this sight.
        let age = seen.sighted("s3".into(), a.clone(), 1, None, t0 + 9 * S);
        assert_eq!(age, Duration::ZERO);
    }

    #[test]
    fn an_earlier_record_delivered_again_is_as_old_as_its_last_delivery() {
        let t0 = Instant::now();
        let mut seen = Sighting::first();
        let a = Some("a".to_string());
        seen.sighted("s1".into(), a.clone(), 1, Some(t0), t0);
        // s2 (a renewal) was delivered and never looked at; s1 restored by hand at t0 + 20 s.
        let age = seen.sighted("s1".into(), a.clone(), 1, Some(t0 + 20 * S), t0 + 25 * S);
        assert_eq!(age, 5 * S, "not 25 s: the restored record is new");
        // Delivered again with an older stamp (never happens): never older.
        let age = seen.sighted("s1".into(), a, 1, Some(t0), t0 + 26 * S);
        assert_eq!(age, 6 * S);
    }

    #[test]
    fn a_record_seen_again_after_the_workers_own_write_is_no_older_than_the_first_sight() {
        let t0 = Instant::now();
        let mut seen = Sighting::first();
        let a = Some("a".to_string());
        // Delivered before this process led; first seen at t0.
        let delivered = t0.checked_sub(30 * S);
        seen.sighted("s1".into(), a.clone(), 1, delivered, t0);
        // The worker renews at t0 + 5 s and looks at its own write (not delivered yet) ...
        seen.sighted("s2".into(), a.clone(), 1, None, t0 + 5 * S);
        // ... then its memory is dropped while the cache still shows s1.
        let age = seen.sighted("s1".into(), a, 1, delivered, t0 + 8 * S);
        assert_eq!(age, 8 * S, "not 38 s: s1 was first seen at t0");
    }

    #[test]
    fn a_term_is_known_from_the_first_record_of_its_holder_and_term_seen() {
        let t0 = Instant::now();
        let mut seen = Sighting::first();
        let a = Some("a".to_string());
        seen.sighted("s1".into(), a.clone(), 1, t0.checked_sub(60 * S), t0);
        assert_eq!(
            seen.term_since, t0,
            "first sight: from now, not from its delivery"
        );
        // Renewals of the same term do not move it.
        seen.sighted("s2".into(), a.clone(), 1, Some(t0 + 5 * S), t0 + 6 * S);
        assert_eq!(seen.term_since, t0);
        // A new term (even of the same holder) is known from its delivery.
        seen.sighted("s3".into(), a.clone(), 2, Some(t0 + 7 * S), t0 + 9 * S);
        assert_eq!(seen.term_since, t0 + 7 * S);
        seen.sighted("s4".into(), Some("b".into()), 2, None, t0 + 10 * S);
        assert_eq!(seen.term_since, t0 + 10 * S, "another holder: another term");
    }
}
