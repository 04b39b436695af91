//! The operator's Event recorder: `events.k8s.io/v1` Events, a repeat counted on the first.
//!
//! Written here rather than taken from kube-runtime because its `Recorder` keeps a copy of every
//! Event it published, whole, for six minutes (to count repeats), and sweeps that copy under a
//! write lock at every publish: at 10,000 leases an election burst kept about 24 MB of Events,
//! and each publish walked them all. This one keeps, per Event it sent, the Event's name and how
//! many times it was sent (about 100 bytes), and sweeps at most once a minute.
//!
//! The Events are the ones kube's recorder writes (the reporter as reporting controller and
//! instance, `action` and `reason`, the object as `regarding`), with one difference: the note is
//! part of what makes a repeat. Two Events on one object with one reason but different notes
//! ("elected ... at term 3", "... at term 4") are two Events, not one whose count rises under the
//! first's note.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use serde_json::json;

/// How long a sent Event is counted on when it repeats (kube's and client-go's six minutes).
const SERIES_FOR: Duration = Duration::from_secs(6 * 60);
/// How often the Events older than [`SERIES_FOR`] are forgotten.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Publishes Events for the operator; clones share what was sent.
#[derive(Clone)]
pub struct Recorder {
    client: Client,
    reporter: Reporter,
    sent: Arc<Mutex<Sent>>,
}

/// The Events sent in the last [`SERIES_FOR`], by a hash of what makes a repeat.
#[derive(Default)]
struct Sent {
    by_key: HashMap<u64, Series>,
    swept: Option<Instant>,
}

/// One Event sent: its name, how many times, and when last.
struct Series {
    name: Box<str>,
    count: i32,
    last: Instant,
}

/// What one publish does: create a new Event, or count a repeat on the one sent before.
enum Send {
    Create,
    Repeat { name: Box<str>, count: i32 },
}

impl Recorder {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Recorder {
            client,
            reporter,
            sent: Arc::default(),
        }
    }

    /// Sends `ev` about the object `regarding`, in that object's namespace (`default` for a
    /// cluster-scoped one): a new Event, or, when the same one was sent in the last six minutes,
    /// its series' count and time raised.
    pub async fn publish(&self, ev: &Event, regarding: &ObjectReference) -> kube::Result<()> {
        let key = key(ev, regarding);
        let now = Instant::now();
        let send = self.next(key, now);
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
        let stamp = MicroTime(jiff::Timestamp::now());
        let name = match send {
            Send::Repeat { name, count } => {
                let series = EventSeries {
                    count,
                    last_observed_time: stamp,
                };
                let patch = json!({ "series": series });
                let params = PatchParams::default();
                events.patch(&name, &params, &Patch::Merge(&patch)).await?;
                name
            }
            Send::Create => {
                let event = self.event(ev, regarding, stamp);
                let created = events.create(&PostParams::default(), &event).await?;
                created.metadata.name.unwrap_or_default().into()
            }
        };
        let mut sent = self
            .sent
            .lock()
            .expect("the recorder's lock is never poisoned");
        let count = match sent.by_key.get(&key) {
            // Counted on the Event sent before (another publish may have counted meanwhile).
            Some(s) if s.name == name => s.count + 1,
            // New (a series over six minutes old, not swept yet, is replaced).
            _ => 1,
        };
        let series = Series {
            name,
            count,
            last: now,
        };
        sent.by_key.insert(key, series);
        Ok(())
    }

    /// Whether the Event with `key` is new or a repeat; forgets the old ones once a minute.
    fn next(&self, key: u64, now: Instant) -> Send {
        let mut sent = self
            .sent
            .lock()
            .expect("the recorder's lock is never poisoned");
        if sent
            .swept
            .is_none_or(|at| now.duration_since(at) >= SWEEP_EVERY)
        {
            sent.by_key
                .retain(|_, s| now.duration_since(s.last) < SERIES_FOR);
            sent.swept = Some(now);
        }
        match sent.by_key.get(&key) {
            Some(s) if now.duration_since(s.last) < SERIES_FOR => Send::Repeat {
                name: s.name.clone(),
                count: s.count + 1,
            },
            _ => Send::Create,
        }
    }

    /// The Event kube's recorder would create.
    fn event(&self, ev: &Event, regarding: &ObjectReference, at: MicroTime) -> K8sEvent {
        let controller = &self.reporter.controller;
        let object = regarding.name.as_deref().unwrap_or(controller);
        K8sEvent {
            metadata: ObjectMeta {
                namespace: regarding.namespace.clone(),
                name: Some(format!("{object}.{:x}", at.0.as_nanosecond())),
                ..Default::default()
            },
            action: Some(ev.action.clone()),
            reason: Some(ev.reason.clone()),
            note: ev.note.clone(),
            event_time: Some(at),
            regarding: Some(regarding.clone()),
            related: ev.secondary.clone(),
            reporting_controller: Some(controller.clone()),
            reporting_instance: Some(self.reporter.instance.clone().unwrap_or(controller.clone())),
            type_: Some(type_name(ev.type_).into()),
            ..Default::default()
        }
    }
}

