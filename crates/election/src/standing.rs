//! What a Lease record says of one candidate's process: whether the term it names is that
//! process's to take or keep. The candidate library (`arbiter-candidate`'s leadership loop)
//! asks [`standing`] of every Lease it reads, before a take and at each renewal; the protocol
//! model (`make model`) asks the same before an agent takes a term or renews it.

/// The parts of a Lease record a process's standing depends on, as the Lease carries them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Record<'a> {
    /// `holderIdentity`.
    pub holder: Option<&'a str>,
    /// `leaseTransitions`.
    pub term: i32,
    /// The incarnation of the process that took the term (`arbiter.dev/incarnation`; none, or
    /// empty, on a fresh assignment).
    pub incarnation: Option<&'a str>,
    /// The arbiter's assignment mark names this holder at this term, written by the arbiter
    /// (`arbiter.dev/assigned`).
    pub assigned_by_arbiter: bool,
    /// The pod the arbiter recorded with its assignment (`arbiter.dev/holder-pod-uid`).
    pub assigned_in: Option<&'a str>,
    /// `preferredHolder`: the arbiter asks the holder to hand over to it.
    pub preferred_holder: Option<&'a str>,
}

/// The process asking.
#[derive(Clone, Copy, Debug)]
pub struct Process<'a> {
    /// Its candidate's name (the holder identity it answers to).
    pub identity: &'a str,
    /// This process's incarnation (a new one per process start).
    pub incarnation: &'a str,
    /// The uid of the pod it runs in, if it runs in one.
    pub pod: Option<&'a str>,
    /// The term it is taking or leads (none while it follows): a record that carries this
    /// process's incarnation is its own only at that term; at any other, the term was edited
    /// in by hand under its stamp, and is nobody's assignment.
    pub took: Option<i32>,
}

/// What the record says about the process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Not assigned to this identity.
    Other,
    /// Assigned to this identity and free to take (a fresh assignment, or already ours).
    Ours,
    /// Assigned to this identity but held by an earlier process of it: must not be resumed.
    Stale,
    /// A fresh assignment to this identity made for another pod of that name (the pod uid the
    /// arbiter recorded is not this process's): the arbiter ends that term when that pod is
    /// seen stopped, so this process must never run under it.
    OtherPod(String),
    /// Names this identity, but the arbiter did not assign it (no assignment mark: a client-go
    /// Lease kept under `arbiter run`, one made or edited by hand): someone else's.
    Unassigned,
    /// Ours, and the arbiter asks us to hand over to someone else.
    HandoverTo(String),
}

/// The standing of `me` under `record`.
pub fn standing(record: &Record, me: &Process) -> Standing {
    if record.holder != Some(me.identity) {
        return Standing::Other;
    }
    match record.incarnation {
        Some(i) if !i.is_empty() && i != me.incarnation => return Standing::Stale,
        Some(i) if i == me.incarnation && me.took != Some(record.term) => {
            return Standing::Unassigned;
        }
        // Taken by this process already: its term, whatever marks were edited since.
        Some(i) if i == me.incarnation => {}
        // A fresh assignment: only the arbiter's, and only in the pod it was made for.
        _ if !record.assigned_by_arbiter => return Standing::Unassigned,
        _ => {
            if let Some(uid) = record.assigned_in.filter(|u| !u.is_empty())
                && me.pod != Some(uid)
            {
                return Standing::OtherPod(uid.to_string());
            }
        }
    }
    match record.preferred_holder {
        Some(p) if p != me.identity => Standing::HandoverTo(p.to_string()),
        _ => Standing::Ours,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: Process = Process {
        identity: "me",
        incarnation: "i1",
        pod: Some("p1"),
        took: Some(3),
    };

    fn fresh() -> Record<'static> {
        Record {
            holder: Some("me"),
            term: 3,
            incarnation: None,
            assigned_by_arbiter: true,
            assigned_in: Some("p1"),
            preferred_holder: None,
        }
    }

    #[test]
    fn only_an_assignment_made_for_this_process_is_its_own() {
        let other_pod = Standing::OtherPod("p0".into());
        let cases: &[(&str, Record, Standing)] = &[
            ("a fresh assignment in its pod", fresh(), Standing::Ours),
            (
                "another holder",
                Record {
                    holder: Some("you"),
                    ..fresh()
                },
                Standing::Other,
            ),
            (
                "no holder",
                Record {
                    holder: None,
                    ..fresh()
                },
                Standing::Other,
            ),
            (
                "taken by an earlier process of its name",
                Record {
                    incarnation: Some("i0"),
                    ..fresh()
                },
                Standing::Stale,
            ),
            (
                "its own take, at the term it took",
                Record {
                    incarnation: Some("i1"),
                    assigned_by_arbiter: false,
                    assigned_in: Some("p0"),
                    ..fresh()
                },
                Standing::Ours,
            ),
            (
                "its own stamp at a term edited in by hand",
                Record {
                    incarnation: Some("i1"),
                    term: 4,
                    ..fresh()
                },
                Standing::Unassigned,
            ),
            (
                "no assignment mark",
                Record {
                    assigned_by_arbiter: false,
                    ..fresh()
                },
                Standing::Unassigned,
            ),
            (
                "an empty incarnation is none",
                Record {
                    incarnation: Some(""),
                    ..fresh()
                },
                Standing::Ours,
            ),
            (
                "assigned in another pod of its name",
                Record {
                    assigned_in: Some("p0"),
                    ..fresh()
                },
                other_pod,
            ),
            (
                "assigned with no pod recorded",
                Record {
                    assigned_in: None,
                    ..fresh()
                },
                Standing::Ours,
            ),
            (
                "an empty recorded pod is none",
                Record {
                    assigned_in: Some(""),
                    ..fresh()
                },
                Standing::Ours,
            ),
            (
                "asked to hand over",
                Record {
                    preferred_holder: Some("you"),
                    ..fresh()
                },
                Standing::HandoverTo("you".into()),
            ),
            (
                "preferred itself",
                Record {
                    preferred_holder: Some("me"),
                    ..fresh()
                },
                Standing::Ours,
            ),
        ];
        for (what, record, want) in cases {
            assert_eq!(&standing(record, &ME), want, "{what}");
        }
    }

    #[test]
    fn a_process_outside_a_pod_takes_only_an_assignment_without_one() {
        let me = Process { pod: None, ..ME };
        assert_eq!(
            standing(&fresh(), &me),
            Standing::OtherPod("p1".into()),
            "a recorded pod is not its own"
        );
        let unrecorded = Record {
            assigned_in: None,
            ..fresh()
        };
        assert_eq!(standing(&unrecorded, &me), Standing::Ours);
    }
}
