//! The namespaces an install arbitrates when `--namespace-selector` is set. The API server
//! selects them: a watch of Namespaces' metadata with that label selector delivers a namespace
//! when its labels come to match and deletes it when they stop matching, so this process never
//! evaluates a selector itself, and a selector the API server refuses stops the operator at
//! start-up with its message.
//!
//! Everything that writes for a lease (its election, a candidate's expiry, a single-active
//! workload's roles, a refused candidate's condition, an injected agent's rights) asks
//! [`Arbitrated::covers`] first. The caches still hold every namespace of the watch scope (a
//! watch cannot select by its objects' namespace labels). The leases of a namespace that comes
//! to match are reconciled at once; one that stops matching is left as it is: its holder keeps
//! renewing, and no election, expiry or eviction happens there until an install arbitrates it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

/// Logged when a namespace comes to match the selector.
const COMES: &str = "namespace matches --namespace-selector: its leases are arbitrated";
/// Logged when a namespace stops matching it.
const GOES: &str = "namespace no longer matches --namespace-selector: nothing is written there until it matches again";

/// Which namespaces this install arbitrates.
#[derive(Clone)]
pub struct Arbitrated(Option<Selected>);

#[derive(Clone)]
struct Selected {
    store: Store<PartialObjectMeta<Namespace>>,
    /// The selected namespaces were listed once: until then nothing is known to be covered.
    listed: Arc<AtomicBool>,
    /// Bumped whenever a namespace comes to match.
    gained: tokio::sync::watch::Receiver<u64>,
}

impl Arbitrated {
    /// Every namespace of the watch scope (no `--namespace-selector`).
    pub fn all() -> Arbitrated {
        Arbitrated(None)
    }

    /// Whether this install arbitrates `namespace`; `None` until the selected namespaces were
    /// listed.
    pub fn covers(&self, namespace: &str) -> Option<bool> {
        let Some(s) = &self.0 else {
            return Some(true);
        };
        if !s.listed.load(Ordering::Acquire) {
            return None;
        }
        Some(s.store.get(&ObjectRef::new(namespace)).is_some())
    }

    /// Resolves once the selected namespaces were listed (at once without a selector). Waited
    /// on in one place only: a kube-runtime store wakes only its last waiter.
    pub async fn wait_until_listed(&self) {
        if let Some(s) = &self.0 {
            let _ = s.store.wait_until_ready().await;
        }
    }

    /// Resolves when a namespace has come to match since the last call (never without a
    /// selector).
    pub async fn gained(&mut self) {
        match &mut self.0 {
            Some(s) => {
                if s.gained.changed().await.is_err() {
                    std::future::pending().await
                }
            }
            None => std::future::pending().await,
        }
    }

    /// Namespaces `names` covered, for tests.
    #[cfg(test)]
    pub fn only(names: &[&str]) -> Arbitrated {
        let (store, mut writer) = reflector::store();
        writer.apply_watcher_event(&watcher::Event::Init);
        for name in names {
            let mut ns = PartialObjectMeta::<Namespace>::default();
            ns.metadata.name = Some(name.to_string());
            writer.apply_watcher_event(&watcher::Event::InitApply(ns));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        Arbitrated(Some(Selected {
            store,
            listed: Arc::new(AtomicBool::new(true)),
            gained: tokio::sync::watch::channel(0).1,
        }))
    }
}

/// Checks `selector` with the API server (one list of at most one namespace), so that a
/// selector it refuses, or a missing right to list namespaces, stops the operator at start-up
/// with the API server's message.
pub async fn check(client: &Client, selector: &str) -> anyhow::Result<()> {
    Api::<Namespace>::all(client.clone())
        .list_metadata(&ListParams::default().labels(selector).limit(1))
        .await
        .map(|_| ())
        .map_err(|e| {
            anyhow::anyhow!("--namespace-selector {selector:?}: listing namespaces failed: {e}")
        })
}

/// The watch of the namespaces `selector` selects: calls `selected` with each namespace that
/// comes to match (all of them at the first list). The stream ends only if the watch does.
pub fn watch(
    client: &Client,
    selector: &str,
    selected: impl Fn(&str) + Send + 'static,
) -> (Arbitrated, BoxStream<'static, anyhow::Result<()>>) {
    let (store, writer) = reflector::store();
    let listed = Arc::new(AtomicBool::new(false));
    let (gained, gained_rx) = tokio::sync::watch::channel(0u64);
    let arbitrated = Arbitrated(Some(Selected {
        store,
        listed: listed.clone(),
        gained: gained_rx,
    }));
    let selected = move |name: &str| {
        selected(name);
        gained.send_modify(|n| *n += 1);
    };
    // What this stream saw selected, and what a (re)list is delivering.
    let mut known: BTreeSet<String> = BTreeSet::new();
    let mut relisting: BTreeSet<String> = BTreeSet::new();
    let config = watcher::Config::default().labels(selector);
    let namespaces: Api<PartialObjectMeta<Namespace>> = Api::all(client.clone());
    let events = watcher(namespaces, config)
        .default_backoff()
        .reflect(writer)
        .map(move |ev| {
            match ev? {
                watcher::Event::Init => relisting.clear(),
                watcher::Event::InitApply(ns) => {
                    relisting.insert(ns.name_any());
                }
                watcher::Event::InitDone => {
                    // Listed before anyone is woken: what wakes must find the namespaces known.
                    listed.store(true, Ordering::Release);
                    for name in relisting.difference(&known) {
                        tracing::info!(namespace = %name, "{COMES}");
                        selected(name);
                    }
                    for name in known.difference(&relisting) {
                        tracing::info!(namespace = %name, "{GOES}");
                    }
                    known = std::mem::take(&mut relisting);
                }
                watcher::Event::Apply(ns) => {
                    if known.insert(ns.name_any()) {
                        tracing::info!(namespace = %ns.name_any(), "{COMES}");
                        selected(&ns.name_any());
                    }
                }
                watcher::Event::Delete(ns) => {
                    if known.remove(&ns.name_any()) {
                        tracing::info!(namespace = %ns.name_any(), "{GOES}");
                    }
                }
            }
            Ok(())
        })
        .boxed();
    (arbitrated, events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_selector_every_namespace_is_covered() {
        assert_eq!(Arbitrated::all().covers("any"), Some(true));
    }

    #[test]
    fn with_one_only_the_listed_namespaces_are_and_nothing_before_the_list() {
        let only = Arbitrated::only(&["team-a"]);
        assert_eq!(only.covers("team-a"), Some(true));
        assert_eq!(only.covers("team-b"), Some(false));
        let (store, _writer) = reflector::store::<PartialObjectMeta<Namespace>>();
        let unlisted = Arbitrated(Some(Selected {
            store,
            listed: Arc::new(AtomicBool::new(false)),
            gained: tokio::sync::watch::channel(0).1,
        }));
        assert_eq!(unlisted.covers("team-a"), None);
    }
}
