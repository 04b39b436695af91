//! The agent's rights for injected pods: a RoleBinding of the candidate ClusterRole
//! (`--inject-cluster-role`) to each injected pod's ServiceAccount in its namespace.
//!
//! The acting replica makes them from the pods it sees through the API, never from an admission
//! review: anyone who can reach the webhook's port can post a review naming any namespace and
//! ServiceAccount, but only pods that exist, carry `arbiter.dev/inject` and were injected (they
//! have the init container) get a binding. A labelled pod that was not injected (created while
//! no webhook was installed) is logged as running unwrapped. The agent retries a refused registration for a while
//! ([`crate::candidate::registration`]), so a binding made a moment after the pod is in time.
//!
//! A binding is removed once no injected pod uses its ServiceAccount: only after the replica saw
//! no such pod at two looks [`SWEEP_EVERY`] apart with the binding unchanged between them, and
//! with that resourceVersion as the delete's precondition. The pods and the looks are in one
//! task, so a pod that appears after a removal gets its binding back.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use crate::workloads::inject::{INIT_CONTAINER, INJECT_LABEL};

/// The label on every binding arbiter makes for injected pods.
pub(crate) const BINDING_LABEL: &str = "arbiter.dev/agent-binding";
/// How far apart the two looks before a removal are.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(300);
const FIELD_MANAGER: &str = "arbiter";

/// A binding's name for ServiceAccount `sa`: `arbiter-agent-SA`, shortened with a hash of the
/// whole name when that is longer than a name may be.
pub(crate) fn name(sa: &str) -> String {
    let full = format!("arbiter-agent-{sa}");
    if full.len() <= 253 {
        return full;
    }
    use std::hash::Hasher;
    let mut h = fnv::FnvHasher::default();
    h.write(sa.as_bytes());
    format!("{}-{:016x}", &full[..236], h.finish())
}

/// The binding of `cluster_role` to ServiceAccount `sa` of `namespace`.
pub(crate) fn desired(namespace: &str, sa: &str, cluster_role: &str) -> RoleBinding {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {
            "name": name(sa),
            "namespace": namespace,
            "labels": {BINDING_LABEL: "true", "app.kubernetes.io/managed-by": "arbiter"},
        },
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}],
    }))
    .expect("a RoleBinding")
}

/// The (namespace, ServiceAccount) whose rights injected pod `pod` needs, if it is one: labelled,
/// injected, not being deleted.
pub(crate) fn needs(pod: &Pod) -> Option<(String, String)> {
    let spec = pod.spec.as_ref()?;
    let injected = pod.labels().get(INJECT_LABEL).map(String::as_str) == Some("true")
        && spec
            .init_containers
            .iter()
            .flatten()
            .any(|c| c.name == INIT_CONTAINER);
    (injected && pod.metadata.deletion_timestamp.is_none()).then(|| {
        let sa = spec
            .service_account_name
            .clone()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".into());
        (pod.namespace().unwrap_or_default(), sa)
    })
}

/// A binding as one look saw it: where, whose, at which resourceVersion.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Seen {
    pub namespace: String,
    pub name: String,
    pub service_account: String,
    pub version: String,
}

/// Which bindings to delete now, given this look's bindings, the (namespace, ServiceAccount)
/// pairs injected pods use, and the unused bindings the previous look saw. Returns those to
/// delete (at this look's resourceVersion) and the unused ones to remember for the next look.
pub(crate) fn sweep(
    bindings: &[Seen],
    used: &BTreeSet<(String, String)>,
    unused_before: &BTreeSet<Seen>,
) -> (Vec<Seen>, BTreeSet<Seen>) {
    let unused: BTreeSet<Seen> = bindings
        .iter()
        .filter(|b| !used.contains(&(b.namespace.clone(), b.service_account.clone())))
        .cloned()
        .collect();
    let delete = unused.intersection(unused_before).cloned().collect();
    (delete, unused)
}

