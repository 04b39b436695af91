//! Reporting what was decided and done: candidates' conditions, Events, and metrics.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Resource, ResourceExt};

use super::metrics::Metrics;
use super::queue::LeaseKey;
use super::status;
use super::status_writer::{Note, StatusUpdate, StatusWriter};
use crate::api::LeaseCandidate;
use crate::election::decide::{Action, Decision};

/// Conditions on candidates, Events and metrics for what was decided and done.
#[allow(clippy::too_many_arguments)]
pub(super) async fn report(
    recorder: &Recorder,
    metrics: &Metrics,
    key: &LeaseKey,
    candidates: &[Arc<LeaseCandidate>],
    decision: &Decision,
    lease_exists: bool,
    holder: Option<&str>,
    term: i32,
    duplicates: &[(String, Vec<String>)],
    overruns: &[(String, i32)],
    statuses: &StatusWriter,
) {
    if holder.is_some() || !candidates.is_empty() {
        metrics.lease_holder(key, holder, term);
    }
    let facts = status::LeaseFacts {
        lease: &key.name,
        holder,
        term,
        duplicates,
        overruns,
    };
    let now = std::time::Instant::now();
    // A lease's first election: while the arbiter waits for answers to its pings, a candidate
    // never reported on waits for the outcome (an ack window or two): written now, the new
    // holder's status would be written again a moment later. (Once the Lease exists, or for a
    // candidate with a status, every decision is reported: a holder that released and is
    // elected again shows both, and a wait that lasts, such as for a ping stamped ahead of this
    // clock, does not hold reports back.)
    let first_election_settling =
        !lease_exists && matches!(decision.action, Action::Ping { .. } | Action::WaitForAcks);
    let mut urgent = Vec::new();
    for c in candidates {
        let name = c.name_any();
        let cached = c
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
        let uid = c.uid().unwrap_or_default();
        // What was handed over last, if the cache does not show it yet.
        let mine = statuses.current(&uid, cached, now);
        let current = mine.as_deref().unwrap_or(cached);
        if first_election_settling && current.is_empty() {
            continue;
        }
        let desired = status::conditions(&name, decision, &facts);
        let Some(conditions) = status::merge(current, desired) else {
            continue;
        };
        // Events on transitions only, so a steady state is quiet.
        let became = |t: &str| status::is_true(&conditions, t) && !status::is_true(current, t);
        let mut events = Vec::new();
        let mut note = |type_, reason, text| {
            events.push(Note {
                type_,
                reason,
                text,
            })
        };
        if became(status::LEADER) {
            note(
                EventType::Normal,
                "Elected",
                format!("elected holder of lease {} at term {term}", key.name),
            );
        }
        if status::is_true(current, status::LEADER) && !status::is_true(&conditions, status::LEADER)
        {
            note(
                EventType::Normal,
                "Deposed",
                format!("no longer holds lease {}", key.name),
            );
        }
        if became(status::DUPLICATE_IDENTITY) {
            note(
                EventType::Warning,
                "DuplicateIdentity",
                message(&conditions, status::DUPLICATE_IDENTITY),
            );
        }
        if became(status::DOUBLE_HOLDER) {
            metrics.double_holders.inc();
            tracing::error!(lease = %key, candidate = %name, "a workload ran past its term: double holder");
            note(
                EventType::Warning,
                "DoubleHolder",
                message(&conditions, status::DOUBLE_HOLDER),
            );
        }
        if became(status::STRATEGY_CONFLICT) {
            metrics.strategy_conflicts.inc();
            note(
                EventType::Warning,
                "StrategyConflict",
                message(&conditions, status::STRATEGY_CONFLICT),
            );
        }
        if became(status::SKEW_VIOLATION) {
            metrics.skew_violations.inc();
            note(
                EventType::Warning,
                "SkewViolation",
                message(&conditions, status::SKEW_VIOLATION),
            );
        }
        // Written by the status writer, apart from the elections; a Leader transition (the
        // memory a replica taking over inherits) at once, and waited for.
        let leader_changed = status::is_true(&conditions, status::LEADER)
            != status::is_true(current, status::LEADER);
        let update = StatusUpdate {
            lease: key.clone(),
            name,
            uid,
            conditions,
            events,
            reference: c.object_ref(&()),
        };
        if leader_changed {
            urgent.push(statuses.submit_urgent(cached.to_vec(), update, now));
        } else {
            statuses.submit(cached.to_vec(), update, now);
        }
    }
    // (A failed write was logged by the writer, which reconciles the lease again.)
    futures::future::join_all(urgent).await;
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
        )
        .await;
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
        )
        .await;
    }
}

fn message(conditions: &[Condition], type_: &str) -> String {
    conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

pub async fn publish(
    recorder: &Recorder,
    reference: &ObjectReference,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: reason.into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&ev, reference).await {
        tracing::warn!(reason, error = %e, "publishing event failed");
    }
}
