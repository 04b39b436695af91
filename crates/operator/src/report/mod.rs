//! Reporting what was decided and done: candidates' conditions, Events, and metrics.

pub mod conditions;
pub(crate) mod events;
pub(crate) mod limits;
pub(crate) mod notices;
pub(crate) mod recorder;

pub use events::publish;
pub(crate) use notices::Notices;
pub use recorder::Recorder;

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use crate::cache::written::Written;
use crate::key::LeaseKey;
use crate::metrics::Metrics;
use arbiter_api::LeaseCandidate;
use arbiter_election::decide::{Action, Decision};

/// What [`report`] left to do.
pub(crate) struct Reported {
    /// Every status that was due was written (a failed one is retried by the caller).
    pub complete: bool,
}

/// What one pass reports on a lease.
pub(crate) struct LeaseReport<'a> {
    pub key: &'a LeaseKey,
    pub candidates: &'a [Arc<LeaseCandidate>],
    pub decision: &'a Decision,
    /// Whether the Lease exists (or was just written).
    pub lease_exists: bool,
    /// The holder to report (for the metrics), and the lease's term.
    pub holder: Option<&'a str>,
    pub term: i32,
    /// Candidates whose identity two live processes are using, with their incarnations.
    pub duplicates: &'a [(String, Vec<String>)],
    /// Candidates whose workload ran past the end of an earlier term, by term.
    pub overruns: &'a [(String, i32)],
}

/// Conditions on candidates, Events and metrics for what was decided and done: a candidate's
/// status is written only when its conditions change ([`conditions`]); `written` remembers
/// what this worker wrote.
pub(crate) async fn report(
    client: &Client,
    notices: &mut Notices,
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
    } = r;
    if holder.is_some() || !candidates.is_empty() {
        metrics.lease_holder(key, holder, term);
    }
    let now = std::time::Instant::now();
    let facts = conditions::LeaseFacts {
        term,
        duplicates,
        overruns,
    };
    let api: Api<LeaseCandidate> = Api::namespaced(client.clone(), &key.namespace);
    let first_election_settling = first_election_settling(lease_exists, decision);
    let mut updates = Vec::new();
    for c in candidates {
        let name = c.name_any();
        let current = &current_status(written, c, now);
        if first_election_settling && current.is_empty() {
            continue;
        }
        let Some(status) = status_of(&name, current, decision, &facts) else {
            continue;
        };
        count(metrics, key, &name, &status.events);
        updates.push(write_status(&api, c, status));
    }
    let done = futures::stream::iter(updates)
        .buffer_unordered(crate::CONCURRENT_WRITES)
        .collect::<Vec<_>>()
        .await;
    let complete = done.iter().all(|(w, _)| w.is_some());
    for (w, events) in done {
        if let Some((uid, read, wrote)) = w {
            written.record(&uid, read, wrote, now);
        }
        notices.extend(events);
    }
    decision_events(notices, metrics, key, candidates, decision, holder);
    Reported { complete }
}

/// A lease's first election, while the arbiter waits for answers to its pings: a candidate
/// never reported on waits for the outcome (an ack window or two), else a candidate that has
/// not answered yet would be reported a moment before it does. (Once the Lease exists, or for
/// a candidate with a status, every decision is reported.)
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

/// A status to write, and the Events of its transitions.
struct NewStatus {
    conditions: Vec<Condition>,
    events: Vec<(EventType, &'static str, String)>,
}

/// The status candidate `name` should have, against `current`, if it changes: pure.
fn status_of(
    name: &str,
    current: &[Condition],
    decision: &Decision,
    facts: &conditions::LeaseFacts,
) -> Option<NewStatus> {
    let desired = conditions::conditions(name, decision, facts, current);
    let conditions = conditions::merge(current, desired)?;
    let events = transitions(current, &conditions);
    Some(NewStatus { conditions, events })
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

/// Writes candidate `c`'s new status. Returns what was written (its uid, the status read, the
/// status written) unless the write failed, and its Events (reported either way).
async fn write_status(
    api: &Api<LeaseCandidate>,
    c: &LeaseCandidate,
    status: NewStatus,
) -> (Option<(String, Vec<Condition>, Vec<Condition>)>, Notices) {
    let NewStatus { conditions, events } = status;
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
    let mut notices = Notices::default();
    for (type_, reason, note) in events {
        notices.add(c.object_ref(&()), type_, reason, note);
    }
    (done, notices)
}

/// The Events of a candidate's conditions changing from `current` to `desired`: a problem
/// that appears, on its transition only, so a steady state is quiet.
fn transitions(
    current: &[Condition],
    desired: &[Condition],
) -> Vec<(EventType, &'static str, String)> {
    let became = |t: &str| conditions::is_true(desired, t) && !conditions::is_true(current, t);
    [
        (conditions::DUPLICATE_IDENTITY, "DuplicateIdentity"),
        (conditions::DOUBLE_HOLDER, "DoubleHolder"),
        (conditions::STRATEGY_CONFLICT, "StrategyConflict"),
        (conditions::SKEW_VIOLATION, "SkewViolation"),
    ]
    .into_iter()
    .filter(|(type_, _)| became(type_))
    .map(|(type_, reason)| (EventType::Warning, reason, message(desired, type_)))
    .collect()
}

/// The Events of the decision itself, on the holder: a switchover refused, a handover asked.
fn decision_events(
    notices: &mut Notices,
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
        notices.warning(h.object_ref(&()), "SwitchoverRefused", note);
    }
    if let Action::RequestHandover { to } = &decision.action
        && let Some(h) = holder.and_then(|h| candidates.iter().find(|c| c.name_any() == h))
    {
        metrics.handovers.inc();
        let note = format!("asked to hand lease {} over to {to}", key.name);
        notices.normal(h.object_ref(&()), "HandoverRequested", note);
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
