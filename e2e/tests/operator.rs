//! `arbiter operator` against the real control plane: elections, handover, expiry, confirmed
//! death, third-party strategies, conflicts, terms, and its own high availability.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arbiter::api::{LeaseCandidate, OLDEST_EMULATION_VERSION as OEV};
use arbiter::lease;
use arbiter::operator::term::ledger as terms;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

use crate::support::operator::{
    FAST_HA, Operator, Responder, condition, create_candidate, hold_and_release,
    hold_and_release_with, record_lease, wait_for_holder,
};
use crate::support::standin::StandIn;
use crate::support::{TestEnv, events_for, eventually, wait_for_event};

crate::tests![operator:
    single_candidate_is_elected,
    oldest_emulation_version_wins,
    better_candidate_gets_the_lease_through_handover,
    an_abandoned_handover_falls_back_to_the_best_live_candidate,
    the_docs_list_every_metric_the_operator_exposes,
    a_repeated_event_is_counted_on_the_first,
    status_watch_rides_out_an_unreachable_api_server,
    expired_lease_goes_to_a_live_candidate,
    a_renewing_holder_keeps_its_lease_though_no_renewal_is_reconciled,
    holder_pod_stopped_is_replaced_before_expiry,
    a_pod_created_again_under_its_name_never_runs_beside_the_next_holder,
    a_recorded_pod_deleted_from_the_lease_does_not_end_a_term_taken_elsewhere,
    only_the_pods_it_follows_are_kept,
    lapsed_holder_pod_still_running_is_evicted,
    eviction_blocked_by_pdb_is_reported_and_retried,
    a_pod_that_does_not_declare_the_lease_is_never_forced_out,
    only_a_pod_that_declares_its_holder_ends_a_term_early,
    a_blocked_forced_exit_survives_an_operator_failover,
    third_party_strategy_gets_a_holderless_lease,
    a_registration_proves_life_for_ack_valid_for,
    strategy_conflict_is_reported_and_changes_nothing,
    term_survives_lease_deletion,
    new_leases_of_a_shard_share_one_mark_write,
    standby_operator_takes_over_on_sigterm,
    standby_operator_takes_over_after_sigkill,
    a_term_nobody_reported_is_waited_out_after_its_lease_is_deleted,
    a_cut_off_operator_stops_acting_before_the_standby_takes_over,
    a_briefly_cut_off_operator_resumes_without_a_failover,
    an_outage_seen_by_both_replicas_is_ridden_out_by_the_active_one,
    deleting_the_operator_lease_does_not_make_two_arbiters,
    clearing_the_operator_lease_does_not_make_two_arbiters,
    clearing_the_operator_lease_after_a_release_does_not_make_two_arbiters,
    naming_the_standby_in_the_operator_lease_does_not_make_two_arbiters,
    the_operator_lease_at_another_term_is_lost_leadership,
    operator_without_rbac_exits_with_a_clear_error,
    status_shows_holder_term_and_candidates,
    stale_candidates_without_a_pod_are_deleted,
    elections_write_no_status_and_one_event_each,
];

const DEADLINE: Duration = Duration::from_secs(30);

/// Waits for `candidate` to be reported `Eligible=False`, reason `Unresponsive`: it was pinged
/// and did not answer.
async fn wait_unresponsive(env: &TestEnv, candidate: &str) {
    let eligible = eventually("Unresponsive", DEADLINE, || async {
        condition(env, candidate, "Eligible")
            .await
            .filter(|c| c.1 == "Unresponsive")
    })
    .await;
    assert_eq!(eligible.0, "False", "{candidate}");
}

async fn single_candidate_is_elected(env: Arc<TestEnv>) {
    let _op = Operator::start(&env, &[]);
    let _r = Responder::start(env.client.clone(), &env.ns, &["c1"]);
    create_candidate(&env, "c1", "demo", "1.31.0", Some("1.31.0"), OEV, None).await;
    let l = wait_for_holder(&env, "demo", "c1", DEADLINE).await;
    assert_eq!(lease::term(&l), 1);
    assert_eq!(
        l.labels().get(lease::MANAGED_LABEL).map(String::as_str),
        Some("true")
    );
    assert_eq!(lease::strategy(&l), Some(OEV));
    assert_eq!(lease::duration(&l), Some(Duration::from_secs(15)));
    let events = eventually("an Elected event", DEADLINE, || async {
        let ev = events_for(&env, "c1").await;
        ev.iter().any(|(r, _)| r == "Elected").then_some(ev)
    })
    .await;
    assert_eq!(
        events,
        [(
            "Elected".to_string(),
            "elected holder of lease demo at term 1".to_string()
        )]
    );
    // Nothing to report on c1: the Lease says it holds it; its status is not written.
    let c: Api<LeaseCandidate> = env.api();
    assert!(
        c.get("c1")
            .await
            .unwrap()
            .status
            .is_none_or(|s| s.conditions.is_empty())
    );
}

/// kep4355.md §6.7 TestMultipleLeaseCandidate: (binary/emulation) 1.20/1.20, 1.20/1.19,
/// 1.19/1.19, 1.20/1.19 elect baz3 (1.19/1.19).
async fn oldest_emulation_version_wins(env: Arc<TestEnv>) {
    let _op = Operator::start(&env, &[]);
    let _r = Responder::start(
        env.client.clone(),
        &env.ns,
        &["baz1", "baz2", "baz3", "baz4"],
    );
    for (name, bin, emu) in [
        ("baz1", "1.20.0", "1.20.0"),
        ("baz2", "1.20.0", "1.19.0"),
        ("baz3", "1.19.0", "1.19.0"),
        ("baz4", "1.20.0", "1.19.0"),
    ] {
        create_candidate(&env, name, "multi", bin, Some(emu), OEV, None).await;
    }
    let l = wait_for_holder(&env, "multi", "baz3", DEADLINE).await;
    assert_eq!(lease::term(&l), 1, "from the first term");
    wait_for_event(&env, "baz3", "Elected", DEADLINE).await;
    for other in ["baz1", "baz2", "baz4"] {
        assert!(events_for(&env, other).await.is_empty(), "{other}");
    }
}

