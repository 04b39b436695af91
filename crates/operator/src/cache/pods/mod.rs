//! The pods the operator follows, and only those. A cluster may run tens of thousands of pods
//! that are none of arbiter's business; caching them all cost about 8 KiB each even slimmed.
//! The pod watch still sees every pod, but keeps only:
//!
//! - a candidate's pod (its `Pod` owner reference),
//! - a pod an annotated single-active workload selects,
//! - a pod carrying the role label the operator sets (so that it can take the label off again
//!   after the annotation is removed, even after a restart),
//! - a pod it already keeps, until that pod is deleted (a deposed holder's pod is watched to its
//!   end even after its candidate is garbage-collected).
//!
//! What follows changes after a pod's last event went by: an agent registers a candidate for a
//! pod that has long been running, a workload is annotated. Such pods are fetched: a GET of the
//! candidate's pod, a LIST of the workload's selector ([`FollowedPods::need_pod`],
//! [`FollowedPods::need_selected`]). A fetched pod never replaces a newer one the watch delivered
//! (resource versions compared), and a pod the watch saw deleted is never brought back by a
//! fetch that read it just before.
//!
//! Until its pod arrives a candidate's pod is simply unknown ([`PodState::Missing`]: not
//! electable, and no proof of anything), and a single-active workload whose pods were not listed
//! yet is not reconciled ([`FollowedPods::loaded`]).
//!
//! [`PodState::Missing`]: arbiter_election::decide::PodState::Missing

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::core::Selector;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::mpsc;

use crate::cache::slim::keep_what_is_read;
use crate::workloads::ROLE_LABEL;

/// How long a deleted (or not found) pod's uid is remembered against late fetches.
const GONE_FOR: Duration = Duration::from_secs(600);

/// Whether a pod is one the operator follows (without looking at what it already keeps).
pub type Follows = Arc<dyn Fn(&Pod) -> bool + Send + Sync>;

/// Something to fetch because what is followed changed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Fetch {
    /// A candidate's pod.
    Pod {
        namespace: String,
        name: String,
        uid: String,
    },
    /// A single-active workload's pods.
    Selected {
        namespace: String,
        selector: String,
        /// How often the selector had been forgotten when this was asked: a list that was on
        /// its way when the selector was forgotten does not count as loading it.
        generation: u64,
    },
}

#[derive(Clone)]
pub struct FollowedPods {
    inner: Arc<Mutex<Inner>>,
    follows: Follows,
    fetches: mpsc::UnboundedSender<Fetch>,
    ready: tokio::sync::watch::Sender<bool>,
    /// How many pods are kept (`arbiter_pods_followed`).
    kept: Gauge,
    /// How many watches (one per namespace watched, or one for all) must list before the
    /// cache is ready.
    scopes: usize,
}

type ByNamespace = HashMap<String, HashMap<String, Arc<Pod>>>;

#[derive(Default)]
struct Inner {
    pods: ByNamespace,
    /// Being rebuilt from a (re-)list, between `Init` and `InitDone`, by the scope of the
    /// watch that lists (a namespace, or `None`: all).
    relists: HashMap<Option<String>, ByNamespace>,
    /// The scopes whose watch listed once.
    listed: HashSet<Option<String>>,
    /// uid → when the watch saw it deleted (or a fetch found it gone).
    gone: HashMap<String, Instant>,
    /// `gone` is pruned when it grows past this.
    prune_gone_at: usize,
    /// How often each selector was forgotten ([`FollowedPods::forget_selected`]).
    forgotten: HashMap<(String, String), u64>,
    /// Selectors (namespace, selector) whose pods were listed.
    loaded: HashSet<(String, String)>,
    /// Fetches asked for and not yet done.
    pending: HashSet<Fetch>,
}

/// Whether `new` may replace `old`: not when both resource versions are numbers (as etcd's
/// are) and `new`'s is lower. The watch delivers in order; only a fetch can be older.
fn newer(new: &Pod, old: &Pod) -> bool {
    let rv = |p: &Pod| p.resource_version().and_then(|v| v.parse::<u64>().ok());
    match (rv(new), rv(old)) {
        (Some(n), Some(o)) => n >= o,
        _ => true,
    }
}

