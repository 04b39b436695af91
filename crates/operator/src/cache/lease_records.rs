//! When each Lease record was delivered, and which of its changes need a reconcile.
//!
//! The arbiter judges a term on its own monotonic clock, from the moment it first saw the
//! record that names the holder: never earlier than the holder wrote it, so it never judges a
//! term over before the holder does. That moment is stamped here, as the watch delivers the
//! record, not when a worker gets round to the lease: under load a worker may reach it seconds
//! later, and every such second used to be added to the election after a holder's failure.
//!
//! A holder's renewal (a record that differs from the one delivered before it only in
//! `renewTime` and `resourceVersion`) needs no reconcile. It changes two things the election
//! reads: the record's age, stamped here, and the remembered term's last sighting, which the
//! watch handler bumps at once ([`crate::term::held::Held::renewed`]), so that a Lease deleted or
//! edited by hand before a worker looks again cannot shorten the term. The lease's timer (its
//! expiry, as last judged) brings the worker back; it finds the record younger and sets the
//! timer again. At 10,000 leases renewed every 20 s that is 500 reconciles a second fewer, and
//! a worker's queue holds what needs deciding.
//!
//! Only a live event is passed over: a relist may stand for changes the watch missed, and is
//! always reconciled. Which changes count as a renewal is decided by comparing everything but
//! `renewTime` and `resourceVersion` by a 64-bit hash; a collision (a real change taken for a
//! renewal) would delay that lease's reconcile to its timer, never shorten a term: the record's
//! age is judged from the full spec, compared as written.

use std::collections::HashMap;
use std::hash::Hasher;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::watcher;

use crate::key::LeaseKey;
use crate::term::held::Held;
use arbiter_api::lease;

/// One lease's last delivered record.
struct Record {
    /// The spec as written ([`fingerprint`]): the record, as its age is judged.
    spec: String,
    /// The object's `resourceVersion`: a relist that delivers another one missed a write.
    version: Option<String>,
    /// When a record with this spec was first delivered.
    delivered: Instant,
    /// Everything but `renewTime` and `resourceVersion`, hashed.
    rest: u64,
}

/// What a delivered record means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Delivered {
    /// When this record was first delivered (now, unless the same spec was delivered before
    /// with nothing missed in between).
    since: Instant,
    /// Whether the lease needs a reconcile: anything but a live renewal, or a live event
    /// that changed nothing.
    reconcile: bool,
    /// A relist delivered another version than the last one delivered: writes were missed
    /// while the watch was down (a holder's renewals among them, perhaps).
    missed: bool,
}

/// The last delivered record of each Lease the operator watches.
#[derive(Clone, Default)]
pub struct Records(Arc<Mutex<HashMap<LeaseKey, Record>>>);

/// The key of `lease`.
fn key_of(lease: &Lease) -> LeaseKey {
    LeaseKey::new(
        lease.metadata.namespace.as_deref().unwrap_or_default(),
        lease.metadata.name.as_deref().unwrap_or_default(),
    )
}

/// A record's spec as written: two records with the same fingerprint are the same record.
pub fn fingerprint(lease: &Lease) -> String {
    serde_json::to_string(&lease.spec).unwrap_or_default()
}

/// Everything a reconcile reads of `lease` but its `renewTime` (and `resourceVersion`, which
/// every write changes), hashed.
fn rest_of(lease: &Lease) -> u64 {
    let mut l = lease.clone();
    l.metadata.resource_version = None;
    l.metadata.generation = None;
    if let Some(spec) = l.spec.as_mut() {
        spec.renew_time = None;
    }
    let mut h = fnv::FnvHasher::default();
    h.write(serde_json::to_string(&l).unwrap_or_default().as_bytes());
    h.finish()
}

impl Records {
    fn locked(&self) -> std::sync::MutexGuard<'_, HashMap<LeaseKey, Record>> {
        // A panic while holding it leaves plain data; the map is still usable.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `lease` as the watch delivers it now: `live` for an event as it happened, not a relist.
    fn deliver(&self, lease: &Lease, live: bool) -> Delivered {
        self.deliver_at(
            key_of(lease),
            fingerprint(lease),
            lease.metadata.resource_version.clone(),
            rest_of(lease),
            live,
            Instant::now(),
        )
    }