async fn better_candidate_gets_the_lease_through_handover(env: Arc<TestEnv>) {
    let op = Operator::start(&env, &[]);
    let _r = Responder::start(env.client.clone(), &env.ns, &["bar1", "bar2"]);
    let holders = hold_and_release(env.client.clone(), &env.ns, "swap", &["bar1", "bar2"]);
    create_candidate(&env, "bar1", "swap", "1.20.0", Some("1.20.0"), OEV, None).await;
    wait_for_holder(&env, "swap", "bar1", DEADLINE).await;
    // Record every version of the Lease from here on.
    let history = record_lease(&env, "swap").await;
    create_candidate(&env, "bar2", "swap", "1.19.0", Some("1.19.0"), OEV, None).await;
    // bar1 is live (renewed every 200 ms), so bar2 gets it only through bar1's release.
    let l = wait_for_holder(&env, "swap", "bar2", DEADLINE).await;
    assert_eq!(lease::term(&l), 2);
    assert_eq!(
        lease::preferred_holder(&l),
        None,
        "the preferred holder is cleared on assignment"
    );
    // The sequence the Lease went through: asked, released, assigned; bar1 never replaced live.
    let seen = history.until_held("bar2", 2).await;
    let asked = seen
        .iter()
        .position(|(h, p, _)| h.as_deref() == Some("bar1") && p.as_deref() == Some("bar2"));
    let released = seen.iter().position(|(h, _, _)| h.is_none());
    let assigned = seen
        .iter()
        .position(|(h, _, _)| h.as_deref() == Some("bar2"));
    assert!(
        asked < released && released < assigned && asked.is_some(),
        "{seen:?}"
    );
    // Events are sent in the background: polled for.
    wait_for_event(&env, "bar1", "HandoverRequested", DEADLINE).await;
    holders.abort();
    // The handover is measured, and so is the leaderless time around it. (The operator updates
    // metrics just after its write, so poll.)
    let value = |metrics: &str, name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    // Two leader changes: the first holder (no term before it) and the handover (a release).
    let metrics = eventually("two leader changes in the metrics", DEADLINE, || async {
        let m = op.http_get("/metrics").await;
        (value(&m, r#"arbiter_leader_changes_total{reason="new"}"#) == Some(1.0)
            && value(&m, r#"arbiter_leader_changes_total{reason="released"}"#) == Some(1.0))
        .then_some(m)
    })
    .await;
    assert_eq!(
        value(&metrics, "arbiter_handover_seconds_count"),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        value(&metrics, "arbiter_handovers_requested_total"),
        Some(1.0),
        "{metrics}"
    );
    let leaderless = value(&metrics, "arbiter_leaderless_seconds_total");
    assert!(leaderless.is_some_and(|s| s > 0.0 && s < 5.0), "{metrics}");
    assert_eq!(
        value(&metrics, "arbiter_operator_active"),
        Some(1.0),
        "{metrics}"
    );
    assert!(op.http_get("/readyz").await.ends_with("ok"));
}

/// The holder `a` is asked to hand over to the better `t`, which answered during `a`'s term;
/// `t` goes silent just before `a` releases. The next holder must answer after the release:
/// `t` does not, so the lease goes to the best live candidate other than `a`, its equal `c`,
/// and the abandoned handover is reported. (Were `c` newer than `a`, `a` would get its lease
/// back: a newer version does not take charge while the older one that stepped down runs.)
/// (Before: `t`'s earlier answer still counted, the lease was assigned to the silent `t` and
/// sat with it until it expired.)
async fn an_abandoned_handover_falls_back_to_the_best_live_candidate(env: Arc<TestEnv>) {
    let op = Operator::start(&env, &[]);
    let r = Responder::start(env.client.clone(), &env.ns, &["a", "c", "t"]);
    let silence = r.silencer();
    let holders = hold_and_release_with(
        env.client.clone(),
        &env.ns,
        "fall",
        &["a", "c", "t"],
        move |to| {
            if to == "t" {
                silence(to)
            }
        },
    );
    create_candidate(&env, "a", "fall", "1.20.0", Some("1.20.0"), OEV, None).await;
    wait_for_holder(&env, "fall", "a", DEADLINE).await;
    create_candidate(&env, "c", "fall", "1.20.0", Some("1.20.0"), OEV, None).await;
    op.wait_eligible(&env.ns, "c").await;
    let history = record_lease(&env, "fall").await;
    create_candidate(&env, "t", "fall", "1.18.0", Some("1.18.0"), OEV, None).await;
    let held = wait_for_holder(&env, "fall", "c", DEADLINE).await;
    let seen = history.until_held("c", lease::term(&held)).await;
    assert!(
        seen.iter()
            .any(|(h, p, _)| h.as_deref() == Some("a") && p.as_deref() == Some("t")),
        "the handover to t was requested: {seen:?}"
    );
    assert!(
        seen.iter().all(|(h, _, _)| h.as_deref() != Some("t")),
        "the lease was given to t, which had gone silent: {seen:?}"
    );
    let note = wait_for_event(&env, "a", "HandoverAbandoned", DEADLINE).await;
    assert!(
        note.contains("to t") && note.contains("c was elected instead"),
        "{note}"
    );
    let metrics = op.http_get("/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("arbiter_handovers_abandoned_total 1")),
        "{metrics}"
    );
    holders.abort();
}

async fn expired_lease_goes_to_a_live_candidate(env: Arc<TestEnv>) {
    let _op = Operator::start(&env, &["--lease-duration", "4s"]);
    let r = Responder::start(env.client.clone(), &env.ns, &["old", "young"]);
    create_candidate(&env, "old", "exp", "1.19.0", Some("1.19.0"), OEV, None).await;
    let first = wait_for_holder(&env, "exp", "old", DEADLINE).await;
    let assigned_at = Instant::now();
    let shards: Api<ConfigMap> = env.api();
    let shard_before = shards.get(&terms::shard_of("exp")).await.unwrap();
    // "old" never renews and goes silent; "young" (newer, so not preferred) is alive.
    r.silence("old");
    create_candidate(&env, "young", "exp", "1.20.0", Some("1.20.0"), OEV, None).await;
    let l = wait_for_holder(&env, "exp", "young", DEADLINE).await;
    let waited = assigned_at.elapsed();
    assert!(
        waited >= Duration::from_secs(4),
        "reassigned after {waited:?}, before the 4 s lease expired"
    );
    assert_eq!(lease::term(&l), lease::term(&first) + 1);
    // The term came from the block the first mark write reserved: no ConfigMap write.
    let shard_after = shards.get(&terms::shard_of("exp")).await.unwrap();
    assert_eq!(
        shard_after.resource_version(),
        shard_before.resource_version(),
        "the re-election wrote the term marks' shard: {:?}",
        shard_after.data
    );
    wait_unresponsive(&env, "old").await;
}

/// The operator no longer reconciles a holder's renewals (a record that changes nothing but
/// `renewTime`): it stamps each as its watch delivers it, and the lease's expiry timer brings
/// it back. A holder that keeps renewing over several lease durations keeps its term (judged
/// from a renewal no reconcile saw, its lease would go to the other candidate), the renewals
/// cost no reconciles, and once they stop the lease goes to the other candidate after expiry.
async fn a_renewing_holder_keeps_its_lease_though_no_renewal_is_reconciled(env: Arc<TestEnv>) {
    let op = Operator::start(&env, &["--lease-duration", "2s"]);
    let _r = Responder::start(env.client.clone(), &env.ns, &["old", "young"]);
    create_candidate(&env, "old", "renew", "1.19.0", Some("1.19.0"), OEV, None).await;
    let first = wait_for_holder(&env, "renew", "old", DEADLINE).await;
    create_candidate(&env, "young", "renew", "1.20.0", Some("1.20.0"), OEV, None).await;
    // Its registration settled (pinged, answered, reported) before the reconciles are counted.
    op.wait_eligible(&env.ns, "young").await;
    let history = record_lease(&env, "renew").await;
    let reconciles = |m: &str| {
        m.lines()
            .find(|l| l.starts_with("arbiter_reconcile_duration_seconds_count"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let before = reconciles(&op.http_get("/metrics").await);
    // "old" renews by compare-and-swap every 200 ms for 4 lease durations.
    let store = lease::LeaseStore::new(env.client.clone(), &env.ns);
    let leases: Api<Lease> = env.api();
    let started = Instant::now();
    let (mut renewals, mut last_renewal) = (0, started);
    while started.elapsed() < Duration::from_secs(8) {
        let mut l = leases.get("renew").await.unwrap();
        assert_eq!(
            lease::holder(&l),
            Some("old"),
            "the lease moved while its holder renewed"
        );
        l.spec.as_mut().unwrap().renew_time = Some(lease::now());
        // Before it is sent: the operator sees the renewal only after it is written.
        let sent = Instant::now();
        store.replace(&l).await.unwrap();
        (renewals, last_renewal) = (renewals + 1, sent);
        // The holder's renew period, not a wait for a condition.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let during = reconciles(&op.http_get("/metrics").await) - before;
    assert!(
        during < f64::from(renewals) / 2.0,
        "{during} reconciles for {renewals} renewals: renewals are reconciled"
    );
    // Its renewals stop: the lease goes to "young" once it expired, not before.
    let l = wait_for_holder(&env, "renew", "young", DEADLINE).await;
    let waited = last_renewal.elapsed();
    assert!(
        waited >= Duration::from_secs(2),
        "reassigned {waited:?} after the last renewal, before the 2 s lease expired"
    );
    let seen = history.until_held("young", lease::term(&l)).await;
    // Holders and terms only: once "young" holds, the operator may rightly ask it to hand
    // back to the older "old", whose candidate still answers (a record that repeats both).
    let mut holders: Vec<_> = seen.iter().map(|(h, _, t)| (h.clone(), *t)).collect();
    holders.dedup();
    // Up to young's term (young, with no agent, later lets it expire and old may take it back).
    if let Some(at) = holders
        .iter()
        .position(|(h, t)| h.as_deref() == Some("young") && *t == lease::term(&l))
    {
        holders.truncate(at + 1);
    }
    assert_eq!(
        holders,
        vec![
            (Some("old".to_string()), lease::term(&first)),
            (Some("young".to_string()), lease::term(&l)),
        ],
        "one term of old's, then young's"
    );
}

fn owned_by(si: &StandIn) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: si.name.clone(),
        uid: si.uid.clone(),
        ..OwnerReference::default()
    }
}

/// A stand-in pod `name` running a shell that exits on SIGTERM, and a candidate for `lease` at
/// `version` that the pod owns.
async fn candidate_in_a_pod(env: &TestEnv, name: &str, lease: &str, version: &str) -> StandIn {
    // The pod declares the lease its candidate runs for (as `arbiter run --lease` in its spec
    // would): only such a pod's stop ends a term early.
    let si = StandIn::spawn(
        env.client.clone(),
        &env.ns,
        name,
        BTreeMap::from([("arbiter.dev/lease".to_string(), lease.to_string())]),
        5,
        "sh",
        &SLEEP,
    )
    .await;
    create_candidate(
        env,
        name,
        lease,
        version,
        Some(version),
        OEV,
        Some(owned_by(&si)),
    )
    .await;
    si
}

/// A workload that exits on SIGTERM.
const SLEEP: [&str; 2] = ["-c", "trap 'exit 0' TERM; while :; do sleep 0.05; done"];

async fn holder_pod_stopped_is_replaced_before_expiry(env: Arc<TestEnv>) {
    let _op = Operator::start(&env, &["--lease-duration", "60s"]);
    let _r = Responder::start(env.client.clone(), &env.ns, &["pod-a", "pod-b"]);
    let a = candidate_in_a_pod(&env, "pod-a", "dead", "1.19.0").await;
    let _b = candidate_in_a_pod(&env, "pod-b", "dead", "1.20.0").await;
    wait_for_holder(&env, "dead", "pod-a", DEADLINE).await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = env.api();
    pods.delete("pod-a", &DeleteParams::default())
        .await
        .unwrap();
    a.wait_exit(DEADLINE).await;
    let stopped = Instant::now();
    // The holder's pod is confirmed stopped: no need to wait out the 60 s lease.
    wait_for_holder(&env, "dead", "pod-b", Duration::from_secs(20)).await;
    assert!(stopped.elapsed() < Duration::from_secs(20));
}

async fn a_pod_created_again_under_its_name_never_runs_beside_the_next_holder(env: Arc<TestEnv>) {
    pod_created_again_under_its_name(&env, false).await
}

async fn a_recorded_pod_deleted_from_the_lease_does_not_end_a_term_taken_elsewhere(
    env: Arc<TestEnv>,
) {
    pod_created_again_under_its_name(&env, true).await
}

/// A pod with a stable name (a StatefulSet's `web-0`) is named holder, then deleted before its
/// agent took the term, and created again under its name, where `arbiter run` (the same
/// identity, a newer version than `web-1`'s) starts. Found by the model checker: the new pod's
/// agent took the term assigned in the old pod, the arbiter saw the old pod stopped, ended the
/// term and named `web-1` while the new pod's workload ran. Now the agent does not take a term
/// assigned in another pod, and (`edit`: the recorded pod deleted from the Lease by hand, so
/// the agent takes it) the old pod's stop does not end a term taken elsewhere. Either way
/// `web-1` is named only after `web-0`'s workload, if it ran, stopped.
async fn pod_created_again_under_its_name(env: &TestEnv, edit: bool) {
    let dir = tempfile::tempdir().unwrap();
    let op = Operator::start(env, &[]);
    let responder = Responder::start(env.client.clone(), &env.ns, &["web-0", "web-1"]);
    // The first web-0 runs no agent: the assignment is never taken in it.
    let first = candidate_in_a_pod(env, "web-0", "sts", "1.19.0").await;
    wait_for_holder(env, "sts", "web-0", DEADLINE).await;
    let _b = candidate_in_a_pod(env, "web-1", "sts", "1.20.0").await;

    // The arbiter is frozen while the pod is replaced, so that the new pod's agent acts on the
    // assignment before the arbiter sees the old pod stop.
    kill(Pid::from_raw(op.pid()), Signal::SIGSTOP).unwrap();
    responder.alive.lock().unwrap().remove("web-0");
    let pods: Api<k8s_openapi::api::core::v1::Pod> = env.api();
    pods.delete("web-0", &DeleteParams::default())
        .await
        .unwrap();
    first.wait_exit(DEADLINE).await;
    eventually("the old web-0 to be gone", DEADLINE, || async {
        pods.get_opt("web-0")
            .await
            .ok()
            .and_then(|p| p.is_none().then_some(()))
    })
    .await;
    let leases: Api<Lease> = env.api();
    if edit {
        let patch = json!({"metadata": {"annotations": {lease::HOLDER_POD_ANNOTATION: null}}});
        leases
            .patch("sts", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
    let log = dir.path().join("web-0.log");
    let agent_log = dir.path().join("web-0.agent.log");
    let mut args = vec![
        "-c".to_string(),
        format!("exec \"$0\" \"$@\" 2>>{}", agent_log.display()),
        env!("CARGO_BIN_EXE_arbiter").to_string(),
    ];
    args.extend(crate::support::agent::agent_args(
        &env.ns, "web-0", "sts", "1.21.0", &log,
    ));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let kubeconfig = env.kubeconfig.display().to_string();
    let _second = StandIn::spawn_with_env(
        env.client.clone(),
        &env.ns,
        "web-0",
        BTreeMap::from([("arbiter.dev/lease".to_string(), "sts".to_string())]),
        5,
        "sh",
        &args,
        &[
            ("KUBECONFIG", &kubeconfig),
            ("RUST_LOG", "info,arbiter=debug"),
        ],
    )
    .await;
    let agent_says = |what: &'static str| {
        let agent_log = agent_log.clone();
        move || {
            std::fs::read_to_string(&agent_log)
                .unwrap_or_default()
                .contains(what)
        }
    };
    let (taken, refused) = (agent_says("leading"), agent_says("in another pod"));
    eventually(
        "the new pod's agent to act on the assignment",
        DEADLINE,
        || async { (taken() || refused()).then_some(()) },
    )
    .await;
    kill(Pid::from_raw(op.pid()), Signal::SIGCONT).unwrap();

    let l = wait_for_holder(env, "sts", "web-1", DEADLINE).await;
    let named_at = l
        .spec
        .as_ref()
        .and_then(|s| s.acquire_time.as_ref())
        .map(|t| t.0.as_second() as f64 + f64::from(t.0.subsec_nanosecond()) / 1e9)
        .expect("an assignment's acquireTime");
    let workload = std::fs::read_to_string(&log).unwrap_or_default();
    let at = |word: &str| {
        workload
            .lines()
            .find(|l| l.starts_with(word))
            .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok())
    };
    let agent = std::fs::read_to_string(&agent_log).unwrap_or_default();
    if at("start").is_some() {
        let stopped = at("stop").expect("web-0's workload stopped");
        assert!(
            stopped < named_at,
            "web-1 was named at {named_at} while web-0's workload ran until {stopped}:\n{agent}"
        );
    }
    if edit {
        assert!(
            at("start").is_some(),
            "with no recorded pod on the Lease, the new pod's agent takes the term:\n{agent}"
        );
    } else {
        assert!(
            at("start").is_none() && refused(),
            "the new pod's agent ran under a term assigned in the old pod:\n{workload}\n{agent}"
        );
    }
}

/// The pod watch sees every pod and keeps only candidates' pods: ordinary pods are dropped, and
/// a pod that was running before its candidate registered (its events all went by, dropped) is
/// fetched, so that it is electable (an unknown pod is not) and its deletion is proof.
async fn only_the_pods_it_follows_are_kept(env: Arc<TestEnv>) {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = env.api();
    let plain = |i: usize| -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("plain-{i}"), "labels": {"app": "plain"}},
            "spec": {
                "nodeName": crate::support::standin::NODE,
                "containers": [{"name": "app", "image": "example.com/app:1.0.0"}],
            },
        }))
        .unwrap()
    };
    for i in 0..3 {
        pods.create(&PostParams::default(), &plain(i))
            .await
            .unwrap();
    }
    let sleep = SLEEP;
    let a = StandIn::spawn(
        env.client.clone(),
        &env.ns,
        "pod-a",
        BTreeMap::from([("arbiter.dev/lease".to_string(), "kept".to_string())]),
        5,
        "sh",
        &sleep,
    )
    .await;
    let op = Operator::start(&env, &["--lease-duration", "60s"]);
    let _r = Responder::start(env.client.clone(), &env.ns, &["pod-a", "pod-b"]);
    async fn followed(op: &Operator) -> Option<f64> {
        let m = op.http_get("/metrics").await;
        m.lines()
            .find(|l| l.starts_with("arbiter_pods_followed "))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    }
    op.wait_ready().await;
    assert_eq!(followed(&op).await, Some(0.0));
    create_candidate(
        &env,
        "pod-a",
        "kept",
        "1.19.0",
        Some("1.19.0"),
        OEV,
        Some(owned_by(&a)),
    )
    .await;
    // Elected: its pod, fetched, is known to be Running.
    wait_for_holder(&env, "kept", "pod-a", DEADLINE).await;
    assert_eq!(followed(&op).await, Some(1.0));
    let _b = candidate_in_a_pod(&env, "pod-b", "kept", "1.20.0").await;
    eventually("pod-b followed", DEADLINE, || async {
        (followed(&op).await == Some(2.0)).then_some(())
    })
    .await;
    // Ordinary pods changed, then the holder's pod deleted: the watch delivers in order, so
    // once the deletion is seen the ordinary pods' changes were seen (and dropped).
    for i in 0..3 {
        let patch = serde_json::json!({"metadata": {"labels": {"touched": "yes"}}});
        pods.patch(
            &format!("plain-{i}"),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
    }
    pods.delete("pod-a", &DeleteParams::default())
        .await
        .unwrap();
    a.wait_exit(DEADLINE).await;
    // Its deletion is proof (no wait for the 60 s lease).
    wait_for_holder(&env, "kept", "pod-b", Duration::from_secs(20)).await;
    // The failover may come from the pod's terminal status, before its Delete event: poll. Only
    // pod-b is left; had the ordinary pods' changes (delivered before the deletion) been kept,
    // the count could never come down to 1.
    eventually("only pod-b followed", DEADLINE, || async {
        (followed(&op).await == Some(1.0)).then_some(())
    })
    .await;
}

async fn third_party_strategy_gets_a_holderless_lease(env: Arc<TestEnv>) {
    let op = Operator::start(&env, &[]);
    let _r = Responder::start(env.client.clone(), &env.ns, &["foo1"]);
    create_candidate(&env, "foo1", "tp", "1.20.0", None, "foo.com/bar", None).await;
    let api: Api<Lease> = env.api();
    let l = eventually("the third-party lease", DEADLINE, || async {
        api.get_opt("tp").await.ok()?
    })
    .await;
    assert_eq!(lease::strategy(&l), Some("foo.com/bar"));
    assert_eq!(lease::holder(&l), None);
    // Left alone: still no holder once the operator decided again on the Lease it made,
    // though a candidate is alive.
    let tp = format!("{}/tp", env.ns);
    eventually("a decision on the Lease as made", DEADLINE, || async {
        op.decisions(&tp)
            .contains(&"Nothing".to_string())
            .then_some(())
    })
    .await;
    assert_eq!(lease::holder(&api.get("tp").await.unwrap()), None);
}

/// `--ack-valid-for`: a candidate's registration counts as an answer for that long, so an
/// election that comes later than the default 10 s after it (here: the lease was another
/// strategy's until then; at scale: elections queued behind each other) needs no ping. But a
/// holder whose term lapsed must answer a ping sent since: alone, it would otherwise be given
/// term after term, dead, for as long as its registration counts.
async fn a_registration_proves_life_for_ack_valid_for(env: Arc<TestEnv>) {
    let op = Operator::start(&env, &["--ack-valid-for", "60s"]);
    // Answers x's and y's pings (without the flag x would be pinged, answer, and be elected
    // all the same), never z's.
    let _r = Responder::start(env.client.clone(), &env.ns, &["x", "y"]);
    // Registrations count only as the operator's watch delivers them, not from its first list.
    op.wait_ready().await;
    // z holds "alone" at once, on its registration, and never renews: its 15 s term lapses.
    create_candidate(&env, "z", "alone", "1.30.0", Some("1.30.0"), OEV, None).await;
    // y, at the highest binaryVersion, makes "mig" a third-party strategy's lease: x waits.
    create_candidate(&env, "y", "mig", "1.31.0", None, "example.com/other", None).await;
    let api: Api<Lease> = env.api();
    eventually("the third-party lease", DEADLINE, || async {
        api.get_opt("mig")
            .await
            .ok()?
            .filter(|l| lease::strategy(l).is_some())
    })
    .await;
    create_candidate(&env, "x", "mig", "1.30.0", Some("1.30.0"), OEV, None).await;
    let registered = Instant::now();
    let mig = format!("{}/mig", env.ns);
    eventually(
        "x judged, under the third-party strategy",
        DEADLINE,
        || async {
            op.decided(&mig)
                .iter()
                .any(|d| d.starts_with("Nothing") && d.contains("\"x\""))
                .then_some(())
        },
    )
    .await;
    let first = wait_for_holder(&env, "alone", "z", DEADLINE).await;
    // The premise, not a condition to wait for: more than the default validity (twice the
    // 5 s ack window) passes between x's registration and its election.
    tokio::time::sleep_until((registered + Duration::from_secs(12)).into()).await;
    let candidates: Api<LeaseCandidate> = env.api();
    candidates
        .delete("y", &DeleteParams::default())
        .await
        .unwrap();
    let held = wait_for_holder(&env, "mig", "x", DEADLINE).await;
    let x = candidates.get("x").await.unwrap();
    assert_eq!(
        x.spec.ping_time,
        None,
        "x was pinged though it registered {:?} before its election",
        registered.elapsed()
    );
    // The candidates went back to the arbiter's strategy, and so did the Lease.
    assert_eq!(lease::strategy(&held), Some(OEV));
    // z, lapsed and alone, was asked, did not answer, and got no new term.
    wait_unresponsive(&env, "z").await;
    assert_eq!(
        lease::term(&api.get("alone").await.unwrap()),
        lease::term(&first),
        "the lapsed holder was given a new term without answering"
    );
}

async fn strategy_conflict_is_reported_and_changes_nothing(env: Arc<TestEnv>) {
    let _op = Operator::start(&env, &[]);
    let _r = Responder::start(env.client.clone(), &env.ns, &["x", "y"]);
    create_candidate(&env, "x", "conflict", "1.31.0", Some("1.31.0"), OEV, None).await;
    create_candidate(
        &env,
        "y",
        "conflict",
        "1.31.0",
        None,
        "example.com/other",
        None,
    )
    .await;
    // x may be elected before y shows up; either way, once both exist nothing changes.
    for name in ["x", "y"] {
        let c = eventually("StrategyConflict=True", DEADLINE, || async {
            condition(&env, name, "StrategyConflict")
                .await
                .filter(|c| c.0 == "True")
        })
        .await;
        assert_eq!(c.1, "StrategyConflict");
    }
    let events = eventually("a StrategyConflict event", DEADLINE, || async {
        let ev = events_for(&env, "y").await;
        ev.iter()
            .any(|(r, _)| r == "StrategyConflict")
            .then_some(ev)
    })
    .await;
    assert!(
        events.iter().any(|(_, m)| m.contains("example.com/other")),
        "{events:?}"
    );
    let api: Api<Lease> = env.api();
    if let Some(l) = api.get_opt("conflict").await.unwrap() {
        assert_ne!(lease::holder(&l), Some("y"));
    }
}

async fn term_survives_lease_deletion(env: Arc<TestEnv>) {
    let _op = Operator::start(&env, &[]);
    let _r = Responder::start(env.client.clone(), &env.ns, &["t1"]);
    create_candidate(&env, "t1", "terms", "1.0.0", Some("1.0.0"), OEV, None).await;
    let first = wait_for_holder(&env, "terms", "t1", DEADLINE).await;
    // The mark is recorded, before the Lease, in the lease name's shard.
    let shards: Api<ConfigMap> = env.api();
    let shard = terms::shard_of("terms");
    let mark = |cm: &ConfigMap| cm.data.as_ref()?.get("terms")?.parse::<i32>().ok();
    let recorded = shards.get(&shard).await.unwrap();
    assert_eq!(
        mark(&recorded),
        Some(lease::term(&first) + terms::BLOCK - 1),
        "mark in {shard}: the first term and the block reserved with it"
    );
    // A mark above the Lease (say, from an earlier life of the name) wins, even though the
    // operator's copy of the shard is now stale.
    let ahead = lease::term(&first) + 1000;
    shards
        .patch(
            &shard,
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": { "terms": ahead.to_string() } })),
        )
        .await
        .unwrap();
    let api: Api<Lease> = env.api();
    api.delete("terms", &DeleteParams::default()).await.unwrap();
    let second = eventually("the lease to be recreated", DEADLINE, || async {
        let l = api.get_opt("terms").await.ok()??;
        (l.uid() != first.uid() && lease::holder(&l).is_some()).then_some(l)
    })
    .await;
    assert_eq!(
        lease::term(&second),
        ahead + 1,
        "term went from {} (mark {ahead}) to {}",
        lease::term(&first),
        lease::term(&second)
    );
    let recorded = shards.get(&shard).await.unwrap();
    assert_eq!(
        mark(&recorded),
        Some(ahead + terms::BLOCK),
        "mark in {shard}"
    );
}

/// Leases elected for the first time together cost their shard one mark write, not one each;
/// a shard written by someone else in between voids the terms reserved ahead (a mark restored
/// by hand is honoured); a lease created from a reserved block is recreated above it.
async fn new_leases_of_a_shard_share_one_mark_write(env: Arc<TestEnv>) {
    let shard = terms::shard_of("ahead-0");
    let names: Vec<String> = (0..10_000)
        .map(|i| format!("ahead-{i}"))
        .filter(|n| terms::shard_of(n) == shard)
        .take(6)
        .collect();
    let (first, later) = names.split_at(3);
    // The shard exists (empty) before the operator starts, so that a watch sees every write.
    let shards: Api<ConfigMap> = env.api();
    let mut empty = ConfigMap::default();
    empty.metadata.name = Some(shard.clone());
    shards.create(&PostParams::default(), &empty).await.unwrap();
    let marks = crate::support::operator::record(shards.clone(), &shard, |cm: &ConfigMap| {
        cm.data.clone().unwrap_or_default()
    })
    .await;
    // Only the first three answer pings; every candidate is there before the first election
    // (the operator starts after them).
    let alive: Vec<&str> = first.iter().map(String::as_str).collect();
    let _r = Responder::start(env.client.clone(), &env.ns, &alive);
    for n in &names {
        create_candidate(&env, n, n, "1.0.0", Some("1.0.0"), OEV, None).await;
    }
    let _op = Operator::start(&env, &[]);
    let mut leases = BTreeMap::new();
    for n in first {
        leases.insert(n.clone(), wait_for_holder(&env, n, n, DEADLINE).await);
    }
    let terms_of = |leases: &BTreeMap<String, Lease>| -> BTreeMap<String, i32> {
        leases
            .iter()
            .map(|(n, l)| (n.clone(), lease::term(l)))
            .collect()
    };
    assert!(
        leases.values().all(|l| lease::term(l) == 1),
        "first terms: {:?}",
        terms_of(&leases)
    );
    let all_reserved: BTreeMap<String, String> = names
        .iter()
        .map(|n| (n.clone(), terms::BLOCK.to_string()))
        .collect();
    // (The later three ignored their pings: nothing else writes the shard meanwhile.)
    let seen = eventually("the watch to see every mark", DEADLINE, || async {
        let seen = marks.lock().unwrap().clone();
        (seen.last() == Some(&all_reserved)).then_some(seen)
    })
    .await;
    assert_eq!(
        seen.len(),
        2,
        "the shard went from empty to every new lease's mark in one write: {seen:?}"
    );

    // Someone else writes the shard: a mark restored by hand for one of the others.
    let restored = &later[0];
    shards
        .patch(
            &shard,
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": { restored.as_str(): "47" } })),
        )
        .await
        .unwrap();
    // The other three come alive: they renew on their own, as an agent's refresh does, until
    // each holds its lease. (A renewal answers only a ping sent before it: one renewal racing
    // the arbiter's ping may land just before it, and a live agent would answer that ping.)
    let candidates: Api<LeaseCandidate> = env.api();
    let last_renewal = std::sync::Mutex::new(None::<std::time::Instant>);
    let held = eventually("the other three to hold their leases", DEADLINE, || async {
        let api: Api<Lease> = env.api();
        // Once a second at most, as an agent refreshes (more often than its 5 minutes).
        let renew_now = {
            let mut last = last_renewal.lock().unwrap();
            let due = last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
            if due {
                *last = Some(std::time::Instant::now());
            }
            due
        };
        let mut held = BTreeMap::new();
        for n in later {
            match api.get_opt(n).await.ok().flatten() {
                Some(l) if lease::holder(&l) == Some(n.as_str()) => {
                    held.insert(n.clone(), l);
                }
                _ if renew_now => {
                    let now = jiff::Timestamp::now();
                    let renew = json!({ "spec": { "renewTime": MicroTime(now) } });
                    candidates
                        .patch(n, &PatchParams::default(), &Patch::Merge(renew))
                        .await
                        .ok()?;
                }
                _ => {}
            }
        }
        (held.len() == later.len()).then_some(held)
    })
    .await;
    leases.extend(held);
    let want: BTreeMap<String, i32> = names
        .iter()
        .map(|n| {
            let term = match n {
                n if first.contains(n) => 1,
                n if n == restored => 48,
                _ => terms::BLOCK + 1,
            };
            (n.clone(), term)
        })
        .collect();
    assert_eq!(
        terms_of(&leases),
        want,
        "the shard changed under the reserved blocks: marks written, the restored one honoured"
    );

    // A block reserved ahead served one creation: a recreation writes a mark above it.
    let api: Api<Lease> = env.api();
    let gone = &first[1];
    api.delete(gone, &DeleteParams::default()).await.unwrap();
    let again = eventually("the lease to be recreated", DEADLINE, || async {
        let l = api.get_opt(gone).await.ok()??;
        (l.uid() != leases[gone].uid() && lease::holder(&l).is_some()).then_some(l)
    })
    .await;
    assert_eq!(
        lease::term(&again),
        terms::BLOCK + 1,
        "recreated above the mark"
    );
}

/// The operator's own HA lease holder, if any.
/// The replica acting as the arbiter: the HA Lease's holder, once it has renewed since it
/// acquired (a replica that created the Lease acts only after its renew deadline).
/// Writes `holder` into the operators' HA Lease, as a hand edit would.
async fn set_ha_holder(env: &TestEnv, holder: &str) {
    edit_ha_lease(env, json!({ "spec": { "holderIdentity": holder } })).await;
}

/// Merge-patches the operators' HA Lease by hand.
async fn edit_ha_lease(env: &TestEnv, patch: serde_json::Value) {
    let leases: Api<Lease> = env.api();
    leases
        .patch(
            "arbiter-operator",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
}

async fn ha_holder(env: &TestEnv) -> Option<String> {
    let api: Api<Lease> = env.api();
    let l = api.get_opt("arbiter-operator").await.ok()??;
    let spec = l.spec.as_ref()?;
    let (acquired, renewed) = (spec.acquire_time.as_ref()?, spec.renew_time.as_ref()?);
    (renewed.0 > acquired.0)
        .then(|| lease::holder(&l).map(str::to_string))
        .flatten()
}

async fn two_operators(env: &TestEnv) -> (Operator, Operator, String) {
    let ha = FAST_HA;
    let first = Operator::start(env, &ha);
    let active = eventually("an active operator", DEADLINE, || ha_holder(env)).await;
    let second = Operator::start(env, &ha);
    (first, second, active)
}

async fn standby_operator_takes_over_on_sigterm(env: Arc<TestEnv>) {
    let (mut first, _second, active) = two_operators(&env).await;
    let _r = Responder::start(env.client.clone(), &env.ns, &["h1", "h2"]);
    create_candidate(&env, "h1", "ha", "1.0.0", Some("1.0.0"), OEV, None).await;
    wait_for_holder(&env, "ha", "h1", DEADLINE).await;
    kill(Pid::from_raw(first.pid()), Signal::SIGTERM).unwrap();
    assert_eq!(first.wait_exit(DEADLINE).await, Some(0));
    let stopped = Instant::now();
    let next = eventually("the standby to take over", DEADLINE, || async {
        ha_holder(&env).await.filter(|h| *h != active)
    })
    .await;
    assert!(
        stopped.elapsed() < Duration::from_secs(4),
        "takeover after release took {:?}",
        stopped.elapsed()
    );
    assert_ne!(next, active);
    // The new active replica arbitrates: a new lease gets a holder.
    create_candidate(&env, "h2", "ha2", "1.0.0", Some("1.0.0"), OEV, None).await;
    wait_for_holder(&env, "ha2", "h2", DEADLINE).await;
}

async fn standby_operator_takes_over_after_sigkill(env: Arc<TestEnv>) {
    let (mut first, _second, active) = two_operators(&env).await;
    kill(Pid::from_raw(first.pid()), Signal::SIGKILL).unwrap();
    first.wait_exit(DEADLINE).await;
    let killed = Instant::now();
    eventually("the standby to take over", DEADLINE, || async {
        ha_holder(&env).await.filter(|h| *h != active)
    })
    .await;
    // Not before the 6 s HA lease expired on the standby's clock.
    assert!(
        killed.elapsed() >= Duration::from_secs(4),
        "took over after {:?}",
        killed.elapsed()
    );
}

/// The active replica dies between the Lease that names a holder and the status that reports
/// it (cleared here by hand, as that status was never written), and the Lease is deleted by
/// hand before the standby looks: nothing names the holder, whose workload may still run, but
/// the term mark says a term was handed out. The standby waits a full lease duration (15 s)
/// from its first look before electing anyone, and the next term is above the mark.
async fn a_term_nobody_reported_is_waited_out_after_its_lease_is_deleted(env: Arc<TestEnv>) {
    let (mut first, _second, active) = two_operators(&env).await;
    let _r = Responder::start(env.client.clone(), &env.ns, &["u1"]);
    create_candidate(&env, "u1", "unreported", "1.0.0", Some("1.0.0"), OEV, None).await;
    let held = wait_for_holder(&env, "unreported", "u1", DEADLINE).await;
    kill(Pid::from_raw(first.pid()), Signal::SIGKILL).unwrap();
    first.wait_exit(DEADLINE).await;
    // Before the standby takes over (6 s of silence): no `Leader` condition, no Lease.
    let candidates: Api<LeaseCandidate> = env.api();
    let cleared = json!({ "status": { "conditions": [] } });
    candidates
        .patch_status("u1", &PatchParams::default(), &Patch::Merge(&cleared))
        .await
        .unwrap();
    let leases: Api<Lease> = env.api();
    leases
        .delete("unreported", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the standby to take over", DEADLINE, || async {
        ha_holder(&env).await.filter(|h| *h != active)
    })
    .await;
    // Seen acting at most a second after it took over (it has renewed once since).
    let acting = Instant::now() - Duration::from_secs(1);
    let again = wait_for_holder(&env, "unreported", "u1", Duration::from_secs(60)).await;
    assert!(
        acting.elapsed() >= Duration::from_secs(14),
        "elected {:?} after the standby took over: the unreported term was not waited out",
        acting.elapsed()
    );
    assert!(
        lease::term(&again) > lease::term(&held) + 1,
        "term {} after {}: above the mark",
        lease::term(&again),
        lease::term(&held)
    );
}

/// Waits until `standby` has read the operator's HA lease.
async fn watching_the_operator_lease(standby: &Operator) {
    eventually(
        "the standby to watch the operator lease",
        DEADLINE,
        || async {
            standby
                .logs()
                .contains("watching the operator lease")
                .then_some(())
        },
    )
    .await;
}

/// Operator flags: an HA lease of `lease`, renew deadline 3 s, retry every second, identity `id`.
fn short_ha(lease: &'static str, id: &'static str) -> Vec<&'static str> {
    vec![
        "--ha-lease-duration",
        lease,
        "--ha-renew-deadline",
        "3s",
        "--ha-retry-period",
        "1s",
        "--identity",
        id,
    ]
}

