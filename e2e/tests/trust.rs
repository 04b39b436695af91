//! The trust boundary: clocks the arbiter does not own, and objects it did not write, must not
//! move a lease, elect the dead, or stall an election. Each test makes such a clock or object
//! (an agent whose wall clock runs ahead, a candidate or a ping written by hand) beside real
//! agents and a real operator.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arbiter::api::{LeaseCandidate, LeaseCandidateSpec, OLDEST_EMULATION_VERSION as OEV};
use arbiter::lease;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, PostParams};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::support::agent::{Agent, agent_args, alive, read_log, starts, wait_started};
use crate::support::operator::{Operator, Responder, condition, wait_for_holder};
use crate::support::{TestEnv, eventually, wait_for_event};

crate::tests![trust:
    a_candidate_whose_clock_runs_ahead_does_not_keep_the_lease_after_it_dies,
    a_holder_whose_wall_clock_stands_still_keeps_its_lease,
    a_hand_made_candidate_with_a_future_renew_time_takes_nothing,
    a_ping_stamped_ahead_does_not_stall_the_election,
    a_malformed_then_deleted_candidate_leaves_no_reconcile_failing,
    a_lease_arbiter_did_not_make_is_waited_out_then_adopted,
    candidates_started_together_elect_the_oldest_from_the_first_term,
    a_handed_over_agent_stands_by_and_leads_again,
];

const DEADLINE: Duration = Duration::from_secs(45);

/// A candidate made by hand (no process behind it), at `version`, with `renewTime` and
/// `pingTime` as given.
async fn ghost(
    env: &TestEnv,
    name: &str,
    lease: &str,
    version: &str,
    renew: Option<jiff::Timestamp>,
    ping: Option<jiff::Timestamp>,
) {
    let api: Api<LeaseCandidate> = env.api();
    let c = LeaseCandidate::new(
        name,
        LeaseCandidateSpec {
            lease_name: lease.into(),
            binary_version: version.into(),
            emulation_version: Some(version.into()),
            strategy: OEV.into(),
            ping_time: ping.map(MicroTime),
            renew_time: renew.map(MicroTime),
        },
    );
    api.create(&PostParams::default(), &c)
        .await
        .unwrap_or_else(|e| panic!("creating candidate {name}: {e}"));
}

