//! Injection: the change the admission webhook makes to a pod that carries the label
//! `arbiter.dev/inject: "true"`, so that exactly one replica's process runs without an image
//! change. Pure (no I/O): the pod in, the pod to admit (or a refusal with the reason the API
//! server shows the user) out.
//!
//! The change:
//!
//! - an init container from the arbiter image copies the static binary into an `emptyDir`
//!   (`arbiter install --to DIR`);
//! - the chosen container (`arbiter.dev/container`, else the first) runs
//!   `DIR/arbiter run --lease NAME --binary-version V [...] -- <its command and args>`, the
//!   command and args moved behind `--` unchanged (so the kubelet still expands `$(VAR)` in
//!   them);
//! - `POD_NAME`, `POD_NAMESPACE` and `POD_UID` from the downward API, unless the container sets
//!   them already (the agent's identity, its Lease's namespace, its candidate's owner pod);
//! - the container's liveness, readiness and startup probes, where it has them, ask the agent's
//!   `/healthz` instead (`--health-address`), keeping their timings: a standby's command is not
//!   running, so a probe of the workload would fail on every standby, and the kubelet would
//!   restart it for ever (liveness) or a rolling update would wait for ever for it to be Ready
//!   (readiness). `arbiter.dev/probes: keep` leaves them as they are.
//!
//! The lease is `arbiter.dev/lease-name`, else the workload's name (the pod's ReplicaSet owner
//! without its `pod-template-hash` suffix, or its StatefulSet owner). The version is the pod's
//! `app.kubernetes.io/version` label, else the container's image tag, as for single-active
//! workloads. A container without a command in the pod spec cannot be wrapped without reading
//! its image: the pod is refused with a message naming `arbiter.dev/command`, which supplies it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction,
    ObjectFieldSelector, Pod, PodSpec, Probe, SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::{LEASE_NAME_ANNOTATION, container_version};

/// The label that selects a pod for injection (the webhook's `objectSelector`: a pod without it
/// is never sent to the webhook, so an outage of the webhook affects only these pods).
pub const INJECT_LABEL: &str = "arbiter.dev/inject";
/// The container to wrap, by name (default: the first).
pub const CONTAINER_ANNOTATION: &str = "arbiter.dev/container";
/// The command to wrap, as a JSON array, for a container whose command is its image's
/// entrypoint (not in the pod spec).
pub const COMMAND_ANNOTATION: &str = "arbiter.dev/command";
/// `arbiter run --kill-grace` (default: the agent's).
pub const KILL_GRACE_ANNOTATION: &str = "arbiter.dev/kill-grace";
/// `agent` (the default): the wrapped container's probes ask the agent's `/healthz`; `keep`:
/// they stay as written.
pub const PROBES_ANNOTATION: &str = "arbiter.dev/probes";
/// The port of the agent's `/healthz` when it answers the probes.
pub const HEALTH_PORT_ANNOTATION: &str = "arbiter.dev/health-port";
/// [`HEALTH_PORT_ANNOTATION`]'s default.
pub const HEALTH_PORT: i32 = 9440;
/// The init container that copies the binary.
pub const INIT_CONTAINER: &str = "arbiter-install";
/// The volume the binary is copied into, and where it is mounted.
pub const VOLUME: &str = "arbiter-bin";
pub const DIR: &str = "/arbiter-bin";
/// Where the binary is in the arbiter image (the Dockerfile's `COPY --from=build /arbiter`).
const IMAGE_BINARY: &str = "/arbiter";
/// The container's default termination message path, where the agent records its incarnation.
const TERMINATION_LOG: &str = "/dev/termination-log";