/// The active replica is cut off from the API server past its renew deadline, but not for as
/// long as the HA lease: it stops writing, then, once it can reach the API server again, finds
/// nobody wrote its lease meanwhile and resumes, with what it remembers, instead of a standby
/// starting from nothing. (Before: it exited, and the standby waited out the HA lease and then
/// a full lease duration before judging any lease expired.)
async fn a_briefly_cut_off_operator_resumes_without_a_failover(env: Arc<TestEnv>) {
    use crate::support::agent::{Proxy, apiserver};
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(apiserver(&env.kubeconfig)).await;
    let proxied = proxy.kubeconfig(&env.kubeconfig, dir.path());
    // HA lease 10 s, renew deadline 3 s: a cut of 4 s passes the deadline, not the lease.
    let timings = |id| short_ha("10s", id);
    let mut a = Operator::start_with(&proxied, &env.ns, &timings("brief-a"));
    let a_id = eventually("the proxied operator to be active", DEADLINE, || async {
        ha_holder(&env).await.filter(|h| h.starts_with("brief-a-"))
    })
    .await;
    let b = Operator::start(&env, &timings("brief-b"));
    watching_the_operator_lease(&b).await;
    proxy.cut();
    eventually("the cut-off replica to stop writing", DEADLINE, || async {
        a.logs().contains("stopped writing").then_some(())
    })
    .await;
    proxy.restore();
    eventually("the cut-off replica to resume", DEADLINE, || async {
        a.logs().contains("resumed").then_some(())
    })
    .await;
    assert!(!a.exited(), "{}", a.logs());
    assert_eq!(ha_holder(&env).await.as_deref(), Some(a_id.as_str()));
    assert!(!b.logs().contains("acting as the arbiter"), "{}", b.logs());
    // And it arbitrates.
    let _r = Responder::start(env.client.clone(), &env.ns, &["r1"]);
    create_candidate(&env, "r1", "resumed", "1.0.0", Some("1.0.0"), OEV, None).await;
    wait_for_holder(&env, "resumed", "r1", DEADLINE).await;
}

