//! Single-active workloads: a Deployment or StatefulSet annotated
//! `arbiter.dev/single-active: "true"` gets exactly one pod labelled `arbiter.dev/role=active`
//! (the others `standby`), elected like any candidate, with no code change in the app.
//!
//! The operator makes each pod a candidate itself (a LeaseCandidate owned by the pod, named after
//! it, version from the pod's `app.kubernetes.io/version` label or its first container's image
//! tag) and holds the lease on the active pod's behalf while that pod is Running and Ready. A pod
//! that runs `arbiter run` itself registers its own candidate, which takes precedence.
//!
//! Changing the active pod always goes: demote the old pod (label `standby`), force it out per
//! `arbiter.dev/on-depose` when it is still running, then assign the Lease and label the new pod
//! `active`; so no two pods ever carry `active` at once.

pub mod inject;
pub mod sync;
pub mod unwrapped;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kube::core::{Selector, SelectorExt};
use kube::{Resource, ResourceExt};

use arbiter_api::OnDepose;
use arbiter_election::Version;

pub const SINGLE_ACTIVE_ANNOTATION: &str = "arbiter.dev/single-active";
pub const LEASE_NAME_ANNOTATION: &str = "arbiter.dev/lease-name";
pub const ON_DEPOSE_ANNOTATION: &str = "arbiter.dev/on-depose";
pub const MAX_SKEW_ANNOTATION: &str = "arbiter.dev/max-skew";
/// The pod label a Service selects the active pod with.
pub const ROLE_LABEL: &str = "arbiter.dev/role";
pub const ACTIVE: &str = "active";
pub const STANDBY: &str = "standby";
/// On candidates the operator created for a workload's pods: the workload's name.
pub const WORKLOAD_LABEL: &str = "arbiter.dev/single-active-workload";
const VERSION_LABEL: &str = "app.kubernetes.io/version";

/// An annotated Deployment or StatefulSet, as the operator needs it.
#[derive(Clone, Debug)]
pub struct Workload {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub lease: String,
    pub selector: Selector,
    pub on_depose: OnDepose,
    pub max_skew: Option<u64>,
    pub owner: OwnerReference,
    pub replicas: i32,
}

/// Why an annotated workload cannot be handled.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum WorkloadError {
    #[error("annotation {ON_DEPOSE_ANNOTATION}={0:?} is not one of evict, delete, none")]
    OnDepose(String),
    #[error("annotation {MAX_SKEW_ANNOTATION}={0:?} is not a number of minor versions")]
    MaxSkew(String),
    #[error("the workload's selector cannot be used: {0}")]
    Selector(String),
}

fn annotated<K: Resource>(obj: &K) -> bool {
    obj.meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(SINGLE_ACTIVE_ANNOTATION))
        .is_some_and(|v| v == "true")
}

/// The lease an annotated workload governs: its `arbiter.dev/lease-name`, else its own name.
pub fn lease_name<K: Resource>(obj: &K) -> String {
    obj.meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(LEASE_NAME_ANNOTATION))
        .cloned()
        .unwrap_or_else(|| obj.name_any())
}

fn parse<K: Resource<DynamicType = ()>>(
    obj: &K,
    kind: &'static str,
    selector: &LabelSelector,
    replicas: Option<i32>,
) -> Option<Result<Workload, WorkloadError>> {
    if !annotated(obj) || obj.meta().deletion_timestamp.is_some() {
        return None;
    }
    let annotations = obj.meta().annotations.clone().unwrap_or_default();
    let on_depose = match annotations.get(ON_DEPOSE_ANNOTATION).map(String::as_str) {
        None | Some("evict") => OnDepose::Evict,
        Some("delete") => OnDepose::Delete,
        Some("none") => OnDepose::None,
        Some(other) => return Some(Err(WorkloadError::OnDepose(other.into()))),
    };
    let max_skew = match annotations.get(MAX_SKEW_ANNOTATION) {
        None => None,
        Some(v) => match v.parse() {
            Ok(n) => Some(n),
            Err(_) => return Some(Err(WorkloadError::MaxSkew(v.clone()))),
        },
    };
    let selector = match Selector::try_from(selector.clone()) {
        Ok(s) if !s.selects_all() => s,
        Ok(_) => return Some(Err(WorkloadError::Selector("it selects every pod".into()))),
        Err(e) => return Some(Err(WorkloadError::Selector(e.to_string()))),
    };
    let name = obj.meta().name.clone().unwrap_or_default();
    Some(Ok(Workload {
        kind,
        namespace: obj.meta().namespace.clone().unwrap_or_default(),
        lease: lease_name(obj),
        name,
        selector,
        on_depose,
        max_skew,
        owner: obj
            .controller_owner_ref(&())
            .expect("a named object has an owner reference"),
        replicas: replicas.unwrap_or(1),
    }))
}

