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

/// `steps` from the initial state; every step must be enabled where it is taken.
pub fn replay(sys: &System, steps: &[Step]) -> Result<Vec<State>, String> {
    let mut states = vec![sys.init()];
    for (k, step) in steps.iter().enumerate() {
        let s = states.last().unwrap();
        let mut enabled = Vec::new();
        sys.steps(s, &mut enabled);
        if !enabled.contains(step) {
            return Err(format!("step {k} ({step:?}) is not enabled at t={}", s.t));
        }
        let next = sys.next(s, *step).unwrap_or_else(|| s.clone());
        states.push(next);
    }
    Ok(states)
}

/// The systems the traces below were recorded in: with the settle off (`--settle=0s`, a
/// setting the operator accepts), as they were found before the model had it; the checks find
/// each mutation again with the settle on.
fn two(mutation: Option<Mutation>, faults: u8) -> System {
    System {
        candidates: 2,
        replicas: 2,
        max_time: 14,
        faults,
        settle: 0,
        extended: true,
        mutation,
    }
}

fn one(mutation: Option<Mutation>, faults: u8) -> System {
    System {
        replicas: 1,
        ..two(mutation, faults)
    }
}

/// The replica assigns c1 and dies (nothing but the Lease records the holder); c1 takes the term; c0
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

/// c1 is named at term 1; in the same second c0 registers, c1's pod is deleted and replaced
/// before its agent took the term (with `edit`, the Lease's recorded pod is then deleted by
/// hand), and the new pod's agent registers; two more seconds.
fn pod_replaced_before_the_take(edit: bool) -> Vec<Step> {
    let mut second = vec![
        Operate(0),
        Operate(1),
        Register(0),
        ReplacePod(1),
        Register(1),
    ];
    if edit {
        second.push(EditHolderPod);
    }
    second.push(Tick);
    [
        vec![Operate(0), Operate(1), Register(1), Tick],
        second,
        seconds(2),
    ]
    .concat()
}

/// c1 is elected and takes its term; in the next second c0 registers, c1's guard is frozen and
/// the Lease deleted by hand; the one replica goes on.
fn guard_frozen() -> Vec<Step> {
    [
        vec![Operate(0), Register(1), Tick],
        vec![Operate(0), Tick],
        vec![Operate(0), Register(0), PauseGuard(1), DeleteLease, Tick],
        [Operate(0), Tick].repeat(4),
    ]
    .concat()
}

/// As [`pod_replaced_before_the_take`] with the edit, but the active replica is paused before
/// the new pod's agent takes the term, and the Lease is deleted by hand before it runs again:
/// its watch then delivers the Lease gone and never the take (a relist after a disconnect
/// does the same). c1, cut off from the API server, runs its term out on its own deadline.
fn take_missed_lease_deleted() -> Vec<Step> {
    [
        vec![Operate(0), Operate(1), Register(1), Tick],
        vec![
            Operate(0),
            Operate(1),
            Register(0),
            ReplacePod(1),
            Register(1),
            EditHolderPod,
            PauseOperator(0),
            Tick,
        ],
        vec![
            Cut(1),
            DeleteLease,
            ResumeOperator(0),
            Operate(0),
            Operate(1),
            Tick,
        ],
        seconds(4),
    ]
    .concat()
}

/// As [`two`], with the settle on (the traces recorded since the model has it).
fn settled(mutation: Option<Mutation>, faults: u8) -> System {
    System {
        settle: crate::system::SETTLE,
        ..two(mutation, faults)
    }
}

