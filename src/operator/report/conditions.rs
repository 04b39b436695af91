//! Status conditions on LeaseCandidates, derived from a decision.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use k8s_openapi::api::coordination::v1::Lease;

use crate::api::OLDEST_EMULATION_VERSION;
use crate::election::decide::{Action, Decision, PodState, Reason, Standing};
use crate::election::strategy::Resolution;

pub use crate::api::conditions::*;

/// What the conditions are computed from, besides the decision.
pub struct LeaseFacts<'a> {
    pub lease: &'a str,
    pub holder: Option<&'a str>,
    pub term: i32,
    /// Candidates whose identity two live processes are using, with their incarnations.
    pub duplicates: &'a [(String, Vec<String>)],
    /// Candidates whose workload ran past the end of an earlier term (it was paused), by term.
    pub overruns: &'a [(String, i32)],
}

/// A condition. Without `observedGeneration`: `pingTime` and `renewTime` are in the spec (as
/// upstream's LeaseCandidate has them), so every ping, every answer and every refresh (5 min)
/// bumps the generation while changing no condition. Carrying it, the status would have to be
/// rewritten at each (up to three status writes per candidate per election, and one per
/// candidate every refresh in steady state), or else fall behind and make `kubectl wait
/// --for=condition` and kstatus-based health checks wait forever.
fn cond(type_: &str, ok: bool, reason: &str, message: String) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        observed_generation: None,
        last_transition_time: Time(jiff::Timestamp::now()),
    }
}

/// The conditions `candidate` should carry.
pub fn conditions(candidate: &str, decision: &Decision, facts: &LeaseFacts) -> Vec<Condition> {
    vec![
        leader(candidate, decision, facts),
        eligible(candidate, decision),
        conflict(candidate, decision),
        skew(candidate, decision),
        duplicate(candidate, facts),
        double_holder(candidate, facts),
    ]
}

/// The `Leader` condition.
fn leader(candidate: &str, decision: &Decision, facts: &LeaseFacts) -> Condition {
    match (facts.holder, &decision.action) {
        (Some(h), _) if h == candidate => cond(
            LEADER,
            true,
            "Holder",
            format!("holds lease {} at term {}", facts.lease, facts.term),
        ),
        (_, Action::WaitForForeign { holder, .. }) => cond(
            LEADER,
            false,
            "ForeignLease",
            format!(
                "lease {} exists but arbiter did not make it (no label arbiter.dev/managed): {holder}'s term there is waited out, then arbiter takes it over",
                facts.lease
            ),
        ),
        // Not who holds it, nor whether anyone does: every candidate's status would be
        // rewritten at every election, when only the old and the new holder's changed.
        _ => cond(
            LEADER,
            false,
            "NotHolder",
            format!("does not hold lease {}", facts.lease),
        ),
    }
}

/// The `Eligible` condition: the candidate's standing, not its liveness.
fn eligible(candidate: &str, decision: &Decision) -> Condition {
    match decision.standings.get(candidate) {
        // Not the candidate's liveness, which changes with every ping: the condition would be
        // rewritten several times per election for no one's benefit.
        Some(Standing::Eligible(_)) => cond(ELIGIBLE, true, "Eligible", "can be elected".into()),
        Some(Standing::Ineligible(reason)) => {
            let (r, msg) = match reason {
                Reason::InvalidVersion(e) => ("InvalidVersion", e.to_string()),
                Reason::NoEmulationVersion => (
                    "NoEmulationVersion",
                    "OldestEmulationVersion needs an emulationVersion".to_string(),
                ),
                Reason::PodNotRunning(PodState::ProcessExited) => (
                    "PodNotRunning",
                    "the process that registered it exited (its container ended or waits to \
                     restart); eligible again once a new process registers"
                        .to_string(),
                ),
                Reason::PodNotRunning(state) => {
                    ("PodNotRunning", format!("the candidate's pod is {state:?}"))
                }
                Reason::Withdrawn => (
                    "Withdrawn",
                    "its agent stopped its workload and exited; a new process of it registers afresh"
                        .to_string(),
                ),
                Reason::Unresponsive => (
                    "Unresponsive",
                    "did not acknowledge the arbiter's ping".to_string(),
                ),
                Reason::Skew(v) => (
                    "SkewViolation",
                    format!(
                        "binaryVersion {} is too far from the oldest live candidate's {}",
                        v.version, v.oldest
                    ),
                ),
            };
            cond(ELIGIBLE, false, r, msg)
        }
        None => cond(ELIGIBLE, false, "Unknown", "not considered".into()),
    }
}