    fn deliver_at(
        &self,
        key: LeaseKey,
        spec: String,
        version: Option<String>,
        rest: u64,
        live: bool,
        at: Instant,
    ) -> Delivered {
        let mut records = self.locked();
        let before = records.get(&key);
        // A live event follows the one before it; a relist may stand for writes in between
        // (the same spec written again: a record restored by hand after a renewal).
        let missed = !live && before.is_some_and(|b| b.version != version);
        let since = match before {
            Some(b) if b.spec == spec && !missed => b.delivered,
            _ => at,
        };
        let reconcile = !live || before.is_none_or(|b| b.rest != rest);
        records.insert(
            key,
            Record {
                spec,
                version,
                delivered: since,
                rest,
            },
        );
        Delivered {
            since,
            reconcile,
            missed,
        }
    }

    /// What the Lease watch does with each event, before any worker looks: stamps the records
    /// it delivers, bumps the remembered term of the holder each names, and returns the leases
    /// that need a reconcile (a relist's, all at its end). `listed`: whether a lease is in the
    /// cache (after a relist).
    ///
    /// After a watch gap nothing says what was missed: a lease whose relist shows another
    /// version, or that the relist no longer lists (deleted meanwhile), may have been renewed
    /// by its remembered holder until now, so that term counts as seen now.
    pub fn on_event(
        &self,
        held: &Held,
        ev: &watcher::Event<Lease>,
        listed: impl Fn(&LeaseKey) -> bool,
    ) -> Vec<LeaseKey> {
        let seen = |l: &Lease, live: bool| {
            let d = self.deliver(l, live);
            if d.missed {
                held.seen_in_gap(&key_of(l), Instant::now());
            }
            if let Some(h) = lease::holder(l) {
                held.renewed(&key_of(l), h, d.since);
            }
            d
        };
        let reconcile = |l: &Lease, d: Delivered| {
            if d.reconcile { vec![key_of(l)] } else { vec![] }
        };
        match ev {
            watcher::Event::Apply(l) => reconcile(l, seen(l, true)),
            // Reconciled at the relist's end: until then the cache still holds what it held
            // before (a worker would judge the old record, as new, and wait a full duration).
            watcher::Event::InitApply(l) => {
                seen(l, false);
                vec![]
            }
            watcher::Event::Delete(l) => {
                // Its last record counts as seen, then its stamp goes.
                seen(l, true);
                self.forget(&key_of(l));
                vec![key_of(l)]
            }
            // The relist is in the cache now (replaced before this runs): every lease is
            // reconciled. It reports no deletions: what it no longer lists was deleted while
            // the watch was down.
            watcher::Event::InitDone => {
                let gone = self.retain(listed);
                for k in &gone {
                    held.seen_in_gap(k, Instant::now());
                }
                let mut keys: Vec<LeaseKey> = self.locked().keys().cloned().collect();
                keys.extend(gone);
                keys
            }
            watcher::Event::Init => vec![],
        }
    }

    /// When the record `lease` (by its spec) was first delivered, if it is the last one
    /// delivered. `None`: the cache holds a record this map has not stamped yet.
    pub fn since(&self, key: &LeaseKey, spec: &str) -> Option<Instant> {
        self.locked()
            .get(key)
            .filter(|r| r.spec == spec)
            .map(|r| r.delivered)
    }

    /// Forgets a deleted Lease.
    fn forget(&self, key: &LeaseKey) {
        self.locked().remove(key);
    }

