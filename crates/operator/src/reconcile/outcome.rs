//! The last phases of a reconcile: **report** what was decided and done (leaderless time and
//! handovers, candidates' conditions, Events), and **requeue**: the one place that says when the
//! lease is looked at again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Resource, ResourceExt};

use super::gather::{Inputs, Pass};
use super::view::look_again;
use super::{RETRY_FAILED_WRITE, Reconciled, Worker};
use crate::cache::written::Written;
use crate::key::LeaseKey;
use crate::metrics::Metrics;
use crate::metrics::lease_timers::Timers;
use crate::report::{LeaseReport, Notices, report};
use arbiter_api::LeaseCandidate;
use arbiter_api::lease;
use arbiter_election::decide::{self, Action, Decision};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// What the report said of the lease.
pub(crate) struct Reported {
    /// The holder reported: the one written, or waited for, or the one the arbiter's Lease names.
    pub holder: Option<String>,
    pub term: i32,
    /// When to try again a status that could not be written.
    pub retry: Option<Duration>,
}

/// The report phase of one pass, as a value: the client and metrics it uses, and the worker's
/// memory it keeps (each lease's timers, the statuses it wrote, the Events), borrowed from the
/// worker for the call.
pub(crate) struct Reporting<'w> {
    client: &'w kube::Client,
    metrics: &'w Metrics,
    timers: &'w mut HashMap<LeaseKey, Timers>,
    statuses: &'w mut Written<Vec<Condition>>,
    notices: &'w mut Notices,
}

impl Worker {
    /// The report phase, over this worker's memory.
    pub(crate) fn reporting(&mut self) -> Reporting<'_> {
        Reporting {
            client: &self.client,
            metrics: &self.metrics,
            timers: &mut self.timers,
            statuses: &mut self.statuses,
            notices: &mut self.notices,
        }
    }
}

