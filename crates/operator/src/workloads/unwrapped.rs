//! Injected pods that run their command unwrapped: a pod labelled `arbiter.dev/inject` that was
//! created while no webhook configuration was installed (a Deployment applied before the chart,
//! or between an uninstall and a reinstall), or admitted by a webhook that did not wrap it. Its
//! command runs on every such replica, beside whichever one the lease names.
//!
//! The acting operator removes them so that their owners create them again through the webhook
//! (wrapped), and holds the lease's election while any still runs, so the workload goes down to
//! one running command and stays there. Pure rules, applied per lease by the reconcile:
//!
//! - [`next`]: which pod to evict now, one at a time per lease: none while one is being removed
//!   (its command may still run), the last one only once a wrapped candidate is there to take
//!   over (so the lease is left with nobody running its command for no longer than a handover);
//!   a pod with no controller (a bare pod, which nothing would create again) is only reported;
//! - [`arbiter_election::decide::held_for_unwrapped`]: no new holder while any runs.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::inject::{INIT_CONTAINER, INJECT_LABEL, lease_for};

/// The lease a pod labelled for injection would have run for, if it runs its command unwrapped
/// (no agent was injected): `None` for a pod that is wrapped, unlabelled, or names no lease.
pub fn unwrapped_lease(pod: &Pod) -> Option<String> {
    let labelled = pod.labels().get(INJECT_LABEL).map(String::as_str) == Some("true");
    let injected = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .any(|c| c.name == INIT_CONTAINER);
    (labelled && !injected).then(|| lease_for(pod)).flatten()
}

/// The controllers that create a pod again after an eviction, keeping its spec: the only
/// owners an unwrapped pod is evicted for (a Job's pod would count against its backoff limit).
const RECREATING_OWNERS: [&str; 3] = ["ReplicaSet", "StatefulSet", "DaemonSet"];

/// An unwrapped pod of one lease, as the operator sees it. (Whether it ended is the caller's
/// to judge: a pod marked Failed by the garbage collector, or removed without a kubelet's
/// report, proves nothing.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unwrapped {
    pub name: String,
    pub uid: String,
    /// Being deleted (evicted, scaled down, deleted by hand, or gone without proof that it
    /// stopped): its command may still run, and it is not evicted again.
    pub deleting: bool,
    /// Owned by a controller that creates it again (a ReplicaSet, a StatefulSet, a DaemonSet).
    pub owned: bool,
    /// Its phase is Running: its command runs (a Pending pod's does not yet).
    pub running: bool,
}

impl Unwrapped {
    /// `pod` as an unwrapped pod.
    pub fn of(pod: &Pod) -> Option<Unwrapped> {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        Some(Unwrapped {
            name: pod.name_any(),
            uid: pod.uid()?,
            deleting: pod.metadata.deletion_timestamp.is_some(),
            owned: pod.owner_references().iter().any(|o| {
                o.controller == Some(true) && RECREATING_OWNERS.contains(&o.kind.as_str())
            }),
            running: phase == Some("Running"),
        })
    }
}

/// What to do next about a lease's unwrapped pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// None runs.
    Nothing,
    /// Evict this one (its owner creates it again, through the webhook).
    Evict { name: String, uid: String },
    /// One is being removed: wait until it is gone before the next.
    WaitForRemoval { name: String },
    /// The last one runs the only command: it goes once a wrapped candidate can take over.
    WaitForSuccessor { name: String },
    /// Only pods nothing would create again are left: reported, never removed.
    OnlyBare { names: Vec<String> },
}

