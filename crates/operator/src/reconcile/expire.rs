//! Candidates that stopped renewing: one that belongs to no pod and has not renewed for
//! `--candidate-expiry` is deleted (a pod-owned one is garbage-collected with its pod), with a
//! precondition on the version judged, so a candidate that renewed meanwhile is kept.
//!
//! A candidate that never wrote `renewTime` (made by hand, or by a client that leaves it out)
//! counts from its creation: it is not deleted the moment the operator first sees it. The times
//! are the writers' wall clocks read on the operator's: a candidate process whose clock runs
//! behind by more than `--candidate-expiry` less its refresh (5 min) has its candidate deleted
//! while it lives, unless a pod owns it (docs/concepts/limits.md).

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;

use crate::cache::candidate_index::owner_pod;
use crate::key::LeaseKey;
use crate::reconcile::Worker;
use arbiter_api::LeaseCandidate;

/// How long until `c` is to be deleted, as of `now` (zero: it is due): `expiry` after its last
/// renewal, else after its creation. `None` when a pod owns it (it goes with the pod) or it
/// carries no time at all.
pub(crate) fn expires_in(c: &LeaseCandidate, now: Timestamp, expiry: Duration) -> Option<Duration> {
    if owner_pod(c).is_some() {
        return None;
    }
    let since = c
        .spec
        .renew_time
        .as_ref()
        .map(|r| r.0)
        .or_else(|| c.creation_timestamp().map(|t| t.0))?;
    let age = Duration::try_from(now.duration_since(since)).unwrap_or_default();
    Some(expiry.saturating_sub(age))
}

impl Worker {
    /// Deletes `candidates` that are due ([`expires_in`] zero; only the version judged), and
    /// drops them from it. Returns when the next of those kept is due (a second after), so the
    /// lease is looked at again then even if nothing else changes.
    pub(crate) async fn expire_candidates(
        &self,
        key: &LeaseKey,
        candidates: &mut Vec<Arc<LeaseCandidate>>,
    ) -> Option<Duration> {
        let expiry = self.settings.candidate_expiry;
        let now = Timestamp::now();
        let api: Api<LeaseCandidate> = Api::namespaced(self.client.clone(), &key.namespace);
        let mut kept = Vec::with_capacity(candidates.len());
        let mut next: Option<Duration> = None;
        for c in candidates.drain(..) {
            match expires_in(&c, now, expiry) {
                Some(Duration::ZERO) => {}
                due => {
                    next = next.into_iter().chain(due).min();
                    kept.push(c);
                    continue;
                }
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
                // Gone already (the cache lags): nothing to elect.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                // Renewed or replaced since the version judged: the cache will show it.
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    tracing::debug!(candidate = %c.name_any(), "an expired candidate changed before its deletion: kept");
                    kept.push(c);
                }
                Err(e) => {
                    tracing::warn!(candidate = %c.name_any(), error = %e, "deleting an expired candidate failed");
                    kept.push(c);
                }
            }
        }
        *candidates = kept;
        next.map(|d| d + Duration::from_secs(1))
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference, Time};

    use super::*;

    const EXPIRY: Duration = Duration::from_secs(30 * 60);

    fn at(now: Timestamp, minutes_ago: i64) -> Timestamp {
        now - jiff::SignedDuration::from_mins(minutes_ago)
    }

    /// (what, renewed minutes ago, created minutes ago, owned by a pod, expired)
    #[test]
    fn the_time_left_counts_from_the_last_renewal_else_the_creation() {
        let now = Timestamp::from_second(2_000_000_000).unwrap();
        let mut c = crate::test_candidate("c", "l");
        c.metadata.creation_timestamp = Some(Time(at(now, 20)));
        assert_eq!(
            expires_in(&c, now, EXPIRY),
            Some(Duration::from_secs(10 * 60))
        );
        c.spec.renew_time = Some(MicroTime(at(now, 5)));
        assert_eq!(
            expires_in(&c, now, EXPIRY),
            Some(Duration::from_secs(25 * 60))
        );
        c.spec.renew_time = Some(MicroTime(at(now, -5)));
        assert_eq!(
            expires_in(&c, now, EXPIRY),
            Some(EXPIRY),
            "a time ahead counts as now"
        );
    }

    #[test]
    fn a_candidate_expires_when_nothing_it_wrote_is_recent_and_no_pod_owns_it() {
        let now = Timestamp::from_second(2_000_000_000).unwrap();
        let cases = [
            ("renewed just now", Some(0), Some(120), false, false),
            (
                "renewed within the expiry",
                Some(29),
                Some(120),
                false,
                false,
            ),
            (
                "renewed before the expiry",
                Some(31),
                Some(120),
                false,
                true,
            ),
            (
                "renewed long ago but owned by a pod",
                Some(600),
                Some(600),
                true,
                false,
            ),
            (
                "never renewed, created just now",
                None,
                Some(0),
                false,
                false,
            ),
            (
                "never renewed, created long ago",
                None,
                Some(31),
                false,
                true,
            ),
            (
                "renewed in the future (a clock ahead)",
                Some(-60),
                Some(120),
                false,
                false,
            ),
            (
                "a recent renewal counts, not the creation",
                Some(1),
                Some(600),
                false,
                false,
            ),
            ("no time at all", None, None, false, false),
        ];
        for (what, renewed, created, owned, want) in cases {
            let mut c = crate::test_candidate("c", "l");
            c.spec.renew_time = renewed.map(|m| MicroTime(at(now, m)));
            c.metadata.creation_timestamp = created.map(|m| Time(at(now, m)));
            if owned {
                c.metadata.owner_references = Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Pod".into(),
                    name: "p".into(),
                    uid: "uid-p".into(),
                    ..Default::default()
                }]);
            }
            let due = expires_in(&c, now, EXPIRY) == Some(Duration::ZERO);
            assert_eq!(due, want, "{what}");
        }
    }
}
