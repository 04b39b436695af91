//! The agent's rights for injected pods (`--inject-agent-rbac`): for each ServiceAccount that
//! injected pods run as, a Role and a RoleBinding `arbiter-agent-SA` in its namespace, granting
//! what an agent needs and no more: its candidates, reading Leases, and updating only the
//! Leases its pods run for (`resourceNames`), so that a pod's creator cannot use injection to
//! take over any other Lease of the namespace.
//!
//! The acting replica makes them from the pods it sees through the API, never from an admission
//! review: anyone who can reach the webhook's port can post a review naming any namespace and
//! ServiceAccount, but only pods that exist, carry `arbiter.dev/inject` and were injected (their
//! wrapped container runs the agent) get rights, for the lease their agent runs for. A labelled
//! pod that was not injected (created while no webhook was installed) is logged as running
//! unwrapped (the reconcile evicts it: [`crate::reconcile`]'s unwrapped phase). The agent retries a registration refused for want of rights for a while
//! ([`arbiter_candidate::registration`]), so rights made a moment after the pod are in time.
//!
//! With `--instance`, each install keeps the rights of its own instance's pods only: its Roles
//! and RoleBindings are named `arbiter-agent:INSTANCE:SA` and labelled with the instance, so
//! that two installs never count each other's rights unused.
//!
//! With `--namespace-selector`, rights are made only in namespaces that match (at once when one
//! comes to match), and removed only there (another install may keep the others').
//!
//! Rights are removed once no injected pod uses the ServiceAccount: only after the replica saw
//! no such pod at two looks [`SWEEP_EVERY`] apart with the binding unchanged between them, only
//! once the pods were listed in full, and with that resourceVersion as the delete's
//! precondition. The pods and the looks are in one task, so a pod that appears after a removal
//! gets its rights back; rights deleted by hand are made again at the next look.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::{Client, ResourceExt};

use crate::workloads::inject::{INIT_CONTAINER, INJECT_LABEL, wrapped_agent};

mod keeper;
mod look;

pub(crate) use keeper::keep;

/// The label on every Role and RoleBinding arbiter makes for injected pods.
pub(crate) const BINDING_LABEL: &str = "arbiter.dev/agent-binding";
/// How far apart the two looks before a removal are.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(300);
const FIELD_MANAGER: &str = "arbiter";

/// (namespace, ServiceAccount).
type Account = (String, String);

/// The name of install `instance`'s Role and RoleBinding for ServiceAccount `sa`:
/// `arbiter-agent-SA`, or `arbiter-agent:INSTANCE:SA` (RBAC names may hold `:`, instances and
/// ServiceAccount names may not, so no two pairs share a name), shortened with a hash of the whole name when that is longer than
/// a name may be.
pub(crate) fn name(instance: Option<&str>, sa: &str) -> String {
    let full = match instance {
        Some(i) => format!("arbiter-agent:{i}:{sa}"),
        None => format!("arbiter-agent-{sa}"),
    };
    if full.len() <= 253 {
        return full;
    }
    use std::hash::Hasher;
    let mut h = fnv::FnvHasher::default();
    // Of the ServiceAccount alone without an instance: the names earlier releases made.
    h.write(instance.map_or(sa, |_| full.as_str()).as_bytes());
    format!("{}-{:016x}", &full[..236], h.finish())
}

fn labels(instance: Option<&str>) -> serde_json::Value {
    let mut labels =
        serde_json::json!({BINDING_LABEL: "true", "app.kubernetes.io/managed-by": "arbiter"});
    if let Some(i) = instance {
        labels[arbiter_api::INSTANCE_LABEL] = i.into();
    }
    labels
}

/// Whether install `instance` made the Role or RoleBinding labelled `labels`.
fn made_by(instance: Option<&str>, labels: &BTreeMap<String, String>) -> bool {
    labels.get(BINDING_LABEL).map(String::as_str) == Some("true")
        && labels.get(arbiter_api::INSTANCE_LABEL).map(String::as_str) == instance
}

