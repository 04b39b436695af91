//! Candidates' statuses, and the Events of their transitions, written apart from the elections.
//!
//! A worker decides, writes the Lease, and hands the conditions it wants on each candidate to
//! the status writer; it goes on to its next lease without waiting for them. In a burst of
//! elections (a node failure that takes out hundreds of holders at once) the Lease writes are
//! what restores service; the conditions and Events report it, and they may come a moment later.
//! The writer keeps at most [`IN_FLIGHT`] writes in flight, so the workers' own writes (pings,
//! term marks, Leases) get most of what the API server can take.
//!
//! One kind of status is not a report: a `Leader` condition turned True (or back to False) is
//! what a replica taking over remembers a holder by when the Lease has been deleted or edited
//! by hand ([`super::held`]). Those are **urgent**: written at once, ahead of every pending
//! report and whatever the number in flight, and the worker waits for them, as it waits for its
//! Lease write, before it goes on.
//!
//! Per candidate (by uid) the writes keep their order: a newer hand-over replaces a pending one
//! (its conditions win; the Events of both are published, in order) and waits while an older
//! one is in flight. The Events of a write are published once it is answered (an answer lost
//! to a timeout may hide a write that was applied, whose transition no retry would see again). What the workers
//! remember handing over ([`Written`]) stands, however long the write waits, until it is done;
//! a write that fails is forgotten (the cache counts again) and its lease reconciled again
//! after [`RETRY_AFTER`], which hands the conditions over again.
//!
//! The writer runs only while this replica is the arbiter, beside its workers: if it ended, the
//! process would stop (a leader whose statuses are never written is not left running).

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{EventType, Recorder};
use prometheus_client::metrics::gauge::Gauge;
use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use super::queue::{Enqueue, LeaseKey};
use super::report::publish;
use super::written::Written;
use crate::api::LeaseCandidate;

/// How many status writes that nobody waits for are in flight at once, whatever the number
/// of workers.
pub const IN_FLIGHT: usize = 4;

/// After a failed write, when its lease is reconciled again.
pub const RETRY_AFTER: Duration = Duration::from_secs(2);

/// An Event to publish on a candidate once its status is written.
#[derive(Clone, Debug, PartialEq)]
pub struct Note {
    pub type_: EventType,
    pub reason: &'static str,
    pub text: String,
}

/// The conditions a candidate should carry, and the Events of their transitions.
#[derive(Clone, Debug)]
pub struct StatusUpdate {
    /// The lease the candidate competes for (reconciled again if the write fails).
    pub lease: LeaseKey,
    pub name: String,
    pub uid: String,
    pub conditions: Vec<Condition>,
    pub events: Vec<Note>,
    pub reference: ObjectReference,
}

/// The workers' side: hands updates over, and remembers them until they are written.
#[derive(Clone)]
pub struct StatusWriter {
    tx: mpsc::UnboundedSender<(StatusUpdate, Option<oneshot::Sender<bool>>)>,
    written: Arc<Mutex<Written<Vec<Condition>>>>,
}

impl StatusWriter {
    /// A writer's two sides: the handle the workers share, and the queue [`write_statuses`]
    /// works through.
    pub fn new() -> (StatusWriter, Pending) {
        let (tx, rx) = mpsc::unbounded_channel();
        let written = Arc::new(Mutex::new(Written::default()));
        let pending = Pending {
            rx,
            written: written.clone(),
        };
        (StatusWriter { tx, written }, pending)
    }

    /// The conditions last handed over for candidate `uid`, while its cache (showing `cached`)
    /// does not show them yet; `None` when the cache counts.
    pub fn current(&self, uid: &str, cached: &[Condition], now: Instant) -> Option<Vec<Condition>> {
        self.written.lock().unwrap().current(uid, cached, now)
    }

    /// Hands `update` over, written over `read` (the conditions as the cache showed them).
    pub fn submit(&self, read: Vec<Condition>, update: StatusUpdate, now: Instant) {
        self.hand_over(read, update, None, now);
    }

