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

    /// Records a Lease this worker wrote, a compare-and-swap on `base` (`None`: created).
    /// Against the cache as it is now: it shows the base, an earlier record, this write, or
    /// already a later one (the new holder's agent may take its term before the write's answer
    /// is read), which then counts ([`Written::record_lease`]).
    pub(crate) fn wrote(
        &mut self,
        cache: &Cached<Lease>,
        key: &LeaseKey,
        base: Option<&Lease>,
        mut wrote: Lease,
    ) {
        // As the cache keeps it.
        crate::cache::slim::keep_arbiter_owned(&mut wrote.metadata);
        // Compared by version only: the Lease read is not kept (the cache moves past it).
        let cached = LeaseVersion::of(cache.get(&key.namespace, &key.name)).only_version();
        let base = base.and_then(|b| b.metadata.resource_version.as_deref());
        self.written.record_lease(
            key,
            base.unwrap_or_default(),
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

#[cfg(test)]
mod tests {
    use kube::runtime::watcher;

    use super::*;

    fn lease(version: &str, holder: &str, taken_by: Option<&str>) -> Lease {
        let mut l = Lease::default();
        l.metadata.namespace = Some("ns".into());
        l.metadata.name = Some("l".into());
        l.metadata.resource_version = Some(version.into());
        l.spec = Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            holder_identity: Some(holder.into()),
            ..Default::default()
        });
        if let Some(i) = taken_by {
            arbiter_api::lease::set_annotation(
                &mut l,
                arbiter_api::INCARNATION_ANNOTATION,
                Some(i),
            );
        }
        l
    }

    #[test]
    fn a_take_the_watch_delivers_before_the_write_returns_counts() {
        let (cache, mut writers) = Cached::<Lease>::new(&[None]);
        let key = LeaseKey::new("ns", "l");
        let mut memory = LeaseMemory::default();
        let base = lease("7", "old", None);
        writers[0].apply_watcher_event(&watcher::Event::Apply(base.clone()));
        // The arbiter assigns `a` (8); a's agent takes the term at once (9), and the watch
        // delivers both before the assignment's answer is read.
        writers[0].apply_watcher_event(&watcher::Event::Apply(lease("8", "a", None)));
        writers[0].apply_watcher_event(&watcher::Event::Apply(lease("9", "a", Some("a-1"))));
        memory.wrote(&cache, &key, Some(&base), lease("8", "a", None));
        // The take is what the next pass sees (its incarnation: the proof a container's end
        // ends the term), not the assignment it replaced.
        let seen = memory.newest(&cache, &key).unwrap();
        assert_eq!(seen.metadata.resource_version.as_deref(), Some("9"));
        // A write the cache has not shown yet still stands for the base.
        let base = lease("9", "a", Some("a-1"));
        memory.wrote(&cache, &key, Some(&base), lease("10", "a", None));
        let seen = memory.newest(&cache, &key).unwrap();
        assert_eq!(seen.metadata.resource_version.as_deref(), Some("10"));
    }
}