/// Both replicas lose the API server (as in a kube-apiserver restart) for longer than the HA
/// lease. The standby must not count that time as the active one's silence: it gets the server
/// back first, and still the active one, back a second later, resumes and the standby never
/// acts. (Before: the standby took over at once, and being fresh it waited a full lease
/// duration before judging any lease expired; after a restart, leases stayed leaderless that
/// much longer.)
async fn an_outage_seen_by_both_replicas_is_ridden_out_by_the_active_one(env: Arc<TestEnv>) {
    use crate::support::agent::{Proxy, apiserver};
    let dir = tempfile::tempdir().unwrap();
    let (proxy_a, proxy_b) = (
        Proxy::start(apiserver(&env.kubeconfig)).await,
        Proxy::start(apiserver(&env.kubeconfig)).await,
    );
    let (dir_a, dir_b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&dir_a).unwrap();
    std::fs::create_dir_all(&dir_b).unwrap();
    let (via_a, via_b) = (
        proxy_a.kubeconfig(&env.kubeconfig, &dir_a),
        proxy_b.kubeconfig(&env.kubeconfig, &dir_b),
    );
    // HA lease 6 s, renew deadline 3 s: the outage (8 s) outlasts both.
    let timings = |id| short_ha("6s", id);
    let mut a = Operator::start_with(&via_a, &env.ns, &timings("both-a"));
    let a_id = eventually("the first replica to be active", DEADLINE, || async {
        ha_holder(&env).await.filter(|h| h.starts_with("both-a-"))
    })
    .await;
    let b = Operator::start_with(&via_b, &env.ns, &timings("both-b"));
    watching_the_operator_lease(&b).await;
    proxy_a.cut();
    proxy_b.cut();
    let cut = Instant::now();
    eventually("the active replica to stop writing", DEADLINE, || async {
        a.logs().contains("stopped writing").then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(8).saturating_sub(cut.elapsed())).await;
    proxy_b.restore();
    tokio::time::sleep(Duration::from_secs(1)).await;
    proxy_a.restore();
    eventually("the active replica to resume", DEADLINE, || async {
        a.logs().contains("resumed").then_some(())
    })
    .await;
    // Past the standby's own lease duration after it got the server back: it would have acted
    // by now if it had counted the outage, or if the resume had not reached it.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert!(!a.exited(), "{}", a.logs());
    assert_eq!(ha_holder(&env).await.as_deref(), Some(a_id.as_str()));
    assert!(
        !b.logs().contains("acquired operator lease"),
        "the standby took over: {}",
        b.logs()
    );
}

/// The active replica's connection goes dead (black-holed: requests hang, nothing answers). Its
/// renew hangs too; it must still stop writing at its renew deadline, counted from the last
/// renew it sent, and write nothing after it, before the standby takes over; once it can reach
/// the API server again it finds the standby's write and exits. (Today's main: the renew
/// had no timeout, and the cut-off replica went on believing it was the arbiter.)
async fn a_cut_off_operator_stops_acting_before_the_standby_takes_over(env: Arc<TestEnv>) {
    use crate::support::agent::{Proxy, apiserver};
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(apiserver(&env.kubeconfig)).await;
    let proxied = proxy.kubeconfig(&env.kubeconfig, dir.path());
    let with_identity = |id: &'static str| {
        let mut args = FAST_HA.to_vec();
        args.extend(["--identity", id]);
        args
    };
    let mut a = Operator::start_with(&proxied, &env.ns, &with_identity("cut-a"));
    let a_id = eventually("the proxied operator to be active", DEADLINE, || async {
        ha_holder(&env).await.filter(|h| h.starts_with("cut-a-"))
    })
    .await;
    let b = Operator::start(&env, &with_identity("cut-b"));
    // Work for the arbiter, so that a stale one would have something to write about.
    let _r = Responder::start(env.client.clone(), &env.ns, &["w1", "w2"]);
    create_candidate(&env, "w1", "work", "1.0.0", Some("1.0.0"), OEV, None).await;
    wait_for_holder(&env, "work", "w1", DEADLINE).await;
    eventually("the standby to stand by", DEADLINE, || async {
        b.logs()
            .contains("standing by for the operator lease")
            .then_some(())
    })
    .await;

    proxy.cut();
    let cut_at = jiff::Timestamp::now();
    let b_id = eventually("the standby to take over", DEADLINE, || async {
        ha_holder(&env).await.filter(|h| h.starts_with("cut-b-"))
    })
    .await;
    // By then the cut-off replica had stopped acting (its write gate closed at its renew
    // deadline): it only tries to resume, which the standby's write makes impossible.
    assert!(
        a.logs().contains("stopped writing"),
        "{b_id} took over while the cut-off {a_id} still believed it was the arbiter:\n{}",
        a.logs()
    );
    proxy.restore();
    exits_having_lost(
        &mut a,
        &["lost leadership", "written by someone else meanwhile"],
    )
    .await;
    // The new arbiter works; the old one wrote nothing since the cut (not even an Event).
    create_candidate(&env, "w2", "work2", "1.0.0", Some("1.0.0"), OEV, None).await;
    wait_for_holder(&env, "work2", "w2", DEADLINE).await;
    let events: Api<k8s_openapi::api::core::v1::Event> = env.api();
    let stale: Vec<_> = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reporting_instance.as_deref() == Some(a_id.as_str()))
        .filter(|e| {
            let at = e
                .event_time
                .as_ref()
                .map(|t| t.0)
                .or(e.last_timestamp.as_ref().map(|t| t.0))
                .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0));
            at.is_some_and(|t| t > cut_at)
        })
        .map(|e| (e.reason, e.message))
        .collect();
    assert!(
        stale.is_empty(),
        "written by {a_id} after the cut: {stale:?}"
    );
}

