//! Many teams, one operator: per-namespace limits and the namespaces an install arbitrates.

use std::sync::Arc;
use std::time::Duration;

use arbiter::api::{LeaseCandidate, OLDEST_EMULATION_VERSION as OEV};
use arbiter::lease;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};

use crate::support::operator::{Operator, Responder, condition, create_candidate, wait_for_holder};
use crate::support::{TestEnv, eventually, wait_for_event};

crate::tests![tenants:
    a_namespace_over_its_limits_gets_limit_exceeded_and_nothing_else_changes,
    an_operator_watching_two_namespaces_ignores_a_third,
    the_documented_lease_writers_policy_lets_only_the_leases_account_write_its_candidates,
    two_installs_with_disjoint_instances_never_write_the_same_lease,
    a_namespace_selector_arbitrates_only_matching_namespaces_as_their_labels_change,
];

const DEADLINE: Duration = Duration::from_secs(40);

/// Another namespace for the test, `ENV-suffix`; its TestEnv (deleted with [`drop_namespace`]).
async fn another_namespace(env: &TestEnv, suffix: &str) -> TestEnv {
    let ns = format!("{}-{suffix}", env.ns);
    crate::support::create_namespace(&env.client, &ns).await;
    TestEnv {
        client: env.client.clone(),
        ns,
        kubeconfig: env.kubeconfig.clone(),
    }
}

async fn drop_namespace(other: TestEnv) {
    other.cleanup().await;
}

