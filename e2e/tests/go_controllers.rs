//! Go controllers under arbiter (go/: `arbiterlock`, `arbiterctrl`): real controller-runtime
//! managers built from the module's example, as processes against the real control plane and
//! the real operator. Every reconcile logs its term and its times; no two replicas may log
//! work at overlapping times.

use std::sync::Arc;
use std::time::Duration;

use arbiter::lease;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::support::agent::{Agent, LEASE_DURATION, Proxy, apiserver, now, read_log, starts};
use crate::support::go_manager::{
    GoManager, assert_one_at_a_time, first_work_of, last_work_of, works,
};
use crate::support::operator::{Operator, wait_for_holder};
use crate::support::standin::{StandIn, kill_container};
use crate::support::{TestEnv, eventually, node};

crate::tests![go_controllers:
    the_oldest_go_replica_leads_from_term_one_in_any_start_order,
    a_rollback_hands_over_with_the_newer_replicas_reconciles_stopped_first,
    a_leader_that_ignores_the_handover_request_is_waited_out_never_released_under,
    sigkill_of_the_go_leader_fails_over_after_expiry_and_not_before,
    sigkill_of_the_go_leader_then_its_pod_gone_fails_over_at_once,
    a_go_leader_cut_from_the_api_stops_reconciling_before_the_next_starts,
    go_and_rust_candidates_follow_the_same_rules_in_one_lease,
    plain_client_go_under_arbiter_hands_over_with_its_work_stopped_first,
    go_managers_as_pods_hand_over_at_once_when_the_leader_pod_is_deleted_or_its_container_crashes,
];

const DEADLINE: Duration = Duration::from_secs(60);

/// The operator, assigning leases for the managers' lease duration (10 s).
fn operator(env: &TestEnv) -> Operator {
    Operator::start(env, &["--lease-duration", "10s"])
}

/// The ConfigMap the example manager reconciles (named after its lease).
async fn config_map(env: &TestEnv, name: &str) {
    let cm = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    env.api::<ConfigMap>()
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
}

/// Replicas of three versions started together, in three orders: the oldest version leads, and
/// from the first term (a newer one never leads first); the standbys are Ready and answer the
/// webhook while the leader reconciles.
async fn the_oldest_go_replica_leads_from_term_one_in_any_start_order(env: Arc<TestEnv>) {
    let _op = operator(&env);
    let dir = tempfile::tempdir().unwrap();
    for (round, order) in [
        ["1.32.0", "1.31.0", "1.30.0"],
        ["1.30.0", "1.32.0", "1.31.0"],
    ]
    .iter()
    .enumerate()
    {
        let name = format!("order{round}");
        config_map(&env, &name).await;
        let events = dir.path().join(format!("{name}.log"));
        let replicas: Vec<GoManager> = order
            .iter()
            .map(|v| {
                let id = format!("{name}-v{}", v.replace('.', ""));
                GoManager::spawn(&env.kubeconfig, &env.ns, &id, &name, v, &events, &[])
            })
            .collect();
        let oldest = format!("{name}-v1300");
        wait_for_holder(&env, &name, &oldest, DEADLINE).await;
        eventually("the leader to reconcile", DEADLINE, || async {
            first_work_of(&works(&events), &oldest)
        })
        .await;
        let started = starts(&read_log(&events));
        assert_eq!(
            started
                .iter()
                .map(|s| (s.0.as_str(), s.1))
                .collect::<Vec<_>>(),
            [(oldest.as_str(), 1)],
            "only the oldest led, from term 1"
        );
        for r in replicas.iter().filter(|r| r.identity != oldest) {
            assert_eq!(r.ready().await, Some(200), "{} is Ready", r.identity);
            let answer = r.admit().await;
            assert_eq!(
                answer.as_deref(),
                Some(format!("checked by {}", r.identity).as_str()),
                "{}'s webhook answers while it stands by",
                r.identity
            );
        }
        let all = works(&events);
        assert!(all.iter().all(|w| w.id == oldest && w.term == 1), "{all:?}");
    }
}

