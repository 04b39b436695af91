//! The first phases of a reconcile: **gather** what the caches hold of one lease, once (its
//! candidates, its Lease, the workload that governs it), then build the pure inputs of the
//! election from it (each candidate's liveness and pod, the Lease read against the memory of
//! its holder, the rules).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use tokio::sync::OwnedMutexGuard;

use super::view::View;
use super::{Reconciled, Worker};
use crate::cache::pod_facts;
use crate::key::LeaseKey;
use crate::single_active::{self, Plan, Prepared};
use arbiter_api::lease;
use arbiter_api::{LeaseCandidate, OnDepose};
use arbiter_election::decide::{self, Rules};

/// One lease as the caches held it when the pass began.
pub(crate) struct Pass {
    pub key: LeaseKey,
    /// The lease's current candidates (those that expired were deleted).
    pub candidates: Vec<Arc<LeaseCandidate>>,
    /// The Lease as this worker last wrote or saw it (or read it, when arbiter did not make it).
    pub lease: Option<Arc<Lease>>,
    /// The single-active workload that governs the lease, with its pods.
    pub plan: Option<Plan>,
    /// When the next candidate without a pod expires.
    pub next_expiry: Option<Duration>,
    /// Nothing says who may hold the lease (no Lease naming a holder that did not release it,
    /// no memory), yet its term mark says a term may have
    /// been handed out before this replica became active: an unknown holder's term may run
    /// (a predecessor died between the Lease and its status, and the Lease was deleted).
    pub unknown_term: bool,
    /// A single-active lease's pass never interleaves with another of its namespace's.
    _serial: Option<OwnedMutexGuard<()>>,
}

impl Pass {
    /// What to do with a pod this lease's holder is deposed from.
    pub fn policy(&self, default: OnDepose) -> OnDepose {
        self.plan
            .as_ref()
            .map(|p| p.workload.on_depose)
            .unwrap_or(default)
    }
}

/// The election's inputs, built from a [`Pass`].
pub(crate) struct Inputs {
    pub candidates: Vec<decide::Candidate>,
    /// The Lease as the election sees it (`None`: there is none).
    pub lease: Option<decide::Lease>,
    /// The term remembered while the Lease is gone or names nobody.
    pub previous: Option<decide::Previous>,
    /// Why the holder's term ended (the leader-change metric's reason).
    pub term_ended: &'static str,
    pub rules: Rules,
    /// Candidates whose identity two live processes are using, with their incarnations.
    pub duplicates: Vec<(String, Vec<String>)>,
    /// An agent took the Lease's current term (it writes its incarnation with its first renew,
    /// before its workload starts): the operator never acts as that holder's agent, whatever a
    /// candidate's labels say (anyone who may write candidates can set them).
    pub agent_took: bool,
}

/// The outcome of gathering: a pass to decide on, or nothing more to do this time.
pub(crate) enum Gathered {
    Pass(Box<Pass>),
    Done(Reconciled),
}

/// How often a lease whose Lease belongs to another install is looked at again.
const ANOTHER_INSTANCE_LOOK: Duration = Duration::from_secs(60);

impl Worker {
    /// Gathers `key`'s lease: its candidates, its Lease, and the workload that governs it. A
    /// candidate that expired is deleted first; a single-active workload's pods are made
    /// candidates.
    pub(crate) async fn gather(&mut self, key: &LeaseKey) -> anyhow::Result<Gathered> {
        // A single-active lease's reconcile (its role labels) never interleaves with another
        // of the namespace's, whatever worker runs it: its lock is taken first, so that the
        // namespace check below is the pass's one.
        let serial = match self.caches.workloads.governing(key) {
            Some(_) => Some(self.caches.single_active_locks.lock(&key.namespace).await),
            None => None,
        };
        // A namespace this install does not arbitrate (`--namespace-selector`): nothing is
        // written there; its leases are enqueued again if its labels come to match. Checked
        // once per pass: a pass that saw it match finishes what it began (the cache lags the
        // Namespace's labels anyway, so a later check would only narrow a window that stays
        // open; the protocol holds with two arbiters writing for a while, as in an operator
        // failover: every Lease write is a compare-and-swap).
        match self.caches.arbitrated.covers(&key.namespace) {
            Some(true) => {}
            Some(false) => return Ok(Gathered::Done(Reconciled::after(None))),
            None => {
                let soon = Some(Duration::from_millis(500));
                return Ok(Gathered::Done(Reconciled::after(soon)));
            }
        }
        let mut candidates = self
            .caches
            .by_lease
            .candidates(key, &self.caches.candidates);
        let lease = match self.leases.newest(&self.caches.leases, key) {
            Some(l) => Some(l),
            None => self.adoption().foreign_lease(key).await?,
        };
        // Another install's Lease (`--instance`): never written; looked at again now and then,
        // in case it is deleted or relabelled.
        if let Some(l) = &lease
            && self.adoption().theirs(l)
        {
            return Ok(Gathered::Done(Reconciled::after(Some(
                ANOTHER_INSTANCE_LOOK,
            ))));
        }
        let next_expiry = self.expire_candidates(key, &mut candidates).await;
        let prepared = single_active::prepare(
            &self.client,
            &self.caches,
            &mut self.notices,
            key,
            &candidates,
            &mut self.reported,
        )
        .await?;
        let plan = match prepared {
            Prepared::CleanedUp | Prepared::Frozen => {
                return Ok(Gathered::Done(Reconciled::after(None)));
            }
            Prepared::Loading => {
                let soon = Some(Duration::from_millis(500));
                return Ok(Gathered::Done(Reconciled::after(soon)));
            }
            Prepared::Ordinary => None,
            Prepared::Workload(p) if serial.is_some() => Some(*p),
            // A workload that came to govern the lease since the pass began (`prepare` reads
            // the workloads again): looked at again at once, under its namespace's lock, since
            // role labels are written only under it.
            Prepared::Workload(_) => {
                return Ok(Gathered::Done(Reconciled::after(Some(Duration::ZERO))));
            }
        };
        self.metrics.candidates(key, candidates.len());
        let unknown_term = self.unknown_term(key, lease.as_deref(), &candidates).await;
        Ok(Gathered::Pass(Box::new(Pass {
            key: key.clone(),
            candidates,
            lease,
            plan,
            next_expiry,
            unknown_term,
            _serial: serial,
        })))
    }

