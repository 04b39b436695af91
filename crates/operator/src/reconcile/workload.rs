//! What a single-active workload's lease adds to a reconcile: the operator is its pods' agent
//! (see [`crate::single_active`]). Four hooks, each a no-op for an ordinary lease, three of
//! them on the value [`PodsAgent`]:
//!
//! - [`PodsAgent::adjust_inputs`] (inputs): a pod is alive while Running and Ready, and a
//!   holder pod judged not running ends its term, as an agent's release would;
//! - [`PodsAgent::hand_over`] (before the write): a handover is done on the pod's behalf
//!   (demote, release, force the pod out);
//! - [`demote_deposed`] (after the write): every pod but the new holder's is demoted;
//! - [`PodsAgent::keep_roles`] (after the report): the role labels follow the lease, and the
//!   operator renews it for the active pod.
//!
//! Only for a term no agent took: an agent's term is the agent's (see
//! [`super::gather::Inputs::agent_took`]).

use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;

use super::gather::{Inputs, Pass};
use super::lease_memory::LeaseMemory;
use super::{Reconciled, Worker};
use crate::cache::Caches;
use crate::force::targets::Deposer;
use crate::key::LeaseKey;
use crate::metrics::Metrics;
use crate::report::Notices;
use crate::single_active::{self, Plan};
use arbiter_api::LeaseCandidate;
use arbiter_api::lease;
use arbiter_election::decide::{self, Action, Decision};

/// The operator as a single-active workload's pods' agent, as a value: what it reads (the
/// client, the caches, the metrics) and the worker's memory it keeps (the Leases it writes for
/// the pods, the pods to force out, the Events), borrowed from the worker for the call.
pub(crate) struct PodsAgent<'w> {
    client: &'w kube::Client,
    caches: &'w Caches,
    metrics: &'w Metrics,
    leases: &'w mut LeaseMemory,
    deposer: &'w mut Deposer,
    notices: &'w mut Notices,
}

impl Worker {
    /// The pods' agent, over this worker's memory.
    pub(crate) fn pods_agent(&mut self) -> PodsAgent<'_> {
        PodsAgent {
            client: &self.client,
            caches: &self.caches,
            metrics: &self.metrics,
            leases: &mut self.leases,
            deposer: &mut self.deposer,
            notices: &mut self.notices,
        }
    }
}

