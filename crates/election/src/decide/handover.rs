//! Handover: a live holder is never replaced directly. A better candidate (a strictly better
//! version) gets the lease only through a handover request (`preferredHolder`), asked once the
//! pool has settled and only once the target answered a ping sent during the current term
//! ([`to_a_better_candidate`]); a planned switchover asks the same of a named or the best other
//! candidate at the versions the rules would elect ([`switchover`], [`switchover_target`]).

use jiff::Timestamp;

use crate::oldest_emulation::{self, Ranked};

use super::eligibility::Field;
use super::settle::{registrations, settle_before_asking};
use super::{Action, Lease, Liveness, Switchover};

/// A live holder and a planned switchover (`arbiter handover`): asked of the holder and term
/// it was made for, to a candidate the rules allow, else refused.
pub(super) fn switchover(field: &Field, l: &Lease, sw: &Switchover) -> Action {
    let holder = l.holder.as_deref().unwrap_or_default();
    let target = if (sw.holder.as_str(), sw.term) != (holder, l.term) {
        Err(format!(
            "the lease moved on: it was asked of {} at term {}, and {holder} holds term {} now",
            sw.holder, sw.term, l.term
        ))
    } else {
        let eligible: Vec<&Ranked> = field.ranked.iter().map(|(r, _)| r).collect();
        switchover_target(sw.to.as_deref(), holder, &eligible)
    };
    match target {
        Err(reason) => Action::RefuseSwitchover { reason },
        Ok(to) => hand_over_to(field, l, to),
    }
}

/// A live holder and the best candidate: only a strictly better version takes over from a live
/// holder; ties on versions (decided by age or name) never disturb it, so the lease does not
/// flip back and forth. A stale handover request is cleared.
pub(super) fn to_a_better_candidate(field: &Field, l: &Lease) -> Action {
    let holder = l.holder.as_deref().unwrap_or_default();
    let best = field.best().filter(|b| {
        field
            .versions_of(b)
            .is_none_or(|v| Some(v) != field.versions_of(holder))
    });
    match best {
        None if l.preferred_holder.is_some() => Action::ClearPreferredHolder,
        None => Action::Nothing,
        Some(best) if best == holder => match &l.preferred_holder {
            Some(_) => Action::ClearPreferredHolder,
            None => Action::Nothing,
        },
        Some(best) => {
            // Asked for only once the pool has settled, and pinged only then: the holder
            // works meanwhile, and its release then goes to the target at once.
            let target = field.candidates.iter().find(|c| c.name == best);
            let settle = target
                .filter(|_| l.preferred_holder.as_deref() != Some(&best))
                .and_then(|t| {
                    let pool = registrations(&field.ranked, field.candidates);
                    settle_before_asking(&pool, t, field.now, field.rules)
                });
            match settle {
                Some(remaining) => Action::Settle { remaining },
                None => hand_over_to(field, l, best),
            }
        }
    }
}

/// Asks the live holder of `l` to hand over to `to` once `to` answered during this term (a ping
/// after the arbiter first saw the term; one ahead of this clock, from a skewed replica or a
/// hand edit, is not waited for), then waits for the release; pings `to` until then.
fn hand_over_to(field: &Field, l: &Lease, to: String) -> Action {
    let began: Option<Timestamp> = l.term_seen.filter(|a| *a <= field.now);
    match field
        .liveness_of(&to)
        .map(|lv| field.answered_since(&to, lv, began))
    {
        Some(Liveness::Acked) if l.preferred_holder.as_deref() == Some(&to) => {
            Action::WaitForRelease { to }
        }
        Some(Liveness::Acked) => Action::RequestHandover { to },
        Some(Liveness::Pending) => Action::WaitForAcks,
        _ => Action::Ping {
            candidates: vec![to],
        },
    }
}

/// The candidate a planned switchover goes to, or why it cannot be done: the named one (`to`),
/// or else the best other one, must be among the `eligible` candidates, not the holder, and at
/// the top versions among them (the rules would elect it but for ties). `arbiter handover`
/// checks with the same function, from the conditions the operator reported.
pub fn switchover_target(
    to: Option<&str>,
    holder: &str,
    eligible: &[&Ranked],
) -> Result<String, String> {
    let top = oldest_emulation::pick_best(eligible.iter().copied())
        .map(|r| (r.emulation.clone(), r.binary.clone()));
    let at_top = |r: &Ranked| top.as_ref() == Some(&(r.emulation.clone(), r.binary.clone()));
    match to {
        Some(to) if to == holder => Err(format!("{to} already holds the lease")),
        Some(to) => {
            let Some(r) = eligible.iter().find(|r| r.name == to) else {
                return Err(format!("{to} is not an eligible candidate of this lease"));
            };
            if !at_top(r) {
                let (e, b) = top.expect("a ranked candidate");
                return Err(format!(
                    "{to} runs emulation {} / binary {}, but the rules elect {e} / {b} (the oldest among eligible candidates): a switchover may pick among equals, never a newer version",
                    r.emulation, r.binary
                ));
            }
            Ok(to.to_string())
        }
        None => oldest_emulation::pick_best(
            eligible
                .iter()
                .copied()
                .filter(|r| r.name != holder && at_top(r)),
        )
        .map(|r| r.name.to_string())
        .ok_or_else(|| "no other eligible candidate runs the versions the rules elect".to_string()),
    }
}
