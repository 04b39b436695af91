//! Events, published in the background so that a worker never waits for them.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};

use super::Recorder;

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
    use std::time::{Duration, Instant};

    use kube::runtime::events::Reporter;

    use super::*;
    use crate::fake_api::{Answer, FakeApi};

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
        // The stand-in API server answers a request only once given a permit for it, with the
        // Event as created: what was sent.
        let answer = Arc::new(tokio::sync::Semaphore::new(0));
        let (client, api) = FakeApi::gated(|r| Answer::echo(r, 201), answer.clone());
        let recorder = Recorder::new(
            client,
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
            api.in_flight() == EVENTS_IN_FLIGHT
        })
        .await;
        assert_eq!(api.answered(), 0);
        answer.add_permits(20);
        until("every Event is sent", || api.answered() == 20).await;
        assert_eq!(
            api.peak(),
            EVENTS_IN_FLIGHT,
            "more Events in flight than allowed"
        );
    }
}
