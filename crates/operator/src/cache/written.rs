//! What this worker wrote that its cache may not show yet: candidates' statuses and Leases.
//!
//! A lease is often reconciled again before the watch delivers what the last reconcile wrote
//! (the answers to a ping arrive while the other pings and the statuses are being written).
//! Judged from the cache alone, a status would be written again, with its transition's Event
//! (`Elected`, `Deposed`, ...) published again. So the worker
//! remembers, per object (a candidate by uid: one recreated under the same name is another), the
//! value it read and the values it wrote over it since: while the cache still shows the value
//! read, or one of the earlier values written, the last one written stands for it. Once the cache
//! shows the last one, or anything else (someone else's write), the cache counts again. A
//! memory is kept at most [`KEPT_FOR`], so a hand edit that puts back exactly the value read
//! before is overlooked no longer than that.
//!
//! (Pings need none of it: the worker's own pings are recorded as it writes them, see
//! [`crate::cache::liveness`].)
//!
//! A Lease this worker wrote ([`LeaseVersion`], compared by `resourceVersion`) stands for the
//! record it replaced: the next write is a compare-and-swap on the version the API server
//! returned, not on one the cache still shows and the server has moved past (while the watch
//! lags, every write would conflict: a new term would be reserved and lost each time, and the
//! lease decided again only after a retry). It is never older than the cache: versions are
//! never reused, so someone else's write shows in the cache as another version, and from then
//! on the cache counts, also when the watch delivered it before the write's answer was read
//! (the new holder's agent takes its term at once: [`Written::record_lease`]); the
//! compare-and-swap refuses a write over a change the cache has not shown yet (and keeps
//! refusing until the cache shows it, as it would without the memory). One case looks like the
//! cache being behind: a Lease this worker created or wrote, deleted by hand before the cache
//! showed it (no Lease either way); writes on it fail until the memory expires.
//! When the view goes back from a written record to an older one the cache shows (the memory
//! expired), that record's age counts from no earlier than the worker's first sight of the
//! lease ([`crate::reconcile::view`]).

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;

use crate::key::LeaseKey;

/// How long a written value stands for a cache that has not shown it yet.
pub const KEPT_FOR: Duration = Duration::from_secs(30);
/// How often the Leases the cache shows by now are forgotten ([`Written::forget_shown`]).
const SWEEP_SHOWN_EVERY: Duration = Duration::from_secs(1);

struct Write<T> {
    read: T,
    /// Every value written over `read`, the last one last.
    wrote: Vec<T>,
    at: Instant,
}

impl<T> Write<T> {
    /// Whether the cache, showing `cached`, has not caught up with the last write yet.
    fn behind<Q>(&self, cached: &Q) -> bool
    where
        T: Borrow<Q>,
        Q: PartialEq + ?Sized,
    {
        let earlier = &self.wrote[..self.wrote.len().saturating_sub(1)];
        self.read.borrow() == cached || earlier.iter().any(|w| w.borrow() == cached)
    }
}

/// A Lease as the cache showed it or as this worker wrote it, compared by `resourceVersion`
/// (empty: no Lease).
#[derive(Clone, Debug)]
pub struct LeaseVersion {
    version: String,
    pub lease: Option<Arc<Lease>>,
}

impl LeaseVersion {
    pub fn of(lease: Option<Arc<Lease>>) -> LeaseVersion {
        let version = lease
            .as_ref()
            .and_then(|l| l.metadata.resource_version.clone())
            .unwrap_or_default();
        LeaseVersion { version, lease }
    }

    /// Only the version, to compare with: what a Lease was read as (never returned).
    pub fn only_version(self) -> LeaseVersion {
        LeaseVersion {
            lease: None,
            ..self
        }
    }
}

impl PartialEq for LeaseVersion {
    fn eq(&self, other: &Self) -> bool {
        self.version == other.version
    }
}

impl Borrow<str> for LeaseVersion {
    fn borrow(&self) -> &str {
        &self.version
    }
}

/// Per object (a candidate's uid, a lease's key): the value read and the values written since.
/// Memories older than [`KEPT_FOR`] are dropped at least every [`KEPT_FOR`] (a Lease's memory
/// holds the whole Lease as written: at 10,000 leases, kept until the next write of each, they
/// were a second copy of every Lease).
pub struct Written<T, K = String> {
    writes: HashMap<K, Write<T>>,
    pruned: Option<Instant>,
    swept_shown: Option<Instant>,
}