/// `--watch-namespaces a,b`, with this test's own HA lease namespace and extra flags.
fn operator_for(env: &TestEnv, namespaces: &[&TestEnv], extra: &[&str]) -> Operator {
    let list = namespaces
        .iter()
        .map(|e| e.ns.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let mut args = vec![
        "--namespace",
        &env.ns,
        "--watch-namespaces",
        &list,
        "--metrics-address",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    Operator::start_args(&env.kubeconfig, &args)
}

/// Namespace A may have 3 candidates naming 2 leases. A fourth candidate, for a third lease, is
/// refused with `LimitExceeded` (a condition and a Warning Event) and gets no Lease; A's other
/// leases go on (a failover within the limit), and so does namespace B, which has limits of its
/// own. Once a candidate of A is deleted, the refused one is admitted and elected.
async fn a_namespace_over_its_limits_gets_limit_exceeded_and_nothing_else_changes(
    env: Arc<TestEnv>,
) {
    let b = another_namespace(&env, "b").await;
    let _op = operator_for(
        &env,
        &[&env, &b],
        &[
            "--max-candidates-per-namespace",
            "3",
            "--max-leases-per-namespace",
            "2",
            "--lease-duration",
            "5s",
        ],
    );
    let ra = Responder::start(env.client.clone(), &env.ns, &["a1", "a2", "y1", "w1"]);
    let _rb = Responder::start(b.client.clone(), &b.ns, &["z1", "z2", "v1"]);
    create_candidate(&env, "a1", "x", "1.30.0", Some("1.30.0"), OEV, None).await;
    create_candidate(&env, "a2", "x", "1.31.0", Some("1.31.0"), OEV, None).await;
    create_candidate(&env, "y1", "y", "1.30.0", Some("1.30.0"), OEV, None).await;
    create_candidate(&b, "z1", "z", "1.30.0", Some("1.30.0"), OEV, None).await;
    create_candidate(&b, "z2", "z", "1.31.0", Some("1.31.0"), OEV, None).await;
    wait_for_holder(&env, "x", "a1", DEADLINE).await;
    wait_for_holder(&env, "y", "y1", DEADLINE).await;
    wait_for_holder(&b, "z", "z1", DEADLINE).await;

    // A fourth candidate in A, for a third lease: refused.
    create_candidate(&env, "w1", "w", "1.30.0", Some("1.30.0"), OEV, None).await;
    let refused = eventually("w1 to be refused", DEADLINE, || async {
        condition(&env, "w1", "Eligible")
            .await
            .filter(|c| c.1 == "LimitExceeded")
    })
    .await;
    assert_eq!(refused.0, "False");
    let event = wait_for_event(&env, "w1", "LimitExceeded", DEADLINE).await;
    assert!(
        event.contains("already has 3 candidates"),
        "the Event names the limit: {event}"
    );
    // A's elections go on: x's holder dies, the next holder is elected.
    ra.silence("a1");
    wait_for_holder(&env, "x", "a2", DEADLINE).await;
    // B is not limited by A: a third candidate there, for a second lease, is elected.
    create_candidate(&b, "v1", "v", "1.30.0", Some("1.30.0"), OEV, None).await;
    wait_for_holder(&b, "v", "v1", DEADLINE).await;
    // Still no Lease for w: it was never arbitrated.
    let leases: Api<Lease> = env.api();
    assert!(leases.get_opt("w").await.unwrap().is_none());

    // y goes (its only candidate is deleted): w1 takes its place and is elected.
    let candidates: Api<LeaseCandidate> = env.api();
    candidates
        .delete("y1", &DeleteParams::default())
        .await
        .unwrap();
    let l = wait_for_holder(&env, "w", "w1", DEADLINE).await;
    assert_eq!(lease::term(&l), 1);
    drop_namespace(b).await;
}

/// An operator given `--watch-namespaces a,b` elects in both and never touches a candidate in
/// c (created first, so it would have been elected first).
async fn an_operator_watching_two_namespaces_ignores_a_third(env: Arc<TestEnv>) {
    let b = another_namespace(&env, "b").await;
    let c = another_namespace(&env, "c").await;
    let _rc = Responder::start(c.client.clone(), &c.ns, &["c1"]);
    create_candidate(&c, "c1", "work", "1.30.0", Some("1.30.0"), OEV, None).await;
    let _op = operator_for(&env, &[&env, &b], &[]);
    let _ra = Responder::start(env.client.clone(), &env.ns, &["a1"]);
    let _rb = Responder::start(b.client.clone(), &b.ns, &["b1"]);
    create_candidate(&env, "a1", "work", "1.30.0", Some("1.30.0"), OEV, None).await;
    create_candidate(&b, "b1", "work", "1.30.0", Some("1.30.0"), OEV, None).await;
    wait_for_holder(&env, "work", "a1", DEADLINE).await;
    wait_for_holder(&b, "work", "b1", DEADLINE).await;
    // Both were elected, and reported (Events); c's candidate has neither a Lease nor a
    // status, and was never pinged.
    wait_for_event(&env, "a1", "Elected", DEADLINE).await;
    wait_for_event(&b, "b1", "Elected", DEADLINE).await;
    untouched(&c, "c1", "work").await;
    drop_namespace(b).await;
    drop_namespace(c).await;
}

/// docs/examples/lease-writers.yaml, as the tenants guide says to apply it (for this test's
/// namespace, with names of its own): only ServiceAccount `writer` may create or patch
/// candidates for lease `work`; another account with the same RBAC rights is refused, for
/// `work` only; the operator's account may.
async fn the_documented_lease_writers_policy_lets_only_the_leases_account_write_its_candidates(
    env: Arc<TestEnv>,
) {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use kube::api::{Patch, PatchParams};
    use serde::Deserialize;
    use serde_json::json;

    let path = crate::support::repo_root().join("docs/examples/lease-writers.yaml");
    let policy_name = format!("{}-lw", env.ns);
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("arbiter-lease-writers", &policy_name)
        .replace("arbiter-system", &env.ns)
        .replace(":arbiter'", ":operator'")
        .replace(
            "payments.payments-controller: payments-controller",
            &format!("{}.work: writer", env.ns),
        );
    let (policies, bindings): (
        Api<ValidatingAdmissionPolicy>,
        Api<ValidatingAdmissionPolicyBinding>,
    ) = (Api::all(env.client.clone()), Api::all(env.client.clone()));
    let pp = PostParams::default();
    let docs: Vec<serde_json::Value> = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| serde_json::Value::deserialize(doc).unwrap())
        .collect();
    for value in docs {
        match value["kind"].as_str() {
            Some("ValidatingAdmissionPolicy") => {
                policies
                    .create(&pp, &serde_json::from_value(value).unwrap())
                    .await
                    .unwrap();
            }
            Some("ValidatingAdmissionPolicyBinding") => {
                bindings
                    .create(&pp, &serde_json::from_value(value).unwrap())
                    .await
                    .unwrap();
            }
            Some("ConfigMap") => {
                let cms: Api<ConfigMap> = env.api();
                cms.create(&pp, &serde_json::from_value(value).unwrap())
                    .await
                    .unwrap();
            }
            other => panic!("unexpected kind {other:?} in {}", path.display()),
        }
    }
    // Three accounts with the same rights on candidates.
    let sas: Api<ServiceAccount> = env.api();
    let roles: Api<Role> = env.api();
    let role_bindings: Api<RoleBinding> = env.api();
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "candidates"},
        "rules": [{"apiGroups": ["arbiter.dev"], "resources": ["leasecandidates"],
                   "verbs": ["get", "create", "patch"]}],
    }))
    .unwrap();
    roles.create(&pp, &role).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut clients = std::collections::BTreeMap::new();
    for sa in ["writer", "other", "operator"] {
        let account: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": sa}})).unwrap();
        sas.create(&pp, &account).await.unwrap();
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": sa},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "candidates"},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": env.ns}],
        }))
        .unwrap();
        role_bindings.create(&pp, &binding).await.unwrap();
        let kubeconfig = crate::support::service_account_kubeconfig(
            &env.client,
            &env.kubeconfig,
            &env.ns,
            sa,
            dir.path(),
        )
        .await;
        let client = crate::support::client_for(&kubeconfig).await;
        clients.insert(sa, Api::<LeaseCandidate>::namespaced(client, &env.ns));
    }
    let candidate = |name: &str, lease: &str| {
        LeaseCandidate::new(
            name,
            arbiter::api::LeaseCandidateSpec {
                lease_name: lease.into(),
                binary_version: "1.30.0".into(),
                emulation_version: Some("1.30.0".into()),
                strategy: OEV.into(),
                ping_time: None,
                renew_time: None,
            },
        )
    };
    // The policy takes a moment to be enforced: until other is refused.
    let refusal = eventually("the policy to refuse other", DEADLINE, || async {
        match clients["other"]
            .create(&pp, &candidate("probe", "work"))
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422 => Some(e.message),
            Ok(_) => {
                let _ = clients["other"]
                    .delete("probe", &DeleteParams::default())
                    .await;
                None
            }
            Err(_) => None,
        }
    })
    .await;
    assert!(
        refusal.contains("only ServiceAccount writer may write candidates for lease work"),
        "{refusal}"
    );
    // writer may; other may for another lease; other may not touch writer's candidate.
    clients["writer"]
        .create(&pp, &candidate("w", "work"))
        .await
        .unwrap();
    clients["other"]
        .create(&pp, &candidate("o", "elsewhere"))
        .await
        .unwrap();
    let forge = json!({"metadata": {"annotations": {"arbiter.dev/withdrawn": "x"}}});
    let patched = clients["other"]
        .patch("w", &PatchParams::default(), &Patch::Merge(&forge))
        .await;
    assert!(patched.is_err(), "other patched writer's candidate");
    // The operator's account may (it pings candidates, and creates single-active ones).
    clients["operator"]
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"pingTime": "2026-01-01T00:00:00.000000Z"}})),
        )
        .await
        .unwrap();
    let _ = bindings
        .delete(&policy_name, &DeleteParams::default())
        .await;
    let _ = policies
        .delete(&policy_name, &DeleteParams::default())
        .await;
}

