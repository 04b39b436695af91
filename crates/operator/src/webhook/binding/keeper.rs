//! Following the injected pods while the replica acts: each one's ServiceAccount gets the
//! rights to its lease as the watch delivers it, a pod running unwrapped is reported, and a
//! look every [`SWEEP_EVERY`] removes what no pod uses.

use std::collections::{BTreeMap, BTreeSet};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};

use super::look::{Scope, look};
use super::{Account, INJECT_LABEL, SWEEP_EVERY, Seen, apply, grant, needs, unwrapped, wanted};
use crate::cache::namespaces::Arbitrated;

/// Keeps the agents' rights while the replica acts. Returns only if the watch of pods ended.
/// Failures are logged, and retried at the pod's next event or the next look.
pub(crate) async fn keep(
    client: Client,
    namespace: Option<String>,
    instance: Option<String>,
    arbitrated: Arbitrated,
    reporter: kube::runtime::events::Reporter,
) {
    let pods: Api<Pod> = match &namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    // Every labelled pod: this install's need rights, and any that runs unwrapped is reported
    // (also one labelled for an instance that no install serves).
    let config = watcher::Config::default().labels(&format!("{INJECT_LABEL}=true"));
    let mut events = watcher(pods, config).default_backoff().boxed();
    let mut gained = arbitrated.clone();
    let mut keeper = Keeper {
        recorder: crate::report::Recorder::new(client.clone(), reporter),
        client,
        namespace,
        instance,
        arbitrated,
        injected: BTreeMap::new(),
        listing: None,
        granted: BTreeMap::new(),
        unused: BTreeSet::new(),
        unwrapped_seen: BTreeSet::new(),
        ever_listed: false,
    };
    let mut looks = tokio::time::interval(SWEEP_EVERY);
    looks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    looks.reset();
    loop {
        tokio::select! {
            event = events.next() => {
                let Some(event) = event else {
                    return tracing::error!("the watch of injected pods ended");
                };
                if let Some(pod) = keeper.follow(event) {
                    keeper.grant_for(&pod).await;
                }
            }
            _ = looks.tick() => keeper.look().await,
            // A namespace came to match: its pods' rights now, not at the next look.
            () = gained.gained(), if keeper.listed() => keeper.grant_wanted().await,
        }
    }
}

/// What [`keep`] follows and remembers.
struct Keeper {
    client: Client,
    namespace: Option<String>,
    instance: Option<String>,
    arbitrated: Arbitrated,
    recorder: crate::report::Recorder,
    /// The injected pods by (namespace, name), with the account and lease each needs.
    injected: BTreeMap<(String, String), (Account, String)>,
    /// The pods listed so far while the watch (re)lists them; `None` between lists.
    listing: Option<BTreeMap<(String, String), (Account, String)>>,
    /// The leases each account's Role grants.
    granted: BTreeMap<Account, BTreeSet<String>>,
    unused: BTreeSet<Seen>,
    /// Pods reported running unwrapped.
    unwrapped_seen: BTreeSet<(String, String)>,
    /// The pods were listed in full at least once.
    ever_listed: bool,
}

impl Keeper {
    /// The pods were listed once, and are not being listed again: before that, an empty or
    /// partial list would count every binding unused, so no look is made.
    fn listed(&self) -> bool {
        self.listing.is_none() && self.ever_listed
    }

    fn covered(&self, ns: &str) -> bool {
        self.arbitrated.covers(ns) == Some(true)
    }