fn key(pod: &Pod) -> (String, String) {
    (pod.namespace().unwrap_or_default(), pod.name_any())
}

/// Stores `pod` unless a newer one is there; returns whether it was stored.
fn put(map: &mut ByNamespace, pod: Arc<Pod>) -> bool {
    let (ns, name) = key(&pod);
    let slot = map.entry(ns).or_default().entry(name);
    match slot {
        std::collections::hash_map::Entry::Occupied(mut o) => {
            let newer = newer(&pod, o.get());
            if newer {
                o.insert(pod);
            }
            newer
        }
        std::collections::hash_map::Entry::Vacant(v) => {
            v.insert(pod);
            true
        }
    }
}

fn take(map: &mut ByNamespace, ns: &str, name: &str) -> Option<Arc<Pod>> {
    let names = map.get_mut(ns)?;
    let pod = names.remove(name);
    if names.is_empty() {
        map.remove(ns);
    }
    pod
}

fn find<'a>(map: &'a ByNamespace, ns: &str, name: &str) -> Option<&'a Arc<Pod>> {
    map.get(ns)?.get(name)
}

impl FollowedPods {
    /// A cache that keeps the pods `follows` accepts, and the receiver of the fetches it asks
    /// for (to hand to [`fetch_loop`]).
    pub fn new(
        follows: Follows,
        scopes: usize,
        kept: Gauge,
    ) -> (Self, mpsc::UnboundedReceiver<Fetch>) {
        let (fetches, rx) = mpsc::unbounded_channel();
        let (ready, _) = tokio::sync::watch::channel(false);
        let pods = FollowedPods {
            inner: Arc::default(),
            follows,
            fetches,
            ready,
            scopes: scopes.max(1),
            kept,
        };
        (pods, rx)
    }

    /// Takes in one event of the watch of every namespace ([`FollowedPods::apply_event_in`]).
    #[cfg(test)]
    pub fn apply_event(&self, ev: watcher::Event<Pod>) -> Option<(Pod, bool)> {
        self.apply_event_in(None, ev)
    }

    /// Takes in one event of the pod watch of `scope` (a namespace, or `None`: all), slimmed
    /// ([`keep_what_is_read`]). Returns the pod if it is followed (its leases need a look) and
    /// whether it was deleted, else `None`: the pod was dropped.
    pub fn apply_event_in(
        &self,
        scope: Option<&str>,
        ev: watcher::Event<Pod>,
    ) -> Option<(Pod, bool)> {
        let seen = self.take_in(scope, ev);
        if seen.is_some() {
            self.kept.set(self.count() as i64);
        }
        seen
    }

    /// Whether `pod` belongs in the cache: kept already, or one this cache follows.
    fn keeps(&self, pods: &ByNamespace, pod: &Pod) -> bool {
        let (ns, name) = key(pod);
        find(pods, &ns, &name).is_some() || (self.follows)(pod)
    }

