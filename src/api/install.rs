//! Installing arbiter's CRDs into a cluster (used by the operator at start-up and by tests).

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, CustomResourceExt, ResourceExt};
use serde_json::{Value, json};

use super::LeaseCandidate;

/// The field manager arbiter applies its CRDs with.
pub const FIELD_MANAGER: &str = "arbiter";

/// Applies the CRDs with server-side apply and waits until the API server serves them.
pub async fn apply_crds(client: Client, timeout: Duration) -> anyhow::Result<()> {
    apply_crd(client, LeaseCandidate::crd(), timeout).await
}

/// Applies `crd` with server-side apply, after dropping the list-map keys an older version of
/// it left on `status.conditions` (see [`drop_list_map_keys`]), and waits until the API server
/// serves it.
pub async fn apply_crd(
    client: Client,
    crd: CustomResourceDefinition,
    timeout: Duration,
) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let name = crd.name_any();
    drop_list_map_keys(&api, &name).await?;
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&crd),
    )
    .await
    .map_err(|e| anyhow::anyhow!("applying CRD {name}: {e}"))?;
    tokio::time::timeout(
        timeout,
        await_condition(api, &name, conditions::is_crd_established()),
    )
    .await
    .map_err(|_| anyhow::anyhow!("CRD {name} not Established after {timeout:?}"))??;
    Ok(())
}

/// A CRD from before the conditions became an atomic list keeps its list-map keys through
/// server-side apply when another field manager owns them (kubectl, helm), and the API server
/// then refuses an atomic list with keys: this drops them, with the list type, first. Another
/// replica doing the same at once makes the patch fail (a path gone): the CRD is read again.
async fn drop_list_map_keys(api: &Api<CustomResourceDefinition>, name: &str) -> anyhow::Result<()> {
    const ATTEMPTS: usize = 3;
    for attempt in 1..=ATTEMPTS {
        let Some(existing) = api
            .get_opt(name)
            .await
            .map_err(|e| anyhow::anyhow!("reading CRD {name}: {e}"))?
        else {
            return Ok(());
        };
        let stale = list_map_keys(&serde_json::to_value(&existing)?);
        if stale.is_empty() {
            return Ok(());
        }
        let ops: Vec<_> = stale
            .iter()
            .flat_map(|list| {
                [
                    json!({"op": "remove", "path": format!("{list}/x-kubernetes-list-map-keys")}),
                    json!({"op": "replace", "path": format!("{list}/x-kubernetes-list-type"), "value": "atomic"}),
                ]
            })
            .collect();
        let patch = Patch::Json::<()>(serde_json::from_value(json!(ops))?);
        match api.patch(name, &PatchParams::default(), &patch).await {
            Ok(_) => {
                tracing::info!(crd = %name, "status.conditions is now an atomic list");
                return Ok(());
            }
            Err(e) if attempt < ATTEMPTS => {
                tracing::debug!(crd = %name, error = %e, "dropping the list-map keys failed; reading the CRD again")
            }
            Err(e) => anyhow::bail!("dropping the list-map keys of CRD {name}: {e}"),
        }
    }
    unreachable!("the last attempt returns")
}

/// The JSON pointers, in a CRD, of each version's `status.conditions` that is still declared a
/// list-map (arbiter declared it one up to 1ee1c65; it is an atomic list since).
fn list_map_keys(crd: &Value) -> Vec<String> {
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    (0..versions)
        .map(|i| {
            format!(
                "/spec/versions/{i}/schema/openAPIV3Schema/properties/status/properties/conditions"
            )
        })
        .filter(|list| {
            crd.pointer(&format!("{list}/x-kubernetes-list-map-keys"))
                .is_some()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONDITIONS: &str =
        "/spec/versions/0/schema/openAPIV3Schema/properties/status/properties/conditions";

    #[test]
    fn the_conditions_are_an_atomic_list_without_keys() {
        let crd = serde_json::to_value(LeaseCandidate::crd()).unwrap();
        let list = crd.pointer(CONDITIONS).unwrap();
        assert_eq!(list["x-kubernetes-list-type"], "atomic");
        assert!(list.get("x-kubernetes-list-map-keys").is_none());
        assert!(list_map_keys(&crd).is_empty());
    }

    #[test]
    fn a_crd_from_before_has_its_list_map_keys_found() {
        let mut crd = serde_json::to_value(LeaseCandidate::crd()).unwrap();
        let list = crd.pointer_mut(CONDITIONS).unwrap();
        list["x-kubernetes-list-type"] = json!("map");
        list["x-kubernetes-list-map-keys"] = json!(["type"]);
        assert_eq!(list_map_keys(&crd), vec![CONDITIONS.to_string()]);
    }
}
