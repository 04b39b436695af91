//! Forced exits, as one reconcile carries them out: a lapsed holder whose pod still runs the
//! same containers is evicted or deleted (per `--on-depose` or the workload's annotation), and
//! forced exits left pending (a PodDisruptionBudget refused the eviction) are carried on,
//! whichever replica leads: they are recorded on the Lease.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Resource, ResourceExt};

use super::gather::Pass;
use super::lease_memory::LeaseMemory;
use crate::cache::candidate_index::owner_pod;
use crate::cache::{Caches, pod_facts};
use crate::force::holder_pods;
use crate::force::targets::{self, Deposer, Target};
use crate::key::LeaseKey;
use crate::metrics::{MethodLabels, Metrics};
use crate::reconcile::RETRY_FAILED_WRITE;
use crate::reconcile::Worker;
use crate::report::Notices;
use crate::single_active::{self, Plan};
use arbiter_api::lease::{
    self, HOLDER_POD_ANNOTATION, LeaseStore, PENDING_ANNOTATION, RESTARTS_ANNOTATION,
};
use arbiter_api::{LeaseCandidate, OnDepose};
use arbiter_election::decide::{Action, Decision};
use arbiter_election::proof::forced_exit_due;

/// The forced-exit phase of one pass, as a value: what it reads (the client, the caches, the
/// metrics) and the worker's memory it keeps (the pods to force out, the Lease it writes their
/// record on, the Events it reports), borrowed from the worker for the call.
pub(crate) struct ForcedExits<'w> {
    client: &'w kube::Client,
    caches: &'w Caches,
    metrics: &'w Metrics,
    deposer: &'w mut Deposer,
    leases: &'w mut LeaseMemory,
    notices: &'w mut Notices,
}

impl Worker {
    /// The forced-exit phase, over this worker's memory.
    pub(crate) fn forced_exits(&mut self) -> ForcedExits<'_> {
        ForcedExits {
            client: &self.client,
            caches: &self.caches,
            metrics: &self.metrics,
            deposer: &mut self.deposer,
            leases: &mut self.leases,
            notices: &mut self.notices,
        }
    }
}

