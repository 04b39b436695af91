//! Table tests (upstream's cases from kep4355.md §6.2, and ours) and property tests.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;

use super::*;
use crate::Version;

const OEV: &str = OLDEST_EMULATION_VERSION;

fn t0() -> Timestamp {
    "2026-01-01T00:00:00Z".parse().unwrap()
}

fn secs(s: i64) -> SignedDuration {
    SignedDuration::from_secs(s)
}

/// A candidate at `version` (emulation = binary), created at t0, acknowledged a ping at now.
fn acked(name: &str, version: &str, now: Timestamp) -> Candidate {
    Candidate {
        name: name.into(),
        binary_version: version.into(),
        emulation_version: Some(version.into()),
        strategy: OEV.into(),
        created: t0(),
        ping: our_ping(now, true),
        renewed_lately: false,
        pod: PodState::Running,
        withdrawn: false,
        registered: None,
    }
}

fn never_pinged(name: &str, version: &str) -> Candidate {
    Candidate {
        ping: None,
        renewed_lately: false,
        ..acked(name, version, t0())
    }
}

/// The arbiter's ping, sent (and shown by its watch) at `sent`, answered or not.
fn our_ping(sent: Timestamp, answered: bool) -> Option<Ping> {
    Some(Ping {
        sent,
        shown: Some(sent),
        answered,
    })
}

fn lease(holder: Option<&str>, unchanged_for: u64) -> Lease {
    Lease {
        holder: holder.map(str::to_string),
        preferred_holder: None,
        strategy: Some(OEV.into()),
        duration: Duration::from_secs(15),
        unchanged_for: Duration::from_secs(unchanged_for),
        released_by: None,
        holder_pod_stopped: false,
        term_seen: None,
        switchover: None,
        term: 1,
        foreign: false,
    }
}

fn act(cands: &[Candidate], lease: Option<&Lease>, now: Timestamp) -> Action {
    decide(cands, lease, None, now, &Rules::default()).action
}

fn create(holder: &str) -> Action {
    Action::CreateLease {
        holder: Some(holder.into()),
        strategy: OEV.into(),
    }
}

fn assign(holder: &str) -> Action {
    Action::Assign {
        holder: holder.into(),
        lapsed: None,
    }
}

fn assign_after_lapse(holder: &str, lapsed: &str) -> Action {
    Action::Assign {
        holder: holder.into(),
        lapsed: Some(lapsed.into()),
    }
}

// ---- kep4355.md §6.2 TestReconcileElectionStep, in arbiter's terms ----

#[test]
fn no_candidates_leaves_the_lease_alone() {
    let now = t0();
    assert_eq!(act(&[], None, now), Action::Nothing);
    assert_eq!(act(&[], Some(&lease(Some("x"), 100)), now), Action::Nothing);
}

#[test]
fn single_acknowledged_candidate_creates_the_lease() {
    let now = t0();
    assert_eq!(
        act(&[acked("id-1", "1.19.0", now)], None, now),
        create("id-1")
    );
}

#[test]
fn candidates_are_pinged_before_an_election() {
    let now = t0() + secs(60);
    let cands = [
        never_pinged("id-2", "1.19.0"),
        never_pinged("id-1", "1.19.0"),
        never_pinged("id-3", "1.20.0"),
    ];
    // The best is asked alone ...
    assert_eq!(
        act(&cands, None, now),
        Action::Ping {
            candidates: vec!["id-1".into()]
        }
    );
    // ... waited for ...
    let pinged = |name: &str, at: Timestamp| Candidate {
        ping: our_ping(at, false),
        ..never_pinged(name, "1.19.0")
    };
    let waiting = [pinged("id-1", now), cands[0].clone(), cands[2].clone()];
    assert_eq!(act(&waiting, None, now + secs(2)), Action::WaitForAcks);
    // ... and elected when it answers, nobody else asked.
    let answered = [
        acked("id-1", "1.19.0", now),
        cands[0].clone(),
        cands[2].clone(),
    ];
    assert_eq!(act(&answered, None, now + secs(2)), create("id-1"));
    // When it ignores the ping, every other one that could win is asked at once.
    let later = now + secs(5);
    let ignored = [pinged("id-1", now), cands[0].clone(), cands[2].clone()];
    assert_eq!(
        act(&ignored, None, later),
        Action::Ping {
            candidates: vec!["id-2".into(), "id-3".into()]
        }
    );
}

#[test]
fn only_candidates_that_could_outrank_every_answer_are_pinged() {
    let now = t0() + secs(60);
    let silent = Candidate {
        ping: our_ping(now - secs(30), false),
        ..acked("silent", "1.17.0", now)
    };
    let cands = [
        acked("id-1", "1.19.0", now),
        never_pinged("id-0", "1.18.0"),
        never_pinged("id-00", "1.18.0"),
        never_pinged("id-3", "1.21.0"),
        silent,
    ];
    // id-3 could not win over id-1, which answered: not asked, even in the wide round.
    assert_eq!(
        act(&cands, None, now),
        Action::Ping {
            candidates: vec!["id-0".into(), "id-00".into()]
        }
    );
}

#[test]
fn candidates_seen_renewing_lately_are_elected_without_a_ping() {
    let now = t0() + secs(60);
    let lately = |name: &str| Candidate {
        renewed_lately: true,
        ..never_pinged(name, "1.19.0")
    };
    assert_eq!(
        act(&[lately("id-2"), lately("id-1")], None, now),
        create("id-1")
    );
    // Only the one whose liveness is unknown is pinged; the election waits for it if it could
    // win.
    let unknown_better = never_pinged("id-0", "1.18.0");
    assert_eq!(
        act(&[lately("id-1"), unknown_better], None, now),
        Action::Ping {
            candidates: vec!["id-0".into()]
        }
    );
}

#[test]
fn renewing_lately_does_not_outweigh_an_ignored_ping() {
    let now = t0() + secs(60);
    let ignored = Candidate {
        ping: our_ping(now - secs(6), false),
        renewed_lately: true,
        ..acked("id-1", "1.18.0", now)
    };
    let rules = Rules::default();
    assert_eq!(liveness(&ignored, now, &rules), Liveness::Unresponsive);
    let pending = Candidate {
        ping: our_ping(now - secs(1), false),
        ..ignored.clone()
    };
    assert_eq!(liveness(&pending, now, &rules), Liveness::Pending);
    assert_eq!(
        act(&[ignored, acked("id-2", "1.19.0", now)], None, now),
        create("id-2")
    );
}

#[test]
fn a_handover_target_seen_renewing_lately_must_still_answer_a_ping_of_this_term() {
    let now = t0() + secs(60);
    let target = Candidate {
        renewed_lately: true,
        ..never_pinged("id-2", "1.18.0")
    };
    let live = Lease {
        term_seen: Some(now - secs(30)),
        ..lease(Some("id-1"), 1)
    };
    assert_eq!(
        act(&[acked("id-1", "1.19.0", now), target], Some(&live), now),
        Action::Ping {
            candidates: vec!["id-2".into()]
        }
    );
}

#[test]
fn better_candidate_gets_a_handover_request_not_the_lease() {
    let now = t0();
    let cands = [acked("id-1", "1.19.0", now), acked("id-2", "1.18.0", now)];
    let live = lease(Some("id-1"), 1);
    assert_eq!(
        act(&cands, Some(&live), now),
        Action::RequestHandover { to: "id-2".into() }
    );
    let requested = Lease {
        preferred_holder: Some("id-2".into()),
        ..live
    };
    assert_eq!(
        act(&cands, Some(&requested), now),
        Action::WaitForRelease { to: "id-2".into() }
    );
}

#[test]
fn only_candidates_that_acknowledged_are_elected() {
    let now = t0() + secs(60);
    let silent = Candidate {
        ping: our_ping(now - secs(10), false),
        renewed_lately: false,
        ..acked("id-1", "1.19.0", now)
    };
    let cands = [silent, acked("id-2", "1.20.0", now)];
    assert_eq!(act(&cands, None, now), create("id-2"));
}

#[test]
fn expired_lease_is_assigned_to_the_best_candidate() {
    let now = t0();
    assert_eq!(
        act(
            &[acked("id-1", "1.19.0", now)],
            Some(&lease(Some("id-expired"), 15)),
            now
        ),
        assign_after_lapse("id-1", "id-expired")
    );
}

