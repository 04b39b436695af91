//! Reporting what was decided and done: candidates' conditions, Events, and metrics.

pub mod conditions;
pub(crate) mod events;
pub(crate) mod limits;

pub use events::publish;

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{EventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use crate::api::LeaseCandidate;
use crate::election::decide::{Action, Decision};
use crate::operator::cache::written::Written;
use crate::operator::key::LeaseKey;
use crate::operator::metrics::Metrics;

/// What [`report`] left to do.
pub(in crate::operator) struct Reported {
    /// Every status that was due was written (a failed one is retried by the caller).
    pub complete: bool,
    /// Some statuses were left for when the worker has nothing else due
    /// ([`conditions::can_wait`]).
    pub waiting: bool,
}

/// Which statuses may be left for when the worker has nothing else due (it has other leases
/// due now).
#[derive(Clone, Copy, Debug, Default)]
pub(in crate::operator) struct MayWait {
    /// A candidate's first status that says it stands by ([`conditions::can_wait`]).
    pub first: bool,
    /// A deposed holder's `Leader=False`, once the holder's `Leader=True` at a higher term is
    /// on the server or written with it ([`conditions::deposed_can_wait`]).
    pub deposed: bool,
}

/// What one pass reports on a lease.
pub(in crate::operator) struct LeaseReport<'a> {
    pub key: &'a LeaseKey,
    pub candidates: &'a [Arc<LeaseCandidate>],
    pub decision: &'a Decision,
    /// Whether the Lease exists (or was just written).
    pub lease_exists: bool,
    /// The holder to report, and its term.
    pub holder: Option<&'a str>,
    pub term: i32,
    /// Candidates whose identity two live processes are using, with their incarnations.
    pub duplicates: &'a [(String, Vec<String>)],
    /// Candidates whose workload ran past the end of an earlier term, by term.
    pub overruns: &'a [(String, i32)],
    /// Which statuses may be left for later.
    pub may_wait: MayWait,
}

/// Conditions on candidates, Events and metrics for what was decided and done. Statuses that
/// `r.may_wait` allows are left for later; `written` remembers what this worker wrote.
pub(in crate::operator) async fn report(
    client: &Client,
    recorder: &Recorder,
    metrics: &Metrics,
    r: LeaseReport<'_>,
    written: &mut Written<Vec<Condition>>,
) -> Reported {
    let LeaseReport {
        key,
        candidates,
        decision,
        lease_exists,
        holder,
        term,
        duplicates,
        overruns,
        may_wait,
    } = r;
    if holder.is_some() || !candidates.is_empty() {
        metrics.lease_holder(key, holder, term);
    }
    let now = std::time::Instant::now();
    let mut current_of = |c: &LeaseCandidate| current_status(written, c, now);
    let holder_candidate = holder.and_then(|h| candidates.iter().find(|c| c.name_any() == h));
    // The holder's term as reported never goes down (the Lease deleted, its leaseTransitions
    // lowered by hand): a deposed holder's `Leader=True` that waits names a lower term than the
    // holder's, and a replica taking over remembers the highest.
    let term = holder_candidate
        .and_then(|c| conditions::leader_term(&current_of(c)))
        .map_or(term, |reported| reported.max(term));
    let facts = conditions::LeaseFacts {
        lease: &key.name,
        holder,
        term,
        duplicates,
        overruns,
    };
    let api: Api<LeaseCandidate> = Api::namespaced(client.clone(), &key.namespace);
    // Written now; and the deposed holders' that may wait, once the holder's is written.
    let (mut updates, mut deposed) = (Vec::new(), Vec::new());
    let mut waiting = false;
    let first_election_settling = first_election_settling(lease_exists, decision);
    // The holder's status is never left to wait: a deposed holder's may, behind it.
    let holder_term = holder_candidate.map(|_| term);
    let mut holder_shown = true;
    for c in candidates {
        let name = c.name_any();
        let current = &current_of(c);
        if first_election_settling && current.is_empty() {
            continue;
        }
        let status = match status_of(&name, current, decision, &facts, may_wait, holder_term) {
            Status::Unchanged => continue,
            Status::Waits => {
                waiting = true;
                continue;
            }
            Status::Write(status) => status,
        };
        count(metrics, key, &name, &status.events);
        holder_shown &= !status.is_holder;
        let after_holder = status.after_holder;
        let update = write_status(&api, recorder, c, status);
        if after_holder {
            deposed.push(update);
        } else {
            updates.push(update);
        }
    }
    let (done, deposed_wait) = write_all(updates, deposed, holder_shown).await;
    waiting |= deposed_wait;
    let complete = done.iter().all(|(_, d)| d.is_some());
    for (uid, read, wrote) in done.into_iter().filter_map(|(_, d)| d) {
        written.record(&uid, read, wrote, now);
    }
    decision_events(recorder, metrics, key, candidates, decision, holder);
    Reported { complete, waiting }
}

