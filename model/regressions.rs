//! Every counterexample the checker has found, kept as a scripted trace replayed against the
//! model before it is checked: a mutation's counterexample must still break the property it
//! names (the check keeps its power as the model grows), and a worst case of the protocol
//! must still end where docs/model.md says. A step the model no longer enables fails the
//! replay: a trace that no longer fits is re-recorded from `make model MUTATION=name`, not
//! dropped.

use crate::system::{Mutation, State, Step, System};
use Step::*;

/// A recorded trace, the system it runs in and what must hold at its end.
pub struct Case {
    pub name: &'static str,
    pub system: System,
    pub steps: Vec<Step>,
    pub end: fn(&State) -> bool,
}

/// `steps` from the initial state; every step must be enabled where it is taken. A replica's
/// status write, the last write of its reconcile, is not recorded: it is taken where the
/// trace moves on without it.
pub fn replay(sys: &System, steps: &[Step]) -> Result<Vec<State>, String> {
    let mut states = vec![sys.init()];
    for (k, step) in steps.iter().enumerate() {
        loop {
            let s = states.last().unwrap();
            let mut enabled = Vec::new();
            sys.steps(s, &mut enabled);
            if enabled.contains(step) {
                let next = sys.next(s, *step).unwrap_or_else(|| s.clone());
                states.push(next);
                break;
            }
            let Some(status) = enabled.iter().find(|e| matches!(e, WriteStatus(_))) else {
                return Err(format!("step {k} ({step:?}) is not enabled at t={}", s.t));
            };
            let next = sys.next(s, *status).unwrap_or_else(|| s.clone());
            states.push(next);
        }
    }
    Ok(states)
}

fn two(mutation: Option<Mutation>, faults: u8) -> System {
    System {
        candidates: 2,
        replicas: 2,
        max_time: 14,
        faults,
        mutation,
    }
}

fn one(mutation: Option<Mutation>, faults: u8) -> System {
    System {
        replicas: 1,
        ..two(mutation, faults)
    }
}

/// The replica assigns c1 and dies before the status that reports it; c1 takes the term; c0
/// registers; c1 is cut off from the API server; the Lease is deleted by hand. The restarted
/// replica takes the HA lease over and finds nothing that names a holder.
fn unreported_term() -> Vec<Step> {
    [
        vec![Operate(0), Register(1), Tick],
        vec![Operate(0), RestartOperator(0), Operate(0), Tick],
        vec![Operate(0), Tick],
        vec![Operate(0), Register(0), Cut(1), DeleteLease, Tick],
        vec![Operate(0), Tick],
    ]
    .concat()
}

/// `n` calm seconds: both replicas operate, time moves on.
fn seconds(n: usize) -> Vec<Step> {
    (0..n)
        .flat_map(|_| [Operate(0), Operate(1), Tick])
        .collect()
}

pub fn cases() -> Vec<Case> {
    vec![
        Case {
            // c1 is elected at term 1; the Lease is deleted by hand; c0 registers and, with
            // the next term taken from the Lease alone, is elected at term 1 again.
            name: "no-term-mark: a deleted Lease restarts its terms",
            system: two(Some(Mutation::NoTermMark), 1),
            steps: [
                vec![Operate(0), Operate(1), Register(1), Tick],
                vec![Operate(0), Operate(1), DeleteLease, Tick],
                vec![Operate(0), Operate(1), Register(0), Tick],
                seconds(2),
                vec![Operate(0)],
            ]
            .concat(),
            end: |s| s.term_reused,
        },
        Case {
            // c1 holds; its wall clock falls behind by a lease duration, so its renewTime
            // looks expired on the operator's clock although it renews every second: c0 is
            // elected while c1's CMD runs.
            name: "expiry-by-renew-time: a holder whose clock is behind is deposed while it runs",
            system: two(Some(Mutation::ExpiryByRenewTime), 1),
            steps: [
                vec![Operate(0), Operate(1), Register(1), Tick],
                seconds(1),
                vec![Operate(1), Operate(0), Register(0), Tick],
                vec![Operate(1), Operate(0), ClockBehind(1), Tick],
                vec![Operate(1), Operate(0), Tick],
            ]
            .concat(),
            end: |s| s.overlap,
        },
        Case {
            // The active replica names c0 at term 1 and is paused before its mark write; the
            // Lease is deleted before anyone saw it; the standby takes over, finds no mark
            // and no Lease, and names c0 at term 1 again.
            name: "mark-after-lease: a replica paused between the Lease and its mark",
            system: two(Some(Mutation::MarkAfterLease), 2),
            steps: [
                vec![Operate(0), Operate(1), Register(0), Tick],
                vec![Operate(0), PauseOperator(0), Operate(1), DeleteLease, Tick],
                [Operate(1), Tick].repeat(2),
                vec![Operate(1)],
            ]
            .concat(),
            end: |s| s.term_reused,
        },
        Case {
            // c1 is elected; c0, an older version, registers a moment later and is never
            // asked for.
            name: "no-handover: an older candidate registered after the first election waits forever",
            system: two(Some(Mutation::NoHandover), 0),
            steps: [
                vec![Operate(0), Operate(1), Register(1), Tick],
                vec![Operate(0), Operate(1), Register(0), Tick],
                seconds(3),
            ]
            .concat(),
            end: |s| !s.in_order(),
        },
        Case {
            // c1 is named at term 1 in its first pod, which is replaced before its agent took
            // the term; the new pod's agent registers and is cut off; the term lapses, and the
            // forced exit hits the new pod, which never held it.
            name: "owner-pod: a forced exit of the pod the candidate names now",
            system: two(Some(Mutation::OwnerPod), 2),
            steps: [
                vec![Operate(1), Operate(0), Register(1), Tick],
                vec![
                    Operate(0),
                    ReplacePod(1),
                    Register(1),
                    Operate(1),
                    Cut(1),
                    Tick,
                ],
                seconds(1),
                vec![Operate(1), Operate(0), Register(0), Tick],
                seconds(1),
                vec![Operate(0)],
            ]
            .concat(),
            end: |s| s.wrong_eviction,
        },
        Case {
            // Electing at once on finding nothing, though the term mark says a term was handed
            // out: c0's CMD runs while the cut-off c1's still does.
            name: "no-unknown-term: a term nobody reported, its Lease deleted",
            system: one(Some(Mutation::NoUnknownTerm), 3),
            steps: unreported_term(),
            end: |s| s.overlap,
        },
        Case {
            // The same with the protocol: the unknown holder's term is waited out, so nobody
            // is elected while c1's CMD may run.
            name: "a term nobody reported, its Lease deleted, is waited out",
            system: one(None, 3),
            steps: unreported_term(),
            end: |s| s.lease.is_none() && s.cands[1].cmd.is_some(),
        },
        Case {
            // The protocol's own worst case for liveness (docs/model.md): c0 registers and
            // crashes, the active replica is paused in the same second; the standby takes
            // over after 3 s, elects c0 (its registration counts as alive), waits its term
            // out, and hands the next term to c1, whose CMD runs 9 s after the last fault.
            name: "liveness: a takeover that elects a candidate which has just crashed",
            system: two(None, 2),
            steps: [
                seconds(4),
                vec![Register(1), Register(0), Crash(0), Operate(0), Operate(1)],
                vec![PauseOperator(0), Tick],
                [Operate(1), Tick].repeat(8),
            ]
            .concat(),
            end: |s| s.t == 4 + 9 && s.calm_since == 4 && s.cands[1].cmd == Some(2) && s.live(),
        },
    ]
}