impl Workload {
    /// The workload if `d` is annotated (and not being deleted).
    pub fn from_deployment(d: &Deployment) -> Option<Result<Workload, WorkloadError>> {
        let spec = d.spec.as_ref()?;
        parse(d, "Deployment", &spec.selector, spec.replicas)
    }

    pub fn from_stateful_set(s: &StatefulSet) -> Option<Result<Workload, WorkloadError>> {
        let spec = s.spec.as_ref()?;
        parse(s, "StatefulSet", &spec.selector, spec.replicas)
    }

    /// Whether `pod` is one of this workload's pods.
    pub fn selects(&self, pod: &Pod) -> bool {
        pod.namespace().as_deref() == Some(self.namespace.as_str())
            && self.selector.matches(pod.labels())
    }
}

/// The version a pod runs: its `app.kubernetes.io/version` label, else its first container's
/// image tag (a leading `v` tolerated; digests ignored). Normalised to strict semver.
pub fn pod_version(pod: &Pod) -> Result<String, String> {
    let first = pod.spec.as_ref().and_then(|s| s.containers.first());
    container_version(pod, first)
}

/// The version `container` of `pod` runs: the pod's `app.kubernetes.io/version` label, else
/// the container's image tag.
pub fn container_version(
    pod: &Pod,
    container: Option<&k8s_openapi::api::core::v1::Container>,
) -> Result<String, String> {
    if let Some(v) = pod.labels().get(VERSION_LABEL) {
        return Version::parse(v).map(|v| v.to_string()).map_err(|e| {
            format!(
                "label {VERSION_LABEL}={v:?} is not a semantic version ({})",
                e.reason
            )
        });
    }
    let image = container.and_then(|c| c.image.clone()).unwrap_or_default();
    template_version(&image)
}

/// The version in an image reference's tag, e.g. `example.com/app:v1.31.0` → `1.31.0`.
pub fn template_version(image: &str) -> Result<String, String> {
    let without_digest = image.split('@').next().unwrap_or_default();
    let last = without_digest.rsplit('/').next().unwrap_or_default();
    let Some((_, tag)) = last.split_once(':') else {
        return Err(format!(
            "image {image:?} has no tag and the pod has no {VERSION_LABEL} label"
        ));
    };
    Version::parse(tag)
        .map(|v| v.to_string())
        .map_err(|_| format!("image tag {tag:?} of {image:?} is not a semantic version and the pod has no {VERSION_LABEL} label"))
}

/// Whether a pod can be active: Running, Ready, not being deleted.
pub fn pod_ready(pod: &Pod) -> bool {
    let Some(status) = &pod.status else {
        return false;
    };
    pod.metadata.deletion_timestamp.is_none()
        && status.phase.as_deref() == Some("Running")
        && status
            .conditions
            .as_deref()
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};
    use std::collections::BTreeMap;

    fn pod(labels: &[(&str, &str)], image: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        );
        p.spec = Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                image: Some(image.into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        });
        p
    }

    #[test]
    fn version_from_label_then_image_tag() {
        assert_eq!(
            pod_version(&pod(&[("app.kubernetes.io/version", "1.30.0")], "x:2.0.0")),
            Ok("1.30.0".into())
        );
        assert_eq!(
            pod_version(&pod(&[("app.kubernetes.io/version", "v1.30.0")], "x:2.0.0")),
            Ok("1.30.0".into())
        );
        assert_eq!(
            pod_version(&pod(&[], "example.com:5000/team/app:v1.31.2")),
            Ok("1.31.2".into())
        );
        assert_eq!(
            pod_version(&pod(&[], "app:1.32.0-rc.1@sha256:abc")),
            Ok("1.32.0-rc.1".into())
        );
    }

    #[test]
    fn unreadable_versions_say_why() {
        let e = pod_version(&pod(&[], "example.com:5000/app")).unwrap_err();
        assert!(e.contains("has no tag"), "{e}");
        let e = pod_version(&pod(&[], "app:latest")).unwrap_err();
        assert!(
            e.contains("\"latest\" of \"app:latest\" is not a semantic version"),
            "{e}"
        );
        let e =
            pod_version(&pod(&[("app.kubernetes.io/version", "1.2")], "app:1.2.0")).unwrap_err();
        assert!(e.contains("label app.kubernetes.io/version=\"1.2\""), "{e}");
    }
}