/// The Role of ServiceAccount `sa` of `namespace` whose pods run for `leases`: what
/// `arbiter run` needs (the chart's candidate ClusterRole), with Lease updates limited to those.
pub(crate) fn desired_role(
    instance: Option<&str>,
    namespace: &str,
    sa: &str,
    leases: &BTreeSet<String>,
) -> Role {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name(instance, sa), "namespace": namespace, "labels": labels(instance)},
        "rules": [
            {"apiGroups": ["arbiter.dev"], "resources": ["leasecandidates"],
             "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "resourceNames": leases, "verbs": ["update"]},
        ],
    }))
    .expect("a Role")
}

/// The binding of that Role to the ServiceAccount.
pub(crate) fn desired_binding(instance: Option<&str>, namespace: &str, sa: &str) -> RoleBinding {
    let name = name(instance, sa);
    serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(instance)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}],
    }))
    .expect("a RoleBinding")
}

/// The Leases a Role arbiter made lets its subjects update.
pub fn granted(role: &Role) -> BTreeSet<String> {
    role.rules
        .iter()
        .flatten()
        .filter(|r| r.verbs.iter().any(|v| v == "update"))
        .flat_map(|r| r.resource_names.iter().flatten().cloned())
        .collect()
}

/// The ServiceAccount whose rights injected pod `pod` needs from install `instance`, and the
/// lease its agent runs for, if it is one: labelled, injected with an agent told that instance
/// (its args, not its labels, which may change), not being deleted.
pub(crate) fn needs(instance: Option<&str>, pod: &Pod) -> Option<(Account, String)> {
    let spec = pod.spec.as_ref()?;
    let labelled = pod.labels().get(INJECT_LABEL).map(String::as_str) == Some("true");
    if !labelled || pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let (lease, told) = wrapped_agent(pod)?;
    if told.as_deref() != instance {
        return None;
    }
    let sa = spec
        .service_account_name
        .clone()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".into());
    Some(((pod.namespace().unwrap_or_default(), sa), lease))
}

/// A pod labelled for injection that was not injected (it runs its command unwrapped), of any
/// instance: one labelled for an instance no install serves is wrapped by none.
fn unwrapped(pod: &Pod) -> bool {
    pod.labels().get(INJECT_LABEL).map(String::as_str) == Some("true")
        && pod.metadata.deletion_timestamp.is_none()
        && !pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten())
            .any(|c| c.name == INIT_CONTAINER)
}

/// A binding as one look saw it: where, whose, at which resourceVersion.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Seen {
    pub namespace: String,
    pub name: String,
    pub service_account: String,
    pub version: String,
}