impl<T, K> Default for Written<T, K> {
    fn default() -> Self {
        Written {
            writes: HashMap::new(),
            pruned: None,
            swept_shown: None,
        }
    }
}

impl Written<LeaseVersion, LeaseKey> {
    /// Forgets, at most once a second, the Leases whose cache (`shown`: the version it shows of
    /// a lease, empty for none) no longer lags this worker's last write: the
    /// cache counts for them again, and their next reconcile (which would forget them too) may
    /// be a while away when many leases wait for a worker. Until then each was a second copy of
    /// its Lease.
    pub fn forget_shown(&mut self, now: Instant, shown: impl Fn(&LeaseKey) -> String) {
        if self
            .swept_shown
            .is_some_and(|at| now.saturating_duration_since(at) < SWEEP_SHOWN_EVERY)
        {
            return;
        }
        self.writes.retain(|key, w| w.behind(shown(key).as_str()));
        self.swept_shown = Some(now);
    }
}

impl Written<LeaseVersion, LeaseKey> {
    /// Records the Lease `wrote`, a compare-and-swap made on version `base` (empty: a
    /// create), written while the cache showed `cached`. When the cache already shows a record
    /// not known to come before the write (the write itself, or a later one: someone wrote
    /// after it, say the new holder's agent taking its term, and the watch delivered both
    /// before the write returned), the cache counts at once: remembered against that record,
    /// the write would stand for a newer one until the Lease changed again, or for
    /// [`KEPT_FOR`]. Known to come before it: the base, an earlier record this memory stands
    /// for, or no Lease (one created, or adopted before the watch saw it).
    pub fn record_lease(
        &mut self,
        key: &LeaseKey,
        base: &str,
        cached: LeaseVersion,
        wrote: LeaseVersion,
        now: Instant,
    ) {
        let shown: &str = cached.borrow();
        let before = shown == base
            || shown.is_empty()
            || self.writes.get(key).is_some_and(|w| w.behind(shown));
        if before {
            self.record(key, cached, wrote, now);
        } else {
            self.writes.remove(key);
        }
    }
}

impl<T, K: Eq + Hash> Written<T, K> {
    /// Drops the memories older than [`KEPT_FOR`], once per [`KEPT_FOR`].
    fn prune(&mut self, now: Instant) {
        if self
            .pruned
            .is_some_and(|at| now.saturating_duration_since(at) < KEPT_FOR)
        {
            return;
        }
        self.writes
            .retain(|_, w| now.saturating_duration_since(w.at) < KEPT_FOR);
        self.writes.shrink_to_fit();
        self.pruned = Some(now);
    }
}

impl<T: Clone, K: Eq + Hash> Written<T, K> {
    /// The last value this worker wrote, while the cache, showing `cached`, has not caught up
    /// with it; `None` when the cache counts.
    pub fn current<Q, I>(&mut self, key: &I, cached: &Q, now: Instant) -> Option<T>
    where
        T: Borrow<Q>,
        Q: PartialEq + ?Sized,
        K: Borrow<I>,
        I: Eq + Hash + ?Sized,
    {
        self.prune(now);
        let w = self.writes.get(key)?;
        if w.behind(cached) && now.saturating_duration_since(w.at) < KEPT_FOR {
            return w.wrote.last().cloned();
        }
        self.writes.remove(key);
        None
    }

