//! Telling the owners of refused candidates ([`crate::cache::limits`]): the acting
//! replica marks each `Eligible=False` (`LimitExceeded`, with the limit in the message) and
//! records a Warning Event `LimitExceeded` when it writes that condition, once per refusal
//! (a replica taking over finds the condition written and stays quiet).

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;

use crate::report::Recorder;
use kube::{Client, Resource};
use serde_json::json;

use super::conditions::{ELIGIBLE, merge};
use super::publish;
use crate::cache::limits::{Exceeded, Refused, Tally};
use crate::cache::namespaces::Arbitrated;
use crate::cache::stores::Cached;
use arbiter_api::LeaseCandidate;

/// The reason of the condition and of the Event.
pub const LIMIT_EXCEEDED: &str = "LimitExceeded";

/// How often writes that failed are tried again.
const RETRY: Duration = Duration::from_secs(10);
/// How soon a refusal is looked at again when its candidate is not in the cache yet (the tally
/// judges a candidate before the watch stores it).
const NOT_CACHED_YET: Duration = Duration::from_millis(500);

/// The conditions a refused candidate should carry: its own, with `Eligible` saying why.
pub fn refused_conditions(current: &[Condition], r: &Refused) -> Option<Vec<Condition>> {
    let eligible = Condition {
        type_: ELIGIBLE.into(),
        status: "False".into(),
        reason: LIMIT_EXCEEDED.into(),
        message: r.exceeded.message(&r.namespace),
        observed_generation: None,
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::now(),
        ),
    };
    let mut desired: Vec<Condition> = current
        .iter()
        .filter(|c| c.type_ != ELIGIBLE)
        .cloned()
        .collect();
    desired.push(eligible);
    merge(current, desired)
}

/// The condition of a candidate admitted after it was refused, until its lease's next
/// reconcile says more.
fn admitted() -> Condition {
    Condition {
        type_: ELIGIBLE.into(),
        status: "Unknown".into(),
        reason: "Admitted".into(),
        message: "admitted within the namespace's limits; its election follows".into(),
        observed_generation: None,
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::now(),
        ),
    }
}

/// Reports refused candidates for as long as the replica acts.
pub async fn report_refusals(
    client: Client,
    tally: Tally,
    cache: Cached<LeaseCandidate>,
    arbitrated: Arbitrated,
    recorder: Recorder,
    refused_gauge: prometheus_client::metrics::gauge::Gauge,
) {
    let mut refusals = Refusals {
        client,
        cache,
        arbitrated,
        recorder,
        reported: HashMap::new(),
    };
    loop {
        let refused = tally.refused();
        refused_gauge.set(refused.len() as i64);
        let (failed, not_cached) = refusals.report(refused).await;
        refusals.reported.retain(|uid, _| tally.is_refused(uid));
        let failed = refusals.admit(tally.promoted()).await || failed;
        if failed {
            tokio::time::sleep(RETRY).await;
        } else if not_cached {
            tokio::select! {
                () = tokio::time::sleep(NOT_CACHED_YET) => {}
                () = tally.changed() => {}
            }
        } else {
            tally.changed().await;
        }
    }
}

/// What the reporter writes with, and what it reported: refusals already on the server are
/// not written again.
struct Refusals {
    client: Client,
    cache: Cached<LeaseCandidate>,
    arbitrated: Arbitrated,
    recorder: Recorder,
    reported: HashMap<String, Exceeded>,
}

impl Refusals {
    /// Writes each refusal not reported yet on its candidate, with an Event. Returns whether a
    /// write failed, and whether a refused candidate was not cached yet.
    async fn report(&mut self, refused: Vec<Refused>) -> (bool, bool) {
        let (mut failed, mut not_cached) = (false, false);
        for r in refused {
            // Not this install's namespace (`--namespace-selector`), or already reported.
            if self.reported.get(&r.uid) == Some(&r.exceeded)
                || self.arbitrated.covers(&r.namespace) != Some(true)
            {
                continue;
            }
            let cached = self.cache.get(&r.namespace, &r.name);
            let Some(cached) = cached.filter(|c| c.metadata.uid.as_deref() == Some(&r.uid)) else {
                // Judged, not stored yet (or replaced under its name, and judged again soon).
                not_cached = true;
                continue;
            };
            let current = cached
                .status
                .as_ref()
                .map(|s| s.conditions.clone())
                .unwrap_or_default();
            match refused_conditions(&current, &r) {
                None => {
                    self.reported.insert(r.uid.clone(), r.exceeded);
                }
                Some(conditions) => failed |= !self.write(&r, &cached, conditions).await,
            }
        }
        (failed, not_cached)
    }

