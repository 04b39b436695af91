//! Injection on the real node: the chart's operator runs in the cluster and serves the webhook;
//! a Deployment whose pods carry `arbiter.dev/inject: "true"` gets the agent wrapped around its
//! command, and exactly one replica's command runs at a time, through a rolling update, a
//! rollback, the active pod's deletion and the webhook certificate's rotations.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::chart::install;
use crate::support::agent::{Entry, WORKLOAD, read_log};
use crate::support::node::{self, BUSYBOX_IMAGE};
use crate::support::operator::Operator;
use crate::support::{TestEnv, eventually};

crate::tests![inject:
    an_injected_deployment_runs_one_command_at_a_time_through_updates_rollback_and_rotation,
    with_cert_manager_the_operator_serves_what_the_secret_holds_and_writes_neither,
    a_replica_that_starts_acting_never_takes_a_lease_from_a_role,
    pods_created_before_the_webhook_are_evicted_down_to_one_command,
    a_force_deleted_unwrapped_pod_holds_its_lease_until_it_could_have_stopped,
];

const DEADLINE: Duration = Duration::from_secs(120);
/// How long a rollout of three pods may take on a loaded machine (the whole suite runs at once).
const ROLLOUT: Duration = Duration::from_secs(240);
/// The Leases' duration in this test: a new holder sooner than this was handed the lease, it
/// did not wait for it to expire.
const LEASE: Duration = Duration::from_secs(60);

/// Deployment `work`: three busybox replicas at `version` whose command appends its start and
/// stop to `shared/log`, with a readiness probe that fails wherever it runs unless the
/// injection points it at the agent.
fn deployment(version: &str, shared: &Path) -> Value {
    // busybox's date has no %N: the times are the kernel's uptime (one clock for every pod
    // on the node). The kubelet reads `$$` as an escaped `$`.
    let workload = WORKLOAD
        .replace("echo \"start", "read up _ < /proc/uptime; echo \"start")
        .replace("trap 'echo", "trap 'read up _ < /proc/uptime; echo")
        .replace("$(date +%s.%N)", "$up")
        .replace("$$", "$$$$");
    let mut spec = json!({
        "serviceAccountName": "worker",
        "containers": [{
            "name": "work", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
            "command": ["/bin/sh", "-c", workload, "workload", "/shared/log"],
            "readinessProbe": {"exec": {"command": ["false"]}, "periodSeconds": 2},
            "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
        }],
        "volumes": [{"name": "shared", "hostPath": {"path": shared.to_str().unwrap(), "type": "Directory"}}],
    });
    node::place(&mut spec);
    json!({
        "metadata": {"name": "work"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "work"}},
            "template": {
                "metadata": {
                    "labels": {"app": "work", "arbiter.dev/inject": "true",
                               "app.kubernetes.io/version": version},
                    "annotations": {"arbiter.dev/kill-grace": "3s"},
                },
                "spec": spec,
            },
        },
    })
}

/// Waits until every replica of `work` runs `version` and is ready, and the lease's holder is
/// one of them; returns the holder.
async fn rolled_out(env: &TestEnv, version: &str) -> String {
    let deployments: Api<Deployment> = env.api();
    let leases: Api<Lease> = env.api();
    let pods: Api<Pod> = env.api();
    let check = || async {
        let d = deployments.get("work").await.ok()?;
        let status = d.status?;
        let done = status.observed_generation >= d.metadata.generation
            && status.updated_replicas == Some(3)
            && status.ready_replicas == Some(3)
            && status.replicas == Some(3);
        let holder = leases.get("work").await.ok()?.spec?.holder_identity?;
        let pod = pods.get(&holder).await.ok()?;
        let running = pod
            .labels()
            .get("app.kubernetes.io/version")
            .map(String::as_str);
        (done && running == Some(version)).then_some(holder)
    };
    let what = format!("work to run {version} and lead with it");
    match tokio::time::timeout(ROLLOUT, eventually(&what, ROLLOUT * 2, check)).await {
        Ok(holder) => holder,
        Err(_) => panic!(
            "timed out after {ROLLOUT:?} waiting for {what}:\n{}",
            state(env).await
        ),
    }
}

