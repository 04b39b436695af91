//! Forced exit: making a deposed holder's pod stop when its agent did not.
//!
//! When a holder's term lapses (it stopped renewing) and the lease goes to someone else, a
//! well-behaved agent has already killed its workload and exited, so its container restarted.
//! The arbiter records the holder pod's container restart count on the Lease when it assigns
//! (annotation `arbiter.dev/holder-restarts`); if, after the lapse, that pod still runs with
//! the same count, nothing in it exited (a hung or paused agent, or a workload without one),
//! and the pod is evicted (policy `evict`, which honours PodDisruptionBudgets), deleted
//! (`delete`), or only reported (`none`). A PDB refusal is reported as an Event and retried
//! with backoff until the pod is gone or restarts.
//!
//! The targets still pending are also written on the Lease (annotation
//! `arbiter.dev/pending-forced-exits`, by compare-and-swap), so that whichever operator replica
//! leads next carries them on: a forced exit a PDB holds back is not forgotten on a failover.
//! Every eviction or deletion carries the pod's uid as a precondition: a new pod with the same
//! name (a StatefulSet's replacement) is never hit.
//!
//! **Only a pod that says so itself is forced out** ([`crate::cache::declared`]): its own spec runs
//! `arbiter run --lease NAME` (or `--lease=NAME`) in a container, or it carries the label
//! `arbiter.dev/lease: NAME`, set by whoever created the pod; or the operator selects it as a
//! pod of an annotated single-active workload. A candidate's `ownerReferences` and the Lease's
//! annotations are written by candidates' agents (and anyone with their rights), so they
//! cannot name another team's pod into an eviction: a pending forced exit whose pod does not
//! declare the lease is refused and reported (Event `ForcedExitRefused`), as is an entry in
//! the annotation that arbiter did not write.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::events::EventType;
use kube::{Client, ResourceExt};

use crate::cache::pod_facts::restarts;
use crate::key::LeaseKey;

use arbiter_api::OnDepose;
use arbiter_api::lease::PENDING_ANNOTATION;

/// A deposed holder's pod to force out.
#[derive(Clone, Debug)]
pub struct Target {
    pub candidate: String,
    pub pod: String,
    pub uid: String,
    pub restarts: i64,
    attempts: u32,
    next: Instant,
}

impl Target {
    /// Tries again later: 2, 4, 8 ... 64 s after each failed attempt.
    fn back_off(&mut self) {
        self.attempts += 1;
        self.next = Instant::now() + Duration::from_secs(1 << self.attempts.min(6));
    }

    pub fn new(candidate: &str, pod: &str, uid: &str, restarts: i64) -> Target {
        Target {
            candidate: candidate.into(),
            pod: pod.into(),
            uid: uid.into(),
            restarts,
            attempts: 0,
            next: Instant::now(),
        }
    }
}

/// What happened to a target on one attempt, for Events and metrics.
#[derive(Debug)]
pub enum Outcome {
    /// The pod stopped by itself (gone, restarted, or terminal): nothing to do.
    Stopped,
    Forced(OnDepose),
    Reported,
    Blocked(String),
    Failed(String),
    /// The pod does not declare the lease ([`crate::cache::declared`]): never forced out for it.
    Refused,
}

/// Outstanding forced exits, per lease.
#[derive(Default)]
pub struct Deposer {
    pending: HashMap<LeaseKey, Vec<Target>>,
    /// Pods (uid, restarts) whose forced exit ended (forced, reported, or the pod stopped), so
    /// that an annotation not yet cleared does not bring them back. (The same pod deposed again
    /// after its containers restarted is another forced exit.)
    done: std::collections::HashSet<(String, i64)>,
}

/// Adds `target` to `list`: the same pod (uid) once, at its highest restart count (deposed
/// again after its containers restarted, the older count would judge it stopped).
fn merge(list: &mut Vec<Target>, target: Target) {
    match list.iter_mut().find(|t| t.uid == target.uid) {
        Some(t) if target.restarts > t.restarts => *t = target,
        Some(_) => {}
        None => list.push(target),
    }
}

impl Deposer {
    pub fn add(&mut self, key: &LeaseKey, target: Target) {
        if self.done.contains(&(target.uid.clone(), target.restarts)) {
            return;
        }
        merge(self.pending.entry(key.clone()).or_default(), target);
    }

    /// Whether a forced exit of `key` is pending.
    pub fn has_pending(&self, key: &LeaseKey) -> bool {
        self.pending.get(key).is_some_and(|l| !l.is_empty())
    }

    /// Drops `key`'s pending forced exits of the holder the lease has now (`holds`): a pod
    /// given the term again is never forced out for an earlier one.
    pub fn spare(&mut self, key: &LeaseKey, holds: impl Fn(&Target) -> bool) {
        if let Some(list) = self.pending.get_mut(key) {
            list.retain(|t| !holds(t));
        }
    }