async fn deleting_the_operator_lease_does_not_make_two_arbiters(env: Arc<TestEnv>) {
    let (first, second, active) = two_operators(&env).await;
    operator_lease_edit_does_not_make_two_arbiters(&env, (first, second, active), true).await
}

async fn clearing_the_operator_lease_does_not_make_two_arbiters(env: Arc<TestEnv>) {
    let (first, second, active) = two_operators(&env).await;
    operator_lease_edit_does_not_make_two_arbiters(&env, (first, second, active), false).await
}

/// The same after a rolling replacement: the lease was once released (on SIGTERM), and that
/// old release must not pass for one when the holder is later cleared by hand.
async fn clearing_the_operator_lease_after_a_release_does_not_make_two_arbiters(env: Arc<TestEnv>) {
    let (mut first, second, active) = two_operators(&env).await;
    kill(Pid::from_raw(first.pid()), Signal::SIGTERM).unwrap();
    assert_eq!(first.wait_exit(DEADLINE).await, Some(0));
    let next = eventually("the standby to take over", DEADLINE, || async {
        ha_holder(&env).await.filter(|h| *h != active)
    })
    .await;
    let third = Operator::start(&env, &FAST_HA);
    operator_lease_edit_does_not_make_two_arbiters(&env, (second, third, next), false).await
}

/// Trust-boundary item 9: the operators' HA Lease edited (or restored from a backup) to name
/// the standby, which never acquired it. The standby treats it as anyone else's record: it acts
/// only after a full HA lease duration of silence, by which time the active replica has seen
/// the edit and exited. (Before: the standby acted at once, while the active replica's write
/// gate was still open.)
async fn naming_the_standby_in_the_operator_lease_does_not_make_two_arbiters(env: Arc<TestEnv>) {
    let with = |identity: &'static str| {
        let mut args = FAST_HA.to_vec();
        args.extend(["--identity", identity]);
        args
    };
    let mut first = Operator::start(&env, &with("op-a"));
    eventually("op-a active", DEADLINE, || async {
        ha_holder(&env).await.filter(|h| h.starts_with("op-a-"))
    })
    .await;
    let second = Operator::start(&env, &with("op-b"));
    second.wait_watching().await;
    // Its full identity (a random suffix is added to --identity).
    let logs = crate::support::operator::strip_ansi(&second.logs());
    let op_b = logs
        .split_whitespace()
        .find_map(|w| {
            w.strip_prefix("identity=")
                .filter(|i| i.starts_with("op-b-"))
        })
        .map(str::to_string)
        .expect("op-b's identity in its log");
    set_ha_holder(&env, &op_b).await;
    let edited = Instant::now();
    eventually("the standby to act", DEADLINE, || async {
        second
            .logs()
            .contains("acting as the arbiter")
            .then_some(())
    })
    .await;
    let waited = edited.elapsed();
    assert!(
        first.exited(),
        "op-b acted {waited:?} after the edit while op-a was still running"
    );
    assert!(
        waited >= Duration::from_secs(6),
        "op-b acted {waited:?} after the edit, before a full HA lease duration (6 s)"
    );
    assert_eq!(first.wait_exit(DEADLINE).await, Some(1));
    assert!(first.logs().contains("lost the operator lease"));
}

/// The operators' HA Lease edited by hand to another term while it still names the active
/// replica (what a takeover followed by an edit naming it again, or a backup restored, leaves):
/// the active replica's renewal conflicts, reads the Lease back, and takes the other term as
/// lost leadership (another replica may have acted under it); the standby takes over after a
/// full HA lease duration. (Before, it renewed and went on acting.)
async fn the_operator_lease_at_another_term_is_lost_leadership(env: Arc<TestEnv>) {
    let (mut first, second, active) = two_operators(&env).await;
    second.wait_watching().await;
    let leases: Api<Lease> = env.api();
    let before = leases.get("arbiter-operator").await.unwrap();
    edit_ha_lease(
        &env,
        json!({ "spec": { "leaseTransitions": lease::term(&before) + 1 } }),
    )
    .await;
    exits_having_lost(&mut first, &["lost the operator lease", "taken over since"]).await;
    eventually("the standby to take over", DEADLINE, || async {
        ha_holder(&env).await.filter(|h| *h != active)
    })
    .await;
}