/// An older replica joins (a rollback): the newer leader stops its reconciles, releases, and
/// only then does the older one start, at a higher term; the newer one exits cleanly.
async fn a_rollback_hands_over_with_the_newer_replicas_reconciles_stopped_first(env: Arc<TestEnv>) {
    let _op = operator(&env);
    config_map(&env, "rollback").await;
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.log");
    let spawn = |id: &str, v: &str| {
        GoManager::spawn(&env.kubeconfig, &env.ns, id, "rollback", v, &events, &[])
    };
    let mut newer = spawn("newer", "1.31.0");
    let first = lease::term(&wait_for_holder(&env, "rollback", "newer", DEADLINE).await);
    eventually("the newer replica to reconcile", DEADLINE, || async {
        first_work_of(&works(&events), "newer")
    })
    .await;
    let older = spawn("older", "1.30.0");
    eventually("the older replica to be Ready", DEADLINE, || async {
        (older.ready().await == Some(200)).then_some(())
    })
    .await;
    let l = wait_for_holder(&env, "rollback", "older", DEADLINE).await;
    assert!(lease::term(&l) > first, "the term went up");
    let older_first = eventually("the older replica to reconcile", DEADLINE, || async {
        first_work_of(&works(&events), "older")
    })
    .await;
    assert_eq!(older_first.term, lease::term(&l), "it works at its term");
    assert_eq!(older.ready().await, Some(200), "Ready throughout");
    assert_eq!(
        older.admit().await.as_deref(),
        Some("checked by older"),
        "its webhook answers as it leads"
    );
    assert_eq!(
        newer.wait_exit(DEADLINE).await,
        Some(0),
        "the newer replica stops cleanly"
    );
    assert!(
        newer.output().contains("\"released\":true"),
        "it released the lease once its reconciles stopped"
    );
    let newer_last = last_work_of(&works(&events), "newer").unwrap();
    assert!(
        newer_last.to <= older_first.from,
        "the newer replica's last reconcile ({newer_last:?}) ended before the older's first ({older_first:?})"
    );
    assert_one_at_a_time(&works(&events));
    eprintln!(
        "rollback: {:.3} s between the newer replica's last reconcile and the older's first",
        older_first.from - newer_last.to
    );
}

/// A program that does not watch StepDownContext: the handover request ends its term in the
/// lock, its elector stops at the renew deadline and controller-runtime exits; nothing releases
/// the lease under reconciles that may still run, so the older replica leads only once the
/// lease expired, and never beside it.
async fn a_leader_that_ignores_the_handover_request_is_waited_out_never_released_under(
    env: Arc<TestEnv>,
) {
    let _op = operator(&env);
    config_map(&env, "unwired").await;
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.log");
    let mut newer = GoManager::spawn(
        &env.kubeconfig,
        &env.ns,
        "newer",
        "unwired",
        "1.31.0",
        &events,
        &["--no-step-down"],
    );
    wait_for_holder(&env, "unwired", "newer", DEADLINE).await;
    eventually("the newer replica to reconcile", DEADLINE, || async {
        first_work_of(&works(&events), "newer")
    })
    .await;
    let _older = GoManager::spawn(
        &env.kubeconfig,
        &env.ns,
        "older",
        "unwired",
        "1.30.0",
        &events,
        &[],
    );
    let leases: Api<Lease> = env.api();
    let asked = eventually("the handover request", DEADLINE, || async {
        let l = leases.get("unwired").await.ok()?;
        lease::preferred_holder(&l).map(|_| now())
    })
    .await;
    assert_eq!(
        newer.wait_exit(DEADLINE).await,
        Some(1),
        "controller-runtime exits on the lost lease"
    );
    assert!(
        !newer.output().contains("\"released\":true"),
        "the lease was released under reconciles that may have run"
    );
    let older_first = eventually("the older replica to reconcile", DEADLINE, || async {
        first_work_of(&works(&events), "older")
    })
    .await;
    let newer_last = last_work_of(&works(&events), "newer").unwrap();
    assert!(
        newer_last.to <= older_first.from,
        "{newer_last:?} then {older_first:?}"
    );
    // Waited out: a lease duration (10 s) after the last renewal, which came at most a retry
    // period before the request.
    assert!(
        older_first.from - asked >= 10.0 - 1.0 - 0.5,
        "the older replica reconciled {:.3} s after the handover request: the lease was not waited out",
        older_first.from - asked
    );
    assert_one_at_a_time(&works(&events));
}

