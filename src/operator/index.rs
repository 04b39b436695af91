//! Which candidates name which lease, kept from the candidate watch's events, so that a
//! reconcile looks up its lease's candidates instead of scanning every candidate in the cache
//! (which made an election's cost grow with the number of leases).
//!
//! The index only narrows the search: names are looked up in the cache, and a name whose object
//! is gone or names another lease (deleted and recreated while the watch was re-listing, which
//! sends no delete) is simply not returned.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use super::queue::LeaseKey;
use crate::api::LeaseCandidate;

#[derive(Clone, Default)]
pub struct CandidateIndex(Arc<Mutex<HashMap<LeaseKey, BTreeSet<String>>>>);

/// The lease a candidate names.
pub fn key_of(c: &LeaseCandidate) -> LeaseKey {
    LeaseKey {
        namespace: c.namespace().unwrap_or_default(),
        name: c.spec.lease_name.clone(),
    }
}

impl CandidateIndex {
    /// A candidate was created or changed (its lease name is immutable).
    pub fn insert(&self, c: &LeaseCandidate) {
        let mut index = self.0.lock().unwrap();
        index.entry(key_of(c)).or_default().insert(c.name_any());
    }

    /// A candidate was deleted.
    pub fn remove(&self, c: &LeaseCandidate) {
        let mut index = self.0.lock().unwrap();
        let key = key_of(c);
        if let Some(names) = index.get_mut(&key) {
            names.remove(&c.name_any());
            if names.is_empty() {
                index.remove(&key);
            }
        }
    }

    /// The cached candidates naming `key`'s lease, sorted by name.
    pub fn candidates(
        &self,
        key: &LeaseKey,
        cache: &Store<LeaseCandidate>,
    ) -> Vec<Arc<LeaseCandidate>> {
        let names: Vec<String> = self
            .0
            .lock()
            .unwrap()
            .get(key)
            .map(|n| n.iter().cloned().collect())
            .unwrap_or_default();
        names
            .iter()
            .filter_map(|name| cache.get(&ObjectRef::new(name).within(&key.namespace)))
            .filter(|c| c.spec.lease_name == key.name)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::{reflector, watcher};

    use super::*;
    use crate::api::LeaseCandidateSpec;

    fn candidate(name: &str, lease: &str) -> LeaseCandidate {
        let mut c = LeaseCandidate::new(
            name,
            LeaseCandidateSpec {
                lease_name: lease.into(),
                binary_version: "1.30.0".into(),
                emulation_version: Some("1.30.0".into()),
                strategy: crate::api::OLDEST_EMULATION_VERSION.into(),
                ping_time: None,
                renew_time: None,
            },
        );
        c.metadata.namespace = Some("ns".into());
        c
    }

    fn key(lease: &str) -> LeaseKey {
        LeaseKey {
            namespace: "ns".into(),
            name: lease.into(),
        }
    }

    fn names(v: Vec<Arc<LeaseCandidate>>) -> Vec<String> {
        v.iter().map(|c| c.name_any()).collect()
    }

    #[test]
    fn finds_a_lease_s_candidates_and_only_cached_current_ones() {
        let (cache, mut writer) = reflector::store::<LeaseCandidate>();
        let index = CandidateIndex::default();
        for c in [
            candidate("b", "one"),
            candidate("a", "one"),
            candidate("c", "two"),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(c.clone()));
            index.insert(&c);
        }
        assert_eq!(names(index.candidates(&key("one"), &cache)), ["a", "b"]);
        assert_eq!(names(index.candidates(&key("two"), &cache)), ["c"]);
        assert!(index.candidates(&key("three"), &cache).is_empty());

        let gone = candidate("a", "one");
        writer.apply_watcher_event(&watcher::Event::Delete(gone.clone()));
        index.remove(&gone);
        assert_eq!(names(index.candidates(&key("one"), &cache)), ["b"]);

        // Deleted and recreated for another lease while no delete was seen (a re-list): the
        // stale entry is not returned for the old lease.
        let moved = candidate("b", "two");
        writer.apply_watcher_event(&watcher::Event::Apply(moved.clone()));
        index.insert(&moved);
        assert!(index.candidates(&key("one"), &cache).is_empty());
        assert_eq!(names(index.candidates(&key("two"), &cache)), ["b", "c"]);
    }
}