/// The pods, the lease and the namespace's Events, for a failure's message.
async fn state(env: &TestEnv) -> String {
    let pods: Api<Pod> = env.api();
    let mut out = String::new();
    let listed = pods.list(&ListParams::default()).await;
    for p in listed.map(|l| l.items).unwrap_or_default() {
        let status = p.status.clone().unwrap_or_default();
        let containers: Vec<String> = status
            .init_container_statuses
            .iter()
            .flatten()
            .chain(status.container_statuses.iter().flatten())
            .map(|c| {
                format!(
                    "{} ready={} restarts={} state={:?}",
                    c.name, c.ready, c.restart_count, c.state
                )
            })
            .collect();
        out += &format!(
            "pod {} phase={:?} {containers:?}\n",
            p.name_any(),
            status.phase
        );
    }
    let leases: Api<Lease> = env.api();
    let lease = leases
        .get_opt("work")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec);
    out += &format!("lease: {lease:?}\n");
    let events: Api<Event> = env.api();
    for e in events
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        out += &format!(
            "event {} {:?}: {}\n",
            e.involved_object.name.unwrap_or_default(),
            e.reason,
            e.message.unwrap_or_default()
        );
    }
    out
}

async fn set_version(env: &TestEnv, version: &str) {
    let deployments: Api<Deployment> = env.api();
    let patch = json!({"spec": {"template": {"metadata": {"labels": {"app.kubernetes.io/version": version}}}}});
    deployments
        .patch("work", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// The version of each pod that logged, from its ReplicaSet (`work-HASH-xxxxx`).
async fn versions(env: &TestEnv) -> std::collections::BTreeMap<String, String> {
    let sets: Api<ReplicaSet> = env.api();
    let sets = sets.list(&ListParams::default()).await.unwrap();
    let mut by_set = std::collections::BTreeMap::new();
    for rs in sets.items {
        let version = rs
            .spec
            .and_then(|s| {
                s.template?
                    .metadata?
                    .labels?
                    .get("app.kubernetes.io/version")
                    .cloned()
            })
            .unwrap_or_default();
        by_set.insert(rs.metadata.name.unwrap_or_default(), version);
    }
    by_set
}

fn version_of<'a>(sets: &'a std::collections::BTreeMap<String, String>, pod: &str) -> &'a str {
    let set = pod.rsplit_once('-').map_or(pod, |(s, _)| s);
    sets.get(set).map_or("?", String::as_str)
}

/// Waits until `holder`'s command has logged its start after entry `from`: the Lease names
/// the new holder a moment before its agent starts the command and the command writes.
async fn command_started(log: &std::path::Path, from: usize, holder: &str) {
    eventually(
        &format!("{holder}'s command to start"),
        DEADLINE,
        || async {
            read_log(log)[from..]
                .iter()
                .any(|e| matches!(e, Entry::Start { id, .. } if id == holder))
                .then_some(())
        },
    )
    .await;
}

/// The versions of the workloads started in `entries`, in order.
fn started_versions(
    entries: &[Entry],
    sets: &std::collections::BTreeMap<String, String>,
) -> Vec<String> {
    entries
        .iter()
        .filter_map(|e| match e {
            Entry::Start { id, .. } => Some(version_of(sets, id).to_string()),
            _ => None,
        })
        .collect()
}

/// The longest time no command ran, between a stop and the next start in `entries` (seconds,
/// on the node's uptime clock); zero without a stop followed by a start.
fn longest_without_a_command(entries: &[Entry]) -> f64 {
    let mut stopped: Option<f64> = None;
    let mut longest: f64 = 0.0;
    for e in entries {
        match e {
            Entry::Stop { at, .. } => stopped = Some(*at),
            Entry::Start { at, .. } => {
                if let Some(stop) = stopped.take() {
                    longest = longest.max(at - stop);
                }
            }
            _ => {}
        }
    }
    longest
}

/// Panics unless, in log order, no workload starts while another runs.
fn one_at_a_time(entries: &[Entry]) {
    let mut running: Option<&str> = None;
    for e in entries {
        match e {
            Entry::Start { id, .. } => {
                assert!(
                    running.is_none(),
                    "{id} started while {running:?} ran: {entries:#?}"
                );
                running = Some(id);
            }
            Entry::Stop { id, .. } if running == Some(id.as_str()) => running = None,
            _ => {}
        }
    }
}