#[test]
fn a_lapsed_holder_does_not_get_the_next_term_while_others_can() {
    let now = t0();
    let cands = [
        acked("lapsed", "1.19.0", now),
        acked("other", "1.20.0", now),
    ];
    assert_eq!(
        act(&cands, Some(&lease(Some("lapsed"), 15)), now),
        assign_after_lapse("other", "lapsed")
    );
    // Alone, it may lead again (a new term), once it answered a ping sent since the lapse.
    assert_eq!(
        act(&cands[..1], Some(&lease(Some("lapsed"), 15)), now),
        assign("lapsed")
    );
    // Not on an answer from before the lapse, nor on a renewal of its own however recent
    // (with an ack validity longer than the lease, it would get term after term while dead).
    let long = Rules {
        ack_valid_for: Duration::from_secs(60),
        ..Rules::default()
    };
    // The lapsed term began 17 s ago and lapsed 1 s ago.
    let lapsed_lease = Lease {
        term_seen: Some(now - secs(17)),
        ..lease(Some("lapsed"), 16)
    };
    let answered_in_term = acked("lapsed", "1.19.0", now - secs(2));
    let renewed = Candidate {
        ping: None,
        renewed_lately: true,
        ..cands[0].clone()
    };
    let answered_before_term = acked("lapsed", "1.19.0", now - secs(20));
    let ping = |name: &str| Action::Ping {
        candidates: vec![name.into()],
    };
    let decide_long = |c: &Candidate| {
        decide(
            std::slice::from_ref(c),
            Some(&lapsed_lease),
            None,
            now,
            &long,
        )
    };
    let other = |c: &Candidate| Candidate {
        name: "other".into(),
        ..c.clone()
    };
    for c in [&answered_in_term, &renewed, &answered_before_term] {
        assert_eq!(decide_long(c).action, ping("lapsed"), "{c:?}");
    }
    // Anyone else must have answered a ping sent during the lapsed term: not on a renewal, nor
    // on an answer from before the term (two dead candidates would otherwise take turns).
    assert_eq!(
        decide_long(&other(&answered_in_term)).action,
        assign_after_lapse("other", "lapsed")
    );
    for c in [&renewed, &answered_before_term] {
        assert_eq!(decide_long(&other(c)).action, ping("other"), "{c:?}");
    }
    // Without an acquire time, since the lapse.
    let unstamped = Lease {
        term_seen: None,
        ..lapsed_lease.clone()
    };
    assert_eq!(
        decide(
            &[other(&answered_in_term)],
            Some(&unstamped),
            None,
            now,
            &long
        )
        .action,
        ping("other")
    );
    // A released lease is no lapse: the best candidate gets it back...
    assert_eq!(act(&cands, Some(&lease(None, 15)), now), assign("lapsed"));
    // ...unless it is the one that released it, and someone else at its versions can lead.
    let released = Lease {
        released_by: Some("lapsed".into()),
        ..lease(None, 0)
    };
    let equal = acked("equal", "1.19.0", now);
    assert_eq!(
        act(&[cands[0].clone(), equal], Some(&released), now),
        assign("equal")
    );
    assert_eq!(act(&cands[..1], Some(&released), now), assign("lapsed"));
    // A newer version does not take charge while the older one that stepped down still runs
    // (the one it stepped down for went away): it gets its lease back.
    assert_eq!(act(&cands, Some(&released), now), assign("lapsed"));
    // The equal it stepped down for went silent (unresponsive: no longer eligible): the one
    // that stepped down is asked again, and the newer one still waits.
    let silent = Candidate {
        ping: our_ping(now - secs(6), false),
        renewed_lately: false,
        ..acked("equal", "1.19.0", now)
    };
    let stepped_down = Candidate {
        ping: our_ping(now - secs(30), true),
        renewed_lately: false,
        ..acked("lapsed", "1.19.0", now)
    };
    let released_now = Lease {
        released_by: Some("lapsed".into()),
        ..lease(None, 1)
    };
    assert_eq!(
        act(
            &[stepped_down, silent, acked("newer", "1.20.0", now)],
            Some(&released_now),
            now
        ),
        Action::Ping {
            candidates: vec!["lapsed".into()]
        }
    );
}

#[test]
fn no_acknowledged_candidate_is_reported() {
    let now = t0() + secs(120);
    let silent = Candidate {
        ping: our_ping(now - secs(60), false),
        renewed_lately: false,
        ..acked("id-1", "1.19.0", now)
    };
    let d = decide(&[silent], None, None, now, &Rules::default());
    assert_eq!(d.action, Action::NoEligibleCandidate);
    assert_eq!(
        d.standings["id-1"],
        Standing::Ineligible(Reason::Unresponsive)
    );
}

#[test]
fn candidates_that_could_not_win_are_not_waited_for() {
    let now = t0() + secs(60);
    let pending = Candidate {
        ping: our_ping(now, false),
        renewed_lately: false,
        ..acked("id-2", "1.20.0", now)
    };
    let cands = [
        acked("id-1", "1.19.0", now),
        pending,
        never_pinged("id-3", "1.21.0"),
    ];
    assert_eq!(act(&cands, None, now), create("id-1"));
    // An unknown candidate that could outrank it is asked first.
    let cands = [acked("id-1", "1.19.0", now), never_pinged("id-0", "1.18.0")];
    assert_eq!(
        act(&cands, None, now),
        Action::Ping {
            candidates: vec!["id-0".into()]
        }
    );
}

#[test]
fn outstanding_ping_is_waited_for() {
    let now = t0() + secs(60);
    let pinged = Candidate {
        ping: our_ping(now, false),
        renewed_lately: false,
        ..acked("id-1", "1.19.0", now)
    };
    assert_eq!(
        act(&[pinged.clone(), acked("id-2", "1.20.0", now)], None, now),
        Action::WaitForAcks
    );
    // After the window, the silent one no longer blocks.
    let later = now + secs(5);
    let d = decide(
        &[pinged, acked("id-2", "1.20.0", later)],
        None,
        None,
        later,
        &Rules::default(),
    );
    assert_eq!(d.action, create("id-2"));
}

#[test]
fn third_party_strategy_creates_a_holderless_lease_and_never_touches_the_holder() {
    let now = t0();
    let c = Candidate {
        strategy: "foo.com/bar".into(),
        emulation_version: None,
        ..acked("id-1", "1.19.0", now)
    };
    let strategy = "foo.com/bar".to_string();
    assert_eq!(
        act(std::slice::from_ref(&c), None, now),
        Action::CreateLease {
            holder: None,
            strategy: strategy.clone()
        }
    );
    let expired = lease(Some("id-expired"), 100);
    assert_eq!(
        act(std::slice::from_ref(&c), Some(&expired), now),
        Action::SetStrategy {
            strategy: strategy.clone()
        }
    );
    let tagged = Lease {
        strategy: Some(strategy),
        ..expired
    };
    assert_eq!(
        act(std::slice::from_ref(&c), Some(&tagged), now),
        Action::Nothing
    );
    // Its candidates go back to OldestEmulationVersion: an election, whose assignment writes
    // that strategy on the Lease (not a write of its own: it would make the expired holder's
    // record new, and live for another duration).
    let back = Candidate {
        strategy: OEV.into(),
        emulation_version: Some("1.19.0".into()),
        ..c
    };
    assert_eq!(
        act(std::slice::from_ref(&back), Some(&tagged), now),
        assign_after_lapse("id-1", "id-expired")
    );
}

// ---- beyond upstream ----

#[test]
fn live_holder_that_is_best_is_left_alone() {
    let now = t0();
    let cands = [acked("id-1", "1.19.0", now), acked("id-2", "1.20.0", now)];
    assert_eq!(
        act(&cands, Some(&lease(Some("id-1"), 3)), now),
        Action::Nothing
    );
}

#[test]
fn an_equal_version_never_takes_over_from_a_live_holder() {
    // "a" sorts first (name) but has the same versions: the live holder "b" keeps the lease.
    let now = t0();
    let cands = [acked("a", "1.19.0", now), acked("b", "1.19.0", now)];
    assert_eq!(
        act(&cands, Some(&lease(Some("b"), 1)), now),
        Action::Nothing
    );
    // It would still win an election.
    assert_eq!(act(&cands, Some(&lease(None, 1)), now), assign("a"));
}

#[test]
fn stale_preferred_holder_is_cleared() {
    // kep4355.md E4: the preferred candidate went away; upstream stalls.
    let now = t0();
    let requested = Lease {
        preferred_holder: Some("gone".into()),
        ..lease(Some("id-1"), 3)
    };
    assert_eq!(
        act(&[acked("id-1", "1.19.0", now)], Some(&requested), now),
        Action::ClearPreferredHolder
    );
}

