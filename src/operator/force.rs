//! Forcing deposed holders out: a lapsed holder whose pod still runs the same containers is
//! evicted or deleted (per `--on-depose` or the workload's annotation), and forced exits left
//! pending (a PodDisruptionBudget refused the eviction) are carried on, whichever replica
//! leads: they are recorded on the Lease.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Resource, ResourceExt};

use super::controller::Worker;
use super::depose::{self, OnDepose, PENDING_ANNOTATION, RESTARTS_ANNOTATION, Target};
use super::index::owner_pod;
use super::metrics::MethodLabels;
use super::queue::LeaseKey;
use super::report::publish;
use super::single_active::{self, Plan};
use crate::api::LeaseCandidate;
use crate::election::decide::{Action, Decision};
use crate::lease::{self, LeaseStore};

impl Worker {
    /// Forces out what the decision deposed and carries on pending forced exits. Returns when
    /// to try again, if one is still pending.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn force_out(
        &mut self,
        key: &LeaseKey,
        lease: Option<&Lease>,
        written: Option<&Lease>,
        candidates: &[Arc<LeaseCandidate>],
        decision: &Decision,
        plan: Option<&Plan>,
        policy: OnDepose,
    ) -> Option<Duration> {
        // A lapsed holder whose pod kept running with the same containers is forced out.
        if let (
            Some(_),
            Action::Assign {
                lapsed: Some(h), ..
            },
            Some(old),
        ) = (written, &decision.action, lease)
            && let Some(c) = candidates.iter().find(|c| c.name_any() == *h)
            && let Some(pod) = self.pod_of(c)
        {
            let recorded = old
                .annotations()
                .get(RESTARTS_ANNOTATION)
                .and_then(|v| v.parse::<i64>().ok());
            tracing::debug!(lease = %key, lapsed = %h, ?recorded, restarts = depose::restarts(&pod), "lapsed holder's pod still exists");
            // Same containers, and not all of them reported ended (one in crash-loop back-off
            // after its process exited runs nothing: nothing to force out).
            if recorded == Some(depose::restarts(&pod)) && !super::stopped::nothing_runs(&pod) {
                self.deposer.add(
                    key,
                    Target::new(
                        h,
                        &pod.name_any(),
                        &pod.uid().unwrap_or_default(),
                        depose::restarts(&pod),
                    ),
                );
            }
        }
        // Forced exits another replica left pending are carried on.
        let latest = written.or(lease);
        let recorded = latest.and_then(|l| l.annotations().get(PENDING_ANNOTATION).cloned());
        let ours: HashSet<String> = candidates
            .iter()
            .filter_map(|c| owner_pod(c).map(|(_, uid)| uid))
            .chain(
                plan.into_iter()
                    .flat_map(|p| p.pods.iter().filter_map(|pod| pod.uid())),
            )
            .collect();
        self.deposer
            .restore(key, recorded.as_deref(), |t| ours.contains(&t.uid));
        let pods = self.caches.pods.clone();
        let ns = key.namespace.clone();
        let (outcomes, mut retry) = self
            .deposer
            .attempt(&self.client, key, policy, |name| {
                pods.get(&ns, name).map(|p| (*p).clone())
            })
            .await;
        // Record what is still pending on the Lease, for whichever replica leads next.
        let pending = self.deposer.recorded(key);
        if pending.is_some() || !candidates.is_empty() {
            let n = pending.as_deref().map_or(0, |p| p.split(',').count());
            self.metrics.forced_exits_pending(key, n);
        }
        if let Some(l) = latest
            && pending != recorded
        {
            let mut l = l.clone();
            lease::set_annotation(&mut l, PENDING_ANNOTATION, pending.as_deref());
            if let Err(e) = LeaseStore::new(self.client.clone(), &key.namespace)
                .replace(&l)
                .await
            {
                tracing::debug!(lease = %key, error = %e, "recording pending forced exits failed (retried)");
                let soon = super::controller::RETRY_FAILED_WRITE;
                retry = Some(retry.unwrap_or(soon).min(soon));
            }
        }
        for (target, outcome) in outcomes {
            tracing::info!(lease = %key, pod = %target.pod, outcome = ?outcome, "forced exit");
            if let depose::Outcome::Forced(policy) = &outcome {
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
                publish(&self.recorder, &r, type_, reason, note.clone()).await;
            }
            publish(&self.recorder, &c.object_ref(&()), type_, reason, note).await;
        }
        retry
    }
}