/// Watches `lease` for `window`: it must keep naming `holder` at `term`, with no handover
/// requested, while `agent` runs.
async fn stays(
    env: &TestEnv,
    lease: &str,
    holder: &str,
    term: i32,
    agent: &mut Agent,
    window: Duration,
) {
    let leases: Api<Lease> = env.api();
    let start = Instant::now();
    while start.elapsed() < window {
        let l = leases.get(lease).await.expect("the Lease");
        assert_eq!(
            (
                lease::holder(&l),
                lease::term(&l),
                lease::preferred_holder(&l)
            ),
            (Some(holder), term, None),
            "the lease moved {:?} after it was {holder}'s",
            start.elapsed()
        );
        assert!(
            agent.child.try_wait().unwrap().is_none(),
            "{holder}'s agent exited"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Trust-boundary item 1: `c1` (1.30.0) runs with its wall clock 10 minutes ahead (its
/// monotonic clock true) and leads; it is SIGKILLed. `c2` (1.31.0) gets the lease after expiry
/// and keeps it: `c1`'s last `renewTime`, ten minutes in the future, answers no ping.
async fn a_candidate_whose_clock_runs_ahead_does_not_keep_the_lease_after_it_dies(
    env: Arc<TestEnv>,
) {
    let op = Operator::start(&env, &[]);
    op.wait_ready().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("work.log");
    let args = agent_args(&env.ns, "c1", "ahead", "1.30.0", &log);
    let mut c1 = Agent::spawn_with_clock(&env.kubeconfig, "c1", &args, &log, "+10m");
    // A live candidate whose clock runs ahead is elected: it answers pings.
    let first = wait_for_holder(&env, "ahead", "c1", DEADLINE).await;
    wait_started(&log, "c1").await;
    let mut c2 = Agent::spawn(&env.kubeconfig, &env.ns, "c2", "ahead", "1.31.0", &log);
    let candidates: Api<LeaseCandidate> = env.api();
    eventually("c2 registered", DEADLINE, || async {
        candidates.get_opt("c2").await.ok().flatten()
    })
    .await;
    kill(Pid::from_raw(c1.pid()), Signal::SIGKILL).unwrap();
    c1.child.wait().unwrap();
    let held = wait_for_holder(&env, "ahead", "c2", DEADLINE).await;
    assert!(lease::term(&held) > lease::term(&first));
    // Two lease durations: before, c2 was asked to hand over to the dead c1 within 30 ms, and
    // c1 was then assigned term after term.
    stays(
        &env,
        "ahead",
        "c2",
        lease::term(&held),
        &mut c2,
        Duration::from_secs(30),
    )
    .await;
    let (status, reason) = condition(&env, "c1", "Eligible")
        .await
        .expect("c1's Eligible condition");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "Unresponsive")
    );
    drop(op);
}

/// A holder whose wall clock stands still (libfaketime's absolute time, its monotonic clock
/// true) renews with `renewTime`s that must still differ: the arbiter counts a renewal by the
/// record changing, and the API server does not write an update that changes nothing. Before,
/// its renewals rewrote the same instant, the record looked silent, and a live candidate was
/// elected after the lease duration while its workload ran.
async fn a_holder_whose_wall_clock_stands_still_keeps_its_lease(env: Arc<TestEnv>) {
    let op = Operator::start(&env, &[]);
    op.wait_ready().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("work.log");
    // Stopped at the true time now, so its registration is fresh when the arbiter sees it.
    let frozen = jiff::Timestamp::now()
        .strftime("%Y-%m-%d %H:%M:%S")
        .to_string();
    let args = agent_args(&env.ns, "c1", "still", "1.30.0", &log);
    let mut c1 = Agent::spawn_with_clock(&env.kubeconfig, "c1", &args, &log, &frozen);
    let first = wait_for_holder(&env, "still", "c1", DEADLINE).await;
    wait_started(&log, "c1").await;
    let _c2 = Agent::spawn(&env.kubeconfig, &env.ns, "c2", "still", "1.31.0", &log);
    let candidates: Api<LeaseCandidate> = env.api();
    eventually("c2 registered", DEADLINE, || async {
        candidates.get_opt("c2").await.ok().flatten()
    })
    .await;
    // Two lease durations.
    stays(
        &env,
        "still",
        "c1",
        lease::term(&first),
        &mut c1,
        Duration::from_secs(30),
    )
    .await;
    drop(op);
}

/// Trust-boundary item 2: a candidate applied by hand next to a live holder, at an older
/// version, with `renewTime` an hour ahead and nothing behind it, is pinged, found
/// unresponsive, and takes nothing: no handover is asked of the live holder.
async fn a_hand_made_candidate_with_a_future_renew_time_takes_nothing(env: Arc<TestEnv>) {
    let op = Operator::start(&env, &[]);
    op.wait_ready().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("work.log");
    let mut g1 = Agent::spawn(&env.kubeconfig, &env.ns, "g1", "ghosted", "1.31.0", &log);
    let held = wait_for_holder(&env, "ghosted", "g1", DEADLINE).await;
    let an_hour_ahead = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1);
    ghost(
        &env,
        "ghost",
        "ghosted",
        "1.30.0",
        Some(an_hour_ahead),
        None,
    )
    .await;
    eventually("the ghost reported Unresponsive", DEADLINE, || async {
        condition(&env, "ghost", "Eligible")
            .await
            .filter(|(s, r)| s == "False" && r == "Unresponsive")
    })
    .await;
    stays(
        &env,
        "ghosted",
        "g1",
        lease::term(&held),
        &mut g1,
        Duration::from_secs(20),
    )
    .await;
    drop(op);
}

/// Trust-boundary item 3: a candidate without a process whose `pingTime` is two minutes ahead
/// (what a replica with a clock ahead, or a hand edit, writes) does not hold up the election
/// after the holder dies: the live standby is elected within a lease duration and an ack
/// window, not when the wall clock passes that ping.
async fn a_ping_stamped_ahead_does_not_stall_the_election(env: Arc<TestEnv>) {
    let op = Operator::start(&env, &[]);
    op.wait_ready().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("work.log");
    let mut h = Agent::spawn(&env.kubeconfig, &env.ns, "h", "stamped", "1.31.0", &log);
    wait_for_holder(&env, "stamped", "h", DEADLINE).await;
    let s = Agent::spawn(&env.kubeconfig, &env.ns, "s", "stamped", "1.31.0", &log);
    let ahead = jiff::Timestamp::now() + jiff::SignedDuration::from_mins(2);
    ghost(&env, "p1", "stamped", "1.30.0", None, Some(ahead)).await;
    let candidates: Api<LeaseCandidate> = env.api();
    eventually("s registered", DEADLINE, || async {
        candidates.get_opt("s").await.ok().flatten()
    })
    .await;
    kill(Pid::from_raw(h.pid()), Signal::SIGKILL).unwrap();
    h.child.wait().unwrap();
    // Expiry (15 s), then at most one ack window for p1 and one for s, with room for a loaded
    // machine: well before the two minutes the stamped ping would hold it up.
    let killed = Instant::now();
    wait_for_holder(&env, "stamped", "s", Duration::from_secs(45)).await;
    assert!(alive(s.pid()), "s runs");
    eprintln!("s elected {:?} after h was killed", killed.elapsed());
    drop(op);
}

/// Trust-boundary item 7: a candidate whose `renewTime` the API server accepts but this
/// program's time type cannot hold (the last day of year 9999) stopped the candidate watch at
/// that event, for every namespace: the operator never became ready when one existed at its
/// start, and one edited that way and then deleted stayed in the cache, its lease's reconcile
/// failing with "not found" forever. Now the watch reads such a time as the latest it can
/// hold, and a 404 on a candidate means it is gone.
async fn a_malformed_then_deleted_candidate_leaves_no_reconcile_failing(env: Arc<TestEnv>) {
    use kube::api::{DeleteParams, Patch, PatchParams};
    let year_9999 = serde_json::json!({ "spec": { "renewTime": "9999-12-31T23:59:59.000000Z" } });
    let pp = PatchParams::default();
    // (This client could not decode such a candidate either.)
    let candidates: Api<arbiter::tolerant::Tolerant<LeaseCandidate>> = env.api();
    // One such candidate exists before the operator starts: it still becomes ready. It is
    // the best of lease `mal` (the oldest version): it is pinged (the answer to the ping's
    // write decoded too), never answers, and holds nothing up.
    ghost(&env, "far", "mal", "1.29.0", None, None).await;
    candidates
        .patch("far", &pp, &Patch::Merge(&year_9999))
        .await
        .unwrap();
    let op = Operator::start(&env, &[]);
    op.wait_ready().await;
    // A candidate is elected (its pings answered), then edited that way and deleted.
    let _r = Responder::start(env.client.clone(), &env.ns, &["mal1"]);
    ghost(
        &env,
        "mal1",
        "mal",
        "1.30.0",
        Some(jiff::Timestamp::now()),
        None,
    )
    .await;
    wait_for_holder(&env, "mal", "mal1", DEADLINE).await;
    candidates
        .patch("mal1", &pp, &Patch::Merge(&year_9999))
        .await
        .unwrap();
    candidates
        .delete("mal1", &DeleteParams::default())
        .await
        .unwrap();
    // A live agent that registers afterwards is seen, and elected once mal1's term is over.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("work.log");
    let _a = Agent::spawn(&env.kubeconfig, &env.ns, "ok1", "mal", "1.31.0", &log);
    wait_for_holder(&env, "mal", "ok1", DEADLINE).await;
    let failing = op
        .logs()
        .lines()
        .filter(|l| l.contains("reconcile failed") && l.contains("not found"))
        .count();
    assert_eq!(failing, 0, "reconciles failed on a candidate that is gone");
}

/// Trust-boundary item 4: a team moves a client-go controller under `arbiter run` and keeps its
/// Lease name. The old Lease (no `arbiter.dev/managed` label, term 7) names `m1`, which is
/// also the new agent's identity, and the old leader still renews it for a while. No agent runs
/// its workload on it; the operator waits until it has been unchanged for a lease duration on
/// its own clock, then takes it over with a term above 7 and labels it. Removing the label by
/// hand later does not stop the holder: the Lease carries arbiter's assignment and is labelled
/// again. (Before: `m1` ran at once with ARBITER_TERM=7, and the lease was never elected.)
async fn a_lease_arbiter_did_not_make_is_waited_out_then_adopted(env: Arc<TestEnv>) {
    use kube::api::{Patch, PatchParams};
    let leases: Api<Lease> = env.api();
    let client_go: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "migrated"},
        "spec": {"holderIdentity": "m1", "leaseDurationSeconds": 10, "leaseTransitions": 7,
            "acquireTime": lease::now(), "renewTime": lease::now()},
    }))
    .unwrap();
    leases
        .create(&PostParams::default(), &client_go)
        .await
        .unwrap();
    // The old client-go leader renews for 8 more seconds, then is gone.
    let renewing = {
        let leases = leases.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(8) {
                tokio::time::sleep(Duration::from_secs(2)).await;
                let p = serde_json::json!({ "spec": { "renewTime": lease::now() } });
                let _ = leases
                    .patch("migrated", &PatchParams::default(), &Patch::Merge(&p))
                    .await;
            }
            Instant::now()
        })
    };
    let op = Operator::start(&env, &[]);
    op.wait_ready().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("work.log");
    let mut m1 = Agent::spawn(&env.kubeconfig, &env.ns, "m1", "migrated", "1.30.0", &log);
    let _m2 = Agent::spawn(&env.kubeconfig, &env.ns, "m2", "migrated", "1.31.0", &log);
    let last_renewal = renewing.await.unwrap();
    assert!(
        starts(&read_log(&log)).is_empty(),
        "a workload ran on a Lease arbiter did not assign: {:?}",
        starts(&read_log(&log))
    );
    let found = wait_for_event(&env, "migrated", "ForeignLease", DEADLINE).await;
    assert!(found.contains("m1"), "{found}");
    let adopted = eventually("the Lease adopted", Duration::from_secs(60), || async {
        let l = leases.get("migrated").await.ok()?;
        lease::managed(&l).then_some(l)
    })
    .await;
    let waited = last_renewal.elapsed();
    assert!(
        waited >= Duration::from_secs(15),
        "taken over {waited:?} after the old leader's last renewal: its term may still have run"
    );
    assert!(
        lease::term(&adopted) > 7,
        "a fresh term above the old Lease's"
    );
    assert_eq!(lease::holder(&adopted), Some("m1"), "the oldest version");
    wait_for_event(&env, "migrated", "LeaseAdopted", DEADLINE).await;
    let (_, term, cmd, _) = wait_started(&log, "m1").await;
    assert_eq!(term, lease::term(&adopted));
    assert!(
        starts(&read_log(&log)).iter().all(|s| s.1 > 7),
        "a workload ran under the old Lease's term: {:?}",
        starts(&read_log(&log))
    );
    // The label removed by hand: labelled again, and the holder runs on in the same term.
    let p = serde_json::json!({ "metadata": { "labels": { lease::MANAGED_LABEL: null } } });
    leases
        .patch("migrated", &PatchParams::default(), &Patch::Merge(&p))
        .await
        .unwrap();
    wait_for_event(&env, "migrated", "LeaseRelabelled", Duration::from_secs(60)).await;
    let l = leases.get("migrated").await.unwrap();
    assert!(lease::managed(&l));
    assert_eq!((lease::holder(&l), lease::term(&l)), (Some("m1"), term));
    assert!(alive(cmd), "m1's workload was stopped");
    assert_eq!(starts(&read_log(&log)).len(), 1, "only m1's one start");
    assert!(m1.child.try_wait().unwrap().is_none());
    drop(op);
}

