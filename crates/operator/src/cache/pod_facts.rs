//! What the operator knows of a candidate's pod, in one place: which pod is the candidate's
//! (its owner reference, with the uid), the pod's state as the election sees it, and what the
//! pod's own status proves (a stop, a process's end, its restarts). Pure functions of the pod,
//! or of the caches as they stand.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::ResourceExt;

use super::Caches;
use super::candidate_index::owner_pod;
use arbiter_api::LeaseCandidate;
use arbiter_election::decide::{PodSeen, PodState};

/// The candidate's pod in the cache: the one its owner reference names, with that uid (a pod
/// recreated under the name is another).
pub(crate) fn pod_of(candidate: &LeaseCandidate, caches: &Caches) -> Option<Arc<Pod>> {
    let (name, uid) = owner_pod(candidate)?;
    let pod = caches.pods.get(&candidate.namespace()?, &name)?;
    (pod.uid().as_deref() == Some(uid.as_str())).then_some(pod)
}

/// The arbiter's view of a candidate's pod: what the caches show of it, judged by the
/// election's rule ([`PodState::of`], which the model runs too).
pub(crate) fn state(c: &LeaseCandidate, caches: &Caches) -> PodState {
    PodState::of(seen(c, caches))
}

/// What the caches show of the pod `c` names (the one with the uid its owner reference gives).
fn seen(c: &LeaseCandidate, caches: &Caches) -> PodSeen {
    let Some((name, uid)) = owner_pod(c) else {
        return PodSeen::NotOwned;
    };
    let ns = c.namespace().unwrap_or_default();
    match caches.pods.get(&ns, &name) {
        Some(pod) if pod.uid().as_deref() == Some(uid.as_str()) => PodSeen::Present {
            terminal: terminal(&pod),
            deleting: pod.metadata.deletion_timestamp.is_some(),
            running: pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"),
            registered_process_exited: registered_process_exited(c, &pod),
        },
        _ => PodSeen::Absent {
            stopped: caches.stopped_pods.contains(&ns, &uid),
        },
    }
}

/// Total container restarts of a pod.
pub fn restarts(pod: &Pod) -> i64 {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or_default();
    statuses.iter().map(|s| i64::from(s.restart_count)).sum()
}

/// In a terminal phase as the kubelet reports it: every container has terminated and none
/// will restart. Not when the pod garbage collector set the phase: for a pod whose Node object
/// was deleted ([`failed_by_gc`]), or a terminating pod on a node tainted out-of-service, no
/// kubelet said anything, and the container statuses it last wrote may still say running.
pub fn terminal(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    let phase_terminal = matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    let still_running = status
        .into_iter()
        .flat_map(|s| {
            let main = s.container_statuses.as_deref().unwrap_or_default();
            let init = s.init_container_statuses.as_deref().unwrap_or_default();
            main.iter().chain(init)
        })
        .any(|c| c.state.as_ref().is_some_and(|st| st.running.is_some()));
    phase_terminal && !still_running && !failed_by_gc(pod)
}

/// Marked Failed by the pod garbage collector because its Node object is gone (condition
/// `DisruptionTarget`, reason `DeletionByPodGC`). Deleting a Node object stops nothing: the
/// machine, its kubelet and the pod's processes may all still run. Not proof of a stop.
pub fn failed_by_gc(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "DisruptionTarget" && c.reason.as_deref() == Some("DeletionByPodGC"))
}

/// The process that recorded `incarnation` in its container's termination log (see
/// [`arbiter_api::lease::termination_message`]) has ended, with everything in its container: the
/// kubelet reports a container terminated with that message, now or as its state before a
/// restart (`lastState`). The runtime kills a container's every process when it ends, so this
/// proves the holder's workload stopped too. Weaker reports are not proof: a container running
/// but not ready, a missing status, a terminated container with another message (an earlier
/// or later process, or a workload that wrote its own). Nor is anything on a pod the garbage
/// collector failed.
pub fn incarnation_ended(pod: &Pod, incarnation: &str) -> bool {
    if incarnation.is_empty() || failed_by_gc(pod) {
        return false;
    }
    let message = arbiter_api::lease::termination_message(incarnation);
    statuses(pod).any(|c| {
        [c.state.as_ref(), c.last_state.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|s| s.terminated.as_ref())
            .any(|t| t.message.as_deref().map(str::trim) == Some(message.as_str()))
    })
}

/// The process that registered `candidate` (its incarnation annotation) is gone from its
/// running pod: the kubelet reported its container's end with that process's termination
/// message. Until a new process registers (a new incarnation), nobody would answer a ping.
/// (Not "no container runs": a new process may register before the kubelet reports its
/// container running, and would be passed over for a moment.)
pub fn registered_process_exited(candidate: &arbiter_api::LeaseCandidate, pod: &Pod) -> bool {
    let incarnation = arbiter_api::incarnation(candidate).unwrap_or_default();
    incarnation_ended(pod, incarnation)
}

/// Every container status of a pod: its containers', then its init containers' (a sidecar, a
/// restartable init container, may run beside them).
pub fn statuses(pod: &Pod) -> impl Iterator<Item = &ContainerStatus> {
    let status = pod.status.as_ref();
    let main = status.and_then(|s| s.container_statuses.as_deref());
    let init = status.and_then(|s| s.init_container_statuses.as_deref());
    main.unwrap_or_default()
        .iter()
        .chain(init.unwrap_or_default())
}

/// The pod reports containers, and none of them (sidecars included) running: its processes
/// exited (a container waiting in crash-loop back-off, or terminated), whatever its restart
/// count says.
pub fn nothing_runs(pod: &Pod) -> bool {
    let reported = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|v| !v.is_empty());
    reported && statuses(pod).all(|c| c.state.as_ref().is_none_or(|s| s.running.is_none()))
}

/// Terminal, or every container reported terminated.
pub(crate) fn containers_stopped(pod: &Pod) -> bool {
    if terminal(pod) {
        return true;
    }
    let main = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or_default();
    nothing_runs(pod)
        && main
            .iter()
            .all(|s| s.state.as_ref().is_some_and(|st| st.terminated.is_some()))
}
