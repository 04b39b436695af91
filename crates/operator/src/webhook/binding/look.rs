//! One look at the agents' rights: this install's RoleBindings and Roles listed, and those
//! unused at this look and the one before, unchanged, removed exactly as read.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use kube::{Client, ResourceExt};

use super::{Account, BINDING_LABEL, Seen, granted, made_by, sweep};
use crate::cache::namespaces::Arbitrated;

/// Whose rights a look removes: install `instance`'s, in `namespace` (or all) where it
/// arbitrates.
#[derive(Clone, Copy)]
pub(super) struct Scope<'a> {
    pub(super) instance: Option<&'a str>,
    pub(super) namespace: Option<&'a str>,
    pub(super) arbitrated: &'a Arbitrated,
}

/// One look: deletes the rights unused now and at the previous look, unchanged. Returns the
/// unused bindings to remember, and the leases granted to each account whose rights are there.
pub(super) async fn look(
    client: &Client,
    scope: &Scope<'_>,
    used: &BTreeSet<Account>,
    unused_before: &BTreeSet<Seen>,
) -> anyhow::Result<(BTreeSet<Seen>, BTreeMap<Account, BTreeSet<String>>)> {
    let (seen, role_leases) = list_ours(client, scope).await?;
    // Only where this install arbitrates: elsewhere another install may keep its own.
    let sweepable: Vec<Seen> = (seen.iter())
        .filter(|b| scope.arbitrated.covers(&b.namespace) == Some(true))
        .cloned()
        .collect();
    let (delete, unused) = sweep(&sweepable, used, unused_before);
    let mut present: BTreeMap<Account, BTreeSet<String>> = seen
        .iter()
        .filter_map(|b| {
            let leases = role_leases.get(&(b.namespace.clone(), b.name.clone()))?;
            Some((
                (b.namespace.clone(), b.service_account.clone()),
                leases.clone(),
            ))
        })
        .collect();
    for b in delete {
        if remove(client, scope.instance, &b).await? {
            present.remove(&(b.namespace.clone(), b.service_account.clone()));
        }
    }
    Ok((unused, present))
}

/// This install's bindings (`--instance`: another's are used by pods this one does not
/// count), and the leases each of its Roles grants, by (namespace, name).
async fn list_ours(
    client: &Client,
    scope: &Scope<'_>,
) -> anyhow::Result<(Vec<Seen>, BTreeMap<(String, String), BTreeSet<String>>)> {
    let (bindings, roles): (Api<RoleBinding>, Api<Role>) = match scope.namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let ours = ListParams::default().labels(&format!(
        "{BINDING_LABEL}=true,{}",
        arbiter_api::instance_selector(scope.instance)
    ));
    let seen: Vec<Seen> = bindings
        .list(&ours)
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
    let role_leases = roles
        .list(&ours)
        .await?
        .items
        .iter()
        .map(|r| {
            (
                (r.namespace().unwrap_or_default(), r.name_any()),
                granted(r),
            )
        })
        .collect();
    Ok((seen, role_leases))
}

/// Deletes binding `b` exactly as read, then the Role of its name if arbiter made it. False
/// when the binding changed meanwhile (it stays).
async fn remove(client: &Client, instance: Option<&str>, b: &Seen) -> anyhow::Result<bool> {
    let api: Api<RoleBinding> = Api::namespaced(client.clone(), &b.namespace);
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: Some(b.version.clone()),
            uid: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&b.name, &dp).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => return Ok(false),
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    // The Role of that name, only if arbiter made it, exactly as read.
    let roles: Api<Role> = Api::namespaced(client.clone(), &b.namespace);
    let role = roles.get_opt(&b.name).await;
    if let Ok(Some(role)) = &role
        && made_by(instance, role.labels())
    {
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: role.resource_version(),
                uid: role.uid(),
            }),
            ..DeleteParams::default()
        };
        if let Err(e) = roles.delete(&b.name, &dp).await {
            tracing::warn!(namespace = %b.namespace, role = %b.name, error = %e, "removing an unused agent Role failed (it grants nothing while unbound)");
        }
    }
    tracing::info!(namespace = %b.namespace, name = %b.name, "removed an agent's rights no injected pod uses");
    Ok(true)
}