/// Keeps the bindings while the replica acts: never returns. Failures are logged, and retried
/// at the pod's next event or the next look.
pub(crate) async fn keep(client: Client, namespace: Option<String>, cluster_role: String) {
    let pods: Api<Pod> = match &namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let config = watcher::Config::default().labels(&format!("{INJECT_LABEL}=true"));
    let mut events = watcher(pods, config).default_backoff().boxed();
    // The injected pods, by (namespace, name), and the pairs whose binding is in place.
    let mut injected: BTreeMap<(String, String), (String, String)> = BTreeMap::new();
    let mut listing: Option<BTreeMap<(String, String), (String, String)>> = None;
    let mut bound: BTreeSet<(String, String)> = BTreeSet::new();
    let mut unused = BTreeSet::new();
    // No look until the pods were listed once, nor while they are listed again: an empty or
    // partial list would count every binding unused.
    let mut listed = false;
    let mut unwrapped_seen: BTreeSet<(String, String)> = BTreeSet::new();
    let mut looks = tokio::time::interval(SWEEP_EVERY);
    looks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first look only after the pods are listed.
    looks.reset();
    loop {
        tokio::select! {
            event = events.next() => {
                let pod = match event {
                    Some(Ok(watcher::Event::Init)) => {
                        listing = Some(BTreeMap::new());
                        continue;
                    }
                    Some(Ok(watcher::Event::InitDone)) => {
                        injected = listing.take().unwrap_or_default();
                        listed = true;
                        continue;
                    }
                    Some(Ok(watcher::Event::InitApply(p))) => {
                        if let (Some(l), Some(need)) = (listing.as_mut(), needs(&p)) {
                            l.insert((p.namespace().unwrap_or_default(), p.name_any()), need);
                        }
                        p
                    }
                    Some(Ok(watcher::Event::Apply(p))) => {
                        let key = (p.namespace().unwrap_or_default(), p.name_any());
                        match needs(&p) {
                            Some(need) => injected.insert(key, need),
                            None => injected.remove(&key),
                        };
                        p
                    }
                    Some(Ok(watcher::Event::Delete(p))) => {
                        injected.remove(&(p.namespace().unwrap_or_default(), p.name_any()));
                        continue;
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "watching injected pods (retrying)");
                        continue;
                    }
                    None => return tracing::error!("the watch of injected pods ended"),
                };
                let Some(need) = needs(&pod) else {
                    let key = (pod.namespace().unwrap_or_default(), pod.name_any());
                    if unwrapped(&pod) && unwrapped_seen.insert(key.clone()) {
                        tracing::warn!(namespace = %key.0, pod = %key.1, "a pod labelled arbiter.dev/inject runs without the agent (created while the webhook was not installed, or outside its namespaces): replace it to have it wrapped");
                    }
                    continue;
                };
                if bound.contains(&need) {
                    continue;
                }
                match apply(&client, &need.0, &need.1, &cluster_role).await {
                    Ok(()) => {
                        bound.insert(need);
                    }
                    Err(e) => tracing::warn!(namespace = %need.0, service_account = %need.1, error = %e, "binding the agent's ClusterRole failed (retrying at the pod's next change)"),
                }
            }
            _ = looks.tick() => {
                if !listed || listing.is_some() {
                    continue;
                }
                let used: BTreeSet<_> = injected.values().cloned().collect();
                match look(&client, namespace.as_deref(), &used, &unused).await {
                    Ok((next, present)) => {
                        unused = next;
                        // What exists now: a binding deleted by hand, or with its namespace, is
                        // made again for the pods that still need it.
                        bound = present;
                        for need in used.difference(&bound.clone()) {
                            match apply(&client, &need.0, &need.1, &cluster_role).await {
                                Ok(()) => {
                                    bound.insert(need.clone());
                                }
                                Err(e) => tracing::warn!(namespace = %need.0, service_account = %need.1, error = %e, "binding the agent's ClusterRole failed (retrying at the next look)"),
                            }
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "removing unused agent RoleBindings failed (retrying)"),
                }
            }
        }
    }
}

/// Makes the binding for ServiceAccount `sa` of `namespace` what it must be, unless a
/// RoleBinding of that name exists that arbiter did not make (it is left alone, and said so).
/// Every write is conditional on what was read.
async fn apply(
    client: &Client,
    namespace: &str,
    sa: &str,
    cluster_role: &str,
) -> anyhow::Result<()> {
    let api: Api<RoleBinding> = Api::namespaced(client.clone(), namespace);
    let mut binding = desired(namespace, sa, cluster_role);
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    match api.get_opt(&name(sa)).await? {
        None => {
            api.create(&pp, &binding).await?;
        }
        Some(existing) => {
            if existing.labels().get(BINDING_LABEL).map(String::as_str) != Some("true") {
                anyhow::bail!(
                    "RoleBinding {namespace}/{} exists and was not made by arbiter: it is left as it is (the injected agent needs ClusterRole {cluster_role} bound to ServiceAccount {sa})",
                    name(sa)
                );
            }
            if existing.role_ref == binding.role_ref && existing.subjects == binding.subjects {
                return Ok(());
            }
            if existing.role_ref == binding.role_ref {
                binding.metadata.resource_version = existing.resource_version();
                api.replace(&name(sa), &pp, &binding).await?;
            } else {
                // roleRef cannot change: delete exactly what was read, and make it again.
                let dp = DeleteParams {
                    preconditions: Some(Preconditions {
                        resource_version: existing.resource_version(),
                        uid: existing.uid(),
                    }),
                    ..DeleteParams::default()
                };
                api.delete(&name(sa), &dp).await?;
                api.create(&pp, &binding).await?;
            }
        }
    }
    tracing::info!(%namespace, service_account = %sa, binding = %name(sa), "bound the agent's ClusterRole for injected pods");
    Ok(())
}

/// A pod labelled for injection that was not injected (it runs its command unwrapped).
fn unwrapped(pod: &Pod) -> bool {
    pod.labels().get(INJECT_LABEL).map(String::as_str) == Some("true")
        && pod.metadata.deletion_timestamp.is_none()
        && !pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten())
            .any(|c| c.name == INIT_CONTAINER)
}

