//! Candidates that stopped renewing: one that belongs to no pod and has not renewed for
//! `--candidate-expiry` is deleted (a pod-owned one is garbage-collected with its pod), with a
//! precondition on the version judged, so a candidate that renewed meanwhile is kept.

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::Api;

use super::controller::Worker;
use super::index::owner_pod;
use super::queue::LeaseKey;
use crate::api::LeaseCandidate;

impl Worker {
    /// Deletes candidates that belong to no pod and have not renewed for `--candidate-expiry`
    /// (pod-owned ones are garbage-collected with their pod), and drops them from `candidates`.
    pub(super) async fn expire_candidates(
        &self,
        key: &LeaseKey,
        candidates: &mut Vec<Arc<LeaseCandidate>>,
    ) {
        let expiry = self.settings.candidate_expiry;
        let now = jiff::Timestamp::now();
        let stale = |c: &LeaseCandidate| {
            owner_pod(c).is_none()
                && c.spec.renew_time.as_ref().is_none_or(|r| {
                    Duration::try_from(now.duration_since(r.0)).is_ok_and(|age| age > expiry)
                })
        };
        let api: Api<LeaseCandidate> = Api::namespaced(self.client.clone(), &key.namespace);
        let mut kept = Vec::with_capacity(candidates.len());
        for c in candidates.drain(..) {
            if !stale(&c) {
                kept.push(c);
                continue;
            }
            // Only the version we judged: a candidate that renewed meanwhile is not deleted.
            let dp = kube::api::DeleteParams {
                preconditions: Some(kube::api::Preconditions {
                    uid: c.uid(),
                    resource_version: c.resource_version(),
                }),
                ..Default::default()
            };
            match api.delete(&c.name_any(), &dp).await {
                Ok(_) => {
                    self.metrics.candidates_expired.inc();
                    tracing::info!(lease = %key, candidate = %c.name_any(), ?expiry, "deleted a candidate that stopped renewing");
                }
                Err(e) => {
                    tracing::warn!(candidate = %c.name_any(), error = %e, "deleting an expired candidate failed");
                    kept.push(c);
                }
            }
        }
        *candidates = kept;
    }
}
