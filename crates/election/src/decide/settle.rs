//! The settle: candidates started together register a moment apart, and the election waits
//! until no candidate that can lead has registered for the settle time (at most an ack window),
//! so the oldest version among them leads from its first term ([`gather`]), and a live holder
//! hands over once, to the oldest of them ([`settle_before_asking`]).

use std::time::Duration;

use jiff::Timestamp;

use crate::oldest_emulation::Ranked;

use super::{Candidate, Lease, Liveness, Rules};

/// When the arbiter saw each candidate that can lead (eligible, its versions read) register,
/// on its own clock (`None`: before this process started): what the settle counts.
pub(super) fn registrations(
    ranked: &[(Ranked, Liveness)],
    candidates: &[Candidate],
) -> Vec<Option<Timestamp>> {
    ranked
        .iter()
        .map(|(r, _)| {
            candidates
                .iter()
                .find(|c| c.name == r.name)
                .and_then(|c| c.registered)
        })
        .collect()
}

fn age(at: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(at)).unwrap_or(Duration::ZERO)
}

/// How much longer the pool must settle (no candidate that can lead registered for
/// `rules.settle`), counting at most an ack window from `since`: someone who keeps
/// registering, or recreating candidates, cannot hold it up for ever. `None`: settled.
fn settling(
    pool: &[Option<Timestamp>],
    since: Duration,
    now: Timestamp,
    rules: &Rules,
) -> Option<Duration> {
    let newest = pool.iter().flatten().max().map(|r| age(*r, now))?;
    (newest < rules.settle && since < rules.ack_window)
        .then(|| (rules.settle - newest).min(rules.ack_window - since))
}

/// The gather: an election with no live holder waits, so that candidates started together
/// register a moment apart and the oldest version among them leads from its first term,
/// instead of the first to register (a newer version leading until it hands over).
///
/// - A lease's **first election** (no term ever assigned on it by the arbiter, or a Lease it
///   is about to adopt) waits until no candidate that can lead has registered for the settle.
/// - **After a term ended** (a release, an expiry, a stopped pod) it waits only when no
///   candidate it could elect was there before: every one registered after the term ended, or
///   within the settle before (the pool started again), and then until no candidate has
///   registered for the settle, as a first election does. `pool` is who the election picks
///   from (not the holder that just stepped down or lapsed, while anyone else can lead). With
///   a candidate from before (or one registered before this process saw it happen), the
///   election is at once, among everyone there: a better candidate that registered a moment
///   ago is elected, and one older still that comes a moment later is handed over to once the
///   pool has settled ([`settle_before_asking`]), while the one elected works. Waiting then
///   would cost leaderless time, which a handover asked for later does not.
///
/// Either waits at most an ack window from when the lease became electable.
pub(super) fn gather(
    pool: &[Option<Timestamp>],
    lease: Option<&Lease>,
    now: Timestamp,
    rules: &Rules,
) -> Option<Duration> {
    let first = lease.is_none_or(|l| l.term == 0 || l.foreign);
    let electable_for = match lease {
        // Its term expired: since then; released, stopped or never held: since the record.
        Some(l) if l.expired() && l.holder.is_some() => l.unchanged_for.saturating_sub(l.duration),
        Some(l) => l.unchanged_for,
        // A first election: since its first candidate registered.
        None => pool.iter().flatten().min().map(|r| age(*r, now))?,
    };
    // Registered at least a settle before the lease became electable (or before this process
    // saw it happen): there before, and counted.
    let from_before = |r: &Option<Timestamp>| {
        r.is_none_or(|r| age(r, now) >= electable_for.saturating_add(rules.settle))
    };
    if !first && pool.iter().any(from_before) {
        return None;
    }
    settling(pool, electable_for, now, rules)
}

/// Before a live holder is asked to hand over to `target`, a better candidate: the pool must
/// have settled (candidates started together counted, so the holder hands over once, to the
/// oldest of them), at most an ack window after the target registered (its latest
/// registration: a new process of it is a new registration). The holder works meanwhile; the
/// target is pinged only then (its answer is fresh when the holder is asked), and the
/// holder's release then goes to it at once.
pub(super) fn settle_before_asking(
    pool: &[Option<Timestamp>],
    target: &Candidate,
    now: Timestamp,
    rules: &Rules,
) -> Option<Duration> {
    let since = age(target.registered?, now);
    settling(pool, since, now, rules)
}