/// The operators' own HA Lease edited by hand (deleted, or its holder cleared): the active
/// replica stops at its next renew, and the standby, which cannot tell the edit from nothing,
/// takes over only after a full HA lease duration. (Before: the standby took over at once while
/// the active replica went on writing until its renew deadline.)
async fn operator_lease_edit_does_not_make_two_arbiters(
    env: &TestEnv,
    (mut first, second, active): (Operator, Operator, String),
    delete: bool,
) {
    // The standby has looked at the lease (a replica that never saw it takes a missing one
    // at once: a fresh install).
    second.wait_watching().await;
    let leases: Api<Lease> = env.api();
    let term_before = lease::term(&leases.get("arbiter-operator").await.unwrap());
    if delete {
        leases
            .delete("arbiter-operator", &DeleteParams::default())
            .await
            .unwrap();
    } else {
        set_ha_holder(env, "").await;
    }
    let next = eventually("the standby to take over", DEADLINE, || async {
        ha_holder(env).await.filter(|h| *h != active)
    })
    .await;
    assert!(
        first.exited(),
        "{next} took over while {active} was still running"
    );
    // Every takeover moves the term, a Lease created again too.
    let term_after = lease::term(&leases.get("arbiter-operator").await.unwrap());
    assert!(
        term_after > term_before,
        "{next} took over at term {term_after}, not above {term_before}"
    );
    assert_eq!(first.wait_exit(DEADLINE).await, Some(1));
    assert!(
        first.logs().contains("lost the operator lease"),
        "{}",
        first.logs()
    );
}

/// Waits for `op` to exit 1, as a replica that lost leadership does, saying each of `why`.
async fn exits_having_lost(op: &mut Operator, why: &[&str]) {
    assert_eq!(
        op.wait_exit(DEADLINE).await,
        Some(1),
        "lost leadership exits 1"
    );
    let logs = op.logs();
    assert!(
        why.iter().all(|w| logs.contains(w)),
        "the replica says why it stopped ({why:?}): {logs}"
    );
}

async fn operator_without_rbac_exits_with_a_clear_error(env: Arc<TestEnv>) {
    let unprivileged = env.kubeconfig.with_file_name("kubeconfig-unprivileged");
    let mut op = Operator::start_with(&unprivileged, &env.ns, &[]);
    let code = op.wait_exit(DEADLINE).await;
    assert_eq!(code, Some(1));
    let logs = op.logs();
    assert!(logs.contains("cannot list LeaseCandidates"), "{logs}");
    assert!(logs.contains("forbidden") || logs.contains("403"), "{logs}");
    // It never took the operator lease.
    let api: Api<Lease> = env.api();
    assert!(api.get_opt("arbiter-operator").await.unwrap().is_none());
}

/// Two stand-in pods without agents as candidates of lease `name`; `a` is the best. Returns
/// them once `a` holds the lease; only `b`'s lease renewals are played, so `a`'s term lapses.
async fn lapsing_pair(
    env: &TestEnv,
    lease_name: &str,
) -> (StandIn, StandIn, Responder, tokio::task::JoinHandle<()>) {
    let r = Responder::start(env.client.clone(), &env.ns, &["pod-a", "pod-b"]);
    let sleep = SLEEP;
    // The pods declare the lease they run for (as `arbiter run --lease` in their spec would):
    // only such a pod is ever forced out.
    let labels = BTreeMap::from([
        ("app".to_string(), "pair".to_string()),
        ("arbiter.dev/lease".to_string(), lease_name.to_string()),
    ]);
    let a = StandIn::spawn(
        env.client.clone(),
        &env.ns,
        "pod-a",
        labels.clone(),
        5,
        "sh",
        &sleep,
    )
    .await;
    let b = StandIn::spawn(
        env.client.clone(),
        &env.ns,
        "pod-b",
        labels,
        5,
        "sh",
        &sleep,
    )
    .await;
    create_candidate(
        env,
        "pod-a",
        lease_name,
        "1.19.0",
        Some("1.19.0"),
        OEV,
        Some(owned_by(&a)),
    )
    .await;
    wait_for_holder(env, lease_name, "pod-a", DEADLINE).await;
    // pod-a goes silent: its term lapses, and it does not answer pings either (a pod-a that
    // answered would be better than pod-b and get the lease back by handover, and pod-b's
    // short term could slip between two polls of the test).
    r.silence("pod-a");
    let renew_b = hold_and_release(env.client.clone(), &env.ns, lease_name, &["pod-b"]);
    create_candidate(
        env,
        "pod-b",
        lease_name,
        "1.20.0",
        Some("1.20.0"),
        OEV,
        Some(owned_by(&b)),
    )
    .await;
    (a, b, r, renew_b)
}

async fn lapsed_holder_pod_still_running_is_evicted(env: Arc<TestEnv>) {
    let _op = Operator::start(&env, &["--lease-duration", "3s"]);
    lapsed_holder_is_evicted(&env, "lapse").await;
}

/// The forced-exit scenario (an operator with a 3 s lease duration must be running): pod-a
/// never renews, its term lapses, pod-b gets the lease, and pod-a, still running with the same
/// containers, is evicted: the stand-in kubelet sees the deletion and stops it.
pub async fn lapsed_holder_is_evicted(env: &TestEnv, lease_name: &str) {
    let (a, _b, _r, renew_b) = lapsing_pair(env, lease_name).await;
    wait_for_holder(env, lease_name, "pod-b", DEADLINE).await;
    assert_eq!(
        a.wait_exit(DEADLINE).await,
        0,
        "pod-a's process was stopped by SIGTERM"
    );
    let events = eventually(
        "an Evicted event on pod-a's candidate",
        DEADLINE,
        || async {
            let ev = events_for(env, "pod-a").await;
            ev.iter().any(|(r, _)| r == "Evicted").then_some(ev)
        },
    )
    .await;
    assert!(
        events.iter().any(|(_, m)| m.contains("(evict)")),
        "{events:?}"
    );
    renew_b.abort();
}

/// The same scenario when eviction is not allowed: returns the EvictionFailed event's message.
pub async fn lapsed_holder_eviction_fails(env: &TestEnv, lease_name: &str) -> String {
    let (a, _b, _r, renew_b) = lapsing_pair(env, lease_name).await;
    wait_for_holder(env, lease_name, "pod-b", DEADLINE).await;
    let message = wait_for_event(env, "pod-a", "EvictionFailed", DEADLINE).await;
    assert_eq!(a.exited(), None, "pod-a was not forced out");
    renew_b.abort();
    message
}

/// A PodDisruptionBudget that refuses every eviction of the pair's pods, once observed.
async fn blocking_pdb(env: &TestEnv) -> Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> {
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let pdbs: Api<PodDisruptionBudget> = env.api();
    let pdb: PodDisruptionBudget = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "pair"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "pair"}}},
    }))
    .unwrap();
    pdbs.create(&Default::default(), &pdb).await.unwrap();
    // The disruption controller must have computed the budget before evictions are judged.
    eventually("the PDB to be observed", DEADLINE, || async {
        let p = pdbs.get("pair").await.ok()?;
        (p.status?.observed_generation? >= 1).then_some(())
    })
    .await;
    pdbs
}

/// The forced exit a PDB holds back is recorded on the Lease: when the active operator dies,
/// the replica that takes over carries it on. (Today's main kept it only in the dead replica's
/// memory: the lapsed holder's pod was never forced out.)
async fn a_blocked_forced_exit_survives_an_operator_failover(env: Arc<TestEnv>) {
    let pdbs = blocking_pdb(&env).await;
    let mut args = FAST_HA.to_vec();
    args.extend(["--lease-duration", "3s"]);
    let mut first = Operator::start(&env, &args);
    let active = eventually("an active operator", DEADLINE, || ha_holder(&env)).await;
    let _second = Operator::start(&env, &args);
    let (a, _b, _r, renew_b) = lapsing_pair(&env, "carried").await;
    wait_for_holder(&env, "carried", "pod-b", DEADLINE).await;
    wait_for_event(&env, "pod-a", "EvictionBlocked", DEADLINE).await;
    let leases: Api<Lease> = env.api();
    eventually("the pending forced exit on the Lease", DEADLINE, || async {
        let l = leases.get("carried").await.ok()?;
        l.annotations()
            .get("arbiter.dev/pending-forced-exits")
            .filter(|v| v.contains("pod-a"))
            .cloned()
    })
    .await;
    kill(Pid::from_raw(first.pid()), Signal::SIGKILL).unwrap();
    first.wait_exit(DEADLINE).await;
    eventually("the standby to take over", DEADLINE, || async {
        ha_holder(&env).await.filter(|h| *h != active)
    })
    .await;
    assert_eq!(a.exited(), None, "the PDB kept pod-a running");
    pdbs.delete("pair", &DeleteParams::default()).await.unwrap();
    assert_eq!(
        a.wait_exit(DEADLINE).await,
        0,
        "the new arbiter forced the lapsed holder's pod out"
    );
    renew_b.abort();
}

/// Trust-boundary item 6 (a confused deputy): the rights of a candidate's agent (write
/// candidates and Leases in the namespace) must not get another team's pod evicted. A
/// candidate whose `ownerReferences` name a stranger's pod is elected and goes silent; its
/// term lapses; and someone writes a pending forced exit of that pod on the Lease by hand. The
/// pod declares no lease (no `arbiter run --lease` in its spec, no `arbiter.dev/lease` label):
/// it is never recorded as the pod of the term, the forged entry is refused and reported, and
/// it keeps running. (Before: it was evicted.)
async fn a_pod_that_does_not_declare_the_lease_is_never_forced_out(env: Arc<TestEnv>) {
    let _op = Operator::start(&env, &["--lease-duration", "3s"]);
    let r = Responder::start(env.client.clone(), &env.ns, &["evil", "other"]);
    let sleep = SLEEP;
    let victim = StandIn::spawn(
        env.client.clone(),
        &env.ns,
        "victim",
        BTreeMap::new(),
        5,
        "sh",
        &sleep,
    )
    .await;
    create_candidate(
        &env,
        "evil",
        "stolen",
        "1.19.0",
        Some("1.19.0"),
        OEV,
        Some(owned_by(&victim)),
    )
    .await;
    wait_for_holder(&env, "stolen", "evil", DEADLINE).await;
    r.silence("evil");
    let renew_other = hold_and_release(env.client.clone(), &env.ns, "stolen", &["other"]);
    create_candidate(&env, "other", "stolen", "1.20.0", Some("1.20.0"), OEV, None).await;
    let held = wait_for_holder(&env, "stolen", "other", DEADLINE).await;
    // The victim was never recorded as the pod of evil's term (it does not vouch for evil), so
    // the lapse deposes no pod.
    assert!(
        !held
            .annotations()
            .get("arbiter.dev/pending-forced-exits")
            .is_some_and(|v| v.contains("victim")),
        "{:?}",
        held.annotations()
    );
    // A pending forced exit written by hand.
    let leases: Api<Lease> = env.api();
    let forged = format!("evil/victim/{}/0", victim.uid);
    let annotate = PatchParams {
        field_manager: Some("kubectl-annotate".into()),
        ..PatchParams::default()
    };
    let p =
        json!({ "metadata": { "annotations": { "arbiter.dev/pending-forced-exits": forged } } });
    leases
        .patch("stolen", &annotate, &Patch::Merge(&p))
        .await
        .unwrap();
    wait_for_event(&env, "stolen", "ForcedExitRefused", DEADLINE).await;
    eventually("the forged entry removed", DEADLINE, || async {
        let l = leases.get("stolen").await.ok()?;
        (!l.annotations()
            .get("arbiter.dev/pending-forced-exits")
            .is_some_and(|v| v.contains("victim")))
        .then_some(())
    })
    .await;
    assert_eq!(victim.exited(), None, "the stranger's pod was forced out");
    let events = events_for(&env, "victim").await;
    assert!(
        !events.iter().any(|(r, _)| r == "Evicted" || r == "Killing"),
        "{events:?}"
    );
    renew_other.abort();
}

