//! What proves a term over before its lease runs out: the confirmed stop of the pod the term
//! was taken in. The operator's memory of each holder (`term/held.rs`) and its view of a Lease
//! record (`reconcile/view.rs`) ask [`stop_proof`] which pod that is; the protocol model
//! (`make model`) asks the same function.

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

#[cfg(test)]
mod tests {
    use super::stop_proof;

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