/// SIGKILL of the leading replica: the standby leads only once the lease expired (a lease
/// duration after the last renewal), and then at once.
async fn sigkill_of_the_go_leader_fails_over_after_expiry_and_not_before(env: Arc<TestEnv>) {
    let _op = operator(&env);
    config_map(&env, "crash").await;
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.log");
    let mut leader = GoManager::spawn(
        &env.kubeconfig,
        &env.ns,
        "leader",
        "crash",
        "1.30.0",
        &events,
        &[],
    );
    let term = lease::term(&wait_for_holder(&env, "crash", "leader", DEADLINE).await);
    let _standby = GoManager::spawn(
        &env.kubeconfig,
        &env.ns,
        "standby",
        "crash",
        "1.31.0",
        &events,
        &[],
    );
    eventually("the standby to register", DEADLINE, || async {
        env.api::<arbiter::api::LeaseCandidate>()
            .get_opt("standby")
            .await
            .ok()?
    })
    .await;
    kill(Pid::from_raw(leader.pid()), Signal::SIGKILL).unwrap();
    leader.wait_exit(DEADLINE).await;
    let leases: Api<Lease> = env.api();
    let renewed = leases.get("crash").await.unwrap().spec.unwrap().renew_time;
    let renewed = renewed.unwrap().0.as_millisecond() as f64 / 1000.0;
    let next = eventually("the standby to lead", DEADLINE, || async {
        first_work_of(&works(&events), "standby")
    })
    .await;
    let expiry = renewed + LEASE_DURATION.as_secs_f64();
    assert!(
        next.from >= expiry,
        "the standby reconciled at {:.3}, before the lease expired at {expiry:.3}",
        next.from
    );
    assert!(
        next.from - expiry < 5.0,
        "and soon after: {:.3} s",
        next.from - expiry
    );
    assert!(next.term > term);
    assert_one_at_a_time(&works(&events));
}

/// A leader in a pod (a stand-in process on a kwok node) is SIGKILLed and its pod is then
/// deleted, as a kubelet reports a dead container: the pod's end, not the lease's expiry,
/// hands the lease on. (The pod declares its lease with the label `arbiter.dev/lease`.)
async fn sigkill_of_the_go_leader_then_its_pod_gone_fails_over_at_once(env: Arc<TestEnv>) {
    let op = Operator::start(&env, &["--lease-duration", "60s"]);
    config_map(&env, "gone").await;
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.log");
    let kubeconfig = env.kubeconfig.to_str().unwrap().to_string();
    let labels: std::collections::BTreeMap<String, String> =
        [("arbiter.dev/lease".to_string(), "gone".to_string())].into();
    let mut pods = Vec::new();
    for (name, version) in [("gone-a", "1.30.0"), ("gone-b", "1.31.0")] {
        let log = events.to_str().unwrap().to_string();
        let args = [
            "--namespace",
            &env.ns,
            "--lease",
            "gone",
            "--config-map",
            "gone",
            "--binary-version",
            version,
            "--log",
            &log,
            "--probe-addr",
            "0",
            "--lease-duration",
            "60s",
            "--renew-deadline",
            "30s",
            "--retry-period",
            "2s",
        ];
        let binary = crate::support::go_manager::binary()
            .to_str()
            .unwrap()
            .to_string();
        pods.push(
            StandIn::spawn_with_env(
                env.client.clone(),
                &env.ns,
                name,
                labels.clone(),
                5,
                &binary,
                &args,
                &[("KUBECONFIG", kubeconfig.as_str())],
            )
            .await,
        );
    }
    wait_for_holder(&env, "gone", "gone-a", DEADLINE).await;
    eventually("gone-a to reconcile", DEADLINE, || async {
        first_work_of(&works(&events), "gone-a")
    })
    .await;
    op.wait_eligible(&env.ns, "gone-b").await;
    kill_container(pods[0].pid);
    let killed_at = now();
    let pods_api: Api<Pod> = env.api();
    pods_api
        .delete("gone-a", &DeleteParams::default())
        .await
        .unwrap();
    let next = eventually("gone-b to reconcile", DEADLINE, || async {
        first_work_of(&works(&events), "gone-b")
    })
    .await;
    assert!(
        next.from - killed_at < 20.0,
        "gone-b reconciled {:.3} s after the crash, on a 60 s lease: it waited for expiry",
        next.from - killed_at
    );
    assert_one_at_a_time(&works(&events));
}

