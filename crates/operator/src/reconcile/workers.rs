//! The leader's reconcile workers: each owns the leases its queue routes to it, and reconciles
//! them one at a time ([`Worker::reconcile`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::report::Recorder;
use kube::Client;

use super::{Reconciled, Worker};
use crate::Settings;
use crate::cache::Caches;
use crate::cache::written::Written;
use crate::force::targets::Deposer;
use crate::metrics::Metrics;
use crate::queue::Queue;
use crate::term::ledger::TermLedger;

/// The leader's reconcile workers, one per queue (`--concurrency`): each owns the leases its
/// queue routes to it, and the memory of them, so a lease is never reconciled twice at once.
/// Returns only if a queue closes.
pub async fn run(
    client: Client,
    caches: Caches,
    queues: Vec<Queue>,
    settings: Settings,
    metrics: Arc<Metrics>,
) {
    let recorder = Recorder::new(client.clone(), settings.reporter());
    let workers = queues.into_iter().enumerate().map(|(index, queue)| {
        let worker = Worker::new(
            client.clone(),
            caches.clone(),
            recorder.clone(),
            settings.clone(),
            metrics.clone(),
        );
        Box::pin(work(index, worker, queue))
    });
    // Candidates beyond a namespace's limits are reported beside the elections.
    let refusals = crate::report::limits::report_refusals(
        client.clone(),
        caches.limits.clone(),
        caches.candidates.clone(),
        caches.arbitrated.clone(),
        recorder.clone(),
        metrics.candidates_refused.clone(),
    );
    tokio::select! {
        _ = futures::future::select_all(workers) => {}
        () = refusals => {}
    }
}

impl Worker {
    /// A worker with nothing remembered yet.
    pub(crate) fn new(
        client: Client,
        caches: Caches,
        recorder: Recorder,
        settings: Settings,
        metrics: Arc<Metrics>,
    ) -> Worker {
        Worker {
            terms: TermLedger::new(client.clone()),
            client: client.clone(),
            caches,
            recorder,
            notices: Default::default(),
            settings,
            metrics,
            deposer: Deposer::default(),
            timers: HashMap::new(),
            reported: HashSet::new(),
            statuses: Written::default(),
            leases: super::lease_memory::LeaseMemory::default(),
            unwrapped: Default::default(),
        }
    }
}

/// One worker's loop: reconciles its queue's leases one at a time.
async fn work(index: usize, mut worker: Worker, mut queue: Queue) {
    while let Some(key) = queue.next().await {
        let start = Instant::now();
        worker.metrics.progress.begin(index);
        let result = worker.reconcile(&key).await;
        worker.metrics.progress.end(index);
        let requeue = match result {
            Ok(Reconciled { after, electing }) => {
                queue.electing(&key, electing);
                after
            }
            // An election under way stays so (its retry ranks from its start).
            Err(err) => {
                worker.metrics.reconcile_errors.inc();
                tracing::warn!(lease = %key, error = %format!("{err:#}"), "reconcile failed; retrying");
                Some(Duration::from_secs(2))
            }
        };
        worker
            .metrics
            .reconcile_duration
            .observe(start.elapsed().as_secs_f64());
        if let Some(after) = requeue {
            queue.requeue(key, after);
        }
    }
}