/// Which bindings to delete now, given this look's bindings, the ServiceAccounts injected pods
/// use, and the unused bindings the previous look saw. Returns those to delete (at this look's
/// resourceVersion) and the unused ones to remember for the next look.
pub(crate) fn sweep(
    bindings: &[Seen],
    used: &BTreeSet<Account>,
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

/// The leases each ServiceAccount's injected pods run for.
fn wanted(
    injected: &BTreeMap<(String, String), (Account, String)>,
) -> BTreeMap<Account, BTreeSet<String>> {
    let mut m: BTreeMap<Account, BTreeSet<String>> = BTreeMap::new();
    for (account, lease) in injected.values() {
        m.entry(account.clone()).or_default().insert(lease.clone());
    }
    m
}

/// Makes the rights `want` says each account needs, in the namespaces `covered` accepts, where
/// `granted` (what exists) falls short.
async fn grant(
    client: &Client,
    instance: Option<&str>,
    want: BTreeMap<Account, BTreeSet<String>>,
    covered: &impl Fn(&str) -> bool,
    granted: &mut BTreeMap<Account, BTreeSet<String>>,
) {
    for (account, leases) in want {
        let has = granted.get(&account).cloned().unwrap_or_default();
        if leases.is_subset(&has) || !covered(&account.0) {
            continue;
        }
        let all: BTreeSet<String> = has.union(&leases).cloned().collect();
        match apply(client, instance, &account, &all).await {
            Ok(()) => {
                granted.insert(account, all);
            }
            Err(e) => {
                tracing::warn!(namespace = %account.0, service_account = %account.1, error = %e, "making the injected agent's rights failed (retrying at the next look)")
            }
        }
    }
}

/// Makes the Role and RoleBinding of `account` grant `leases`, unless one of that name exists
/// that arbiter did not make (it is left alone, and said so). Every write is conditional on
/// what was read.
async fn apply(
    client: &Client,
    instance: Option<&str>,
    account: &Account,
    leases: &BTreeSet<String>,
) -> anyhow::Result<()> {
    let (namespace, sa) = account;
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    let name = name(instance, sa);
    let not_ours = |kind: &str| {
        anyhow::anyhow!(
            "{kind} {namespace}/{name} exists and was not made by this arbiter install: it is left as it is (injected pods of ServiceAccount {sa} need an agent's rights)",
        )
    };
    let ours = |labels: &BTreeMap<String, String>| made_by(instance, labels);

    let roles: Api<Role> = Api::namespaced(client.clone(), namespace);
    match roles.get_opt(&name).await? {
        None => {
            roles
                .create(&pp, &desired_role(instance, namespace, sa, leases))
                .await?;
        }
        Some(existing) if !ours(existing.labels()) => return Err(not_ours("Role")),
        Some(existing) => {
            // Never fewer leases than the Role grants already: this replica's memory may lag
            // (it just started acting), and a running holder must keep its renewals.
            let all: BTreeSet<String> = granted(&existing).union(leases).cloned().collect();
            let mut role = desired_role(instance, namespace, sa, &all);
            if existing.rules != role.rules {
                role.metadata.resource_version = existing.resource_version();
                roles.replace(&name, &pp, &role).await?;
            }
        }
    }

    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), namespace);
    let mut binding = desired_binding(instance, namespace, sa);
    match bindings.get_opt(&name).await? {
        None => {
            bindings.create(&pp, &binding).await?;
        }
        Some(existing) if !ours(existing.labels()) => return Err(not_ours("RoleBinding")),
        Some(existing)
            if existing.role_ref == binding.role_ref && existing.subjects == binding.subjects => {}
        Some(existing) if existing.role_ref == binding.role_ref => {
            binding.metadata.resource_version = existing.resource_version();
            bindings.replace(&name, &pp, &binding).await?;
        }
        Some(existing) => {
            // roleRef cannot change: delete exactly what was read, and make it again.
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: existing.resource_version(),
                    uid: existing.uid(),
                }),
                ..DeleteParams::default()
            };
            bindings.delete(&name, &dp).await?;
            bindings.create(&pp, &binding).await?;
        }
    }
    tracing::info!(%namespace, service_account = %sa, ?leases, "made the injected agent's rights");
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::workloads::inject::inject;

    fn seen(ns: &str, sa: &str, version: &str) -> Seen {
        Seen {
            namespace: ns.into(),
            name: name(None, sa),
            service_account: sa.into(),
            version: version.into(),
        }
    }

    fn account(ns: &str, sa: &str) -> Account {
        (ns.into(), sa.into())
    }

    #[test]
    fn rights_go_only_when_unused_and_unchanged_at_two_looks() {
        let used = BTreeSet::from([account("a", "worker")]);
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

        let back = BTreeSet::from([account("b", "worker")]);
        let (delete, unused) = sweep(&changed, &back, &unused);
        assert!(delete.is_empty() && unused.is_empty(), "used again");
    }

    /// A pod of Deployment `work` as the webhook admits it, or as created without it.
    fn pod(sa: Option<&str>, injected: bool) -> Pod {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "work-5d9f-x", "namespace": "ns",
                "labels": {INJECT_LABEL: "true", "pod-template-hash": "5d9f",
                           "app.kubernetes.io/version": "1.0.0"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "work-5d9f", "uid": "u", "controller": true}]},
            "spec": {"serviceAccountName": sa, "containers": [{"name": "c", "image": "x", "command": ["/x"]}]},
        }))
        .unwrap();
        if injected {
            inject(&p, "arbiter:1").unwrap().unwrap()
        } else {
            p
        }
    }

    #[test]
    fn only_injected_pods_that_exist_need_rights_for_their_own_lease() {
        assert_eq!(
            needs(None, &pod(Some("worker"), true)),
            Some((account("ns", "worker"), "work".into()))
        );
        assert_eq!(
            needs(None, &pod(None, true)),
            Some((account("ns", "default"), "work".into()))
        );
        let plain = pod(Some("worker"), false);
        assert_eq!(needs(None, &plain), None, "labelled but not injected");
        assert!(unwrapped(&plain));
        let mut unlabelled = pod(Some("worker"), true);
        unlabelled.labels_mut().remove(INJECT_LABEL);
        assert_eq!(needs(None, &unlabelled), None);
        let mut going = pod(Some("worker"), true);
        going.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
        );
        assert_eq!(needs(None, &going), None);
        // Another install's pod needs nothing from this one, and this one's nothing from it.
        let mut labelled_blue = pod(Some("worker"), false);
        labelled_blue
            .labels_mut()
            .insert(arbiter_api::INSTANCE_LABEL.into(), "blue".into());
        let mut blue = inject(&labelled_blue, "arbiter:1").unwrap().unwrap();
        assert_eq!(needs(None, &blue), None);
        assert_eq!(
            needs(Some("blue"), &blue),
            Some((account("ns", "worker"), "work".into()))
        );
        assert_eq!(needs(Some("blue"), &pod(Some("worker"), true)), None);
        // Relabelled after it was wrapped: still the install its agent was told.
        blue.labels_mut()
            .insert(arbiter_api::INSTANCE_LABEL.into(), "green".into());
        assert_eq!(
            needs(Some("blue"), &blue),
            Some((account("ns", "worker"), "work".into()))
        );
        assert_eq!(needs(Some("green"), &blue), None);
    }

    #[test]
    fn the_role_updates_only_the_leases_its_pods_run_for() {
        let leases = BTreeSet::from(["work".to_string(), "other".to_string()]);
        let role = desired_role(None, "ns", "worker", &leases);
        assert_eq!(granted(&role), leases);
        let rules = role.rules.clone().unwrap();
        for r in &rules {
            if r.verbs.iter().any(|v| v == "update") {
                assert_eq!(r.resource_names.as_ref().unwrap().len(), 2);
            }
        }
        assert!(
            rules.iter().all(|r| !r.verbs.iter().any(|v| v == "create")
                || r.resources.as_deref() == Some(&["leasecandidates".to_string()][..])),
            "no Lease is created by an agent"
        );
        let binding = desired_binding(None, "ns", "worker");
        assert_eq!(binding.role_ref.kind, "Role");
        assert_eq!(binding.role_ref.name, "arbiter-agent-worker");
        assert_eq!(
            binding.subjects.unwrap()[0].namespace.as_deref(),
            Some("ns")
        );
        let mut w = BTreeMap::new();
        w.insert(
            ("ns".to_string(), "a".to_string()),
            (account("ns", "worker"), "work".to_string()),
        );
        w.insert(
            ("ns".to_string(), "b".to_string()),
            (account("ns", "worker"), "other".to_string()),
        );
        assert_eq!(wanted(&w)[&account("ns", "worker")], leases);
    }

    #[test]
    fn names_fit_the_limit_and_stay_distinct() {
        assert_eq!(name(None, "worker"), "arbiter-agent-worker");
        assert_eq!(name(Some("blue"), "worker"), "arbiter-agent:blue:worker");
        let long = |c: char| std::iter::repeat_n(c, 253).collect::<String>();
        let (a, b) = (
            name(None, &long('a')),
            name(None, &format!("{}b", &long('a')[1..])),
        );
        assert!(a.len() <= 253 && b.len() <= 253);
        assert_ne!(a, b);
        let (c, d) = (name(Some("x"), &long('a')), name(Some("y"), &long('a')));
        assert!(c.len() <= 253 && d.len() <= 253);
        assert_ne!(c, d, "two installs' names for one long ServiceAccount");
    }

    /// Two installs never take each other's rights for their own.
    #[test]
    fn each_install_owns_only_its_instances_rights() {
        let blue = desired_role(Some("blue"), "ns", "worker", &BTreeSet::new());
        assert!(made_by(Some("blue"), blue.labels()));
        assert!(!made_by(None, blue.labels()));
        let plain = desired_binding(None, "ns", "worker");
        assert!(made_by(None, plain.labels()));
        assert!(!made_by(Some("blue"), plain.labels()));
        assert_ne!(blue.name_any(), plain.name_any());
    }
}
