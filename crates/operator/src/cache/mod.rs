//! The operator's caches and the watches that fill them: LeaseCandidates, the Leases it manages
//! (label `arbiter.dev/managed`), the pods it follows (only candidates' and single-active
//! workloads' pods, kept slim: [`crate::cache::pods`], [`crate::cache::slim`]), and annotated Deployments and
//! StatefulSets. Every change enqueues the leases it may affect. Every replica keeps these
//! warm, leader or not.

pub(crate) mod candidate_index;
pub(crate) mod declared;
#[cfg(test)]
pub(crate) mod feed;
pub(crate) mod incarnations;
pub(crate) mod lease_records;
pub(crate) mod limits;
pub(crate) mod liveness;
pub(crate) mod namespaces;
pub mod pod_facts;
pub(crate) mod pods;
pub(crate) mod slim;
pub(crate) mod stopped;
pub(crate) mod stores;
pub(crate) mod unwrapped;
pub(crate) mod workloads;
pub(crate) mod written;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};

use crate::cache::candidate_index::{CandidateIndex, key_of, owner_pod};
use crate::cache::incarnations::IncarnationLog;
use crate::cache::lease_records::Records;
use crate::cache::liveness::Liveness;
use crate::cache::pods::{Fetch, FollowedPods, fetch_loop, has_role};
use crate::cache::stopped::StoppedPods;
use crate::cache::stores::{Cached, Writer};
use crate::cache::workloads::AnnotatedWorkloads;
use crate::key::LeaseKey;
use crate::queue::Enqueue;
use crate::term::held::Held;
use crate::workloads::{Workload, WorkloadError};
use arbiter_api::LeaseCandidate;
use arbiter_api::lease::MANAGED_LABEL;

/// The caches every replica keeps warm, leader or not.
#[derive(Clone)]
pub struct Caches {
    pub candidates: Cached<LeaseCandidate>,
    pub leases: Cached<Lease>,
    pub pods: FollowedPods,
    /// Kept for readiness: [`Self::workloads`] is complete once these are.
    pub deployments: Cached<Deployment>,
    pub stateful_sets: Cached<StatefulSet>,
    /// The single-active workloads, from the Deployment and StatefulSet watches.
    pub workloads: AnnotatedWorkloads,
    /// Every candidate's recent incarnation stamps (duplicate identities).
    pub incarnations: IncarnationLog,
    /// What each candidate was heard to write: answers to this process's pings, renewals
    /// seen as they happened.
    pub liveness: Liveness,
    /// The candidates of each lease.
    pub by_lease: CandidateIndex,
    /// Pods confirmed stopped (terminal, or deleted after their containers stopped).
    pub stopped_pods: StoppedPods,
    /// Pods labelled for injection that run unwrapped, by lease ([`unwrapped`]).
    pub unwrapped: unwrapped::UnwrappedPods,
    /// When each Lease record was delivered (the start of its age).
    pub records: Records,
    /// Each lease's holder as this process last saw or assigned it (the workers' memory; the
    /// Lease watch bumps it as it delivers a holder's records).
    pub held: Held,
    /// Which candidates each namespace's limits admit ([`limits`]).
    pub limits: limits::Tally,
    /// This install's instance (`--instance`): what its watches list, and the label of what it
    /// creates.
    pub instance: Option<String>,
    /// The namespaces this install arbitrates (`--namespace-selector`; all of the watch scope
    /// without one).
    pub arbitrated: namespaces::Arbitrated,
    /// One lock per namespace, held by a worker for a single-active lease's whole reconcile:
    /// role labels belong to pods, and two workloads (or a workload whose lease name changed)
    /// may select the same pods, so "demote, then promote" must not interleave across workers.
    pub single_active_locks: NamespaceLocks,
}

/// Per-namespace async locks (see [`Caches::single_active_locks`]).
#[derive(Clone, Default)]
pub struct NamespaceLocks(Arc<std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>);

