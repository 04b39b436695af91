//! What proves a term over before its lease runs out: the confirmed stop of the pod the term
//! was taken in. The operator's memory of each holder (`term/held.rs`) and its view of a Lease
//! record (`reconcile/view.rs`) ask [`stop_proof`] which pod that is; the protocol model
//! (`make model`) asks the same function.
//!
//! And the converse, for a holder whose term lapsed while its pod still runs: whether that pod
//! is the one to force out ([`forced_exit_due`]), asked by the operator's forced exits
//! (`reconcile/forced_exit.rs`) and by the model.

/// The pod whose confirmed stop ends a term: `recorded`, the pod the arbiter recorded with its
/// assignment, if the term was taken in it.
///
/// `taken` is `Some(taken_in)` once a take of the term was seen (`taken_in`: the pod it was
/// taken in, if the take named one). A term taken elsewhere (a new pod of the same name took
/// an assignment made while the old one ran) does not end with the recorded pod. While no take
/// was seen, the recorded pod counts only against a Lease that still names the holder
/// (`with_lease`): a take the arbiter has not seen yet makes the compare-and-swap that deposes
/// the holder fail; with the Lease gone or renamed nothing would stop that write.
pub fn stop_proof<P: PartialEq>(
    recorded: Option<P>,
    taken: Option<Option<P>>,
    with_lease: bool,
) -> Option<P> {
    let pod = recorded?;
    match taken {
        Some(taken_in) => (taken_in.as_ref() == Some(&pod)).then_some(pod),
        None => with_lease.then_some(pod),
    }
}

/// Whether a lapsed holder's `pod`, with `restarts` container restarts now, is the one to force
/// out: the pod its term was assigned in (`assigned_in`, as the arbiter recorded it), with the
/// container restarts recorded then (`recorded_restarts`: nothing in it exited since, so the
/// process that held the term may still run), and not every container of it reported ended
/// (`nothing_runs`: one in crash-loop back-off runs nothing).
pub fn forced_exit_due<P: PartialEq, R: PartialEq>(
    assigned_in: Option<P>,
    recorded_restarts: Option<R>,
    pod: P,
    restarts: R,
    nothing_runs: bool,
) -> bool {
    assigned_in.is_some_and(|a| a == pod) && recorded_restarts == Some(restarts) && !nothing_runs
}

#[cfg(test)]
mod tests {
    use super::{forced_exit_due, stop_proof};

    /// (assigned in, recorded restarts, pod, restarts now, nothing runs) -> forced out
    type ExitCase = (
        Option<&'static str>,
        Option<i64>,
        &'static str,
        i64,
        bool,
        bool,
    );

    #[test]
    fn only_the_pod_the_term_was_assigned_in_with_the_same_containers_is_forced_out() {
        let cases: &[ExitCase] = &[
            (Some("a"), Some(0), "a", 0, false, true),
            // Another pod of the same name: it never held the term.
            (Some("a"), Some(0), "b", 0, false, false),
            // A container ended since the assignment: the process that held it exited.
            (Some("a"), Some(0), "a", 1, false, false),
            // Every container reported ended (crash-loop back-off): nothing to stop.
            (Some("a"), Some(0), "a", 0, true, false),
            // Nothing recorded (a term assigned without a pod, or a record not arbiter's).
            (None, Some(0), "a", 0, false, false),
            (Some("a"), None, "a", 0, false, false),
        ];
        for &(assigned_in, recorded, pod, restarts, nothing_runs, want) in cases {
            assert_eq!(
                forced_exit_due(assigned_in, recorded, pod, restarts, nothing_runs),
                want,
                "{assigned_in:?} {recorded:?} {pod} {restarts} {nothing_runs}"
            );
        }
    }

    /// (recorded, taken, with the Lease) -> the pod whose stop ends the term.
    type Case = (
        Option<&'static str>,
        Option<Option<&'static str>>,
        bool,
        Option<&'static str>,
    );

    #[test]
    fn only_the_pod_the_term_was_taken_in_proves_it_over() {
        let cases: &[Case] = &[
            // Taken in the recorded pod: its stop ends the term, Lease or not.
            (Some("a"), Some(Some("a")), true, Some("a")),
            (Some("a"), Some(Some("a")), false, Some("a")),
            // Taken in another pod of the same name, or by a take that named none: never.
            (Some("a"), Some(Some("b")), true, None),
            (Some("a"), Some(None), true, None),
            // No take seen: only against a Lease that still names the holder.
            (Some("a"), None, true, Some("a")),
            (Some("a"), None, false, None),
            // Nothing recorded: nothing proves it.
            (None, Some(Some("a")), true, None),
            (None, None, true, None),
        ];
        for &(recorded, taken, with_lease, want) in cases {
            assert_eq!(
                stop_proof(recorded, taken, with_lease),
                want,
                "{recorded:?} {taken:?} {with_lease}"
            );
        }
    }
}