/// POSTs, from the host, an AdmissionReview the API server never sent to the webhook on
/// `ip`: a pod of ServiceAccount `forged` in `ns`. Returns the answer.
fn forge_review(ip: &str, ns: &str) -> String {
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "forged-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": ns, "operation": "CREATE", "userInfo": {"username": "nobody"},
            "object": {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "forged", "namespace": ns,
                             "labels": {"arbiter.dev/inject": "true"},
                             "annotations": {"arbiter.dev/lease-name": "forged"}},
                "spec": {"serviceAccountName": "forged",
                         "containers": [{"name": "c", "image": "x:1.0.0", "command": ["/x"]}]},
            },
            "dryRun": false,
        },
    });
    let out = std::process::Command::new("curl")
        .args([
            "-sk",
            "--max-time",
            "5",
            "-H",
            "Content-Type: application/json",
            "-d",
        ])
        .arg(review.to_string())
        .arg(format!("https://{ip}:9443/inject"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Whether ServiceAccount `worker` may `verb` `resource` in the test's namespace.
fn can(env: &TestEnv, verb: &str, resource: &str) -> bool {
    let who = format!("system:serviceaccount:{}:worker", env.ns);
    let out = std::process::Command::new("kubectl")
        .args(["auth", "can-i", verb, resource, "-n", &env.ns, "--as", &who])
        .env("KUBECONFIG", &env.kubeconfig)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

async fn tls_crt(secrets: &Api<Secret>, name: &str) -> Vec<u8> {
    eventually(
        &format!("Secret {name}'s certificate"),
        DEADLINE,
        || async {
            Some(
                secrets
                    .get(name)
                    .await
                    .ok()?
                    .data?
                    .get("tls.crt")?
                    .0
                    .clone(),
            )
        },
    )
    .await
}

async fn an_injected_deployment_runs_one_command_at_a_time_through_updates_rollback_and_rotation(
    env: Arc<TestEnv>,
) {
    node::ready(&env).await;
    let release = env.release("inj");
    let name = format!("{release}-arbiter");
    let settings: &[&str] = &[
        // Rotated once a minute: during the test.
        "--set",
        "injection.certValidity=90s",
        "--set",
        "operator.leaseDuration=60s",
        "--wait",
        "--timeout",
        "120s",
    ];
    install(&env, &release, &[node::CHART_ON_NODE, settings].concat());
    let secrets: Api<Secret> = env.api();
    let secret = format!("{name}-webhook-tls");
    let first_cert = tls_crt(&secrets, &secret).await;

    // A review posted to the webhook's port by anyone is only answered: it binds nothing.
    let operators: Api<Pod> = env.api();
    let operator_ips: Vec<String> = operators
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={release}")))
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect();
    let operator_ip = operator_ips
        .first()
        .expect("an operator pod with an IP")
        .clone();
    let answer = forge_review(&operator_ip, &env.ns);
    assert!(answer.contains("\"patchType\":\"JSONPatch\""), "{answer}");
    let bindings: Api<RoleBinding> = env.api();
    let forged_bound = async || {
        let forged = bindings.get_opt("arbiter-agent-forged").await.unwrap();
        assert!(forged.is_none(), "a forged review made a RoleBinding");
    };
    forged_bound().await;

    // A ServiceAccount with no rights: the operator binds the agent's role to it.
    let accounts: Api<ServiceAccount> = env.api();
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "worker"}})).unwrap(),
        )
        .await
        .unwrap();
    let shared = node::shared_dir();
    let log = shared.path().join("log");
    let deployments: Api<Deployment> = env.api();
    deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(deployment("1.30.0", shared.path())).unwrap(),
        )
        .await
        .unwrap();
    let first = rolled_out(&env, "1.30.0").await;
    let binding = bindings.get("arbiter-agent-worker").await.unwrap();
    assert_eq!(
        (
            binding.role_ref.kind.as_str(),
            binding.role_ref.name.as_str()
        ),
        ("Role", "arbiter-agent-worker")
    );
    // The ServiceAccount may renew its own lease, and no other.
    assert!(can(&env, "update", "leases/work"));
    assert!(!can(&env, "update", "leases/other"));
    assert!(can(&env, "create", "leasecandidates.arbiter.dev"));
    // By now the operator has seen the pods, and still made nothing for the forged one.
    forged_bound().await;
    let pods: Api<Pod> = env.api();
    let holder_pod = pods.get(&first).await.unwrap();
    let spec = holder_pod.spec.unwrap();
    assert_eq!(
        spec.init_containers.unwrap()[0].name,
        arbiter::workloads::inject::INIT_CONTAINER
    );
    assert_eq!(
        spec.containers[0].command.as_deref().unwrap(),
        ["/arbiter-bin/arbiter"]
    );

    // A rolling update: the old version leads while any of its pods is left.
    let before_update = read_log(&log).len();
    set_version(&env, "1.31.0").await;
    let leader = rolled_out(&env, "1.31.0").await;
    command_started(&log, before_update, &leader).await;
    let sets = versions(&env).await;
    let update = started_versions(&read_log(&log)[before_update..], &sets);
    // Measured, not asserted (`make bench` measures): how long no command ran.
    eprintln!(
        "injected rolling update: no command ran for at most {:.2} s",
        longest_without_a_command(&read_log(&log)[before_update..])
    );
    let first_new = update.iter().position(|v| v == "1.31.0");
    assert!(
        first_new.is_some_and(|i| update[i..].iter().all(|v| v == "1.31.0")),
        "an old pod led again after a new one: {update:?}"
    );

    // The certificate changes during the test; the pods created from here on are admitted
    // under a rotated one.
    eventually(
        "the webhook certificate to be rotated",
        DEADLINE,
        || async {
            let now = secrets
                .get(&secret)
                .await
                .ok()?
                .data?
                .get("tls.crt")?
                .0
                .clone();
            (now != first_cert).then_some(())
        },
    )
    .await;

    // A rollback: the older version takes over as soon as one of its pods is live.
    let before_rollback = read_log(&log).len();
    set_version(&env, "1.30.0").await;
    let active = rolled_out(&env, "1.30.0").await;
    command_started(&log, before_rollback, &active).await;
    let sets = versions(&env).await;
    let rollback = started_versions(&read_log(&log)[before_rollback..], &sets);
    eprintln!(
        "injected rollback: no command ran for at most {:.2} s",
        longest_without_a_command(&read_log(&log)[before_rollback..])
    );
    assert_eq!(
        rollback.last().map(String::as_str),
        Some("1.30.0"),
        "{rollback:?}"
    );

    // The active pod deleted: its agent stops the command and releases, and another replica's
    // command starts long before the lease could have expired.
    let before_delete = read_log(&log).len();
    pods.delete(&active, &DeleteParams::default())
        .await
        .unwrap();
    // Waiting no longer than the lease: a start within it was handed over, not waited out.
    eventually("another replica's command to start", LEASE, || async {
        read_log(&log)[before_delete..]
            .iter()
            .find_map(|e| match e {
                Entry::Start { id, .. } if *id != active => Some(id.clone()),
                _ => None,
            })
    })
    .await;

    // A pod whose command is its image's entrypoint is refused, with what to do.
    let bare: Pod = serde_json::from_value(json!({
        "metadata": {"name": "bare",
                     "labels": {"arbiter.dev/inject": "true", "app.kubernetes.io/version": "1.0.0"},
                     "annotations": {"arbiter.dev/lease-name": "bare"}},
        "spec": {"containers": [{"name": "c", "image": BUSYBOX_IMAGE}]},
    }))
    .unwrap();
    let refused = pods
        .create(&PostParams::default(), &bare)
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("arbiter.dev/command"),
        "{refused}"
    );

    // No pod of the Deployment was refused (a ReplicaSet reports FailedCreate).
    let events: Api<Event> = env.api();
    let failed: Vec<_> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("FailedCreate"))
        .map(|e| e.message.unwrap_or_default())
        .collect();
    assert!(failed.is_empty(), "pods were refused: {failed:?}");
    // The caBundle trusts the certificate served now.
    let configs: Api<MutatingWebhookConfiguration> = Api::all(env.client.clone());
    let config = configs.get(&format!("{name}-inject")).await.unwrap();
    let bundle = config.webhooks.unwrap()[0]
        .client_config
        .ca_bundle
        .clone()
        .unwrap();
    let ca = secrets.get(&secret).await.unwrap().data.unwrap()["ca.crt"]
        .0
        .clone();
    assert!(
        String::from_utf8_lossy(&bundle.0).contains(String::from_utf8_lossy(&ca).as_ref()),
        "the caBundle does not hold the current CA"
    );

    // The replicas counted what they answered (each counts its own).
    let count = |result: &str| -> f64 {
        let series = format!("arbiter_webhook_admissions_total{{result=\"{result}\"}}");
        operator_ips
            .iter()
            .filter_map(|ip| {
                let out = std::process::Command::new("curl")
                    .args([
                        "-sf",
                        "--max-time",
                        "5",
                        &format!("http://{ip}:8080/metrics"),
                    ])
                    .output()
                    .ok()?;
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                text.lines()
                    .find(|l| l.starts_with(&series))
                    .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            })
            .sum()
    };
    assert!(count("injected") >= 6.0, "{}", count("injected"));
    assert!(count("refused") >= 1.0, "{}", count("refused"));

    // Over the whole test, one command at a time.
    one_at_a_time(&read_log(&log));

    // Without the webhook configuration a labelled pod is created unwrapped: the operator says
    // so on the pod.
    configs
        .delete(&format!("{name}-inject"), &DeleteParams::default())
        .await
        .unwrap();
    let unwrapped: Pod = serde_json::from_value(json!({
        "metadata": {"generateName": "unwrapped-", "labels": {"arbiter.dev/inject": "true"}},
        "spec": {"containers": [{"name": "c", "image": BUSYBOX_IMAGE, "command": ["sleep", "1"]}]},
    }))
    .unwrap();
    // The API server may still call the webhook for a moment after the deletion.
    let created = eventually("a pod created with no webhook", DEADLINE, || async {
        let p = pods.create(&PostParams::default(), &unwrapped).await.ok()?;
        if p.spec.as_ref()?.init_containers.is_some() {
            pods.delete(&p.name_any(), &DeleteParams::default())
                .await
                .ok();
            return None;
        }
        Some(p.name_any())
    })
    .await;
    eventually("a NotInjected Event on it", DEADLINE, || async {
        has_event(&env, "NotInjected", &created).await.then_some(())
    })
    .await;
    crate::chart::uninstall(&env, &release);
}