    /// Records that `wrote` was written while the cache showed `cached`.
    pub fn record<I>(&mut self, key: &I, cached: T, wrote: T, now: Instant)
    where
        T: PartialEq,
        K: Borrow<I>,
        I: Eq + Hash + ToOwned<Owned = K> + ?Sized,
    {
        match self.writes.get_mut(key) {
            // Written over a write the cache does not show yet: the chain goes on.
            Some(w) if w.behind(&cached) => {
                w.wrote.push(wrote);
                w.at = now;
            }
            _ => {
                let w = Write {
                    read: cached,
                    wrote: vec![wrote],
                    at: now,
                };
                self.writes.insert(key.to_owned(), w);
            }
        }
        self.prune(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn cond(status: &str) -> Vec<Condition> {
        vec![Condition {
            type_: "Leader".into(),
            status: status.into(),
            reason: "R".into(),
            message: "m".into(),
            last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }]
    }

    const UID: &str = "uid-1";

    #[test]
    fn a_write_stands_for_a_cache_that_has_not_shown_it() {
        let mut w = Written::default();
        let t0 = Instant::now();
        w.record(UID, cond("False"), cond("True"), t0);
        assert_eq!(w.current(UID, &cond("False")[..], t0), Some(cond("True")));
        // Shown: the cache counts again, and the memory goes.
        assert_eq!(w.current(UID, &cond("True")[..], t0), None);
        assert!(w.writes.is_empty());
    }

    #[test]
    fn writes_in_a_row_stand_until_the_cache_shows_the_last() {
        let mut w = Written::default();
        let t0 = Instant::now();
        w.record(UID, cond("False"), cond("True"), t0);
        // Written again before the cache showed the first write.
        let current = w.current(UID, &cond("False")[..], t0).unwrap();
        w.record(UID, cond("False"), cond("Unknown"), t0);
        assert_eq!(current, cond("True"));
        // The first write arrives: still behind, the last write stands.
        assert_eq!(w.current(UID, &cond("True")[..], t0), Some(cond("Unknown")));
        assert_eq!(w.current(UID, &cond("Unknown")[..], t0), None);
    }

    #[test]
    fn someone_elses_status_counts_at_once() {
        let mut w = Written::default();
        let t0 = Instant::now();
        w.record(UID, cond("False"), cond("True"), t0);
        assert_eq!(w.current(UID, &cond("Unknown")[..], t0), None);
        // ... and the memory is gone even if the cache goes back to what was read.
        assert_eq!(w.current(UID, &cond("False")[..], t0), None);
    }

    #[test]
    fn a_write_stands_no_longer_than_kept_for() {
        let mut w = Written::default();
        let t0 = Instant::now();
        w.record(UID, cond("False"), cond("True"), t0);
        assert_eq!(w.current(UID, &cond("False")[..], t0 + KEPT_FOR), None);
    }

    fn lease(version: &str, holder: &str) -> LeaseVersion {
        let mut l = Lease::default();
        l.metadata.resource_version = Some(version.into());
        l.spec = Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            holder_identity: Some(holder.into()),
            ..Default::default()
        });
        LeaseVersion::of(Some(Arc::new(l)))
    }

    #[test]
    fn a_lease_written_stands_for_the_version_it_replaced_until_the_cache_moves() {
        let mut w = Written::default();
        let t0 = Instant::now();
        // A renewal, then a new holder written over it, before the cache showed either.
        w.record("ns/l", lease("1", "a"), lease("2", "a"), t0);
        let base = w.current("ns/l", "1", t0).unwrap();
        assert_eq!(base.version, "2");
        w.record("ns/l", lease("1", "a"), lease("3", "b"), t0);
        // The cache shows the renewal: still behind the new holder.
        let base = w.current("ns/l", "2", t0).unwrap();
        assert_eq!(
            base.lease
                .unwrap()
                .spec
                .as_ref()
                .unwrap()
                .holder_identity
                .as_deref(),
            Some("b")
        );
        // Someone else's write (version 4) counts at once.
        assert_eq!(w.current("ns/l", "4", t0), None);
    }