    /// Keeps only the Leases `exists` knows (after a relist, which reports no deletions), and
    /// returns the others.
    fn retain(&self, exists: impl Fn(&LeaseKey) -> bool) -> Vec<LeaseKey> {
        let mut records = self.locked();
        let gone: Vec<LeaseKey> = records.keys().filter(|k| !exists(k)).cloned().collect();
        for k in &gone {
            records.remove(k);
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    use super::*;

    fn lease(holder: &str, renewed_at: i64, rv: &str) -> Lease {
        let mut l = Lease::default();
        l.metadata.name = Some("l".into());
        l.metadata.namespace = Some("ns".into());
        l.metadata.resource_version = Some(rv.into());
        l.spec = Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            lease_transitions: Some(3),
            renew_time: Some(MicroTime(
                jiff::Timestamp::from_second(1_800_000_000 + renewed_at).unwrap(),
            )),
            ..LeaseSpec::default()
        });
        l
    }

    fn deliver(r: &Records, l: &Lease, live: bool, at: Instant) -> Delivered {
        let version = l.metadata.resource_version.clone();
        r.deliver_at(key_of(l), fingerprint(l), version, rest_of(l), live, at)
    }

    fn delivered(since: Instant, reconcile: bool, missed: bool) -> Delivered {
        Delivered {
            since,
            reconcile,
            missed,
        }
    }

    #[test]
    fn a_live_renewal_is_stamped_at_delivery_and_needs_no_reconcile() {
        let r = Records::default();
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(5);
        let first = lease("a", 0, "1");
        assert_eq!(
            deliver(&r, &first, true, t0),
            delivered(t0, true, false),
            "first seen"
        );
        let renewed = lease("a", 5, "2");
        assert_eq!(
            deliver(&r, &renewed, true, t1),
            delivered(t1, false, false),
            "only renewTime changed"
        );
        assert_eq!(r.since(&key_of(&renewed), &fingerprint(&renewed)), Some(t1));
        assert_eq!(
            r.since(&key_of(&first), &fingerprint(&first)),
            None,
            "an older record than the last delivered is not stamped"
        );
        let t2 = t1 + Duration::from_secs(5);
        let mut restored = first.clone();
        restored.metadata.resource_version = Some("3".into());
        assert_eq!(
            deliver(&r, &restored, true, t2),
            delivered(t2, false, false),
            "an earlier record restored by hand is as old as its new delivery (and, differing \
             only in renewTime, is taken as a renewal)"
        );
        assert_eq!(r.since(&key_of(&first), &fingerprint(&first)), Some(t2));
    }

    #[test]
    fn any_other_change_or_a_relist_is_reconciled_and_the_same_spec_keeps_its_stamp() {
        let r = Records::default();
        let t0 = Instant::now();
        let later = |s| t0 + Duration::from_secs(s);
        deliver(&r, &lease("a", 0, "1"), true, t0);
        let mut other = lease("b", 1, "2");
        assert!(
            deliver(&r, &other, true, later(1)).reconcile,
            "a new holder"
        );
        other.metadata.annotations = Some([("arbiter.dev/x".to_string(), "1".to_string())].into());
        other.metadata.resource_version = Some("3".into());
        assert_eq!(
            deliver(&r, &other, true, later(2)),
            delivered(later(1), true, false),
            "an annotation: reconciled, but the spec (the record's age) is unchanged"
        );
        assert_eq!(
            deliver(&r, &other, false, later(3)),
            delivered(later(1), true, false),
            "relisted as it was: reconciled, nothing missed"
        );
        let mut shorter = lease("b", 3, "4");
        shorter.metadata.annotations = other.metadata.annotations.clone();
        shorter.spec.as_mut().unwrap().lease_duration_seconds = Some(1);
        assert!(
            deliver(&r, &shorter, true, later(3)).reconcile,
            "a duration changed"
        );
        let mut relisted = shorter.clone();
        relisted.metadata.resource_version = Some("6".into());
        assert_eq!(
            deliver(&r, &relisted, false, later(4)),
            delivered(later(4), true, true),
            "the same spec relisted at another version (rewritten while the watch was down) is \
             stamped when delivered, and writes were missed"
        );
    }