/// The leader's connection to the API server is cut: its elector stops leading at the renew
/// deadline, controller-runtime exits, and its last reconcile ends before the next leader's
/// first (which waits for the lease to expire).
async fn a_go_leader_cut_from_the_api_stops_reconciling_before_the_next_starts(env: Arc<TestEnv>) {
    let _op = operator(&env);
    config_map(&env, "cut").await;
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.log");
    let proxy = Proxy::start(apiserver(&env.kubeconfig)).await;
    let proxied = proxy.kubeconfig(&env.kubeconfig, dir.path());
    let mut victim = GoManager::spawn(&proxied, &env.ns, "victim", "cut", "1.30.0", &events, &[]);
    wait_for_holder(&env, "cut", "victim", DEADLINE).await;
    let _direct = GoManager::spawn(
        &env.kubeconfig,
        &env.ns,
        "direct",
        "cut",
        "1.31.0",
        &events,
        &[],
    );
    eventually("the victim to reconcile", DEADLINE, || async {
        first_work_of(&works(&events), "victim")
    })
    .await;
    eventually("the direct replica to register", DEADLINE, || async {
        env.api::<arbiter::api::LeaseCandidate>()
            .get_opt("direct")
            .await
            .ok()?
    })
    .await;
    proxy.cut();
    let cut_at = now();
    assert_eq!(
        victim.wait_exit(DEADLINE).await,
        Some(1),
        "controller-runtime exits when leadership is lost"
    );
    let next = eventually("the direct replica to lead", DEADLINE, || async {
        first_work_of(&works(&events), "direct")
    })
    .await;
    let last = last_work_of(&works(&events), "victim").unwrap();
    assert!(
        last.to < next.from,
        "the cut-off leader reconciled until {:.3}, the next began at {:.3}",
        last.to,
        next.from
    );
    // The elector gives up a retry period and its renew deadline after its last renewal.
    assert!(
        last.to - cut_at <= 1.0 + 5.0 + 1.0,
        "the cut-off leader reconciled {:.3} s after the cut",
        last.to - cut_at
    );
    assert_one_at_a_time(&works(&events));
}

/// A Go replica and Rust agents in one lease: the oldest leads whichever library it runs, and
/// handovers go both ways with the old holder's work stopped before the new one's starts.
async fn go_and_rust_candidates_follow_the_same_rules_in_one_lease(env: Arc<TestEnv>) {
    let _op = operator(&env);
    config_map(&env, "mixed").await;
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.log");
    // The Rust agent's workload logs start and stop lines to the same file.
    let _rust = Agent::spawn(&env.kubeconfig, &env.ns, "rust", "mixed", "1.30.0", &events);
    wait_for_holder(&env, "mixed", "rust", DEADLINE).await;
    let go = GoManager::spawn(
        &env.kubeconfig,
        &env.ns,
        "go",
        "mixed",
        "1.31.0",
        &events,
        &[],
    );
    eventually("the Go replica to register", DEADLINE, || async {
        env.api::<arbiter::api::LeaseCandidate>()
            .get_opt("go")
            .await
            .ok()?
    })
    .await;
    // An older Go replica joins: the Rust agent hands over to it.
    let _go_older = GoManager::spawn(
        &env.kubeconfig,
        &env.ns,
        "go-older",
        "mixed",
        "1.29.0",
        &events,
        &[],
    );
    wait_for_holder(&env, "mixed", "go-older", DEADLINE).await;
    let go_first = eventually("the older Go replica to reconcile", DEADLINE, || async {
        first_work_of(&works(&events), "go-older")
    })
    .await;
    let rust_stop = crate::support::agent::stop_of(&read_log(&events), "rust")
        .expect("the Rust agent's workload stopped");
    assert!(
        rust_stop <= go_first.from,
        "the Rust workload stopped at {rust_stop:.3}, the Go replica reconciled at {:.3}",
        go_first.from
    );
    // An older Rust agent joins: the Go replica hands over to it.
    let _rust_older = Agent::spawn(
        &env.kubeconfig,
        &env.ns,
        "rust-older",
        "mixed",
        "1.28.0",
        &events,
    );
    let l = wait_for_holder(&env, "mixed", "rust-older", DEADLINE).await;
    let rust_start = eventually("the older Rust agent's workload", DEADLINE, || async {
        starts(&read_log(&events))
            .into_iter()
            .find(|s| s.0 == "rust-older")
    })
    .await;
    assert_eq!(rust_start.1, lease::term(&l));
    let go_last = last_work_of(&works(&events), "go-older").unwrap();
    assert!(
        go_last.to <= rust_start.3,
        "the Go replica reconciled until {:.3}, the Rust workload started at {:.3}",
        go_last.to,
        rust_start.3
    );
    assert!(
        works(&events).iter().all(|w| w.id != "go"),
        "the newer Go replica never led"
    );
    assert_one_at_a_time(&works(&events));
    drop(go);
}