/// Found by the review of the trust-boundary work: the pod a term is recorded in must vouch
/// for the holder. Candidate `a`'s process runs elsewhere (a played holder renews its lease),
/// but its candidate names a Job's pod that declares nothing. When that pod ends, `a`'s term
/// runs on: the pod's stop proves its own processes gone, not `a`'s. (Before: `b` was
/// assigned at once while `a` still held and renewed.)
async fn only_a_pod_that_declares_its_holder_ends_a_term_early(env: Arc<TestEnv>) {
    let op = Operator::start(&env, &["--lease-duration", "10s"]);
    eventually("the operator acting", DEADLINE, || async {
        op.logs().contains("acting as the arbiter").then_some(())
    })
    .await;
    let _r = Responder::start(env.client.clone(), &env.ns, &["a", "b"]);
    // A Job's pod: it runs a while and succeeds (it stays, Succeeded, and so does the
    // candidate it owns).
    let job = StandIn::spawn(
        env.client.clone(),
        &env.ns,
        "job",
        BTreeMap::new(),
        1,
        "sh",
        &["-c", "sleep 12"],
    )
    .await;
    create_candidate(
        &env,
        "a",
        "vouch",
        "1.19.0",
        Some("1.19.0"),
        OEV,
        Some(owned_by(&job)),
    )
    .await;
    let renew = hold_and_release(env.client.clone(), &env.ns, "vouch", &["a"]);
    let held = wait_for_holder(&env, "vouch", "a", DEADLINE).await;
    create_candidate(&env, "b", "vouch", "1.20.0", Some("1.20.0"), OEV, None).await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = env.api();
    job.wait_exit(DEADLINE).await;
    eventually("the job's pod Succeeded", DEADLINE, || async {
        let p = pods.get("job").await.ok()?;
        (p.status?.phase.as_deref() == Some("Succeeded")).then_some(())
    })
    .await;
    let leases: Api<Lease> = env.api();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(15) {
        let l = leases.get("vouch").await.unwrap();
        assert_eq!(
            (lease::holder(&l), lease::term(&l)),
            (Some("a"), lease::term(&held)),
            "a's term was ended {:?} after the job's pod ended",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        !held
            .annotations()
            .contains_key(lease::HOLDER_POD_ANNOTATION),
        "a pod that does not declare the holder is not recorded"
    );
    renew.abort();
}

async fn eviction_blocked_by_pdb_is_reported_and_retried(env: Arc<TestEnv>) {
    let pdbs = blocking_pdb(&env).await;
    let _op = Operator::start(&env, &["--lease-duration", "3s"]);
    let (a, _b, _r, renew_b) = lapsing_pair(&env, "blocked").await;
    wait_for_holder(&env, "blocked", "pod-b", DEADLINE).await;
    eventually("an EvictionBlocked event", DEADLINE, || async {
        events_for(&env, "pod-a")
            .await
            .iter()
            .any(|(r, _)| r == "EvictionBlocked")
            .then_some(())
    })
    .await;
    assert_eq!(a.exited(), None, "the PDB kept pod-a running");
    // Lifting the budget lets the retry through.
    pdbs.delete("pair", &DeleteParams::default()).await.unwrap();
    assert_eq!(a.wait_exit(DEADLINE).await, 0);
    renew_b.abort();
}

async fn status_shows_holder_term_and_candidates(env: Arc<TestEnv>) {
    let op = Operator::start(&env, &[]);
    let _r = Responder::start(env.client.clone(), &env.ns, &["s1", "s2"]);
    create_candidate(&env, "s1", "shown", "1.30.0", Some("1.30.0"), OEV, None).await;
    create_candidate(&env, "s2", "shown", "1.31.0", Some("1.31.0"), OEV, None).await;
    wait_for_holder(&env, "shown", "s1", DEADLINE).await;
    // Counted by the operator (an eligible candidate gets no status: nothing to report).
    op.wait_eligible(&env.ns, "s2").await;
    let run = |program: &str, args: &[&str], path: Option<&std::path::Path>| {
        let mut cmd = std::process::Command::new(program);
        cmd.args(args).env("KUBECONFIG", &env.kubeconfig);
        if let Some(dir) = path {
            cmd.env(
                "PATH",
                format!("{}:{}", dir.display(), std::env::var("PATH").unwrap()),
            );
        }
        let out = cmd.output().expect("running status");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let bin = env!("CARGO_BIN_EXE_arbiter");
    let table = run(bin, &["status", "-n", &env.ns], None);
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        [
            "LEASE",
            "HOLDER",
            "TERM",
            "HOLDER",
            "VERSION",
            "CANDIDATES",
            "PREFERRED",
            "STATE",
            "AGE"
        ],
        "{table}"
    );
    assert_eq!(
        lines[1][..7],
        ["shown", "s1", "1", "1.30.0", "2", "-", "Held"],
        "{table}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&run(bin, &["status", "-n", &env.ns, "-o", "json"], None)).unwrap();
    assert_eq!(json[0]["holder"], "s1");
    assert_eq!(json[0]["candidates"], serde_json::json!(["s1", "s2"]));
    // -o wide says why each candidate is or is not eligible (an eligible one: nothing reported).
    let wide = run(bin, &["status", "-n", &env.ns, "-o", "wide"], None);
    let s2 = wide
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("s2"))
        .unwrap_or_else(|| panic!("no s2 row:\n{wide}"));
    assert_eq!(
        s2.split_whitespace().collect::<Vec<_>>()[..6],
        [
            "shown",
            "s2",
            "1.31.0",
            "1.31.0",
            "True",
            "NothingReported:"
        ],
        "{wide}"
    );
    // --kubeconfig and --context, as kubectl's, without KUBECONFIG.
    let context = std::fs::read_to_string(&env.kubeconfig)
        .unwrap()
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("current-context: ")
                .map(str::to_string)
        })
        .expect("a current context");
    let explicit = std::process::Command::new(bin)
        .args(["status", "-n", &env.ns, "--kubeconfig"])
        .arg(&env.kubeconfig)
        .args(["--context", &context])
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    assert!(
        explicit.status.success(),
        "{}",
        String::from_utf8_lossy(&explicit.stderr)
    );
    // The same row, but for AGE, which may have ticked over between the two calls.
    let without_age = |t: &str| -> Option<Vec<String>> {
        let words: Vec<String> = t
            .lines()
            .nth(1)?
            .split_whitespace()
            .map(String::from)
            .collect();
        Some(words[..words.len() - 1].to_vec())
    };
    assert_eq!(
        without_age(&String::from_utf8_lossy(&explicit.stdout)),
        without_age(&table)
    );
    let wrong = std::process::Command::new(bin)
        .args(["status", "-n", &env.ns, "--context", "no-such-context"])
        .env("KUBECONFIG", &env.kubeconfig)
        .output()
        .unwrap();
    assert!(!wrong.status.success());
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("no-such-context"));
    // --exit-code: 0 while every lease has a live holder; 1 once one has none. --watch prints
    // the change.
    let code = |args: &[&str]| {
        std::process::Command::new(bin)
            .args(args)
            .env("KUBECONFIG", &env.kubeconfig)
            .status()
            .unwrap()
            .code()
    };
    assert_eq!(code(&["status", "-n", &env.ns, "--exit-code"]), Some(0));
    let mut watch = std::process::Command::new(bin)
        .args(["status", "-n", &env.ns, "--watch"])
        .env("KUBECONFIG", &env.kubeconfig)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let leases: Api<Lease> = env.api();
    let orphan: Lease = serde_json::from_value(json!({
        "metadata": {"name": "orphan", "labels": {lease::MANAGED_LABEL: "true"}},
        "spec": {},
    }))
    .unwrap();
    leases.create(&Default::default(), &orphan).await.unwrap();
    assert_eq!(code(&["status", "-n", &env.ns, "--exit-code"]), Some(1));
    let stdout = watch.stdout.take().unwrap();
    let seen = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find(|l| l.starts_with("orphan") && l.contains("NoHolder"))
    });
    let seen = tokio::time::timeout(DEADLINE, seen).await;
    let _ = watch.kill();
    assert!(
        matches!(seen, Ok(Ok(Some(_)))),
        "--watch did not print the new lease"
    );
    let _ = watch.wait();
    // As a kubectl plugin.
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(bin, dir.path().join("kubectl-arbiter")).unwrap();
    let plugin = run(
        "kubectl",
        &["arbiter", "status", "-n", &env.ns],
        Some(dir.path()),
    );
    assert_eq!(
        plugin
            .lines()
            .find(|l| l.starts_with("shown"))
            .map(|l| l.split_whitespace().take(7).collect::<Vec<_>>()),
        Some(lines[1][..7].to_vec())
    );
}

/// `count` leases `{prefix}-NN`, each with two candidates registered: `{prefix}-NN-old` at
/// 1.30.0 and `{prefix}-NN-new` at 1.31.0 (OldestEmulationVersion elects the old one). Returns
/// (lease, old, new) per lease.
async fn register_old_and_new(
    env: &TestEnv,
    prefix: &str,
    count: usize,
) -> Vec<(String, String, String)> {
    let leases: Vec<(String, String, String)> = (0..count)
        .map(|i| {
            let l = format!("{prefix}-{i:02}");
            (l.clone(), format!("{l}-old"), format!("{l}-new"))
        })
        .collect();
    for (lease, old, new) in &leases {
        create_candidate(env, old, lease, "1.30.0", Some("1.30.0"), OEV, None).await;
        create_candidate(env, new, lease, "1.31.0", Some("1.31.0"), OEV, None).await;
    }
    leases
}

/// Both candidates' names of every lease `register_old_and_new` made.
fn both_names(leases: &[(String, String, String)]) -> Vec<&str> {
    leases
        .iter()
        .flat_map(|(_, o, n)| [o.as_str(), n.as_str()])
        .collect()
}