impl Reporting<'_> {
    /// Reports the pass: the lease's timers and metrics, then each candidate's conditions and
    /// the Events of what changed. Statuses that can wait are left for when this worker has no
    /// other lease due (`queue`).
    pub(crate) async fn report_pass(
        &mut self,
        pass: &Pass,
        inputs: &Inputs,
        decision: &Decision,
        written: Option<&Lease>,
    ) -> Reported {
        let (key, candidates, lease) = (&pass.key, &pass.candidates, pass.lease.as_deref());
        if candidates.is_empty() && inputs.lease.is_none() && written.is_none() {
            // Nothing left of this lease: its series go (a deleted lease is not leaderless).
            self.timers.remove(key);
            self.metrics.forget(key);
        } else {
            self.time(
                key,
                inputs.lease.as_ref(),
                &decision.action,
                written.is_some(),
            );
        }
        // While a hand-edited-out holder's term may still run, it is still reported as the
        // leader (for the metrics and a single-active workload's labels).
        let waiting_for = match &decision.action {
            Action::WaitForTerm { holder, .. } if holder != crate::term::held::UNKNOWN_HOLDER => {
                Some(holder.as_str())
            }
            _ => None,
        };
        // (A Lease arbiter did not make names nobody arbiter elected.)
        let holder = written
            .and_then(lease::holder)
            .or(waiting_for)
            .or(lease.filter(|l| lease::managed(l)).and_then(lease::holder));
        let term = written.or(lease).map(lease::term).unwrap_or(0);
        let overruns = overruns(candidates, term);
        // A status that could not be written is tried again soon (a holder's renewals no
        // longer bring the lease back every few seconds).
        let r = LeaseReport {
            key,
            candidates,
            decision,
            lease_exists: lease.is_some() || written.is_some(),
            holder,
            term,
            duplicates: &inputs.duplicates,
            overruns: &overruns,
        };
        let reported = report(self.client, self.notices, self.metrics, r, self.statuses).await;
        Reported {
            holder: holder.map(str::to_string),
            term,
            retry: (!reported.complete).then_some(RETRY_FAILED_WRITE),
        }
    }

    /// Leaderless time and handover duration, for metrics.
    fn time(
        &mut self,
        key: &LeaseKey,
        lease: Option<&decide::Lease>,
        action: &Action,
        written: bool,
    ) {
        let t = self.timers.entry(key.clone()).or_default();
        let now = Instant::now();
        let leaderless = lease.is_none_or(|l| l.holder.is_none() || l.expired());
        if matches!(action, Action::NoEligibleCandidate) {
            self.metrics.elections_failed.inc();
        }
        let ended = t.step(leaderless, action, written, now);
        if let Some(d) = ended.handover {
            self.metrics.handover_seconds.observe(d.as_secs_f64());
        }
        // A lease under a third-party strategy has no holder of arbiter's choosing.
        let ours = lease.is_none_or(|l| {
            l.strategy
                .as_deref()
                .is_none_or(|s| s == arbiter_api::OLDEST_EMULATION_VERSION)
        });
        if let Some(d) = ended.leaderless.filter(|_| ours) {
            let labels = self.metrics.labels(key);
            self.metrics
                .leaderless_seconds
                .get_or_create(&labels)
                .inc_by(d.as_secs_f64());
        }
        let since = t.leaderless_since().filter(|_| ours).map(|since| {
            let ago = now.saturating_duration_since(since).as_secs_f64();
            jiff::Timestamp::now().as_millisecond() as f64 / 1000.0 - ago
        });
        self.metrics
            .lease_state(key, since, lease.map(|l| l.duration.as_secs()));
    }

    /// A handover was asked for (`preferredHolder`) and the lease is now going elsewhere: its
    /// target did not take it (it stopped answering, withdrew, or is no longer the best). The
    /// arbiter falls back to the best live candidate; this says so (Event `HandoverAbandoned`,
    /// counter `arbiter_handovers_abandoned_total`).
    pub(crate) fn report_abandoned_handover(
        &mut self,
        key: &LeaseKey,
        old: &Lease,
        action: &Action,
        candidates: &[Arc<LeaseCandidate>],
    ) {
        let (Some(target), holder) = (lease::preferred_holder(old), lease::holder(old)) else {
            return;
        };
        if holder == Some(target) {
            return;
        }
        let instead = match action {
            Action::Assign { holder: h, .. } if h != target => format!("{h} was elected instead"),
            Action::RequestHandover { to } if to != target => {
                format!("asking for a handover to {to} instead")
            }
            Action::ClearPreferredHolder => {
                format!("{} keeps it", holder.unwrap_or("nobody"))
            }
            _ => return,
        };
        self.metrics.handovers_abandoned.inc();
        let note = format!(
            "the handover of lease {} to {target} was abandoned: {target} did not take it (no answer, withdrawn, or no longer the best); {instead}",
            key.name
        );
        tracing::warn!(lease = %key, %target, "{note}");
        // On the candidate that was asked to hand over (the holder, or who released).
        let subject = holder
            .or(lease::released_by(old))
            .and_then(|h| candidates.iter().find(|c| c.name_any() == h))
            .map(|c| c.object_ref(&()))
            .unwrap_or_else(|| old.object_ref(&()));
        self.notices.warning(subject, "HandoverAbandoned", note);
    }
}

/// The candidates whose agents say their workload outlived an earlier term than `term` (the
/// whole candidate was paused), with that term.
fn overruns(
    candidates: &[std::sync::Arc<arbiter_api::LeaseCandidate>],
    term: i32,
) -> Vec<(String, i32)> {
    candidates
        .iter()
        .filter_map(|c| {
            let t = c.annotations().get(arbiter_api::OVERRAN_ANNOTATION)?;
            let t: i32 = t.parse().ok()?;
            (t < term).then(|| (c.name_any(), t))
        })
        .collect()
}

/// When to look at the lease again, and whether its election is under way: the earliest of
/// the decision's own deadline ([`look_again`]), a single-active lease's renewal (a third of its
/// duration), the retries of what failed (`retries`), and the next candidate's expiry.
pub(crate) fn requeue(
    pass: &Pass,
    inputs: &Inputs,
    decision: &Decision,
    wrote: bool,
    retries: &[Option<Duration>],
) -> Reconciled {
    let after = look_again(&decision.action, inputs.lease.as_ref());
    // Single-active leases are renewed by the operator: come back in a third of the duration.
    let renew = pass
        .plan
        .as_ref()
        .and(inputs.lease.as_ref())
        .map(|l| l.duration / 3);
    let after = [after, renew, pass.next_expiry]
        .into_iter()
        .chain(retries.iter().copied())
        .flatten()
        .min();
    Reconciled {
        after,
        // Until someone is elected (a write that elects ends it).
        electing: !wrote && decision.action.electing(),
    }
}