/// The example manager's pod on the real node: a 60 s lease (so that a handover within
/// seconds is not expiry), the events log in `shared`, restarted when its container ends.
fn manager_pod(name: &str, version: &str, shared: &std::path::Path) -> serde_json::Value {
    let field = |path: &str| serde_json::json!({"fieldRef": {"fieldPath": path}});
    let mut spec = serde_json::json!({
        "serviceAccountName": "manager",
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 40,
        "containers": [{
            "name": "manager", "image": node::GO_MANAGER_IMAGE, "imagePullPolicy": "Never",
            "args": ["--lease", "pods", "--config-map", "pods", "--binary-version", version,
                     "--log", "/shared/log", "--probe-addr", "0",
                     "--lease-duration", "60s", "--renew-deadline", "30s", "--retry-period", "2s"],
            "env": [
                {"name": "POD_NAME", "valueFrom": field("metadata.name")},
                {"name": "POD_NAMESPACE", "valueFrom": field("metadata.namespace")},
                {"name": "POD_UID", "valueFrom": field("metadata.uid")},
            ],
            "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
        }],
        "volumes": [{"name": "shared", "hostPath": {"path": shared.to_str().unwrap(), "type": "Directory"}}],
    });
    node::place(&mut spec);
    // The label is the pod's own word that it runs a candidate of lease "pods": only then is
    // its stop, or its container's end, taken for the end of a term.
    serde_json::json!({"metadata": {"name": name, "labels": {"arbiter.dev/lease": "pods"}}, "spec": spec})
}

/// The manager's ServiceAccount: the candidate's rights (the chart's `arbiter-candidate`
/// role) and the ConfigMaps it reconciles.
async fn manager_service_account(env: &TestEnv) {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let pp = PostParams::default();
    let sa: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "manager"}})).unwrap();
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "manager"},
        "rules": [
            {"apiGroups": ["arbiter.dev"], "resources": ["leasecandidates"],
             "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "verbs": ["get", "list", "watch", "update"]},
            {"apiGroups": [""], "resources": ["configmaps"],
             "verbs": ["get", "list", "watch", "update"]},
        ],
    }))
    .unwrap();
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "manager"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "manager"},
        "subjects": [{"kind": "ServiceAccount", "name": "manager", "namespace": env.ns}],
    }))
    .unwrap();
    env.api::<ServiceAccount>().create(&pp, &sa).await.unwrap();
    env.api::<Role>().create(&pp, &role).await.unwrap();
    env.api::<RoleBinding>()
        .create(&pp, &binding)
        .await
        .unwrap();
}

/// Within this of the event that ended a term, the next term is not the lease's expiry (60 s).
const AT_ONCE: f64 = 20.0;