impl NamespaceLocks {
    pub async fn lock(&self, namespace: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = self
            .0
            .lock()
            .unwrap()
            .entry(namespace.to_string())
            .or_default()
            .clone();
        lock.lock_owned().await
    }
}

impl Caches {
    /// Caches on these stores, with every index and memory empty.
    pub(crate) fn with(
        candidates: Cached<LeaseCandidate>,
        leases: Cached<Lease>,
        pods: FollowedPods,
        deployments: Cached<Deployment>,
        stateful_sets: Cached<StatefulSet>,
        by_lease: CandidateIndex,
        workloads: AnnotatedWorkloads,
    ) -> Caches {
        Caches {
            candidates,
            leases,
            pods,
            deployments,
            stateful_sets,
            workloads,
            incarnations: IncarnationLog::default(),
            liveness: Liveness::default(),
            by_lease,
            stopped_pods: StoppedPods::default(),
            unwrapped: unwrapped::UnwrappedPods::default(),
            records: Records::default(),
            held: Held::default(),
            limits: limits::Tally::default(),
            instance: None,
            arbitrated: namespaces::Arbitrated::all(),
            single_active_locks: NamespaceLocks::default(),
        }
    }
}

/// The pods the operator follows: a pod is followed if a candidate names it, an annotated
/// workload selects it, or it carries a role label the operator set. Also the fetches of
/// followed pods the watch has not delivered.
fn follow_pods(
    by_lease: &CandidateIndex,
    workloads: &AnnotatedWorkloads,
    scopes: usize,
    kept: prometheus_client::metrics::gauge::Gauge,
) -> (FollowedPods, tokio::sync::mpsc::UnboundedReceiver<Fetch>) {
    let (index, annotated) = (by_lease.clone(), workloads.clone());
    let follows = Arc::new(move |pod: &Pod| {
        pod.uid().is_some_and(|uid| index.has_pod(&uid))
            || annotated.selects_any(pod)
            || has_role(pod)
            || crate::workloads::unwrapped::unwrapped_lease(pod).is_some()
    });
    FollowedPods::new(follows, scopes, kept)
}

/// Ends once the candidates and workloads are listed: the pod watch starts then, so that its
/// first list keeps every pod they name without fetching them one by one. (This is the only
/// wait on those three stores: a kube-runtime store wakes only its last waiter.)
fn all_listed(
    candidates: &Cached<LeaseCandidate>,
    deployments: &Cached<Deployment>,
    stateful_sets: &Cached<StatefulSet>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (c, d, s) = (
        candidates.clone(),
        deployments.clone(),
        stateful_sets.clone(),
    );
    async move {
        let _ = tokio::join!(
            c.wait_until_ready(),
            d.wait_until_ready(),
            s.wait_until_ready()
        );
    }
}