/// Minimal CRDs for cert-manager's Certificate and Issuer: enough for the API server to take
/// the chart's objects (this machine has no cert-manager; the test plays its part).
fn cert_manager_crd(plural: &str, kind: &str) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.cert-manager.io")},
        "spec": {
            "group": "cert-manager.io", "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.to_lowercase(), "kind": kind},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}],
        },
    })
}

/// `injection.certManager.enabled`: the chart asks cert-manager for the certificate and its CA
/// injector for the `caBundle`; the operator only serves what the Secret holds, and writes
/// neither. The test does what cert-manager would: it issues the certificate the chart's
/// Certificate asks for into its Secret, and puts the CA where the configuration's
/// `cert-manager.io/inject-ca-from` says. A labelled pod is then injected.
async fn with_cert_manager_the_operator_serves_what_the_secret_holds_and_writes_neither(
    env: Arc<TestEnv>,
) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{DynamicObject, GroupVersionKind};
    node::ready(&env).await;
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    for (plural, kind) in [("certificates", "Certificate"), ("issuers", "Issuer")] {
        let crd: CustomResourceDefinition =
            serde_json::from_value(cert_manager_crd(plural, kind)).unwrap();
        let _ = crds.create(&PostParams::default(), &crd).await;
    }
    let certificate_gvk = GroupVersionKind::gvk("cert-manager.io", "v1", "Certificate");
    let (resource, _) = eventually("the Certificate kind to be served", DEADLINE, || async {
        kube::discovery::pinned_kind(&env.client, &certificate_gvk)
            .await
            .ok()
    })
    .await;
    let release = env.release("cm");
    let name = format!("{release}-arbiter");
    let settings: &[&str] = &[
        "--set",
        "injection.certManager.enabled=true",
        "--wait",
        "--timeout",
        "120s",
    ];
    install(&env, &release, &[node::CHART_ON_NODE, settings].concat());

    // cert-manager's part: the certificate the chart's Certificate asks for, into its Secret.
    let certificates: Api<DynamicObject> =
        Api::namespaced_with(env.client.clone(), &env.ns, &resource);
    let certificate = certificates.get(&format!("{name}-webhook")).await.unwrap();
    let secret_name = certificate.data["spec"]["secretName"]
        .as_str()
        .unwrap()
        .to_string();
    let dns = certificate.data["spec"]["dnsNames"][0].as_str().unwrap();
    assert_eq!(dns, format!("{name}-webhook.{}.svc", env.ns));
    let issued = arbiter::operator::webhook::certs::issue(
        &format!("{name}-webhook"),
        &env.ns,
        jiff::Timestamp::now(),
        Duration::from_secs(86_400),
    )
    .unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": secret_name},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": issued.cert_pem, "tls.key": issued.key_pem, "ca.crt": issued.ca_pem},
    }))
    .unwrap();
    let secrets: Api<Secret> = env.api();
    secrets
        .create(
            &PostParams {
                field_manager: Some("cert-manager-certificates-issuing".into()),
                ..Default::default()
            },
            &secret,
        )
        .await
        .unwrap();
    // The CA injector's part: the caBundle of the configuration that asks for it.
    let configs: Api<MutatingWebhookConfiguration> = Api::all(env.client.clone());
    let config = configs.get(&format!("{name}-inject")).await.unwrap();
    assert_eq!(
        config.annotations().get("cert-manager.io/inject-ca-from"),
        Some(&format!("{}/{name}-webhook", env.ns))
    );
    let bundle = k8s_openapi::ByteString(issued.ca_pem.clone().into_bytes());
    let patch =
        json!([{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": bundle}]);
    configs
        .patch(
            &format!("{name}-inject"),
            &PatchParams {
                field_manager: Some("cert-manager-cainjector".into()),
                ..Default::default()
            },
            &Patch::Json::<()>(serde_json::from_value(patch).unwrap()),
        )
        .await
        .unwrap();

    // A labelled pod is injected once the replicas serve the Secret's certificate.
    let pods: Api<Pod> = env.api();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"generateName": "job-",
                     "labels": {"arbiter.dev/inject": "true", "app.kubernetes.io/version": "1.0.0"},
                     "annotations": {"arbiter.dev/lease-name": "job"}},
        "spec": {"containers": [{"name": "c", "image": BUSYBOX_IMAGE, "command": ["sleep", "1"]}]},
    }))
    .unwrap();
    let injected = eventually("a labelled pod admitted", DEADLINE, || async {
        pods.create(&PostParams::default(), &pod).await.ok()
    })
    .await;
    assert_eq!(
        injected.spec.unwrap().init_containers.unwrap()[0].name,
        arbiter::workloads::inject::INIT_CONTAINER
    );
    // The operator wrote neither the Secret nor the caBundle.
    let managers = |m: &Option<
        Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry>,
    >|
     -> Vec<String> {
        m.iter()
            .flatten()
            .filter_map(|e| e.manager.clone())
            .collect()
    };
    let secret = secrets.get(&secret_name).await.unwrap();
    assert!(!managers(&secret.metadata.managed_fields).contains(&"arbiter".to_string()));
    let config = configs.get(&format!("{name}-inject")).await.unwrap();
    assert!(!managers(&config.metadata.managed_fields).contains(&"arbiter".to_string()));
    assert_eq!(
        config.webhooks.unwrap()[0].client_config.ca_bundle,
        Some(k8s_openapi::ByteString(issued.ca_pem.into_bytes()))
    );
    crate::chart::uninstall(&env, &release);
}

