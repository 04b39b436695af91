//! Reporting what was decided and done: candidates' conditions, Events, and metrics.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use super::metrics::Metrics;
use super::queue::LeaseKey;
use super::status;
use super::written::Written;
use crate::api::LeaseCandidate;
use crate::election::decide::{Action, Decision};

/// How many independent writes for one lease (candidates' statuses) are in flight at once.
const CONCURRENT_WRITES: usize = 8;

/// What [`report`] left to do.
pub(super) struct Reported {
    /// Every status that was due was written (a failed one is retried by the caller).
    pub complete: bool,
    /// Some statuses were left for when the worker has nothing else due
    /// ([`status::can_wait`]).
    pub waiting: bool,
}

/// Conditions on candidates, Events and metrics for what was decided and done. With
/// `may_wait` (the worker has other leases due), statuses that can wait are left for later.
#[allow(clippy::too_many_arguments)]
pub(super) async fn report(
    client: &Client,
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
    written: &mut Written<Vec<Condition>>,
    may_wait: bool,
) -> Reported {
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
    let api: Api<LeaseCandidate> = Api::namespaced(client.clone(), &key.namespace);
    let mut updates = Vec::new();
    let mut waiting = false;
    let now = std::time::Instant::now();
    // A lease's first election: while the arbiter waits for answers to its pings, a candidate
    // never reported on waits for the outcome (an ack window or two): written now, the new
    // holder's status would be written again a moment later. (Once the Lease exists, or for a
    // candidate with a status, every decision is reported: a holder that released and is
    // elected again shows both, and a wait that lasts, such as for a ping stamped ahead of this
    // clock, does not hold reports back.)
    let first_election_settling =
        !lease_exists && matches!(decision.action, Action::Ping { .. } | Action::WaitForAcks);
    for c in candidates {
        let name = c.name_any();
        let cached = c
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
        let uid = c.uid().unwrap_or_default();
        // What this worker wrote last, if the cache does not show it yet.
        let mine = written.current(&uid, cached, now);
        let current = mine.as_deref().unwrap_or(cached);
        if first_election_settling && current.is_empty() {
            continue;
        }
        let desired = status::conditions(&name, decision, &facts);
        let Some(conditions) = status::merge(current, desired) else {
            continue;
        };
        if may_wait && status::can_wait(current, &conditions) {
            waiting = true;
            continue;
        }
        // Events on transitions only, so a steady state is quiet.
        let became = |t: &str| status::is_true(&conditions, t) && !status::is_true(current, t);
        let mut events = Vec::new();
        if became(status::LEADER) {
            events.push((
                EventType::Normal,
                "Elected",
                format!("elected holder of lease {} at term {term}", key.name),
            ));
        }
        if status::is_true(current, status::LEADER) && !status::is_true(&conditions, status::LEADER)
        {
            events.push((
                EventType::Normal,
                "Deposed",
                format!("no longer holds lease {}", key.name),
            ));
        }
        if became(status::DUPLICATE_IDENTITY) {
            events.push((
                EventType::Warning,
                "DuplicateIdentity",
                message(&conditions, status::DUPLICATE_IDENTITY),
            ));
        }
        if became(status::DOUBLE_HOLDER) {
            metrics.double_holders.inc();
            tracing::error!(lease = %key, candidate = %name, "a workload ran past its term: double holder");
            events.push((
                EventType::Warning,
                "DoubleHolder",
                message(&conditions, status::DOUBLE_HOLDER),
            ));
        }
        if became(status::STRATEGY_CONFLICT) {
            metrics.strategy_conflicts.inc();
            events.push((
                EventType::Warning,
                "StrategyConflict",
                message(&conditions, status::STRATEGY_CONFLICT),
            ));
        }
        if became(status::SKEW_VIOLATION) {
            metrics.skew_violations.inc();
            events.push((
                EventType::Warning,
                "SkewViolation",
                message(&conditions, status::SKEW_VIOLATION),
            ));
        }
        // No observedGeneration (see status::conditions); null removes one an earlier version wrote.
        let patch = json!({ "status": { "conditions": conditions, "observedGeneration": null } });
        let (api, read) = (&api, cached.to_vec());
        updates.push(async move {
            let done = match api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => Some((uid, read, conditions)),
                Err(e) => {
                    tracing::warn!(candidate = %name, error = %e, "updating candidate status failed");
                    None
                }
            };
            for (type_, reason, note) in events {
                publish(recorder, &c.object_ref(&()), type_, reason, note);
            }
            done
        });
    }
    // Candidates' statuses are independent of each other: written side by side.
    let done = futures::stream::iter(updates)
        .buffer_unordered(CONCURRENT_WRITES)
        .collect::<Vec<_>>()
        .await;
    let complete = done.iter().all(Option::is_some);
    for (uid, read, wrote) in done.into_iter().flatten() {
        written.record(&uid, read, wrote, now);
    }
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
    Reported { complete, waiting }
}