/// The three watches (and the selected namespaces', with `--namespace-selector`), as one stream
/// that ends only on error. Each event enqueues the leases it may affect.
pub fn watch_all(
    client: Client,
    scopes: &[Option<String>],
    instance: Option<&str>,
    namespace_selector: Option<&str>,
    limits: limits::Limits,
    enqueue: Enqueue,
    pods_followed: prometheus_client::metrics::gauge::Gauge,
) -> (Caches, BoxStream<'static, anyhow::Error>) {
    let (candidates, cws) = Cached::new(scopes);
    let (leases, lws) = Cached::new(scopes);
    let (deployments, dws) = Cached::new(scopes);
    let (stateful_sets, sws) = Cached::new(scopes);
    let (by_lease, workloads) = (CandidateIndex::default(), AnnotatedWorkloads::default());
    let (pods, fetches) = follow_pods(&by_lease, &workloads, scopes.len(), pods_followed);
    let listed = all_listed(&candidates, &deployments, &stateful_sets);
    let mut caches = Caches::with(
        candidates,
        leases,
        pods,
        deployments,
        stateful_sets,
        by_lease,
        workloads,
    );
    caches.limits = limits::Tally::new(limits);
    caches.instance = instance.map(String::from);
    let stopped_pods = caches.stopped_pods.clone();

    // Only what this install arbitrates (`--instance`) is listed at all.
    let selector = arbiter_api::instance_selector(instance);
    // One watch of each kind per scope (a namespace, or all).
    let mut streams: Vec<BoxStream<'static, anyhow::Result<()>>> = Vec::new();
    if let Some(selector) = namespace_selector {
        let (arbitrated, events) =
            namespaces::watch(&client, selector, leases_of(&caches, enqueue.clone()));
        caches.arbitrated = arbitrated;
        streams.push(events);
    }
    for (((scope, cw), lw), (dw, sw)) in scopes
        .iter()
        .zip(cws)
        .zip(lws)
        .zip(dws.into_iter().zip(sws))
    {
        let ns = scope.as_deref();
        streams.push(candidate_events(
            &client,
            ns,
            &selector,
            cw,
            &caches,
            enqueue.clone(),
        ));
        streams.push(lease_events(
            &client,
            ns,
            &selector,
            lw,
            &caches,
            enqueue.clone(),
        ));
        streams.push(
            workload_events(
                api::<Deployment>(&client, ns),
                &selector,
                dw,
                "Deployment",
                Workload::from_deployment,
                &caches,
                enqueue.clone(),
            )
            .boxed(),
        );
        streams.push(
            workload_events(
                api::<StatefulSet>(&client, ns),
                &selector,
                sw,
                "StatefulSet",
                Workload::from_stateful_set,
                &caches,
                enqueue.clone(),
            )
            .boxed(),
        );
    }
    streams.push(pod_events(
        &client,
        scopes,
        &caches,
        stopped_pods,
        listed,
        fetches,
        enqueue,
    ));
    let errors = futures::stream::select_all(streams)
        .filter_map(|r: anyhow::Result<()>| async move { r.err() })
        .boxed();
    (caches, errors)
}

/// What a namespace coming to be arbitrated sets off: every lease of it is enqueued (those
/// its candidates name, its Leases, those its single-active workloads govern), and its
/// refused candidates are reported.
fn leases_of(caches: &Caches, e: Enqueue) -> impl Fn(&str) + Send + 'static {
    let (index, leases, workloads, tally) = (
        caches.by_lease.clone(),
        caches.leases.clone(),
        caches.workloads.clone(),
        caches.limits.clone(),
    );
    move |namespace: &str| {
        tally.nudge();
        let mut names = index.leases_in(namespace, |_| true);
        names.extend(
            (leases.state().iter())
                .filter(|l| l.namespace().as_deref() == Some(namespace))
                .map(|l| l.name_any()),
        );
        for name in names {
            e.key(LeaseKey::new(namespace, &name));
        }
        for key in workloads.leases_in(namespace) {
            e.key(key);
        }
    }
}