/// Why a pod is refused: the API server returns the message to whoever created the pod (for a
/// Deployment's pods, its ReplicaSet's events show it).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("arbiter: {CONTAINER_ANNOTATION}={0:?} names no container of this pod")]
    NoSuchContainer(String),
    #[error(
        "arbiter: container {0:?} has no command in the pod spec, and its image's entrypoint cannot be read at admission: set the annotation {COMMAND_ANNOTATION} to the command to run, as a JSON array (for example [\"/app\", \"serve\"])"
    )]
    NoCommand(String),
    #[error("arbiter: annotation {key}: {why}")]
    Annotation { key: &'static str, why: String },
    #[error(
        "arbiter: no lease name: set the annotation {LEASE_NAME_ANNOTATION} (the pod has no ReplicaSet or StatefulSet owner to name the lease after)"
    )]
    NoLease,
    #[error("arbiter: no version for container {container:?}: {why}")]
    Version { container: String, why: String },
    #[error("arbiter: annotation {PROBES_ANNOTATION}: {0:?} is neither \"agent\" nor \"keep\"")]
    Probes(String),
    #[error("arbiter: the pod has no containers")]
    NoContainers,
    #[error(
        "arbiter: the pod has an init container named {INIT_CONTAINER:?} but its container {0:?} does not run the agent: it was changed after injection, or names its own init container so (rename it)"
    )]
    HalfInjected(String),
    #[error(
        "arbiter: annotation {LEASE_NAME_ANNOTATION}={0:?} is not a valid Lease name (lowercase letters, digits, '-' and '.', at most 253): every replica must name the same lease"
    )]
    LeaseName(String),
    #[error(
        "arbiter: the pod does not mount its ServiceAccount token (automountServiceAccountToken: false): the agent needs it to reach the API server"
    )]
    NoToken,
}

/// `pod` as admitted with the agent injected, with the arbiter `image` for the init container;
/// `None` when it is injected already (a webhook may be called again for one pod).
pub fn inject(pod: &Pod, image: &str) -> Result<Option<Pod>, Refusal> {
    let annotations = pod.annotations();
    let lease = lease_of(pod, annotations)?;
    let Some(spec) = pod.spec.as_ref() else {
        return Err(Refusal::NoContainers);
    };
    if spec.automount_service_account_token == Some(false) {
        return Err(Refusal::NoToken);
    }
    let index = container_index(spec, annotations)?;
    if spec
        .init_containers
        .iter()
        .flatten()
        .any(|c| c.name == INIT_CONTAINER)
    {
        return injected_already(spec, index);
    }
    let version =
        container_version(pod, spec.containers.get(index)).map_err(|why| Refusal::Version {
            container: spec.containers[index].name.clone(),
            why,
        })?;
    // The install that arbitrates the pod, passed on to its agent's candidate.
    let instance = pod.labels().get(arbiter_api::INSTANCE_LABEL).cloned();
    let mut pod = pod.clone();
    let spec = pod.spec.as_mut().expect("checked above");
    let container = &mut spec.containers[index];
    let command = command_of(container, annotations)?;
    let mut args = agent_args(&lease, &version, instance, container, annotations)?;
    args.push("--".into());
    args.extend(command);
    args.extend(container.args.take().unwrap_or_default());
    wrap(container, args);
    spec.init_containers
        .get_or_insert_with(Vec::new)
        .push(init_container(image));
    spec.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    });
    Ok(Some(pod))
}

/// The container the agent wraps: the one `arbiter.dev/container` names, else the first.
fn container_index(
    spec: &PodSpec,
    annotations: &BTreeMap<String, String>,
) -> Result<usize, Refusal> {
    match annotations.get(CONTAINER_ANNOTATION) {
        Some(name) => spec
            .containers
            .iter()
            .position(|c| &c.name == name)
            .ok_or_else(|| Refusal::NoSuchContainer(name.clone())),
        None if spec.containers.is_empty() => Err(Refusal::NoContainers),
        None => Ok(0),
    }
}

/// Called again for a pod injected already: nothing to do, if the agent still wraps a
/// container's command (another webhook may have put a container before it).
fn injected_already(spec: &PodSpec, index: usize) -> Result<Option<Pod>, Refusal> {
    let wrapped = spec.containers.iter().any(|c| {
        c.command.as_deref() == Some(&[format!("{DIR}/arbiter")][..])
            && c.args.as_ref().and_then(|a| a.first()).map(String::as_str) == Some("run")
    });
    if wrapped {
        Ok(None)
    } else {
        Err(Refusal::HalfInjected(spec.containers[index].name.clone()))
    }
}

/// The container's command: its own, else the one `arbiter.dev/command` gives (for an image
/// whose entrypoint the pod does not spell out).
fn command_of(
    container: &Container,
    annotations: &BTreeMap<String, String>,
) -> Result<Vec<String>, Refusal> {
    match (&container.command, annotations.get(COMMAND_ANNOTATION)) {
        (Some(command), _) if !command.is_empty() => Ok(command.clone()),
        (_, Some(json)) => serde_json::from_str::<Vec<String>>(json)
            .ok()
            .filter(|c| !c.is_empty())
            .ok_or_else(|| Refusal::Annotation {
                key: COMMAND_ANNOTATION,
                why: format!("{json:?} is not a non-empty JSON array of strings"),
            }),
        _ => Err(Refusal::NoCommand(container.name.clone())),
    }
}

