//! The state of a candidate's pod as the election sees it ([`PodState`]), judged from what the
//! arbiter's caches show of the pod the candidate names ([`PodSeen`]): the operator reads those
//! facts off the Pod object, the model off the pods it simulates, and both judge them here.

/// What the arbiter knows of the pod a candidate belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PodState {
    /// The candidate is not owned by a pod: its liveness alone counts.
    NoPod,
    /// The pod is running and not being deleted.
    Running,
    /// The pod exists but is pending, not ready or terminating: not electable, and its
    /// processes may still run.
    NotRunning,
    /// The pod reached a terminal phase, or was removed after its containers stopped: proof
    /// that its processes are gone.
    Stopped,
    /// The pod is not known (not yet seen, or force-deleted): not electable, and no proof.
    Missing,
    /// The pod runs, but the process that registered the candidate exited: the kubelet
    /// reported its container's end with that process's termination message. Not electable
    /// until a new process registers: a ping would wait out the ack window for nobody. (No
    /// proof that a term ended: only [`PodState::Stopped`] is.)
    ProcessExited,
}

impl PodState {
    pub(super) fn electable(self) -> bool {
        matches!(self, PodState::NoPod | PodState::Running)
    }
}

/// What the arbiter's caches show of the pod a candidate names (by its uid).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PodSeen {
    /// The candidate names no pod.
    NotOwned,
    /// The pod is in the cache.
    Present {
        /// The kubelet reported a terminal phase with every container stopped.
        terminal: bool,
        /// It is being deleted (terminating).
        deleting: bool,
        /// Its phase is `Running`.
        running: bool,
        /// The kubelet reported the end of the container of the process that registered the
        /// candidate (its termination message names that process's incarnation).
        registered_process_exited: bool,
    },
    /// The pod is not in the cache. `stopped`: its stop was recorded when it went (its
    /// containers had stopped), which is proof; without that, it may have been force-deleted
    /// with its processes still running, or not be seen yet.
    Absent { stopped: bool },
}

impl PodState {
    /// The state of the pod `seen` shows: a stop the kubelet reported first, then a deletion
    /// under way, then the registering process's end, then the phase.
    pub fn of(seen: PodSeen) -> PodState {
        match seen {
            PodSeen::NotOwned => PodState::NoPod,
            PodSeen::Present { terminal: true, .. } => PodState::Stopped,
            PodSeen::Present { deleting: true, .. } => PodState::NotRunning,
            PodSeen::Present {
                running: true,
                registered_process_exited: true,
                ..
            } => PodState::ProcessExited,
            PodSeen::Present { running: true, .. } => PodState::Running,
            PodSeen::Present { .. } => PodState::NotRunning,
            PodSeen::Absent { stopped: true } => PodState::Stopped,
            PodSeen::Absent { stopped: false } => PodState::Missing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PodSeen::{Absent, NotOwned, Present};
    use super::*;

    fn present(terminal: bool, deleting: bool, running: bool, exited: bool) -> PodSeen {
        Present {
            terminal,
            deleting,
            running,
            registered_process_exited: exited,
        }
    }

    #[test]
    fn a_pods_state_follows_from_what_the_caches_show() {
        let cases = [
            (NotOwned, PodState::NoPod),
            (present(false, false, true, false), PodState::Running),
            // A stop the kubelet reported wins over a deletion under way.
            (present(true, true, false, false), PodState::Stopped),
            (present(true, false, false, true), PodState::Stopped),
            // Terminating: its processes may still run, and it is not electable.
            (present(false, true, true, false), PodState::NotRunning),
            (present(false, true, true, true), PodState::NotRunning),
            (present(false, false, true, true), PodState::ProcessExited),
            // Pending, or a phase other than Running: not running, whatever the containers say.
            (present(false, false, false, true), PodState::NotRunning),
            (present(false, false, false, false), PodState::NotRunning),
            (Absent { stopped: true }, PodState::Stopped),
            (Absent { stopped: false }, PodState::Missing),
        ];
        for (seen, want) in cases {
            assert_eq!(PodState::of(seen), want, "{seen:?}");
        }
    }

    #[test]
    fn only_a_running_pod_or_none_is_electable() {
        let electable: Vec<PodState> = [
            PodState::NoPod,
            PodState::Running,
            PodState::NotRunning,
            PodState::Stopped,
            PodState::Missing,
            PodState::ProcessExited,
        ]
        .into_iter()
        .filter(|s| s.electable())
        .collect();
        assert_eq!(electable, [PodState::NoPod, PodState::Running]);
    }
}