/// The API of `K` in `namespace`, or in all namespaces.
fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The pod watch, started once `listed` (the candidates and workloads are listed, so that its
/// first list keeps every pod they name), and the fetches of followed pods it missed
/// (`fetches`): each pod event is proof of a stop or not, and enqueues the leases of the pod's
/// candidates and workloads.
fn pod_events(
    client: &Client,
    scopes: &[Option<String>],
    caches: &Caches,
    stopped_pods: StoppedPods,
    listed: impl std::future::Future<Output = ()> + Send + 'static,
    fetches: tokio::sync::mpsc::UnboundedReceiver<Fetch>,
    enqueue: Enqueue,
) -> BoxStream<'static, anyhow::Result<()>> {
    let e = enqueue;
    let (pod_index, annotated) = (caches.by_lease.clone(), caches.workloads.clone());
    let unwrapped = caches.unwrapped.clone();
    // What a followed pod's event (or fetch) means: proof of a stop, leases to look at.
    let on_pod = move |pod: &Pod, deleted: bool| {
        stopped_pods.record_event(pod, deleted);
        for key in pod_index.leases_of_pod(&pod.uid().unwrap_or_default()) {
            e.key(key);
        }
        // A single-active workload's pod may have no candidate yet.
        for key in annotated.selecting(pod) {
            e.key(key);
        }
        // A pod labelled for injection that runs unwrapped holds its lease's election.
        if let Some(key) = unwrapped.record(pod, deleted) {
            e.key(key);
        }
    };
    let (all_candidates, on_fetched) = (caches.candidates.clone(), on_pod.clone());
    let (pods, client_for_watch, scopes) = (caches.pods.clone(), client.clone(), scopes.to_vec());
    let events = futures::stream::once(listed).flat_map(move |()| {
        let watches = scopes.iter().map(|scope| {
            let (pods, all_candidates, on_pod) =
                (pods.clone(), all_candidates.clone(), on_pod.clone());
            let scope = scope.clone();
            // Pods and workloads keep kube-runtime's backoff (up to 30 s): relisting every pod
            // in the cluster every few seconds would weigh on an API server that is struggling,
            // and elections after a restart need the candidates and Leases, not these.
            watcher(
                api::<Pod>(&client_for_watch, scope.as_deref()),
                watcher::Config::default(),
            )
            .default_backoff()
            .map(move |ev| {
                let ev = ev?;
                let listed = matches!(ev, watcher::Event::InitDone);
                // Only what the operator reads is kept (managed fields, annotations,
                // volumes, env and probes are most of a pod).
                if let Some((pod, deleted)) = pods.apply_event_in(scope.as_deref(), ev) {
                    on_pod(&pod, deleted);
                }
                if listed {
                    // Candidates that came while the list went by.
                    for c in all_candidates.state() {
                        if let Some((name, uid)) = owner_pod(&c) {
                            pods.need_pod(&c.namespace().unwrap_or_default(), &name, &uid);
                        }
                    }
                }
                Ok::<_, anyhow::Error>(())
            })
            .boxed()
        });
        futures::stream::select_all(watches)
    });
    let fetched = futures::stream::once(fetch_loop(
        client.clone(),
        caches.pods.clone(),
        fetches,
        move |pod| on_fetched(pod, false),
    ))
    .map(Err);
    futures::stream::select(events, fetched).boxed()
}

/// The candidate watch: every event feeds the incarnation log, the liveness evidence and the
/// index of candidates by lease, and enqueues the candidate's lease (a relist's, at its end).
fn candidate_events(
    client: &Client,
    namespace: Option<&str>,
    selector: &str,
    mut writer: Writer<LeaseCandidate>,
    caches: &Caches,
    enqueue: Enqueue,
) -> BoxStream<'static, anyhow::Result<()>> {
    let e = enqueue;
    let log = caches.incarnations.clone();
    let liveness = caches.liveness.clone();
    let listed_candidates = caches.candidates.clone();
    let index = caches.by_lease.clone();
    let followed = caches.pods.clone();
    // Leases of the candidates a (re)list delivered: reconciled at its end, once the store
    // holds what it listed (until then a worker would judge the candidates as they were).
    let mut relisted: HashSet<LeaseKey> = HashSet::new();
    let tally = caches.limits.clone();
    let (judge, list_client, list_ns, list_selector) = (
        tally.clone(),
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
            let ev = ev?;
            match &ev {
                watcher::Event::Apply(c) | watcher::Event::InitApply(c)
                    if tally.is_refused(&c.uid().unwrap_or_default()) =>
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
                        followed.need_pod(&c.namespace().unwrap_or_default(), &name, &uid);
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
                    let listed = |ns: &str, name: &str| listed_candidates.get(ns, name).is_some();
                    liveness.retain(listed);
                    log.retain(listed);
                    let cached: HashSet<String> = listed_candidates
                        .state()
                        .iter()
                        .filter_map(|c| c.uid())
                        .collect();
                    index.retain_gone(|uid| cached.contains(uid));
                    for key in relisted.drain() {
                        e.key(key);
                    }
                }
                _ => {}
            }
            match ev {
                watcher::Event::InitApply(c) => {
                    relisted.insert(key_of(&c));
                }
                ev => {
                    for c in touched(ev) {
                        e.key(key_of(&c));
                    }
                }
            }
            Ok::<_, anyhow::Error>(())
        })
        .boxed()
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