/// Two installs on one namespace, `--instance a` and `--instance b`: each elects only the
/// candidates labelled for it, and labels its Leases so. For lease `both`, whose candidates
/// are split between them, the install that made the Lease is the only one that ever writes
/// it (every version names a holder of the Lease's own instance), and the other reports
/// `LeaseOfAnotherInstance`. An unlabelled candidate is elected by neither.
async fn two_installs_with_disjoint_instances_never_write_the_same_lease(env: Arc<TestEnv>) {
    let install = |instance: &str| {
        let ha = format!("ha-{instance}");
        Operator::start_with(
            &env.kubeconfig,
            &env.ns,
            &["--instance", instance, "--leader-election-lease", &ha],
        )
    };
    let (_a, _b) = (install("a"), install("b"));
    let _r = Responder::start(env.client.clone(), &env.ns, &["a1", "b1", "x", "y", "n1"]);
    let labelled = |name: &str, lease: &str, instance: Option<&str>| {
        let mut c = LeaseCandidate::new(
            name,
            arbiter::api::LeaseCandidateSpec {
                lease_name: lease.into(),
                binary_version: "1.30.0".into(),
                emulation_version: Some("1.30.0".into()),
                strategy: OEV.into(),
                ping_time: None,
                renew_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                    jiff::Timestamp::now(),
                )),
            },
        );
        c.metadata.labels =
            instance.map(|i| [(arbiter::api::INSTANCE_LABEL.to_string(), i.to_string())].into());
        c
    };
    let candidates: Api<LeaseCandidate> = env.api();
    let create = |name: &'static str, lease: &'static str, instance: Option<&'static str>| {
        let candidates = candidates.clone();
        async move {
            candidates
                .create(&PostParams::default(), &labelled(name, lease, instance))
                .await
                .unwrap();
        }
    };
    // `both` first, its candidates split; then one lease each, and an unlabelled one.
    create("x", "both", Some("a")).await;
    create("y", "both", Some("b")).await;
    let leases: Api<Lease> = env.api();
    let first = eventually("lease both to be held", DEADLINE, || async {
        let l = leases.get_opt("both").await.ok()??;
        lease::holder(&l).is_some().then_some(l)
    })
    .await;
    let history = crate::support::operator::record(leases.clone(), "both", |l: &Lease| {
        (
            lease::holder(l).map(str::to_string),
            lease::instance(l).map(str::to_string),
            lease::term(l),
        )
    })
    .await;
    create("a1", "la", Some("a")).await;
    create("b1", "lb", Some("b")).await;
    create("n1", "ln", None).await;
    let la = wait_for_holder(&env, "la", "a1", DEADLINE).await;
    let lb = wait_for_holder(&env, "lb", "b1", DEADLINE).await;
    assert_eq!(lease::instance(&la), Some("a"));
    assert_eq!(lease::instance(&lb), Some("b"));
    // The install that lost the race for `both` says so, and never writes it.
    let owner = lease::instance(&first).map(str::to_string).unwrap();
    let event = eventually("a LeaseOfAnotherInstance event", DEADLINE, || async {
        crate::support::events_for(&env, "both")
            .await
            .into_iter()
            .find(|(r, _)| r == "LeaseOfAnotherInstance")
            .map(|(_, m)| m)
    })
    .await;
    assert!(event.contains(&format!("instance {owner}")), "{event}");
    // Every version of `both` was written by its owner: labelled so, naming its candidate.
    let mine = if owner == "a" { "x" } else { "y" };
    for (holder, instance, _) in history.lock().unwrap().iter() {
        assert_eq!(instance.as_deref(), Some(owner.as_str()), "{holder:?}");
        assert!(holder.as_deref().is_none_or(|h| h == mine), "{holder:?}");
    }
    assert_eq!(lease::holder(&first), Some(mine));
    // Nobody elects the unlabelled candidate.
    assert!(leases.get_opt("ln").await.unwrap().is_none());
    let n1 = candidates.get("n1").await.unwrap();
    assert!(n1.status.is_none() && n1.spec.ping_time.is_none());
}

