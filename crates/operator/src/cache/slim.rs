//! What the operator keeps of each cached Pod: only the fields it reads. A pod's managed
//! fields, annotations, volumes, environment, probes and resource requests are most of its
//! size, and the operator caches every pod it watches; the rest is dropped as the watch
//! delivers it.
//!
//! Read elsewhere, and so kept: name, namespace, uid, labels, owner references, resource
//! version, deletion timestamp; each container's name and image (a pod's version), init
//! containers' names and restart policy; the phase, the conditions, and each container status's
//! state, last state, restart count, container id and readiness.

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, ObjectMeta};

/// Keeps of `meta`'s managed fields only what [`arbiter_api::written_by_arbiter`] reads: which
/// annotations arbiter owns, as one entry of arbiter's listing them (nothing when it owns none).
/// Every other owner, field, operation, time and API version is dropped: as the API server
/// returns them (nested JSON maps, one per manager) they were most of a cached LeaseCandidate's
/// or Lease's size. Every annotation arbiter owns is kept, not only those some rule asks about
/// today: a rule that asks about another one reads the truth, never a compaction that forgot it.
/// (Never sent back: [`arbiter_api::lease::LeaseStore::replace`] leaves managed fields out.)
pub fn keep_arbiter_owned(meta: &mut ObjectMeta) {
    let Some(entries) = meta.managed_fields.as_deref() else {
        return;
    };
    let mut keys: Vec<&str> = entries
        .iter()
        .filter(|e| e.manager.as_deref() == Some(arbiter_api::FIELD_MANAGER))
        .filter_map(|e| e.fields_v1.as_ref())
        .flat_map(|f| -> Vec<&str> {
            match &f.0 {
                serde_json::Value::Array(owned) => {
                    owned.iter().filter_map(|k| k.as_str()).collect()
                }
                v => (v.get("f:metadata"))
                    .and_then(|m| m.get("f:annotations")?.as_object())
                    .map(|a| a.keys().map(String::as_str).collect())
                    .unwrap_or_default(),
            }
        })
        .filter_map(|k| k.strip_prefix("f:"))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    let owned: Vec<serde_json::Value> = keys
        .into_iter()
        .filter(|key| arbiter_api::written_by_arbiter(meta, key))
        .map(|key| serde_json::Value::String(format!("f:{key}")))
        .collect();
    meta.managed_fields = (!owned.is_empty()).then(|| {
        vec![ManagedFieldsEntry {
            manager: Some(arbiter_api::FIELD_MANAGER.into()),
            fields_v1: Some(FieldsV1(serde_json::Value::Array(owned))),
            ..ManagedFieldsEntry::default()
        }]
    });
}

