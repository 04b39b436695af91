//! Assignment: a lease with no live holder (none yet, expired, released, or its holder's work
//! confirmed stopped) is given to the best candidate that answered. The arbiter first learns
//! who is alive, asking only those that could outrank every one that answered ([`to_ask`]);
//! a holder whose term lapsed, or that stepped down, is passed over while anyone else can lead
//! ([`Pool`]); candidates started together are counted first (the settle).

use std::cmp::Ordering;

use jiff::{SignedDuration, Timestamp};

use crate::oldest_emulation::{self, Ranked};

use super::eligibility::Field;
use super::settle::{gather, registrations};
use super::{Action, Lease, Liveness, Reason, Standing};

/// An election: learn who is alive, then elect the best of those that answered.
pub(super) fn elect(field: &Field, lease: Option<&Lease>, strategy: String) -> Action {
    let pool = Pool::of(field, lease);
    // Candidates started together are counted before anyone from the pool is elected.
    let registered = registrations(&pool.members, field.candidates);
    if let Some(remaining) = gather(&registered, lease, field.now, field.rules) {
        return Action::Settle { remaining };
    }
    let pool = pool.answered_since_release(field, lease);
    if let Some(action) = pool.to_ask(field) {
        return action;
    }
    let best = pool.top(|l| l == Liveness::Acked);
    match (best, lease) {
        (None, _) => Action::NoEligibleCandidate,
        (Some(holder), None) => Action::CreateLease {
            holder: Some(holder),
            strategy,
        },
        (Some(holder), Some(_)) => Action::Assign {
            lapsed: pool.lapsed.filter(|l| *l != holder).map(str::to_string),
            holder,
        },
    }
}

/// Who an election picks from, in the order of the rules.
struct Pool<'a> {
    members: Vec<(Ranked<'a>, Liveness)>,
    /// The holder whose term lapsed without a renew.
    lapsed: Option<&'a str>,
    /// Who released the lease (it stepped down).
    stepped_down: Option<&'a str>,
    /// The handover's target, first among equals.
    preferred: Option<&'a str>,
}

impl<'a> Pool<'a> {
    /// A holder whose term lapsed without a renew, or that just stepped down, does not get the
    /// next term while anyone else can take it: re-electing it would only repeat the lapse or
    /// undo the release (and a stepping-down candidate may be on its way out). One that stepped
    /// down (a handover, a switchover) and is still eligible is passed over only for a
    /// candidate at its versions or older: if the one it stepped down for went away, a newer
    /// version must not take charge while it still runs.
    fn of(field: &Field<'a>, lease: Option<&'a Lease>) -> Self {
        let lapsed = lease
            .filter(|l| l.expired())
            .and_then(|l| l.holder.as_deref());
        let stepped_down = lease
            .filter(|l| l.holder.is_none())
            .and_then(|l| l.released_by.as_deref());
        let may_replace = |r: &Ranked, h: &str| {
            lapsed.is_some()
                || field
                    .versions_of(h)
                    .is_none_or(|v| (r.emulation, r.binary) <= v)
        };
        let members = match lapsed.or(stepped_down) {
            Some(h)
                if field
                    .ranked
                    .iter()
                    .any(|(r, _)| r.name != h && may_replace(r, h)) =>
            {
                field
                    .ranked
                    .iter()
                    .filter(|(r, _)| r.name != h)
                    .cloned()
                    .collect()
            }
            _ => field.ranked.clone(),
        };
        Pool {
            members,
            lapsed,
            stepped_down,
            preferred: lease.and_then(|l| l.preferred_holder.as_deref()),
        }
    }

    /// After a release (a handover, or a holder stepping down) the next holder must have
    /// answered since the arbiter saw the release: the target of a handover may have exited
    /// while the holder was stopping.
    fn answered_since_release(mut self, field: &Field, lease: Option<&Lease>) -> Self {
        let released_seen: Option<Timestamp> =
            lease.filter(|_| self.stepped_down.is_some()).and_then(|l| {
                field
                    .now
                    .checked_sub(SignedDuration::try_from(l.unchanged_for).ok()?)
                    .ok()
            });
        for (r, lv) in &mut self.members {
            *lv = field.answered_since(r.name, *lv, released_seen);
        }
        self
    }