    fn take_in(&self, scope: Option<&str>, ev: watcher::Event<Pod>) -> Option<(Pod, bool)> {
        let mut inner = self.inner.lock().unwrap();
        let scope_key = scope.map(String::from);
        match ev {
            watcher::Event::Init => {
                inner.relists.insert(scope_key, ByNamespace::default());
                None
            }
            watcher::Event::InitDone => {
                if let Some(fresh) = inner.relists.remove(&scope_key) {
                    inner.pods.retain(|ns, _| scope.is_some_and(|s| s != ns));
                    inner.pods.extend(fresh);
                }
                inner.listed.insert(scope_key);
                let all_listed = inner.listed.len() >= self.scopes;
                drop(inner);
                // The list's pages (every pod in the cluster, a page at a time) are freed.
                crate::memory::release_free_memory();
                // Counted before the cache says it is ready.
                self.kept.set(self.count() as i64);
                if all_listed {
                    self.ready.send_replace(true);
                }
                None
            }
            watcher::Event::InitApply(mut pod) => {
                if !self.keeps(&inner.pods, &pod) {
                    return None;
                }
                keep_what_is_read(&mut pod);
                if let Some(relist) = inner.relists.get_mut(&scope_key) {
                    put(relist, Arc::new(pod.clone()));
                }
                Some((pod, false))
            }
            watcher::Event::Apply(mut pod) => {
                if !self.keeps(&inner.pods, &pod) {
                    return None;
                }
                keep_what_is_read(&mut pod);
                put(&mut inner.pods, Arc::new(pod.clone()));
                Some((pod, false))
            }
            watcher::Event::Delete(mut pod) => {
                let (ns, name) = key(&pod);
                if let Some(uid) = pod.uid() {
                    inner.gone(uid);
                }
                // Only the pod with this uid (a same-name pod fetched since is another pod).
                let uid = pod.uid();
                let same = |m: &ByNamespace| find(m, &ns, &name).is_some_and(|p| p.uid() == uid);
                let kept = same(&inner.pods) && take(&mut inner.pods, &ns, &name).is_some();
                if let Some(relist) = inner.relists.get_mut(&scope_key)
                    && same(relist)
                {
                    take(relist, &ns, &name);
                }
                if !kept && !(self.follows)(&pod) {
                    return None;
                }
                keep_what_is_read(&mut pod);
                Some((pod, true))
            }
        }
    }

    /// Takes in a fetched pod, unless the watch has a newer one or saw it deleted. Returns
    /// whether it was kept.
    fn fetched(&self, pod: Pod) -> bool {
        let mut inner = self.inner.lock().unwrap();
        if pod.uid().is_some_and(|uid| inner.gone.contains_key(&uid)) || !(self.follows)(&pod) {
            return false;
        }
        let pod = Arc::new(pod);
        let ns = pod.namespace();
        for scope in [ns, None] {
            if let Some(relist) = inner.relists.get_mut(&scope) {
                put(relist, pod.clone());
            }
        }
        put(&mut inner.pods, pod)
    }

    /// The followed pod `name` in `namespace`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        find(&self.inner.lock().unwrap().pods, namespace, name).cloned()
    }

    /// The followed pods of a namespace.
    pub fn in_namespace(&self, namespace: &str) -> Vec<Arc<Pod>> {
        let inner = self.inner.lock().unwrap();
        inner
            .pods
            .get(namespace)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// How many pods are kept.
    pub fn count(&self) -> usize {
        let inner = self.inner.lock().unwrap();
        inner.pods.values().map(HashMap::len).sum()
    }

    /// Resolves once the watch has listed every pod once.
    pub async fn wait_until_ready(&self) {
        let mut ready = self.ready.subscribe();
        let _ = ready.wait_for(|r| *r).await;
    }

    fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// A candidate names pod `name` (uid `uid`): fetches it unless it is kept, known gone, or
    /// the first list (which will bring it) is still to come.
    pub fn need_pod(&self, namespace: &str, name: &str, uid: &str) {
        if !self.is_ready() {
            return;
        }
        let fetch = {
            let mut inner = self.inner.lock().unwrap();
            let kept =
                find(&inner.pods, namespace, name).is_some_and(|p| p.uid().as_deref() == Some(uid));
            if kept || inner.gone.contains_key(uid) {
                return;
            }
            let fetch = Fetch::Pod {
                namespace: namespace.into(),
                name: name.into(),
                uid: uid.into(),
            };
            if !inner.pending.insert(fetch.clone()) {
                return;
            }
            fetch
        };
        let _ = self.fetches.send(fetch);
    }

    /// Whether the pods `selector` selects in `namespace` were listed since it was first needed.
    pub fn loaded(&self, namespace: &str, selector: &Selector) -> bool {
        let inner = self.inner.lock().unwrap();
        inner
            .loaded
            .contains(&(namespace.to_string(), selector.to_string()))
    }

    /// No valid annotated workload uses `selector` any more: its pods' events are dropped from
    /// now on, so it must be listed again if a workload uses it again.
    pub fn forget_selected(&self, namespace: &str, selector: &Selector) {
        let key = (namespace.to_string(), selector.to_string());
        let mut inner = self.inner.lock().unwrap();
        inner.loaded.remove(&key);
        *inner.forgotten.entry(key).or_default() += 1;
    }

    /// A single-active workload selects pods with `selector`: lists them once.
    pub fn need_selected(&self, namespace: &str, selector: &Selector) {
        let selector = selector.to_string();
        let fetch = {
            let key = (namespace.to_string(), selector);
            let mut inner = self.inner.lock().unwrap();
            if inner.loaded.contains(&key) {
                return;
            }
            let generation = inner.forgotten.get(&key).copied().unwrap_or(0);
            let fetch = Fetch::Selected {
                namespace: key.0,
                selector: key.1,
                generation,
            };
            if !inner.pending.insert(fetch.clone()) {
                return;
            }
            fetch
        };
        let _ = self.fetches.send(fetch);
    }

    /// Records a fetch done: its pods (slimmed) are taken in, and a candidate's pod
    /// that was not found is remembered as gone. Returns the pods kept.
    pub(crate) fn done(&self, fetch: &Fetch, result: Vec<Pod>) -> Vec<Pod> {
        let found = |uid: &str| result.iter().any(|p| p.uid().as_deref() == Some(uid));
        let not_found = match fetch {
            Fetch::Pod { uid, .. } => !found(uid),
            Fetch::Selected { .. } => false,
        };
        let mut kept = Vec::new();
        for mut pod in result {
            keep_what_is_read(&mut pod);
            if self.fetched(pod.clone()) {
                kept.push(pod);
            }
        }
        self.kept.set(self.count() as i64);
        let mut inner = self.inner.lock().unwrap();
        inner.pending.remove(fetch);
        match fetch {
            Fetch::Selected {
                namespace,
                selector,
                generation,
            } => {
                let key = (namespace.clone(), selector.clone());
                if inner.forgotten.get(&key).copied().unwrap_or(0) == *generation {
                    inner.loaded.insert(key);
                }
            }
            Fetch::Pod { uid, .. } => {
                if not_found {
                    inner.gone(uid.clone());
                }
            }
        }
        kept
    }
}