    /// Hands `update` over ahead of every pending one; the answer says whether it (or a newer
    /// update of the same candidate) was written.
    pub fn submit_urgent(
        &self,
        read: Vec<Condition>,
        update: StatusUpdate,
        now: Instant,
    ) -> oneshot::Receiver<bool> {
        let (tx, rx) = oneshot::channel();
        self.hand_over(read, update, Some(tx), now);
        rx
    }

    fn hand_over(
        &self,
        read: Vec<Condition>,
        update: StatusUpdate,
        waiter: Option<oneshot::Sender<bool>>,
        now: Instant,
    ) {
        // Recorded and sent under one lock: the writer, deciding about a failed write under
        // the same lock, sees every hand-over recorded in its channel.
        let mut written = self.written.lock().unwrap();
        written.record_pending(&update.uid, read, update.conditions.clone(), now);
        // The receiver lives as long as the workers; if it is gone the process is exiting.
        let _ = self.tx.send((update, waiter));
    }
}

/// The writer's side of [`StatusWriter::new`].
pub struct Pending {
    rx: mpsc::UnboundedReceiver<(StatusUpdate, Option<oneshot::Sender<bool>>)>,
    written: Arc<Mutex<Written<Vec<Condition>>>>,
}

/// Writes candidates' statuses through the API server, then publishes their Events. Returns
/// only when every [`StatusWriter`] is gone.
pub async fn write_statuses(
    pending: Pending,
    client: Client,
    recorder: Recorder,
    enqueue: Enqueue,
    depth: Gauge,
) {
    let write = move |u: StatusUpdate| {
        let (client, recorder) = (client.clone(), recorder.clone());
        async move {
            let api: Api<LeaseCandidate> = Api::namespaced(client, &u.lease.namespace);
            // No observedGeneration (see status::conditions); null removes one an earlier
            // version wrote.
            let patch =
                json!({ "status": { "conditions": u.conditions, "observedGeneration": null } });
            let written = match api
                .patch_status(&u.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => true,
                Err(e) => {
                    tracing::warn!(candidate = %u.name, error = %e, "updating candidate status failed; retrying");
                    false
                }
            };
            // Whatever the answer: a write that timed out may have been applied, and then no
            // retry would see the transition again. (One that failed may publish twice.)
            for n in &u.events {
                publish(&recorder, &u.reference, n.type_, n.reason, n.text.clone()).await;
            }
            written
        }
    };
    let retry = move |key: LeaseKey| {
        let enqueue = enqueue.clone();
        tokio::spawn(async move {
            tokio::time::sleep(RETRY_AFTER).await;
            enqueue.key(key);
        });
    };
    drain(pending, IN_FLIGHT, write, retry, depth).await;
}

/// A pending update, how many hand-overs it stands for (a newer one replaces a pending one,
/// and then stands for both), and the workers waiting for it if it is urgent.
struct Queued {
    update: StatusUpdate,
    handed: usize,
    waiters: Vec<oneshot::Sender<bool>>,
}

impl Queued {
    fn urgent(&self) -> bool {
        !self.waiters.is_empty()
    }

    /// Takes `newer`'s place in line: its conditions win, both Events are kept, in order.
    fn absorb(&mut self, newer: Queued) {
        self.update.events.extend(newer.update.events);
        self.update.conditions = newer.update.conditions;
        self.update.reference = newer.update.reference;
        self.update.lease = newer.update.lease;
        self.update.name = newer.update.name;
        self.handed += newer.handed;
        self.waiters.extend(newer.waiters);
    }
}

/// What waits to be written: one update per candidate, in two lines (urgent, and the others),
/// each first come first. A line may keep a candidate that left it (written, or moved to the
/// urgent line): such entries are skipped and dropped when met.
#[derive(Default)]
struct Line {
    queued: HashMap<String, Queued>,
    urgent: VecDeque<String>,
    normal: VecDeque<String>,
}

impl Line {
    /// Queues `q`: it joins a pending update of the same candidate (which moves to the urgent
    /// line if `q` is urgent), or waits last in its line.
    fn push(&mut self, q: Queued) {
        let uid = q.update.uid.clone();
        let urgent = match self.queued.get_mut(&uid) {
            Some(older) => {
                let promote = q.urgent() && !older.urgent();
                older.absorb(q);
                if !promote {
                    return;
                }
                true
            }
            None => {
                let urgent = q.urgent();
                self.queued.insert(uid.clone(), q);
                urgent
            }
        };
        if urgent {
            self.urgent.push_back(uid);
        } else {
            self.normal.push_back(uid);
        }
    }

