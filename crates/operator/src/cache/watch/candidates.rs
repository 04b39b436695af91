//! The candidate watch, with the namespaces' limits applied before anything is cached.

use std::collections::HashSet;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use super::super::candidate_index::{CandidateIndex, key_of, owner_pod};
use super::super::incarnations::IncarnationLog;
use super::super::liveness::Liveness;
use super::super::pods::FollowedPods;
use super::super::stores::{Cached, Writer};
use super::super::{Caches, limits};
use super::{api, touched};
use crate::key::LeaseKey;
use crate::queue::Enqueue;
use arbiter_api::LeaseCandidate;

/// The candidate watch: every event feeds the incarnation log, the liveness evidence and the
/// index of candidates by lease, and enqueues the candidate's lease (a relist's, at its end).
pub(super) fn candidate_events(
    client: &Client,
    namespace: Option<&str>,
    selector: &str,
    mut writer: Writer<LeaseCandidate>,
    caches: &Caches,
    enqueue: Enqueue,
) -> BoxStream<'static, anyhow::Result<()>> {
    let mut delivered = Delivered {
        log: caches.incarnations.clone(),
        liveness: caches.liveness.clone(),
        listed: caches.candidates.clone(),
        index: caches.by_lease.clone(),
        followed: caches.pods.clone(),
        relisted: HashSet::new(),
        tally: caches.limits.clone(),
        enqueue,
    };
    let (judge, list_client, list_ns, list_selector) = (
        caches.limits.clone(),
        client.clone(),
        namespace.map(String::from),
        selector.to_string(),
    );
    // Tolerant: one candidate (or Lease) anyone wrote must not stop the watch for all.
    let config = watcher::Config::default().labels(selector);
    arbiter_api::tolerant::watch::<LeaseCandidate>(client.clone(), namespace, config)
        .backoff(arbiter_candidate::client::reconnect_backoff())
        // The namespaces' limits: a (re)list follows the candidates' creation order, and a
        // refused candidate is cut down before it is cached.
        .and_then(move |ev| {
            let (tally, client, ns, selector) = (
                judge.clone(),
                list_client.clone(),
                list_ns.clone(),
                list_selector.clone(),
            );
            async move { limits_applied(ev, &tally, &client, ns.as_deref(), &selector).await }
        })
        .modify(|c| crate::cache::slim::keep_arbiter_owned(&mut c.metadata))
        .map_ok(move |ev| {
            writer.apply_watcher_event(&ev);
            ev
        })
        .map(move |ev| {
            delivered.on(ev?);
            Ok::<_, anyhow::Error>(())
        })
        .boxed()
}

/// What a delivered candidate feeds: the incarnation log, the liveness evidence, the index of
/// candidates by lease and the pods followed; and the leases to enqueue.
struct Delivered {
    log: IncarnationLog,
    liveness: Liveness,
    listed: Cached<LeaseCandidate>,
    index: CandidateIndex,
    followed: FollowedPods,
    /// Leases of the candidates a (re)list delivered: reconciled at its end, once the store
    /// holds what it listed (until then a worker would judge the candidates as they were).
    relisted: HashSet<LeaseKey>,
    tally: limits::Tally,
    enqueue: Enqueue,
}

impl Delivered {
    fn on(&mut self, ev: watcher::Event<LeaseCandidate>) {
        let (log, liveness, index, e) = (&self.log, &self.liveness, &self.index, &self.enqueue);
        match &ev {
            watcher::Event::Apply(c) | watcher::Event::InitApply(c)
                if self.tally.is_refused(&c.uid().unwrap_or_default()) =>
            {
                log.forget(c);
                liveness.forget(c);
                index.remove(c);
            }
            watcher::Event::Apply(c) | watcher::Event::InitApply(c) => {
                log.record(c);
                liveness.delivered(c, matches!(ev, watcher::Event::Apply(_)));
                index.insert(c);
                if let Some((name, uid)) = owner_pod(c) {
                    self.followed
                        .need_pod(&c.namespace().unwrap_or_default(), &name, &uid);
                }
            }
            watcher::Event::Delete(c) => {
                log.forget(c);
                liveness.forget(c);
                index.remove(c);
            }
            // A relist reports no deletions: forget what it no longer lists (the store is
            // replaced before this runs).
            watcher::Event::InitDone => {
                let listed = |ns: &str, name: &str| self.listed.get(ns, name).is_some();
                liveness.retain(listed);
                log.retain(listed);
                let cached: HashSet<String> =
                    self.listed.state().iter().filter_map(|c| c.uid()).collect();
                index.retain_gone(|uid| cached.contains(uid));
                for key in self.relisted.drain() {
                    e.key(key);
                }
            }
            _ => {}
        }
        match ev {
            watcher::Event::InitApply(c) => {
                self.relisted.insert(key_of(&c));
            }
            ev => {
                for c in touched(ev) {
                    e.key(key_of(&c));
                }
            }
        }
    }
}

/// A candidate watch event with the namespaces' limits applied ([`limits`]): at a (re)list's
/// start the candidates are listed page by page and judged in creation order (if that list
/// fails, the relist's candidates are judged in the order they come); refused candidates are
/// cut down to stubs.
async fn limits_applied(
    mut ev: watcher::Event<LeaseCandidate>,
    tally: &limits::Tally,
    client: &Client,
    namespace: Option<&str>,
    selector: &str,
) -> watcher::Result<watcher::Event<LeaseCandidate>> {
    // The stub marker is the cache's own, whatever the API server's copy says.
    if let watcher::Event::Apply(c) | watcher::Event::InitApply(c) | watcher::Event::Delete(c) =
        &mut ev
    {
        limits::clear_stub_marker(c);
    }
    if !tally.limits().any() {
        return Ok(ev);
    }
    match &mut ev {
        watcher::Event::Init => {
            let listed = match list_in_creation_order(client, namespace, selector).await {
                Ok(listed) => Some(listed),
                Err(e) => {
                    tracing::warn!(error = %e, "listing the candidates for the namespaces' limits failed; candidates admitted stay so, new ones are admitted in the order they come");
                    None
                }
            };
            tally.relist(namespace, listed);
        }
        watcher::Event::Apply(c) | watcher::Event::InitApply(c) => {
            tally.apply(c);
        }
        watcher::Event::Delete(c) => tally.delete(c),
        watcher::Event::InitDone => tally.relisted(namespace),
    }
    Ok(ev)
}

/// What the limits need of every candidate, listed 500 at a time (only those few fields are
/// kept of each page).
async fn list_in_creation_order(
    client: &Client,
    namespace: Option<&str>,
    selector: &str,
) -> kube::Result<Vec<limits::Listed>> {
    let api: Api<arbiter_api::tolerant::Tolerant<LeaseCandidate>> = api(client, namespace);
    let mut listed = Vec::new();
    let mut params = kube::api::ListParams::default().labels(selector).limit(500);
    loop {
        let page = api.list(&params).await?;
        listed.extend(page.items.iter().map(|c| limits::Listed::of(&c.0)));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(listed),
        }
    }
}