impl Inner {
    /// Remembers a uid as gone, forgetting those gone for longer than [`GONE_FOR`] once the
    /// set has doubled.
    fn gone(&mut self, uid: String) {
        let now = Instant::now();
        self.gone.insert(uid, now);
        if self.gone.len() >= self.prune_gone_at.max(1024) {
            self.gone
                .retain(|_, at| now.saturating_duration_since(*at) < GONE_FOR);
            self.prune_gone_at = 2 * self.gone.len();
        }
    }
}

/// Whether `pod` carries the role label the operator sets on single-active pods.
pub fn has_role(pod: &Pod) -> bool {
    pod.labels().contains_key(ROLE_LABEL)
}

/// Carries out the fetches `pods` asks for, one at a time, retrying failures after a pause;
/// `kept` is told of each pod taken in. Returns only if the cache is gone.
pub async fn fetch_loop(
    client: Client,
    pods: FollowedPods,
    mut fetches: mpsc::UnboundedReceiver<Fetch>,
    kept: impl Fn(&Pod),
) -> anyhow::Error {
    while let Some(fetch) = fetches.recv().await {
        let result = match &fetch {
            Fetch::Pod {
                namespace, name, ..
            } => {
                let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
                api.get_opt(name).await.map(|p| p.into_iter().collect())
            }
            Fetch::Selected {
                namespace,
                selector,
                ..
            } => {
                let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
                api.list(&ListParams::default().labels(selector))
                    .await
                    .map(|l| l.items)
            }
        };
        match result {
            Ok(found) => {
                for pod in pods.done(&fetch, found) {
                    kept(&pod);
                }
            }
            Err(e) => {
                // Still pending: asked again after a pause, and not twice meanwhile.
                tracing::warn!(?fetch, error = %e, "fetching pods failed (retried)");
                let again = pods.fetches.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    let _ = again.send(fetch);
                });
            }
        }
    }
    anyhow::anyhow!("the pod fetcher stopped")
}

#[cfg(test)]
mod tests;
