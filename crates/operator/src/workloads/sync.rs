//! The writes single-active workloads need: candidates for pods, role labels, clean-up.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::{ROLE_LABEL, WORKLOAD_LABEL, Workload, pod_version};
use arbiter_api::{LeaseCandidate, LeaseCandidateSpec, OLDEST_EMULATION_VERSION};

/// Whether the operator created this candidate for a single-active workload's pod.
pub fn managed(c: &LeaseCandidate) -> bool {
    c.labels().contains_key(WORKLOAD_LABEL)
}

/// Creates a candidate for each of the workload's pods that has none (a pod running its own
/// agent has one already, which takes precedence). Returns, per pod whose version cannot be
/// read, why.
pub async fn ensure_candidates(
    client: &Client,
    instance: Option<&str>,
    workload: &Workload,
    pods: &[Arc<Pod>],
    candidates: &[Arc<LeaseCandidate>],
) -> anyhow::Result<Vec<(String, String)>> {
    let api: Api<LeaseCandidate> = Api::namespaced(client.clone(), &workload.namespace);
    let mut unreadable = Vec::new();
    for pod in pods {
        let name = pod.name_any();
        if pod.metadata.deletion_timestamp.is_some()
            || candidates.iter().any(|c| c.name_any() == name)
        {
            continue;
        }
        let version = match pod_version(pod) {
            Ok(v) => v,
            Err(why) => {
                unreadable.push((name, why));
                continue;
            }
        };
        let mut c = LeaseCandidate::new(
            &name,
            LeaseCandidateSpec {
                lease_name: workload.lease.clone(),
                binary_version: version.clone(),
                emulation_version: Some(version),
                strategy: OLDEST_EMULATION_VERSION.into(),
                ping_time: None,
                renew_time: Some(MicroTime(jiff::Timestamp::now())),
            },
        );
        let mut labels = BTreeMap::from([(WORKLOAD_LABEL.to_string(), workload.name.clone())]);
        if let Some(i) = instance {
            labels.insert(arbiter_api::INSTANCE_LABEL.to_string(), i.to_string());
        }
        c.metadata.labels = Some(labels);
        c.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: name.clone(),
            uid: pod.uid().unwrap_or_default(),
            ..OwnerReference::default()
        }]);
        match api.create(&PostParams::default(), &c).await {
            Ok(_) => {
                tracing::info!(workload = %workload.name, pod = %name, "made the pod a candidate")
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {} // created meanwhile (by its own agent)
            Err(e) => return Err(anyhow::anyhow!("creating a candidate for pod {name}: {e}")),
        }
    }
    Ok(unreadable)
}

/// Sets (or with `None` removes) a pod's role label, on that pod only (its uid is a
/// precondition: a new pod with the same name is not written over). With `exact`, also only if
/// the pod is unchanged since it was read (its resourceVersion): for a demotion judged from a
/// fresh read of the API server.
pub async fn set_role(
    client: &Client,
    pod: &Pod,
    role: Option<&str>,
    exact: bool,
) -> anyhow::Result<()> {
    if pod.labels().get(ROLE_LABEL).map(String::as_str) == role {
        return Ok(());
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let mut patch = json!({ "metadata": {
        "labels": { ROLE_LABEL: role },
        "uid": pod.uid(),
    } });
    if exact {
        patch["metadata"]["resourceVersion"] = json!(pod.resource_version());
    }
    match api
        .patch(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(anyhow::anyhow!(
            "labelling pod {} {ROLE_LABEL}={role:?}: {e}",
            pod.name_any()
        )),
    }
}

/// After the annotation was removed: deletes the candidates the operator created and the role
/// labels it set.
pub async fn clean_up(
    client: &Client,
    namespace: &str,
    candidates: &[Arc<LeaseCandidate>],
    pods: &[Arc<Pod>],
) -> anyhow::Result<()> {
    let api: Api<LeaseCandidate> = Api::namespaced(client.clone(), namespace);
    for c in candidates.iter().filter(|c| managed(c)) {
        if let Some(pod) = pods.iter().find(|p| p.name_any() == c.name_any()) {
            set_role(client, pod, None, false).await?;
        }
        match api.delete(&c.name_any(), &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(anyhow::anyhow!("deleting candidate {}: {e}", c.name_any())),
        }
        tracing::info!(candidate = %c.name_any(), "removed a single-active candidate (annotation removed)");
    }
    Ok(())
}