/// A burst of first elections, then a burst of re-elections (holders that stop renewing
/// together): an election writes no candidate's status (every candidate here is eligible
/// throughout: nothing to report; the Lease says who holds it), and one Event, `Elected` on
/// the new holder, which names whose term ended and how. No `Deposed`.
async fn elections_write_no_status_and_one_event_each(env: Arc<TestEnv>) {
    const LEASES: usize = 30;
    let leases = register_old_and_new(&env, "lapse", LEASES).await;
    let names = both_names(&leases);
    let _r = Responder::start(env.client.clone(), &env.ns, &names);
    // Every holder renews its Lease until it is taken off this list.
    let renewing: Arc<std::sync::Mutex<std::collections::HashSet<String>>> = Arc::new(
        std::sync::Mutex::new(names.iter().map(|n| n.to_string()).collect()),
    );
    let renewer = {
        let (api, renewing) = (env.api::<Lease>(), renewing.clone());
        tokio::spawn(async move {
            loop {
                for mut l in api
                    .list(&Default::default())
                    .await
                    .map(|l| l.items)
                    .unwrap_or_default()
                {
                    let holds =
                        lease::holder(&l).is_some_and(|h| renewing.lock().unwrap().contains(h));
                    if holds && l.name_any().starts_with("lapse-") {
                        l.spec.as_mut().unwrap().renew_time = Some(lease::now());
                        let _ = api.replace(&l.name_any(), &PostParams::default(), &l).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let held_by = |which: fn(&(String, String, String)) -> &String| {
        let env = env.clone();
        let leases = leases.clone();
        async move {
            let api: Api<Lease> = env.api();
            let mut held = 0;
            for l in &leases {
                let lease = api.get_opt(&l.0).await.ok()??;
                held += usize::from(lease::holder(&lease) == Some(which(l).as_str()));
            }
            (held == LEASES).then_some(())
        }
    };
    let _op = Operator::start(&env, &["--concurrency", "1", "--lease-duration", "5s"]);
    eventually(
        "every lease held by its oldest candidate",
        Duration::from_secs(90),
        || held_by(|l| &l.1),
    )
    .await;
    // The old holders stop renewing at once: their terms lapse together.
    for (_, old, _) in &leases {
        renewing.lock().unwrap().remove(old);
    }
    eventually(
        "every lease moved to its newer candidate",
        Duration::from_secs(90),
        || held_by(|l| &l.2),
    )
    .await;
    renewer.abort();
    // Every election's Event is there (they are sent in the background).
    let events = eventually("an Elected Event for each election", DEADLINE, || async {
        let events: Vec<_> = events_in(&env)
            .await
            .into_iter()
            .filter(|(_, reason, _)| reason == "Elected" || reason == "Deposed")
            .collect();
        (events.len() >= 2 * LEASES).then_some(events)
    })
    .await;
    let candidates: Api<LeaseCandidate> = env.api();
    for (lease, old, new) in &leases {
        for name in [old, new] {
            let c = candidates.get(name).await.unwrap();
            let conditions = c.status.map(|s| s.conditions).unwrap_or_default();
            assert!(conditions.is_empty(), "{name}'s status: {conditions:?}");
        }
        let on = |name: &str| -> Vec<&String> {
            events
                .iter()
                .filter(|(n, _, _)| n == name)
                .map(|(_, _, m)| m)
                .collect()
        };
        assert_eq!(
            on(old),
            [&format!("elected holder of lease {lease} at term 1")],
            "{old}"
        );
        let moved = on(new);
        assert_eq!(moved.len(), 1, "{new}: {moved:?}");
        assert!(
            moved[0].starts_with(&format!("elected holder of lease {lease} at term "))
                && moved[0].ends_with(&format!(", after {old} (its term lapsed)")),
            "{new}: {moved:?}"
        );
    }
}

/// Every Event in `env`'s namespace: the object it is on, its reason, its message.
async fn events_in(env: &TestEnv) -> Vec<(String, String, String)> {
    let api: Api<k8s_openapi::api::core::v1::Event> = env.api();
    api.list(&Default::default())
        .await
        .expect("listing events")
        .items
        .into_iter()
        .map(|e| {
            (
                e.involved_object.name.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default(),
            )
        })
        .collect()
}

/// A candidate without a pod whose renewal is older than `--candidate-expiry` is deleted; one
/// that never wrote `renewTime` (made by hand) counts from its creation and is kept, though the
/// reconciles that deleted the other and elected a holder judged it.
async fn stale_candidates_without_a_pod_are_deleted(env: Arc<TestEnv>) {
    let _op = Operator::start(&env, &["--candidate-expiry", "15m"]);
    let _r = Responder::start(env.client.clone(), &env.ns, &["fresh"]);
    let api: Api<LeaseCandidate> = env.api();
    // First: the candidate watch delivers in order, so every later reconcile of "gc" sees it.
    create_candidate(&env, "by-hand", "gc", "1.0.0", Some("1.0.0"), OEV, None).await;
    let never_renewed = json!({"spec": {"renewTime": null}});
    api.patch(
        "by-hand",
        &PatchParams::default(),
        &Patch::Merge(&never_renewed),
    )
    .await
    .unwrap();
    create_candidate(&env, "fresh", "gc", "1.0.0", Some("1.0.0"), OEV, None).await;
    create_candidate(&env, "stale", "gc", "1.0.0", Some("1.0.0"), OEV, None).await;
    let old = jiff::Timestamp::now() - jiff::SignedDuration::from_hours(1);
    let patch = serde_json::json!({"spec": {"renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(old)}});
    api.patch(
        "stale",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .unwrap();
    eventually("the stale candidate to be deleted", DEADLINE, || async {
        api.get_opt("stale").await.ok()?.is_none().then_some(())
    })
    .await;
    wait_for_holder(&env, "gc", "fresh", DEADLINE).await;
    assert!(api.get_opt("fresh").await.unwrap().is_some());
    assert!(
        api.get_opt("by-hand").await.unwrap().is_some(),
        "a candidate that never renewed was deleted at once"
    );
}

/// The metric table of docs/reference/observability.md is the truth: every family a running operator exposes is listed
/// with its type, and every listed metric is exposed (a family with labels appears once it has
/// a series: an election here gives the per-lease ones theirs; forced exits, single-active
/// workloads and the injection webhook, which give `forced_depositions`, `active_pods` and
/// `webhook_admissions` theirs, are other tests' business).
/// The operator's Event recorder on a real API server: a repeat of an Event (same object,
/// reason and note) raises the first one's series count, which the API server accepts as a
/// merge patch; another note is another Event.
async fn a_repeated_event_is_counted_on_the_first(env: Arc<TestEnv>) {
    use arbiter::operator::report::Recorder;
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::events::v1::Event as K8sEvent;
    use kube::runtime::events::{Event, EventType, Reporter};

    let recorder = Recorder::new(env.client.clone(), Reporter::from("arbiter-e2e"));
    let regarding = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ConfigMap".into()),
        name: Some("repeated".into()),
        namespace: Some(env.ns.clone()),
        ..ObjectReference::default()
    };
    let event = |note: &str| Event {
        type_: EventType::Warning,
        reason: "Repeated".into(),
        note: Some(note.into()),
        action: "Repeated".into(),
        secondary: None,
    };
    for _ in 0..3 {
        recorder
            .publish(&event("the same"), &regarding)
            .await
            .unwrap();
    }
    recorder
        .publish(&event("another"), &regarding)
        .await
        .unwrap();
    let events: Api<K8sEvent> = env.api();
    let mut sent: Vec<(String, Option<i32>)> = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Repeated"))
        .map(|e| (e.note.unwrap_or_default(), e.series.map(|s| s.count)))
        .collect();
    sent.sort();
    assert_eq!(
        sent,
        [
            ("another".to_string(), None),
            ("the same".to_string(), Some(3))
        ]
    );
}

async fn the_docs_list_every_metric_the_operator_exposes(env: Arc<TestEnv>) {
    use std::collections::BTreeSet;
    let op = Operator::start(&env, &[]);
    let _r = Responder::start(env.client.clone(), &env.ns, &["m1"]);
    create_candidate(&env, "m1", "metered", "1.0.0", Some("1.0.0"), OEV, None).await;
    wait_for_holder(&env, "metered", "m1", DEADLINE).await;
    let exposed = |text: &str| -> BTreeSet<(String, String)> {
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| {
                let (name, kind) = l.split_once(' ')?;
                Some((name.to_string(), kind.to_string()))
            })
            .collect()
    };
    let listed = crate::support::documented_metrics();
    let family = |m: &crate::support::DocumentedMetric| (m.family().to_string(), m.kind.clone());
    let must_show: BTreeSet<(String, String)> = listed
        .iter()
        .filter(|m| {
            !m.labelled
                || !(m.name.ends_with("_forced_depositions_total")
                    || m.name.ends_with("_active_pods")
                    || m.name.ends_with("_webhook_admissions_total")
                    || m.name.ends_with("_unwrapped_evictions_total"))
        })
        .map(family)
        .collect();
    let text = eventually("every listed metric on /metrics", DEADLINE, || async {
        let m = op.http_get("/metrics").await;
        must_show.is_subset(&exposed(&m)).then_some(m)
    })
    .await;
    let all_listed: BTreeSet<(String, String)> = listed.iter().map(family).collect();
    let unlisted: Vec<_> = exposed(&text).difference(&all_listed).cloned().collect();
    assert!(
        unlisted.is_empty(),
        "exposed but not in docs/reference/observability.md: {unlisted:?}"
    );
    // The queue's metrics count what the workers did: the election's reconciles waited (each
    // counted once), and the queue is empty once the lease is held and nothing is due.
    let sample = |text: &str, name: &str| {
        text.lines()
            .find(|l| l.split(' ').next() == Some(name))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    let waits = sample(&text, "arbiter_queue_wait_seconds_count").expect("the wait count");
    assert!(waits >= 1.0, "no reconcile counted: {waits}");
    eventually("the queue to drain", DEADLINE, || async {
        let m = op.http_get("/metrics").await;
        (sample(&m, "arbiter_queue_depth") == Some(0.0)).then_some(())
    })
    .await;
}

/// `arbiter status --watch` while its connection to the API server goes dead (a proxy that
/// black-holes it): it says so and retries, and once the connection is back it prints what
/// changed meanwhile. (Before: the first failed look ended the watch.)
async fn status_watch_rides_out_an_unreachable_api_server(env: Arc<TestEnv>) {
    use crate::support::agent::{Proxy, apiserver};
    use std::io::BufRead;
    let _op = Operator::start(&env, &[]);
    let _r = Responder::start(env.client.clone(), &env.ns, &["w1", "w2"]);
    create_candidate(&env, "w1", "watched", "1.0.0", Some("1.0.0"), OEV, None).await;
    wait_for_holder(&env, "watched", "w1", DEADLINE).await;
    let proxy = Proxy::start(apiserver(&env.kubeconfig)).await;
    let dir = tempfile::tempdir().unwrap();
    let mut watch = std::process::Command::new(env!("CARGO_BIN_EXE_arbiter"))
        .args(["status", "-n", &env.ns, "--watch", "--kubeconfig"])
        .arg(proxy.kubeconfig(&env.kubeconfig, dir.path()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Every line printed so far, on stdout and stderr.
    let lines = Arc::new(std::sync::Mutex::new((
        Vec::<String>::new(),
        Vec::<String>::new(),
    )));
    let (out, err) = (watch.stdout.take().unwrap(), watch.stderr.take().unwrap());
    let (o, e) = (lines.clone(), lines.clone());
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            o.lock().unwrap().0.push(l);
        }
    });
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            e.lock().unwrap().1.push(l);
        }
    });
    let printed = |prefix: &'static str| {
        let lines = lines.clone();
        move || {
            let lines = lines.clone();
            async move {
                lines
                    .lock()
                    .unwrap()
                    .0
                    .iter()
                    .any(|l| l.starts_with(prefix))
                    .then_some(())
            }
        }
    };
    eventually(
        "the watch to print the lease",
        DEADLINE,
        printed("watched "),
    )
    .await;
    proxy.cut();
    eventually(
        "the watch to report the dead connection",
        Duration::from_secs(90),
        || async {
            lines
                .lock()
                .unwrap()
                .1
                .iter()
                .any(|l| l.contains("retrying"))
                .then_some(())
        },
    )
    .await;
    assert!(watch.try_wait().unwrap().is_none(), "the watch gave up");
    create_candidate(&env, "w2", "watched2", "1.0.0", Some("1.0.0"), OEV, None).await;
    wait_for_holder(&env, "watched2", "w2", DEADLINE).await;
    proxy.restore();
    eventually(
        "the watch to print the lease elected meanwhile",
        Duration::from_secs(90),
        printed("watched2 "),
    )
    .await;
    let _ = watch.kill();
    let _ = watch.wait();
}
