//! The Helm chart with the real `helm` CLI against the real control plane: lint, render drift,
//! install/upgrade/uninstall, and least-privilege RBAC proven by running the operator with the
//! chart's ServiceAccount token.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arbiter::api::OLDEST_EMULATION_VERSION as OEV;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
use kube::api::{Api, ListParams};

use crate::support::operator::{Operator, Responder, create_candidate, wait_for_holder};
use crate::support::{TestEnv, eventually, repo_root};

crate::tests![chart:
    lint_is_clean,
    the_schema_refuses_lease_durations_that_are_not_whole_seconds,
    the_namespace_selector_renders_into_the_flag_and_the_rbac,
    manifests_match_the_chart,
    crd_template_matches_the_generated_crd,
    install_upgrade_uninstall,
    operator_works_with_the_charts_service_account,
    a_missing_rbac_rule_fails_with_a_readable_error,
    the_chart_follows_the_conventions_of_other_charts,
    the_charts_agent_role_is_all_an_agent_needs,
    every_alert_has_a_promtool_test,
    the_dashboard_loads_and_queries_only_metrics_the_operator_exposes,
];

const DEADLINE: Duration = Duration::from_secs(60);

/// The helm binary `e2e/cluster.sh build` made.
fn helm() -> PathBuf {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| {
        let out = std::process::Command::new(repo_root().join("e2e/cluster.sh"))
            .arg("build")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cluster.sh build: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()).join("helm")
    })
    .clone()
}

pub(crate) fn chart() -> PathBuf {
    repo_root().join("charts/arbiter")
}

/// Runs helm with `args`, asserting success; returns stdout.
/// The Kubernetes version `helm template` renders for (the chart's minimum, `kubeVersion` in
/// Chart.yaml). A helm built from source without release ldflags assumes v1.20.
pub const KUBE_VERSION: &str = "1.33.0";

/// `helm ARGS`, with `--kube-version` after `template`.
fn helm_command(args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new(helm());
    cmd.args(args);
    if args.first() == Some(&"template") {
        cmd.args(["--kube-version", KUBE_VERSION]);
    }
    cmd
}