/// `arbiter run`'s flags for the wrapped container, up to the `--` (the container's probes
/// that the agent answers are pointed at it).
fn agent_args(
    lease: &str,
    version: &str,
    instance: Option<String>,
    container: &mut Container,
    annotations: &BTreeMap<String, String>,
) -> Result<Vec<String>, Refusal> {
    let mut args: Vec<String> = ["run", "--lease", lease, "--binary-version", version]
        .map(String::from)
        .into();
    if let Some(instance) = instance {
        args.extend(["--instance".into(), instance]);
    }
    if let Some(grace) = annotations.get(KILL_GRACE_ANNOTATION) {
        humantime::parse_duration(grace).map_err(|e| Refusal::Annotation {
            key: KILL_GRACE_ANNOTATION,
            why: format!("{grace:?} is not a duration ({e}): use e.g. 3s, 500ms"),
        })?;
        args.extend(["--kill-grace".into(), grace.clone()]);
    }
    // The agent records its incarnation where the kubelet reads the container's termination
    // message: the container's own path, if it moved it.
    if let Some(path) = container
        .termination_message_path
        .as_ref()
        .filter(|p| *p != TERMINATION_LOG)
    {
        args.extend(["--termination-log".into(), path.clone()]);
    }
    if let Some(port) = probes_to_agent(container, annotations)? {
        args.extend(["--health-address".into(), format!("0.0.0.0:{port}")]);
    }
    Ok(args)
}

/// Makes `container` run the agent with `args`, with the pod's name, namespace and uid from the
/// downward API and the agent's binary mounted.
fn wrap(container: &mut Container, args: Vec<String>) {
    container.command = Some(vec![format!("{DIR}/arbiter")]);
    container.args = Some(args);
    let env = container.env.get_or_insert_with(Vec::new);
    for (name, field) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
        ("POD_UID", "metadata.uid"),
    ] {
        if !env.iter().any(|e| e.name == name) {
            env.push(downward(name, field));
        }
    }
    container
        .volume_mounts
        .get_or_insert_with(Vec::new)
        .push(VolumeMount {
            name: VOLUME.into(),
            mount_path: DIR.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
}

/// The init container that copies the agent's binary into the shared volume.
fn init_container(image: &str) -> Container {
    Container {
        name: INIT_CONTAINER.into(),
        image: Some(image.into()),
        command: Some(
            [IMAGE_BINARY, "install", "--to", DIR]
                .map(String::from)
                .into(),
        ),
        volume_mounts: Some(vec![VolumeMount {
            name: VOLUME.into(),
            mount_path: DIR.into(),
            ..VolumeMount::default()
        }]),
        // What the `restricted` Pod Security Standard asks of a container.
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            // The image's user, whatever the pod's securityContext says.
            run_as_user: Some(65532),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Capabilities::default()
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..SeccompProfile::default()
            }),
            ..SecurityContext::default()
        }),
        ..Container::default()
    }
}

/// The lease an injected pod's agent runs for and the install instance it was told
/// (`--lease`, `--instance` in its wrapped container's args), if the pod was injected: fixed
/// at the pod's creation, whatever its labels say later.
pub fn wrapped_agent(pod: &Pod) -> Option<(String, Option<String>)> {
    let wrapper = [format!("{DIR}/arbiter")];
    pod.spec.as_ref()?.containers.iter().find_map(|c| {
        let args = c.args.as_ref()?;
        if c.command.as_deref() != Some(&wrapper[..]) || args.first()? != "run" {
            return None;
        }
        let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
        let flag = |name: &str| {
            let at = args[..end].iter().position(|a| a == name)?;
            args.get(at + 1).cloned()
        };
        Some((flag("--lease")?, flag("--instance")))
    })
}

/// The lease the webhook gives `pod`'s agent (as [`inject`] would), if the pod names one.
pub fn lease_for(pod: &Pod) -> Option<String> {
    lease_of(pod, pod.annotations()).ok()
}