/// The watch of the Leases arbiter manages: each record's delivery is stamped (the start of
/// its age) and the memory of holders follows the renewals; the leases that need a reconcile
/// are enqueued.
fn lease_events(
    client: &Client,
    namespace: Option<&str>,
    instance_selector: &str,
    mut writer: Writer<Lease>,
    caches: &Caches,
    enqueue: Enqueue,
) -> BoxStream<'static, anyhow::Result<()>> {
    let e = enqueue;
    let (records, held, listed_leases) = (
        caches.records.clone(),
        caches.held.clone(),
        caches.leases.clone(),
    );
    let managed =
        watcher::Config::default().labels(&format!("{MANAGED_LABEL}=true,{instance_selector}"));
    arbiter_api::tolerant::watch::<Lease>(client.clone(), namespace, managed)
        .backoff(arbiter_candidate::client::reconnect_backoff())
        .modify(|l| crate::cache::slim::keep_arbiter_owned(&mut l.metadata))
        .map_ok(move |ev| {
            writer.apply_watcher_event(&ev);
            ev
        })
        .map(move |ev| {
            let ev = ev?;
            let listed = |k: &LeaseKey| listed_leases.get(&k.namespace, &k.name).is_some();
            for key in records.on_event(&held, &ev, listed) {
                e.key(key);
            }
            Ok(())
        })
        .boxed()
}

/// A workload kind's watch, filling its cache. The lease an annotated workload governs, and the
/// one it governed before if its annotation was removed or its lease name changed, need
/// reconciling; its pods need listing once, and again if its selector was dropped meanwhile.
fn workload_events<K>(
    api: Api<K>,
    selector: &str,
    mut writer: Writer<K>,
    kind: &'static str,
    parse: fn(&K) -> Option<Result<Workload, WorkloadError>>,
    caches: &Caches,
    e: Enqueue,
) -> impl futures::Stream<Item = anyhow::Result<()>> + Send + 'static
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (annotated, pods) = (caches.workloads.clone(), caches.pods.clone());
    watcher(api, watcher::Config::default().labels(selector))
        .default_backoff()
        .modify(|w| w.managed_fields_mut().clear())
        .map_ok(move |ev| {
            writer.apply_watcher_event(&ev);
            ev
        })
        .map(move |ev| {
            let ev = ev?;
            let deleted = matches!(ev, watcher::Event::Delete(_));
            for obj in touched(ev) {
                let parsed = parse(&obj);
                let ns = obj.namespace().unwrap_or_default();
                let before = annotated.valid_selector(&ns, kind, &obj.name_any());
                let now = match (&parsed, deleted) {
                    (Some(Ok(w)), false) => Some(w.selector.clone()),
                    _ => None,
                };
                // A selector no longer followed: its pods' events are dropped from now on, so
                // it must be listed again if it comes back.
                if let Some(b) = before
                    && now.as_ref().map(ToString::to_string) != Some(b.to_string())
                {
                    pods.forget_selected(&ns, &b);
                }
                if let Some(s) = &now {
                    pods.need_selected(&ns, s);
                }
                for key in annotated.take_in(&obj, kind, parsed, deleted) {
                    e.key(key);
                }
            }
            Ok(())
        })
}

fn touched<K>(ev: watcher::Event<K>) -> Vec<K> {
    match ev {
        watcher::Event::Apply(o) | watcher::Event::Delete(o) | watcher::Event::InitApply(o) => {
            vec![o]
        }
        watcher::Event::Init | watcher::Event::InitDone => vec![],
    }
}