/// Candidate `name` of `env` was never pinged nor given a status, and lease `lease` has no
/// Lease.
async fn untouched(env: &TestEnv, name: &str, lease: &str) {
    let leases: Api<Lease> = env.api();
    assert!(leases.get_opt(lease).await.unwrap().is_none(), "{lease}");
    let candidate = env.api::<LeaseCandidate>().get(name).await.unwrap();
    assert!(candidate.status.is_none(), "{name}: {:?}", candidate.status);
    assert!(candidate.spec.ping_time.is_none(), "{name} was pinged");
}

/// Labels (or, with `None`, unlabels) namespace `ns` with `key`.
async fn label_namespace(env: &TestEnv, ns: &str, key: &str, value: Option<&str>) {
    use kube::api::{Patch, PatchParams};
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    let patch = serde_json::json!({"metadata": {"labels": {key: value}}});
    namespaces
        .patch(ns, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("labelling a namespace");
}

/// An operator given `--namespace-selector` (cluster-wide) elects in a namespace whose labels
/// match, never in one whose labels do not (its candidate, created first, is neither pinged nor
/// given a status or a Lease), starts arbitrating a namespace once it is labelled, and writes
/// nothing in one once its label is removed (a new lease there gets no Lease, while a
/// failover elsewhere, which takes longer than a first election, completes).
async fn a_namespace_selector_arbitrates_only_matching_namespaces_as_their_labels_change(
    env: Arc<TestEnv>,
) {
    let key = "e2e.arbiter.dev/tenant";
    let b = another_namespace(&env, "b").await;
    let c = another_namespace(&env, "c").await;
    label_namespace(&env, &b.ns, key, Some(&env.ns)).await;
    let rb = Responder::start(b.client.clone(), &b.ns, &["b1", "fresh1"]);
    let rc = Responder::start(c.client.clone(), &c.ns, &["c1", "c2"]);
    create_candidate(&c, "c1", "work", "1.30.0", Some("1.30.0"), OEV, None).await;
    create_candidate(&b, "b1", "work", "1.30.0", Some("1.30.0"), OEV, None).await;
    let selector = format!("{key}={}", env.ns);
    let op = Operator::start_args(
        &env.kubeconfig,
        &[
            "--namespace",
            &env.ns,
            "--namespace-selector",
            &selector,
            "--lease-duration",
            "5s",
            "--metrics-address",
            "127.0.0.1:0",
        ],
    );
    wait_for_holder(&b, "work", "b1", DEADLINE).await;
    wait_for_event(&b, "b1", "Elected", DEADLINE).await;
    // c does not match: its candidate, there first, is left alone.
    untouched(&c, "c1", "work").await;

    // c comes to match: its lease is elected.
    label_namespace(&env, &c.ns, key, Some(&env.ns)).await;
    wait_for_holder(&c, "work", "c1", DEADLINE).await;

    // b stops matching (the operator says so): a new lease there gets nothing, while c fails
    // over (its holder stops answering; the next is elected after the lease expires).
    label_namespace(&env, &b.ns, key, None).await;
    eventually("the operator to let b go", DEADLINE, || async {
        op.logs()
            .lines()
            .any(|l| l.contains("no longer matches") && l.contains(&b.ns))
            .then_some(())
    })
    .await;
    create_candidate(&b, "fresh1", "fresh", "1.30.0", Some("1.30.0"), OEV, None).await;
    create_candidate(&c, "c2", "work", "1.30.0", Some("1.30.0"), OEV, None).await;
    rc.silence("c1");
    wait_for_holder(&c, "work", "c2", DEADLINE).await;
    untouched(&b, "fresh1", "fresh").await;
    let work: Api<Lease> = b.api();
    let held = work.get("work").await.unwrap();
    assert_eq!(
        lease::holder(&held),
        Some("b1"),
        "b's lease stays as it was"
    );
    drop(rb);
    drop_namespace(b).await;
    drop_namespace(c).await;
}