/// One look: deletes the bindings unused now and at the previous look, unchanged. Returns the
/// unused ones to remember, and the (namespace, ServiceAccount) pairs whose binding is there.
async fn look(
    client: &Client,
    namespace: Option<&str>,
    used: &BTreeSet<(String, String)>,
    unused_before: &BTreeSet<Seen>,
) -> anyhow::Result<(BTreeSet<Seen>, BTreeSet<(String, String)>)> {
    let bindings: Api<RoleBinding> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let seen: Vec<Seen> = bindings
        .list(&ListParams::default().labels(&format!("{BINDING_LABEL}=true")))
        .await?
        .items
        .iter()
        .filter_map(|b| {
            Some(Seen {
                namespace: b.namespace()?,
                name: b.name_any(),
                service_account: b.subjects.as_ref()?.first()?.name.clone(),
                version: b.resource_version()?,
            })
        })
        .collect();
    let (delete, unused) = sweep(&seen, used, unused_before);
    let mut present: BTreeSet<(String, String)> = seen
        .iter()
        .map(|b| (b.namespace.clone(), b.service_account.clone()))
        .collect();
    for b in delete {
        let api: Api<RoleBinding> = Api::namespaced(client.clone(), &b.namespace);
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(b.version.clone()),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&b.name, &dp).await {
            Ok(_) => {
                tracing::info!(namespace = %b.namespace, binding = %b.name, "removed an agent RoleBinding no injected pod uses");
                present.remove(&(b.namespace, b.service_account));
            }
            // Changed meanwhile (it stays) or gone already.
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {
                present.remove(&(b.namespace, b.service_account));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok((unused, present))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn seen(ns: &str, sa: &str, version: &str) -> Seen {
        Seen {
            namespace: ns.into(),
            name: name(sa),
            service_account: sa.into(),
            version: version.into(),
        }
    }

    #[test]
    fn a_binding_goes_only_when_unused_and_unchanged_at_two_looks() {
        let used = BTreeSet::from([("a".to_string(), "worker".to_string())]);
        let looks = [seen("a", "worker", "1"), seen("b", "worker", "5")];
        let (delete, unused) = sweep(&looks, &used, &BTreeSet::new());
        assert!(delete.is_empty(), "first look: nothing goes");
        assert_eq!(
            unused,
            BTreeSet::from([seen("b", "worker", "5")]),
            "same name, other namespace"
        );

        let (delete, _) = sweep(&looks, &used, &unused);
        assert_eq!(delete, [seen("b", "worker", "5")]);

        let changed = [seen("b", "worker", "6")];
        let (delete, unused) = sweep(&changed, &BTreeSet::new(), &unused);
        assert!(delete.is_empty(), "changed between the looks");
        let (delete, _) = sweep(&changed, &BTreeSet::new(), &unused);
        assert_eq!(delete, changed);

        let back = BTreeSet::from([("b".to_string(), "worker".to_string())]);
        let (delete, unused) = sweep(&changed, &back, &unused);
        assert!(delete.is_empty() && unused.is_empty(), "used again");
    }

    #[test]
    fn only_injected_pods_that_exist_need_a_binding() {
        let pod = |labels: serde_json::Value, init: bool, sa: Option<&str>| -> Pod {
            let init = if init {
                json!([{"name": INIT_CONTAINER, "image": "arbiter"}])
            } else {
                json!([])
            };
            serde_json::from_value(json!({
                "metadata": {"name": "p", "namespace": "ns", "labels": labels},
                "spec": {"serviceAccountName": sa, "initContainers": init,
                         "containers": [{"name": "c", "image": "x"}]},
            }))
            .unwrap()
        };
        let label = json!({INJECT_LABEL: "true"});
        assert_eq!(
            needs(&pod(label.clone(), true, Some("worker"))),
            Some(("ns".into(), "worker".into()))
        );
        assert_eq!(
            needs(&pod(label.clone(), true, None)),
            Some(("ns".into(), "default".into()))
        );
        assert_eq!(
            needs(&pod(label.clone(), false, Some("worker"))),
            None,
            "labelled but not injected (created while injection was off, or the label added later)"
        );
        assert_eq!(needs(&pod(json!({}), true, Some("worker"))), None);
        let mut going = pod(label, true, Some("worker"));
        going.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
        );
        assert_eq!(needs(&going), None);
    }

    #[test]
    fn names_fit_the_limit_and_stay_distinct() {
        assert_eq!(name("worker"), "arbiter-agent-worker");
        let long = |c: char| std::iter::repeat_n(c, 253).collect::<String>();
        let (a, b) = (name(&long('a')), name(&format!("{}b", &long('a')[1..])));
        assert!(a.len() <= 253 && b.len() <= 253);
        assert_ne!(a, b);
        let rb = desired("ns", "worker", "arbiter-candidate");
        assert_eq!(rb.role_ref.name, "arbiter-candidate");
        assert_eq!(rb.subjects.unwrap()[0].namespace.as_deref(), Some("ns"));
    }
}
