//! Which candidates name which lease, and which pod owns them, kept from the candidate watch's
//! events, so that a reconcile looks up its lease's candidates, and a pod event finds the
//! leases its candidates name, without scanning every candidate in the cache (which made an
//! election's cost grow with the number of leases).
//!
//! The index only narrows the search: names are looked up in the cache, and a name whose object
//! is gone or names another lease (deleted and recreated while the watch was re-listing, which
//! sends no delete) is simply not returned. A stale pod entry only costs an extra reconcile.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use kube::ResourceExt;

use crate::key::LeaseKey;
use arbiter_api::LeaseCandidate;

/// Something the watch keeps per candidate, by (namespace, name), shared with the workers.
pub struct PerCandidate<T>(Arc<Mutex<HashMap<(String, String), T>>>);

impl<T> Clone for PerCandidate<T> {
    fn clone(&self) -> Self {
        PerCandidate(self.0.clone())
    }
}

impl<T> Default for PerCandidate<T> {
    fn default() -> Self {
        PerCandidate(Arc::default())
    }
}

impl<T> PerCandidate<T> {
    /// The map, locked.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), T>> {
        self.0.lock().unwrap()
    }

    /// Forgets a deleted candidate.
    pub fn forget(&self, c: &LeaseCandidate) {
        self.lock()
            .remove(&(c.namespace().unwrap_or_default(), c.name_any()));
    }

    /// Keeps only the candidates `exists` knows (after a relist, which reports no deletions).
    pub fn retain(&self, exists: impl Fn(&str, &str) -> bool) {
        self.lock().retain(|(ns, name), _| exists(ns, name));
    }
}

#[derive(Clone, Default)]
pub struct CandidateIndex(Arc<Mutex<Inner>>);

#[derive(Default)]
struct Inner {
    /// lease → names of the candidates naming it.
    by_lease: HashMap<LeaseKey, BTreeSet<String>>,
    /// owner pod uid → (lease, candidate name) of the candidates it owns.
    by_pod: HashMap<String, BTreeSet<(LeaseKey, String)>>,
    /// Uids of candidates the API server said are gone (a write got 404) while the cache still
    /// shows them: left out until the watch delivers their deletion or a relist drops them.
    gone: HashSet<String>,
}

/// The Pod a candidate belongs to: `(name, uid)` of its Pod owner reference.
pub fn owner_pod(c: &LeaseCandidate) -> Option<(String, String)> {
    c.owner_references()
        .iter()
        .find(|o| o.kind == "Pod" && o.api_version == "v1")
        .map(|o| (o.name.clone(), o.uid.clone()))
}

/// The lease a candidate names.
pub fn key_of(c: &LeaseCandidate) -> LeaseKey {
    LeaseKey::new(
        c.metadata.namespace.as_deref().unwrap_or_default(),
        c.spec.lease_name.as_str(),
    )
}

impl CandidateIndex {
    /// A candidate was created or changed (its lease name is immutable; its owner is taken
    /// as it was first seen, which is how the agent and the operator create it).
    pub fn insert(&self, c: &LeaseCandidate) {
        let mut index = self.0.lock().unwrap();
        let key = key_of(c);
        if let Some((_, uid)) = owner_pod(c) {
            let entry = (key.clone(), c.name_any());
            index.by_pod.entry(uid).or_default().insert(entry);
        }
        index.by_lease.entry(key).or_default().insert(c.name_any());
    }

    /// A write to candidate `uid` got 404: it is gone, whatever the cache says (a watch that
    /// lags, or one stuck on an event, must not make every reconcile of its lease fail).
    pub fn gone(&self, uid: &str) {
        self.0.lock().unwrap().gone.insert(uid.to_string());
    }

    /// After a relist: forgets the gone candidates the cache no longer holds.
    pub fn retain_gone(&self, cached: impl Fn(&str) -> bool) {
        self.0.lock().unwrap().gone.retain(|uid| cached(uid));
    }

    /// A candidate was deleted.
    pub fn remove(&self, c: &LeaseCandidate) {
        let mut index = self.0.lock().unwrap();
        if let Some(uid) = c.uid() {
            index.gone.remove(&uid);
        }
        let key = key_of(c);
        if let Some((_, uid)) = owner_pod(c)
            && let Some(entries) = index.by_pod.get_mut(&uid)
        {
            entries.remove(&(key.clone(), c.name_any()));
            if entries.is_empty() {
                index.by_pod.remove(&uid);
            }
        }
        if let Some(names) = index.by_lease.get_mut(&key) {
            names.remove(&c.name_any());
            if names.is_empty() {
                index.by_lease.remove(&key);
            }
        }
    }