fn message(conditions: &[Condition], type_: &str) -> String {
    conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

/// Events sent to the API server at once; the others wait their turn, first come first.
const EVENTS_IN_FLIGHT: usize = 8;
static EVENTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(EVENTS_IN_FLIGHT);

/// Publishes an Event in the background: a worker does not wait for it. Events report what was
/// decided and done; waiting for each would add a round trip to the API server to every
/// election after its status write, and in a burst of elections (a node failure that takes out
/// hundreds of holders) the leases queue behind those round trips. At most [`EVENTS_IN_FLIGHT`]
/// are sent at once, the others waiting (their order roughly kept, not guaranteed). An Event
/// carries the time it is sent, so one that waited behind others (with many workers, in a
/// burst) is stamped late; the messages that matter name the term. One still waiting when the
/// process exits is lost, as one whose request fails is (it is logged). Sent through the
/// operator's gate like every write: never after this replica lost its HA lease.
pub fn publish(
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
    let (recorder, reference) = (recorder.clone(), reference.clone());
    tokio::spawn(async move {
        // The semaphore is never closed.
        let Ok(_sending) = EVENTS.acquire().await else {
            return;
        };
        if let Err(e) = recorder.publish(&ev, &reference).await {
            tracing::warn!(reason = %ev.reason, error = %e, "publishing event failed");
        }
    });
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::time::{Duration, Instant};

    use kube::runtime::events::Reporter;

    use super::*;

    async fn until(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The publisher goes on while its Events are sent; at most `EVENTS_IN_FLIGHT` are sent at
    /// once, and every one is sent in the end.
    #[tokio::test]
    async fn events_are_sent_in_the_background_a_few_at_a_time() {
        let in_flight = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let sent = Arc::new(AtomicUsize::new(0));
        // The stand-in API server answers a request only once given a permit for it.
        let answer = Arc::new(tokio::sync::Semaphore::new(0));
        let service = {
            let (in_flight, peak, sent, answer) = (
                in_flight.clone(),
                peak.clone(),
                sent.clone(),
                answer.clone(),
            );
            tower::service_fn(move |req: http::Request<kube::client::Body>| {
                let (in_flight, peak, sent, answer) = (
                    in_flight.clone(),
                    peak.clone(),
                    sent.clone(),
                    answer.clone(),
                );
                async move {
                    let now = in_flight.fetch_add(1, SeqCst) + 1;
                    peak.fetch_max(now, SeqCst);
                    let body = http_body_util::BodyExt::collect(req.into_body())
                        .await?
                        .to_bytes();
                    answer.acquire().await?.forget();
                    in_flight.fetch_sub(1, SeqCst);
                    sent.fetch_add(1, SeqCst);
                    // The Event as created: what was sent.
                    Ok::<_, tower::BoxError>(
                        http::Response::builder()
                            .status(201)
                            .header("content-type", "application/json")
                            .body(kube::client::Body::from(body.to_vec()))
                            .unwrap(),
                    )
                }
            })
        };
        let recorder = Recorder::new(
            Client::new(service, "ns"),
            Reporter {
                controller: "arbiter".into(),
                instance: None,
            },
        );
        let reference = ObjectReference {
            api_version: Some("arbiter.dev/v1alpha1".into()),
            kind: Some("LeaseCandidate".into()),
            name: Some("c".into()),
            namespace: Some("ns".into()),
            uid: Some("u".into()),
            ..Default::default()
        };
        for i in 0..20 {
            publish(
                &recorder,
                &reference,
                EventType::Normal,
                "Elected",
                format!("elected holder of lease l at term {i}"),
            );
        }
        // Nothing is answered yet: the sender holds as many requests as it may.
        until("the most allowed are in flight", || {
            in_flight.load(SeqCst) == EVENTS_IN_FLIGHT
        })
        .await;
        assert_eq!(sent.load(SeqCst), 0);
        answer.add_permits(20);
        until("every Event is sent", || sent.load(SeqCst) == 20).await;
        assert_eq!(
            peak.load(SeqCst),
            EVENTS_IN_FLIGHT,
            "more Events in flight than allowed"
        );
    }
}