/// A pod of ServiceAccount `worker` as the webhook admits it, running for `lease` (created by
/// hand here: no webhook serves this namespace).
fn injected_pod(name: &str, lease: &str) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name,
                     "labels": {"arbiter.dev/inject": "true", "app.kubernetes.io/version": "1.0.0"},
                     "annotations": {"arbiter.dev/lease-name": lease}},
        "spec": {"serviceAccountName": "worker",
                 "containers": [{"name": "c", "image": BUSYBOX_IMAGE, "command": ["sleep", "1"]}]},
    }))
    .unwrap();
    arbiter::workloads::inject::inject(&pod, "arbiter:x")
        .unwrap()
        .unwrap()
}

/// An operator replica that starts acting knows none of the rights its predecessor made: its
/// first writes must never take a lease away from a ServiceAccount whose pods still run for it
/// (a holder that cannot renew stops). Every version of the Role, watched from the start, keeps
/// every lease it granted once, across a failover and a new pod's lease being added.
async fn a_replica_that_starts_acting_never_takes_a_lease_from_a_role(env: Arc<TestEnv>) {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let flags = [
        "--webhook-address",
        "127.0.0.1:0",
        "--inject-image",
        "arbiter:x",
        "--inject-agent-rbac",
    ];
    let accounts: Api<ServiceAccount> = env.api();
    let worker = serde_json::from_value(json!({"metadata": {"name": "worker"}})).unwrap();
    accounts
        .create(&PostParams::default(), &worker)
        .await
        .unwrap();
    let pods: Api<Pod> = env.api();
    for (name, lease) in [("pa", "a"), ("pb", "b")] {
        pods.create(&PostParams::default(), &injected_pod(name, lease))
            .await
            .unwrap();
    }
    let roles: Api<Role> = env.api();
    let versions = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = versions.clone();
    let watching = tokio::spawn(
        watcher(
            roles.clone(),
            watcher::Config::default().fields("metadata.name=arbiter-agent-worker"),
        )
        .applied_objects()
        .for_each(move |r| {
            if let Ok(r) = r {
                seen.lock()
                    .unwrap()
                    .push(arbiter::operator::webhook::binding::granted(&r));
            }
            std::future::ready(())
        }),
    );
    let first = Operator::start(&env, &flags);
    let both: std::collections::BTreeSet<String> = ["a", "b"].map(String::from).into();
    eventually("the Role to grant a and b", DEADLINE, || async {
        (arbiter::operator::webhook::binding::granted(
            &roles.get_opt("arbiter-agent-worker").await.ok()??,
        ) == both)
            .then_some(())
    })
    .await;
    // Killed: the next replica acts once the operator lease expires, and knows nothing.
    drop(first);
    let _second = Operator::start(&env, &flags);
    pods.create(&PostParams::default(), &injected_pod("pc", "c"))
        .await
        .unwrap();
    let all: std::collections::BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
    eventually("the Role to grant c too", DEADLINE, || async {
        (arbiter::operator::webhook::binding::granted(
            &roles.get_opt("arbiter-agent-worker").await.ok()??,
        ) == all)
            .then_some(())
    })
    .await;
    watching.abort();
    let versions = versions.lock().unwrap().clone();
    let granted_once = versions.iter().position(|v| v.is_superset(&both)).unwrap();
    for v in &versions[granted_once..] {
        assert!(
            v.is_superset(&both),
            "a version took a lease away: {versions:?}"
        );
    }
}