/// Writes `updates` side by side (candidates' statuses are independent of each other), then
/// `deposed`, the deposed holders' statuses, unless the holder's `Leader=True` is on the
/// server (`holder_shown`, or written just now): then they wait (`true`). Else they are written
/// now: a replica taking over would remember a deposed holder's `Leader=True` for want of the
/// holder's.
async fn write_all<F, T>(
    updates: Vec<F>,
    deposed: Vec<F>,
    holder_shown: bool,
) -> (Vec<(bool, Option<T>)>, bool)
where
    F: std::future::Future<Output = (bool, Option<T>)>,
{
    let mut done = futures::stream::iter(updates)
        .buffer_unordered(crate::operator::CONCURRENT_WRITES)
        .collect::<Vec<_>>()
        .await;
    let holder_shown = holder_shown || done.iter().any(|(h, d)| *h && d.is_some());
    if deposed.is_empty() {
        return (done, false);
    }
    if holder_shown {
        return (done, true);
    }
    done.extend(
        futures::stream::iter(deposed)
            .buffer_unordered(crate::operator::CONCURRENT_WRITES)
            .collect::<Vec<_>>()
            .await,
    );
    (done, false)
}

/// A lease's first election, while the arbiter waits for answers to its pings: a candidate
/// never reported on waits for the outcome (an ack window or two), else the new holder's
/// status would be written again a moment later. (Once the Lease exists, or for a candidate
/// with a status, every decision is reported: a holder that released and is elected again
/// shows both, and a wait that lasts, such as for a ping stamped ahead of this clock, does not
/// hold reports back.)
fn first_election_settling(lease_exists: bool, decision: &Decision) -> bool {
    !lease_exists && matches!(decision.action, Action::Ping { .. } | Action::WaitForAcks)
}

/// A candidate's status as the cache shows it.
fn cached_status(c: &LeaseCandidate) -> &[Condition] {
    c.status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default()
}

/// A candidate's status as last written: the cache's, or this worker's newer write.
fn current_status(
    written: &mut Written<Vec<Condition>>,
    c: &LeaseCandidate,
    now: std::time::Instant,
) -> Vec<Condition> {
    let cached = cached_status(c);
    let mine = written.current(&c.uid().unwrap_or_default(), cached, now);
    mine.map(|m| m.to_vec()).unwrap_or_else(|| cached.to_vec())
}

/// What becomes of a candidate's status.
enum Status {
    /// Nothing changes.
    Unchanged,
    /// It changes, but may wait until the worker has nothing else due.
    Waits,
    /// Written now (or right after the holder's).
    Write(NewStatus),
}