/// The lease: the annotation, else the workload's name from the pod's controller.
fn lease_of(pod: &Pod, annotations: &BTreeMap<String, String>) -> Result<String, Refusal> {
    if let Some(name) = annotations.get(LEASE_NAME_ANNOTATION) {
        let valid = !name.is_empty()
            && name.len() <= 253
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
            && name.starts_with(|c: char| c.is_ascii_alphanumeric())
            && name.ends_with(|c: char| c.is_ascii_alphanumeric());
        return if valid {
            Ok(name.clone())
        } else {
            Err(Refusal::LeaseName(name.clone()))
        };
    }
    let owner = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .ok_or(Refusal::NoLease)?;
    match owner.kind.as_str() {
        "StatefulSet" => Ok(owner.name.clone()),
        "ReplicaSet" => {
            let hash = pod
                .labels()
                .get("pod-template-hash")
                .ok_or(Refusal::NoLease)?;
            owner
                .name
                .strip_suffix(&format!("-{hash}"))
                .map(str::to_string)
                .ok_or(Refusal::NoLease)
        }
        _ => Err(Refusal::NoLease),
    }
}

/// Points `container`'s probes at the agent's `/healthz`, keeping their timings, unless the pod
/// says `keep`; the port the agent must serve it on, if any probe now asks it.
fn probes_to_agent(
    container: &mut Container,
    annotations: &BTreeMap<String, String>,
) -> Result<Option<i32>, Refusal> {
    match annotations.get(PROBES_ANNOTATION).map(String::as_str) {
        None | Some("agent") => {}
        Some("keep") => return Ok(None),
        Some(other) => return Err(Refusal::Probes(other.into())),
    }
    let port = match annotations.get(HEALTH_PORT_ANNOTATION) {
        None => HEALTH_PORT,
        Some(p) => p
            .parse::<i32>()
            .ok()
            .filter(|p| (1..=65535).contains(p))
            .ok_or_else(|| Refusal::Annotation {
                key: HEALTH_PORT_ANNOTATION,
                why: format!("{p:?} is not a port number (1 to 65535)"),
            })?,
    };
    let mut asked = false;
    for probe in [
        &mut container.liveness_probe,
        &mut container.readiness_probe,
        &mut container.startup_probe,
    ]
    .into_iter()
    .flatten()
    {
        *probe = Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/healthz".into()),
                port: IntOrString::Int(port),
                ..HTTPGetAction::default()
            }),
            exec: None,
            grpc: None,
            tcp_socket: None,
            ..probe.clone()
        };
        asked = true;
    }
    Ok(asked.then_some(port))
}

