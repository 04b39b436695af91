//! The agent's rights for injected pods: a RoleBinding of the candidate ClusterRole
//! (`--inject-cluster-role`) to the pod's ServiceAccount in its namespace.
//!
//! The webhook applies it before it admits the pod (an admission that is not a dry run), so the
//! agent never starts without its rights; if it cannot, the pod is refused with the reason.
//! Each admission writes its request's uid on the binding, so the binding's resourceVersion
//! moves with every pod admitted for it.
//!
//! The acting replica removes a binding once no injected pod uses its ServiceAccount: only
//! after it saw no such pod at two looks [`SWEEP_EVERY`] apart with the binding unchanged
//! between them, and with the resourceVersion of the second look as a precondition. A pod
//! admitted meanwhile changed the binding, so its delete fails; no clock but the replica's own
//! timer is involved.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::{Client, ResourceExt};

use crate::workloads::inject::INJECT_LABEL;

/// The label on every binding arbiter makes for injected pods.
pub(crate) const BINDING_LABEL: &str = "arbiter.dev/agent-binding";
/// The uid of the last admission that applied a binding.
const ADMISSION_ANNOTATION: &str = "arbiter.dev/last-admission";
/// How far apart the two looks before a removal are.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(300);
const FIELD_MANAGER: &str = "arbiter-webhook";

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

/// The binding of `cluster_role` to ServiceAccount `sa` of `namespace`, stamped with
/// `admission`.
pub(crate) fn desired(
    namespace: &str,
    sa: &str,
    cluster_role: &str,
    admission: &str,
) -> RoleBinding {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {
            "name": name(sa),
            "namespace": namespace,
            "labels": {BINDING_LABEL: "true", "app.kubernetes.io/managed-by": "arbiter"},
            "annotations": {ADMISSION_ANNOTATION: admission},
        },
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}],
    }))
    .expect("a RoleBinding")
}

/// Applies the binding for an injected pod being admitted.
pub(crate) async fn apply(
    client: &Client,
    namespace: &str,
    sa: &str,
    cluster_role: &str,
    admission: &str,
) -> Result<(), kube::Error> {
    let api: Api<RoleBinding> = Api::namespaced(client.clone(), namespace);
    let binding = desired(namespace, sa, cluster_role, admission);
    api.patch(
        &name(sa),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&binding),
    )
    .await?;
    Ok(())
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

/// Removes bindings no injected pod uses, while the replica acts: never returns.
pub(crate) async fn sweep_forever(client: Client, namespace: Option<String>) {
    let mut unused = BTreeSet::new();
    loop {
        match look(&client, namespace.as_deref(), &unused).await {
            Ok(next) => unused = next,
            Err(e) => {
                tracing::warn!(error = %e, "removing unused agent RoleBindings failed (retrying)")
            }
        }
        tokio::time::sleep(SWEEP_EVERY).await;
    }
}

async fn look(
    client: &Client,
    namespace: Option<&str>,
    unused_before: &BTreeSet<Seen>,
) -> anyhow::Result<BTreeSet<Seen>> {
    let (bindings, pods): (Api<RoleBinding>, Api<Pod>) = match namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    // The bindings first: a pod admitted after this list changed its binding since.
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
    let used: BTreeSet<(String, String)> = pods
        .list(&ListParams::default().labels(&format!("{INJECT_LABEL}=true")))
        .await?
        .items
        .iter()
        .filter_map(|p| {
            let sa = p.spec.as_ref()?.service_account_name.clone();
            Some((p.namespace()?, sa.unwrap_or_else(|| "default".into())))
        })
        .collect();
    let (delete, unused) = sweep(&seen, &used, unused_before);
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
                tracing::info!(namespace = %b.namespace, binding = %b.name, "removed an agent RoleBinding no injected pod uses")
            }
            // Changed (a pod was admitted) or gone meanwhile: it stays, or is gone already.
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(unused)
}

#[cfg(test)]
mod tests {
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

        let admitted = [seen("b", "worker", "6")];
        let (delete, unused) = sweep(&admitted, &BTreeSet::new(), &unused);
        assert!(delete.is_empty(), "a pod was admitted between the looks");
        let (delete, _) = sweep(&admitted, &BTreeSet::new(), &unused);
        assert_eq!(delete, admitted);

        let back = BTreeSet::from([("b".to_string(), "worker".to_string())]);
        let (delete, unused) = sweep(&admitted, &back, &unused);
        assert!(delete.is_empty() && unused.is_empty(), "used again");
    }

    #[test]
    fn names_fit_the_limit_and_stay_distinct() {
        assert_eq!(name("worker"), "arbiter-agent-worker");
        let long = |c: char| std::iter::repeat_n(c, 253).collect::<String>();
        let (a, b) = (name(&long('a')), name(&format!("{}b", &long('a')[1..])));
        assert!(a.len() <= 253 && b.len() <= 253);
        assert_ne!(a, b);
        let rb = desired("ns", "worker", "arbiter-candidate", "uid-1");
        assert_eq!(rb.role_ref.name, "arbiter-candidate");
        assert_eq!(rb.subjects.unwrap()[0].namespace.as_deref(), Some("ns"));
    }
}