/// A status to write, and the Events of its transitions.
struct NewStatus {
    conditions: Vec<Condition>,
    events: Vec<(EventType, &'static str, String)>,
    is_holder: bool,
    /// A deposed holder's `Leader=False` that may wait behind the holder's `Leader=True`.
    after_holder: bool,
}

/// The status candidate `name` should have, against `current`: pure.
fn status_of(
    name: &str,
    current: &[Condition],
    decision: &Decision,
    facts: &conditions::LeaseFacts,
    may_wait: MayWait,
    holder_term: Option<i32>,
) -> Status {
    let desired = conditions::conditions(name, decision, facts);
    let Some(conditions) = conditions::merge(current, desired) else {
        return Status::Unchanged;
    };
    if may_wait.first && conditions::can_wait(current, &conditions) {
        return Status::Waits;
    }
    let after_holder = may_wait.deposed
        && holder_term.is_some_and(|t| conditions::leader_term(current).is_some_and(|was| was < t))
        && conditions::deposed_can_wait(current, &conditions);
    let (term, is_holder) = (facts.term, facts.holder == Some(name));
    // A holder the arbiter elects again at a new term (its lease lapsed, or it was deposed
    // while its status waited) is elected again; a term raised by hand elects nobody.
    let elected_again = is_holder
        && decision.action.elects().is_some()
        && conditions::leader_term(current).is_some_and(|was| was < term)
        && conditions::leader_term(&conditions) == Some(term);
    let events = transitions(current, &conditions, elected_again, facts.lease, term);
    Status::Write(NewStatus {
        conditions,
        events,
        is_holder,
        after_holder,
    })
}

/// Counts the transitions the metrics follow.
fn count(
    metrics: &Metrics,
    key: &LeaseKey,
    candidate: &str,
    events: &[(EventType, &'static str, String)],
) {
    for (_, reason, _) in events {
        match *reason {
            "DoubleHolder" => {
                metrics.double_holders.inc();
                tracing::error!(lease = %key, %candidate, "a workload ran past its term: double holder");
            }
            "StrategyConflict" => {
                metrics.strategy_conflicts.inc();
            }
            "SkewViolation" => {
                metrics.skew_violations.inc();
            }
            _ => {}
        }
    }
}

/// Writes candidate `c`'s new status, then publishes its Events. Returns whether `c` is the
/// holder, and what was written (its uid, the status read, the status written) unless the
/// write failed.
async fn write_status(
    api: &Api<LeaseCandidate>,
    recorder: &Recorder,
    c: &LeaseCandidate,
    status: NewStatus,
) -> (bool, Option<(String, Vec<Condition>, Vec<Condition>)>) {
    let NewStatus {
        conditions,
        events,
        is_holder,
        ..
    } = status;
    let (uid, read) = (c.uid().unwrap_or_default(), cached_status(c).to_vec());
    let name = c.name_any();
    // No observedGeneration (see conditions::conditions); null removes one an earlier version wrote.
    let patch = json!({ "status": { "conditions": conditions, "observedGeneration": null } });
    let done = match api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Some((uid, read, conditions)),
        // Gone: nothing left to report on it.
        Err(kube::Error::Api(s)) if s.code == 404 => {
            tracing::debug!(candidate = %name, "the candidate is gone; its status is not written");
            Some((uid, read, conditions))
        }
        Err(e) => {
            tracing::warn!(candidate = %name, error = %e, "updating candidate status failed");
            None
        }
    };
    for (type_, reason, note) in events {
        publish(recorder, &c.object_ref(&()), type_, reason, note);
    }
    (is_holder, done)
}

/// The Events of a candidate's conditions changing from `current` to `desired`, on transitions
/// only, so a steady state is quiet. `elected_again`: the holder was elected at a new term
/// without its `Leader` condition changing.
fn transitions(
    current: &[Condition],
    desired: &[Condition],
    elected_again: bool,
    lease: &str,
    term: i32,
) -> Vec<(EventType, &'static str, String)> {
    let became = |t: &str| conditions::is_true(desired, t) && !conditions::is_true(current, t);
    let mut events = Vec::new();
    if became(conditions::LEADER) || elected_again {
        events.push((
            EventType::Normal,
            "Elected",
            format!("elected holder of lease {lease} at term {term}"),
        ));
    }
    if conditions::is_true(current, conditions::LEADER)
        && !conditions::is_true(desired, conditions::LEADER)
    {
        events.push((
            EventType::Normal,
            "Deposed",
            format!("no longer holds lease {lease}"),
        ));
    }
    for (type_, reason) in [
        (conditions::DUPLICATE_IDENTITY, "DuplicateIdentity"),
        (conditions::DOUBLE_HOLDER, "DoubleHolder"),
        (conditions::STRATEGY_CONFLICT, "StrategyConflict"),
        (conditions::SKEW_VIOLATION, "SkewViolation"),
    ] {
        if became(type_) {
            events.push((EventType::Warning, reason, message(desired, type_)));
        }
    }
    events
}

/// The Events of the decision itself, on the holder: a switchover refused, a handover asked.
fn decision_events(
    recorder: &Recorder,
    metrics: &Metrics,
    key: &LeaseKey,
    candidates: &[Arc<LeaseCandidate>],
    decision: &Decision,
    holder: Option<&str>,
) {
    if let Action::RefuseSwitchover { reason } = &decision.action
        && let Some(h) = holder.and_then(|h| candidates.iter().find(|c| c.name_any() == h))
    {
        let note = format!("planned switchover of lease {} refused: {reason}", key.name);
        publish(
            recorder,
            &h.object_ref(&()),
            EventType::Warning,
            "SwitchoverRefused",
            note,
        );
    }
    if let Action::RequestHandover { to } = &decision.action
        && let Some(h) = holder.and_then(|h| candidates.iter().find(|c| c.name_any() == h))
    {
        metrics.handovers.inc();
        let note = format!("asked to hand lease {} over to {to}", key.name);
        publish(
            recorder,
            &h.object_ref(&()),
            EventType::Normal,
            "HandoverRequested",
            note,
        );
    }
}

fn message(conditions: &[Condition], type_: &str) -> String {
    conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