#[test]
fn released_lease_is_assigned_at_once() {
    let now = t0();
    let released = Lease {
        preferred_holder: Some("id-2".into()),
        ..lease(None, 0)
    };
    let cands = [acked("id-1", "1.20.0", now), acked("id-2", "1.19.0", now)];
    assert_eq!(act(&cands, Some(&released), now), assign("id-2"));
}

#[test]
fn a_candidate_whose_registered_process_exited_is_passed_over_but_a_live_holder_is_not() {
    let now = t0();
    let exited = |name: &str, version: &str| Candidate {
        pod: PodState::ProcessExited,
        ..acked(name, version, now)
    };
    // The best candidate (the oldest version) restarts: the next one is elected, and the
    // restarting one is neither pinged nor waited for.
    let cands = [exited("old", "1.19.0"), never_pinged("new", "1.20.0")];
    let d = decide(&cands, Some(&lease(None, 1)), None, now, &Rules::default());
    assert_eq!(
        d.action,
        Action::Ping {
            candidates: vec!["new".into()]
        }
    );
    assert_eq!(
        d.standings["old"],
        Standing::Ineligible(Reason::PodNotRunning(PodState::ProcessExited))
    );
    let cands = [exited("old", "1.19.0"), acked("new", "1.20.0", now)];
    assert_eq!(act(&cands, Some(&lease(None, 1)), now), assign("new"));
    // While its term runs, the holder is judged by its term (the process that took it), not
    // by the one its candidate names: a newer candidate is not asked to take over.
    let cands = [exited("old", "1.19.0"), acked("new", "1.20.0", now)];
    let d = decide(
        &cands,
        Some(&lease(Some("old"), 1)),
        None,
        now,
        &Rules::default(),
    );
    assert_eq!(d.action, Action::Nothing);
    assert!(matches!(d.standings["old"], Standing::Eligible(_)));
    // Once the term lapsed it is a candidate like any other.
    assert_eq!(
        act(&cands, Some(&lease(Some("old"), 20)), now),
        assign_after_lapse("new", "old")
    );
}

/// Trust-boundary item 4: a Lease the arbiter did not make (a client-go Lease kept under
/// `arbiter run`) is waited out, unchanged for its duration, then taken over like one nobody
/// holds: its holder, even if a candidate has its name, never held an arbiter term.
#[test]
fn a_foreign_lease_is_waited_out_then_taken_over() {
    let now = t0();
    let foreign = |unchanged_for: u64| Lease {
        foreign: true,
        term: 7,
        ..lease(Some("m1"), unchanged_for)
    };
    let cands = [acked("m1", "1.30.0", now), acked("m2", "1.31.0", now)];
    assert_eq!(
        act(&cands, Some(&foreign(3)), now),
        Action::WaitForForeign {
            holder: "m1".into(),
            remaining: Duration::from_secs(12)
        }
    );
    // Its holder, m1 (the best), is not passed over as a lapsed holder would be.
    assert_eq!(act(&cands, Some(&foreign(15)), now), assign("m1"));
    // Nobody holds it: taken over at once.
    let unheld = Lease {
        holder: None,
        ..foreign(0)
    };
    assert_eq!(act(&cands, Some(&unheld), now), assign("m1"));
    // A hand-made handover request or release on it means nothing.
    let edited = Lease {
        preferred_holder: Some("m2".into()),
        released_by: Some("m1".into()),
        ..foreign(15)
    };
    assert_eq!(act(&cands, Some(&edited), now), assign("m1"));
    // Under a third-party strategy the arbiter leaves it alone.
    let third = [Candidate {
        strategy: "example.com/other".into(),
        ..acked("m1", "1.30.0", now)
    }];
    assert_eq!(act(&third, Some(&foreign(30)), now), Action::Nothing);
}

/// Trust-boundary item 10: candidates started together register a moment apart. An election
/// with no live holder waits until none has registered for the settle time, so the oldest
/// version leads from the first term (not the first to register, which would then be asked to
/// hand over: a newer version leading meanwhile).
#[test]
fn an_election_without_a_live_holder_waits_for_registrations_to_settle() {
    let now = t0() + secs(60);
    let registered = |name: &str, version: &str, ago_ms: i64| Candidate {
        registered: Some(now - SignedDuration::from_millis(ago_ms)),
        renewed_lately: true,
        ping: None,
        ..acked(name, version, now)
    };
    // The newer one registered 1.8 s ago, the older 0.3 s ago: wait 1.7 s more.
    let cands = [
        registered("new", "1.31.0", 1800),
        registered("old", "1.30.0", 300),
    ];
    assert_eq!(
        act(&cands, None, now),
        Action::Settle {
            remaining: Duration::from_millis(1700)
        }
    );
    // Two seconds after the last registration: the oldest version, at term 1.
    let settled = [
        registered("new", "1.31.0", 3500),
        registered("old", "1.30.0", 2000),
    ];
    assert_eq!(act(&settled, None, now), create("old"));
    // After a term ended, a pool started again all over (every candidate registered after
    // the lease became electable, or within the settle before; here a release 1 s ago) is
    // gathered as a first election is: until no candidate has registered for the settle.
    let released = Lease {
        holder: None,
        released_by: Some("gone".into()),
        ..lease(None, 1)
    };
    let restarted = [
        registered("new", "1.31.0", 900),
        registered("old", "1.30.0", 300),
    ];
    assert_eq!(
        act(&restarted, Some(&released), now),
        Action::Settle {
            remaining: Duration::from_millis(1700)
        }
    );
    // Even once the first of them has registered over a settle ago: it came 0.1 s before the
    // release (1 s ago), with the rest.
    let restarting = [
        registered("new", "1.32.0", 2100),
        registered("old", "1.31.0", 300),
    ];
    assert_eq!(
        act(&restarting, Some(&released), now),
        Action::Settle {
            remaining: Duration::from_millis(1700)
        }
    );
    // But candidates that were there before had their time to be counted: whenever one of
    // them can lead, the election is at once. Here the lapsed holder registered again 0.5 s
    // ago (it is passed over anyway).
    let after = [
        registered("old", "1.30.0", 500),
        acked("new", "1.31.0", now),
    ];
    assert_eq!(
        act(&after, Some(&lease(Some("old"), 15)), now),
        assign_after_lapse("new", "old")
    );
    let at_once = |newcomer: Candidate| {
        act(
            &[newcomer, acked("old", "1.30.0", now)],
            Some(&released),
            now,
        )
    };
    assert_eq!(
        at_once(registered("new", "1.31.0", 100)),
        assign("old"),
        "a release goes to the candidate that was there at once"
    );
    assert_eq!(
        at_once(registered("twin", "1.30.0", 100)),
        assign("old"),
        "an equal newcomer changes nothing"
    );
    // A rollback's pod registered a moment before the holder stopped (a Deployment stops an
    // old pod once a new one is ready): elected at once, with those there before. An older
    // one still that comes a moment later is handed over to once the pool has settled.
    assert_eq!(
        at_once(registered("older", "1.29.0", 800)),
        Action::Ping {
            candidates: vec!["older".into()]
        },
        "a better newcomer is asked at once (it must answer since the release)"
    );
    // A registration of a candidate that cannot lead (its pod not running) holds nothing up.
    let gone = Candidate {
        pod: PodState::Stopped,
        ..registered("gone", "1.29.0", 100)
    };
    assert_eq!(
        act(&[settled[0].clone(), settled[1].clone(), gone], None, now),
        create("old")
    );
    // --settle 0s: never.
    let rules = Rules {
        settle: Duration::ZERO,
        ..Rules::default()
    };
    assert_eq!(
        decide(&cands, None, None, now, &rules).action,
        create("old")
    );
    // At most an ack window (5 s) after the lease became electable: a candidate registering
    // again and again (or recreated) does not hold it up for ever.
    let flapping = [
        registered("first", "1.31.0", 4600),
        registered("flapper", "1.30.0", 100),
    ];
    assert_eq!(
        act(&flapping, None, now),
        Action::Settle {
            remaining: Duration::from_millis(400)
        },
        "0.4 s left of the ack window since the first registration"
    );
    let later = [
        registered("first", "1.31.0", 5100),
        registered("flapper", "1.30.0", 100),
    ];
    assert_eq!(act(&later, None, now), create("flapper"));
    // After an expiry, counted from the expiry.
    let expired_long_ago = lease(Some("gone"), 40);
    assert_eq!(
        act(&after, Some(&expired_long_ago), now),
        Action::Ping {
            candidates: vec!["old".into()]
        },
        "the restarted old holder registered 0.5 s ago, but the lease has been electable for 25 s: no settling (its renewal does not count after a lapse: it is pinged)"
    );
}

