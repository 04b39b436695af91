//! The watches of annotated Deployments and StatefulSets.

use futures::{StreamExt, TryStreamExt};
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};

use super::super::Caches;
use super::super::stores::Writer;
use super::touched;
use crate::queue::Enqueue;
use crate::workloads::{Workload, WorkloadError};

/// A workload kind's watch, filling its cache. The lease an annotated workload governs, and the
/// one it governed before if its annotation was removed or its lease name changed, need
/// reconciling; its pods need listing once, and again if its selector was dropped meanwhile.
pub(super) fn workload_events<K>(
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