    /// The leases named by the candidates the pod `uid` owns.
    pub fn leases_of_pod(&self, uid: &str) -> BTreeSet<LeaseKey> {
        let index = self.0.lock().unwrap();
        index
            .by_pod
            .get(uid)
            .map(|entries| entries.iter().map(|(key, _)| key.clone()).collect())
            .unwrap_or_default()
    }

    /// Whether a candidate names the pod `uid` as its owner.
    pub fn has_pod(&self, uid: &str) -> bool {
        self.0.lock().unwrap().by_pod.contains_key(uid)
    }

    /// The names of the leases of `namespace` that candidates name and `keep` accepts.
    pub fn leases_in(&self, namespace: &str, keep: impl Fn(&str) -> bool) -> Vec<String> {
        let index = self.0.lock().unwrap();
        index
            .by_lease
            .keys()
            .filter(|k| &*k.namespace == namespace && keep(&k.name))
            .map(|k| k.name.to_string())
            .collect()
    }

    /// The cached candidates naming `key`'s lease, sorted by name.
    pub fn candidates(
        &self,
        key: &LeaseKey,
        cache: &crate::cache::stores::Cached<LeaseCandidate>,
    ) -> Vec<Arc<LeaseCandidate>> {
        let index = self.0.lock().unwrap();
        let names: Vec<String> = index
            .by_lease
            .get(key)
            .map(|n| n.iter().cloned().collect())
            .unwrap_or_default();
        names
            .iter()
            .filter_map(|name| cache.get(&key.namespace, name))
            .filter(|c| *c.spec.lease_name == *key.name)
            // A stub of a refused candidate (see `limits`) is never elected, nor expired.
            .filter(|c| !crate::cache::limits::is_stub(c))
            .filter(|c| c.uid().is_none_or(|uid| !index.gone.contains(&uid)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::watcher;

    use super::*;

    fn candidate(name: &str, lease: &str) -> LeaseCandidate {
        let mut c = crate::test_candidate(name, lease);
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
        let (cache, mut writer) = crate::cache::stores::store::<LeaseCandidate>();
        let cache = crate::cache::stores::Cached::single(cache);
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

    #[test]
    fn a_candidate_the_api_server_said_is_gone_is_left_out_until_the_cache_drops_it() {
        let (cache, mut writer) = crate::cache::stores::store::<LeaseCandidate>();
        let cache = crate::cache::stores::Cached::single(cache);
        let index = CandidateIndex::default();
        let mut a = candidate("a", "one");
        a.metadata.uid = Some("uid-a".into());
        writer.apply_watcher_event(&watcher::Event::Apply(a.clone()));
        index.insert(&a);
        index.gone("uid-a");
        assert!(index.candidates(&key("one"), &cache).is_empty());
        // Recreated under the same name (another uid): there again.
        let mut again = candidate("a", "one");
        again.metadata.uid = Some("uid-a2".into());
        writer.apply_watcher_event(&watcher::Event::Apply(again.clone()));
        index.insert(&again);
        assert_eq!(names(index.candidates(&key("one"), &cache)), ["a"]);
        // A relist that no longer holds the gone uid forgets it.
        index.retain_gone(|uid| uid == "uid-a2");
        assert!(index.0.lock().unwrap().gone.is_empty());
    }

    #[test]
    fn finds_the_leases_of_a_pod_s_candidates() {
        let owned = |name: &str, lease: &str, pod_uid: &str| {
            let mut c = candidate(name, lease);
            c.metadata.owner_references = Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    api_version: "v1".into(),
                    kind: "Pod".into(),
                    name: format!("pod-{pod_uid}"),
                    uid: pod_uid.into(),
                    ..Default::default()
                },
            ]);
            c
        };
        let index = CandidateIndex::default();
        let (a, b, c) = (
            owned("a", "one", "p1"),
            owned("b", "two", "p1"),
            owned("c", "one", "p2"),
        );
        for x in [&a, &b, &c, &candidate("d", "three")] {
            index.insert(x);
        }
        let leases = |uid| -> Vec<String> {
            index
                .leases_of_pod(uid)
                .into_iter()
                .map(|k| k.name.to_string())
                .collect()
        };
        assert_eq!(leases("p1"), ["one", "two"]);
        assert_eq!(leases("p2"), ["one"]);
        assert!(leases("p3").is_empty());
        index.remove(&a);
        assert_eq!(leases("p1"), ["two"]);
        index.remove(&b);
        assert!(leases("p1").is_empty());
    }
}
