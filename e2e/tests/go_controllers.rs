//! Go controllers under arbiter (go/: `arbiterlock`, `arbiterctrl`): real controller-runtime
//! managers built from the module's example, as processes against the real control plane and
//! the real operator. Every reconcile logs its term and its times; no two replicas may log
//! work at overlapping times.

use std::sync::Arc;
use std::time::Duration;

use arbiter::lease;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::support::agent::{Agent, LEASE_DURATION, Proxy, apiserver, now, read_log, starts};
use crate::support::go_manager::{
    GoManager, assert_one_at_a_time, first_work_of, last_work_of, works,
};
use crate::support::operator::{Operator, wait_for_holder};
use crate::support::{TestEnv, eventually};

crate::tests![go_controllers:
    the_oldest_go_replica_leads_from_term_one_in_any_start_order,
    a_rollback_hands_over_with_the_newer_replicas_reconciles_stopped_first,
    sigkill_of_the_go_leader_fails_over_after_expiry_and_not_before,
    a_go_leader_cut_from_the_api_stops_reconciling_before_the_next_starts,
    go_and_rust_candidates_follow_the_same_rules_in_one_lease,
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

/// Replicas of three versions started together, in two orders: the oldest version leads, and
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
    let _older = spawn("older", "1.30.0");
    let l = wait_for_holder(&env, "rollback", "older", DEADLINE).await;
    assert!(lease::term(&l) > first, "the term went up");
    let older_first = eventually("the older replica to reconcile", DEADLINE, || async {
        first_work_of(&works(&events), "older")
    })
    .await;
    assert_eq!(older_first.term, lease::term(&l), "it works at its term");
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
