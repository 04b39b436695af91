//! The next step for one lease, from what the arbiter currently knows.
//!
//! [`decide`] takes the lease's candidates, the Lease record (if any) and the arbiter's own
//! observations, and returns one [`Action`] plus the standing of every candidate (for status
//! conditions). It is the whole election policy:
//!
//! - Only an **eligible** candidate can be elected: its versions parse, its pod (if it has one)
//!   is running, it did not ignore the last ping, and it does not break the skew rule when
//!   skew is refused. Before electing, the arbiter **pings** (`spec.pingTime`) the eligible
//!   candidates whose liveness it does not know (one it saw renew on its own lately counts as
//!   alive: [`Candidate::renewed_lately`]), waits up to the ack window for them to write their
//!   `renewTime` after the ping (a change the arbiter observed, [`super::heard`]; never
//!   `renewTime >= pingTime`, which compares two hosts' clocks), and elects only among those
//!   that acknowledged. It stops waiting
//!   as soon as the best candidate that could still answer has answered: no later answer could
//!   change the outcome. So it asks only candidates that would outrank every one that
//!   answered, and the best of them alone: when it answers, nobody else is asked. Once a
//!   candidate of the lease has ignored a ping (it is Unresponsive), all of those are asked at
//!   once, so dead candidates cost an election one ack window more, not one each.
//! - A **live holder** (lease not expired on the arbiter's clock, holder not released, its pod
//!   not confirmed stopped) is never replaced directly. A better candidate gets it only through
//!   a **handover request** (`preferredHolder`), after which the holder releases, and only once
//!   it has answered a ping sent during the current term (after the arbiter first saw the
//!   term): an older answer
//!   may come from a process that has exited since, and the live holder would stop for nobody.
//!   It is asked only once no eligible candidate has registered for the settle time (at most
//!   an ack window after the target registered), and the target is pinged only then:
//!   candidates started together are counted while the holder works, so it hands over once, and
//!   its release goes to the target at once.
//!   After the release, the next holder must again have answered since the release was seen.
//! - **Candidates started together** register a moment apart: a lease's first election waits
//!   until no eligible candidate has registered for the settle time (at most an ack window from
//!   the first registration), so the oldest version leads from term 1. After a term ended the
//!   election waits only when everyone it could elect registered within the settle (the pool
//!   started again); otherwise it is at once, and an older candidate a moment behind is handed
//!   over to once the pool has settled.
//! - A **withdrawn** candidate (its agent stopped its work and left) is never elected.
//! - A **planned switchover** (`arbiter handover`) asks the live holder to hand over to a named
//!   candidate, or to the best other one, through the same handover request; it is refused
//!   unless that candidate is eligible and at the versions the rules would elect (the top
//!   emulation and binary versions among eligible candidates): a switchover may pick among
//!   equals, never put a newer version in charge while an older one runs.
//! - A lease that expired, was released, or whose holder's pod is confirmed stopped is
//!   **assigned** at once to the best acknowledged candidate. A holder whose term lapsed (it
//!   stopped renewing) is passed over while anyone else can lead; one that released it (and
//!   can still lead) only for a candidate at its versions or older, and among equals the
//!   handover's target (the preferred holder) goes first: it is the one asked, and waited for.
//!   After a lapse, a candidate is alive only by an answer to a ping sent during the lapsed
//!   term (the lapsed holder: since the lapse), not by an older answer or a renewal of its own.
//! - Under a **third-party strategy** the arbiter creates the Lease with that strategy and no
//!   holder, and never touches the holder. When the candidates go back to the arbiter's
//!   strategy, its next assignment writes that strategy on the Lease.
//! - A **strategy conflict** changes nothing; it is reported.
//! - A term ends only by the holder's own release, its pod confirmed stopped (or the container
//!   its process took the term in ended), or its lease expiring on the arbiter's clock. A **hand edit** does not end it: when the Lease is
//!   deleted, its holder cleared or replaced, or its duration lowered, the holder the arbiter
//!   last saw ([`Previous`]) keeps its full lease duration, counted from its last record the
//!   arbiter saw, before anyone else is elected.
//!
//! Expiry is `unchanged_for >= duration`, where `unchanged_for` is measured by the caller on its
//! monotonic clock since it first saw the current Lease record: no wall clock is trusted for it.
//! Every other time this module compares (pings sent and shown, terms seen, `now`) is a point
//! on the arbiter's own clock; no timestamp written by a candidate, another replica or a hand
//! edit is compared with anything.
//!
//! Each rule has a module of its own (the table and property tests of all of them are in
//! `decide/tests.rs`):
//! `eligibility` (who may be elected, and each candidate's standing), `term` (the
//! holder's term, a hand-edited or foreign Lease), `handover` (a live holder and a better
//! candidate or a switchover), `settle` (candidates started together), `assignment` (an
//! election with no live holder). [`decide`] applies them in that order.

mod assignment;
mod eligibility;
mod handover;
mod inputs;
mod outcome;
mod pod_state;
mod settle;
mod term;

use jiff::Timestamp;

pub use super::heard::Ping;
use super::strategy::{OLDEST_EMULATION_VERSION, Resolution};

pub use assignment::held_for_unwrapped;
pub use eligibility::liveness;
pub use handover::switchover_target;
pub use inputs::{Candidate, Lease, Previous, Rules, Switchover};
pub use outcome::{Action, Decision, Liveness, Reason, SkewViolation, Standing};
pub use pod_state::{PodSeen, PodState};

use eligibility::{Field, holder_judged_by_its_term, skew_violations, standings};
use term::Foreign;

/// Decides the next action for one lease. `candidates` are those naming this lease in its
/// namespace; their order does not matter. `previous` is the holder the arbiter itself last
/// saw on the lease, if any.
pub fn decide(
    candidates: &[Candidate],
    lease: Option<&Lease>,
    previous: Option<&Previous>,
    now: Timestamp,
    rules: &Rules,
) -> Decision {
    let adjusted = holder_judged_by_its_term(candidates, lease);
    let candidates = adjusted.as_deref().unwrap_or(candidates);
    let parsed = eligibility::parse(candidates, lease, now, rules);
    let resolution = eligibility::strategy_of(&parsed);
    let oev = matches!(&resolution, Resolution::Strategy(s) if s == OLDEST_EMULATION_VERSION);
    let skew = skew_violations(&parsed, rules);
    let standings = standings(&parsed, oev, &skew, rules);
    let decision = |action| Decision {
        action,
        strategy: resolution.clone(),
        standings: standings.clone(),
        skew_violations: skew.clone(),
    };

    let strategy = match &resolution {
        Resolution::NoCandidates => return decision(Action::Nothing),
        Resolution::Conflict { .. } => return decision(Action::StrategyConflict),
        Resolution::Strategy(s) => s.clone(),
    };
    let adopted;
    let lease = match term::foreign(lease, oev) {
        Foreign::Own => lease,
        Foreign::Act(action) => return decision(action),
        Foreign::Adopt(l) => {
            adopted = l;
            Some(&adopted)
        }
    };
    if !oev {
        return decision(term::third_party(lease, strategy));
    }
    if let Some(action) = term::previous_term(previous, lease) {
        return decision(action);
    }
    let field = Field::new(&parsed, &standings, candidates, now, rules);
    decision(match lease.filter(|l| l.holder_live()) {
        Some(l) => match &l.switchover {
            Some(sw) => handover::switchover(&field, l, sw),
            None => handover::to_a_better_candidate(&field, l),
        },
        None => assignment::elect(&field, lease, strategy),
    })
}

#[cfg(test)]
mod tests;