    /// The order of the election: among equals, the candidate the handover was for (the
    /// preferred holder, e.g. a switchover's target) rather than the older or alphabetically
    /// first.
    fn order(&self, a: &Ranked, b: &Ranked) -> Ordering {
        oldest_emulation::compare_preferring(a, b, self.preferred)
    }

    /// The first in order among the members whose liveness passes `filter`.
    fn top(&self, filter: impl Fn(Liveness) -> bool) -> Option<String> {
        self.members
            .iter()
            .filter(|(_, l)| filter(*l))
            .map(|(r, _)| r)
            .min_by(|a, b| self.order(a, b))
            .map(|r| r.name.to_string())
    }

    /// Whom to ask before electing, if anyone. Those not yet heard from only matter if one of
    /// them could outrank every candidate that acknowledged: when the best that could still
    /// answer has already answered, waiting could not change the outcome, so it is elected at
    /// once. Otherwise only those that could outrank every candidate that answered are asked,
    /// and the best of them alone: it usually answers, and then nobody else needs a ping (nor
    /// writes an answer). Once a candidate of this lease has ignored a ping, all of them are
    /// asked at once, so that a dead candidate costs an election one ack window more, not one
    /// per dead candidate.
    fn to_ask(&self, field: &Field) -> Option<Action> {
        let best_possible = self.top(|l| l != Liveness::Unresponsive);
        let best_answered = best_possible.as_deref().is_some_and(|best| {
            self.members
                .iter()
                .any(|(r, l)| r.name == best && *l == Liveness::Acked)
        });
        if best_answered {
            return None;
        }
        let best_acked = self
            .members
            .iter()
            .filter(|(_, l)| *l == Liveness::Acked)
            .map(|(r, _)| r)
            .min_by(|a, b| self.order(a, b));
        let open: Vec<&(Ranked, Liveness)> = self
            .members
            .iter()
            .filter(|(_, l)| matches!(l, Liveness::Unknown | Liveness::Pending))
            .filter(|(r, _)| best_acked.is_none_or(|b| self.order(r, b).is_lt()))
            .collect();
        let someone_silent = field
            .standings
            .values()
            .any(|s| *s == Standing::Ineligible(Reason::Unresponsive));
        let to_ping: Vec<String> = if someone_silent {
            let mut unknown: Vec<String> = open
                .iter()
                .filter(|(_, l)| *l == Liveness::Unknown)
                .map(|(r, _)| r.name.to_string())
                .collect();
            unknown.sort();
            unknown
        } else {
            open.iter()
                .min_by(|(a, _), (b, _)| self.order(a, b))
                .filter(|(_, l)| *l == Liveness::Unknown)
                .map(|(r, _)| vec![r.name.to_string()])
                .unwrap_or_default()
        };
        if !to_ping.is_empty() {
            return Some(Action::Ping {
                candidates: to_ping,
            });
        }
        open.iter()
            .any(|(_, l)| *l == Liveness::Pending)
            .then_some(Action::WaitForAcks)
    }
}

/// The election held while `unwrapped` pods run the lease's command without an agent (pods
/// labelled for injection that were not injected: the operator's `workloads::unwrapped`): an action
/// that would give the lease to someone waits instead, as a new holder's command would run
/// beside theirs. Every other action stands: a holder keeps its lease (its command already
/// runs), a handover is still asked for and carried out by the holder, pings still go out, so
/// that a successor is known alive the moment the last unwrapped pod is gone.
pub fn held_for_unwrapped(action: Action, unwrapped: usize) -> Action {
    match action.elects() {
        Some(holder) if unwrapped > 0 => Action::WaitForUnwrapped {
            holder: holder.to_string(),
            pods: unwrapped,
        },
        _ => action,
    }
}