    #[test]
    fn a_lease_write_the_cache_is_already_past_is_not_remembered() {
        let mut w: Written<LeaseVersion, LeaseKey> = Written::default();
        let key = LeaseKey::new("ns", "l");
        let t0 = Instant::now();
        // Written over 7 as 8; before the write returned, the new holder's agent took its
        // term (9) and the watch delivered it: the cache counts, at once and for good.
        w.record_lease(&key, "7", lease_at("9").only_version(), lease_at("8"), t0);
        assert_eq!(w.current(&key, "9", t0), None);
        // The write itself shown already: nothing to remember either.
        w.record_lease(&key, "9", lease_at("10").only_version(), lease_at("10"), t0);
        assert_eq!(w.current(&key, "10", t0), None);
        // (base, version the cache shows, version written), then what stands for a cache
        // showing `shown`.
        let mut write = |base: &str, shown: &str, wrote: &str| {
            w.record_lease(
                &key,
                base,
                lease_at(shown).only_version(),
                lease_at(wrote),
                t0,
            );
        };
        // Shown as the base: the write stands until the cache moves.
        write("10", "10", "11");
        // Written again over the write the cache does not show yet: the chain goes on.
        write("11", "10", "12");
        let standing = |w: &mut Written<LeaseVersion, LeaseKey>, shown: &str| {
            w.current(&key, shown, t0).map(|l| l.version)
        };
        assert_eq!(standing(&mut w, "10"), Some("12".into()));
        assert_eq!(standing(&mut w, "11"), Some("12".into()));
        // A remembered write the cache then passed: someone's later record counts.
        w.record_lease(
            &key,
            "12",
            lease_at("14").only_version(),
            lease_at("13"),
            t0,
        );
        assert_eq!(standing(&mut w, "14"), None);
        // Created while the cache showed none: stands for a cache without it.
        let other = LeaseKey::new("ns", "m");
        w.record_lease(&other, "", LeaseVersion::of(None), lease_at("20"), t0);
        assert_eq!(
            w.current(&other, "", t0).map(|l| l.version),
            Some("20".into())
        );
    }

    #[test]
    fn a_lease_created_stands_for_a_cache_without_it() {
        let mut w = Written::default();
        let t0 = Instant::now();
        w.record("ns/l", LeaseVersion::of(None), lease("1", "a"), t0);
        assert_eq!(
            w.current("ns/l", "", t0).map(|l| l.version),
            Some("1".into())
        );
        // Deleted by hand before the cache showed it: a cache without it looks the same, so
        // the memory stands until it is kept no longer (a write on it fails meanwhile).
        assert_eq!(w.current("ns/l", "", t0 + KEPT_FOR), None);
    }

    #[test]
    fn old_memories_are_pruned() {
        let mut w: Written<Vec<Condition>> = Written::default();
        let t0 = Instant::now();
        for i in 0..63 {
            w.record(&format!("other-{i}"), vec![], cond("True"), t0);
        }
        w.record(UID, vec![], cond("True"), t0 + KEPT_FOR);
        assert_eq!(w.writes.len(), 1);
        // With no write since, a look at any object drops them too.
        w.current("another", &[][..], t0 + 2 * KEPT_FOR);
        assert!(w.writes.is_empty());
    }

    fn lease_at(version: &str) -> LeaseVersion {
        let mut l = Lease::default();
        l.metadata.resource_version = Some(version.into());
        LeaseVersion::of(Some(Arc::new(l)))
    }

    #[test]
    fn leases_the_cache_shows_are_forgotten_at_the_next_sweep() {
        let mut w: Written<LeaseVersion, LeaseKey> = Written::default();
        let (a, b) = (LeaseKey::new("ns", "a"), LeaseKey::new("ns", "b"));
        let t0 = Instant::now();
        // a: created (the cache showed none); b: replaced 7 with 8.
        w.record(&a, LeaseVersion::of(None), lease_at("5"), t0);
        w.record(&b, lease_at("7").only_version(), lease_at("8"), t0);
        let shows = |a: &'static str, b: &'static str| {
            move |key: &LeaseKey| match &*key.name {
                "a" => a.to_string(),
                "b" => b.to_string(),
                _ => String::new(),
            }
        };
        // Nothing shown yet: both kept.
        w.forget_shown(t0, shows("", "7"));
        assert_eq!(w.writes.len(), 2);
        // a shown, b not: a forgotten at the next sweep (a second on), b kept.
        w.forget_shown(t0 + Duration::from_millis(500), shows("5", "7"));
        assert_eq!(w.writes.len(), 2, "at most one sweep a second");
        w.forget_shown(t0 + Duration::from_secs(1), shows("5", "7"));
        assert_eq!(w.writes.keys().collect::<Vec<_>>(), [&b]);
        let standing = w.current(&b, "7", t0 + Duration::from_secs(1)).unwrap();
        assert_eq!(standing.version, "8");
        // Someone else's write (9) shows: the cache counts again.
        w.forget_shown(t0 + Duration::from_secs(2), shows("5", "9"));
        assert!(w.writes.is_empty());
    }
}