/// A better candidate that registers while a live holder leads is asked for only once the
/// pool has settled: the holder works meanwhile (candidates started together are counted, and
/// it hands over once, to the oldest of them), and its release then goes to the target at once.
#[test]
fn a_handover_is_asked_for_once_the_pool_has_settled() {
    let now = t0() + secs(60);
    let live = Lease {
        term_seen: Some(t0()),
        ..lease(Some("new"), 1)
    };
    let registered = |name: &str, version: &str, ago_ms: i64| Candidate {
        registered: Some(now - SignedDuration::from_millis(ago_ms)),
        ..acked(name, version, now)
    };
    // The target answered a ping of this term, but registered 0.3 s ago: the holder keeps
    // working 1.7 s more.
    let cands = [
        acked("new", "1.31.0", now),
        registered("old", "1.30.0", 300),
    ];
    assert_eq!(
        act(&cands, Some(&live), now),
        Action::Settle {
            remaining: Duration::from_millis(1700)
        }
    );
    // It is pinged only once the pool has settled: its answer is fresh when the holder is
    // asked (one given at its registration could come from a process gone since).
    let unknown = |ago_ms| {
        [
            acked("new", "1.31.0", now),
            Candidate {
                ping: None,
                renewed_lately: true,
                ..registered("old", "1.30.0", ago_ms)
            },
        ]
    };
    assert_eq!(
        act(&unknown(300), Some(&live), now),
        Action::Settle {
            remaining: Duration::from_millis(1700)
        }
    );
    assert_eq!(
        act(&unknown(2000), Some(&live), now),
        Action::Ping {
            candidates: vec!["old".into()]
        }
    );
    // Any candidate that can lead registering holds it: an even older one may follow.
    let another = [
        acked("new", "1.31.0", now),
        registered("old", "1.30.0", 2500),
        registered("other", "1.31.0", 500),
    ];
    assert_eq!(
        act(&another, Some(&live), now),
        Action::Settle {
            remaining: Duration::from_millis(1500)
        }
    );
    // At most an ack window after the target registered.
    let flapping = [
        acked("new", "1.31.0", now),
        registered("old", "1.30.0", 4800),
        registered("other", "1.31.0", 100),
    ];
    assert_eq!(
        act(&flapping, Some(&live), now),
        Action::Settle {
            remaining: Duration::from_millis(200)
        }
    );
    // Settled: asked.
    let settled = [
        acked("new", "1.31.0", now),
        registered("old", "1.30.0", 2000),
    ];
    assert_eq!(
        act(&settled, Some(&live), now),
        Action::RequestHandover { to: "old".into() }
    );
    // Once asked, it is waited for, whoever registers.
    let asked = Lease {
        preferred_holder: Some("old".into()),
        ..live.clone()
    };
    assert_eq!(
        act(&another, Some(&asked), now),
        Action::WaitForRelease { to: "old".into() }
    );
    // The release goes to the target at once: it registered before the lease was released.
    let released = Lease {
        holder: None,
        released_by: Some("new".into()),
        preferred_holder: Some("old".into()),
        ..lease(None, 0)
    };
    let after = [
        registered("new", "1.31.0", 50),
        registered("old", "1.30.0", 2100),
    ];
    assert_eq!(act(&after, Some(&released), now), assign("old"));
    // --settle 0s: asked at once.
    let rules = Rules {
        settle: Duration::ZERO,
        ..Rules::default()
    };
    assert_eq!(
        decide(&cands, Some(&live), None, now, &rules).action,
        Action::RequestHandover { to: "old".into() }
    );
}

#[test]
fn holder_is_replaced_at_once_only_on_proof_about_what_took_its_term() {
    let now = t0();
    // Its candidate names a pod that stopped (its ownerReferences re-pointed by hand, or a
    // replacement pod of the same name registered and ended): a claim about some pod, not
    // about the one the term was assigned in. The term runs on.
    let repointed = Candidate {
        pod: PodState::Stopped,
        ..acked("id-1", "1.19.0", now)
    };
    let cands = [repointed, acked("id-2", "1.20.0", now)];
    assert_eq!(
        act(&cands, Some(&lease(Some("id-1"), 1)), now),
        Action::Nothing
    );
    // The caller's proof (the recorded pod stopped, or the process that took the term ended).
    let proven = Lease {
        holder_pod_stopped: true,
        ..lease(Some("id-1"), 1)
    };
    assert_eq!(act(&cands, Some(&proven), now), assign("id-2"));
}

#[test]
fn holder_whose_pod_stopped_is_replaced_even_after_its_candidate_is_gone() {
    // The candidate was garbage-collected with its pod; the lease remembers the pod.
    let now = t0();
    let gone = Lease {
        holder_pod_stopped: true,
        ..lease(Some("id-1"), 1)
    };
    assert_eq!(
        act(&[acked("id-2", "1.20.0", now)], Some(&gone), now),
        assign("id-2")
    );
}

#[test]
fn holder_whose_pod_vanished_waits_for_expiry() {
    // A force-deleted pod is no proof that its processes stopped.
    let now = t0();
    let vanished = Candidate {
        pod: PodState::Missing,
        ..acked("id-1", "1.19.0", now)
    };
    let cands = [vanished.clone(), acked("id-2", "1.20.0", now)];
    // While its term runs it is judged by the term: still the best, nobody is asked to take
    // over.
    assert_eq!(
        act(&cands, Some(&lease(Some("id-1"), 1)), now),
        Action::Nothing
    );
    assert_eq!(
        act(&cands, Some(&lease(Some("id-1"), 15)), now),
        assign_after_lapse("id-2", "id-1")
    );
}

fn previous(holder: &str, quiet_for: u64) -> Previous {
    Previous {
        holder: holder.into(),
        quiet_for: Duration::from_secs(quiet_for),
        duration: Duration::from_secs(15),
        pod_stopped: false,
    }
}

fn decide_after(
    cands: &[Candidate],
    lease: Option<&Lease>,
    prev: &Previous,
    now: Timestamp,
) -> Action {
    decide(cands, lease, Some(prev), now, &Rules::default()).action
}

#[test]
fn hand_edits_do_not_end_a_term() {
    let now = t0();
    let cands = [acked("id-1", "1.19.0", now), acked("id-2", "1.20.0", now)];
    let wait = |left: u64| Action::WaitForTerm {
        holder: "id-1".into(),
        remaining: Duration::from_secs(left),
    };
    // The Lease deleted 4 s after id-1's last renew: nobody before its 15 s are over.
    assert_eq!(
        decide_after(&cands, None, &previous("id-1", 4), now),
        wait(11)
    );
    // Its holder cleared (by hand: not released by id-1 itself), or replaced by hand.
    let cleared = lease(None, 0);
    assert_eq!(
        decide_after(&cands, Some(&cleared), &previous("id-1", 4), now),
        wait(11)
    );
    let replaced = lease(Some("id-2"), 0);
    assert_eq!(
        decide_after(&cands, Some(&replaced), &previous("id-1", 4), now),
        wait(11)
    );
    // Once the term is over on the arbiter's clock, the election goes on as usual (and the
    // lapsed holder is not preferred: here it is the only one alive, so it is re-elected).
    assert_eq!(
        decide_after(&cands, None, &previous("id-1", 15), now),
        create("id-1")
    );
    // The Lease still names the holder: the ordinary rules (here: live holder, nothing to do).
    assert_eq!(
        decide_after(
            &cands,
            Some(&lease(Some("id-1"), 1)),
            &previous("id-1", 1),
            now
        ),
        Action::Nothing
    );
}

#[test]
fn a_term_ends_early_only_by_the_holders_release_or_its_stopped_pod() {
    let now = t0();
    let cands = [acked("id-1", "1.19.0", now), acked("id-2", "1.19.0", now)];
    let released = Lease {
        released_by: Some("id-1".into()),
        ..lease(None, 0)
    };
    assert_eq!(
        decide_after(&cands, Some(&released), &previous("id-1", 1), now),
        assign("id-2")
    );
    // Released "by" someone else is a hand edit.
    let forged = Lease {
        released_by: Some("id-2".into()),
        ..lease(None, 0)
    };
    assert!(matches!(
        decide_after(&cands, Some(&forged), &previous("id-1", 1), now),
        Action::WaitForTerm { .. }
    ));
    let stopped = Previous {
        pod_stopped: true,
        ..previous("id-1", 1)
    };
    assert!(matches!(
        decide_after(&cands, Some(&lease(None, 0)), &stopped, now),
        Action::Assign { .. }
    ));
    // A pod stopped according to the Lease's annotation alone (editable by hand) is not enough.
    let annotated = Lease {
        holder_pod_stopped: true,
        ..lease(None, 0)
    };
    assert!(matches!(
        decide_after(&cands, Some(&annotated), &previous("id-1", 1), now),
        Action::WaitForTerm { .. }
    ));
}