    /// [`Pass::unknown_term`]: asked of the term ledger on each pass while nothing else is
    /// known (each worker reads a shard for it at most once: a lease's shard is always its
    /// worker's); a failed read counts as a term.
    async fn unknown_term(
        &mut self,
        key: &LeaseKey,
        lease: Option<&Lease>,
        candidates: &[Arc<LeaseCandidate>],
    ) -> bool {
        let holderless =
            lease.is_none_or(|l| lease::holder(l).is_none() && lease::released_by(l).is_none());
        if candidates.is_empty() || !holderless || self.caches.held.knows(key) {
            return false;
        }
        self.terms
            .handed_out_before(&key.namespace, &key.name)
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(lease = %key, error = %e, "reading the term mark; waiting a lease duration as if a term ran");
                true
            })
    }

    /// The election's inputs for `pass`: each candidate as heard and with its pod, the Lease
    /// as seen against the memory of its holder, and the rules (a workload may set its own
    /// skew).
    pub(crate) fn inputs(&mut self, pass: &Pass) -> Inputs {
        let Pass {
            key,
            candidates,
            lease,
            plan,
            unknown_term,
            ..
        } = pass;
        let valid = self.settings.rules.ack_valid_for;
        let heard: Vec<_> = candidates
            .iter()
            .map(|c| self.caches.liveness.judge(c, valid))
            .collect();
        let mut inputs: Vec<decide::Candidate> = candidates
            .iter()
            .enumerate()
            .map(|(i, c)| decide::Candidate {
                name: c.name_any(),
                binary_version: c.spec.binary_version.clone(),
                emulation_version: c.spec.emulation_version.clone(),
                strategy: c.spec.strategy.clone(),
                created: c
                    .creation_timestamp()
                    .map(|t| t.0)
                    .unwrap_or_else(jiff::Timestamp::now),
                ping: heard[i].ping,
                renewed_lately: heard[i].renewed_lately,
                pod: pod_facts::state(c, &self.caches),
                withdrawn: arbiter_api::withdrawn_incarnation(c).is_some(),
                registered: heard[i].registered,
            })
            .collect();
        let View {
            lease: mut lease_view,
            previous,
            term_ended,
        } = self.viewer().view(
            key,
            lease.as_deref(),
            candidates,
            *unknown_term,
            &mut inputs,
        );
        let duplicates: Vec<(String, Vec<String>)> = candidates
            .iter()
            .filter_map(|c| {
                Some((
                    c.name_any(),
                    self.caches
                        .incarnations
                        .duplicate(&key.namespace, &c.name_any())?,
                ))
            })
            .collect();
        let mut rules = self.settings.rules.clone();
        let agent_took = lease.as_deref().is_some_and(lease::incarnation_stamped);
        if let Some(p) = plan {
            self.pods_agent().adjust_inputs(
                p,
                key,
                candidates,
                agent_took,
                &mut inputs,
                &mut lease_view,
            );
            rules.max_skew = p.workload.max_skew.or(rules.max_skew);
        }
        Inputs {
            candidates: inputs,
            lease: lease_view,
            previous,
            term_ended,
            rules,
            duplicates,
            agent_took,
        }
    }
}
