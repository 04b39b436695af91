//! What the operator decides about: one lease, named by namespace and name.

use std::collections::HashSet;
use std::sync::{Arc, LazyLock, Mutex};

/// A lease: `(namespace, name)`. Every decision is made per key.
///
/// The operator keeps a lease's key in several maps (the queue, the timers, the holders it
/// saw, the Lease records, the candidates' index, the written Leases): shared strings make
/// each copy two pointers, not two allocations.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseKey {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

impl LeaseKey {
    /// The key of lease `name` in `namespace`, sharing its strings with every other key of it
    /// in use.
    pub fn new(namespace: &str, name: &str) -> LeaseKey {
        LeaseKey {
            namespace: intern(namespace),
            name: intern(name),
        }
    }
}

/// The namespaces and lease names of the keys in use, one copy of each.
static NAMES: LazyLock<Mutex<Interned>> = LazyLock::new(Mutex::default);

#[derive(Default)]
struct Interned {
    names: HashSet<Arc<str>>,
    /// How many names there may be before those no key uses any more are dropped.
    sweep_at: usize,
}

/// The one copy of `s` (hand-written: a few lines, where an interning crate would bring its
/// own pointer-compared type into every map). Names no key uses any more are dropped once the
/// set has doubled since it was last swept, so the set stays within twice those in use.
fn intern(s: &str) -> Arc<str> {
    let mut interned = NAMES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(name) = interned.names.get(s) {
        return name.clone();
    }
    if interned.names.len() >= interned.sweep_at {
        interned.names.retain(|n| Arc::strong_count(n) > 1);
        interned.sweep_at = (interned.names.len() * 2).max(1024);
    }
    let name: Arc<str> = s.into();
    interned.names.insert(name.clone());
    name
}

impl std::fmt::Display for LeaseKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_one_lease_share_their_strings_and_unused_names_are_dropped() {
        let a = LeaseKey::new("ns-interned", "lease-interned");
        let b = LeaseKey::new("ns-interned", "lease-interned");
        assert_eq!(a, b);
        assert!(Arc::ptr_eq(&a.namespace, &b.namespace) && Arc::ptr_eq(&a.name, &b.name));
        assert_eq!(a.to_string(), "ns-interned/lease-interned");
        // Names no key holds any more go at a sweep; those in use stay shared.
        drop(b);
        for i in 0..3000 {
            LeaseKey::new("ns-interned", &format!("passing-{i}"));
        }
        let names = NAMES.lock().unwrap().names.len();
        assert!(names < 2100, "{names} names kept");
        let c = LeaseKey::new("ns-interned", "lease-interned");
        assert!(Arc::ptr_eq(&a.name, &c.name));
    }
}