    /// Takes up the forced exits recorded on the Lease (by this or another replica), only for
    /// pods that `belongs` says are this lease's (an annotation anyone can edit must not make
    /// the arbiter evict an arbitrary pod).
    pub fn restore(
        &mut self,
        key: &LeaseKey,
        recorded: Option<&str>,
        belongs: impl Fn(&Target) -> bool,
    ) {
        for t in parse_pending(recorded.unwrap_or_default()) {
            if belongs(&t) {
                self.add(key, t);
            }
        }
    }

    /// The annotation value for `key`'s pending targets (`None`: nothing pending).
    pub fn recorded(&self, key: &LeaseKey) -> Option<String> {
        let list = self.pending.get(key).filter(|l| !l.is_empty())?;
        Some(record(list))
    }

    /// Attempts every due target of `key`, each only if `may_force` accepts its pod as the
    /// API server (or the cache) has it. Returns the outcomes, and when to try again.
    pub async fn attempt(
        &mut self,
        client: &Client,
        key: &LeaseKey,
        policy: OnDepose,
        current: impl Fn(&str) -> Option<Pod>,
        may_force: impl Fn(&Pod) -> bool,
    ) -> (Vec<(Target, Outcome)>, Option<Duration>) {
        let Some(list) = self.pending.remove(key) else {
            return (Vec::new(), None);
        };
        let pods: Api<Pod> = Api::namespaced(client.clone(), &key.namespace);
        let mut outcomes = Vec::new();
        let mut keep = Vec::new();
        for mut t in list {
            if t.next > Instant::now() {
                keep.push(t);
                continue;
            }
            let pod = match pod_now(&pods, &t.pod, &current).await {
                Ok(pod) => pod,
                Err(e) => {
                    // Nothing was tried on the pod: no outcome (no Event), a retry.
                    tracing::debug!(lease = %key, pod = %t.pod, error = %e, "looking up a pod to force out failed (retried)");
                    t.back_off();
                    keep.push(t);
                    continue;
                }
            };
            if !still_running(pod.as_ref(), &t) {
                outcomes.push((t, Outcome::Stopped));
                continue;
            }
            if !pod.as_ref().is_some_and(&may_force) {
                outcomes.push((t, Outcome::Refused));
                continue;
            }
            let result = force(&pods, &key.namespace, &t, policy).await;
            match result {
                Ok(outcome) => outcomes.push((t, outcome)),
                // Gone, or replaced by a pod of the same name (the uid precondition failed).
                Err(kube::Error::Api(s))
                    if s.code == 404 || (s.code == 409 && s.message.contains("UID")) =>
                {
                    outcomes.push((t, Outcome::Stopped))
                }
                Err(e) => {
                    let blocked = matches!(&e, kube::Error::Api(s) if s.code == 429);
                    t.back_off();
                    let outcome = if blocked {
                        Outcome::Blocked(e.to_string())
                    } else {
                        Outcome::Failed(e.to_string())
                    };
                    outcomes.push((t.clone(), outcome));
                    keep.push(t);
                }
            }
        }
        for (t, outcome) in &outcomes {
            if !matches!(outcome, Outcome::Blocked(_) | Outcome::Failed(_)) {
                self.done.insert((t.uid.clone(), t.restarts));
            }
        }
        if self.done.len() > 10_000 {
            self.done.clear(); // a bound; forgetting only risks one more attempt on a stopped pod
        }
        let retry = keep
            .iter()
            .map(|t| t.next.saturating_duration_since(Instant::now()))
            .min();
        if keep.is_empty() {
            self.pending.remove(key);
        } else {
            self.pending.insert(key.clone(), keep);
        }
        (outcomes, retry)
    }
}

/// Evicts pod `name` only if it is still the pod `uid` (a policy/v1 Eviction whose
/// `deleteOptions.preconditions.uid` names it). Written out here because kube's `Api::evict`
/// (kube-core 5.0) serializes the options as `delete_options`, a field the API server does not
/// know and drops, so its precondition would silently not apply.
pub(crate) async fn evict(
    pods: &Api<Pod>,
    name: &str,
    namespace: &str,
    uid: &str,
) -> kube::Result<()> {
    let eviction = serde_json::json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": { "name": name, "namespace": namespace },
        "deleteOptions": { "preconditions": { "uid": uid } },
    });
    pods.create_subresource::<_, serde_json::Value>(
        "eviction",
        name,
        &PostParams::default(),
        &eviction,
    )
    .await
    .map(|_| ())
}

/// The annotation value recording `targets`.
fn record(targets: &[Target]) -> String {
    let mut parts: Vec<String> = targets
        .iter()
        .map(|t| format!("{}/{}/{}/{}", t.candidate, t.pod, t.uid, t.restarts))
        .collect();
    parts.sort();
    parts.join(",")
}