    /// The next update of the urgent line (`urgent`) or the other, first come first, of a
    /// candidate with no write in flight.
    fn pop(&mut self, urgent: bool, writing: &HashSet<String>) -> Option<Queued> {
        let queued = &self.queued;
        let line = if urgent {
            &mut self.urgent
        } else {
            &mut self.normal
        };
        let belongs = |uid: &String| queued.get(uid).is_some_and(|q| q.urgent() == urgent);
        while line.front().is_some_and(|u| !belongs(u)) {
            line.pop_front();
        }
        let at = line
            .iter()
            .position(|u| belongs(u) && !writing.contains(u))?;
        let uid = line.remove(at)?;
        self.queued.remove(&uid)
    }

    fn len(&self) -> usize {
        self.queued.len()
    }
}

/// The writer's loop, over any `write` (true: written): one at a time per candidate, pending
/// ones coalesced; urgent ones at once (their workers wait, so there are few), the others at
/// most `in_flight` at once.
async fn drain<W, F>(
    mut pending: Pending,
    in_flight: usize,
    write: W,
    retry: impl Fn(LeaseKey),
    depth: Gauge,
) where
    W: Fn(StatusUpdate) -> F,
    F: Future<Output = bool>,
{
    let mut line = Line::default();
    let mut writing: HashSet<String> = HashSet::new();
    let mut running = FuturesUnordered::new();
    let mut reports_running = 0;
    let mut open = true;
    loop {
        loop {
            let q = match line.pop(true, &writing) {
                Some(q) => q,
                None if reports_running < in_flight => match line.pop(false, &writing) {
                    Some(q) => q,
                    None => break,
                },
                None => break,
            };
            let urgent = q.urgent();
            reports_running += usize::from(!urgent);
            writing.insert(q.update.uid.clone());
            let done = write(q.update.clone());
            running.push(async move { (q, urgent, done.await) });
        }
        depth.set((line.len() + running.len()) as i64);
        if !open && running.is_empty() && line.len() == 0 {
            return;
        }
        tokio::select! {
            update = pending.rx.recv(), if open => match update {
                Some(first) => {
                    // Everything already handed over, so that updates of one candidate
                    // coalesce before its write starts.
                    let more = std::iter::from_fn(|| pending.rx.try_recv().ok());
                    for (update, waiter) in std::iter::once(first).chain(more) {
                        line.push(Queued {
                            update,
                            handed: 1,
                            waiters: waiter.into_iter().collect(),
                        });
                    }
                }
                None => open = false,
            },
            Some((q, urgent, ok)) = running.next(), if !running.is_empty() => {
                let uid = q.update.uid.clone();
                writing.remove(&uid);
                reports_running -= usize::from(!urgent);
                let mut written = pending.written.lock().unwrap();
                // Every hand-over recorded so far is in the channel: a newer one of this
                // candidate is seen before its memory could be forgotten.
                while let Ok((update, waiter)) = pending.rx.try_recv() {
                    line.push(Queued {
                        update,
                        handed: 1,
                        waiters: waiter.into_iter().collect(),
                    });
                }
                match (ok, line.queued.contains_key(&uid)) {
                    (true, _) => {
                        written.done(&uid, q.handed, Instant::now());
                        for w in q.waiters {
                            let _ = w.send(true);
                        }
                    }
                    // A newer update waits: it stands for the failed one's hand-overs too, and
                    // answers its waiters (the failed one's Events were published).
                    (false, true) => {
                        let newer = line.queued.get_mut(&uid).expect("checked");
                        newer.handed += q.handed;
                        let promote = q.urgent() && !newer.urgent();
                        newer.waiters.extend(q.waiters);
                        if promote {
                            line.urgent.push_back(uid);
                        }
                    }
                    (false, false) => {
                        written.forget(&uid);
                        retry(q.update.lease);
                        for w in q.waiters {
                            let _ = w.send(false);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
