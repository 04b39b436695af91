//! A worker's memory of each Lease, in one place: what it wrote that its cache may not show
//! yet (the next write's base), when it first saw each record and term (a record's age on
//! this process's clock, [`Sighting`]), and which Leases candidates name exist without
//! arbiter's label (read from the API server on each reconcile, as the Lease watch sees only
//! labelled ones: [`super::adopt`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;

use super::sighting::Sighting;
use crate::cache::stores::Cached;
use crate::cache::written::{LeaseVersion, Written};
use crate::key::LeaseKey;

#[derive(Default)]
pub(crate) struct LeaseMemory {
    /// Leases this worker wrote that its cache may not show yet.
    written: Written<LeaseVersion, LeaseKey>,
    /// Per lease: the record last seen, when this process first saw it, and its holder.
    seen: HashMap<LeaseKey, Sighting>,
    /// Leases candidates name that exist without arbiter's label.
    foreign: HashSet<LeaseKey>,
}

impl LeaseMemory {
    /// The Lease as this worker last wrote it while its cache (`cache`) has not caught up with
    /// that write; else the cache's ([`crate::cache::written`]).
    pub(crate) fn newest(&mut self, cache: &Cached<Lease>, key: &LeaseKey) -> Option<Arc<Lease>> {
        let cached = cache.get(&key.namespace, &key.name);
        let version = cached
            .as_ref()
            .and_then(|l| l.metadata.resource_version.as_deref())
            .unwrap_or_default();
        let now = Instant::now();
        self.written.forget_shown(now, |key| {
            (cache.get(&key.namespace, &key.name))
                .and_then(|l| l.metadata.resource_version.clone())
                .unwrap_or_default()
        });
        match self.written.current(key, version, now) {
            Some(written) => written.lease,
            None => cached,
        }
    }

    /// Records a Lease this worker wrote. (Against the cache as it is now: a compare-and-swap
    /// that succeeded was based on the newest version, so the cache shows it, an earlier
    /// one, or already this write.)
    pub(crate) fn wrote(&mut self, cache: &Cached<Lease>, key: &LeaseKey, mut wrote: Lease) {
        // As the cache keeps it.
        crate::cache::slim::keep_arbiter_owned(&mut wrote.metadata);
        // Compared by version only: the Lease read is not kept (the cache moves past it).
        let cached = LeaseVersion::of(cache.get(&key.namespace, &key.name)).only_version();
        self.written.record(
            key,
            cached,
            LeaseVersion::of(Some(Arc::new(wrote))),
            Instant::now(),
        );
    }

    /// The record of `key` (its `fingerprint`, `holder` and `term`, as delivered at
    /// `delivered` if the watch stamped it) seen now: how long it has been unchanged, and how
    /// long this process has known its term, on this process's monotonic clock.
    pub(crate) fn sighted(
        &mut self,
        key: &LeaseKey,
        fingerprint: String,
        holder: Option<String>,
        term: i32,
        delivered: Option<Instant>,
    ) -> (Duration, Duration) {
        let seen = self.seen.entry(key.clone()).or_insert_with(Sighting::first);
        let now = Instant::now();
        let age = seen.sighted(fingerprint, holder, term, delivered, now);
        (age, now.saturating_duration_since(seen.term_since))
    }

    /// Remembers `key`'s Lease as someone else's; true the first time.
    pub(crate) fn found_foreign(&mut self, key: &LeaseKey) -> bool {
        self.foreign.insert(key.clone())
    }

    pub(crate) fn is_foreign(&self, key: &LeaseKey) -> bool {
        self.foreign.contains(key)
    }

    /// `key`'s Lease is gone, or arbiter's again.
    pub(crate) fn not_foreign(&mut self, key: &LeaseKey) {
        self.foreign.remove(key);
    }
}