/// The next step for one lease's unwrapped pods (`pods`, in any order), given whether a
/// candidate could take over at once (a live holder, or a live candidate to elect).
pub fn next(pods: &[Unwrapped], successor: bool) -> Step {
    if let Some(going) = pods
        .iter()
        .filter(|p| p.deleting)
        .min_by(|a, b| a.name.cmp(&b.name))
    {
        return Step::WaitForRemoval {
            name: going.name.clone(),
        };
    }
    // Pods not running yet first (evicting one stops no command), then by name.
    let mut owned: Vec<&Unwrapped> = pods.iter().filter(|p| p.owned).collect();
    owned.sort_by(|a, b| (a.running, &a.name).cmp(&(b.running, &b.name)));
    let Some(first) = owned.first() else {
        return if pods.is_empty() {
            Step::Nothing
        } else {
            let mut names: Vec<String> = pods.iter().map(|p| p.name.clone()).collect();
            names.sort();
            Step::OnlyBare { names }
        };
    };
    // It runs nothing yet, or another command runs beside it (another unwrapped pod's, a bare
    // one's included): it can go now, nobody is left without the command.
    let another_runs = pods.iter().any(|p| p.uid != first.uid && p.running);
    if !first.running || another_runs || successor {
        Step::Evict {
            name: first.name.clone(),
            uid: first.uid.clone(),
        }
    } else {
        Step::WaitForSuccessor {
            name: first.name.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, deleting: bool, owned: bool) -> Unwrapped {
        Unwrapped {
            name: name.into(),
            uid: format!("uid-{name}"),
            deleting,
            owned,
            running: true,
        }
    }

    fn pending(name: &str) -> Unwrapped {
        Unwrapped {
            running: false,
            ..pod(name, false, true)
        }
    }

    fn evict(name: &str) -> Step {
        Step::Evict {
            name: name.into(),
            uid: format!("uid-{name}"),
        }
    }

    #[test]
    fn one_at_a_time_and_the_last_only_when_someone_can_take_over() {
        let cases = [
            (vec![], false, Step::Nothing),
            (vec![], true, Step::Nothing),
            // Three run: one goes, whatever the candidates.
            (
                vec![
                    pod("c", false, true),
                    pod("a", false, true),
                    pod("b", false, true),
                ],
                false,
                evict("a"),
            ),
            // One is going: wait for it, even with a successor.
            (
                vec![pod("a", true, true), pod("b", false, true)],
                true,
                Step::WaitForRemoval { name: "a".into() },
            ),
            // The last: only once a successor is there.
            (
                vec![pod("b", false, true)],
                false,
                Step::WaitForSuccessor { name: "b".into() },
            ),
            (vec![pod("b", false, true)], true, evict("b")),
            // A bare pod is never evicted, but its command counts: an owned one beside it goes.
            (
                vec![pod("bare", false, false), pod("b", false, true)],
                false,
                evict("b"),
            ),
            (
                vec![pod("z", false, false), pod("bare", false, false)],
                true,
                Step::OnlyBare {
                    names: vec!["bare".into(), "z".into()],
                },
            ),
            // A pending pod runs no command: it goes first, and never counts as one beside.
            (vec![pod("a", false, true), pending("b")], false, evict("b")),
            (vec![pending("b")], false, evict("b")),
            (
                vec![
                    pod("a", false, true),
                    Unwrapped {
                        deleting: true,
                        ..pending("b")
                    },
                ],
                true,
                Step::WaitForRemoval { name: "b".into() },
            ),
        ];
        for (pods, successor, want) in cases {
            assert_eq!(
                next(&pods, successor),
                want,
                "{pods:?}, successor {successor}"
            );
        }
    }

    fn labelled(init: bool, owner: Option<&str>, annotation: Option<&str>) -> Pod {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "work-5d9f-x", "namespace": "ns", "uid": "u1",
                "labels": {INJECT_LABEL: "true", "pod-template-hash": "5d9f"}},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        }))
        .unwrap();
        if init {
            p.spec.as_mut().unwrap().init_containers = Some(vec![
                serde_json::from_value(serde_json::json!({"name": INIT_CONTAINER})).unwrap(),
            ]);
        }
        if let Some(kind) = owner {
            p.metadata.owner_references = Some(vec![
                serde_json::from_value(serde_json::json!({"apiVersion": "apps/v1", "kind": kind,
                    "name": "work-5d9f", "uid": "o", "controller": true}))
                .unwrap(),
            ]);
        }
        if let Some(lease) = annotation {
            p.annotations_mut()
                .insert(crate::workloads::LEASE_NAME_ANNOTATION.into(), lease.into());
        }
        p
    }

    #[test]
    fn the_lease_is_the_one_the_webhook_would_have_given() {
        assert_eq!(
            unwrapped_lease(&labelled(false, Some("ReplicaSet"), None)).as_deref(),
            Some("work")
        );
        assert_eq!(
            unwrapped_lease(&labelled(false, None, Some("mine"))).as_deref(),
            Some("mine")
        );
        assert_eq!(
            unwrapped_lease(&labelled(true, Some("ReplicaSet"), None)),
            None,
            "wrapped"
        );
        assert_eq!(
            unwrapped_lease(&labelled(false, None, None)),
            None,
            "no lease to name"
        );
        let mut unlabelled = labelled(false, Some("ReplicaSet"), None);
        unlabelled.labels_mut().remove(INJECT_LABEL);
        assert_eq!(unwrapped_lease(&unlabelled), None);
        let bare = Unwrapped::of(&labelled(false, None, Some("mine"))).unwrap();
        assert!(!bare.owned);
        assert!(
            !Unwrapped::of(&labelled(false, Some("Job"), Some("mine")))
                .unwrap()
                .owned
        );
        let mut running = labelled(false, Some("ReplicaSet"), None);
        running.status =
            Some(serde_json::from_value(serde_json::json!({"phase": "Running"})).unwrap());
        let seen = Unwrapped::of(&running).unwrap();
        assert!(seen.owned && seen.running && !seen.deleting);
    }
}