fn type_name(t: EventType) -> &'static str {
    match t {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

/// What makes an Event a repeat of one sent before: its type, action, reason and note, and the
/// objects it is about (the reporter is the recorder's own).
fn key(ev: &Event, regarding: &ObjectReference) -> u64 {
    let mut h = DefaultHasher::new();
    type_name(ev.type_).hash(&mut h);
    (&ev.action, &ev.reason, &ev.note).hash(&mut h);
    for r in std::iter::once(regarding).chain(ev.secondary.as_ref()) {
        (&r.api_version, &r.kind, &r.namespace, &r.name, &r.uid).hash(&mut h);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_api::{Answer, FakeApi};

    fn reference(name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("arbiter.dev/v1alpha1".into()),
            kind: Some("LeaseCandidate".into()),
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        }
    }

    fn event(reason: &str, note: &str) -> Event {
        Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note.into()),
            action: reason.into(),
            secondary: None,
        }
    }

    /// The same Event again is counted on the first (a merge patch of its series); a different
    /// note, reason or object is a new Event.
    #[tokio::test]
    async fn a_repeat_is_counted_on_the_event_sent_before() {
        let (client, api) = FakeApi::new(|r| Answer::echo(r, 201));
        let recorder = Recorder::new(
            client,
            Reporter {
                controller: "arbiter".into(),
                instance: Some("arbiter-0".into()),
            },
        );
        let (a, b) = (reference("a"), reference("b"));
        let sent = [
            ("bad version", &a),
            ("bad version", &a),
            ("bad version", &a),
            ("other", &a),
            ("bad version", &b),
        ];
        for (note, regarding) in sent {
            recorder
                .publish(&event("Refused", note), regarding)
                .await
                .unwrap();
        }
        let requests = api.requests();
        let methods: Vec<&str> = requests.iter().map(|r| r.method.as_str()).collect();
        assert_eq!(methods, ["POST", "PATCH", "PATCH", "POST", "POST"]);
        let first: K8sEvent = serde_json::from_str(&requests[0].body).unwrap();
        let name = first.metadata.name.unwrap();
        assert!(name.starts_with("a."), "{name}");
        assert_eq!(first.reporting_instance.as_deref(), Some("arbiter-0"));
        assert_eq!(first.type_.as_deref(), Some("Warning"));
        assert!(
            requests[1]
                .path
                .ends_with(&format!("/namespaces/ns/events/{name}"))
        );
        let counts: Vec<i64> = requests[1..3]
            .iter()
            .map(|r| {
                let patch: serde_json::Value = serde_json::from_str(&r.body).unwrap();
                patch["series"]["count"].as_i64().unwrap()
            })
            .collect();
        assert_eq!(counts, [2, 3]);
    }
}