#[test]
fn unknown_better_candidate_is_pinged_before_a_handover() {
    let now = t0() + secs(60);
    let cands = [acked("id-1", "1.20.0", now), never_pinged("id-2", "1.19.0")];
    assert_eq!(
        act(&cands, Some(&lease(Some("id-1"), 1)), now),
        Action::Ping {
            candidates: vec!["id-2".into()]
        }
    );
}

#[test]
fn strategy_conflict_changes_nothing() {
    let now = t0();
    let other = Candidate {
        strategy: "foo.com/bar".into(),
        ..acked("id-2", "1.20.0", now)
    };
    let d = decide(
        &[acked("id-1", "1.20.0", now), other],
        Some(&lease(None, 100)),
        None,
        now,
        &Rules::default(),
    );
    assert_eq!(d.action, Action::StrategyConflict);
    assert!(matches!(d.strategy, Resolution::Conflict { .. }));
}

#[test]
fn candidates_that_cannot_be_ranked_are_ineligible() {
    let now = t0();
    let bad = Candidate {
        binary_version: "abc".into(),
        ..acked("bad", "1.0.0", now)
    };
    let no_emulation = Candidate {
        emulation_version: None,
        strategy: "foo.com/bar".into(),
        ..acked("noemu", "1.0.0", now)
    };
    let pending_pod = Candidate {
        pod: PodState::NotRunning,
        ..acked("pending", "1.0.0", now)
    };
    let d = decide(
        &[bad, no_emulation, pending_pod, acked("ok", "1.20.0", now)],
        None,
        None,
        now,
        &Rules::default(),
    );
    assert_eq!(d.action, create("ok"));
    assert!(matches!(
        d.standings["bad"],
        Standing::Ineligible(Reason::InvalidVersion(_))
    ));
    assert_eq!(
        d.standings["noemu"],
        Standing::Ineligible(Reason::NoEmulationVersion)
    );
    assert_eq!(
        d.standings["pending"],
        Standing::Ineligible(Reason::PodNotRunning(PodState::NotRunning))
    );
    assert_eq!(d.standings["ok"], Standing::Eligible(Liveness::Acked));
}

#[test]
fn skew_is_reported_and_refused_when_asked() {
    let now = t0();
    let cands = [
        acked("old", "1.30.0", now),
        acked("new", "1.33.0", now),
        acked("near", "1.31.0", now),
    ];
    let report = Rules {
        max_skew: Some(1),
        ..Rules::default()
    };
    let d = decide(&cands, None, None, now, &report);
    assert_eq!(
        d.skew_violations
            .iter()
            .map(|v| v.candidate.as_str())
            .collect::<Vec<_>>(),
        ["new"]
    );
    assert_eq!(d.standings["new"], Standing::Eligible(Liveness::Acked));
    let refuse = Rules {
        refuse_skew: true,
        ..report
    };
    let d = decide(&cands, None, None, now, &refuse);
    assert!(
        matches!(&d.standings["new"], Standing::Ineligible(Reason::Skew(v)) if v.oldest.to_string() == "1.30.0")
    );
    assert_eq!(d.action, create("old"));
}

#[test]
fn liveness_from_the_arbiters_own_ping() {
    let rules = Rules::default();
    let now = t0() + secs(100);
    // (seconds since the ping was sent, since the watch showed it, answered)
    let at = |sent: Option<i64>, shown: Option<i64>, answered: bool| {
        let c = Candidate {
            ping: sent.map(|s| Ping {
                sent: now - secs(s),
                shown: shown.map(|s| now - secs(s)),
                answered,
            }),
            renewed_lately: false,
            ..acked("c", "1.0.0", now)
        };
        liveness(&c, now, &rules)
    };
    assert_eq!(at(None, None, false), Liveness::Unknown);
    assert_eq!(at(Some(2), Some(2), true), Liveness::Acked);
    assert_eq!(
        at(Some(10), Some(10), true),
        Liveness::Acked,
        "for the ack validity from the ping"
    );
    assert_eq!(
        at(Some(60), Some(60), true),
        Liveness::Unknown,
        "an old ack proves nothing now"
    );
    assert_eq!(at(Some(2), Some(2), false), Liveness::Pending);
    assert_eq!(at(Some(6), Some(6), false), Liveness::Unresponsive);
    assert_eq!(
        at(Some(8), Some(2), false),
        Liveness::Pending,
        "the window counts from when the watch showed the ping"
    );
    assert_eq!(
        at(Some(8), None, false),
        Liveness::Pending,
        "not shown yet: its answer may be on its way in the same watch"
    );
    assert_eq!(
        at(Some(10), None, false),
        Liveness::Unresponsive,
        "... for the ack validity at most"
    );
    // Sent ahead of `now` (never, on one clock): as sent now.
    assert_eq!(at(Some(-30), Some(-30), false), Liveness::Pending);
}

/// The trace of issue 17: `d2` was elected after `d1` lapsed; `d1` is better, and its last
/// acknowledgement (before `d2`'s term began) still looks fresh. It must answer again, during
/// `d2`'s term, before `d2` is asked to hand over to it.
#[test]
fn a_handover_target_must_answer_during_the_current_term() {
    let now = t0() + secs(100);
    let term_began = now - secs(2);
    let holder = Lease {
        term_seen: Some(term_began),
        ..lease(Some("d2"), 1)
    };
    let mut d1 = acked("d1", "1.30.0", now - secs(3));
    let d2 = acked("d2", "1.31.0", now);
    assert_eq!(
        act(&[d1.clone(), d2.clone()], Some(&holder), now),
        Action::Ping {
            candidates: vec!["d1".into()]
        },
        "an answer from before the term began does not count"
    );
    d1.ping = our_ping(now - secs(1), false);
    assert_eq!(
        act(&[d1.clone(), d2.clone()], Some(&holder), now),
        Action::WaitForAcks
    );
    d1.ping = our_ping(now - secs(6), false);
    assert_eq!(
        act(&[d1.clone(), d2.clone()], Some(&holder), now),
        Action::Nothing,
        "no answer: the live holder stays, and is not asked again"
    );
    d1 = acked("d1", "1.30.0", now - secs(1));
    assert_eq!(
        act(&[d1, d2], Some(&holder), now),
        Action::RequestHandover { to: "d1".into() }
    );
}

/// After a release, the next holder must have answered since the arbiter saw the release.
#[test]
fn after_a_release_the_next_holder_must_answer_again() {
    let now = t0() + secs(100);
    let released = Lease {
        released_by: Some("d2".into()),
        preferred_holder: Some("d1".into()),
        ..lease(None, 1)
    };
    let d2 = acked("d2", "1.31.0", now);
    let stale = acked("d1", "1.30.0", now - secs(3));
    assert_eq!(
        act(&[stale, d2.clone()], Some(&released), now),
        Action::Ping {
            candidates: vec!["d1".into()]
        }
    );
    let fresh = acked("d1", "1.30.0", now - secs(0));
    assert_eq!(act(&[fresh, d2], Some(&released), now), assign("d1"));
}

#[test]
fn a_withdrawn_candidate_is_never_elected() {
    let now = t0() + secs(100);
    let gone = Candidate {
        withdrawn: true,
        ..acked("old", "1.30.0", now)
    };
    let other = acked("new", "1.31.0", now);
    let d = decide(
        &[gone.clone(), other.clone()],
        Some(&lease(Some("old"), 20)),
        None,
        now,
        &Rules::default(),
    );
    assert_eq!(d.action, assign_after_lapse("new", "old"));
    assert_eq!(d.standings["old"], Standing::Ineligible(Reason::Withdrawn));
    // Nor is it a handover target, nor does its strategy count.
    let holder = lease(Some("new"), 1);
    assert_eq!(act(&[gone, other], Some(&holder), now), Action::Nothing);
}

