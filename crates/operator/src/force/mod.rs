//! Forced exit: making a deposed holder's pod stop when its agent did not. The targets, their
//! record on the Lease and the evictions are in [`targets`]; which pods are never forced out is
//! here. A reconcile carries it out ([`crate::reconcile`]: the lapsed holder's pod it
//! deposes, and the forced exits left pending, whichever replica leads).

pub mod targets;

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;

use crate::cache::candidate_index::owner_pod;
use arbiter_api::LeaseCandidate;
use arbiter_api::lease::{self, HOLDER_POD_ANNOTATION};

/// The pods `lease`'s holder may run in (none when nobody holds it): the one recorded when its
/// term was assigned, and the one its candidate names now. Never forced out.
pub(crate) fn holder_pods(lease: &Lease, candidates: &[Arc<LeaseCandidate>]) -> HashSet<String> {
    let Some(h) = lease::holder(lease) else {
        return HashSet::new();
    };
    let candidate = candidates.iter().find(|c| c.name_any() == h);
    lease
        .annotations()
        .get(HOLDER_POD_ANNOTATION)
        .cloned()
        .into_iter()
        .chain(candidate.and_then(|c| owner_pod(c)).map(|(_, uid)| uid))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn held_by(holder: &str, pod_uid: Option<&str>) -> Lease {
        let mut l = Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        };
        if let Some(uid) = pod_uid {
            lease::set_annotation(&mut l, HOLDER_POD_ANNOTATION, Some(uid));
        }
        l
    }

    fn candidate_in_pod(name: &str, pod_uid: &str) -> Arc<LeaseCandidate> {
        let mut c = crate::test_candidate(name, "l");
        c.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: format!("{name}-pod"),
            uid: pod_uid.into(),
            ..OwnerReference::default()
        }]);
        Arc::new(c)
    }

    #[test]
    fn the_holders_pods_are_spared_and_a_released_lease_spares_none() {
        let candidates = [candidate_in_pod("a", "uid-now")];
        // Assigned in one pod, its candidate in another now: neither is forced out.
        let held = holder_pods(&held_by("a", Some("uid-assigned")), &candidates);
        let want: HashSet<String> = ["uid-assigned", "uid-now"].map(String::from).into();
        assert_eq!(held, want);
        // Released (the holder-pod annotation stays): the pod that stepped down is not spared.
        let mut released = held_by("a", Some("uid-assigned"));
        lease::mark_released(&mut released, Some("a"));
        assert!(holder_pods(&released, &candidates).is_empty());
    }
}