/// A Lease's pending forced exits (`recorded`) with `target` added and those of the lease's
/// new holder (`spare`) dropped: what the Lease write that deposes the target's holder records
/// in the same compare-and-swap, so that neither a lost answer to it nor another replica
/// taking over loses the forced exit.
fn recorded_with(
    recorded: Option<&str>,
    target: Option<&Target>,
    spare: impl Fn(&Target) -> bool,
) -> Option<String> {
    let mut targets = parse_pending(recorded.unwrap_or_default());
    targets.retain(|t| !spare(t));
    if let Some(t) = target {
        merge(&mut targets, t.clone());
    }
    (!targets.is_empty()).then(|| record(&targets))
}

/// Records on `lease` (to be written by compare-and-swap) the forced exit of `deposed` and
/// drops those `spare` names: [`recorded_with`] applied to the Lease's annotation.
pub fn record_on(lease: &mut Lease, deposed: Option<&Target>, spare: impl Fn(&Target) -> bool) {
    // Only what arbiter wrote is carried on: an entry written by hand must not pass into a
    // record this write makes arbiter's own.
    let recorded = lease
        .annotations()
        .get(PENDING_ANNOTATION)
        .filter(|_| arbiter_api::written_by_arbiter(&lease.metadata, PENDING_ANNOTATION))
        .cloned();
    let pending = recorded_with(recorded.as_deref(), deposed, spare);
    arbiter_api::lease::set_annotation(lease, PENDING_ANNOTATION, pending.as_deref());
}

/// Parses [`PENDING_ANNOTATION`]; malformed entries are skipped.
fn parse_pending(s: &str) -> Vec<Target> {
    s.split(',')
        .filter_map(|entry| {
            let f: Vec<&str> = entry.split('/').collect();
            match f.as_slice() {
                [candidate, pod, uid, restarts] if !uid.is_empty() => {
                    Some(Target::new(candidate, pod, uid, restarts.parse().ok()?))
                }
                _ => None,
            }
        })
        .collect()
}

impl Outcome {
    /// The Event to publish on the deposed candidate, if any.
    pub fn event(&self, t: &Target) -> Option<(EventType, &'static str, String)> {
        match self {
            Outcome::Stopped => None,
            Outcome::Forced(p) => Some((
                EventType::Normal,
                "Evicted",
                format!(
                    "pod {} kept running after its term lapsed; forced out ({})",
                    t.pod,
                    p.as_str()
                ),
            )),
            Outcome::Reported => Some((
                EventType::Warning,
                "DeposedStillRunning",
                format!(
                    "pod {} kept running after its term lapsed (policy none: left running)",
                    t.pod
                ),
            )),
            Outcome::Blocked(e) => Some((
                EventType::Warning,
                "EvictionBlocked",
                format!(
                    "evicting pod {} was refused, retrying with backoff: {e}",
                    t.pod
                ),
            )),
            Outcome::Failed(e) => Some((
                EventType::Warning,
                "EvictionFailed",
                format!("forcing pod {} out failed, retrying: {e}", t.pod),
            )),
            Outcome::Refused => Some((
                EventType::Warning,
                "ForcedExitRefused",
                format!(
                    "pod {} was not forced out: it does not declare this lease (arbiter run --lease in its spec, or the label {}), and is no pod of its single-active workload",
                    t.pod,
                    crate::cache::declared::LEASE_LABEL
                ),
            )),
        }
    }
}

/// Pod `name` as the cache has it, else as the API server has it (not in the cache: not
/// fetched yet, say just after taking over from another replica), never taken for gone; read
/// as the cache keeps pods (what it declares noted from its spec, not from annotations it came
/// with).
async fn pod_now(
    pods: &Api<Pod>,
    name: &str,
    cached: impl Fn(&str) -> Option<Pod>,
) -> Result<Option<Pod>, kube::Error> {
    if let Some(p) = cached(name) {
        return Ok(Some(p));
    }
    Ok(pods.get_opt(name).await?.map(|mut p| {
        crate::cache::slim::keep_what_is_read(&mut p);
        p
    }))
}

/// Whether `pod` is still the target's pod (its uid), running the same containers (its restart
/// count), not being deleted and not in a terminal phase.
fn still_running(pod: Option<&Pod>, t: &Target) -> bool {
    pod.is_some_and(|p| {
        p.uid().as_deref() == Some(t.uid.as_str())
            && p.metadata.deletion_timestamp.is_none()
            && restarts(p) == t.restarts
            && !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
    })
}

/// Forces the target's pod out per `policy`: evicted or deleted with its uid as precondition,
/// so only the pod that held the lease is hit (a new pod with the same name, a StatefulSet's
/// replacement, fails the precondition), or only reported.
async fn force(
    pods: &Api<Pod>,
    namespace: &str,
    t: &Target,
    policy: OnDepose,
) -> Result<Outcome, kube::Error> {
    let only_this = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(t.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match policy {
        OnDepose::None => Ok(Outcome::Reported),
        OnDepose::Evict => evict(pods, &t.pod, namespace, &t.uid)
            .await
            .map(|_| Outcome::Forced(policy)),
        OnDepose::Delete => pods
            .delete(&t.pod, &only_this)
            .await
            .map(|_| Outcome::Forced(policy)),
    }
}

#[cfg(test)]
mod tests;
