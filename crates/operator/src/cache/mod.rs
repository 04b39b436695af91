//! The operator's caches and the watches that fill them: LeaseCandidates, the Leases it manages
//! (label `arbiter.dev/managed`), the pods it follows (only candidates' and single-active
//! workloads' pods, kept slim: [`crate::cache::pods`], [`crate::cache::slim`]), and annotated Deployments and
//! StatefulSets. Every change enqueues the leases it may affect. Every replica keeps these
//! warm, leader or not.

pub(crate) mod candidate_index;
pub(crate) mod declared;
#[cfg(test)]
pub(crate) mod feed;
pub(crate) mod incarnations;
pub(crate) mod lease_records;
pub(crate) mod limits;
pub(crate) mod liveness;
pub(crate) mod namespaces;
pub mod pod_facts;
pub(crate) mod pods;
pub(crate) mod slim;
pub(crate) mod stopped;
pub(crate) mod stores;
pub(crate) mod unwrapped;
mod watch;
pub(crate) mod workloads;
pub(crate) mod written;

pub use watch::watch_all;

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;

use crate::cache::candidate_index::CandidateIndex;
use crate::cache::incarnations::IncarnationLog;
use crate::cache::lease_records::Records;
use crate::cache::liveness::Liveness;
use crate::cache::pods::FollowedPods;
use crate::cache::stopped::StoppedPods;
use crate::cache::stores::Cached;
use crate::cache::workloads::AnnotatedWorkloads;
use crate::term::held::Held;
use arbiter_api::LeaseCandidate;

/// The caches every replica keeps warm, leader or not.
#[derive(Clone)]
pub struct Caches {
    pub candidates: Cached<LeaseCandidate>,
    pub leases: Cached<Lease>,
    pub pods: FollowedPods,
    /// Kept for readiness: [`Self::workloads`] is complete once these are.
    pub deployments: Cached<Deployment>,
    pub stateful_sets: Cached<StatefulSet>,
    /// The single-active workloads, from the Deployment and StatefulSet watches.
    pub workloads: AnnotatedWorkloads,
    /// Every candidate's recent incarnation stamps (duplicate identities).
    pub incarnations: IncarnationLog,
    /// What each candidate was heard to write: answers to this process's pings, renewals
    /// seen as they happened.
    pub liveness: Liveness,
    /// The candidates of each lease.
    pub by_lease: CandidateIndex,
    /// Pods confirmed stopped (terminal, or deleted after their containers stopped).
    pub stopped_pods: StoppedPods,
    /// Pods labelled for injection that run unwrapped, by lease ([`unwrapped`]).
    pub unwrapped: unwrapped::UnwrappedPods,
    /// When each Lease record was delivered (the start of its age).
    pub records: Records,
    /// Each lease's holder as this process last saw or assigned it (the workers' memory; the
    /// Lease watch bumps it as it delivers a holder's records).
    pub held: Held,
    /// Which candidates each namespace's limits admit ([`limits`]).
    pub limits: limits::Tally,
    /// This install's instance (`--instance`): what its watches list, and the label of what it
    /// creates.
    pub instance: Option<String>,
    /// The namespaces this install arbitrates (`--namespace-selector`; all of the watch scope
    /// without one).
    pub arbitrated: namespaces::Arbitrated,
    /// One lock per namespace, held by a worker for a single-active lease's whole reconcile:
    /// role labels belong to pods, and two workloads (or a workload whose lease name changed)
    /// may select the same pods, so "demote, then promote" must not interleave across workers.
    pub single_active_locks: NamespaceLocks,
}

/// Per-namespace async locks (see [`Caches::single_active_locks`]).
#[derive(Clone, Default)]
pub struct NamespaceLocks(Arc<std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>);

impl NamespaceLocks {
    pub async fn lock(&self, namespace: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = self
            .0
            .lock()
            .unwrap()
            .entry(namespace.to_string())
            .or_default()
            .clone();
        lock.lock_owned().await
    }
}

impl Caches {
    /// Caches on these stores, with every index and memory empty.
    pub(crate) fn with(
        candidates: Cached<LeaseCandidate>,
        leases: Cached<Lease>,
        pods: FollowedPods,
        deployments: Cached<Deployment>,
        stateful_sets: Cached<StatefulSet>,
        by_lease: CandidateIndex,
        workloads: AnnotatedWorkloads,
    ) -> Caches {
        Caches {
            candidates,
            leases,
            pods,
            deployments,
            stateful_sets,
            workloads,
            incarnations: IncarnationLog::default(),
            liveness: Liveness::default(),
            by_lease,
            stopped_pods: StoppedPods::default(),
            unwrapped: unwrapped::UnwrappedPods::default(),
            records: Records::default(),
            held: Held::default(),
            limits: limits::Tally::default(),
            instance: None,
            arbitrated: namespaces::Arbitrated::all(),
            single_active_locks: NamespaceLocks::default(),
        }
    }
}
