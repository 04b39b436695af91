//! The holder's term: a term ends only by the holder's own release, its work confirmed
//! stopped, or its lease expiring on the arbiter's clock. A hand edit of the Lease does not end
//! it: the holder the arbiter last saw ([`Previous`]) keeps its full lease duration before
//! anyone else is elected ([`previous_term`]). A Lease the arbiter did not make is waited out
//! the same way, then adopted ([`foreign`]).

use std::time::Duration;

use super::{Action, Lease, Previous};

/// The Lease no longer names the holder the arbiter last saw, but nothing proves its term
/// over (a hand edit): wait until its lease would have expired. `None`: the ordinary rules
/// apply.
pub(super) fn previous_term(previous: Option<&Previous>, lease: Option<&Lease>) -> Option<Action> {
    let p = previous?;
    let remaining = term_left(p, lease)?;
    Some(Action::WaitForTerm {
        holder: p.holder.clone(),
        remaining,
    })
}

/// What a Lease the arbiter did not make ([`Lease::foreign`]) leads to.
pub(super) enum Foreign {
    /// The Lease is the arbiter's (or there is none): the ordinary rules apply.
    Own,
    /// Act on it now: leave it alone (under a third-party strategy, as the arbiter leaves such
    /// Leases), or wait for its holder's term to run out.
    Act(Action),
    /// Its holder's term is over: take it over as a Lease that nobody holds (its holder never
    /// held an arbiter term).
    Adopt(Lease),
}

/// A Lease the arbiter did not make: its holder (a client-go leader that may still run) is
/// waited out, unchanged for its full duration on the arbiter's clock; then the Lease is taken
/// over like one that nobody holds. Under a third-party strategy (`oev` false) it is left
/// alone.
pub(super) fn foreign(lease: Option<&Lease>, oev: bool) -> Foreign {
    let Some(l) = lease.filter(|l| l.foreign) else {
        return Foreign::Own;
    };
    if !oev {
        return Foreign::Act(Action::Nothing);
    }
    if let (Some(holder), false) = (&l.holder, l.expired()) {
        let remaining = l.duration.saturating_sub(l.unchanged_for);
        return Foreign::Act(Action::WaitForForeign {
            holder: holder.clone(),
            remaining,
        });
    }
    Foreign::Adopt(Lease {
        holder: None,
        preferred_holder: None,
        released_by: None,
        holder_pod_stopped: false,
        switchover: None,
        ..l.clone()
    })
}

/// Under a third-party strategy the arbiter creates the Lease with that strategy and no
/// holder, writes the strategy when it changes, and never touches the holder.
pub(super) fn third_party(lease: Option<&Lease>, strategy: String) -> Action {
    match lease {
        None => Action::CreateLease {
            holder: None,
            strategy,
        },
        Some(l) if l.strategy.as_deref() != Some(&strategy) => Action::SetStrategy { strategy },
        Some(_) => Action::Nothing,
    }
}

/// How long the previous holder's term may still run although the Lease no longer names it:
/// `None` when the Lease names it (the ordinary rules apply), or its term certainly ended
/// (it released the lease itself, its pod is confirmed stopped, or its lease expired).
fn term_left(p: &Previous, lease: Option<&Lease>) -> Option<Duration> {
    if lease.is_some_and(|l| l.holder.as_deref() == Some(p.holder.as_str())) {
        return None;
    }
    let released_itself = lease
        .is_some_and(|l| l.holder.is_none() && l.released_by.as_deref() == Some(p.holder.as_str()));
    if released_itself || p.pod_stopped || p.quiet_for >= p.duration {
        return None;
    }
    Some(p.duration - p.quiet_for)
}