/// The `StrategyConflict` condition.
fn conflict(candidate: &str, decision: &Decision) -> Condition {
    match &decision.strategy {
        Resolution::Conflict {
            version,
            strategies,
            candidates,
        } if candidates.iter().any(|c| c == candidate) => cond(
            STRATEGY_CONFLICT,
            true,
            "StrategyConflict",
            format!(
                "candidates at binaryVersion {version} declare different strategies ({}); the lease is left unchanged until they agree",
                strategies.join(", ")
            ),
        ),
        _ => cond(
            STRATEGY_CONFLICT,
            false,
            "NoConflict",
            "strategies agree".into(),
        ),
    }
}

/// The `SkewViolation` condition.
fn skew(candidate: &str, decision: &Decision) -> Condition {
    match decision
        .skew_violations
        .iter()
        .find(|v| v.candidate == candidate)
    {
        Some(v) => cond(
            SKEW_VIOLATION,
            true,
            "SkewViolation",
            format!(
                "binaryVersion {} is more minor versions than allowed from the oldest live {}",
                v.version, v.oldest
            ),
        ),
        None => cond(
            SKEW_VIOLATION,
            false,
            "WithinSkew",
            "within the allowed version skew".into(),
        ),
    }
}

/// The `DuplicateIdentity` condition.
fn duplicate(candidate: &str, facts: &LeaseFacts) -> Condition {
    match facts.duplicates.iter().find(|(n, _)| n == candidate) {
        Some((_, incarnations)) => cond(
            DUPLICATE_IDENTITY,
            true,
            "DuplicateIdentity",
            format!(
                "more than one live process uses this identity (incarnations {}): give each replica its own name",
                incarnations.join(", ")
            ),
        ),
        None => cond(
            DUPLICATE_IDENTITY,
            false,
            "UniqueIdentity",
            "one process uses this identity".into(),
        ),
    }
}

/// The `DoubleHolder` condition.
fn double_holder(candidate: &str, facts: &LeaseFacts) -> Condition {
    match facts.overruns.iter().find(|(n, _)| n == candidate) {
        Some((_, t)) => cond(
            DOUBLE_HOLDER,
            true,
            "WorkloadOverranTerm",
            format!(
                "its workload of term {t} ran past the term's end (the candidate was paused) while the lease moved on (now term {}): two workloads may have run at once; only a resource that checks the fencing token was protected",
                facts.term
            ),
        ),
        None => cond(
            DOUBLE_HOLDER,
            false,
            "NoOverrun",
            "no workload of this candidate is known to have outlived its term".into(),
        ),
    }
}

/// `desired` with the transition times of unchanged conditions carried over from `current`;
/// `None` if nothing but those times would change. (A condition an earlier version wrote with an
/// `observedGeneration` is rewritten once without it.)
pub fn merge(current: &[Condition], mut desired: Vec<Condition>) -> Option<Vec<Condition>> {
    let mut changed = current.len() != desired.len();
    for d in &mut desired {
        match current.iter().find(|c| c.type_ == d.type_) {
            Some(c) if c.status == d.status => {
                d.last_transition_time = c.last_transition_time.clone();
                changed |= c.reason != d.reason
                    || c.message != d.message
                    || c.observed_generation != d.observed_generation;
            }
            _ => changed = true,
        }
    }
    changed.then_some(desired)
}

/// Whether writing `desired` over `current` can wait until the worker has nothing else due: a
/// candidate's first status that only says it stands by (eligible, not the holder, nothing
/// wrong). Its absence tells no reader otherwise: only a `Leader=True` is remembered (by a
/// replica taking over), and a candidate without conditions is not the holder. (The caller
/// makes sure no `Leader=True` of an earlier term can be on the server unseen: it lets
/// statuses wait only at a lease's first term.) Every other status is written at once: the
/// holder's, a transition, anything a user must be told.
pub fn can_wait(current: &[Condition], desired: &[Condition]) -> bool {
    current.is_empty()
        && desired
            .iter()
            .all(|c| (c.type_ == ELIGIBLE) == (c.status == "True"))
}

