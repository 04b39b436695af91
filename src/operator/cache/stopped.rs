//! Pods confirmed stopped, by uid, kept from the pod watch's events so that a reconcile asks a
//! set instead of scanning every cached pod.
//!
//! A pod is confirmed stopped when it is seen in a terminal phase (`Succeeded`, `Failed`), or
//! deleted after every container had terminated (what a kubelet reports before it removes the
//! object). A pod removed while still running (force-deleted, say) is not proof, and is not
//! recorded; nor is a pod the garbage collector marked Failed because its Node object was
//! deleted (no kubelet reported anything). Both facts are forever true of a uid, so the set never has to be corrected; it is
//! only forgotten after [`FORGET_AFTER`], by which time any lease its holder had has expired
//! (forgetting makes the arbiter wait for expiry, never act sooner).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::ResourceExt;

/// How long a stopped pod is remembered.
pub const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// The set never prunes below this many entries.
const PRUNE_FLOOR: usize = 1024;

#[derive(Clone, Default)]
pub struct StoppedPods(Arc<Mutex<Inner>>);

#[derive(Default)]
struct Inner {
    /// uid → (namespace, when it was recorded).
    pods: HashMap<String, (String, Instant)>,
    prune_at: usize,
}

impl StoppedPods {
    /// Records what a pod watch event proves: `deleted` for a Delete event.
    pub fn observe(&self, pod: &Pod, deleted: bool) {
        let proof = if deleted {
            containers_stopped(pod)
        } else {
            terminal(pod)
        };
        if let (true, Some(uid)) = (proof, pod.uid()) {
            self.record(&pod.namespace().unwrap_or_default(), &uid, Instant::now());
        }
    }

    fn record(&self, namespace: &str, uid: &str, now: Instant) {
        let mut inner = self.0.lock().unwrap();
        inner
            .pods
            .entry(uid.to_string())
            .or_insert_with(|| (namespace.to_string(), now));
        if inner.pods.len() >= inner.prune_at.max(PRUNE_FLOOR) {
            inner
                .pods
                .retain(|_, (_, at)| now.saturating_duration_since(*at) < FORGET_AFTER);
            inner.prune_at = 2 * inner.pods.len();
        }
    }

    /// Whether the pod `uid` of `namespace` is confirmed stopped.
    pub fn contains(&self, namespace: &str, uid: &str) -> bool {
        let inner = self.0.lock().unwrap();
        inner.pods.get(uid).is_some_and(|(ns, _)| ns == namespace)
    }
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
/// [`crate::lease::termination_message`]) has ended, with everything in its container: the
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
    let message = crate::lease::termination_message(incarnation);
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
pub fn registered_process_exited(candidate: &crate::api::LeaseCandidate, pod: &Pod) -> bool {
    let incarnation = candidate
        .annotations()
        .get(crate::lease::INCARNATION_ANNOTATION)
        .map(String::as_str)
        .unwrap_or_default();
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
fn containers_stopped(pod: &Pod) -> bool {
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

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus, PodStatus,
    };

    use super::*;

    fn pod(uid: &str, phase: &str, containers: &[bool]) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some("ns".into());
        p.metadata.uid = Some(uid.into());
        let state = |stopped: bool| ContainerState {
            terminated: stopped.then(ContainerStateTerminated::default),
            running: (!stopped).then(ContainerStateRunning::default),
            ..ContainerState::default()
        };
        p.status = Some(PodStatus {
            phase: Some(phase.into()),
            container_statuses: Some(
                containers
                    .iter()
                    .map(|&s| ContainerStatus {
                        state: Some(state(s)),
                        ..ContainerStatus::default()
                    })
                    .collect(),
            ),
            ..PodStatus::default()
        });
        p
    }

