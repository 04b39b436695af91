//! The lease's pods that were labelled for injection but run their command without the agent
//! ([`crate::workloads::unwrapped`]), with `--inject-evict-unwrapped` (on by default with the
//! webhook): while any runs the election is held ([`decide::held_for_unwrapped`]), and they are
//! evicted one at a time, the last once a wrapped candidate can take over, so that their owners
//! create them again through the webhook. Only this install's pods (`--instance`) in namespaces
//! it arbitrates are counted; another install's are its business.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;

use super::Worker;
use crate::Settings;
use crate::cache::{Caches, declared, pod_facts};
use crate::force::targets::evict;
use crate::key::LeaseKey;
use crate::metrics::{Metrics, ResultLabels};
use crate::report::Notices;
use crate::workloads::unwrapped::{self, Step, Unwrapped};
use arbiter_election::decide::{self, Action, Decision};

/// How long a pod just evicted is taken for one being removed, until the cache shows it so (and
/// how long a refused eviction waits before it is tried again).
const EVICTED_RECENTLY: Duration = Duration::from_secs(10);
/// How soon a lease with unwrapped pods is looked at again after an eviction, and otherwise
/// (their pods' and candidates' events enqueue it sooner).
const AFTER_EVICTION: Duration = Duration::from_secs(2);
const LOOK_AGAIN: Duration = Duration::from_secs(5);
/// How long, beyond a lease duration, an unwrapped pod removed without proof that it stopped
/// still holds its lease: a kubelet that is alive kills its containers within the pod's grace
/// period (30 s by default).
pub(crate) const UNPROVEN_GRACE: Duration = Duration::from_secs(60);

/// What a worker remembers of unwrapped pods between passes.
#[derive(Default)]
pub(crate) struct UnwrappedMemory {
    /// The pods it evicted (or tried to) lately, by uid.
    evicted: HashMap<String, Instant>,
    /// Per lease, the unwrapped pods seen (uid → name, and since when they are gone without
    /// proof that they stopped), until they are proven stopped.
    seen: HashMap<LeaseKey, HashMap<String, (String, Option<Instant>)>>,
}

/// The unwrapped-pods phase of one pass, as a value: what it reads, and the worker's memory it
/// keeps, borrowed for the call.
pub(crate) struct UnwrappedPods<'w> {
    client: &'w kube::Client,
    caches: &'w Caches,
    settings: &'w Settings,
    metrics: &'w Metrics,
    memory: &'w mut UnwrappedMemory,
    notices: &'w mut Notices,
}

impl Worker {
    /// The unwrapped-pods phase, over this worker's memory.
    pub(crate) fn unwrapped_pods(&mut self) -> UnwrappedPods<'_> {
        UnwrappedPods {
            client: &self.client,
            caches: &self.caches,
            settings: &self.settings,
            metrics: &self.metrics,
            memory: &mut self.unwrapped,
            notices: &mut self.notices,
        }
    }
}

/// The election held while `pods` run.
pub(super) fn hold_for_unwrapped(decision: &mut Decision, pods: &[Unwrapped]) {
    let action = std::mem::replace(&mut decision.action, Action::Nothing);
    decision.action = decide::held_for_unwrapped(action, pods.len());
}