/// Drops from `pod` everything the operator does not read. What its containers' command
/// lines declare is noted first ([`crate::cache::declared::note`]: the only annotations kept, written
/// here and never taken from the pod).
pub fn keep_what_is_read(pod: &mut Pod) {
    crate::cache::declared::note(pod);
    let meta = &mut pod.metadata;
    meta.managed_fields = None;
    if let Some(spec) = pod.spec.take() {
        let container = |c: Container| Container {
            name: c.name,
            image: c.image,
            restart_policy: c.restart_policy,
            ..Container::default()
        };
        pod.spec = Some(PodSpec {
            containers: spec.containers.into_iter().map(container).collect(),
            init_containers: spec
                .init_containers
                .map(|v| v.into_iter().map(container).collect()),
            node_name: spec.node_name,
            ..PodSpec::default()
        });
    }
    if let Some(status) = pod.status.take() {
        let container = |c: ContainerStatus| ContainerStatus {
            name: c.name,
            state: c.state,
            last_state: c.last_state,
            restart_count: c.restart_count,
            container_id: c.container_id,
            ready: c.ready,
            started: c.started,
            ..ContainerStatus::default()
        };
        pod.status = Some(PodStatus {
            phase: status.phase,
            conditions: status.conditions,
            container_statuses: status
                .container_statuses
                .map(|v| v.into_iter().map(container).collect()),
            init_container_statuses: status
                .init_container_statuses
                .map(|v| v.into_iter().map(container).collect()),
            ..PodStatus::default()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod as the API server returns it, with the bulk a real one carries.
    fn full_pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "web-1", "namespace": "ns", "uid": "u1", "resourceVersion": "42",
                "labels": {"app": "web", "app.kubernetes.io/version": "1.2.3", "arbiter.dev/role": "active"},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "x".repeat(4000)},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d", "uid": "rs"}],
                "managedFields": [{"manager": "kubelet", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}],
            },
            "spec": {
                "nodeName": "node-1",
                "containers": [{
                    "name": "web", "image": "example.com/web:1.2.3",
                    "env": [{"name": "A", "value": "x".repeat(2000)}],
                    "readinessProbe": {"httpGet": {"path": "/", "port": 8080}},
                    "resources": {"requests": {"cpu": "100m"}},
                }],
                "initContainers": [{"name": "sidecar", "image": "example.com/s:1", "restartPolicy": "Always"}],
                "volumes": [{"name": "v", "emptyDir": {}}],
                "tolerations": [{"key": "k", "operator": "Exists"}],
            },
            "status": {
                "phase": "Running", "podIP": "10.0.0.1", "qosClass": "Burstable",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{
                    "name": "web", "image": "example.com/web:1.2.3", "imageID": "sha256:abc",
                    "ready": true, "restartCount": 1, "containerID": "containerd://c2",
                    "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                    "lastState": {"terminated": {"exitCode": 137, "message": "arbiter incarnation a1"}},
                }],
            },
        }))
        .unwrap()
    }

    #[test]
    fn every_answer_the_operator_reads_survives() {
        let full = full_pod();
        let mut slim = full.clone();
        keep_what_is_read(&mut slim);
        assert_eq!(
            crate::cache::pod_facts::terminal(&slim),
            crate::cache::pod_facts::terminal(&full)
        );
        assert!(crate::cache::pod_facts::incarnation_ended(&slim, "a1"));
        assert_eq!(crate::cache::pod_facts::restarts(&slim), 1);
        assert!(crate::workloads::pod_ready(&slim));
        assert_eq!(
            crate::workloads::pod_version(&slim),
            crate::workloads::pod_version(&full)
        );
        assert_eq!(slim.metadata.labels, full.metadata.labels);
        assert_eq!(
            slim.metadata.owner_references,
            full.metadata.owner_references
        );
        assert_eq!(slim.metadata.uid, full.metadata.uid);
        assert_eq!(
            slim.metadata.resource_version,
            full.metadata.resource_version
        );
        let spec = slim.spec.as_ref().unwrap();
        assert_eq!(
            spec.containers[0].image.as_deref(),
            Some("example.com/web:1.2.3")
        );
        assert_eq!(
            spec.init_containers.as_ref().unwrap()[0]
                .restart_policy
                .as_deref(),
            Some("Always")
        );
        // ... and it is a fraction of the size.
        let size = |p: &Pod| serde_json::to_vec(p).unwrap().len();
        assert!(
            size(&slim) * 5 < size(&full),
            "{} vs {}",
            size(&slim),
            size(&full)
        );
        assert!(slim.metadata.annotations.is_none() && slim.metadata.managed_fields.is_none());
    }

    #[test]
    fn only_the_annotations_arbiter_owns_are_kept_of_managed_fields() {
        use arbiter_api::lease::{
            ASSIGNED_ANNOTATION, HOLDER_POD_ANNOTATION, RELEASED_BY_ANNOTATION, RESTARTS_ANNOTATION,
        };
        use arbiter_api::written_by_arbiter;
        let mut meta: ObjectMeta = serde_json::from_value(serde_json::json!({
            "name": "l",
            "managedFields": [
                {"manager": "arbiter", "operation": "Update", "apiVersion": "coordination.k8s.io/v1",
                 "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:annotations": {(format!("f:{RELEASED_BY_ANNOTATION}")): {},
                                                               (format!("f:{RESTARTS_ANNOTATION}")): {},
                                                               "f:arbiter.dev/some-future-mark": {}},
                                             "f:labels": {"f:arbiter.dev/managed": {}}},
                              "f:spec": {"f:holderIdentity": {}, "f:renewTime": {}}}},
                {"manager": "kubectl-annotate", "operation": "Update", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:annotations": {(format!("f:{HOLDER_POD_ANNOTATION}")): {}}}}},
                {"manager": "kubectl-edit", "operation": "Update", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:spec": {"f:leaseDurationSeconds": {}}}},
            ],
        }))
        .unwrap();
        let before = meta.clone();
        keep_arbiter_owned(&mut meta);
        for key in [
            RELEASED_BY_ANNOTATION,
            RESTARTS_ANNOTATION,
            "arbiter.dev/some-future-mark",
            HOLDER_POD_ANNOTATION,
            ASSIGNED_ANNOTATION,
        ] {
            assert_eq!(
                written_by_arbiter(&meta, key),
                written_by_arbiter(&before, key),
                "{key}"
            );
        }
        assert!(written_by_arbiter(&meta, RELEASED_BY_ANNOTATION));
        assert!(written_by_arbiter(&meta, RESTARTS_ANNOTATION));
        assert!(
            !written_by_arbiter(&meta, HOLDER_POD_ANNOTATION),
            "kubectl's"
        );
        let kept = meta.managed_fields.as_ref().unwrap();
        assert_eq!(kept.len(), 1, "one entry: arbiter's");
        let text = serde_json::to_string(kept).unwrap();
        for gone in [
            "f:spec",
            "f:labels",
            "time",
            "operation",
            "apiVersion",
            "kubectl",
        ] {
            assert!(!text.contains(gone), "{gone} kept: {text}");
        }
        // Again: the compact form reads the same.
        let once = meta.clone();
        keep_arbiter_owned(&mut meta);
        assert_eq!(meta, once);
        let mut none = ObjectMeta::default();
        keep_arbiter_owned(&mut none);
        assert_eq!(none.managed_fields, None);
        // Owning no annotation: nothing kept.
        let mut other: ObjectMeta = serde_json::from_value(serde_json::json!({
            "name": "l",
            "managedFields": [{"manager": "arbiter", "fieldsV1": {"f:spec": {"f:holderIdentity": {}}}}],
        }))
        .unwrap();
        keep_arbiter_owned(&mut other);
        assert_eq!(other.managed_fields, None);
    }
}