    /// Writes one refusal's conditions on its candidate (only the candidate judged: its uid,
    /// not one made again under its name), with a Warning Event. False when it should be
    /// retried.
    async fn write(
        &mut self,
        r: &Refused,
        cached: &LeaseCandidate,
        conditions: Vec<Condition>,
    ) -> bool {
        let api: Api<LeaseCandidate> = Api::namespaced(self.client.clone(), &r.namespace);
        let patch = json!({
            "metadata": { "uid": r.uid },
            "status": { "conditions": conditions },
        });
        match api
            .patch_status(&r.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::warn!(namespace = %r.namespace, candidate = %r.name, "{}", r.exceeded.message(&r.namespace));
                publish(
                    &self.recorder,
                    &cached.object_ref(&()),
                    EventType::Warning,
                    LIMIT_EXCEEDED,
                    r.exceeded.message(&r.namespace),
                );
                self.reported.insert(r.uid.clone(), r.exceeded);
                true
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => true,
            Err(e) => {
                tracing::warn!(namespace = %r.namespace, candidate = %r.name, error = %e, "reporting a refused candidate failed; retrying");
                false
            }
        }
    }

    /// Admitted after all (room was made), but cached only as a stub: a status write makes the
    /// watch deliver them whole, and the next reconcile of their lease reports them. Returns
    /// whether a write failed.
    async fn admit(&self, promoted: Vec<(String, String, String)>) -> bool {
        let mut failed = false;
        for (namespace, name, uid) in promoted {
            if self.arbitrated.covers(&namespace) != Some(true) {
                continue;
            }
            let api: Api<LeaseCandidate> = Api::namespaced(self.client.clone(), &namespace);
            // Its other conditions stay.
            let current = self
                .cache
                .get(&namespace, &name)
                .and_then(|c| c.status.clone())
                .map(|s| s.conditions)
                .unwrap_or_default();
            let mut conditions: Vec<Condition> = current
                .into_iter()
                .filter(|c| c.type_ != ELIGIBLE)
                .collect();
            conditions.push(admitted());
            let patch = json!({
                "metadata": { "uid": uid },
                "status": { "conditions": conditions },
            });
            let pp = PatchParams::default();
            match api.patch_status(&name, &pp, &Patch::Merge(&patch)).await {
                Ok(_) => {
                    tracing::info!(%namespace, candidate = %name, %uid, "admitted within the namespace's limits")
                }
                // Gone, or made again under its name (its uid differs).
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => {
                    tracing::warn!(%namespace, candidate = %name, error = %e, "touching an admitted candidate failed; retrying");
                    failed = true;
                }
            }
        }
        failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> Refused {
        Refused {
            namespace: "team".into(),
            name: "c".into(),
            uid: "u".into(),
            exceeded: Exceeded::Candidates(3),
            created: String::new(),
            lease: "l".into(),
        }
    }

    #[test]
    fn a_refused_candidate_is_marked_not_eligible_once() {
        let first = refused_conditions(&[], &refused()).expect("written");
        assert_eq!(first.len(), 1);
        assert_eq!(
            (first[0].type_.as_str(), first[0].status.as_str()),
            (ELIGIBLE, "False")
        );
        assert_eq!(first[0].reason, LIMIT_EXCEEDED);
        assert!(
            first[0]
                .message
                .contains("namespace team already has 3 candidates")
        );
        assert_eq!(refused_conditions(&first, &refused()), None, "no rewrite");
        // Another limit: rewritten.
        let mut leases = refused();
        leases.exceeded = Exceeded::Leases(2);
        assert!(refused_conditions(&first, &leases).is_some());
    }
}
