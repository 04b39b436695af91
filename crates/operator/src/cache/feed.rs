//! The caches fed by hand, as the watches would feed them (for unit tests of a reconcile
//! without an API server to watch).

use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;

use super::Caches;
use super::candidate_index::CandidateIndex;
use super::pods::{Fetch, FollowedPods};
use super::stores::{Writer, store};
use super::workloads::AnnotatedWorkloads;
use crate::workloads::Workload;
use arbiter_api::LeaseCandidate;

/// Empty caches, and the writers that fill them.
pub(crate) struct Feed {
    pub caches: Caches,
    candidates: Writer<LeaseCandidate>,
    leases: Writer<Lease>,
    /// The pod fetches the caches asked for (a workload's pods, listed once).
    fetches: tokio::sync::mpsc::UnboundedReceiver<Fetch>,
}

impl Feed {
    pub fn new() -> Feed {
        let (candidates, candidate_writer) = store();
        let (leases, lease_writer) = store();
        let (deployments, _) = store();
        let (stateful_sets, _) = store();
        let (pods, fetches) = FollowedPods::new(Arc::new(|_| true), 1, Default::default());
        use crate::cache::stores::Cached;
        let caches = Caches::with(
            Cached::single(candidates),
            Cached::single(leases),
            pods,
            Cached::single(deployments),
            Cached::single(stateful_sets),
            CandidateIndex::default(),
            AnnotatedWorkloads::default(),
        );
        Feed {
            caches,
            candidates: candidate_writer,
            leases: lease_writer,
            fetches,
        }
    }

    /// `c` created or changed, as the candidate watch delivers it as it happens.
    pub fn candidate(&mut self, c: &LeaseCandidate) {
        self.candidates
            .apply_watcher_event(&watcher::Event::Apply(c.clone()));
        self.caches.incarnations.record(c);
        self.caches.liveness.delivered(c, true);
        self.caches.by_lease.insert(c);
    }

    /// `candidates` as a (re)list of the candidate watch delivers them: nothing is known of
    /// when they were written.
    pub fn listed(&mut self, candidates: &[&LeaseCandidate]) {
        self.candidates.apply_watcher_event(&watcher::Event::Init);
        for c in candidates {
            self.candidates
                .apply_watcher_event(&watcher::Event::InitApply((*c).clone()));
            self.caches.incarnations.record(c);
            self.caches.liveness.delivered(c, false);
            self.caches.by_lease.insert(c);
        }
        self.candidates
            .apply_watcher_event(&watcher::Event::InitDone);
    }

    /// `pod` created or changed, as the pod watch delivers it (slimmed, and proof of a stop
    /// if it is in a terminal phase).
    pub fn pod(&mut self, pod: &Pod) {
        if let Some((pod, deleted)) = self
            .caches
            .pods
            .apply_event(watcher::Event::Apply(pod.clone()))
        {
            self.caches.stopped_pods.record_event(&pod, deleted);
        }
    }

    /// `l` created or changed, as the Lease watch delivers it as it happens.
    pub fn lease(&mut self, l: &Lease) {
        let ev = watcher::Event::Apply(l.clone());
        self.leases.apply_watcher_event(&ev);
        self.caches
            .records
            .on_event(&self.caches.held, &ev, |_| true);
    }

    /// `l` deleted, as the Lease watch delivers it.
    pub fn lease_deleted(&mut self, l: &Lease) {
        let ev = watcher::Event::Delete(l.clone());
        self.leases.apply_watcher_event(&ev);
        self.caches
            .records
            .on_event(&self.caches.held, &ev, |_| false);
    }

    /// `deployment` created or changed, as the Deployment watch delivers it.
    pub fn deployment(&mut self, deployment: &Deployment) {
        self.caches.workloads.take_in(
            deployment,
            "Deployment",
            Workload::from_deployment(deployment),
            false,
        );
    }

    /// Answers the pod lists the caches asked for with `pods` (what the API server would
    /// list for the selector).
    pub fn list_pods(&mut self, pods: &[Pod]) {
        while let Ok(fetch) = self.fetches.try_recv() {
            self.caches.pods.done(&fetch, pods.to_vec());
        }
    }
}