/// Whether writing `desired` over `current` can wait until the worker has nothing else due, for
/// a candidate that no longer holds the lease: only its `Leader` goes from True to False,
/// nothing else changes. The caller lets it wait only while the new holder's `Leader=True`, at
/// a higher term of an arbiter-elected lease, is on the server or being written with it: a
/// replica taking over that finds both remembers the one of the highest term
/// ([`leader_term`]), so the stale one misleads no one but a human reader of `kubectl get`
/// (the Lease, and `arbiter status`, say who holds it). Its `Deposed` Event waits with it.
pub fn deposed_can_wait(current: &[Condition], desired: &[Condition]) -> bool {
    let rest = |conditions: &[Condition]| -> Vec<(String, String, String, String)> {
        conditions
            .iter()
            .filter(|c| c.type_ != LEADER)
            .map(|c| {
                (
                    c.type_.clone(),
                    c.status.clone(),
                    c.reason.clone(),
                    c.message.clone(),
                )
            })
            .collect()
    };
    is_true(current, LEADER) && !is_true(desired, LEADER) && rest(current) == rest(desired)
}

/// The term a `Leader=True` says the candidate holds ("holds lease L at term N"), if
/// `Leader` is True (0 when the message names no term).
pub fn leader_term(conditions: &[Condition]) -> Option<i32> {
    let leader = conditions
        .iter()
        .find(|c| c.type_ == LEADER && c.status == "True")?;
    Some(
        leader
            .message
            .rsplit_once(" at term ")
            .and_then(|(_, t)| t.trim().parse().ok())
            .unwrap_or(0),
    )
}

/// Whether statuses of the lease whose Lease is `lease` may wait at all ([`can_wait`]): only
/// while the Lease is at its first term, under the arbiter's own strategy. The arbiter's terms
/// never repeat, so no candidate but the holder has ever held it, and no `Leader=True` the
/// cache does not show yet (a lagging watch) is left standing by a `Leader=False` that waits.
/// Not while the Lease is gone (the term it had is not known), nor under a third-party
/// strategy (whose holders change without a term).
pub fn may_wait(lease: Option<&Lease>) -> bool {
    lease.is_some_and(|l| {
        crate::lease::term(l) <= 1 && crate::lease::strategy(l) == Some(OLDEST_EMULATION_VERSION)
    })
}

