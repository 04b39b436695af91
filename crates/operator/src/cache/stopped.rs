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

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::pod_facts::{containers_stopped, terminal};

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
    pub fn record_event(&self, pod: &Pod, deleted: bool) {
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

#[cfg(test)]
mod tests {
    use super::super::pod_facts::*;
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
        stopped.record_event(&pod("running", "Running", &[false]), false);
        stopped.record_event(&pod("terminating", "Running", &[true, false]), true);
        stopped.record_event(&pod("unknown", "Running", &[]), true);
        stopped.record_event(&pod("containers-done", "Running", &[true]), false);
        stopped.record_event(&pod("failed", "Failed", &[]), false);
        // Failed, but a container still reported running: the phase was not the kubelet's
        // (the pod GC fails terminating pods on out-of-service nodes without a condition).
        stopped.record_event(&pod("failed-running", "Failed", &[true, false]), false);
        stopped.record_event(&pod("deleted-done", "Running", &[true, true]), true);
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
        stopped.record_event(&gc, false);
        stopped.record_event(&gc, true);
        assert!(!stopped.contains("ns", "gc"));
        assert!(!terminal(&gc));
        // The kubelet's own eviction (TerminationByKubelet) is a kubelet report: proof.
        let mut evicted = pod("evicted", "Failed", &[true]);
        let mut condition = gc.status.as_ref().unwrap().conditions.clone().unwrap();
        condition[0].reason = Some("TerminationByKubelet".into());
        evicted.status.as_mut().unwrap().conditions = Some(condition);
        stopped.record_event(&evicted, false);
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
        let mine = arbiter_api::lease::termination_message("a1");
        let other = arbiter_api::lease::termination_message("a0");
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
            let mut c = crate::test_candidate("c", "l");
            if let Some(i) = incarnation {
                c.metadata.annotations = Some(std::collections::BTreeMap::from([(
                    arbiter_api::lease::INCARNATION_ANNOTATION.to_string(),
                    i.to_string(),
                )]));
            }
            c
        };
        let a1 = arbiter_api::lease::termination_message("a1");
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
