//! The pods labelled for injection that run their command unwrapped
//! ([`crate::workloads::unwrapped`]), by the lease they would run for: names only (the pods are
//! in the followed pods' cache), so that a reconcile looks up its own lease's instead of
//! scanning its namespace's pods.
//!
//! Kept from the pod watch's events: a pod's event adds it under the lease its spec names, its
//! deletion removes it. A name is never dropped otherwise (a pod relabelled, or gone in a
//! relist, stays listed until its lease is looked at again and finds nothing under that name):
//! a name dropped while a new pod of that name arrived would hide a running command.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::declared;
use crate::key::LeaseKey;

#[derive(Clone, Default)]
pub struct UnwrappedPods(Arc<Mutex<HashMap<LeaseKey, BTreeSet<String>>>>);

impl UnwrappedPods {
    /// Takes in a slimmed pod's event (`deleted` for a Delete); returns its lease, if it runs
    /// unwrapped.
    pub fn record(&self, pod: &Pod, deleted: bool) -> Option<LeaseKey> {
        let lease = declared::unwrapped_for(pod)?;
        let key = LeaseKey::new(&pod.namespace().unwrap_or_default(), lease);
        let mut by_lease = self.0.lock().unwrap();
        if deleted {
            if let Some(names) = by_lease.get_mut(&key) {
                names.remove(&pod.name_any());
                if names.is_empty() {
                    by_lease.remove(&key);
                }
            }
        } else {
            by_lease
                .entry(key.clone())
                .or_default()
                .insert(pod.name_any());
        }
        Some(key)
    }

    /// The names of the pods listed under `key`.
    pub fn names(&self, key: &LeaseKey) -> Vec<String> {
        let by_lease = self.0.lock().unwrap();
        by_lease
            .get(key)
            .map(|n| n.iter().cloned().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, lease: Option<&str>) -> Pod {
        let mut annotations = serde_json::Map::new();
        if let Some(l) = lease {
            annotations.insert(declared::UNWRAPPED_ANNOTATION.into(), l.into());
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "annotations": annotations},
        }))
        .unwrap()
    }

    #[test]
    fn pods_are_listed_under_their_lease_until_deleted() {
        let index = UnwrappedPods::default();
        let work = LeaseKey::new("ns", "work");
        assert_eq!(
            index.record(&pod("a", Some("work")), false),
            Some(work.clone())
        );
        index.record(&pod("b", Some("work")), false);
        assert_eq!(index.record(&pod("c", None), false), None, "a wrapped pod");
        assert_eq!(index.names(&work), ["a", "b"]);
        index.record(&pod("a", Some("work")), true);
        assert_eq!(index.names(&work), ["b"]);
        index.record(&pod("b", Some("work")), true);
        assert!(index.names(&work).is_empty());
    }
}
