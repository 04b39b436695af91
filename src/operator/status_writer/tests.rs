use std::sync::Mutex as StdMutex;

use tokio::sync::oneshot;

use super::super::written::tests::cond as leader;
use super::*;

fn update(uid: &str, status: &str, event: &'static str) -> StatusUpdate {
    StatusUpdate {
        lease: LeaseKey {
            namespace: "ns".into(),
            name: format!("lease-of-{uid}"),
        },
        name: uid.into(),
        uid: uid.into(),
        conditions: leader(status),
        events: vec![Note {
            type_: EventType::Normal,
            reason: event,
            text: String::new(),
        }],
        reference: ObjectReference::default(),
    }
}

/// A writer whose writes the test completes by hand: `started` lists each write as it starts
/// (candidate, Leader status, Events), `finish` completes the oldest in flight of a candidate.
/// A write as it started: (candidate, its Leader status, its Events).
type Started = (String, String, Vec<&'static str>);
/// A write in flight: its candidate, and the sender that finishes it.
type InFlight = (String, oneshot::Sender<bool>);

#[derive(Clone, Default)]
struct Fake {
    started: Arc<StdMutex<Vec<Started>>>,
    /// Writes in flight, each with the sender that finishes it.
    open: Arc<StdMutex<Vec<InFlight>>>,
    retried: Arc<StdMutex<Vec<LeaseKey>>>,
}

impl Fake {
    fn write(&self) -> impl Fn(StatusUpdate) -> futures::future::BoxFuture<'static, bool> + use<> {
        let me = self.clone();
        move |u: StatusUpdate| {
            let (tx, rx) = oneshot::channel();
            me.started.lock().unwrap().push((
                u.uid.clone(),
                u.conditions[0].status.clone(),
                u.events.iter().map(|n| n.reason).collect(),
            ));
            me.open.lock().unwrap().push((u.uid.clone(), tx));
            Box::pin(async move { rx.await.unwrap_or(false) })
        }
    }

    fn retry(&self) -> impl Fn(LeaseKey) + use<> {
        let me = self.clone();
        move |k| me.retried.lock().unwrap().push(k)
    }

    fn in_flight(&self) -> Vec<String> {
        self.open
            .lock()
            .unwrap()
            .iter()
            .map(|(u, _)| u.clone())
            .collect()
    }

    fn finish(&self, uid: &str, ok: bool) {
        let mut open = self.open.lock().unwrap();
        let at = open.iter().position(|(u, _)| u == uid).expect("in flight");
        let (_, tx) = open.remove(at);
        tx.send(ok).unwrap();
    }

    fn started(&self) -> Vec<Started> {
        self.started.lock().unwrap().clone()
    }
}

/// Lets the writer's task run until it waits again.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

fn spawn(fake: &Fake, in_flight: usize) -> (StatusWriter, tokio::task::JoinHandle<()>, Gauge) {
    let (writer, pending) = StatusWriter::new();
    let depth = Gauge::default();
    let task = tokio::spawn(drain(
        pending,
        in_flight,
        fake.write(),
        fake.retry(),
        depth.clone(),
    ));
    (writer, task, depth)
}

#[tokio::test]
async fn updates_of_one_candidate_coalesce_and_keep_their_events_in_order() {
    let fake = Fake::default();
    let (writer, pending) = StatusWriter::new();
    let now = Instant::now();
    // Handed over before the writer runs: a is elected then deposed, b elected.
    writer.submit(leader("False"), update("a", "True", "Elected"), now);
    writer.submit(leader("False"), update("a", "False", "Deposed"), now);
    writer.submit(vec![], update("b", "True", "Elected"), now);
    // Until written, the last hand-over stands for the cache.
    assert_eq!(
        writer.current("a", &leader("False"), now),
        Some(leader("False"))
    );
    assert_eq!(
        writer.current("b", &[], now + 10 * super::super::written::KEPT_FOR),
        Some(leader("True"))
    );
    let depth = Gauge::default();
    let task = tokio::spawn(drain(pending, 4, fake.write(), fake.retry(), depth.clone()));
    settle().await;
    assert_eq!(
        fake.started(),
        vec![
            (
                "a".to_string(),
                "False".to_string(),
                vec!["Elected", "Deposed"]
            ),
            ("b".to_string(), "True".to_string(), vec!["Elected"]),
        ]
    );
    assert_eq!(depth.get(), 2);
    fake.finish("a", true);
    fake.finish("b", true);
    settle().await;
    assert_eq!(depth.get(), 0);
    // Done: the memory stands until the cache shows it, at most KEPT_FOR.
    let later = Instant::now();
    assert_eq!(writer.current("b", &[], later), Some(leader("True")));
    assert_eq!(
        writer.current("b", &[], later + super::super::written::KEPT_FOR),
        None
    );
    assert!(fake.retried.lock().unwrap().is_empty());
    drop(writer);
    task.await.unwrap();
}

