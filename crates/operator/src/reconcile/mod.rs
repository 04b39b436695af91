//! One lease's reconcile, in phases. Every change enqueues the affected `(namespace,
//! leaseName)`; each worker ([`workers`]) reconciles its keys one at a time:
//!
//! 1. **gather** ([`gather`]): the lease's candidates, its Lease, the workload that governs
//!    it, read once from the caches ([`crate::cache`]);
//! 2. **inputs** ([`gather`], [`view`]): each candidate as heard and with its pod, the Lease
//!    read against the memory of its holder ([`crate::term`]), the rules;
//! 3. **decide**: [`arbiter_election::decide::decide`], pure;
//! 4. **write** ([`write`]): the one action it returns carried out, every Lease write a
//!    compare-and-swap;
//! 5. **report** ([`outcome`]): metrics, candidates' conditions, Events
//!    ([`crate::report`]);
//! 6. **force out** ([`forced_exit`]): a deposed pod that still runs; and pods labelled for
//!    injection that run their command unwrapped ([`unwrapped`], which also holds step 3's
//!    election while any runs);
//! 7. **requeue** ([`outcome::requeue`]): when to look at the lease again.
//!
//! The phases hand their Events to the pass's [`Notices`] as values; [`Worker::reconcile`]
//! sends them once the pass ends, whichever way it ends.
//!
//! A single-active workload's lease adds four hooks ([`workload`]); a Lease arbiter did not
//! make is read and adopted ([`adopt`]); candidates that stopped renewing are deleted
//! ([`expire`]).

mod adopt;
mod expire;
mod forced_exit;
mod gather;
mod lease_memory;
mod outcome;
mod sighting;
mod unwrapped;
mod view;
mod workers;
mod workload;
mod write;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use crate::report::{Notices, Recorder};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{Client, ResourceExt};

use self::gather::{Gathered, Pass};
use self::lease_memory::LeaseMemory;
use self::outcome::requeue;
pub use self::workers::run;
use crate::Settings;
use crate::cache::written::Written;
use crate::cache::{Caches, pod_facts};
use crate::force::targets::Deposer;
use crate::key::LeaseKey;
use crate::metrics::Metrics;
use crate::metrics::lease_timers::Timers;
use crate::term::ledger::TermLedger;
use arbiter_api::LeaseCandidate;
use arbiter_election::decide::{self, Decision};

/// When a lease whose report (a candidate's status, the pending forced exits) could not be
/// written is looked at again.
pub(crate) const RETRY_FAILED_WRITE: Duration = Duration::from_secs(2);

/// What a reconcile left to do.
pub(crate) struct Reconciled {
    /// When to look at the lease again.
    pub after: Option<Duration>,
    /// Whether the lease's election is under way ([`Queue::electing`]).
    pub electing: bool,
}

impl Reconciled {
    pub(crate) fn after(after: Option<Duration>) -> Reconciled {
        Reconciled {
            after,
            electing: false,
        }
    }
}

/// What one reconcile needs, and what the worker remembers between reconciles.
pub(crate) struct Worker {
    pub(crate) client: Client,
    pub(crate) caches: Caches,
    pub(crate) recorder: Recorder,
    /// The Events the pass under way decided, sent when it ends ([`Notices::publish`]).
    pub(crate) notices: Notices,
    pub(crate) settings: Settings,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) terms: TermLedger,
    pub(crate) deposer: Deposer,
    pub(crate) timers: HashMap<LeaseKey, Timers>,
    /// Single-active pods whose unreadable version was reported.
    pub(crate) reported: HashSet<(String, String)>,
    /// Candidates' statuses this worker wrote that its cache may not show yet.
    pub(crate) statuses: Written<Vec<Condition>>,
    /// What it wrote, saw and found foreign of each Lease.
    pub(crate) leases: LeaseMemory,
    /// What it remembers of pods that run their command unwrapped ([`unwrapped`]).
    pub(crate) unwrapped: unwrapped::UnwrappedMemory,
}

impl Worker {
    /// Whether `candidate`'s pod, as the caches stand now, can still take a term: running (and,
    /// for a single-active workload's pod, ready), or no pod at all.
    fn still_electable(&self, candidate: &LeaseCandidate) -> bool {
        match pod_facts::state(candidate, &self.caches) {
            decide::PodState::NoPod => true,
            decide::PodState::Running if crate::workloads::sync::managed(candidate) => {
                pod_facts::pod_of(candidate, &self.caches)
                    .is_some_and(|p| crate::workloads::pod_ready(&p))
            }
            decide::PodState::Running => true,
            _ => false,
        }
    }

