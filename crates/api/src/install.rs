//! Installing arbiter's CRDs into a cluster (used by the operator at start-up and by tests).

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, CustomResourceExt, ResourceExt};

use super::{FIELD_MANAGER, LeaseCandidate};

/// Applies the CRDs with server-side apply and waits until the API server serves them.
pub async fn apply_crds(client: Client, timeout: Duration) -> anyhow::Result<()> {
    apply_crd(client, LeaseCandidate::crd(), timeout).await
}

/// Applies `crd` with server-side apply and waits until the API server serves it. The apply
/// takes `spec.versions` whole (an atomic list to field management), so what an older version
/// declared there, such as the conditions' list-map keys up to 1ee1c65, does not survive it,
/// whoever installed that version.
pub async fn apply_crd(
    client: Client,
    crd: CustomResourceDefinition,
    timeout: Duration,
) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let name = crd.name_any();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_conditions_are_an_atomic_list_without_keys() {
        let crd = serde_json::to_value(LeaseCandidate::crd()).unwrap();
        let list = crd
            .pointer(
                "/spec/versions/0/schema/openAPIV3Schema/properties/status/properties/conditions",
            )
            .unwrap();
        assert_eq!(list["x-kubernetes-list-type"], "atomic");
        assert!(list.get("x-kubernetes-list-map-keys").is_none());
    }
}