impl PodsAgent<'_> {
    /// The election's inputs as the pods' agent sees them: liveness from the pods, and a holder
    /// pod it judged not running ends its term. Counts the pods labelled active.
    pub(crate) fn adjust_inputs(
        &self,
        p: &Plan,
        key: &LeaseKey,
        candidates: &[Arc<LeaseCandidate>],
        agent_took: bool,
        inputs: &mut [decide::Candidate],
        lease_view: &mut Option<decide::Lease>,
    ) {
        p.adjust(candidates, inputs);
        // The operator is its workload's pods' agent: a holder pod it judged not running
        // (it is demoted before anyone is promoted) ends its term, as an agent's release
        // would. (Only for a term no agent took, and the candidates it made: an agent's term
        // ends on proof about the pod recorded at its assignment. The assignment that
        // follows is a compare-and-swap on this very record.)
        if let Some(l) = lease_view.as_mut()
            && !agent_took
            && let Some(h) = l.holder.as_deref()
            && candidates.iter().zip(inputs.iter()).any(|(c, input)| {
                input.name == h
                    && crate::workloads::sync::managed(c)
                    && input.pod == decide::PodState::Stopped
            })
        {
            l.holder_pod_stopped = true;
        }
        let active = p.active_pods();
        let labels = self.metrics.labels(key);
        self.metrics
            .active_pods
            .get_or_create(&labels)
            .set(active as i64);
        if active > 1 {
            self.metrics.double_holders.inc();
            tracing::error!(lease = %key, active, "more than one pod is labelled active");
        }
    }

    /// A handover asked of a holder pod the operator is the agent of: it demotes the pod,
    /// releases the lease and forces the pod out, on the pod's behalf. `Some` when it did.
    pub(crate) async fn hand_over(
        &mut self,
        pass: &Pass,
        inputs: &Inputs,
        decision: &Decision,
    ) -> anyhow::Result<Option<Reconciled>> {
        let (Some(p), Some(current)) = (&pass.plan, pass.lease.as_deref()) else {
            return Ok(None);
        };
        let (key, candidates) = (&pass.key, &pass.candidates);
        let holder = lease::holder(current).map(str::to_string);
        let (Action::RequestHandover { to }, Some(h)) = (&decision.action, holder) else {
            return Ok(None);
        };
        if inputs.agent_took || !p.holds_for(candidates, &h) {
            return Ok(None);
        }
        let deposed = p.deposed(candidates, Some(current), None);
        let released = p
            .release_for(self.client, key, current, &h, deposed.as_ref())
            .await?;
        self.leases
            .wrote(&self.caches.leases, key, Some(current), released);
        if let Some(t) = deposed {
            self.deposer.add(key, t);
        }
        let note = format!("pod {h} handed lease {} over to {to}", key.name);
        self.notices
            .normal(single_active::workload_ref(&p.workload), "Deposed", note);
        Ok(Some(Reconciled::after(Some(std::time::Duration::ZERO))))
    }

    /// The role labels follow the lease (demote first, then promote `holder`), with an
    /// `Elected` Event for a new term; the operator renews the lease for the active pod. An
    /// error (a labelling or renewal that failed) fails the reconcile, after the forced exits.
    pub(crate) async fn keep_roles(
        &mut self,
        pass: &Pass,
        inputs: &Inputs,
        decision: &Decision,
        written: Option<&Lease>,
        holder: Option<&str>,
        term: i32,
    ) -> anyhow::Result<()> {
        let Some(p) = &pass.plan else {
            return Ok(());
        };
        let (key, candidates) = (&pass.key, &pass.candidates);
        let current = written.or(pass.lease.as_deref());
        // The Event below reports the assignment, which is done: a failed labelling (retried)
        // must not lose it.
        let mut labelled = p.label(self.client, holder).await;
        if let Some(w) = written
            && let Some(h) = lease::holder(w)
            && decision.action.elects().is_some()
        {
            let version = candidates
                .iter()
                .find(|c| c.name_any() == h)
                .map(|c| c.spec.binary_version.clone());
            let note = format!(
                "pod {h} ({}) is active, term {term}",
                version.unwrap_or_default()
            );
            self.notices
                .normal(single_active::workload_ref(&p.workload), "Elected", note);
        }
        if labelled.is_ok()
            && written.is_none()
            && let (Some(l), Some(v)) = (current, inputs.lease.as_ref())
            && !inputs.agent_took
            && lease::holder(l).is_some_and(|h| p.holds_for(candidates, h))
        {
            match p.renew_for(self.client, key, l, v.unchanged_for).await {
                Ok(Some(renewed)) => self
                    .leases
                    .wrote(&self.caches.leases, key, Some(l), renewed),
                Ok(None) => {}
                Err(e) => labelled = Err(e),
            }
        }
        labelled
    }
}

/// Once the new holder's term is written (not before: a decision on a view the
/// compare-and-swap refuses must not touch the pods), every pod but the new holder's is
/// demoted at once. (The labelling after the report demotes again before it promotes
/// anyone, and fails the reconcile if it cannot.)
pub(crate) async fn demote_deposed(
    client: &kube::Client,
    pass: &Pass,
    decision: &Decision,
    written: Option<&Lease>,
) {
    let (true, Some(p), Some(holder)) = (written.is_some(), &pass.plan, decision.action.elects())
    else {
        return;
    };
    if let Err(e) = p.demote_all_but(client, Some(holder)).await {
        tracing::warn!(lease = %pass.key, error = %format!("{e:#}"), "demoting the deposed pod failed; trying again before anyone is promoted");
    }
}
