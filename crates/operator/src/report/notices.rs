//! What a reconcile reports as Events, as values: each phase hands its Events here, in the order
//! it decided them, and the reconcile sends them all once the pass ends, whichever way it ends
//! ([`Notices::publish`], the one place a worker's Events leave it). A phase never holds the
//! recorder, and a test reads what a pass reported without an API server.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::EventType;

use super::Recorder;

/// One Event to publish: about `reference`, of `type_`, for `reason`.
pub(crate) struct Notice {
    pub reference: ObjectReference,
    pub type_: EventType,
    pub reason: &'static str,
    pub note: String,
}

/// A pass's Events, in the order they were decided.
#[derive(Default)]
pub(crate) struct Notices(Vec<Notice>);

impl Notices {
    /// A Normal Event about `reference`.
    pub fn normal(&mut self, reference: ObjectReference, reason: &'static str, note: String) {
        self.add(reference, EventType::Normal, reason, note);
    }

    /// A Warning Event about `reference`.
    pub fn warning(&mut self, reference: ObjectReference, reason: &'static str, note: String) {
        self.add(reference, EventType::Warning, reason, note);
    }

    pub fn add(
        &mut self,
        reference: ObjectReference,
        type_: EventType,
        reason: &'static str,
        note: String,
    ) {
        self.0.push(Notice {
            reference,
            type_,
            reason,
            note,
        });
    }

    /// Takes in another list's Events, after these.
    pub fn extend(&mut self, other: Notices) {
        self.0.extend(other.0);
    }

    /// Sends every Event, in order (in the background: [`super::events::publish`]), and
    /// leaves the list empty.
    pub fn publish(&mut self, recorder: &Recorder) {
        for n in self.0.drain(..) {
            super::events::publish(recorder, &n.reference, n.type_, n.reason, n.note);
        }
    }

    /// The reasons, in order.
    #[cfg(test)]
    pub fn reasons(&self) -> Vec<&'static str> {
        self.0.iter().map(|n| n.reason).collect()
    }
}