impl ForcedExits<'_> {
    /// The pod a new holder deposes, to force out per policy, recorded on the Lease by the
    /// write that deposes it: a single-active workload's active pod, or an ordinary lease's
    /// lapsed holder's that still runs ([`ForcedExits::lapsed_target`]).
    pub(crate) fn deposed(&self, pass: &Pass, decision: &Decision) -> Option<Target> {
        let (key, candidates, lease) = (&pass.key, &pass.candidates, pass.lease.as_deref());
        match (&pass.plan, decision.action.elects()) {
            (Some(p), Some(holder)) => p.deposed(candidates, lease, Some(holder)),
            (Some(_), None) => None,
            (None, _) => self.lapsed_target(key, lease, decision, candidates),
        }
    }

    /// The pod of an ordinary lease's lapsed holder that kept running with the same
    /// containers (the pod its term was assigned in), to force out once `decision` deposes it:
    /// recorded by the write that deposes it.
    fn lapsed_target(
        &self,
        key: &LeaseKey,
        lease: Option<&Lease>,
        decision: &Decision,
        candidates: &[Arc<LeaseCandidate>],
    ) -> Option<Target> {
        let (
            Action::Assign {
                lapsed: Some(h), ..
            },
            Some(old),
        ) = (&decision.action, lease)
        else {
            return None;
        };
        let c = candidates.iter().find(|c| c.name_any() == *h)?;
        let pod = pod_facts::pod_of(c, self.caches)?;
        let uid = pod.uid().unwrap_or_default();
        // The pod its term was assigned in: as this process recorded it, else as arbiter wrote
        // it on the Lease (a hand-written uid or count is no record).
        let by_arbiter = |a: &str| arbiter_api::written_by_arbiter(&old.metadata, a);
        let assigned_in = match self.caches.held.term_of(key, h) {
            Some((_, pod)) => pod,
            None => old
                .annotations()
                .get(HOLDER_POD_ANNOTATION)
                .filter(|_| by_arbiter(HOLDER_POD_ANNOTATION))
                .cloned(),
        };
        let recorded = old
            .annotations()
            .get(RESTARTS_ANNOTATION)
            .filter(|_| by_arbiter(RESTARTS_ANNOTATION))
            .and_then(|v| v.parse::<i64>().ok());
        tracing::debug!(lease = %key, lapsed = %h, ?recorded, restarts = pod_facts::restarts(&pod), "lapsed holder's pod still exists");
        // The pod the term was assigned in (as recorded then: a term assigned without a pod
        // has none to force out), with the same containers, and not all of them reported
        // ended. Whether the pod declares the lease is checked before anything is done to it.
        let restarts = pod_facts::restarts(&pod);
        forced_exit_due(
            assigned_in.as_deref(),
            recorded,
            uid.as_str(),
            restarts,
            pod_facts::nothing_runs(&pod),
        )
        .then(|| Target::new(h, &pod.name_any(), &uid, restarts))
    }

    /// Forces out what was deposed and carries on pending forced exits (recorded on the Lease,
    /// by this or another replica), never the pod of the lease's holder as the API server has
    /// it now. Returns when to try again, if one is still pending.
    pub(crate) async fn force_out(
        &mut self,
        key: &LeaseKey,
        candidates: &[Arc<LeaseCandidate>],
        plan: Option<&Plan>,
        policy: OnDepose,
    ) -> Option<Duration> {
        // The Lease as this worker last wrote it this reconcile (an assignment, a renewal) or
        // as its cache shows it: the base of the record's compare-and-swap below.
        let latest = self.leases.newest(&self.caches.leases, key);
        let latest = latest.as_deref();
        let workload_pods: HashSet<String> = plan
            .into_iter()
            .flat_map(|p| p.pods.iter().filter_map(|pod| pod.uid()))
            .collect();
        let recorded = self.restore_pending(key, latest, candidates, &workload_pods);
        let (outcomes, retry) = if self.spare_holders(key, latest, candidates).await {
            let pods = self.caches.pods.clone();
            let ns = key.namespace.clone();
            // Only a pod that declares this lease itself, or that the operator selects as its
            // workload's (never one a candidate's writer named).
            let lease_name = key.name.clone();
            let may_force = |pod: &k8s_openapi::api::core::v1::Pod| {
                crate::cache::declared::declares(pod, &lease_name)
                    || pod.uid().is_some_and(|u| workload_pods.contains(&u))
            };
            self.deposer
                .attempt(
                    self.client,
                    key,
                    policy,
                    |name| pods.get(&ns, name).map(|p| (*p).clone()),
                    may_force,
                )
                .await
        } else {
            (Vec::new(), Some(RETRY_FAILED_WRITE))
        };
        let retry = self
            .record_pending(key, latest, recorded.as_deref(), candidates, retry)
            .await;
        self.publish_outcomes(key, candidates, plan, outcomes);
        retry
    }

    /// Takes up the forced exits recorded on the Lease (`latest`) that another replica left
    /// pending: only as arbiter wrote them (a hand edit's, or anyone else's, are refused and
    /// reported), and only for pods of this lease's candidates or workload. Returns what was
    /// recorded.
    fn restore_pending(
        &mut self,
        key: &LeaseKey,
        latest: Option<&Lease>,
        candidates: &[Arc<LeaseCandidate>],
        workload_pods: &HashSet<String>,
    ) -> Option<String> {
        let recorded = latest.and_then(|l| l.annotations().get(PENDING_ANNOTATION).cloned());
        let trusted = latest
            .is_some_and(|l| arbiter_api::written_by_arbiter(&l.metadata, PENDING_ANNOTATION));
        let ours: HashSet<String> = candidates
            .iter()
            .filter_map(|c| owner_pod(c).map(|(_, uid)| uid))
            .chain(workload_pods.iter().cloned())
            .collect();
        if let (false, Some(forged), Some(l)) = (trusted, recorded.as_deref(), latest) {
            let note = format!(
                "ignored pending forced exits that arbiter did not write ({} {forged:?}): removed",
                PENDING_ANNOTATION
            );
            tracing::warn!(lease = %key, "{note}");
            self.notices
                .warning(l.object_ref(&()), "ForcedExitRefused", note);
        }
        let restorable = recorded.as_deref().filter(|_| trusted);
        self.deposer
            .restore(key, restorable, |t| ours.contains(&t.uid));
        recorded
    }

    /// Drops the pods of the lease's holder (given the term again since it was deposed) from
    /// what is to be forced out: as this worker sees the Lease, and, before anything is forced
    /// out, as the API server has it now (a view that lags, e.g. after taking over from another
    /// replica, may not show it yet). `false` if the Lease could not be read: nothing is
    /// forced out this time.
    async fn spare_holders(
        &mut self,
        key: &LeaseKey,
        latest: Option<&Lease>,
        candidates: &[Arc<LeaseCandidate>],
    ) -> bool {
        let holding = latest
            .map(|l| holder_pods(l, candidates))
            .unwrap_or_default();
        self.deposer.spare(key, |t| holding.contains(&t.uid));
        if !self.deposer.has_pending(key) {
            return true;
        }
        match LeaseStore::new(self.client.clone(), &key.namespace)
            .get(&key.name)
            .await
        {
            Ok(now) => {
                let holding = now
                    .as_ref()
                    .map(|l| holder_pods(l, candidates))
                    .unwrap_or_default();
                self.deposer.spare(key, |t| holding.contains(&t.uid));
                true
            }
            Err(e) => {
                tracing::debug!(lease = %key, error = %e, "reading the Lease before forcing out failed (retried)");
                false
            }
        }
    }

    /// Records what is still pending on the Lease, for whichever replica leads next, if it
    /// changed from what was `recorded`. Returns `retry`, sooner if the record failed.
    async fn record_pending(
        &mut self,
        key: &LeaseKey,
        latest: Option<&Lease>,
        recorded: Option<&str>,
        candidates: &[Arc<LeaseCandidate>],
        mut retry: Option<Duration>,
    ) -> Option<Duration> {
        let pending = self.deposer.recorded(key);
        if pending.is_some() || !candidates.is_empty() {
            let n = pending.as_deref().map_or(0, |p| p.split(',').count());
            self.metrics.forced_exits_pending(key, n);
        }
        if let Some(l) = latest
            && pending.as_deref() != recorded
        {
            let mut l = l.clone();
            lease::set_annotation(&mut l, PENDING_ANNOTATION, pending.as_deref());
            match LeaseStore::new(self.client.clone(), &key.namespace)
                .replace(&l)
                .await
            {
                Ok(w) => self.leases.wrote(&self.caches.leases, key, Some(&l), w),
                Err(e) => {
                    tracing::debug!(lease = %key, error = %e, "recording pending forced exits failed (retried)");
                    let soon = RETRY_FAILED_WRITE;
                    retry = Some(retry.unwrap_or(soon).min(soon));
                }
            }
        }
        retry
    }

    /// Logs, counts and reports each forced exit's outcome (on the candidate, and on the
    /// workload if one governs the lease).
    fn publish_outcomes(
        &mut self,
        key: &LeaseKey,
        candidates: &[Arc<LeaseCandidate>],
        plan: Option<&Plan>,
        outcomes: Vec<(Target, targets::Outcome)>,
    ) {
        for (target, outcome) in outcomes {
            tracing::info!(lease = %key, pod = %target.pod, outcome = ?outcome, "forced exit");
            if let targets::Outcome::Forced(policy) = &outcome {
                self.metrics
                    .forced_depositions
                    .get_or_create(&MethodLabels {
                        method: policy.as_str().into(),
                    })
                    .inc();
            }
            let (Some((type_, reason, note)), Some(c)) = (
                outcome.event(&target),
                candidates.iter().find(|c| c.name_any() == target.candidate),
            ) else {
                continue;
            };
            if let Some(p) = plan {
                let r = single_active::workload_ref(&p.workload);
                self.notices.add(r, type_, reason, note.clone());
            }
            self.notices.add(c.object_ref(&()), type_, reason, note);
        }
    }
}