/// `arbiter handover`: a planned switchover picks among equals, never a newer version.
#[test]
fn a_planned_switchover_goes_to_an_equal_and_never_to_a_newer_version() {
    let now = t0() + secs(100);
    let h = acked("h", "1.30.0", now);
    let twin = acked("twin", "1.30.0", now);
    let newer = acked("newer", "1.31.0", now);
    let asked = |to: Option<&str>| Lease {
        switchover: Some(Switchover {
            to: to.map(str::to_string),
            holder: "h".into(),
            term: 1,
        }),
        term_seen: Some(now - secs(5)),
        ..lease(Some("h"), 1)
    };
    let all = [h.clone(), twin.clone(), newer.clone()];
    assert_eq!(
        act(&all, Some(&asked(Some("twin"))), now),
        Action::RequestHandover { to: "twin".into() }
    );
    assert_eq!(
        act(&all, Some(&asked(None)), now),
        Action::RequestHandover { to: "twin".into() },
        "the best other candidate at the elected versions"
    );
    let refused = |to: Option<&str>, cands: &[Candidate]| match act(cands, Some(&asked(to)), now) {
        Action::RefuseSwitchover { reason } => reason,
        other => panic!("{to:?}: {other:?}"),
    };
    assert!(refused(Some("newer"), &all).contains("the rules elect"));
    assert!(refused(Some("h"), &all).contains("already holds"));
    assert!(refused(Some("nobody"), &all).contains("not an eligible candidate"));
    assert!(refused(None, &[h.clone(), newer.clone()]).contains("no other eligible candidate"));
    // A twin whose last answer predates the term is asked again first.
    let stale = acked("twin", "1.30.0", now - secs(8));
    assert_eq!(
        act(&[h.clone(), stale], Some(&asked(Some("twin"))), now),
        Action::Ping {
            candidates: vec!["twin".into()]
        }
    );
    // Asked and not yet released: wait for the holder.
    let asked_twin = Lease {
        preferred_holder: Some("twin".into()),
        ..asked(Some("twin"))
    };
    assert_eq!(
        act(&[h.clone(), twin.clone()], Some(&asked_twin), now),
        Action::WaitForRelease { to: "twin".into() }
    );
    // Asked of h at term 1; the lease has moved on to term 2: refused, never carried out.
    let moved = Lease {
        term: 2,
        ..asked(Some("twin"))
    };
    assert!(matches!(
        act(&[h.clone(), twin.clone()], Some(&moved), now),
        Action::RefuseSwitchover { reason } if reason.contains("moved on")
    ));
    // Released for twin2, an equal of the older twin: twin2 gets it, not the older equal.
    let twin2 = Candidate {
        created: t0() + secs(1),
        ..acked("twin2", "1.30.0", now)
    };
    let released_for_twin2 = Lease {
        released_by: Some("h".into()),
        preferred_holder: Some("twin2".into()),
        ..lease(None, 0)
    };
    assert_eq!(
        act(
            &[h.clone(), twin.clone(), twin2],
            Some(&released_for_twin2),
            now
        ),
        assign("twin2")
    );
    // Released for twin2, whose last answer predates the release (as does the older twin's):
    // twin2 is the one asked, and waited for even when the older twin answers first.
    let released_later = Lease {
        unchanged_for: Duration::ZERO,
        ..released_for_twin2
    };
    let before_release = |name: &str, created: i64| Candidate {
        created: t0() + secs(created),
        ..acked(name, "1.30.0", now - secs(1))
    };
    let (old_twin, twin2) = (before_release("twin", 0), before_release("twin2", 1));
    assert_eq!(
        act(
            &[h.clone(), old_twin.clone(), twin2.clone()],
            Some(&released_later),
            now
        ),
        Action::Ping {
            candidates: vec!["twin2".into()]
        }
    );
    let twin2_pinged = Candidate {
        ping: our_ping(now, false),
        ..twin2.clone()
    };
    // (Seen released at `now`, one second before.)
    let later = now + secs(1);
    let released_later = Lease {
        unchanged_for: Duration::from_secs(1),
        ..released_later
    };
    assert_eq!(
        act(
            &[
                h.clone(),
                acked("twin", "1.30.0", later),
                twin2_pinged.clone()
            ],
            Some(&released_later),
            later
        ),
        Action::WaitForAcks
    );
    let twin2_answered = Candidate {
        ping: our_ping(now, true),
        ..twin2_pinged
    };
    assert_eq!(
        act(&[h, old_twin, twin2_answered], Some(&released_later), later),
        assign("twin2")
    );
}

// ---- properties ----

fn candidate_strategy() -> impl Strategy<Value = Candidate> {
    let versions = prop::sample::select(vec![
        "1.29.0",
        "1.30.0",
        "1.30.1",
        "1.31.0-rc.1",
        "1.31.0",
        "2.0.0",
        "abc",
    ]);
    let strategies = prop::sample::select(vec![OEV, OEV, OEV, "foo.com/bar"]);
    let pods = prop::sample::select(vec![
        PodState::NoPod,
        PodState::Running,
        PodState::Running,
        PodState::NotRunning,
        PodState::Stopped,
        PodState::Missing,
        PodState::ProcessExited,
    ]);
    (
        versions.clone(),
        prop::option::weighted(0.9, versions),
        strategies,
        0i64..3,
        prop::option::of(0i64..20),
        prop::option::of(0i64..30),
        pods,
        prop::bool::weighted(0.15),
        prop::bool::weighted(0.3),
        prop::option::of(0i64..8000),
    )
        .prop_map(
            |(
                binary,
                emulation,
                strategy,
                created,
                ping,
                renew,
                pod,
                withdrawn,
                lately,
                registered,
            )| {
                Candidate {
                    name: String::new(),
                    binary_version: binary.into(),
                    emulation_version: emulation.map(str::to_string),
                    strategy: strategy.into(),
                    created: t0() + secs(created),
                    // Answered when the candidate renewed (`renew` seconds ago) after it.
                    ping: ping.map(|s| Ping {
                        sent: t0() + secs(100 - s),
                        shown: Some(t0() + secs(100 - s)),
                        answered: renew.is_some_and(|r| r <= s),
                    }),
                    renewed_lately: lately,
                    pod,
                    withdrawn,
                    // Seen registering `registered` ms ago, or before this process started.
                    registered: registered.map(|ms| now() - SignedDuration::from_millis(ms)),
                }
            },
        )
}

fn candidates_strategy() -> impl Strategy<Value = Vec<Candidate>> {
    prop::collection::vec(candidate_strategy(), 0..7).prop_map(|mut cs| {
        for (i, c) in cs.iter_mut().enumerate() {
            c.name = format!("c{i}");
        }
        cs
    })
}

fn lease_strategy() -> impl Strategy<Value = Option<Lease>> {
    prop::option::of((
        prop::option::of(prop::sample::select(vec!["c0", "c1", "c2", "legacy"])),
        prop::option::of(prop::sample::select(vec!["c0", "c3", "gone"])),
        0u64..30,
        prop::option::of(prop::sample::select(vec!["c0", "c1"])),
        prop::option::of(0i64..30),
        prop::bool::weighted(0.1),
    ))
    .prop_map(|l| {
        l.map(
            |(holder, preferred, unchanged, released_by, acquired, foreign)| Lease {
                preferred_holder: preferred.map(str::to_string),
                released_by: released_by.map(str::to_string),
                term_seen: acquired.map(|s| t0() + secs(100 - s)),
                foreign,
                ..lease(holder, unchanged)
            },
        )
    })
}

fn rules_strategy() -> impl Strategy<Value = Rules> {
    (prop::option::of(0u64..3), any::<bool>()).prop_map(|(max_skew, refuse_skew)| Rules {
        max_skew,
        refuse_skew,
        ..Rules::default()
    })
}

fn now() -> Timestamp {
    t0() + secs(100)
}

/// The holder named by an action, if it names one.
fn elected(action: &Action) -> Option<&str> {
    match action {
        Action::CreateLease {
            holder: Some(h), ..
        }
        | Action::Assign { holder: h, .. } => Some(h),
        Action::RequestHandover { to } => Some(to),
        _ => None,
    }
}