impl UnwrappedPods<'_> {
    /// The lease's unwrapped pods that may still run their command: none when this install
    /// does not enforce injection. A pod stops counting only once it is proven to have ended
    /// (a terminal phase the kubelet reported, or removed after its containers stopped: the
    /// same proofs as a holder's pod). One whose labels or annotations changed while it runs
    /// still counts (only reported from then on); one removed without proof (force-deleted, its
    /// Node deleted) counts for a further lease duration and [`UNPROVEN_GRACE`], on this
    /// worker's memory.
    pub(super) fn running(&mut self, key: &LeaseKey) -> Vec<Unwrapped> {
        if !self.settings.webhook.enforces_injection() {
            return Vec::new();
        }
        let names = self.caches.unwrapped.names(key);
        if names.is_empty() && !self.memory.seen.contains_key(key) {
            return Vec::new();
        }
        let instance = self.caches.instance.as_deref();
        let ns = &*key.namespace;
        let mut pods: Vec<Unwrapped> = (names.iter())
            .filter_map(|name| self.caches.pods.get(ns, name))
            .filter(|p| declared::unwrapped_for(p) == Some(&*key.name))
            .filter(|p| {
                p.labels()
                    .get(arbiter_api::INSTANCE_LABEL)
                    .map(String::as_str)
                    == instance
            })
            .filter(|p| !pod_facts::terminal(p))
            .filter_map(|p| Unwrapped::of(&p))
            .collect();
        let (caches, hold) = (self.caches, self.settings.lease_duration + UNPROVEN_GRACE);
        let memory = self.memory.seen.entry(key.clone()).or_default();
        for p in &pods {
            memory.insert(p.uid.clone(), (p.name.clone(), None));
        }
        let now = Instant::now();
        let mut more = Vec::new();
        memory.retain(|uid, (name, gone_since)| {
            if pods.iter().any(|p| &p.uid == uid) {
                return true;
            }
            if caches.stopped_pods.contains(ns, uid) {
                return false;
            }
            if let Some(p) = caches.pods.get(ns, name).filter(|p| p.uid().as_ref() == Some(uid)) {
                // Relabelled, or its lease annotation changed, while it runs.
                if pod_facts::terminal(&p) {
                    return false;
                }
                more.extend(Unwrapped::of(&p).map(|u| Unwrapped { owned: false, ..u }));
                return true;
            }
            let since = *gone_since.get_or_insert(now);
            if now.duration_since(since) >= hold {
                tracing::warn!(lease = %key, pod = %name, "an unwrapped pod was removed without proof that its command stopped (force-deleted, or its Node deleted); its lease is no longer held for it");
                return false;
            }
            more.push(Unwrapped {
                name: name.clone(),
                uid: uid.clone(),
                deleting: true,
                owned: false,
                running: true,
            });
            true
        });
        if memory.is_empty() {
            self.memory.seen.remove(key);
        }
        pods.extend(more);
        pods
    }

    /// Evicts the next of `pods` ([`unwrapped::next`]); a successor is there when the lease
    /// is held (its holder's command already runs) or was held back from a live candidate.
    /// Returns when to look again while any is left.
    pub(super) async fn evict(
        &mut self,
        key: &LeaseKey,
        pods: &[Unwrapped],
        decision: &Decision,
        lease: Option<&decide::Lease>,
    ) -> Option<Duration> {
        if pods.is_empty() {
            return None;
        }
        let successor = matches!(decision.action, Action::WaitForUnwrapped { .. })
            || lease.is_some_and(|l| l.holder.is_some() && !l.expired());
        let now = Instant::now();
        self.memory
            .evicted
            .retain(|_, at| now.duration_since(*at) < EVICTED_RECENTLY);
        // A pod evicted a moment ago is being removed, whether or not the cache shows it yet.
        let seen: Vec<Unwrapped> = (pods.iter())
            .map(|p| Unwrapped {
                deleting: p.deleting || self.memory.evicted.contains_key(&p.uid),
                ..p.clone()
            })
            .collect();
        match unwrapped::next(&seen, successor) {
            Step::Evict { name, uid } => {
                self.evict_one(key, &name, &uid).await;
                Some(AFTER_EVICTION)
            }
            step => {
                tracing::debug!(lease = %key, ?step, "unwrapped pods");
                Some(LOOK_AGAIN)
            }
        }
    }

    async fn evict_one(&mut self, key: &LeaseKey, name: &str, uid: &str) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &key.namespace);
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(key.namespace.to_string()),
            name: Some(name.into()),
            uid: Some(uid.into()),
            ..ObjectReference::default()
        };
        let count = |result: &str| {
            self.metrics
                .unwrapped_evictions
                .get_or_create(&ResultLabels {
                    result: result.into(),
                })
                .inc();
        };
        match evict(&pods, name, &key.namespace, uid).await {
            Ok(()) => {
                count("evicted");
                self.memory.evicted.insert(uid.to_string(), Instant::now());
                tracing::info!(lease = %key, pod = name, "evicted a pod that ran its command without the agent, so that its owner creates it again through the webhook");
                self.notices.add(
                    reference,
                    EventType::Normal,
                    "UnwrappedEvicted",
                    format!(
                        "labelled arbiter.dev/inject but created without the agent: its command ran beside lease {}'s; evicted (one at a time per lease) so that its owner creates it again through the webhook",
                        key.name
                    ),
                );
            }
            // Gone, or replaced by a pod of the same name: the next look sees what is there.
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => {
                count("refused");
                // Tried again after a while, not at every look (a PodDisruptionBudget may
                // refuse it for long); the others wait meanwhile, one at a time.
                self.memory.evicted.insert(uid.to_string(), Instant::now());
                tracing::warn!(lease = %key, pod = name, error = %e, "evicting a pod that runs its command without the agent was refused (retrying)");
                self.notices.add(
                    reference,
                    EventType::Warning,
                    "UnwrappedEvictionRefused",
                    format!(
                        "labelled arbiter.dev/inject but created without the agent, and its eviction was refused (retrying): {e}; lease {} gets no new holder while it runs",
                        key.name
                    ),
                );
            }
        }
    }
}
