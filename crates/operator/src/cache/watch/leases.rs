//! The watch of the Leases arbiter manages.

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::runtime::WatchStreamExt;

use super::super::Caches;
use super::super::stores::Writer;
use crate::key::LeaseKey;
use crate::queue::Enqueue;
use arbiter_api::lease::MANAGED_LABEL;
use kube::runtime::watcher;

/// The watch of the Leases arbiter manages: each record's delivery is stamped (the start of
/// its age) and the memory of holders follows the renewals; the leases that need a reconcile
/// are enqueued.
pub(super) fn lease_events(
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