    #[test]
    fn the_watch_bumps_the_term_a_renewal_extends_though_no_worker_reconciles_it() {
        use watcher::Event;
        let (records, held) = (Records::default(), Held::default());
        let minute = Duration::from_secs(60);
        let assigned_at = Instant::now().checked_sub(minute).unwrap();
        let first = lease("a", 0, "1");
        let key = key_of(&first);
        held.assigned(&key, "a", 3, minute, None, assigned_at);
        let none = |_: &str| false;
        let all = |_: &LeaseKey| true;
        assert_eq!(
            records.on_event(&held, &Event::InitApply(first), all),
            vec![],
            "a relist is reconciled at its end"
        );
        assert_eq!(
            records.on_event(&held, &Event::InitDone, all),
            vec![key.clone()]
        );
        let renewed = lease("a", 60, "2");
        assert_eq!(
            records.on_event(&held, &Event::Apply(renewed.clone()), all),
            vec![],
            "a renewal is not reconciled"
        );
        let quiet = |held: &Held| held.previous(&key, Instant::now(), none).unwrap().quiet_for;
        assert!(
            quiet(&held) < minute / 2,
            "the term counts from the renewal's delivery, not the assignment a minute ago: \
             quiet for {:?}",
            quiet(&held)
        );
        // Someone else named by hand bumps nothing of a's term.
        let other = Held::default();
        other.assigned(&key, "b", 3, minute, None, assigned_at);
        records.on_event(&other, &Event::Apply(lease("a", 61, "3")), all);
        assert!(quiet(&other) >= minute);
        // Deleted: reconciled, and the stamp goes with it.
        assert_eq!(
            records.on_event(&held, &Event::Delete(renewed.clone()), all),
            vec![key.clone()]
        );
        assert_eq!(records.since(&key, &fingerprint(&renewed)), None);
        assert!(quiet(&held) < minute / 2);
    }

    #[test]
    fn after_a_watch_gap_the_remembered_term_counts_as_seen_at_the_relist() {
        use watcher::Event;
        let minute = Duration::from_secs(60);
        let assigned_at = Instant::now().checked_sub(minute).unwrap();
        let none = |_: &str| false;
        let first = lease("a", 0, "1");
        let key = key_of(&first);
        let quiet = |held: &Held| held.previous(&key, Instant::now(), none).unwrap().quiet_for;
        // The Lease was cleared by hand while the watch was down (a may have renewed before).
        let (records, held) = (Records::default(), Held::default());
        records.on_event(&held, &Event::Apply(first.clone()), |_| true);
        held.assigned(&key, "a", 3, minute, None, assigned_at);
        let mut cleared = lease("", 61, "9");
        cleared.spec.as_mut().unwrap().holder_identity = None;
        records.on_event(&held, &Event::InitApply(cleared), |_| true);
        assert!(quiet(&held) < minute / 2, "quiet for {:?}", quiet(&held));
        // Deleted while the watch was down: the relist no longer lists it.
        let (records, held) = (Records::default(), Held::default());
        records.on_event(&held, &Event::Apply(first.clone()), |_| true);
        held.assigned(&key, "a", 3, minute, None, assigned_at);
        assert_eq!(
            records.on_event(&held, &Event::InitDone, |_| false),
            vec![key.clone()],
            "reconciled"
        );
        assert!(quiet(&held) < minute / 2, "quiet for {:?}", quiet(&held));
        // Relisted unchanged: nothing was missed, nothing bumped.
        let (records, held) = (Records::default(), Held::default());
        held.assigned(&key, "a", 3, minute, None, assigned_at);
        deliver(&records, &first, true, assigned_at);
        records.on_event(&held, &Event::InitApply(first.clone()), |_| true);
        assert_eq!(
            records.on_event(&held, &Event::InitDone, |_| true),
            vec![key.clone()],
            "reconciled at the relist's end"
        );
        assert!(quiet(&held) >= minute);
    }

    #[test]
    fn a_forgotten_lease_is_new_again() {
        let r = Records::default();
        let t0 = Instant::now();
        let l = lease("a", 0, "1");
        deliver(&r, &l, true, t0);
        assert_eq!(r.retain(|_| false), vec![key_of(&l)]);
        assert_eq!(r.since(&key_of(&l), &fingerprint(&l)), None);
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(
            deliver(&r, &lease("a", 1, "2"), true, t1),
            delivered(t1, true, false)
        );
    }
}