/// Trust-boundary item 10: candidates of three versions registered 0.2 s apart (as agents
/// started together do), each answering pings, in three orders on three leases: newest first,
/// oldest in the middle, oldest first. The oldest leads from term 1 on each: the first election
/// waits until no candidate has registered for the settle time (2 s). (Before: the first to
/// register got term 1, then was asked to hand over.)
async fn candidates_started_together_elect_the_oldest_from_the_first_term(env: Arc<TestEnv>) {
    use crate::support::operator::create_candidate;
    let op = Operator::start(&env, &[]);
    // Acting (a fresh operator acts a renew deadline after it made its HA lease: candidates
    // created before then would all be there at its first look).
    eventually("the operator acting", DEADLINE, || async {
        op.logs().contains("acting as the arbiter").then_some(())
    })
    .await;
    let orders: [(&str, [u32; 3]); 3] = [
        ("newest-first", [32, 31, 30]),
        ("oldest-between", [31, 30, 32]),
        ("oldest-first", [30, 32, 31]),
    ];
    let names: Vec<String> = orders
        .iter()
        .flat_map(|(name, minors)| minors.map(|m| format!("{name}-{m}")))
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let _r = Responder::start(env.client.clone(), &env.ns, &names);
    // The three leases' candidates registered together, one of each lease every 0.2 s.
    for k in 0..3 {
        for (lease_name, minors) in &orders {
            let version = format!("1.{}.0", minors[k]);
            let name = format!("{lease_name}-{}", minors[k]);
            create_candidate(&env, &name, lease_name, &version, Some(&version), OEV, None).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (lease_name, _) in &orders {
        let held = wait_for_holder(&env, lease_name, &format!("{lease_name}-30"), DEADLINE).await;
        assert_eq!(
            lease::term(&held),
            1,
            "{lease_name}: the oldest version from the first term, no handover"
        );
    }
    drop(op);
}

/// Trust-boundary item 10: an agent asked to hand over stops its workload, gives the lease up,
/// and stands by again as a new incarnation (it does not exit: a standby outside a pod would be
/// gone for good, one in a pod would restart); when the new holder dies, it leads again. With
/// `--exit-on-handover` it exits 0 instead.
async fn a_handed_over_agent_stands_by_and_leads_again(env: Arc<TestEnv>) {
    let op = Operator::start(&env, &[]);
    op.wait_ready().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("work.log");
    let mut newer = Agent::spawn(&env.kubeconfig, &env.ns, "newer", "back", "1.31.0", &log);
    let first = wait_for_holder(&env, "back", "newer", DEADLINE).await;
    wait_started(&log, "newer").await;
    let mut older = Agent::spawn(&env.kubeconfig, &env.ns, "older", "back", "1.30.0", &log);
    wait_for_holder(&env, "back", "older", DEADLINE).await;
    let candidates: Api<LeaseCandidate> = env.api();
    eventually("newer registered again", DEADLINE, || async {
        let c = candidates.get_opt("newer").await.ok()??;
        let stamp = kube::ResourceExt::annotations(&c)
            .get(lease::INCARNATION_ANNOTATION)?
            .clone();
        (!kube::ResourceExt::annotations(&first).contains_key(lease::INCARNATION_ANNOTATION)
            || kube::ResourceExt::annotations(&first).get(lease::INCARNATION_ANNOTATION)
                != Some(&stamp))
        .then_some(())
    })
    .await;
    assert!(
        newer.child.try_wait().unwrap().is_none(),
        "the handed-over agent exited"
    );
    kill(Pid::from_raw(older.pid()), Signal::SIGKILL).unwrap();
    older.child.wait().unwrap();
    let again = wait_for_holder(&env, "back", "newer", Duration::from_secs(60)).await;
    let (_, term, _, _) = eventually("newer's workload again", DEADLINE, || async {
        starts(&read_log(&log))
            .into_iter()
            .filter(|s| s.0 == "newer")
            .nth(1)
    })
    .await;
    assert_eq!(term, lease::term(&again));
    // The old behaviour on request.
    let mut args = agent_args(&env.ns, "quitter", "quit", "1.31.0", &log);
    args.insert(1, "--exit-on-handover".into());
    let mut quitter = Agent::spawn_args(&env.kubeconfig, "quitter", &args, &log);
    wait_for_holder(&env, "quit", "quitter", DEADLINE).await;
    let _better = Agent::spawn(&env.kubeconfig, &env.ns, "better", "quit", "1.30.0", &log);
    assert_eq!(quitter.wait_exit(DEADLINE).await, Some(0));
    drop(op);
}