pub(crate) fn run_helm(kubeconfig: Option<&Path>, args: &[&str]) -> String {
    let mut cmd = helm_command(args);
    let dir = tempfile::tempdir().unwrap();
    // Keep helm's own state out of $HOME.
    cmd.env("HELM_CACHE_HOME", dir.path())
        .env("HELM_CONFIG_HOME", dir.path())
        .env("HELM_DATA_HOME", dir.path());
    if let Some(k) = kubeconfig {
        cmd.env("KUBECONFIG", k);
    }
    let out = cmd.output().expect("running helm");
    assert!(
        out.status.success(),
        "helm {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

async fn lint_is_clean(_env: Arc<TestEnv>) {
    let out = run_helm(None, &["lint", "--strict", chart().to_str().unwrap()]);
    assert!(out.contains("0 chart(s) failed"), "{out}");
    assert!(
        !out.contains("[WARNING]") && !out.contains("[ERROR]"),
        "{out}"
    );
}

/// `leaseDurationSeconds` holds whole seconds: the chart refuses anything else at install time
/// (the operator would refuse it at start, exit 2).
async fn the_schema_refuses_lease_durations_that_are_not_whole_seconds(_env: Arc<TestEnv>) {
    let chart = chart();
    for value in [
        "operator.leaseDuration=2500ms",
        "operator.ha.leaseDuration=0s",
    ] {
        let out = helm_command(&["template", "x", chart.to_str().unwrap(), "--set", value])
            .env("HELM_CACHE_HOME", "/tmp")
            .output()
            .expect("running helm");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{value} was accepted");
        assert!(stderr.contains("leaseDuration"), "{value}: {stderr}");
    }
    template(&["operator.leaseDuration=20s"], None);
}

/// `operator.namespaceSelector` (a LabelSelector) becomes the operator's
/// `--namespace-selector`, which the API server reads as that LabelSelector; the operator may
/// list and watch Namespaces; the webhook is not scoped by it (a pod made while its namespace
/// does not match must not start unwrapped); combining it with watchNamespaces fails to render.
async fn the_namespace_selector_renders_into_the_flag_and_the_rbac(env: Arc<TestEnv>) {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{Patch, PatchParams};
    let sets = [
        "injection.enabled=true",
        "operator.namespaceSelector.matchLabels.e2e\\.arbiter\\.dev/chart=yes",
        "operator.namespaceSelector.matchExpressions[0].key=e2e.arbiter.dev/tier",
        "operator.namespaceSelector.matchExpressions[0].operator=In",
        "operator.namespaceSelector.matchExpressions[0].values={prod,staging}",
        "operator.namespaceSelector.matchExpressions[1].key=e2e.arbiter.dev/legacy",
        "operator.namespaceSelector.matchExpressions[1].operator=DoesNotExist",
    ];
    let out = template(&sets, None);
    let flag = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("- \"--namespace-selector="))
        .and_then(|l| l.strip_suffix('"'))
        .unwrap_or_else(|| panic!("no --namespace-selector:\n{out}"));
    assert_eq!(
        flag,
        "e2e.arbiter.dev/chart=yes,e2e.arbiter.dev/tier in (prod,staging),!e2e.arbiter.dev/legacy"
    );
    assert!(out.contains("resources: [\"namespaces\"]"), "{out}");
    let webhook = template(&sets, Some("templates/webhook.yaml"));
    assert!(!webhook.contains("namespaceSelector:"), "{webhook}");
    // The API server reads the flag as the LabelSelector: this test's namespace matches once
    // labelled so, and not with the legacy label.
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    let selected = || async {
        let list = namespaces
            .list_metadata(&ListParams::default().labels(flag))
            .await
            .expect("the API server accepts the rendered selector");
        list.items
            .iter()
            .any(|n| n.metadata.name.as_deref() == Some(&env.ns))
    };
    assert!(!selected().await);
    let label = |labels: serde_json::Value| {
        let patch = serde_json::json!({"metadata": {"labels": labels}});
        let namespaces = namespaces.clone();
        let ns = env.ns.clone();
        async move {
            namespaces
                .patch(&ns, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
        }
    };
    label(serde_json::json!({"e2e.arbiter.dev/chart": "yes", "e2e.arbiter.dev/tier": "prod"}))
        .await;
    assert!(selected().await);
    label(serde_json::json!({"e2e.arbiter.dev/legacy": "1"})).await;
    assert!(!selected().await);

    let both = helm_command(&[
        "template",
        "x",
        chart().to_str().unwrap(),
        "--set",
        "operator.watchNamespaces={a}",
        "--set",
        sets[1],
    ])
    .env("HELM_CACHE_HOME", "/tmp")
    .output()
    .expect("running helm");
    assert!(!both.status.success());
    assert!(
        String::from_utf8_lossy(&both.stderr).contains("cannot be combined"),
        "{}",
        String::from_utf8_lossy(&both.stderr)
    );
}

async fn manifests_match_the_chart(_env: Arc<TestEnv>) {
    let rendered = arbiter_manifests();
    let committed = std::fs::read_to_string(repo_root().join("manifests/arbiter.yaml")).unwrap();
    assert!(
        committed == rendered,
        "manifests/arbiter.yaml is stale: run `make manifests` and commit it"
    );
}

/// What `make manifests` writes: the namespace, then the chart rendered with default values.
fn arbiter_manifests() -> String {
    let out = std::process::Command::new("make")
        .args(["--no-print-directory", "-s", "render-manifests"])
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "make render-manifests: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

async fn crd_template_matches_the_generated_crd(_env: Arc<TestEnv>) {
    let rendered = template(&[], Some("templates/crd.yaml"));
    let doc: serde_json::Value =
        serde_yaml_ng::from_str(rendered.trim_start_matches("---").trim()).unwrap();
    let generated: serde_json::Value =
        serde_json::to_value(<arbiter::api::LeaseCandidate as kube::CustomResourceExt>::crd())
            .unwrap();
    assert_eq!(doc["spec"], generated["spec"]);
    assert_eq!(
        doc["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
}

/// `helm install RELEASE` of the chart into the test's namespace, the operator watching only
/// that namespace and the CRD left to the suite, with `extra` arguments.
pub(crate) fn install(env: &TestEnv, release: &str, extra: &[&str]) {
    let chart = chart();
    let watch = format!("operator.watchNamespace={}", env.ns);
    let mut args = vec![
        "install",
        release,
        chart.to_str().unwrap(),
        "-n",
        &env.ns,
        "--set",
        "crds.install=false",
        "--set",
        &watch,
    ];
    args.extend_from_slice(extra);
    run_helm(Some(&env.kubeconfig), &args);
}

/// `helm uninstall RELEASE --wait` from the test's namespace.
pub(crate) fn uninstall(env: &TestEnv, release: &str) {
    let args = [
        "uninstall",
        release,
        "-n",
        &env.ns,
        "--wait",
        "--timeout",
        "60s",
    ];
    run_helm(Some(&env.kubeconfig), &args);
}

async fn install_upgrade_uninstall(env: Arc<TestEnv>) {
    let chart = chart();
    let chart = chart.to_str().unwrap();
    let kc = Some(env.kubeconfig.as_path());
    // On the kwok node a pod only looks Running, so the uninstall hook's Job would never end:
    // the hook is proven on the real node (real_node.rs).
    install(
        &env,
        "arb",
        &[
            "--wait",
            "--timeout",
            "60s",
            "--set",
            "uninstallHook.enabled=false",
        ],
    );
    let deployments: Api<Deployment> = env.api();
    let d = deployments.get("arb-arbiter").await.unwrap();
    assert_eq!(d.spec.as_ref().unwrap().replicas, Some(2));
    let pod_spec = d.spec.unwrap().template.spec.unwrap();
    let sc = pod_spec.containers[0].security_context.clone().unwrap();
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(
        pod_spec.security_context.unwrap().run_as_non_root,
        Some(true)
    );
    let pods: Api<Pod> = env.api();
    let running = pods
        .list(&ListParams::default().labels("app.kubernetes.io/instance=arb"))
        .await
        .unwrap();
    assert_eq!(running.items.len(), 2);
    let pdbs: Api<PodDisruptionBudget> = env.api();
    assert!(pdbs.get_opt("arb-arbiter").await.unwrap().is_some());
    let roles: Api<Role> = env.api();
    let role = roles.get("arb-arbiter").await.unwrap();
    for rule in role.rules.unwrap_or_default() {
        assert!(
            !rule.verbs.contains(&"*".to_string()),
            "wildcard verb in {rule:?}"
        );
        assert!(
            !rule
                .resources
                .unwrap_or_default()
                .contains(&"*".to_string()),
            "wildcard resource"
        );
    }

    run_helm(
        kc,
        &[
            "upgrade",
            "arb",
            chart,
            "-n",
            &env.ns,
            "--reuse-values",
            "--set",
            "replicaCount=3",
            "--wait",
            "--timeout",
            "60s",
        ],
    );
    let replicas = eventually("3 replicas after upgrade", DEADLINE, || async {
        let d = deployments.get("arb-arbiter").await.ok()?;
        (d.spec?.replicas == Some(3)).then_some(3)
    })
    .await;
    assert_eq!(replicas, 3);

    run_helm(
        kc,
        &[
            "uninstall",
            "arb",
            "-n",
            &env.ns,
            "--wait",
            "--timeout",
            "60s",
        ],
    );
    assert!(deployments.get_opt("arb-arbiter").await.unwrap().is_none());
    assert!(roles.get_opt("arb-arbiter").await.unwrap().is_none());
    // The agents' ClusterRole is kept (agentRbac.keep): agents bound to it keep their rights.
    let cluster_roles: Api<ClusterRole> = Api::all(env.client.clone());
    let kept = "arb-arbiter-candidate";
    assert!(
        cluster_roles.get_opt(kept).await.unwrap().is_some(),
        "{kept} is kept on uninstall"
    );
    cluster_roles
        .delete(kept, &Default::default())
        .await
        .unwrap();
}

/// A kubeconfig for the chart's ServiceAccount `sa` (a real, RBAC-limited token).
async fn service_account_kubeconfig(env: &TestEnv, sa: &str, dir: &Path) -> PathBuf {
    crate::support::service_account_kubeconfig(&env.client, &env.kubeconfig, &env.ns, sa, dir).await
}

async fn operator_works_with_the_charts_service_account(env: Arc<TestEnv>) {
    install(&env, "rbac", &[]);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = service_account_kubeconfig(&env, "rbac-arbiter", dir.path()).await;
    // The chart's operator, as a local process with the chart's identity and flags.
    let _op = Operator::start_with(
        &kubeconfig,
        &env.ns,
        &[
            "--leader-election-lease",
            "rbac-arbiter",
            "--lease-duration",
            "3s",
        ],
    );
    let _r = Responder::start(env.client.clone(), &env.ns, &["c1", "c2"]);
    create_candidate(&env, "c1", "core", "1.31.0", Some("1.31.0"), OEV, None).await;
    wait_for_holder(&env, "core", "c1", DEADLINE).await;
    // Events were written with the ServiceAccount's rights.
    crate::support::wait_for_event(&env, "c1", "Elected", DEADLINE).await;
    // Handover request, then (nobody renews) expiry and a new term: writes on an existing lease.
    create_candidate(&env, "c2", "core", "1.30.0", Some("1.30.0"), OEV, None).await;
    let l = wait_for_holder(&env, "core", "c2", DEADLINE).await;
    assert!(arbiter::lease::term(&l) >= 2);
    crate::operator::lapsed_holder_is_evicted(&env, "evict").await;
}

async fn a_missing_rbac_rule_fails_with_a_readable_error(env: Arc<TestEnv>) {
    // Render the chart's RBAC for this namespace, drop the pods/eviction rule, apply it.
    let ns_value = format!("operator.watchNamespace={}", env.ns);
    let rendered = run_helm(
        None,
        &[
            "template",
            "norbac",
            chart().to_str().unwrap(),
            "-n",
            &env.ns,
            "--set",
            &ns_value,
        ],
    );
    let mut kept = Vec::new();
    for doc in rendered.split("\n---") {
        let mut value: serde_json::Value = match serde_yaml_ng::from_str(doc) {
            Ok(v) => v,
            Err(_) => continue,
        };
        match value["kind"].as_str() {
            Some("Role") if value["metadata"]["name"] == "norbac-arbiter" => {
                let rules = value["rules"].as_array_mut().unwrap();
                let before = rules.len();
                rules.retain(|r| r["resources"][0] != "pods/eviction");
                assert_eq!(
                    rules.len(),
                    before - 1,
                    "the chart has a pods/eviction rule to remove"
                );
            }
            Some("ServiceAccount" | "RoleBinding" | "Role") => {}
            _ => continue,
        }
        kept.push(serde_yaml_ng::to_string(&value).unwrap());
    }
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), kept.join("---\n")).unwrap();
    let out = std::process::Command::new("kubectl")
        .args(["apply", "-n", &env.ns, "-f", file.path().to_str().unwrap()])
        .env("KUBECONFIG", &env.kubeconfig)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = service_account_kubeconfig(&env, "norbac-arbiter", dir.path()).await;
    let _op = Operator::start_with(
        &kubeconfig,
        &env.ns,
        &[
            "--leader-election-lease",
            "norbac-arbiter",
            "--lease-duration",
            "3s",
        ],
    );
    // The named scenario: forcing out a lapsed holder. Without the rule it fails, and says why.
    let message = crate::operator::lapsed_holder_eviction_fails(&env, "noevict").await;
    assert!(
        message.contains("forbidden") && message.contains("pods/eviction"),
        "{message}"
    );
}

/// `helm template x CHART --set SETS... [--show-only TEMPLATE]` (release `x`, namespace
/// `default`).
fn template(sets: &[&str], show_only: Option<&str>) -> String {
    let chart = chart();
    let mut args = vec!["template", "x", chart.to_str().unwrap()];
    for s in sets {
        args.extend(["--set", s]);
    }
    if let Some(t) = show_only {
        args.extend(["--show-only", t]);
    }
    run_helm(None, &args)
}

/// The kinds `helm template` renders with `sets`, in order, and the whole output.
fn rendered_kinds(sets: &[&str]) -> (Vec<String>, String) {
    let out = template(sets, None);
    let kinds = out
        .lines()
        .filter_map(|l| l.strip_prefix("kind: "))
        .map(str::to_string)
        .collect();
    (kinds, out)
}

/// What users of other charts take for granted: no budget that blocks drains at one replica, no
/// ServiceMonitor without the Service it scrapes, refuseSkew refused without maxSkew (it would
/// render and then exit at start), the usual overrides, replicas spread across nodes, a `helm
/// test` hook, and `global` accepted so the chart works as a subchart.
async fn the_chart_follows_the_conventions_of_other_charts(_env: Arc<TestEnv>) {
    let count = |kinds: &[String], kind: &str| kinds.iter().filter(|k| *k == kind).count();
    let (one, _) = rendered_kinds(&["replicaCount=1"]);
    assert_eq!(
        count(&one, "PodDisruptionBudget"),
        0,
        "a PDB at one replica"
    );
    let (two, out) = rendered_kinds(&[]);
    assert_eq!(count(&two, "PodDisruptionBudget"), 1);
    assert!(out.contains("topologyKey: kubernetes.io/hostname"), "{out}");
    let (no_service, _) = rendered_kinds(&["serviceMonitor.enabled=true", "service.enabled=false"]);
    assert_eq!(count(&no_service, "ServiceMonitor"), 0);
    let (monitored, _) = rendered_kinds(&["serviceMonitor.enabled=true"]);
    assert_eq!(count(&monitored, "ServiceMonitor"), 1);

    let refused = helm_command(&[
        "template",
        "x",
        chart().to_str().unwrap(),
        "--set",
        "operator.refuseSkew=true",
    ])
    .env("HELM_CACHE_HOME", "/tmp")
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("maxSkew"),
        "{stderr}"
    );
    rendered_kinds(&["operator.refuseSkew=true", "operator.maxSkew=1"]);

    let (_, out) = rendered_kinds(&[
        "fullnameOverride=elector",
        "extraArgs[0]=--max-skew=2",
        "extraEnv[0].name=EXTRA",
        "extraEnv[0].value=yes",
        "securityContext.readOnlyRootFilesystem=false",
    ]);
    for expected in [
        "name: elector\n",
        "- \"--max-skew=2\"",
        "name: EXTRA",
        "readOnlyRootFilesystem: false",
    ] {
        assert!(out.contains(expected), "{expected:?} not rendered:\n{out}");
    }
    // The aggregation of candidate rights into `edit` and `admin` can be turned off.
    let (_, aggregated) = rendered_kinds(&[]);
    assert!(aggregated.contains("rbac.authorization.k8s.io/aggregate-to-edit: \"true\""));
    let (_, alone) = rendered_kinds(&["agentRbac.aggregateToEdit=false"]);
    assert!(!alone.contains("aggregate-to-edit"), "{alone}");
    assert!(
        alone.contains("aggregate-to-view"),
        "viewers still see candidates"
    );
    // `helm test`: a hook pod asking the metrics Service for /readyz.
    let (_, out) = rendered_kinds(&[]);
    assert!(
        out.contains("helm.sh/hook: test")
            && out.contains("x-arbiter-metrics.default.svc:8080/readyz"),
        "{out}"
    );

    // As a subchart of an umbrella chart, with the parent's `global` values.
    let dir = tempfile::tempdir().unwrap();
    let umbrella = dir.path().join("umbrella");
    std::fs::create_dir_all(umbrella.join("charts")).unwrap();
    std::fs::write(
        umbrella.join("Chart.yaml"),
        "apiVersion: v2\nname: umbrella\nversion: 0.1.0\n",
    )
    .unwrap();
    std::fs::write(
        umbrella.join("values.yaml"),
        "global:\n  imageRegistry: registry.example.com\narbiter:\n  replicaCount: 3\n",
    )
    .unwrap();
    let copy = std::process::Command::new("cp")
        .args([
            "-r",
            chart().to_str().unwrap(),
            umbrella.join("charts/arbiter").to_str().unwrap(),
        ])
        .status()
        .unwrap();
    assert!(copy.success());
    let out = run_helm(None, &["template", "u", umbrella.to_str().unwrap()]);
    assert!(out.contains("replicas: 3"), "{out}");
}

/// The chart's agent ClusterRole, bound in a namespace to a ServiceAccount, is all an agent
/// needs: it registers, is elected, runs its workload, and on SIGTERM releases and withdraws.
async fn the_charts_agent_role_is_all_an_agent_needs(env: Arc<TestEnv>) {
    use crate::support::agent::{Agent, agent_args, wait_started};
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding};
    use kube::api::PostParams;
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    // The agent role, rendered by the chart under a name of this test's own.
    let name = format!("{}-agent", env.ns);
    let fullname = format!("fullnameOverride={name}");
    let rendered = template(&[&fullname], Some("templates/agent-rbac.yaml"));
    let roles: Api<ClusterRole> = Api::all(env.client.clone());
    let role_name = format!("{name}-candidate");
    let doc = rendered
        .split("\n---")
        .find(|d| d.contains(&format!("name: {role_name}")))
        .expect("the candidate ClusterRole");
    let role: ClusterRole = serde_yaml_ng::from_str(doc).unwrap();
    roles.create(&PostParams::default(), &role).await.unwrap();
    let sas: Api<ServiceAccount> = env.api();
    let sa: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "agent"}})).unwrap();
    sas.create(&PostParams::default(), &sa).await.unwrap();
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "agent"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
        "subjects": [{"kind": "ServiceAccount", "name": "agent", "namespace": env.ns}],
    }))
    .unwrap();
    let bindings: Api<RoleBinding> = env.api();
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();

    let _op = Operator::start(&env, &["--lease-duration", "10s"]);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = service_account_kubeconfig(&env, "agent", dir.path()).await;
    let log = dir.path().join("workload.log");
    let args = agent_args(&env.ns, "a1", "rbac", "1.30.0", &log);
    let mut agent = Agent::spawn_args(&kubeconfig, "a1", &args, &log);
    wait_for_holder(&env, "rbac", "a1", DEADLINE).await;
    wait_started(&log, "a1").await;
    kill(Pid::from_raw(agent.pid()), Signal::SIGTERM).unwrap();
    assert_eq!(agent.wait_exit(DEADLINE).await, Some(0));
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = env.api();
    let l = leases.get("rbac").await.unwrap();
    assert_eq!(
        arbiter::lease::holder(&l),
        None,
        "released with the role's rights"
    );
    let candidates: Api<arbiter::api::LeaseCandidate> = env.api();
    assert!(
        candidates.get_opt("a1").await.unwrap().is_none(),
        "withdrawn with the role's rights"
    );
    let _ = roles.delete(&role_name, &Default::default()).await;
}