/// Deployment `work` of `replicas` created with no webhook configuration (every pod runs its
/// command unwrapped, logging under its pod's name), and the ServiceAccount it runs as.
async fn unwrapped_work(env: &TestEnv, replicas: i32, shared: &Path) {
    let accounts: Api<ServiceAccount> = env.api();
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "worker"}})).unwrap(),
        )
        .await
        .unwrap();
    let mut work = deployment("1.30.0", shared);
    work["spec"]["replicas"] = json!(replicas);
    let script = &mut work["spec"]["template"]["spec"]["containers"][0]["command"][2];
    *script = script
        .as_str()
        .unwrap()
        .replace(
            "$ARBITER_IDENTITY $ARBITER_TERM",
            "${ARBITER_IDENTITY:-$HOSTNAME} ${ARBITER_TERM:-0}",
        )
        .replace(
            "\"stop $ARBITER_IDENTITY",
            "\"stop ${ARBITER_IDENTITY:-$HOSTNAME}",
        )
        .into();
    let deployments: Api<Deployment> = env.api();
    deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(work).unwrap(),
        )
        .await
        .unwrap();
    let log = shared.join("log");
    eventually("the unwrapped commands to run", ROLLOUT, || async {
        let counts = running_counts(&read_log(&log));
        (counts.last().map(|c| c.1) == Some(replicas as usize)).then_some(())
    })
    .await;
}

