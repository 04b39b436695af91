//! Status conditions on LeaseCandidates, derived from a decision.
//!
//! A candidate's conditions report its own standing, and only what is worth a write: a
//! problem it has now (not eligible, a strategy conflict, a skew violation, a duplicate
//! identity, a workload that outlived its term), and, once a condition is on the candidate,
//! its current value (a problem that cleared flips to its good value, so the transition stays
//! visible). A candidate with nothing to report carries no conditions and costs no write. Who
//! holds the lease is the Lease's (`holderIdentity`, `leaseTransitions`): it is not repeated
//! on every candidate, so an election writes no candidate's status (an earlier version's
//! `Leader` condition is removed the next time the candidate's status is written, or at its
//! first report).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use arbiter_election::decide::{Decision, PodState, Reason, Standing};
use arbiter_election::strategy::Resolution;

pub use arbiter_api::conditions::*;

/// What the conditions are computed from, besides the decision.
pub struct LeaseFacts<'a> {
    /// The lease's term (the Lease's `leaseTransitions`).
    pub term: i32,
    /// Candidates whose identity two live processes are using, with their incarnations.
    pub duplicates: &'a [(String, Vec<String>)],
    /// Candidates whose workload ran past the end of an earlier term (it was paused), by term.
    pub overruns: &'a [(String, i32)],
}

/// A condition. Without `observedGeneration`: `pingTime` and `renewTime` are in the spec (as
/// upstream's LeaseCandidate has them), so every ping, every answer and every refresh (5 min)
/// bumps the generation while changing no condition. Carrying it, the status would have to be
/// rewritten at each, or else fall behind and make `kubectl wait --for=condition` and
/// kstatus-based health checks wait forever.
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

/// The conditions `candidate` should carry, given those it carries (`current`): each one that
/// reports a problem now, and each one it already carries, at its current value. (No
/// `Leader`: the Lease says who holds it.)
pub fn conditions(
    candidate: &str,
    decision: &Decision,
    facts: &LeaseFacts,
    current: &[Condition],
) -> Vec<Condition> {
    let carried = |type_: &str| current.iter().any(|c| c.type_ == type_);
    [
        (eligible(candidate, decision), false),
        (conflict(candidate, decision), true),
        (skew(candidate, decision), true),
        (duplicate(candidate, facts), true),
        (double_holder(candidate, facts), true),
    ]
    .into_iter()
    .filter(|(c, problem_when_true)| {
        (c.status == "True") == *problem_when_true || carried(&c.type_)
    })
    .map(|(c, _)| c)
    .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use arbiter_election::decide::{Action, Liveness, SkewViolation};

    /// The decision when `a` and `b` are eligible, `c` breaks the skew rule and `d` ignored a
    /// ping.
    fn decision() -> Decision {
        let version = |v: &str| arbiter_election::Version::parse(v).unwrap();
        let mut standings: std::collections::BTreeMap<String, Standing> = ["a", "b", "c"]
            .into_iter()
            .map(|n| (n.to_string(), Standing::Eligible(Liveness::Acked)))
            .collect();
        standings.insert("d".into(), Standing::Ineligible(Reason::Unresponsive));
        Decision {
            action: Action::Nothing,
            strategy: Resolution::Strategy("OldestEmulationVersion".into()),
            standings,
            skew_violations: vec![SkewViolation {
                candidate: "c".into(),
                version: version("1.33.0"),
                oldest: version("1.30.0"),
            }],
        }
    }

    fn judged(candidate: &str, current: &[Condition]) -> Vec<Condition> {
        let facts = LeaseFacts {
            term: 1,
            duplicates: &[],
            overruns: &[],
        };
        conditions(candidate, &decision(), &facts, current)
    }

    fn types(conditions: &[Condition]) -> Vec<(&str, &str)> {
        conditions
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect()
    }

    #[test]
    fn a_candidate_with_nothing_to_report_carries_no_conditions() {
        assert!(judged("a", &[]).is_empty());
        assert_eq!(merge(&[], judged("a", &[])), None, "no write");
        assert_eq!(types(&judged("c", &[])), [("SkewViolation", "True")]);
        assert_eq!(types(&judged("d", &[])), [("Eligible", "False")]);
        assert_eq!(judged("d", &[])[0].reason, "Unresponsive");
    }

    #[test]
    fn a_problem_that_clears_flips_to_its_good_value_and_stays() {
        let unresponsive = judged("d", &[]);
        // d answers again: judged as a is.
        let facts = LeaseFacts {
            term: 1,
            duplicates: &[],
            overruns: &[],
        };
        let back = conditions("a", &decision(), &facts, &unresponsive);
        assert_eq!(types(&back), [("Eligible", "True")]);
        assert!(
            merge(&unresponsive, back.clone()).is_some(),
            "a transition: written"
        );
        assert_eq!(
            merge(&back, conditions("a", &decision(), &facts, &back)),
            None
        );
    }

    #[test]
    fn an_earlier_versions_leader_condition_is_dropped() {
        let old = vec![
            cond("Leader", true, "Holder", "holds lease l at term 3".into()),
            cond(ELIGIBLE, true, "Eligible", "can be elected".into()),
        ];
        let now = judged("a", &old);
        assert_eq!(types(&now), [("Eligible", "True")]);
        assert!(merge(&old, now).is_some(), "rewritten without it");
    }

    #[test]
    fn conditions_carry_no_generation_and_the_same_ones_write_nothing() {
        let c = judged("c", &[]);
        assert_eq!(c[0].observed_generation, None);
        assert_eq!(merge(&c, judged("c", &c)), None);
    }

    #[test]
    fn a_generation_an_earlier_version_wrote_is_dropped_once() {
        let mut old = judged("c", &[]);
        old[0].observed_generation = Some(3);
        let merged = merge(&old, judged("c", &old)).expect("rewritten without it");
        assert_eq!(merged[0].observed_generation, None);
        assert_eq!(merge(&merged, judged("c", &merged)), None);
    }

    #[test]
    fn an_unchanged_status_keeps_its_transition_time() {
        let mut current = judged("c", &[]);
        current[0].last_transition_time = Time(jiff::Timestamp::UNIX_EPOCH);
        let mut desired = judged("c", &current);
        desired[0].message = "another message".into();
        let merged = merge(&current, desired).expect("the message changed");
        assert_eq!(
            merged[0].last_transition_time,
            Time(jiff::Timestamp::UNIX_EPOCH)
        );
    }
}