    #[test]
    fn records_only_proof_that_a_pod_stopped() {
        let stopped = StoppedPods::default();
        stopped.observe(&pod("running", "Running", &[false]), false);
        stopped.observe(&pod("terminating", "Running", &[true, false]), true);
        stopped.observe(&pod("unknown", "Running", &[]), true);
        stopped.observe(&pod("containers-done", "Running", &[true]), false);
        stopped.observe(&pod("failed", "Failed", &[]), false);
        // Failed, but a container still reported running: the phase was not the kubelet's
        // (the pod GC fails terminating pods on out-of-service nodes without a condition).
        stopped.observe(&pod("failed-running", "Failed", &[true, false]), false);
        stopped.observe(&pod("deleted-done", "Running", &[true, true]), true);
        for uid in [
            "running",
            "terminating",
            "unknown",
            "containers-done",
            "failed-running",
        ] {
            assert!(!stopped.contains("ns", uid), "{uid} is not proof");
        }
        for uid in ["failed", "deleted-done"] {
            assert!(stopped.contains("ns", uid), "{uid} is proof");
            assert!(!stopped.contains("other", uid), "{uid} is in ns only");
        }
    }

    #[test]
    fn a_pod_failed_by_the_garbage_collector_is_not_proof() {
        use k8s_openapi::api::core::v1::PodCondition;
        let stopped = StoppedPods::default();
        let mut gc = pod("gc", "Failed", &[false]);
        gc.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("DeletionByPodGC".into()),
            ..PodCondition::default()
        }]);
        stopped.observe(&gc, false);
        stopped.observe(&gc, true);
        assert!(!stopped.contains("ns", "gc"));
        assert!(!terminal(&gc));
        // The kubelet's own eviction (TerminationByKubelet) is a kubelet report: proof.
        let mut evicted = pod("evicted", "Failed", &[true]);
        let mut condition = gc.status.as_ref().unwrap().conditions.clone().unwrap();
        condition[0].reason = Some("TerminationByKubelet".into());
        evicted.status.as_mut().unwrap().conditions = Some(condition);
        stopped.observe(&evicted, false);
        assert!(stopped.contains("ns", "evicted"));
    }

    /// A container status whose process recorded `incarnation` (or another message): running,
    /// terminated, or restarted after it (then the message is in `lastState`).
    fn container(state: &str, message: &str) -> ContainerStatus {
        let terminated = ContainerStateTerminated {
            exit_code: 137,
            message: Some(message.into()),
            ..ContainerStateTerminated::default()
        };
        let running = ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..ContainerState::default()
        };
        let ended = ContainerState {
            terminated: Some(terminated),
            ..ContainerState::default()
        };
        match state {
            "running" => ContainerStatus {
                state: Some(running),
                ..ContainerStatus::default()
            },
            "terminated" => ContainerStatus {
                state: Some(ended),
                ..ContainerStatus::default()
            },
            "restarted" => ContainerStatus {
                state: Some(running),
                last_state: Some(ended),
                restart_count: 1,
                ..ContainerStatus::default()
            },
            // Ended, and held back before its restart (crash-loop back-off).
            "waiting" => ContainerStatus {
                state: Some(ContainerState {
                    waiting: Some(Default::default()),
                    ..ContainerState::default()
                }),
                last_state: Some(ended),
                restart_count: 1,
                ..ContainerStatus::default()
            },
            _ => unreachable!(),
        }
    }

    fn with(statuses: Vec<ContainerStatus>, init: Vec<ContainerStatus>) -> Pod {
        let mut p = pod("p", "Running", &[]);
        let s = p.status.as_mut().unwrap();
        s.container_statuses = Some(statuses);
        s.init_container_statuses = Some(init);
        p
    }

    #[test]
    fn a_terminated_container_that_names_the_incarnation_proves_it_ended() {
        let mine = crate::lease::termination_message("a1");
        let other = crate::lease::termination_message("a0");
        // Proof: the container ended (and maybe restarted) with this incarnation's message; in a
        // sidecar (restartable init container) too. Trailing whitespace is the kubelet's.
        for p in [
            with(vec![container("terminated", &mine)], vec![]),
            with(vec![container("restarted", &mine)], vec![]),
            with(
                vec![container("running", ""), container("restarted", &mine)],
                vec![],
            ),
            with(vec![], vec![container("restarted", &mine)]),
            with(vec![container("terminated", &format!("{mine}\n"))], vec![]),
        ] {
            assert!(incarnation_ended(&p, "a1"), "{p:?}");
        }
        // Not proof: running; an earlier process's message (a stale status from before this
        // process started); a workload's own message; no status at all; an empty incarnation.
        for p in [
            with(vec![container("running", "")], vec![]),
            with(vec![container("restarted", &other)], vec![]),
            with(vec![container("terminated", "my app's last words")], vec![]),
            with(vec![], vec![]),
            pod("p", "Running", &[]),
        ] {
            assert!(!incarnation_ended(&p, "a1"), "{p:?}");
        }
        assert!(!incarnation_ended(
            &with(
                vec![container("terminated", "arbiter incarnation ")],
                vec![]
            ),
            ""
        ));
        // Not from a pod the garbage collector failed.
        let mut gc = with(vec![container("restarted", &mine)], vec![]);
        gc.status.as_mut().unwrap().conditions =
            Some(vec![k8s_openapi::api::core::v1::PodCondition {
                type_: "DisruptionTarget".into(),
                status: "True".into(),
                reason: Some("DeletionByPodGC".into()),
                ..Default::default()
            }]);
        assert!(!incarnation_ended(&gc, "a1"));
    }

    #[test]
    fn a_candidate_whose_registered_process_exited_waits_for_a_new_one() {
        let registered_by = |incarnation: Option<&str>| {
            let mut c = crate::api::test_candidate("c", "l");
            if let Some(i) = incarnation {
                c.metadata.annotations = Some(std::collections::BTreeMap::from([(
                    crate::lease::INCARNATION_ANNOTATION.to_string(),
                    i.to_string(),
                )]));
            }
            c
        };
        let a1 = crate::lease::termination_message("a1");
        let restarted = with(vec![container("restarted", &a1)], vec![]);
        // Its container was restarted after a1 wrote its message: a1 is gone, and the process
        // that runs now has not registered yet.
        assert!(registered_process_exited(
            &registered_by(Some("a1")),
            &restarted
        ));
        // The new process registered (a2): it is the one a ping reaches.
        assert!(!registered_process_exited(
            &registered_by(Some("a2")),
            &restarted
        ));
        // Waiting to restart with a1's message: a1 is gone.
        let waiting = with(vec![container("waiting", &a1)], vec![]);
        assert!(registered_process_exited(
            &registered_by(Some("a1")),
            &waiting
        ));
        // No container runs, but no message names the registered process (a new process may
        // have registered before the kubelet reports its container): not passed over.
        let stopped = pod("p", "Running", &[true]);
        assert!(!registered_process_exited(
            &registered_by(Some("a2")),
            &stopped
        ));
        assert!(!registered_process_exited(&registered_by(None), &stopped));
        // Running, and nothing says the registered process ended (a library user without a
        // termination log, too).
        let running = with(vec![container("running", "")], vec![]);
        assert!(!registered_process_exited(
            &registered_by(Some("a1")),
            &running
        ));
        assert!(!registered_process_exited(&registered_by(None), &running));
    }

    #[test]
    fn forgets_old_entries_once_it_grows() {
        let stopped = StoppedPods::default();
        let start = Instant::now();
        stopped.record("ns", "old", start);
        for i in 0..PRUNE_FLOOR {
            stopped.record("ns", &format!("new-{i}"), start + FORGET_AFTER);
        }
        assert!(!stopped.contains("ns", "old"));
        assert!(stopped.contains("ns", "new-0"));
        assert!(stopped.0.lock().unwrap().pods.len() < PRUNE_FLOOR + 1);
    }
}