proptest! {
    #[test]
    fn the_settle_only_ever_postpones(
        cands in candidates_strategy(),
        lease in lease_strategy(),
        rules in rules_strategy(),
    ) {
        let without = Rules { settle: Duration::ZERO, ..rules.clone() };
        let d = decide(&cands, lease.as_ref(), None, now(), &rules);
        let at_once = decide(&cands, lease.as_ref(), None, now(), &without);
        prop_assert_eq!(&d.standings, &at_once.standings);
        if !matches!(d.action, Action::Settle { .. }) {
            prop_assert_eq!(&d.action, &at_once.action);
        }
    }

    /// After a term ended (released, expired, its pod stopped), an election waits only when
    /// nobody it could elect was there before (the pool started again). A live holder is asked
    /// to hand over only once the pool has settled.
    #[test]
    fn the_settle_applies_to_first_elections_pools_started_again_and_before_asking(
        cands in candidates_strategy(),
        lease in lease_strategy(),
        rules in rules_strategy(),
    ) {
        let d = decide(&cands, lease.as_ref(), None, now(), &rules);
        let Some(l) = &lease else { return Ok(()) };
        let live = l.holder.is_some() && !l.expired() && !l.holder_pod_stopped;
        let age = |t: Timestamp| Duration::try_from(now().duration_since(t)).unwrap();
        let versions = |c: &Candidate| {
            Some((
                Version::parse(c.emulation_version.as_deref()?).ok()?,
                Version::parse(&c.binary_version).ok()?,
            ))
        };
        let eligible = |c: &&Candidate| {
            matches!(d.standings.get(&c.name), Some(Standing::Eligible(_))) && versions(c).is_some()
        };
        // There before: registered at least a settle before the lease became electable (or
        // before the operator saw it). The holder whose term ended is left out: it is passed
        // over while anyone else can lead.
        let electable_for = if l.expired() && l.holder.is_some() {
            l.unchanged_for.saturating_sub(l.duration)
        } else {
            l.unchanged_for
        };
        let ended = l.holder.as_deref().or(l.released_by.as_deref());
        let from_before = cands.iter().filter(eligible).any(|c| {
            c.registered.is_none_or(|r| age(r) >= electable_for + rules.settle)
                && Some(c.name.as_str()) != ended
        });
        if !live && !l.foreign && l.term > 0 && from_before {
            prop_assert!(!matches!(d.action, Action::Settle { .. }), "{:?}", d.action);
        }
        if let Action::RequestHandover { to } = &d.action {
            let newest = cands.iter().filter(eligible).filter_map(|c| c.registered).max();
            let target = cands.iter().find(|c| &c.name == to).and_then(|c| c.registered);
            prop_assert!(
                newest.is_none_or(|n| age(n) >= rules.settle)
                    || target.is_none_or(|t| age(t) >= rules.ack_window),
                "asked before the pool settled: {:?}", d.action
            );
        }
    }

    #[test]
    fn permuting_candidates_never_changes_the_decision(
        cands in candidates_strategy(),
        lease in lease_strategy(),
        rules in rules_strategy(),
        seed in any::<u64>(),
    ) {
        let before = decide(&cands, lease.as_ref(), None, now(), &rules);
        let mut shuffled = cands.clone();
        // A deterministic shuffle from the seed.
        let mut state = seed;
        for i in (1..shuffled.len()).rev() {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            shuffled.swap(i, (state >> 33) as usize % (i + 1));
        }
        prop_assert_eq!(&before, &decide(&shuffled, lease.as_ref(), None, now(), &rules));
        prop_assert_eq!(&before, &decide(&cands, lease.as_ref(), None, now(), &rules), "deterministic");
    }

    #[test]
    fn only_eligible_acknowledged_candidates_are_elected(
        cands in candidates_strategy(),
        lease in lease_strategy(),
        rules in rules_strategy(),
    ) {
        let d = decide(&cands, lease.as_ref(), None, now(), &rules);
        if let Some(name) = elected(&d.action) {
            prop_assert_eq!(d.standings.get(name), Some(&Standing::Eligible(Liveness::Acked)), "{:?}", d.action);
            let c = cands.iter().find(|c| c.name == name).unwrap();
            prop_assert!(c.pod.electable());
        }
    }

    #[test]
    fn a_live_holder_is_only_asked_to_hand_over_to_a_strictly_better_version(
        cands in candidates_strategy(),
        lease in lease_strategy(),
        rules in rules_strategy(),
    ) {
        let d = decide(&cands, lease.as_ref(), None, now(), &rules);
        if let (Action::RequestHandover { to }, Some(holder)) = (&d.action, lease.as_ref().and_then(|l| l.holder.clone())) {
            let key = |name: &str| cands.iter().find(|c| c.name == name).and_then(|c| {
                Some((Version::parse(c.emulation_version.as_deref()?).ok()?, Version::parse(&c.binary_version).ok()?))
            });
            // (A holder that is itself no longer eligible may go to an equal version.)
            let eligible = matches!(d.standings.get(&holder), Some(Standing::Eligible(_)));
            if let (Some(t), Some(h), true) = (key(to), key(&holder), eligible) {
                prop_assert!(t < h, "handover from {} {:?} to {} {:?}", holder, h, to, t);
            }
        }
    }

    #[test]
    fn a_live_holder_is_only_ever_asked_to_hand_over(
        cands in candidates_strategy(),
        lease in lease_strategy(),
        rules in rules_strategy(),
    ) {
        let Some(l) = &lease else { return Ok(()) };
        let Some(holder) = &l.holder else { return Ok(()) };
        // Whatever pod its candidate names: only the caller's proof ends a term early.
        if l.expired() || l.holder_pod_stopped { return Ok(()) }
        let d = decide(&cands, lease.as_ref(), None, now(), &rules);
        prop_assert!(
            !matches!(d.action, Action::Assign { .. } | Action::CreateLease { .. }),
            "live holder {} replaced: {:?}", holder, d.action
        );
    }

    #[test]
    fn a_handover_target_answered_a_ping_sent_during_the_current_term(
        cands in candidates_strategy(),
        lease in lease_strategy(),
        rules in rules_strategy(),
    ) {
        let d = decide(&cands, lease.as_ref(), None, now(), &rules);
        if let (Action::RequestHandover { to }, Some(Lease { term_seen: Some(began), .. })) = (&d.action, &lease) {
            let c = cands.iter().find(|c| &c.name == to).unwrap();
            let ping = c.ping.unwrap();
            prop_assert!(ping.sent >= *began, "{to} pinged at {}, before the term was seen at {began}", ping.sent);
            prop_assert!(ping.answered, "{to} did not answer its ping");
        }
    }

    #[test]
    fn after_a_release_the_next_holder_answered_since(
        cands in candidates_strategy(),
        lease in lease_strategy(),
        rules in rules_strategy(),
    ) {
        let d = decide(&cands, lease.as_ref(), None, now(), &rules);
        // A release counts only on the arbiter's own Lease: on a foreign one it is a claim.
        let Some(l) = lease.as_ref().filter(|l| !l.foreign) else { return Ok(()) };
        if let (Action::Assign { holder, .. }, None, Some(_)) = (&d.action, &l.holder, &l.released_by) {
            let c = cands.iter().find(|c| &c.name == holder).unwrap();
            let seen = now() - SignedDuration::try_from(l.unchanged_for).unwrap();
            prop_assert!(c.ping.is_some_and(|p| p.sent >= seen && p.answered), "{holder} assigned on an answer from before the release");
        }
    }

    #[test]
    fn a_switchover_never_puts_a_newer_version_in_charge(
        cands in candidates_strategy(),
        lease in lease_strategy(),
        rules in rules_strategy(),
        to in prop::option::of(prop::sample::select(vec!["c0", "c1", "c2", "c3"]).prop_map(str::to_string)),
    ) {
        let Some(l) = lease else { return Ok(()) };
        let sw = Switchover { to, holder: l.holder.clone().unwrap_or_default(), term: l.term };
        let l = Lease { switchover: Some(sw), ..l };
        let d = decide(&cands, Some(&l), None, now(), &rules);
        if let Action::RequestHandover { to } = &d.action {
            let key = |c: &Candidate| Some((
                Version::parse(c.emulation_version.as_deref()?).ok()?,
                Version::parse(&c.binary_version).ok()?,
            ));
            let target = cands.iter().find(|c| &c.name == to).and_then(key);
            for other in cands.iter().filter(|c| matches!(d.standings[&c.name], Standing::Eligible(_))) {
                prop_assert!(target <= key(other), "switchover to {to} {target:?} over {} {:?}", other.name, key(other));
            }
        }
    }

    #[test]
    fn after_a_release_no_newer_version_takes_charge_while_the_one_that_released_can_lead(
        cands in candidates_strategy(),
        lease in lease_strategy(),
        rules in rules_strategy(),
    ) {
        let d = decide(&cands, lease.as_ref(), None, now(), &rules);
        let Some(l) = &lease else { return Ok(()) };
        let (Action::Assign { holder, .. }, None, Some(by)) = (&d.action, &l.holder, &l.released_by) else {
            return Ok(());
        };
        let Some(released) = cands.iter().find(|c| &c.name == by) else { return Ok(()) };
        if !matches!(d.standings[by], Standing::Eligible(_)) { return Ok(()) }
        let key = |c: &Candidate| Some((
            Version::parse(c.emulation_version.as_deref()?).ok()?,
            Version::parse(&c.binary_version).ok()?,
        ));
        let elected = cands.iter().find(|c| &c.name == holder).unwrap();
        prop_assert!(key(elected) <= key(released), "{holder} {:?} elected over {by} {:?}, which released and can still lead", key(elected), key(released));
    }

    #[test]
    fn withdrawn_candidates_are_never_elected(
        cands in candidates_strategy(),
        lease in lease_strategy(),
        rules in rules_strategy(),
    ) {
        let d = decide(&cands, lease.as_ref(), None, now(), &rules);
        if let Some(e) = elected(&d.action) {
            let c = cands.iter().find(|c| c.name == e);
            prop_assert!(c.is_none_or(|c| !c.withdrawn), "{e} elected although withdrawn: {:?}", d.action);
        }
    }

    #[test]
    fn nobody_is_elected_while_a_previous_term_may_run(
        cands in candidates_strategy(),
        lease in lease_strategy(),
        rules in rules_strategy(),
        holder in prop::sample::select(vec!["c0", "c1", "c2", "legacy"]).prop_map(str::to_string),
        quiet in 0u64..30,
    ) {
        let prev = Previous {
            holder: holder.clone(),
            quiet_for: Duration::from_secs(quiet),
            duration: Duration::from_secs(15),
            pod_stopped: false,
        };
        let d = decide(&cands, lease.as_ref(), Some(&prev), now(), &rules);
        let names_it = lease.as_ref().is_some_and(|l| l.holder.as_deref() == Some(holder.as_str()));
        let released = lease.as_ref().is_some_and(|l| l.holder.is_none() && l.released_by.as_deref() == Some(holder.as_str()));
        let pod_stopped = cands.iter().any(|c| c.name == holder && c.pod == PodState::Stopped);
        if let Some(e) = elected(&d.action) && !names_it && !released && !pod_stopped {
            prop_assert!(quiet >= 15, "{e} elected {quiet}s after {holder}'s last record: {:?}", d.action);
        }
    }

    #[test]
    fn pings_go_only_to_unknown_eligible_candidates_that_could_win(
        cands in candidates_strategy(),
        lease in lease_strategy(),
        rules in rules_strategy(),
    ) {
        let d = decide(&cands, lease.as_ref(), None, now(), &rules);
        if let Action::Ping { candidates } = &d.action {
            prop_assert!(!candidates.is_empty());
            let mut sorted = candidates.clone();
            sorted.sort();
            sorted.dedup();
            prop_assert_eq!(&sorted, candidates, "sorted, no repeats");
            let someone_silent = d
                .standings
                .values()
                .any(|s| *s == Standing::Ineligible(Reason::Unresponsive));
            prop_assert!(someone_silent || candidates.len() == 1, "{:?} asked at once", candidates);
            // In an election with no release to answer after (a first one, or after expiry):
            // only candidates never heard from are asked, and only those that would outrank
            // every candidate that answered (the lapsed holder, passed over, aside).
            let election = match &lease {
                None => true,
                Some(l) => l.released_by.is_none() && (l.holder.is_none() || l.expired()),
            };
            if election {
                let lapsed = lease.as_ref().and_then(|l| l.holder.clone());
                let preferred = lease.as_ref().and_then(|l| l.preferred_holder.clone());
                // The election's order: versions, the handover's target among equals, age, name.
                let key = |c: &Candidate| (
                    Version::parse(c.emulation_version.as_deref().unwrap()).unwrap(),
                    Version::parse(&c.binary_version).unwrap(),
                    Some(&c.name) != preferred.as_ref(),
                    c.created,
                    c.name.clone(),
                );
                let (standings, lapsed) = (&d.standings, lapsed.as_ref());
                let rivals = |l: Liveness| cands.iter().filter(move |c| {
                    standings[&c.name] == Standing::Eligible(l) && Some(&c.name) != lapsed
                });
                for name in candidates {
                    prop_assert_eq!(&d.standings[name], &Standing::Eligible(Liveness::Unknown));
                    let me = cands.iter().find(|c| &c.name == name).unwrap();
                    for other in rivals(Liveness::Acked) {
                        prop_assert!(key(me) < key(other), "{} asked though {} answered", name, other.name);
                    }
                    // Asked alone: the best of those yet to answer.
                    if !someone_silent {
                        for other in rivals(Liveness::Unknown).chain(rivals(Liveness::Pending)) {
                            prop_assert!(key(me) <= key(other), "{} asked before better {}", name, other.name);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_elected_candidate_ranks_above_every_candidate_that_could_answer(
        cands in candidates_strategy(),
        lease in lease_strategy(),
        rules in rules_strategy(),
    ) {
        let d = decide(&cands, lease.as_ref(), None, now(), &rules);
        // The lapsed or stepped-down holder is passed over when anyone else can lead.
        let lapsed = lease.as_ref().and_then(|l| match &l.holder {
            Some(h) if l.expired() => Some(h.clone()),
            Some(_) => None,
            None => l.released_by.clone(),
        });
        if let Action::CreateLease { holder: Some(h), .. } | Action::Assign { holder: h, .. } = &d.action {
            let me = cands.iter().find(|c| &c.name == h).unwrap();
            let key = |c: &Candidate| (
                Version::parse(c.emulation_version.as_deref().unwrap()).unwrap(),
                Version::parse(&c.binary_version).unwrap(),
                c.created,
                c.name.clone(),
            );
            // Every rival that is or could still be alive: waiting for an answer could not
            // have elected anyone better.
            let rivals = cands.iter().filter(|c| matches!(
                d.standings[&c.name],
                Standing::Eligible(Liveness::Acked | Liveness::Pending | Liveness::Unknown)
            ));
            for other in rivals.filter(|c| Some(&c.name) != lapsed.as_ref() || lapsed.as_ref() == Some(h)) {
                prop_assert!(key(me) <= key(other), "{} elected over better {}", h, other.name);
            }
        }
    }
}

#[test]
fn unwrapped_pods_hold_every_election_and_nothing_else() {
    let elections = [
        Action::Assign {
            holder: "a".into(),
            lapsed: None,
        },
        Action::CreateLease {
            holder: Some("a".into()),
            strategy: OEV.into(),
        },
    ];
    for action in elections {
        assert_eq!(
            held_for_unwrapped(action.clone(), 2),
            Action::WaitForUnwrapped {
                holder: "a".into(),
                pods: 2
            }
        );
        assert_eq!(held_for_unwrapped(action.clone(), 0), action);
    }
    let others = [
        Action::Nothing,
        Action::CreateLease {
            holder: None,
            strategy: OEV.into(),
        },
        Action::Ping {
            candidates: vec!["a".into()],
        },
        Action::RequestHandover { to: "b".into() },
        Action::WaitForRelease { to: "b".into() },
        Action::NoEligibleCandidate,
    ];
    for action in others {
        assert_eq!(held_for_unwrapped(action.clone(), 3), action);
    }
}

proptest! {
    /// Whatever the election decides, while an unwrapped pod runs nobody is given the lease.
    #[test]
    fn while_an_unwrapped_pod_runs_nobody_is_elected(
        holder in proptest::option::of(0usize..3),
        live in proptest::collection::vec(any::<bool>(), 0..4),
        unchanged_for in 0u64..40,
        unwrapped in 1usize..4,
    ) {
        let now = t0();
        let candidates: Vec<Candidate> = live
            .iter()
            .enumerate()
            .map(|(i, live)| {
                let name = format!("c{i}");
                if *live { acked(&name, "1.31.0", now) } else { never_pinged(&name, "1.31.0") }
            })
            .collect();
        let l = holder.map(|h| lease(Some(&format!("c{h}")), unchanged_for));
        let d = decide(&candidates, l.as_ref(), None, now, &Rules::default());
        let held = held_for_unwrapped(d.action.clone(), unwrapped);
        prop_assert!(held.elects().is_none(), "{:?} became {:?}", d.action, held);
        prop_assert_eq!(held_for_unwrapped(d.action.clone(), 0), d.action);
    }
}

#[test]
fn an_emulation_version_above_the_binary_version_is_invalid() {
    let now = t0();
    let mut c = acked("a", "1.31.0-rc.2", now);
    c.emulation_version = Some("1.31.0-rc.10".into());
    let d = decide(&[c], None, None, now, &Rules::default());
    assert!(
        matches!(&d.standings["a"], Standing::Ineligible(Reason::InvalidVersion(e)) if e.input == "1.31.0-rc.10"),
        "{:?}",
        d.standings
    );
    let mut ok = acked("b", "1.31.0-rc.10", now);
    ok.emulation_version = Some("1.31.0-rc.2".into());
    let d = decide(&[ok], None, None, now, &Rules::default());
    assert!(
        matches!(d.standings["b"], Standing::Eligible(_)),
        "{:?}",
        d.standings
    );
}
