//! Events, published in the background so that a worker never waits for them.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};

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

    use kube::Client;
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
