//! The pod watch and the fetches of followed pods it missed.

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use super::super::Caches;
use super::super::candidate_index::owner_pod;
use super::super::pods::{Fetch, fetch_loop};
use super::super::stopped::StoppedPods;
use super::api;
use crate::queue::Enqueue;

/// The pod watch, started once `listed` (the candidates and workloads are listed, so that its
/// first list keeps every pod they name), and the fetches of followed pods it missed
/// (`fetches`): each pod event is proof of a stop or not, and enqueues the leases of the pod's
/// candidates and workloads.
pub(super) fn pod_events(
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