/// The chart's PrometheusRule: `promtool check rules` accepts it whole (annotation templates
/// included), `promtool test rules` passes e2e/alerts/tests.yaml against its expressions, and
/// every alert has a case there in which it fires. promtool is built from its Go module
/// (`e2e/cluster.sh promtool`, cached by version).
async fn every_alert_has_a_promtool_test(_env: Arc<TestEnv>) {
    let built = std::process::Command::new(repo_root().join("e2e/cluster.sh"))
        .arg("promtool")
        .output()
        .expect("running e2e/cluster.sh promtool");
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let promtool = String::from_utf8(built.stdout).unwrap().trim().to_string();
    let rendered = template(
        &["prometheusRule.enabled=true"],
        Some("templates/prometheusrule.yaml"),
    );
    let doc: serde_json::Value = serde_yaml_ng::from_str(&rendered).unwrap();
    let mut spec = doc["spec"].clone();
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(&promtool)
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    std::fs::write(
        dir.path().join("full.yaml"),
        serde_yaml_ng::to_string(&spec).unwrap(),
    )
    .unwrap();
    run(&["check", "rules", "full.yaml"]);
    let mut alerts = Vec::new();
    for rule in spec["groups"][0]["rules"].as_array_mut().unwrap() {
        alerts.push(rule["alert"].as_str().unwrap().to_string());
        rule.as_object_mut().unwrap().remove("annotations");
    }
    assert!(alerts.len() >= 6, "{alerts:?}");
    std::fs::write(
        dir.path().join("rules.yaml"),
        serde_yaml_ng::to_string(&spec).unwrap(),
    )
    .unwrap();
    let tests = std::fs::read_to_string(repo_root().join("e2e/alerts/tests.yaml")).unwrap();
    std::fs::write(dir.path().join("tests.yaml"), &tests).unwrap();
    run(&["test", "rules", "tests.yaml"]);
    // Every alert fires in some case.
    let cases: serde_json::Value = serde_yaml_ng::from_str(&tests).unwrap();
    let firing: Vec<&str> = cases["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap())
        .filter(|a| a["exp_alerts"].as_array().is_some_and(|e| !e.is_empty()))
        .filter_map(|a| a["alertname"].as_str())
        .collect();
    for alert in &alerts {
        assert!(
            firing.contains(&alert.as_str()),
            "{alert} has no firing case in e2e/alerts/tests.yaml"
        );
    }
}

/// The Grafana dashboard: valid JSON, rendered unchanged into its ConfigMap, and every query
/// names only metrics the operator exposes (the metric table of docs/reference/observability.md, which
/// `operator::the_docs_list_every_metric_the_operator_exposes` checks against /metrics).
async fn the_dashboard_loads_and_queries_only_metrics_the_operator_exposes(_env: Arc<TestEnv>) {
    let text = std::fs::read_to_string(chart().join("files/dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert_eq!(dashboard["uid"], "arbiter-overview");
    let panels = dashboard["panels"].as_array().unwrap();
    let mut ids: Vec<u64> = panels.iter().map(|p| p["id"].as_u64().unwrap()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), panels.len(), "panel ids are unique");
    fn exprs(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr" | "query", serde_json::Value::String(e)) => out.push(e.clone()),
                        _ => exprs(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| exprs(v, out)),
            _ => {}
        }
    }
    let mut queries = Vec::new();
    exprs(&dashboard, &mut queries);
    assert!(queries.len() > 10, "{queries:?}");
    let listed = crate::support::documented_metrics();
    let known = |m: &str| {
        listed.iter().any(|l| {
            m == l.name
                || (l.kind == "histogram"
                    && ["_bucket", "_sum", "_count"]
                        .iter()
                        .any(|s| m.strip_suffix(s) == Some(l.name.as_str())))
        })
    };
    for q in &queries {
        let mut rest = q.as_str();
        while let Some(i) = rest.find("arbiter_") {
            let m: String = rest[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                known(&m),
                "{m} (in {q:?}) is not a metric the operator exposes"
            );
            rest = &rest[i + m.len()..];
        }
    }
    // The ConfigMap carries the file unchanged.
    let rendered = template(
        &["grafana.dashboards.enabled=true"],
        Some("templates/grafana-dashboard.yaml"),
    );
    let cm: serde_json::Value = serde_yaml_ng::from_str(&rendered).unwrap();
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let carried: serde_json::Value =
        serde_json::from_str(cm["data"]["arbiter.json"].as_str().unwrap()).unwrap();
    assert_eq!(carried, dashboard);
}
