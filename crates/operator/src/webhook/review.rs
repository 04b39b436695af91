//! The injection webhook's answer to an admission review: the JSON patch that injects the agent
//! into a pod labelled `arbiter.dev/inject` ([`crate::workloads::inject`]), nothing for a pod
//! that has it already, or a denial whose message says what to change. It needs no leadership:
//! every replica answers, from the pod in the request alone.

use k8s_openapi::api::core::v1::Pod;
use kube::core::admission::{AdmissionRequest, AdmissionResponse};

use crate::workloads::inject::{INIT_CONTAINER, inject};

/// How this operator injects.
#[derive(Clone, Debug, Default)]
pub struct Injection {
    /// The arbiter image, for the init container.
    pub image: String,
    /// The init container's `imagePullPolicy` (the operator's own, so that an air-gapped install
    /// pulls the image as the operator's pods do); the cluster's default when unset.
    pub pull_policy: Option<String>,
    /// The only namespaces arbitrated (`--watch-namespaces`; empty: all): pods elsewhere are
    /// refused (no one would elect them, and unwrapped they would all run).
    pub only: Vec<String>,
    /// This install's instance (`--instance`): a pod labelled for another is left to its
    /// install's webhook.
    pub instance: Option<String>,
}

/// The response to `request`.
pub fn review(request: &AdmissionRequest<Pod>, injection: &Injection) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    // Only pod creations are wrapped (a running pod's spec cannot change); anything else
    // passes as it is.
    let Some(pod) = request
        .object
        .as_ref()
        .filter(|_| request.operation == kube::core::admission::Operation::Create)
    else {
        return response;
    };
    let pod_instance = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(arbiter_api::INSTANCE_LABEL));
    // No install has such an instance: refused by every install, rather than run unwrapped.
    if let Some(Err(why)) = pod_instance.map(|i| arbiter_api::check_instance(i)) {
        return response.deny(format!(
            "arbiter: label {}: {why}",
            arbiter_api::INSTANCE_LABEL
        ));
    }
    // Another install's pod: its own webhook wraps it.
    if pod_instance != injection.instance.as_ref() {
        return response;
    }
    if !injection.only.is_empty()
        && !request
            .namespace
            .as_ref()
            .is_some_and(|ns| injection.only.contains(ns))
    {
        return response.deny(format!(
            "arbiter: this arbiter arbitrates only namespace {}: a pod labelled arbiter.dev/inject elsewhere would never be elected",
            injection.only.join(", ")
        ));
    }
    match inject(pod, &injection.image) {
        Ok(None) => response,
        Ok(Some(mut injected)) => {
            let init = injected
                .spec
                .as_mut()
                .and_then(|s| s.init_containers.as_mut());
            for c in init
                .into_iter()
                .flatten()
                .filter(|c| c.name == INIT_CONTAINER)
            {
                c.image_pull_policy.clone_from(&injection.pull_policy);
            }
            let (Ok(before), Ok(after)) =
                (serde_json::to_value(pod), serde_json::to_value(&injected))
            else {
                return response.deny("arbiter: the pod could not be encoded");
            };
            let patch = json_patch::diff(&before, &after);
            match AdmissionResponse::from(request).with_patch(patch) {
                Ok(patched) => patched,
                Err(e) => response.deny(format!("arbiter: {e}")),
            }
        }
        Err(refusal) => response.deny(refusal),
    }
}

#[cfg(test)]
mod tests {
    use kube::core::admission::AdmissionReview;
    use serde_json::json;

    use super::*;

