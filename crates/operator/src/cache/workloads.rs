//! The single-active workloads, parsed once per Deployment or StatefulSet watch event, so that a
//! pod event or a reconcile looks them up instead of parsing every Deployment and StatefulSet in
//! the cache (which made each pod event cost as much as the cluster has workloads).
//!
//! Only annotated workloads are kept, with the lease they govern, valid or not: an invalid
//! annotation is kept with its error so the lease's reconcile can report it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::{Resource, ResourceExt};

use crate::key::LeaseKey;
use crate::workloads::{Workload, WorkloadError, lease_name};

/// A workload by (namespace, kind, name).
type WorkloadRef = (String, &'static str, String);

/// An annotated workload whose annotations cannot be used.
#[derive(Clone, Debug)]
pub struct Invalid {
    pub object: ObjectReference,
    pub error: String,
}

#[derive(Clone, Debug)]
enum Entry {
    Valid(Workload),
    Invalid { lease: String, invalid: Invalid },
}

impl Entry {
    fn lease(&self) -> &str {
        match self {
            Entry::Valid(w) => &w.lease,
            Entry::Invalid { lease, .. } => lease,
        }
    }
}

#[derive(Clone, Default)]
pub struct AnnotatedWorkloads(Arc<Mutex<BTreeMap<WorkloadRef, Entry>>>);

impl AnnotatedWorkloads {
    /// Records a watch event's object (`parsed` is what [`Workload::from_deployment`] or
    /// [`Workload::from_stateful_set`] made of it; `deleted` for a Delete event). Returns the
    /// leases to reconcile: the one it governs now, and the one it governed before if that
    /// changed (its annotation was removed or its lease name changed).
    pub fn take_in<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        kind: &'static str,
        parsed: Option<Result<Workload, WorkloadError>>,
        deleted: bool,
    ) -> Vec<LeaseKey> {
        let namespace = obj.namespace().unwrap_or_default();
        let id = (namespace.clone(), kind, obj.name_any());
        let entry = match parsed {
            _ if deleted => None,
            None => None,
            Some(Ok(w)) => Some(Entry::Valid(w)),
            Some(Err(e)) => Some(Entry::Invalid {
                lease: lease_name(obj),
                invalid: Invalid {
                    object: obj.object_ref(&()),
                    error: e.to_string(),
                },
            }),
        };
        let mut leases: Vec<String> = entry.iter().map(|e| e.lease().to_string()).collect();
        let mut index = self.0.lock().unwrap();
        let before = match entry {
            Some(entry) => index.insert(id, entry),
            None => index.remove(&id),
        };
        if let Some(before) = before
            && !leases.iter().any(|l| l == before.lease())
        {
            leases.push(before.lease().to_string());
        }
        leases
            .into_iter()
            .map(|name| LeaseKey::new(&namespace, &name))
            .collect()
    }

    /// The workload governing `key`'s lease, if any: a valid one first (Deployments before
    /// StatefulSets, then by name), else the error of an invalid one.
    pub fn governing(&self, key: &LeaseKey) -> Option<Result<Workload, Invalid>> {
        let index = self.0.lock().unwrap();
        let all: Vec<&Entry> = index
            .iter()
            .filter(|((ns, _, _), e)| **ns == *key.namespace && e.lease() == &*key.name)
            .map(|(_, e)| e)
            .collect();
        all.iter()
            .find_map(|e| match e {
                Entry::Valid(w) => Some(Ok(w.clone())),
                Entry::Invalid { .. } => None,
            })
            .or_else(|| {
                all.iter().find_map(|e| match e {
                    Entry::Invalid { invalid, .. } => Some(Err(invalid.clone())),
                    Entry::Valid(_) => None,
                })
            })
    }

    /// The selector of the valid annotated workload `kind` `name` in `namespace`, if it is one.
    pub fn valid_selector(
        &self,
        namespace: &str,
        kind: &'static str,
        name: &str,
    ) -> Option<kube::core::Selector> {
        let index = self.0.lock().unwrap();
        match index.get(&(namespace.to_string(), kind, name.to_string()))? {
            Entry::Valid(w) => Some(w.selector.clone()),
            Entry::Invalid { .. } => None,
        }
    }

    /// Whether a valid annotated workload selects `pod`.
    pub fn selects_any(&self, pod: &Pod) -> bool {
        !self.selecting(pod).is_empty()
    }

    /// The leases the annotated workloads of `namespace` govern, valid or not.
    pub fn leases_in(&self, namespace: &str) -> Vec<LeaseKey> {
        let index = self.0.lock().unwrap();
        let start = (namespace.to_string(), "", String::new());
        index
            .range(start..)
            .take_while(|((ns, _, _), _)| ns == namespace)
            .map(|(_, e)| LeaseKey::new(namespace, e.lease()))
            .collect()
    }

    /// The leases of the workloads that select `pod` (valid ones only; an invalid selector
    /// selects nothing).
    pub fn selecting(&self, pod: &Pod) -> Vec<LeaseKey> {
        let namespace = pod.namespace().unwrap_or_default();
        let index = self.0.lock().unwrap();
        let start = (namespace.clone(), "", String::new());
        index
            .range(start..)
            .take_while(|((ns, _, _), _)| *ns == namespace)
            .filter_map(|(_, e)| match e {
                Entry::Valid(w) if w.selects(pod) => {
                    Some(LeaseKey::new(namespace.as_str(), w.lease.as_str()))
                }
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    use super::*;
    use crate::workloads::{LEASE_NAME_ANNOTATION, ON_DEPOSE_ANNOTATION, SINGLE_ACTIVE_ANNOTATION};

    fn deployment(name: &str, annotations: &[(&str, &str)]) -> Deployment {
        let mut d = Deployment::default();
        d.metadata.name = Some(name.into());
        d.metadata.namespace = Some("ns".into());
        d.metadata.uid = Some(format!("uid-{name}"));
        d.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        d.spec = Some(DeploymentSpec {
            selector: LabelSelector {
                match_labels: Some(BTreeMap::from([("app".into(), name.into())])),
                ..LabelSelector::default()
            },
            ..DeploymentSpec::default()
        });
        d
    }

    fn take_in(index: &AnnotatedWorkloads, d: &Deployment, deleted: bool) -> Vec<String> {
        index
            .take_in(d, "Deployment", Workload::from_deployment(d), deleted)
            .into_iter()
            .map(|k| k.name.to_string())
            .collect()
    }

    fn pod(app: &str, namespace: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some(namespace.into());
        p.metadata.labels = Some(BTreeMap::from([("app".into(), app.into())]));
        p
    }

    fn key(name: &str) -> LeaseKey {
        LeaseKey {
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    #[test]
    fn follows_annotation_lease_name_and_deletion() {
        let index = AnnotatedWorkloads::default();
        let on = [(SINGLE_ACTIVE_ANNOTATION, "true")];
        assert!(take_in(&index, &deployment("web", &[]), false).is_empty());
        assert_eq!(take_in(&index, &deployment("web", &on), false), ["web"]);
        assert_eq!(index.selecting(&pod("web", "ns")), [key("web")]);
        assert_eq!(index.leases_in("ns"), [key("web")]);
        assert!(index.leases_in("n").is_empty() && index.leases_in("nt").is_empty());
        assert!(index.selecting(&pod("web", "other")).is_empty());
        assert!(index.selecting(&pod("db", "ns")).is_empty());
        // A changed lease name: both the new and the old lease are reconciled.
        let renamed = [
            (SINGLE_ACTIVE_ANNOTATION, "true"),
            (LEASE_NAME_ANNOTATION, "web-lease"),
        ];
        assert_eq!(
            take_in(&index, &deployment("web", &renamed), false),
            ["web-lease", "web"]
        );
        assert!(index.governing(&key("web")).is_none());
        assert!(matches!(index.governing(&key("web-lease")), Some(Ok(_))));
        // The annotation removed: the lease it governed is reconciled (to clean up).
        assert_eq!(
            take_in(&index, &deployment("web", &[]), false),
            ["web-lease"]
        );
        assert!(index.governing(&key("web-lease")).is_none());
        assert!(index.selecting(&pod("web", "ns")).is_empty());
        // Deleted while annotated.
        take_in(&index, &deployment("web", &on), false);
        assert_eq!(take_in(&index, &deployment("web", &on), true), ["web"]);
        assert!(index.governing(&key("web")).is_none());
    }

    #[test]
    fn keeps_an_invalid_annotation_s_error_for_its_lease() {
        let index = AnnotatedWorkloads::default();
        let bad = [
            (SINGLE_ACTIVE_ANNOTATION, "true"),
            (ON_DEPOSE_ANNOTATION, "explode"),
        ];
        assert_eq!(take_in(&index, &deployment("web", &bad), false), ["web"]);
        let Some(Err(invalid)) = index.governing(&key("web")) else {
            panic!("expected the invalid workload");
        };
        assert!(invalid.error.contains("explode"), "{}", invalid.error);
        assert_eq!(invalid.object.name.as_deref(), Some("web"));
        assert!(index.selecting(&pod("web", "ns")).is_empty());
        // A valid workload naming the same lease governs it.
        let other = [
            (SINGLE_ACTIVE_ANNOTATION, "true"),
            (LEASE_NAME_ANNOTATION, "web"),
        ];
        take_in(&index, &deployment("web2", &other), false);
        assert!(matches!(index.governing(&key("web")), Some(Ok(w)) if w.name == "web2"));
    }
}
