//! One cache of a kind, made of one kube-runtime store per watched namespace (or one for all):
//! each namespace's watch relists on its own, and a store holds what one watch lists, so
//! `--watch-namespaces a,b` needs rights in those namespaces only, never cluster-wide.

use std::sync::Arc;

use kube::Resource;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};

/// The stores of one kind, by the namespace each watches (`None`: all).
pub struct Cached<K: Resource<DynamicType = ()> + 'static> {
    stores: Arc<Vec<(Option<String>, Store<K>)>>,
}

impl<K: Resource<DynamicType = ()> + 'static> Clone for Cached<K> {
    fn clone(&self) -> Self {
        Cached {
            stores: self.stores.clone(),
        }
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Cached<K> {
    /// One store per scope (a namespace, or `None`: all), and the writers to fill them, in the
    /// same order.
    pub fn new(scopes: &[Option<String>]) -> (Cached<K>, Vec<Writer<K>>) {
        let (stores, writers) = scopes
            .iter()
            .map(|scope| {
                let (store, writer) = reflector::store();
                ((scope.clone(), store), writer)
            })
            .unzip();
        (
            Cached {
                stores: Arc::new(stores),
            },
            writers,
        )
    }

    /// A cache of one store for every namespace.
    pub fn single(store: Store<K>) -> Cached<K> {
        Cached {
            stores: Arc::new(vec![(None, store)]),
        }
    }

    /// The cached object `r` names.
    pub fn get(&self, r: &ObjectRef<K>) -> Option<Arc<K>> {
        let ns = r.namespace.as_deref();
        self.stores
            .iter()
            .find(|(scope, _)| scope.is_none() || scope.as_deref() == ns)?
            .1
            .get(r)
    }

    /// Every cached object.
    pub fn state(&self) -> Vec<Arc<K>> {
        self.stores.iter().flat_map(|(_, s)| s.state()).collect()
    }

    /// Resolves once every store was listed. (A kube-runtime store wakes only its last waiter:
    /// wait on each cache in one place.)
    pub async fn wait_until_ready(&self) {
        futures::future::join_all(self.stores.iter().map(|(_, s)| s.wait_until_ready())).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::watcher;

    fn cm(ns: &str, name: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.namespace = Some(ns.into());
        c.metadata.name = Some(name.into());
        c
    }

    #[tokio::test]
    async fn each_namespace_has_its_store_and_lookups_find_theirs() {
        let (cached, mut writers) = Cached::<ConfigMap>::new(&[Some("a".into()), Some("b".into())]);
        for (w, ns) in writers.iter_mut().zip(["a", "b"]) {
            w.apply_watcher_event(&watcher::Event::Init);
            w.apply_watcher_event(&watcher::Event::InitApply(cm(ns, "x")));
            w.apply_watcher_event(&watcher::Event::InitDone);
        }
        cached.wait_until_ready().await;
        assert_eq!(cached.state().len(), 2);
        let got = cached.get(&ObjectRef::new("x").within("b")).unwrap();
        assert_eq!(got.metadata.namespace.as_deref(), Some("b"));
        assert!(cached.get(&ObjectRef::new("x").within("c")).is_none());
        // b relists without x: a keeps its own.
        writers[1].apply_watcher_event(&watcher::Event::Init);
        writers[1].apply_watcher_event(&watcher::Event::InitDone);
        assert!(cached.get(&ObjectRef::new("x").within("a")).is_some());
        assert!(cached.get(&ObjectRef::new("x").within("b")).is_none());
    }
}
