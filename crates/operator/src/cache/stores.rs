//! One cache of a kind, made of one store per watched namespace (or one for all): each
//! namespace's watch relists on its own, and a store holds what one watch lists, so
//! `--watch-namespaces a,b` needs rights in those namespaces only, never cluster-wide.
//!
//! A store finds an object by the namespace and name it carries: kube-runtime's store keys
//! each object by a copy of its name, namespace, uid and resourceVersion (about 250 bytes an
//! object, 10 MB at 10,000 leases of three candidates), which this one does without. Hand
//! written for that reason; it applies a watch's events as kube-runtime's does (a relist is
//! built apart and replaces the store at its end).

use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, RwLock};

use hashbrown::HashTable;
use kube::Resource;
use kube::runtime::watcher;
use tokio::sync::watch;

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
                let (store, writer) = store();
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

    /// The cached object named `name` in `namespace`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        self.stores
            .iter()
            .find(|(scope, _)| scope.as_deref().is_none_or(|s| s == namespace))?
            .1
            .get(Some(namespace), name)
    }

    /// Every cached object.
    pub fn state(&self) -> Vec<Arc<K>> {
        self.stores.iter().flat_map(|(_, s)| s.state()).collect()
    }

    /// Resolves once every store was listed.
    pub async fn wait_until_ready(&self) {
        futures::future::join_all(self.stores.iter().map(|(_, s)| s.wait_until_ready())).await;
    }
}

/// An empty store, and the writer that fills it from a watch.
pub fn store<K: Resource>() -> (Store<K>, Writer<K>) {
    let shared = Arc::new(Shared {
        objects: RwLock::new(Objects {
            listed: HashTable::new(),
            relisting: None,
        }),
        hasher: RandomState::new(),
        ready: watch::channel(false).0,
    });
    (
        Store {
            shared: shared.clone(),
        },
        Writer { shared },
    )
}

/// What one watch listed, read by many.
pub struct Store<K> {
    shared: Arc<Shared<K>>,
}

impl<K> Clone for Store<K> {
    fn clone(&self) -> Self {
        Store {
            shared: self.shared.clone(),
        }
    }
}

/// Fills its [`Store`] from one watch's events.
pub struct Writer<K> {
    shared: Arc<Shared<K>>,
}

struct Shared<K> {
    objects: RwLock<Objects<K>>,
    hasher: RandomState,
    /// Whether the first list has ended (a watch channel wakes every waiter).
    ready: watch::Sender<bool>,
}

struct Objects<K> {
    listed: HashTable<Arc<K>>,
    /// A relist under way: what it delivered so far.
    relisting: Option<HashTable<Arc<K>>>,
}