#[tokio::test]
async fn one_write_per_candidate_at_a_time_and_no_more_than_the_limit() {
    let fake = Fake::default();
    let (writer, task, _) = spawn(&fake, 2);
    let now = Instant::now();
    writer.submit(vec![], update("a", "True", "Elected"), now);
    writer.submit(vec![], update("b", "True", "Elected"), now);
    writer.submit(vec![], update("c", "True", "Elected"), now);
    settle().await;
    assert_eq!(fake.in_flight(), vec!["a", "b"], "two at most");
    // A newer update of a, while a's first write is in flight: it waits for it, c goes first.
    writer.submit(leader("True"), update("a", "False", "Deposed"), now);
    settle().await;
    fake.finish("a", true);
    settle().await;
    assert_eq!(fake.in_flight(), vec!["b", "c"]);
    fake.finish("b", true);
    settle().await;
    assert_eq!(fake.in_flight(), vec!["c", "a"]);
    let started = fake.started();
    assert_eq!(
        started.last().unwrap(),
        &("a".to_string(), "False".to_string(), vec!["Deposed"])
    );
    fake.finish("c", true);
    fake.finish("a", true);
    drop(writer);
    task.await.unwrap();
    assert_eq!(fake.started().len(), 4);
}

#[tokio::test]
async fn a_failed_write_is_forgotten_and_its_lease_retried_unless_a_newer_one_waits() {
    let fake = Fake::default();
    let (writer, task, _) = spawn(&fake, 1);
    let now = Instant::now();
    writer.submit(vec![], update("a", "True", "Elected"), now);
    settle().await;
    fake.finish("a", false);
    settle().await;
    // Forgotten: the cache counts again (and the next reconcile hands it over again).
    assert_eq!(writer.current("a", &[], now), None);
    assert_eq!(
        *fake.retried.lock().unwrap(),
        vec![LeaseKey {
            namespace: "ns".into(),
            name: "lease-of-a".into()
        }]
    );
    // A newer update waits while the write fails: it goes next (the failed one's Events were
    // published when it was answered), and nothing is retried.
    writer.submit(vec![], update("a", "True", "Elected"), now);
    settle().await;
    writer.submit(vec![], update("a", "False", "Deposed"), now);
    settle().await;
    fake.finish("a", false);
    settle().await;
    assert_eq!(fake.retried.lock().unwrap().len(), 1);
    assert_eq!(
        fake.started().last().unwrap(),
        &("a".to_string(), "False".to_string(), vec!["Deposed"])
    );
    assert_eq!(writer.current("a", &[], now), Some(leader("False")));
    fake.finish("a", true);
    drop(writer);
    task.await.unwrap();
}

#[tokio::test]
async fn an_urgent_update_goes_at_once_and_its_worker_hears_when_it_is_written() {
    let fake = Fake::default();
    let (writer, task, _) = spawn(&fake, 1);
    let now = Instant::now();
    // One report in flight (the most there may be), two waiting.
    writer.submit(vec![], update("a", "False", "x"), now);
    settle().await;
    writer.submit(vec![], update("b", "False", "y"), now);
    writer.submit(vec![], update("c", "False", "z"), now);
    // c becomes the holder: urgent, it goes at once (taking its waiting report along).
    let mut elected = writer.submit_urgent(vec![], update("c", "True", "Elected"), now);
    settle().await;
    assert_eq!(fake.in_flight(), vec!["a", "c"]);
    assert_eq!(
        fake.started().last().unwrap(),
        &("c".to_string(), "True".to_string(), vec!["z", "Elected"])
    );
    assert!(elected.try_recv().is_err(), "not written yet");
    fake.finish("c", true);
    settle().await;
    assert!(matches!(elected.try_recv(), Ok(true)));
    assert_eq!(
        fake.in_flight(),
        vec!["a"],
        "b still waits for a report's turn"
    );
    fake.finish("a", true);
    settle().await;
    assert_eq!(fake.in_flight(), vec!["b"]);
    fake.finish("b", true);
    // An urgent write that fails with nothing newer: its worker hears it, the lease is retried.
    let mut deposed = writer.submit_urgent(leader("True"), update("c", "False", "Deposed"), now);
    settle().await;
    fake.finish("c", false);
    settle().await;
    assert!(matches!(deposed.try_recv(), Ok(false)));
    assert_eq!(fake.retried.lock().unwrap().len(), 1);
    drop(writer);
    task.await.unwrap();
}