/// As pods on the real node. The leader's pod is deleted: its manager stops its reconciles,
/// releases, and the standby leads at once. Then the new leader's container is SIGKILLed (its
/// pod stays, and restarts it): the kubelet's report of the container's end, with the
/// incarnation the lock wrote to its termination log, hands the lease on without waiting for
/// it to expire. Never two reconciling at once.
async fn go_managers_as_pods_hand_over_at_once_when_the_leader_pod_is_deleted_or_its_container_crashes(
    env: Arc<TestEnv>,
) {
    node::ready(&env).await;
    let op = Operator::start(&env, &["--lease-duration", "60s"]);
    manager_service_account(&env).await;
    config_map(&env, "pods").await;
    let shared = node::shared_dir();
    let events = shared.path().join("log");
    let pods: Api<Pod> = env.api();
    let pp = PostParams::default();
    for (name, version) in [("go-a", "1.30.0"), ("go-b", "1.31.0")] {
        let pod: Pod = serde_json::from_value(manager_pod(name, version, shared.path())).unwrap();
        pods.create(&pp, &pod).await.unwrap();
    }
    wait_for_holder(&env, "pods", "go-a", DEADLINE).await;
    eventually("go-a to reconcile", DEADLINE, || async {
        first_work_of(&works(&events), "go-a")
    })
    .await;
    op.wait_eligible(&env.ns, "go-b").await;

    // The leader's pod is deleted.
    pods.delete("go-a", &DeleteParams::default()).await.unwrap();
    let deleted_at = now();
    let b_first = eventually("go-b to reconcile", DEADLINE, || async {
        first_work_of(&works(&events), "go-b")
    })
    .await;
    let a_last = last_work_of(&works(&events), "go-a").unwrap();
    assert!(a_last.to <= b_first.from, "{a_last:?} then {b_first:?}");
    assert!(
        b_first.from - deleted_at < AT_ONCE,
        "go-b led {:.3} s after go-a's pod was deleted",
        b_first.from - deleted_at
    );
    eprintln!(
        "pod deleted: {:.3} s between go-a's last reconcile and go-b's first",
        b_first.from - a_last.to
    );

    // A standby for the crash, then SIGKILL of the leader's container (its first process).
    let pod: Pod = serde_json::from_value(manager_pod("go-c", "1.31.0", shared.path())).unwrap();
    pods.create(&pp, &pod).await.unwrap();
    op.wait_eligible(&env.ns, "go-c").await;
    let b_term = b_first.term;
    let id = node::container_id(&env, "go-b").await;
    let manager = node::container_init_pid(&env.kubeconfig, &id).expect("the container's task");
    kill(Pid::from_raw(manager), Signal::SIGKILL).unwrap();
    let killed_at = now();
    let next = eventually("a new term's first reconcile", DEADLINE, || async {
        works(&events).into_iter().find(|w| w.term > b_term)
    })
    .await;
    assert!(
        next.from - killed_at < AT_ONCE,
        "the next leader ({}) reconciled {:.3} s after the crash: it waited for expiry",
        next.id,
        next.from - killed_at
    );
    let b_last = works(&events)
        .into_iter()
        .rfind(|w| w.id == "go-b" && w.term == b_term)
        .unwrap();
    assert!(b_last.to <= next.from, "{b_last:?} then {next:?}");
    assert_one_at_a_time(&works(&events));
}

/// The guide's plain client-go program (`leaderelection.RunOrDie` with the lock): the oldest
/// leads; SIGTERM stops its work, then releases, and the standby leads at once; a rollback hands
/// over with the newer replica's work stopped first.
async fn plain_client_go_under_arbiter_hands_over_with_its_work_stopped_first(env: Arc<TestEnv>) {
    let _op = operator(&env);
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.log");
    let spawn = |id: &str, version: &str| {
        let out = std::fs::File::create(dir.path().join(format!("{id}.out"))).unwrap();
        std::process::Command::new(crate::support::go_manager::clientgo_binary())
            .args(["--namespace", &env.ns, "--lease", "plain", "--identity", id])
            .args(["--binary-version", version, "--log"])
            .arg(&events)
            .args(crate::support::go_manager::TIMINGS)
            .env("KUBECONFIG", &env.kubeconfig)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap()
    };
    let mut first = spawn("first", "1.30.0");
    wait_for_holder(&env, "plain", "first", DEADLINE).await;
    let mut second = spawn("second", "1.31.0");
    eventually(
        "the first to work and the second to register",
        DEADLINE,
        || async {
            first_work_of(&works(&events), "first")?;
            env.api::<arbiter::api::LeaseCandidate>()
                .get_opt("second")
                .await
                .ok()?
        },
    )
    .await;
    kill(Pid::from_raw(first.id() as i32), Signal::SIGTERM).unwrap();
    let sigterm = now();
    let status = tokio::task::spawn_blocking(move || first.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "the first exits cleanly: {status}");
    let next = eventually("the second to work", DEADLINE, || async {
        first_work_of(&works(&events), "second")
    })
    .await;
    let last = last_work_of(&works(&events), "first").unwrap();
    assert!(last.to <= next.from, "{last:?} then {next:?}");
    assert!(
        next.from - sigterm < 5.0,
        "the second worked {:.3} s after the SIGTERM: the release was not used",
        next.from - sigterm
    );
    // A rollback: an older replica joins.
    let mut older = spawn("older", "1.29.0");
    let l = wait_for_holder(&env, "plain", "older", DEADLINE).await;
    let older_first = eventually("the older to work", DEADLINE, || async {
        first_work_of(&works(&events), "older")
    })
    .await;
    assert_eq!(older_first.term, lease::term(&l));
    let second_last = last_work_of(&works(&events), "second").unwrap();
    assert!(
        second_last.to <= older_first.from,
        "{second_last:?} then {older_first:?}"
    );
    assert_one_at_a_time(&works(&events));
    for p in [&mut second, &mut older] {
        let _ = p.kill();
        let _ = p.wait();
    }
}
