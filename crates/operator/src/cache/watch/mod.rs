//! The watches that fill the caches, one of each kind per scope (a namespace, or all): the
//! candidates ([`candidates`]), the Leases arbiter manages ([`leases`]), annotated Deployments
//! and StatefulSets ([`workloads`]), and the pods the operator follows ([`pods`]), started once
//! the others are listed. Every event enqueues the leases it may affect.

mod candidates;
mod leases;
mod pods;
mod workloads;

use std::sync::Arc;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};

use super::candidate_index::CandidateIndex;
use super::pods::{Fetch, FollowedPods, has_role};
use super::stores::{Cached, Writer};
use super::workloads::AnnotatedWorkloads;
use super::{Caches, limits, namespaces};
use crate::key::LeaseKey;
use crate::queue::Enqueue;
use crate::workloads::Workload;
use arbiter_api::LeaseCandidate;

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
        let writers = (cw, lw, dw, sw);
        let ns = scope.as_deref();
        streams.extend(scope_streams(
            &client, ns, &selector, writers, &caches, &enqueue,
        ));
    }
    streams.push(pods::pod_events(
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

/// One scope's watches (a namespace, or all): candidates, Leases, Deployments, StatefulSets.
fn scope_streams(
    client: &Client,
    ns: Option<&str>,
    selector: &str,
    (cw, lw, dw, sw): (
        Writer<LeaseCandidate>,
        Writer<Lease>,
        Writer<Deployment>,
        Writer<StatefulSet>,
    ),
    caches: &Caches,
    enqueue: &Enqueue,
) -> [BoxStream<'static, anyhow::Result<()>>; 4] {
    [
        candidates::candidate_events(client, ns, selector, cw, caches, enqueue.clone()),
        leases::lease_events(client, ns, selector, lw, caches, enqueue.clone()),
        workloads::workload_events(
            api::<Deployment>(client, ns),
            selector,
            dw,
            "Deployment",
            Workload::from_deployment,
            caches,
            enqueue.clone(),
        )
        .boxed(),
        workloads::workload_events(
            api::<StatefulSet>(client, ns),
            selector,
            sw,
            "StatefulSet",
            Workload::from_stateful_set,
            caches,
            enqueue.clone(),
        )
        .boxed(),
    ]
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
pub(super) fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The objects a watch event delivers (none for a list's start or end).
pub(super) fn touched<K>(ev: watcher::Event<K>) -> Vec<K> {
    match ev {
        watcher::Event::Apply(o) | watcher::Event::Delete(o) | watcher::Event::InitApply(o) => {
            vec![o]
        }
        watcher::Event::Init | watcher::Event::InitDone => vec![],
    }
}