/// An unwrapped pod whose eviction a PodDisruptionBudget refuses holds its lease although a
/// wrapped replica is alive; force-deleted (no kubelet report that its command stopped), it
/// still holds it for a lease duration and a minute, and only then is the wrapped one elected.
async fn a_force_deleted_unwrapped_pod_holds_its_lease_until_it_could_have_stopped(
    env: Arc<TestEnv>,
) {
    node::ready(&env).await;
    let shared = node::shared_dir();
    unwrapped_work(&env, 2, shared.path()).await;
    let pdbs: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> = env.api();
    pdbs.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "work"},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "work"}}},
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    let pods: Api<Pod> = env.api();
    let unwrapped: Vec<String> = pods
        .list(&ListParams::default().labels("app=work"))
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    let release = env.release("frc");
    install(
        &env,
        &release,
        &[node::CHART_ON_NODE, &["--wait", "--timeout", "120s"]].concat(),
    );
    // One goes by hand: its replacement is wrapped, and alive.
    pods.delete(&unwrapped[0], &DeleteParams::default())
        .await
        .unwrap();
    let kept = &unwrapped[1];
    eventually(
        "the eviction of the last unwrapped pod to be refused",
        DEADLINE,
        || async { (has_event(&env, "UnwrappedEvictionRefused", kept).await).then_some(()) },
    )
    .await;
    let leases: Api<Lease> = env.api();
    let holder = |l: Option<Lease>| {
        l.and_then(|l| l.spec?.holder_identity)
            .filter(|h| !h.is_empty())
    };
    assert_eq!(
        holder(leases.get_opt("work").await.unwrap()),
        None,
        "a wrapped replica was elected while {kept} ran its command unwrapped:\n{}",
        state(&env).await
    );
    let forced = std::time::Instant::now();
    pods.delete(
        kept,
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    let elected = eventually("a wrapped replica to be elected", DEADLINE * 2, || async {
        holder(leases.get_opt("work").await.ok()?)
    })
    .await;
    let after = forced.elapsed();
    // The chart's lease duration (15 s) and a minute.
    assert!(
        after >= Duration::from_secs(75),
        "{elected} was elected {after:?} after {kept} was force-deleted, with nothing to prove its command stopped"
    );
}

