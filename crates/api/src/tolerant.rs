//! Watches that one object cannot stop.
//!
//! A watch decodes every object of its kind it delivers. An object that fails to decode fails
//! the watch at that event, and since a watch resumes from the last version it decoded, the
//! same event fails again on every retry (a deletion carries the same object, so it fails too):
//! the cache stays stale for every namespace until the API server's history has moved on. The
//! API server accepts timestamps that this program's time type cannot hold (the last hours of
//! year 9999, past `jiff::Timestamp::MAX`), so one `kubectl apply` of a candidate, or of a Lease
//! labelled `arbiter.dev/managed`, with such a `renewTime` did that to the operator.
//!
//! [`Tolerant`] decodes as `K` does; if that fails, it reads such timestamps as the latest one
//! it can hold and tries again. ([`watch`] is kube-runtime's watcher on it, unwrapped.) The
//! answers of writes and reads of such objects are decoded the same way (a ping whose answer
//! cannot be decoded would otherwise fail, and be sent again, at every reconcile).

use std::fmt::Debug;

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::api::Api;
use kube::runtime::watcher;
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer};

/// `K`, decoded with timestamps beyond the time type's range clamped to its end.
#[derive(Clone, Debug)]
pub struct Tolerant<K>(pub K);

impl<'de, K: DeserializeOwned> Deserialize<'de> for Tolerant<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut value = serde_json::Value::deserialize(d)?;
        match K::deserialize(&value) {
            Ok(k) => Ok(Tolerant(k)),
            Err(first) => {
                // Not in the metadata: its times are the API server's own, and its labels and
                // annotations are anyone's strings.
                let mut clamped = false;
                if let serde_json::Value::Object(fields) = &mut value {
                    for (name, field) in fields.iter_mut() {
                        if name != "metadata" {
                            clamped |= clamp_times(field);
                        }
                    }
                }
                if clamped && let Ok(k) = K::deserialize(&value) {
                    return Ok(Tolerant(k));
                }
                Err(D::Error::custom(first))
            }
        }
    }
}

/// Replaces every string in `value` that is an RFC 3339 timestamp past `jiff::Timestamp::MAX` (the API
/// server takes years up to 9999) with that maximum, to the microsecond. Whether it changed
/// anything.
fn clamp_times(value: &mut serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::String(s) if beyond_range(s) => {
            let max = jiff::Timestamp::from_microsecond(jiff::Timestamp::MAX.as_microsecond())
                .unwrap_or(jiff::Timestamp::MAX);
            *s = max.to_string();
            true
        }
        Value::Array(items) => items.iter_mut().fold(false, |c, v| clamp_times(v) | c),
        Value::Object(fields) => fields.values_mut().fold(false, |c, v| clamp_times(v) | c),
        _ => false,
    }
}

fn beyond_range(s: &str) -> bool {
    s.len() >= 20
        && s.starts_with("9999-12-3")
        && s.as_bytes()[10] == b'T'
        && s.parse::<jiff::Timestamp>().is_err()
}

impl<K: serde::Serialize> serde::Serialize for Tolerant<K> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<K: Resource<DynamicType = ()>> Resource for Tolerant<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> std::borrow::Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> std::borrow::Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> std::borrow::Cow<'_, str> {
        K::version(dt)
    }
    fn api_version(dt: &()) -> std::borrow::Cow<'_, str> {
        K::api_version(dt)
    }
    fn plural(dt: &()) -> std::borrow::Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        self.0.meta()
    }
    fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        self.0.meta_mut()
    }
}

/// kube-runtime's watcher of the objects of kind `K` in `namespace` (all namespaces: `None`),
/// each decoded as [`Tolerant`].
pub fn watch<K>(
    client: kube::Client,
    namespace: Option<&str>,
    config: watcher::Config,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
{
    let tolerant: Api<Tolerant<K>> = match namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    watcher(tolerant, config).map(|ev| {
        ev.map(|ev| match ev {
            watcher::Event::Apply(o) => watcher::Event::Apply(o.0),
            watcher::Event::Delete(o) => watcher::Event::Delete(o.0),
            watcher::Event::InitApply(o) => watcher::Event::InitApply(o.0),
            watcher::Event::Init => watcher::Event::Init,
            watcher::Event::InitDone => watcher::Event::InitDone,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LeaseCandidate;
    use k8s_openapi::api::coordination::v1::Lease;

    fn candidate(renew: &str) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "arbiter.dev/v1alpha1",
            "kind": "LeaseCandidate",
            "metadata": {"name": "c", "namespace": "ns",
                "annotations": {"note": "9999-12-31T23:59:59Z"}},
            "spec": {"leaseName": "l", "binaryVersion": "1.0.0", "strategy": "OldestEmulationVersion",
                "renewTime": renew},
        })
    }

    #[test]
    fn a_timestamp_past_the_time_types_range_is_read_as_its_end() {
        let far = candidate("9999-12-31T23:59:59.000000Z");
        assert!(
            serde_json::from_value::<LeaseCandidate>(far.clone()).is_err(),
            "what broke the watch"
        );
        let c: Tolerant<LeaseCandidate> = serde_json::from_value(far).unwrap();
        let renew = c.0.spec.renew_time.unwrap().0;
        assert!(renew > "9999-12-30T00:00:00Z".parse().unwrap());
        assert_eq!(
            c.0.metadata.annotations.unwrap()["note"],
            "9999-12-31T23:59:59Z",
            "a string that did not fail to decode is left alone"
        );
        let lease = serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "l"},
            "spec": {"holderIdentity": "x", "renewTime": "9999-12-31T23:59:59.000000Z"},
        });
        let l: Tolerant<Lease> = serde_json::from_value(lease).unwrap();
        assert_eq!(crate::lease::holder(&l.0), Some("x"));
    }

    #[test]
    fn an_ordinary_object_decodes_as_it_is() {
        let c: Tolerant<LeaseCandidate> =
            serde_json::from_value(candidate("2026-06-01T00:00:00Z")).unwrap();
        assert_eq!(
            c.0.spec.renew_time.unwrap().0,
            "2026-06-01T00:00:00Z".parse::<jiff::Timestamp>().unwrap()
        );
        // Anything else that does not decode still fails (the watch reports it).
        let mut bad = candidate("2026-06-01T00:00:00Z");
        bad["spec"]["binaryVersion"] = serde_json::json!(7);
        assert!(serde_json::from_value::<Tolerant<LeaseCandidate>>(bad).is_err());
    }
}
