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
//! **Only a pod that says so itself is forced out** ([`crate::operator::cache::declared`]): its own spec runs
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

use crate::operator::cache::pod_facts::restarts;
use crate::operator::key::LeaseKey;

use crate::api::OnDepose;
use crate::lease::PENDING_ANNOTATION;

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
    /// The pod does not declare the lease ([`crate::operator::cache::declared`]): never forced out for it.
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
async fn evict(pods: &Api<Pod>, name: &str, namespace: &str, uid: &str) -> kube::Result<()> {
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
        .filter(|_| crate::api::written_by_arbiter(&lease.metadata, PENDING_ANNOTATION))
        .cloned();
    let pending = recorded_with(recorded.as_deref(), deposed, spare);
    crate::lease::set_annotation(lease, PENDING_ANNOTATION, pending.as_deref());
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
                    crate::operator::cache::declared::LEASE_LABEL
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
        crate::operator::cache::slim::keep_what_is_read(&mut p);
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
mod tests {
    use super::*;
    use crate::fake_api::{Answer, FakeApi};

    /// A client whose API server records each request and answers `status`: a success, or a
    /// conflict on the pod's uid precondition.
    fn recording_client(status: u16) -> (Client, FakeApi) {
        let (client, api) = FakeApi::new(move |_| {
            Answer::status(
                status,
                "Conflict",
                "Precondition failed: UID in precondition: a, UID in object meta: b",
            )
        });
        (client, api)
    }

    fn key() -> LeaseKey {
        LeaseKey {
            namespace: "ns".into(),
            name: "l".into(),
        }
    }

    fn running_pod(uid: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("web-0".into());
        p.metadata.uid = Some(uid.into());
        p
    }

    #[test]
    fn a_pod_whose_containers_all_ended_runs_nothing() {
        let pod = |states: &[&str]| -> Pod {
            serde_json::from_value(serde_json::json!({"status": {"containerStatuses": states
                .iter()
                .map(|s| match *s {
                    "running" => serde_json::json!({"name": "c", "ready": true, "restartCount": 1, "image": "i", "imageID": "", "state": {"running": {}}}),
                    "waiting" => serde_json::json!({"name": "c", "ready": false, "restartCount": 1, "image": "i", "imageID": "", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}),
                    _ => serde_json::json!({"name": "c", "ready": false, "restartCount": 1, "image": "i", "imageID": "", "state": {"terminated": {"exitCode": 137}}}),
                })
                .collect::<Vec<_>>()}}))
            .unwrap()
        };
        assert!(crate::operator::cache::pod_facts::nothing_runs(&pod(&[
            "waiting"
        ])));
        assert!(crate::operator::cache::pod_facts::nothing_runs(&pod(&[
            "terminated",
            "waiting"
        ])));
        assert!(!crate::operator::cache::pod_facts::nothing_runs(&pod(&[
            "running"
        ])));
        assert!(!crate::operator::cache::pod_facts::nothing_runs(&pod(&[
            "waiting", "running"
        ])));
        // No statuses reported: nothing is known, so it may run.
        assert!(!crate::operator::cache::pod_facts::nothing_runs(&pod(&[])));
    }

    #[tokio::test]
    async fn evictions_and_deletions_name_the_pods_uid() {
        for (policy, path) in [
            (OnDepose::Evict, "/api/v1/namespaces/ns/pods/web-0/eviction"),
            (OnDepose::Delete, "/api/v1/namespaces/ns/pods/web-0"),
        ] {
            let (client, seen) = recording_client(200);
            let mut d = Deposer::default();
            d.add(&key(), Target::new("web-0", "web-0", "uid-1", 0));
            let (outcomes, _) = d
                .attempt(
                    &client,
                    &key(),
                    policy,
                    |_| Some(running_pod("uid-1")),
                    |_| true,
                )
                .await;
            assert!(matches!(outcomes[0].1, Outcome::Forced(_)), "{outcomes:?}");
            let seen = seen.requests();
            assert_eq!(seen.len(), 1, "{seen:?}");
            assert_eq!(seen[0].path, path);
            let body: serde_json::Value = serde_json::from_str(&seen[0].body).unwrap();
            let preconditions = if policy == OnDepose::Evict {
                assert_eq!(body["kind"], "Eviction", "{body}");
                &body["deleteOptions"]["preconditions"]
            } else {
                &body["preconditions"]
            };
            assert_eq!(preconditions["uid"], "uid-1", "{body}");
        }
    }

    /// One pending deletion of pod `web-0` (uid-1, running), attempted against an API
    /// server answering `status`, allowed by `may_force`.
    async fn attempt_one(
        status: u16,
        may_force: impl Fn(&Pod) -> bool,
    ) -> (Deposer, Vec<(Target, Outcome)>, Option<Duration>, FakeApi) {
        let (client, seen) = recording_client(status);
        let mut d = Deposer::default();
        d.add(&key(), Target::new("web-0", "web-0", "uid-1", 0));
        let (outcomes, retry) = d
            .attempt(
                &client,
                &key(),
                OnDepose::Delete,
                |_| Some(running_pod("uid-1")),
                may_force,
            )
            .await;
        (d, outcomes, retry, seen)
    }

    #[tokio::test]
    async fn a_pod_that_does_not_declare_the_lease_is_refused_and_left_alone() {
        let (d, outcomes, retry, seen) =
            attempt_one(200, |p| crate::operator::cache::declared::declares(p, "l")).await;
        assert!(matches!(outcomes[0].1, Outcome::Refused), "{outcomes:?}");
        assert_eq!(retry, None, "not tried again");
        assert!(seen.requests().is_empty(), "nothing sent");
        assert_eq!(d.recorded(&key()), None);
    }

    #[tokio::test]
    async fn a_replacement_pod_with_the_same_name_ends_the_target_untouched() {
        // The cache still shows the old pod; the server has a new one under the same name.
        let (d, outcomes, retry, seen) = attempt_one(409, |_| true).await;
        assert!(matches!(outcomes[0].1, Outcome::Stopped), "{outcomes:?}");
        assert_eq!(retry, None, "nothing left to retry");
        assert_eq!(seen.requests().len(), 1);
        assert_eq!(d.recorded(&key()), None);
    }

    /// The review's laundering sequence: an entry written by hand must not pass into the
    /// record an assignment writes as arbiter's own.
    #[test]
    fn a_deposing_write_carries_on_only_what_arbiter_recorded() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
        let owned_by = |manager: &str| ManagedFieldsEntry {
            manager: Some(manager.into()),
            fields_v1: Some(FieldsV1(serde_json::json!({
                "f:metadata": { "f:annotations": { "f:arbiter.dev/pending-forced-exits": {} } },
            }))),
            ..ManagedFieldsEntry::default()
        };
        let deposed = Target::new("a", "a-pod", "uid-a", 0);
        let mut l = Lease::default();
        crate::lease::set_annotation(&mut l, PENDING_ANNOTATION, Some("x/standby/uid-s/0"));
        l.metadata.managed_fields = Some(vec![owned_by("kubectl-annotate")]);
        record_on(&mut l, Some(&deposed), |_| false);
        assert_eq!(
            l.annotations().get(PENDING_ANNOTATION).map(String::as_str),
            Some("a/a-pod/uid-a/0"),
            "the hand-written entry is dropped"
        );
        let mut ours = Lease::default();
        crate::lease::set_annotation(&mut ours, PENDING_ANNOTATION, Some("x/old/uid-o/1"));
        ours.metadata.managed_fields = Some(vec![owned_by(crate::api::FIELD_MANAGER)]);
        record_on(&mut ours, Some(&deposed), |_| false);
        assert_eq!(
            ours.annotations()
                .get(PENDING_ANNOTATION)
                .map(String::as_str),
            Some("a/a-pod/uid-a/0,x/old/uid-o/1")
        );
    }

    #[test]
    fn a_deposing_write_records_the_deposed_pod_once_and_spares_the_new_holder() {
        let none = |_: &Target| false;
        let t = Target::new("web-0", "web-0", "uid-0", 2);
        let one = recorded_with(None, Some(&t), none).unwrap();
        assert_eq!(one, "web-0/web-0/uid-0/2");
        assert_eq!(recorded_with(Some(&one), Some(&t), none).unwrap(), one);
        let other = Target::new("web-1", "web-1", "uid-1", 0);
        let two = recorded_with(Some(&one), Some(&other), none).unwrap();
        assert_eq!(two, "web-0/web-0/uid-0/2,web-1/web-1/uid-1/0");
        // web-0 deposed again after a restart: the newer count stands, an older one never.
        let again = Target::new("web-0", "web-0", "uid-0", 3);
        let newer = recorded_with(Some(&two), Some(&again), none).unwrap();
        assert_eq!(newer, "web-0/web-0/uid-0/3,web-1/web-1/uid-1/0");
        assert_eq!(recorded_with(Some(&newer), Some(&t), none).unwrap(), newer);
        // web-1 is given the term: its pending forced exit goes with the same write.
        let spared = recorded_with(Some(&two), None, |t| t.candidate == "web-1");
        assert_eq!(spared.as_deref(), Some("web-0/web-0/uid-0/2"));
        assert_eq!(recorded_with(Some(&spared.unwrap()), None, |_| true), None);
    }

    #[test]
    fn a_pod_deposed_again_after_a_restart_is_forced_out_again() {
        let key = key();
        let mut d = Deposer::default();
        d.done.insert(("uid-a".into(), 1));
        // Its first forced exit ended (at 1 restart); deposed again at 2.
        d.add(&key, Target::new("a", "a", "uid-a", 1));
        assert_eq!(d.recorded(&key), None);
        d.add(&key, Target::new("a", "a", "uid-a", 2));
        assert_eq!(d.recorded(&key).as_deref(), Some("a/a/uid-a/2"));
        // An annotation with the older count does not replace it.
        d.restore(&key, Some("a/a/uid-a/1"), |_| true);
        assert_eq!(d.recorded(&key).as_deref(), Some("a/a/uid-a/2"));
        // Given the term again: spared.
        d.spare(&key, |t| t.uid == "uid-a");
        assert_eq!(d.recorded(&key), None);
    }

    #[test]
    fn pending_targets_round_trip_through_the_annotation() {
        let key = key();
        let mut d = Deposer::default();
        assert_eq!(d.recorded(&key), None);
        d.add(&key, Target::new("c-a", "pod-a", "uid-a", 2));
        d.add(&key, Target::new("c-b", "pod-b", "uid-b", 0));
        let recorded = d.recorded(&key).unwrap();
        assert_eq!(recorded, "c-a/pod-a/uid-a/2,c-b/pod-b/uid-b/0");
        let mut other = Deposer::default();
        other.restore(&key, Some(&recorded), |_| true);
        assert_eq!(other.recorded(&key).as_deref(), Some(recorded.as_str()));
        other.restore(&key, Some("garbage,a/b/c/notanumber,/x//1"), |_| true);
        let mut picky = Deposer::default();
        picky.restore(&key, Some(&recorded), |t| t.uid == "uid-b");
        assert_eq!(picky.recorded(&key).as_deref(), Some("c-b/pod-b/uid-b/0"));
        assert_eq!(other.recorded(&key).as_deref(), Some(recorded.as_str()));
        // A finished target is not brought back by a stale annotation.
        other.done.insert(("uid-a".into(), 2));
        let mut fresh = Deposer {
            done: other.done.clone(),
            ..Deposer::default()
        };
        fresh.restore(&key, Some(&recorded), |_| true);
        assert_eq!(fresh.recorded(&key).as_deref(), Some("c-b/pod-b/uid-b/0"));
    }
}