/// Whether a deposed holder's status may wait at all ([`deposed_can_wait`]): under the
/// arbiter's own strategy, whose every assignment takes a higher term than any before it. Not
/// while the Lease is gone (the term it had is not known), nor under a third-party strategy
/// (whose holders change without a term: the stale `Leader=True` would tie with the holder's).
pub fn deposed_may_wait(lease: Option<&Lease>) -> bool {
    lease.is_some_and(|l| crate::lease::strategy(l) == Some(OLDEST_EMULATION_VERSION))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leader(holds: bool) -> Vec<Condition> {
        let (reason, message) = if holds {
            ("Holder", "holds lease l at term 1")
        } else {
            ("NotHolder", "does not hold lease l")
        };
        vec![cond(LEADER, holds, reason, message.into())]
    }

    #[test]
    fn conditions_carry_no_generation_and_the_same_ones_write_nothing() {
        // A ping, its answer, a refresh: each bumps the generation and changes no condition.
        assert_eq!(leader(false)[0].observed_generation, None);
        assert_eq!(merge(&leader(false), leader(false)), None);
        assert!(merge(&leader(false), leader(true)).is_some());
    }

    /// The conditions of `candidate` when `a` holds the lease and `b` and `c` are eligible
    /// (`c` breaking the skew rule).
    fn judged(candidate: &str) -> Vec<Condition> {
        judged_at(candidate, "a", 1)
    }

    /// The same, with `holder` holding the lease at `term`.
    fn judged_at(candidate: &str, holder: &str, term: i32) -> Vec<Condition> {
        use crate::election::decide::{Action, Liveness, SkewViolation};
        let version = |v: &str| crate::election::Version::parse(v).unwrap();
        let decision = Decision {
            action: Action::Nothing,
            strategy: Resolution::Strategy("OldestEmulationVersion".into()),
            standings: ["a", "b", "c"]
                .into_iter()
                .map(|n| (n.to_string(), Standing::Eligible(Liveness::Acked)))
                .collect(),
            skew_violations: vec![SkewViolation {
                candidate: "c".into(),
                version: version("1.33.0"),
                oldest: version("1.30.0"),
            }],
        };
        let facts = LeaseFacts {
            lease: "l",
            holder: Some(holder),
            term,
            duplicates: &[],
            overruns: &[],
        };
        conditions(candidate, &decision, &facts)
    }

    #[test]
    fn only_a_deposed_holders_leader_false_can_wait_and_the_term_is_read_back() {
        let was = judged_at("a", "a", 7);
        assert_eq!(leader_term(&was), Some(7));
        let now = merge(&was, judged_at("a", "b", 8)).expect("a no longer holds it");
        assert_eq!(leader_term(&now), None);
        assert!(deposed_can_wait(&was, &now), "only Leader changes");
        assert!(
            !deposed_can_wait(&judged_at("b", "a", 7), &judged_at("b", "b", 8)),
            "the new holder's status"
        );
        assert!(
            !deposed_can_wait(&judged_at("c", "a", 7), &judged_at("c", "b", 8)),
            "a standby's (unchanged)"
        );
        let mut also_ineligible = now.clone();
        let eligible = also_ineligible
            .iter_mut()
            .find(|c| c.type_ == ELIGIBLE)
            .unwrap();
        eligible.status = "False".into();
        eligible.reason = "Unresponsive".into();
        assert!(
            !deposed_can_wait(&was, &also_ineligible),
            "a reason it cannot be elected is reported at once"
        );
        let mut no_term = was.clone();
        no_term[0].message = "holds lease l".into();
        assert_eq!(leader_term(&no_term), Some(0), "True, at no known term");
    }

    #[test]
    fn statuses_may_wait_only_at_the_first_term_of_an_arbiter_elected_lease() {
        let lease = |term: Option<i32>, strategy: &str| Lease {
            spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                holder_identity: Some("a".into()),
                lease_transitions: term,
                strategy: Some(strategy.into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(may_wait(Some(&lease(Some(1), OLDEST_EMULATION_VERSION))));
        assert!(
            may_wait(Some(&lease(None, OLDEST_EMULATION_VERSION))),
            "no holder yet"
        );
        assert!(
            !may_wait(Some(&lease(Some(2), OLDEST_EMULATION_VERSION))),
            "another candidate may have held it"
        );
        assert!(
            !may_wait(Some(&lease(Some(1), "example.com/mine"))),
            "a third-party strategy's holders change without a term"
        );
        assert!(!may_wait(None), "the Lease is gone: its term is not known");
    }

    #[test]
    fn only_a_first_status_that_says_the_candidate_stands_by_can_wait() {
        assert!(can_wait(&[], &judged("b")), "b stands by");
        assert!(
            !can_wait(&leader(false), &judged("b")),
            "a candidate with a status gets its changes at once"
        );
        assert!(!can_wait(&[], &judged("a")), "the holder's status");
        assert!(!can_wait(&[], &judged("c")), "a problem to report");
        let mut ineligible = judged("b");
        let eligible = ineligible.iter_mut().find(|c| c.type_ == ELIGIBLE).unwrap();
        eligible.status = "False".into();
        assert!(!can_wait(&[], &ineligible), "a reason it cannot be elected");
    }

    #[test]
    fn a_generation_an_earlier_version_wrote_is_dropped_once() {
        let mut old = leader(false);
        old[0].observed_generation = Some(3);
        let merged = merge(&old, leader(false)).expect("rewritten without it");
        assert_eq!(merged[0].observed_generation, None);
        assert_eq!(merge(&merged, leader(false)), None);
    }

    #[test]
    fn an_unchanged_status_keeps_its_transition_time() {
        let mut current = leader(false);
        current[0].last_transition_time = Time(jiff::Timestamp::UNIX_EPOCH);
        let mut desired = leader(false);
        desired[0].message = "does not hold lease l2".into();
        let merged = merge(&current, desired).expect("the message changed");
        assert_eq!(
            merged[0].last_transition_time,
            Time(jiff::Timestamp::UNIX_EPOCH)
        );
    }
}