    /// An AdmissionReview as the API server sends it for a Deployment's new pod.
    fn request(container: serde_json::Value) -> AdmissionRequest<Pod> {
        let review: AdmissionReview<Pod> = serde_json::from_value(json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
                "requestResource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "ns",
                "operation": "CREATE",
                "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
                "object": {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {
                        "generateName": "kv-5d9f-",
                        "labels": {"arbiter.dev/inject": "true", "pod-template-hash": "5d9f"},
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                            "name": "kv-5d9f", "uid": "u-rs", "controller": true}],
                    },
                    "spec": {"containers": [container]},
                },
                "dryRun": false,
            },
        }))
        .unwrap();
        review.try_into().unwrap()
    }

    fn image(name: &str, only: Option<&str>) -> Injection {
        Injection {
            image: name.into(),
            pull_policy: Some("Never".into()),
            only: only.map(String::from).into_iter().collect(),
            instance: None,
        }
    }

    #[test]
    fn the_patch_makes_the_pod_run_its_command_under_the_agent() {
        let req = request(json!({"name": "app", "image": "kv:1.2.3", "command": ["/kv"]}));
        let response = review(&req, &image("arbiter:0.1.0", None));
        assert!(response.allowed);
        assert_eq!(response.uid, req.uid);
        let patch: json_patch::Patch =
            serde_json::from_slice(response.patch.as_deref().expect("a patch")).unwrap();
        let mut pod = serde_json::to_value(req.object.as_ref().unwrap()).unwrap();
        json_patch::patch(&mut pod, &patch).unwrap();
        let pod: Pod = serde_json::from_value(pod).unwrap();
        let args = pod.spec.as_ref().unwrap().containers[0]
            .args
            .clone()
            .unwrap();
        assert_eq!(
            args[..5],
            ["run", "--lease", "kv", "--binary-version", "1.2.3"]
        );
        assert_eq!(args[args.len() - 2..], ["--", "/kv"]);
        let init = &pod.spec.unwrap().init_containers.unwrap()[0];
        assert_eq!(
            init.image_pull_policy.as_deref(),
            Some("Never"),
            "the operator's own"
        );
    }

    /// A pod labelled for an install's instance is wrapped only by that install's webhook,
    /// and its agent is told the instance (its candidate is labelled with it).
    #[test]
    fn only_the_pods_of_this_install_are_wrapped_and_their_agents_told_its_instance() {
        let mut req = request(json!({"name": "app", "image": "kv:1.2.3", "command": ["/kv"]}));
        req.object
            .as_mut()
            .unwrap()
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(arbiter_api::INSTANCE_LABEL.into(), "blue".into());
        let unlabelled_install = review(&req, &image("arbiter:0.1.0", None));
        assert!(unlabelled_install.allowed && unlabelled_install.patch.is_none());
        let mut blue = image("arbiter:0.1.0", None);
        blue.instance = Some("blue".into());
        let response = review(&req, &blue);
        let patch: json_patch::Patch =
            serde_json::from_slice(response.patch.as_deref().expect("a patch")).unwrap();
        let mut pod = serde_json::to_value(req.object.as_ref().unwrap()).unwrap();
        json_patch::patch(&mut pod, &patch).unwrap();
        let pod: Pod = serde_json::from_value(pod).unwrap();
        let args = pod.spec.unwrap().containers[0].args.clone().unwrap();
        let at = args
            .iter()
            .position(|a| a == "--instance")
            .expect("--instance");
        assert_eq!(args[at + 1], "blue");
        // An unlabelled pod is not the blue install's.
        let plain = request(json!({"name": "app", "image": "kv:1.2.3", "command": ["/kv"]}));
        assert!(review(&plain, &blue).patch.is_none());
        // A label no install can have (empty, or not a label value) is refused by every
        // install: unwrapped, the pod's command would run on every replica.
        for bad in ["", "-x"] {
            let mut req = plain.clone();
            let labels = req.object.as_mut().unwrap().metadata.labels.as_mut();
            labels
                .unwrap()
                .insert(arbiter_api::INSTANCE_LABEL.into(), bad.into());
            for install in [&blue, &image("arbiter:0.1.0", None)] {
                let response = review(&req, install);
                assert!(!response.allowed, "{bad:?}");
                assert!(response.result.message.contains("arbiter.dev/instance"));
            }
        }
    }

    #[test]
    fn a_pod_outside_the_arbitrated_namespace_is_denied() {
        let req = request(json!({"name": "app", "image": "kv:1.2.3", "command": ["/kv"]}));
        assert!(review(&req, &image("arbiter:0.1.0", Some("ns"))).allowed);
        let response = review(&req, &image("arbiter:0.1.0", Some("other")));
        assert!(!response.allowed);
        assert!(response.result.message.contains("only namespace other"));
    }

    #[test]
    fn a_pod_that_cannot_be_wrapped_is_denied_with_the_reason() {
        let req = request(json!({"name": "app", "image": "kv:1.2.3"}));
        let response = review(&req, &image("arbiter:0.1.0", None));
        assert!(!response.allowed);
        assert!(response.patch.is_none());
        assert!(
            response.result.message.contains("arbiter.dev/command"),
            "{}",
            response.result.message
        );
    }
}