fn downward(name: &str, field: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field.into(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const IMAGE: &str = "registry.example/arbiter:0.1.0";

    /// A pod of Deployment `kv` (ReplicaSet `kv-5d9f`), its container `app` at 1.31.0.
    fn pod(container: serde_json::Value, annotations: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": "kv-5d9f-abcde",
                "namespace": "ns",
                "labels": {INJECT_LABEL: "true", "pod-template-hash": "5d9f"},
                "annotations": annotations,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "kv-5d9f",
                    "uid": "u-rs", "controller": true}],
            },
            "spec": {"containers": [container]},
        }))
        .unwrap()
    }

    fn app(extra: serde_json::Value) -> serde_json::Value {
        let mut c = json!({"name": "app", "image": "example/kv:1.31.0"});
        c.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        c
    }

    fn wrapped(pod: &Pod) -> &Container {
        &pod.spec.as_ref().unwrap().containers[0]
    }

    #[test]
    fn the_container_runs_its_command_under_the_agent() {
        let p = pod(
            app(json!({"command": ["sh", "-c"], "args": ["echo $(POD_NAME)"]})),
            json!({KILL_GRACE_ANNOTATION: "5s"}),
        );
        let injected = inject(&p, IMAGE).unwrap().unwrap();
        let c = wrapped(&injected);
        assert_eq!(
            c.command.as_deref(),
            Some(&["/arbiter-bin/arbiter".to_string()][..])
        );
        assert_eq!(
            c.args.as_deref().unwrap(),
            [
                "run",
                "--lease",
                "kv",
                "--binary-version",
                "1.31.0",
                "--kill-grace",
                "5s",
                "--",
                "sh",
                "-c",
                "echo $(POD_NAME)"
            ]
        );
        let env: Vec<_> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
        assert_eq!(env, ["POD_NAME", "POD_NAMESPACE", "POD_UID"]);
        let spec = injected.spec.as_ref().unwrap();
        let init = &spec.init_containers.as_ref().unwrap()[0];
        assert_eq!(init.image.as_deref(), Some(IMAGE));
        assert_eq!(
            init.command.as_deref().unwrap(),
            ["/arbiter", "install", "--to", "/arbiter-bin"]
        );
        assert_eq!(spec.volumes.as_ref().unwrap()[0].name, VOLUME);
        assert_eq!(inject(&injected, IMAGE), Ok(None), "injected once only");
        assert_eq!(wrapped_agent(&injected), Some(("kv".into(), None)));
        assert_eq!(
            wrapped_agent(&pod(app(json!({"command": ["/kv"]})), json!({}))),
            None
        );
        assert_eq!(
            init.security_context.as_ref().unwrap().run_as_user,
            Some(65532)
        );

        // Its command changed after injection (another webhook), or an init container of
        // its own under that name: refused, never admitted unwrapped.
        let mut changed = injected.clone();
        changed.spec.as_mut().unwrap().containers[0].command = Some(vec!["/bin/sh".into()]);
        assert_eq!(
            inject(&changed, IMAGE),
            Err(Refusal::HalfInjected("app".into()))
        );
        let mut own = pod(app(json!({"command": ["/kv"]})), json!({}));
        own.spec.as_mut().unwrap().init_containers = Some(vec![
            serde_json::from_value(json!({"name": INIT_CONTAINER, "image": "x"})).unwrap(),
        ]);
        assert_eq!(
            inject(&own, IMAGE),
            Err(Refusal::HalfInjected("app".into()))
        );
    }

    #[test]
    fn a_lease_name_every_replica_shares_and_a_token_are_required() {
        let with = |annotations| pod(app(json!({"command": ["/kv"]})), annotations);
        for bad in ["w-$(POD_NAME)", "Work", "", "-w", "w_1"] {
            assert_eq!(
                inject(&with(json!({LEASE_NAME_ANNOTATION: bad})), IMAGE),
                Err(Refusal::LeaseName(bad.into())),
                "{bad}"
            );
        }
        assert!(inject(&with(json!({LEASE_NAME_ANNOTATION: "work.v2"})), IMAGE).is_ok());
        let mut tokenless = with(json!({}));
        tokenless
            .spec
            .as_mut()
            .unwrap()
            .automount_service_account_token = Some(false);
        assert_eq!(inject(&tokenless, IMAGE), Err(Refusal::NoToken));
    }

    #[test]
    fn a_container_without_a_command_is_refused_unless_the_annotation_supplies_it() {
        let refused = inject(&pod(app(json!({})), json!({})), IMAGE).unwrap_err();
        assert_eq!(refused, Refusal::NoCommand("app".into()));
        assert!(
            refused.to_string().contains(COMMAND_ANNOTATION),
            "{refused}"
        );

        let p = pod(
            app(json!({"args": ["--port", "80"]})),
            json!({COMMAND_ANNOTATION: r#"["/kv"]"#}),
        );
        let injected = inject(&p, IMAGE).unwrap().unwrap();
        let args = wrapped(&injected).args.clone().unwrap();
        assert_eq!(args[args.len() - 4..], ["--", "/kv", "--port", "80"]);

        let bad = pod(app(json!({})), json!({COMMAND_ANNOTATION: "/kv --port 80"}));
        assert!(matches!(
            inject(&bad, IMAGE),
            Err(Refusal::Annotation {
                key: COMMAND_ANNOTATION,
                ..
            })
        ));
    }

    #[test]
    fn annotations_choose_the_lease_the_container_and_say_what_is_wrong() {
        let two = |annotations| {
            let mut p = pod(app(json!({"command": ["/kv"]})), annotations);
            p.spec.as_mut().unwrap().containers.push(
                serde_json::from_value(
                    json!({"name": "sidecar", "image": "proxy:2.0.0", "command": ["/proxy"]}),
                )
                .unwrap(),
            );
            p
        };
        let injected = inject(
            &two(json!({CONTAINER_ANNOTATION: "sidecar", LEASE_NAME_ANNOTATION: "proxy"})),
            IMAGE,
        )
        .unwrap()
        .unwrap();
        let spec = injected.spec.as_ref().unwrap();
        assert_eq!(
            spec.containers[0].command.as_deref().unwrap(),
            ["/kv"],
            "untouched"
        );
        let args = spec.containers[1].args.clone().unwrap();
        assert_eq!(
            args[..5],
            ["run", "--lease", "proxy", "--binary-version", "2.0.0"]
        );

        assert_eq!(
            inject(&two(json!({CONTAINER_ANNOTATION: "web"})), IMAGE),
            Err(Refusal::NoSuchContainer("web".into()))
        );
        assert!(matches!(
            inject(&two(json!({KILL_GRACE_ANNOTATION: "soon"})), IMAGE),
            Err(Refusal::Annotation {
                key: KILL_GRACE_ANNOTATION,
                ..
            })
        ));
        let mut orphan = two(json!({}));
        orphan.metadata.owner_references = None;
        assert_eq!(inject(&orphan, IMAGE), Err(Refusal::NoLease));
        let untagged = pod(
            app(json!({"image": "example/kv", "command": ["/kv"]})),
            json!({}),
        );
        assert!(matches!(
            inject(&untagged, IMAGE),
            Err(Refusal::Version { .. })
        ));
    }

    #[test]
    fn probes_ask_the_agent_keeping_their_timings_unless_told_to_keep_them() {
        let probed = json!({
            "command": ["/kv"],
            "livenessProbe": {"httpGet": {"path": "/live", "port": 8080}, "periodSeconds": 7},
            "readinessProbe": {"exec": {"command": ["/kv", "ready"]}, "failureThreshold": 2},
        });
        let injected = inject(&pod(app(probed.clone()), json!({})), IMAGE)
            .unwrap()
            .unwrap();
        let c = wrapped(&injected);
        let agent = |p: &Option<Probe>| {
            let p = p.clone().expect("still probed");
            assert!(p.exec.is_none() && p.tcp_socket.is_none() && p.grpc.is_none());
            let get = p.http_get.clone().unwrap();
            assert_eq!(get.path.as_deref(), Some("/healthz"));
            assert_eq!(get.port, IntOrString::Int(HEALTH_PORT));
            p
        };
        assert_eq!(agent(&c.liveness_probe).period_seconds, Some(7));
        assert_eq!(agent(&c.readiness_probe).failure_threshold, Some(2));
        assert!(c.startup_probe.is_none(), "no probe is added");
        let args = c.args.clone().unwrap();
        let at = args.iter().position(|a| a == "--health-address").unwrap();
        assert_eq!(args[at + 1], "0.0.0.0:9440");
        assert!(at < args.iter().position(|a| a == "--").unwrap());

        let on = |annotations| inject(&pod(app(probed.clone()), annotations), IMAGE);
        let moved = on(json!({HEALTH_PORT_ANNOTATION: "9999"}))
            .unwrap()
            .unwrap();
        assert!(
            wrapped(&moved)
                .args
                .clone()
                .unwrap()
                .contains(&"0.0.0.0:9999".into())
        );
        let kept = on(json!({PROBES_ANNOTATION: "keep"})).unwrap().unwrap();
        let c = wrapped(&kept);
        assert!(c.readiness_probe.as_ref().unwrap().exec.is_some());
        assert!(!c.args.clone().unwrap().contains(&"--health-address".into()));
        assert_eq!(
            on(json!({PROBES_ANNOTATION: "off"})),
            Err(Refusal::Probes("off".into()))
        );
        assert!(matches!(
            on(json!({HEALTH_PORT_ANNOTATION: "0"})),
            Err(Refusal::Annotation {
                key: HEALTH_PORT_ANNOTATION,
                ..
            })
        ));

        let unprobed = inject(&pod(app(json!({"command": ["/kv"]})), json!({})), IMAGE)
            .unwrap()
            .unwrap();
        let c = wrapped(&unprobed);
        assert!(c.liveness_probe.is_none() && c.readiness_probe.is_none());
        assert!(!c.args.clone().unwrap().contains(&"--health-address".into()));
    }

    #[test]
    fn a_moved_termination_message_path_is_where_the_agent_records_itself() {
        let p = pod(
            app(json!({"command": ["/kv"], "terminationMessagePath": "/tmp/end"})),
            json!({}),
        );
        let injected = inject(&p, IMAGE).unwrap().unwrap();
        let args = wrapped(&injected).args.clone().unwrap();
        assert!(
            args.windows(2)
                .any(|w| w == ["--termination-log", "/tmp/end"]),
            "{args:?}"
        );
    }
}