    /// One pass over `key`'s lease ([`Worker::pass`]); the Events it decided are sent once it
    /// ends, also when it failed part way (what it did before is reported).
    async fn reconcile(&mut self, key: &LeaseKey) -> anyhow::Result<Reconciled> {
        let done = self.pass(key).await;
        self.notices.publish(&self.recorder);
        done
    }

    /// One pass over `key`'s lease, in phases: gather what the caches hold of it, build the
    /// election's inputs, decide (pure), confirm the elected candidate's pod still runs, write
    /// (a single-active holder pod hands over through the operator), report, force out what
    /// was deposed, and say when to look again.
    async fn pass(&mut self, key: &LeaseKey) -> anyhow::Result<Reconciled> {
        let pass = match self.gather(key).await? {
            Gathered::Pass(pass) => pass,
            Gathered::Done(done) => return Ok(done),
        };
        let inputs = self.inputs(&pass);
        let mut decision = decide::decide(
            &inputs.candidates,
            inputs.lease.as_ref(),
            inputs.previous.as_ref(),
            jiff::Timestamp::now(),
            &inputs.rules,
        );
        let unwrapped = self.unwrapped_pods().running(key);
        unwrapped::hold_for_unwrapped(&mut decision, &unwrapped);
        tracing::debug!(lease = %key, action = ?decision.action, standings = ?decision.standings, "decided");
        if let Some(again) = self.confirm(&pass, &decision) {
            return Ok(again);
        }
        if let Some(done) = self
            .pods_agent()
            .hand_over(&pass, &inputs, &decision)
            .await?
        {
            return Ok(done);
        }
        let deposed = self.forced_exits().deposed(&pass, &decision);
        let written = self
            .writer()
            .write(&pass, &inputs, &decision, deposed)
            .await?;
        let reported = self
            .reporting()
            .report_pass(&pass, &inputs, &decision, written.as_ref())
            .await;
        // A labelling or renewal that failed fails the reconcile (retried), after the forced
        // exits below: a pod the write deposed is forced out even while labels cannot be written.
        let labelled = self
            .pods_agent()
            .keep_roles(
                &pass,
                &inputs,
                &decision,
                written.as_ref(),
                reported.holder.as_deref(),
                reported.term,
            )
            .await;
        if written.is_some()
            && let Some(old) = pass.lease.as_deref()
        {
            self.reporting().report_abandoned_handover(
                key,
                old,
                &decision.action,
                &pass.candidates,
            );
        }
        let policy = pass.policy(self.settings.on_depose);
        let forced = self
            .forced_exits()
            .force_out(key, &pass.candidates, pass.plan.as_ref(), policy)
            .await;
        let unwrapped = self
            .unwrapped_pods()
            .evict(key, &unwrapped, &decision, inputs.lease.as_ref())
            .await;
        labelled?;
        Ok(requeue(
            &pass,
            &inputs,
            &decision,
            written.is_some(),
            &[forced, reported.retry, unwrapped],
        ))
    }

    /// The decision read the pods at several moments (the workload's pods, each candidate's
    /// pod, the stopped pods): a new holder whose pod stopped meanwhile is not given a term it
    /// cannot take (its pod, gone, would then prove nothing, and the term would run its full
    /// duration); the lease is decided again on the caches as they stand now.
    fn confirm(&self, pass: &Pass, decision: &Decision) -> Option<Reconciled> {
        let holder = decision.action.elects()?;
        let c = pass.candidates.iter().find(|c| c.name_any() == holder)?;
        if self.still_electable(c) {
            return None;
        }
        tracing::debug!(lease = %pass.key, %holder, "the elected candidate's pod stopped while deciding; deciding again");
        Some(Reconciled {
            after: Some(Duration::ZERO),
            electing: true,
        })
    }
}

/// The lease duration a candidate's agent says it writes (zero if it does not say; at most
/// what a Lease's `leaseDurationSeconds` can hold, as the agent's flag allows: a longer claim
/// is counted as that, so that no deadline computed from it overflows).
pub(crate) fn declared_duration(candidate: Option<&Arc<LeaseCandidate>>) -> Duration {
    candidate
        .and_then(|c| c.annotations().get(arbiter_api::LEASE_DURATION_ANNOTATION))
        .and_then(|d| d.parse::<u64>().ok())
        .map(|d| Duration::from_secs(d.min(i32::MAX as u64)))
        .unwrap_or_default()
}