    /// Applies one watch event to the injected pods; returns the pod it delivered, if it is
    /// one to act on now.
    fn follow(&mut self, event: Result<watcher::Event<Pod>, watcher::Error>) -> Option<Pod> {
        let instance = self.instance.as_deref();
        match event {
            Ok(watcher::Event::Init) => {
                self.listing = Some(BTreeMap::new());
                None
            }
            Ok(watcher::Event::InitDone) => {
                self.injected = self.listing.take().unwrap_or_default();
                self.ever_listed = true;
                None
            }
            Ok(watcher::Event::InitApply(p)) => {
                if let (Some(l), Some(need)) = (self.listing.as_mut(), needs(instance, &p)) {
                    l.insert((p.namespace().unwrap_or_default(), p.name_any()), need);
                }
                Some(p)
            }
            Ok(watcher::Event::Apply(p)) => {
                let key = (p.namespace().unwrap_or_default(), p.name_any());
                match needs(instance, &p) {
                    Some(need) => self.injected.insert(key, need),
                    None => self.injected.remove(&key),
                };
                Some(p)
            }
            Ok(watcher::Event::Delete(p)) => {
                self.injected
                    .remove(&(p.namespace().unwrap_or_default(), p.name_any()));
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "watching injected pods (retrying)");
                None
            }
        }
    }

    /// Gives `pod`'s account the rights to its lease, or reports it running unwrapped.
    /// Nothing is written where this install does not arbitrate.
    async fn grant_for(&mut self, pod: &Pod) {
        let key = (pod.namespace().unwrap_or_default(), pod.name_any());
        if !self.covered(&key.0) {
            return;
        }
        let instance = self.instance.as_deref();
        let Some((account, lease)) = needs(instance, pod) else {
            if unwrapped(pod) && self.unwrapped_seen.insert(key.clone()) {
                tracing::warn!(namespace = %key.0, pod = %key.1, "a pod labelled arbiter.dev/inject runs without the agent (created while the webhook was not installed, outside its namespaces, or labelled for an instance no install serves): replace it to have it wrapped");
                crate::report::events::publish(
                    &self.recorder,
                    &pod.object_ref(&()),
                    kube::runtime::events::EventType::Warning,
                    "NotInjected",
                    "labelled arbiter.dev/inject but created without the agent (no webhook configuration then, or its arbiter.dev/instance is served by no install): its command runs beside the lease's; with --inject-evict-unwrapped the acting operator evicts it (if a controller owns it) so that it is created again wrapped, else delete it".into(),
                );
            }
            return;
        };
        let has = self.granted.entry(account.clone()).or_default();
        if has.contains(&lease) {
            return;
        }
        let mut leases = has.clone();
        leases.insert(lease);
        match apply(&self.client, instance, &account, &leases).await {
            Ok(()) => {
                self.granted.insert(account, leases);
            }
            Err(e) => {
                tracing::warn!(namespace = %account.0, service_account = %account.1, error = %e, "making the injected agent's rights failed (retrying at the next look)")
            }
        }
    }

    /// One look ([`look`]), once the pods are listed: removes the rights unused twice, and
    /// makes again what was deleted by hand (or with its namespace) for the pods that still
    /// need it.
    async fn look(&mut self) {
        if !self.listed() {
            return;
        }
        let want = wanted(&self.injected);
        let used: BTreeSet<Account> = want.keys().cloned().collect();
        let scope = Scope {
            instance: self.instance.as_deref(),
            namespace: self.namespace.as_deref(),
            arbitrated: &self.arbitrated,
        };
        match look(&self.client, &scope, &used, &self.unused).await {
            Ok((next, present)) => {
                self.unused = next;
                self.granted = present;
                self.grant(want).await;
            }
            Err(e) => tracing::warn!(error = %e, "removing unused agent rights failed (retrying)"),
        }
    }

    /// Makes the rights every injected pod needs.
    async fn grant_wanted(&mut self) {
        let want = wanted(&self.injected);
        self.grant(want).await;
    }

    async fn grant(&mut self, want: BTreeMap<Account, BTreeSet<String>>) {
        let arbitrated = &self.arbitrated;
        let covered = |ns: &str| arbitrated.covers(ns) == Some(true);
        grant(
            &self.client,
            self.instance.as_deref(),
            want,
            &covered,
            &mut self.granted,
        )
        .await;
    }
}