/// Whether the test's namespace has an Event with `reason` on the object named `name`.
async fn has_event(env: &TestEnv, reason: &str, name: &str) -> bool {
    let events: Api<Event> = env.api();
    let listed = events.list(&ListParams::default()).await;
    listed.map(|l| l.items).unwrap_or_default().iter().any(|e| {
        e.reason.as_deref() == Some(reason) && e.involved_object.name.as_deref() == Some(name)
    })
}

/// The node's uptime (the clock the workloads log on: the real node is this machine).
fn uptime() -> f64 {
    let text = std::fs::read_to_string("/proc/uptime").unwrap();
    text.split_whitespace().next().unwrap().parse().unwrap()
}

/// After each entry of `entries`: its time (a start's or a stop's) and how many commands run.
fn running_counts(entries: &[Entry]) -> Vec<(f64, usize)> {
    let mut running = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for e in entries {
        match e {
            Entry::Start { id, at, .. } => {
                running.insert(id.clone());
                out.push((*at, running.len()));
            }
            Entry::Stop { id, at } => {
                running.remove(id);
                out.push((*at, running.len()));
            }
            Entry::Child { .. } => {}
        }
    }
    out
}

/// A Deployment applied before the chart: its three labelled pods were created with no webhook
/// configuration, so all three run the command unwrapped. Once the chart is installed, the
/// acting operator evicts them one at a time (their ReplicaSet creates them again, wrapped) and
/// holds the lease's election while any runs: within one lease duration at most one command
/// runs, and never more after, through a rolling update started meanwhile.
async fn pods_created_before_the_webhook_are_evicted_down_to_one_command(env: Arc<TestEnv>) {
    node::ready(&env).await;
    let shared = node::shared_dir();
    let log = shared.path().join("log");
    unwrapped_work(&env, 3, shared.path()).await;

    let release = env.release("unw");
    install(
        &env,
        &release,
        &[node::CHART_ON_NODE, &["--wait", "--timeout", "120s"]].concat(),
    );
    let installed = uptime();
    // The chart's lease duration (15 s): by then at most one command runs.
    let lease_duration = 15.0;
    eventually("at most one command to run", DEADLINE, || async {
        let counts = running_counts(&read_log(&log));
        (counts.last().map(|c| c.1) <= Some(1)).then_some(())
    })
    .await;
    // A rolling update while the last unwrapped pod may still run.
    set_version(&env, "1.31.0").await;
    rolled_out(&env, "1.31.0").await;

    let entries = read_log(&log);
    let counts = running_counts(&entries);
    let first_one = counts
        .iter()
        .position(|(at, n)| *at >= installed - 0.5 && *n <= 1)
        .unwrap_or_else(|| panic!("never down to one command: {entries:#?}"));
    let (at, _) = counts[first_one];
    assert!(
        at - installed <= lease_duration,
        "one command ran only {:.1} s after the chart was installed (more than a lease duration): {entries:#?}\n{}",
        at - installed,
        state(&env).await
    );
    if let Some((at, n)) = counts[first_one..].iter().find(|(_, n)| *n > 1) {
        panic!(
            "{n} commands ran at {at} after one alone had run: {entries:#?}\n{}",
            state(&env).await
        );
    }
    // What was done is said: an Event on each evicted pod, and the metric.
    let events: Api<Event> = env.api();
    let evicted = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("UnwrappedEvicted"))
        .count();
    assert!(
        evicted >= 1,
        "an UnwrappedEvicted Event:\n{}",
        state(&env).await
    );
}