fn name_of<K: Resource>(k: &K) -> (Option<&str>, &str) {
    let meta = k.meta();
    (
        meta.namespace.as_deref(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

impl<K: Resource> Shared<K> {
    fn hash(&self, key: (Option<&str>, &str)) -> u64 {
        self.hasher.hash_one(key)
    }
}

/// Puts `obj` in `table`, in place of the one of its name.
fn put<K: Resource>(shared: &Shared<K>, table: &mut HashTable<Arc<K>>, obj: Arc<K>) {
    let key = name_of(obj.as_ref());
    let hash = shared.hash(key);
    match table.find_mut(hash, |o| name_of(o.as_ref()) == key) {
        Some(slot) => *slot = obj,
        None => {
            table.insert_unique(hash, obj, |o| shared.hash(name_of(o.as_ref())));
        }
    }
}

impl<K: Resource + Clone> Writer<K> {
    /// Applies one watch event: a relist is built apart and replaces what was listed at its
    /// end (objects it no longer lists are gone); a change or deletion applies at once.
    pub fn apply_watcher_event(&mut self, ev: &watcher::Event<K>) {
        let shared = &*self.shared;
        let mut objects = shared.objects.write().unwrap();
        match ev {
            watcher::Event::Init => objects.relisting = Some(HashTable::new()),
            watcher::Event::InitApply(o) => {
                let mut relisting = objects.relisting.take().unwrap_or_default();
                put(shared, &mut relisting, Arc::new(o.clone()));
                objects.relisting = Some(relisting);
            }
            watcher::Event::InitDone => {
                let mut relisted = objects.relisting.take().unwrap_or_default();
                relisted.shrink_to_fit(|o| shared.hash(name_of(o.as_ref())));
                objects.listed = relisted;
                drop(objects);
                shared.ready.send_replace(true);
            }
            watcher::Event::Apply(o) => put(shared, &mut objects.listed, Arc::new(o.clone())),
            watcher::Event::Delete(o) => {
                let key = name_of(o);
                if let Ok(entry) = objects
                    .listed
                    .find_entry(shared.hash(key), |k| name_of(k.as_ref()) == key)
                {
                    entry.remove();
                }
            }
        }
    }
}

impl<K: Resource> Store<K> {
    /// The object named `name` in `namespace` (`None`: a cluster-scoped one).
    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<K>> {
        let key = (namespace, name);
        let objects = self.shared.objects.read().unwrap();
        objects
            .listed
            .find(self.shared.hash(key), |o| name_of(o.as_ref()) == key)
            .cloned()
    }

    /// Every object listed.
    pub fn state(&self) -> Vec<Arc<K>> {
        self.shared
            .objects
            .read()
            .unwrap()
            .listed
            .iter()
            .cloned()
            .collect()
    }

    /// Resolves once the first list has ended.
    pub async fn wait_until_ready(&self) {
        let mut ready = self.shared.ready.subscribe();
        // The sender lives as long as this store: the wait ends only once listed.
        let _ = ready.wait_for(|listed| *listed).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn cm(ns: &str, name: &str, data: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.namespace = Some(ns.into());
        c.metadata.name = Some(name.into());
        c.data = Some([("v".to_string(), data.to_string())].into());
        c
    }

    fn value(c: &ConfigMap) -> &str {
        &c.data.as_ref().unwrap()["v"]
    }

    #[tokio::test]
    async fn each_namespace_has_its_store_and_lookups_find_theirs() {
        let (cached, mut writers) = Cached::<ConfigMap>::new(&[Some("a".into()), Some("b".into())]);
        for (w, ns) in writers.iter_mut().zip(["a", "b"]) {
            w.apply_watcher_event(&watcher::Event::Init);
            w.apply_watcher_event(&watcher::Event::InitApply(cm(ns, "x", ns)));
            w.apply_watcher_event(&watcher::Event::InitDone);
        }
        cached.wait_until_ready().await;
        assert_eq!(cached.state().len(), 2);
        let got = cached.get("b", "x").unwrap();
        assert_eq!(got.metadata.namespace.as_deref(), Some("b"));
        assert!(cached.get("c", "x").is_none());
        // b relists without x: a keeps its own.
        writers[1].apply_watcher_event(&watcher::Event::Init);
        writers[1].apply_watcher_event(&watcher::Event::InitDone);
        assert!(cached.get("a", "x").is_some());
        assert!(cached.get("b", "x").is_none());
    }

    #[tokio::test]
    async fn a_store_follows_changes_deletions_and_relists() {
        let (store, mut w) = store::<ConfigMap>();
        let waiting = tokio::spawn({
            let store = store.clone();
            async move { store.wait_until_ready().await }
        });
        // Two waiters: both wake (not only the last).
        let also = tokio::spawn({
            let store = store.clone();
            async move { store.wait_until_ready().await }
        });
        w.apply_watcher_event(&watcher::Event::Init);
        w.apply_watcher_event(&watcher::Event::InitApply(cm("n", "x", "1")));
        // A relist under way is not seen until it ends.
        assert!(store.get(Some("n"), "x").is_none());
        assert!(!waiting.is_finished());
        w.apply_watcher_event(&watcher::Event::InitDone);
        waiting.await.unwrap();
        also.await.unwrap();
        assert_eq!(value(&store.get(Some("n"), "x").unwrap()), "1");
        // The same name in another namespace is another object.
        w.apply_watcher_event(&watcher::Event::Apply(cm("m", "x", "m")));
        w.apply_watcher_event(&watcher::Event::Apply(cm("n", "x", "2")));
        assert_eq!(value(&store.get(Some("n"), "x").unwrap()), "2");
        assert_eq!(value(&store.get(Some("m"), "x").unwrap()), "m");
        assert_eq!(store.state().len(), 2);
        w.apply_watcher_event(&watcher::Event::Delete(cm("m", "x", "")));
        assert!(store.get(Some("m"), "x").is_none());
        // Deleting what is not there changes nothing.
        w.apply_watcher_event(&watcher::Event::Delete(cm("m", "y", "")));
        assert_eq!(store.state().len(), 1);
        // A relist replaces everything: what it does not list is gone, the rest is as listed.
        w.apply_watcher_event(&watcher::Event::Init);
        for i in 0..100 {
            w.apply_watcher_event(&watcher::Event::InitApply(cm("n", &format!("o{i}"), "r")));
        }
        assert_eq!(value(&store.get(Some("n"), "x").unwrap()), "2");
        w.apply_watcher_event(&watcher::Event::InitDone);
        assert!(store.get(Some("n"), "x").is_none());
        assert_eq!(store.state().len(), 100);
        assert_eq!(value(&store.get(Some("n"), "o42").unwrap()), "r");
    }
}