/// c1 registers and leads; in its second second, c0 (older) is written by hand with a
/// `renewTime` a minute ahead; ten more seconds.
fn ghost_after_a_leader() -> Vec<Step> {
    [
        vec![Operate(0), Operate(1), Register(1), Tick],
        seconds(1),
        vec![Operate(0), Operate(1), Ghost(0), Tick],
        seconds(10),
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
            // c1 (1.31) registers; with no settle it is elected at once, and c0 (1.30),
            // started with it, registers in the next second: a newer version leads first.
            name: "no-settle: the first to register leads first, an older one a second behind",
            system: settled(Some(Mutation::NoSettle), 0),
            steps: [
                vec![Operate(0), Operate(1), Register(1), Tick],
                vec![Operate(0), Register(0)],
            ]
            .concat(),
            end: |s| !s.gathered(),
        },
        Case {
            // The same with the protocol: the first election waits for the pool to settle,
            // and c0 leads from term 1; then c1 never takes a term.
            name: "candidates started together elect the oldest from the first term",
            system: settled(None, 0),
            steps: [
                vec![Operate(0), Operate(1), Register(1), Tick],
                vec![Operate(0), Register(0), Operate(1), Tick],
                seconds(3),
            ]
            .concat(),
            end: |s| s.max_term == 1 && s.cands[0].cmd == Some(1) && s.gathered(),
        },
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
            // c0 holds; its wall clock falls behind by a lease duration, so the renewTime it
            // writes stays where it was (every renewal writes a later instant, by a
            // millisecond), and looks expired on the operator's clock a lease duration later
            // although c0 renews every second: c1 is elected while c0's CMD runs.
            name: "expiry-by-renew-time: a holder whose clock is behind is deposed while it runs",
            system: two(Some(Mutation::ExpiryByRenewTime), 1),
            steps: [
                vec![Operate(0), Operate(1), Register(0), Tick],
                seconds(1),
                vec![Operate(1), Operate(0), Register(1), Tick],
                vec![Operate(1), Operate(0), ClockBehind(0), Tick],
                seconds(6),
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
            // c1 is named at term 1 in its first pod, which is force-deleted (no proof it
            // stopped) and replaced before its agent took the term; the new pod's agent
            // registers and is cut off; the term lapses, and the forced exit hits the new pod,
            // which never held it.
            name: "owner-pod: a forced exit of the pod the candidate names now",
            system: two(Some(Mutation::OwnerPod), 2),
            steps: [
                vec![Operate(1), Operate(0), Register(1), Tick],
                vec![
                    Operate(0),
                    ForceReplacePod(1),
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
            // c1's take is applied but answered late; the agent, counting its deadline from
            // the answer, starts CMD when the answer arrives, after the operator saw the term
            // lapse and named c0: both CMDs run.
            name: "renew-deadline-from-answer: a take answered after its term lapsed",
            system: two(Some(Mutation::RenewDeadlineFromAnswer), 1),
            steps: [
                vec![Operate(0), Operate(1), Register(1), Tick],
                vec![Operate(0), Operate(1), SlowAnswer(1), Tick],
                seconds(2),
                vec![Operate(0), Operate(1), Register(0), Tick],
                seconds(1),
                vec![Operate(0), Operate(1), Answer(1), Tick],
            ]
            .concat(),
            end: |s| s.overlap,
        },
        Case {
            // c1 is named at term 1 in its pod, which is deleted before its agent took it; the
            // new pod of the same name (a StatefulSet's) registers and takes the term; the
            // operator sees the recorded pod stopped, ends the term and names c0, while c1's
            // new CMD runs.
            name: "take-in-any-pod: a new pod of the same name takes a term assigned in the old one",
            system: two(Some(Mutation::TakeInAnyPod), 1),
            steps: pod_replaced_before_the_take(false),
            end: |s| s.overlap,
        },
        Case {
            // The same with the protocol: the new pod's agent does not take a term assigned in
            // another pod; the old pod's stop ends that term, and c0 is named.
            name: "a term assigned in a pod since replaced is not taken by its successor",
            system: two(None, 1),
            steps: pod_replaced_before_the_take(false),
            end: |s| s.cands[1].cmd.is_none() && s.cands[0].cmd.is_some(),
        },
        Case {
            // The recorded pod deleted by hand from the Lease: the new pod's agent takes the
            // term; the operator, ending terms on the recorded pod's stop whoever took them,
            // names c0 while c1's new CMD runs.
            name: "pod-stop-whoever-took: the recorded pod's stop ends a term taken elsewhere",
            system: two(Some(Mutation::PodStopWhoeverTook), 2),
            steps: pod_replaced_before_the_take(true),
            end: |s| s.overlap,
        },
        Case {
            // The same with the protocol: the term was taken in the new pod, so the old pod's
            // stop does not end it; c1 runs it until it hands over to c0 (older), releasing it.
            name: "a recorded pod's stop does not end a term taken in another pod",
            system: two(None, 2),
            steps: pod_replaced_before_the_take(true),
            end: |s| s.max_term == 1 && s.lease.as_ref().is_some_and(|l| l.released_by == Some(1)),
        },
        Case {
            // The replica never saw c1's take in the new pod, and the Lease is gone: the
            // recorded pod's stop proves nothing (`proof::stop_proof`'s `with_lease` half), so
            // the remembered term is waited out and c0 leads only once c1's CMD is dead.
            name: "a take the replica never saw, its Lease deleted: the recorded pod's stop proves nothing",
            system: two(None, 5),
            steps: take_missed_lease_deleted(),
            end: |s| s.cands[1].cmd.is_none() && s.cands[0].cmd.is_some(),
        },
        Case {
            // c1 holds; its agent is frozen (CMD runs on); c0 registers and c1 is asked to
            // hand over, which its frozen agent never does; with nothing else to stop CMD, it
            // still runs when the operator names c0 after the term lapsed.
            name: "no-guard: a holder whose agent is frozen",
            system: two(Some(Mutation::NoGuard), 1),
            steps: [
                vec![Operate(0), Operate(1), Register(1), Tick],
                seconds(1),
                vec![Operate(0), Operate(1), PauseAgent(1), Tick],
                vec![Operate(0), Operate(1), Register(0), Tick],
                seconds(6),
            ]
            .concat(),
            end: |s| s.overlap,
        },
        Case {
            // c1 holds; its guard is frozen and its Lease deleted: the agent finds the Lease
            // gone and leaves stopping CMD to the guard, which does not run; c0 is elected
            // once the unknown holder's term is waited out, while c1's CMD runs.
            name: "agent-relies-on-guard: the guard frozen, the Lease deleted",
            system: one(Some(Mutation::AgentReliesOnGuard), 2),
            steps: guard_frozen(),
            end: |s| s.overlap,
        },
        Case {
            // The same with the protocol: the agent stops CMD itself a kill grace after it
            // found the Lease gone.
            name: "a holder whose guard is frozen is stopped by its agent",
            system: one(None, 2),
            steps: guard_frozen(),
            end: |s| {
                s.cands[1].guard_paused && s.cands[1].cmd.is_none() && s.cands[0].cmd.is_some()
            },
        },
        Case {
            // c1 leads; c0 (older) is written by hand with a renewTime a minute ahead and no
            // process behind it, and c1 hands over to it. Taking that timestamp as the answer
            // to every ping, the operator keeps the term it assigned c0, which nobody takes,
            // while c1 waits.
            name: "future-renew-as-answer: a candidate written by hand answers every ping",
            system: settled(Some(Mutation::FutureRenewAsAnswer), 1),
            steps: ghost_after_a_leader(),
            end: |s| !s.live(),
        },
        Case {
            // The same with the protocol: the term assigned to the hand-written candidate
            // lapses untaken (it never answers a ping), and c1 leads again.
            name: "a live holder handing over to a candidate written by hand leads again",
            system: settled(None, 1),
            steps: ghost_after_a_leader(),
            end: |s| s.cands[1].cmd.is_some() && s.live(),
        },
        Case {
            // The same with the protocol: the hand-written candidate is elected once (its
            // registration counts as alive for the ack validity), never answers a ping, and
            // c1 runs CMD.
            name: "a candidate written by hand with a renewTime in the future is not alive",
            system: two(None, 1),
            steps: [
                vec![Operate(0), Operate(1), Ghost(0), Register(1), Tick],
                seconds(11),
            ]
            .concat(),
            end: |s| s.cands[1].cmd.is_some() && s.live(),
        },
        Case {
            // The protocol's own worst case for liveness (docs/model.md): c0 registers and is
            // frozen, the active replica is paused in the same second; the standby takes over
            // after 3 s, elects c0 (its registration counts as alive, and its pod runs), waits
            // its term out, and hands the next term to c1, whose CMD runs 9 s after the last
            // fault. (A candidate that crashes instead is not elected: its container restarted
            // since it registered.)
            name: "liveness: a takeover that elects a candidate which has just frozen",
            system: two(None, 2),
            steps: [
                seconds(4),
                vec![Register(1), Register(0), Pause(0), Operate(0), Operate(1)],
                vec![PauseOperator(0), Tick],
                [Operate(1), Tick].repeat(8),
            ]
            .concat(),
            end: |s| s.t == 4 + 9 && s.calm_since == 4 && s.cands[1].cmd == Some(2) && s.live(),
        },
    ]
}
