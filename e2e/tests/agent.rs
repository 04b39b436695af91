//! `arbiter run` against the real control plane, with the real operator: only the holder's
//! workload runs, and a deposed holder's workload is dead before anyone else's starts.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arbiter::api::LeaseCandidate;
use arbiter::lease;
use futures::FutureExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

use crate::support::agent::{
    Agent, KILL_GRACE, LEASE_DURATION, Proxy, RENEW_DEADLINE, agent_args, agent_args_with, alive,
    apiserver, child_of, now, read_log, starts, stop_of, wait_started,
};
use crate::support::operator::{Operator, wait_for_holder};
use crate::support::standin::StandIn;
use crate::support::{TestEnv, eventually};
use arbiter::agent::reaper::children;

crate::tests![agent:
    oldest_agent_leads_and_only_its_workload_runs,
    sigkill_of_the_leading_agent_kills_its_workload_and_the_next_waits_for_expiry,
    sigkill_of_an_agent_as_its_workload_starts_leaves_nothing_running,
    network_cut_stops_the_workload_before_the_next_holder_starts,
    graceful_handover_stops_the_old_workload_before_the_new_starts,
    sigterm_stops_the_workload_releases_and_deregisters,
    workload_exit_releases_the_lease_with_its_code,
    unsafe_timings_are_refused,
    flag_errors_exit_2_with_one_message_and_create_nothing,
    a_stopped_agent_cannot_keep_its_workload_running,
    an_agent_waits_out_an_unreachable_api_server,
    as_pid_1_the_agent_reaps_orphans,
    deleting_the_lease_does_not_shorten_the_holders_term,
    clearing_the_holder_does_not_shorten_its_term,
    lowering_the_lease_duration_does_not_shorten_the_term,
    forging_the_holder_pod_uid_does_not_shorten_the_term,
    re_pointing_the_holders_candidate_at_an_ended_pod_does_not_shorten_the_term,
    forging_a_release_does_not_shorten_the_term,
    forging_a_withdrawal_does_not_shorten_the_term,
    clearing_the_holder_then_failing_over_does_not_shorten_its_term,
    a_pod_failed_by_the_garbage_collector_is_not_proof_of_a_stop,
    a_frozen_candidate_that_outlives_its_term_is_reported_as_a_double_holder,
    a_dead_guard_stops_the_workload_and_ends_the_term,
    two_agents_with_one_identity_are_reported,
    an_agent_alone_leaves_its_candidate_alone_between_refreshes,
    an_agent_whose_watch_lags_answers_a_ping_from_a_read,
    deleting_the_lease_settles_on_the_live_candidate,
    arbiter_handover_switches_over_to_an_equal_and_refuses_a_newer_version,
    an_agent_outside_a_pod_drops_a_pod_left_as_its_candidates_owner,
    the_health_endpoint_answers_on_a_standby_and_on_the_leader,
];

const DEADLINE: Duration = Duration::from_secs(40);

fn operator(env: &TestEnv) -> Operator {
    Operator::start(env, &["--lease-duration", "10s"])
}

async fn oldest_agent_leads_and_only_its_workload_runs(env: Arc<TestEnv>) {
    let op = operator(&env);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("workload.log");
    let kubeconfig = env.kubeconfig.to_str().unwrap().to_string();
    let mut pods = Vec::new();
    for (name, version) in [("v131", "1.31.0"), ("v130", "1.30.0"), ("v132", "1.32.0")] {
        let args = agent_args(&env.ns, name, "trio", version, &log);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let envs = [("KUBECONFIG", kubeconfig.as_str())];
        pods.push(
            StandIn::spawn_with_env(
                env.client.clone(),
                &env.ns,
                name,
                BTreeMap::new(),
                5,
                env!("CARGO_BIN_EXE_arbiter"),
                &args,
                &envs,
            )
            .await,
        );
    }
    let l = wait_for_holder(&env, "trio", "v130", DEADLINE).await;
    // (A newer pod may lead for a moment until the oldest registers; it hands over.)
    let started = wait_started(&log, "v130").await;
    assert_eq!(
        started.1,
        lease::term(&l),
        "ARBITER_TERM is the lease's term"
    );
    assert!(alive(started.2));
    assert_eq!(
        running(&read_log(&log)),
        ["v130"],
        "only the holder's workload runs"
    );
    // Every candidate is owned by its pod (garbage-collected with it).
    let candidates: Api<LeaseCandidate> = env.api();
    for si in &pods {
        let c = candidates.get(&si.name).await.unwrap();
        let owner = &c.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Pod", si.uid.as_str())
        );
    }
    // Still only one workload once the others have certainly registered and been considered
    // (a decision on the lease after both registered that judges them).
    let trio = format!("{}/trio", env.ns);
    eventually("the others judged", DEADLINE, || async {
        op.decided(&trio)
            .iter()
            .any(|d| d.contains("\"v131\"") && d.contains("\"v132\""))
            .then_some(())
    })
    .await;
    assert_eq!(running(&read_log(&log)), ["v130"]);
}

/// The moment right after CMD starts, while the guard is still starting, is the riskiest for an
/// agent to die (`make chaos` once left a workload running there): SIGKILL it then, repeatedly.
async fn sigkill_of_an_agent_as_its_workload_starts_leaves_nothing_running(env: Arc<TestEnv>) {
    let _op = operator(&env);
    let dir = tempfile::tempdir().unwrap();
    for i in 0..8 {
        let log = dir.path().join(format!("workload-{i}.log"));
        let id = format!("early-{i}");
        let mut a = Agent::spawn(&env.kubeconfig, &env.ns, &id, &id, "1.30.0", &log);
        // Poll tightly: the kill should land within milliseconds of the workload's start.
        let until = std::time::Instant::now() + DEADLINE;
        let cmd = loop {
            if let Some(s) = starts(&read_log(&log)).first() {
                break s.2;
            }
            assert!(
                std::time::Instant::now() < until,
                "{id}'s workload never started"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        kill(Pid::from_raw(a.pid()), Signal::SIGKILL).unwrap();
        a.wait_exit(DEADLINE).await;
        eventually(
            &format!("{id}'s workload (pid {cmd}) and its child to die with the agent"),
            Duration::from_secs(5),
            || async {
                let child = child_of(&read_log(&log), &id);
                (!alive(cmd) && child.is_none_or(|c| !alive(c))).then_some(())
            },
        )
        .await;
    }
}

async fn sigkill_of_the_leading_agent_kills_its_workload_and_the_next_waits_for_expiry(
    env: Arc<TestEnv>,
) {
    let _op = operator(&env);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("workload.log");
    let mut a = Agent::spawn(&env.kubeconfig, &env.ns, "a", "kill", "1.30.0", &log);
    let a_term = lease::term(&wait_for_holder(&env, "kill", "a", DEADLINE).await);
    // b joins as a standby (it never leads before a dies, so it never hands over and exits).
    let _b = Agent::spawn(&env.kubeconfig, &env.ns, "b", "kill", "1.31.0", &log);
    let candidates: Api<LeaseCandidate> = env.api();
    eventually("b to register", DEADLINE, || async {
        candidates.get_opt("b").await.ok()?
    })
    .await;
    let (cmd, grandchild) = eventually("a's workload and its child", DEADLINE, || async {
        let l = read_log(&log);
        Some((
            starts(&l).iter().find(|s| s.0 == "a")?.2,
            child_of(&l, "a")?,
        ))
    })
    .await;
    assert!(alive(cmd) && alive(grandchild));

    let leases: Api<Lease> = env.api();
    kill(Pid::from_raw(a.pid()), Signal::SIGKILL).unwrap();
    let killed_at = now();
    // The last renew the agent made before it died.
    let renewed = leases
        .get("kill")
        .await
        .unwrap()
        .spec
        .unwrap()
        .renew_time
        .unwrap()
        .0;
    a.wait_exit(DEADLINE).await;
    eventually(
        "the workload and its grandchild to die with the agent",
        Duration::from_secs(5),
        || async { (!alive(cmd) && !alive(grandchild)).then_some(()) },
    )
    .await;

    let (b_start, b_term) = eventually("b's workload to start", DEADLINE, || async {
        let s = starts(&read_log(&log));
        s.iter()
            .find(|s| s.0 == "b" && s.1 > a_term)
            .map(|s| (s.3, s.1))
    })
    .await;
    let expiry = renewed.as_millisecond() as f64 / 1000.0 + LEASE_DURATION.as_secs_f64();
    assert!(
        b_start >= expiry,
        "b started at {b_start:.3}, before a's lease expired at {expiry:.3} (killed at {killed_at:.3})"
    );
    assert!(b_term > a_term, "terms only go up");
}

async fn network_cut_stops_the_workload_before_the_next_holder_starts(env: Arc<TestEnv>) {
    let op = operator(&env);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("workload.log");
    let proxy = Proxy::start(apiserver(&env.kubeconfig)).await;
    let proxied = proxy.kubeconfig(&env.kubeconfig, dir.path());
    // Each trial: a better agent behind the proxy takes the lease (by handover from the last
    // trial's holder), a worse agent connects directly, then the proxy is cut.
    let mut gaps = Vec::new();
    let mut directs = Vec::new();
    for trial in 0..3 {
        let (victim_id, direct_id) = (format!("cut{trial}"), format!("direct{trial}"));
        let mut victim = Agent::spawn(
            &proxied,
            &env.ns,
            &victim_id,
            "cut",
            &format!("1.{}.0", 30 - trial),
            &log,
        );
        wait_for_holder(&env, "cut", &victim_id, DEADLINE).await;
        eventually("the victim's workload to start", DEADLINE, || async {
            starts(&read_log(&log))
                .iter()
                .any(|s| s.0 == victim_id)
                .then_some(())
        })
        .await;
        directs.push(Agent::spawn(
            &env.kubeconfig,
            &env.ns,
            &direct_id,
            "cut",
            "1.40.0",
            &log,
        ));
        // The direct agent is registered (and acknowledged a ping) before the cut.
        op.wait_eligible(&env.ns, &direct_id).await;
        proxy.cut();
        let cut_at = now();
        let stopped = eventually("the cut-off workload to stop", DEADLINE, || async {
            stop_of(&read_log(&log), &victim_id)
        })
        .await;
        assert_eq!(
            victim.wait_exit(DEADLINE).await,
            Some(1),
            "a cut-off agent exits non-zero"
        );
        let bound = (RENEW_DEADLINE + KILL_GRACE).as_secs_f64();
        assert!(
            stopped - cut_at <= bound,
            "trial {trial}: stopped {:.3}s after the cut, over {bound}s",
            stopped - cut_at
        );
        // A direct agent (this trial's, or an earlier one standing by again after it handed
        // the lease to this trial's victim).
        let victim_term = starts(&read_log(&log))
            .iter()
            .find(|s| s.0 == victim_id)
            .map(|s| s.1)
            .expect("the victim's start");
        let next = eventually("the next holder's workload to start", DEADLINE, || async {
            starts(&read_log(&log))
                .iter()
                .find(|s| s.0.starts_with("direct") && s.1 > victim_term)
                .map(|s| s.3)
        })
        .await;
        assert!(
            next > stopped,
            "trial {trial}: overlap: next started at {next:.3}, cut-off stopped at {stopped:.3}"
        );
        gaps.push(next - stopped);
        proxy.restore();
    }
    eprintln!("network cut: cut-off workload stopped, next started after gaps of {gaps:.3?} s");
}

/// A rollback: an older version joins while a newer one leads. The holder works on until the
/// pool has settled (the operator decides `Settle` before it asks), then stops its workload and
/// releases; the older version is assigned at once (no settle after the release), at term 2,
/// and its workload starts only after the old one stopped.
async fn graceful_handover_stops_the_old_workload_before_the_new_starts(env: Arc<TestEnv>) {
    let op = operator(&env);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("workload.log");
    let mut old = Agent::spawn(&env.kubeconfig, &env.ns, "old", "hand", "1.31.0", &log);
    wait_for_holder(&env, "hand", "old", DEADLINE).await;
    eventually("old's workload", DEADLINE, || async {
        (!starts(&read_log(&log)).is_empty()).then_some(())
    })
    .await;
    let _new = Agent::spawn(&env.kubeconfig, &env.ns, "new", "hand", "1.30.0", &log);
    let new_start = eventually("new's workload", DEADLINE, || async {
        starts(&read_log(&log))
            .iter()
            .find(|s| s.0 == "new")
            .map(|s| s.3)
    })
    .await;
    let old_stop = stop_of(&read_log(&log), "old").expect("old's workload stopped");
    let gap = new_start - old_stop;
    assert!(
        gap > 0.0,
        "overlap: new started {:.3}s before old stopped",
        -gap
    );
    let held = wait_for_holder(&env, "hand", "new", DEADLINE).await;
    assert_eq!(
        arbiter::lease::term(&held),
        2,
        "one handover, no term between"
    );
    // The operator's decisions for this lease, in order: it settled while the holder led,
    // asked once, and decided no settle after the release.
    let decisions = op.decisions(&format!("{}/hand", env.ns));
    let asked = decisions
        .iter()
        .position(|d| d.starts_with("RequestHandover"))
        .unwrap_or_else(|| panic!("no handover requested: {decisions:?}"));
    assert!(
        decisions[..asked].iter().any(|d| d.starts_with("Settle")),
        "asked before the pool settled: {decisions:?}"
    );
    assert!(
        !decisions[asked..].iter().any(|d| d.starts_with("Settle")),
        "waited after the release: {decisions:?}"
    );
    // A handed-over agent stays, standing by as a new process incarnation.
    stands_by_again(&env, &mut old, "hand").await;
    // How long the gap is, is measured by `make bench`, not asserted here.
    eprintln!("graceful handover: gap {:.0} ms", gap * 1000.0);
}

async fn sigterm_stops_the_workload_releases_and_deregisters(env: Arc<TestEnv>) {
    let _op = operator(&env);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("workload.log");
    let mut a = Agent::spawn(&env.kubeconfig, &env.ns, "a", "term", "1.30.0", &log);
    wait_for_holder(&env, "term", "a", DEADLINE).await;
    let _b = Agent::spawn(&env.kubeconfig, &env.ns, "b", "term", "1.31.0", &log);
    let candidates: Api<LeaseCandidate> = env.api();
    eventually("b to register", DEADLINE, || async {
        candidates.get_opt("b").await.ok()?
    })
    .await;
    wait_started(&log, "a").await;
    kill(Pid::from_raw(a.pid()), Signal::SIGTERM).unwrap();
    assert_eq!(a.wait_exit(DEADLINE).await, Some(0));
    assert!(
        stop_of(&read_log(&log), "a").is_some(),
        "the workload got SIGTERM"
    );
    let candidates: Api<LeaseCandidate> = env.api();
    assert!(
        candidates.get_opt("a").await.unwrap().is_none(),
        "the candidate was deleted"
    );
    // Released, so b takes over well before a 6 s expiry.
    let released = now();
    wait_for_holder(&env, "term", "b", Duration::from_secs(6)).await;
    assert!(now() - released < LEASE_DURATION.as_secs_f64());
}

async fn workload_exit_releases_the_lease_with_its_code(env: Arc<TestEnv>) {
    let _op = operator(&env);
    let mut args: Vec<String> = [
        "run",
        "--lease",
        "quit",
        "--identity",
        "q",
        "--namespace",
        &env.ns,
        "--binary-version",
        "1.0.0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(crate::support::agent::TIMINGS.iter().map(|s| s.to_string()));
    args.extend(["--", "sh", "-c", "exit 7"].iter().map(|s| s.to_string()));
    let status = tokio::process::Command::new(env!("CARGO_BIN_EXE_arbiter"))
        .args(&args)
        .env("KUBECONFIG", &env.kubeconfig)
        .stderr(std::process::Stdio::null())
        .status();
    let status = tokio::time::timeout(DEADLINE, status)
        .await
        .expect("the agent exits")
        .unwrap();
    assert_eq!(status.code(), Some(7));
    let leases: Api<Lease> = env.api();
    let l = leases.get("quit").await.unwrap();
    assert_eq!(lease::holder(&l), None, "released");
}

async fn unsafe_timings_are_refused(env: Arc<TestEnv>) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_arbiter"))
        .args([
            "run",
            "--lease",
            "x",
            "--identity",
            "i",
            "--namespace",
            &env.ns,
            "--binary-version",
            "1.0.0",
        ])
        .args([
            "--renew-deadline",
            "10s",
            "--kill-grace",
            "6s",
            "--",
            "true",
        ])
        .env("KUBECONFIG", &env.kubeconfig)
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a flag error exits 2");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("must be less than --lease-duration"),
        "{stderr}"
    );
}

/// Every flag error: exit 2, the message once, nothing created in the cluster. A lease
/// duration that is not whole seconds would be truncated in `leaseDurationSeconds` (2500ms
/// written as 2 s, 900ms as 0 s: every lease expired), so it is refused.
async fn flag_errors_exit_2_with_one_message_and_create_nothing(env: Arc<TestEnv>) {
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--lease",
            "flags",
            "--identity",
            "f",
            "--namespace",
            &env.ns,
            "--binary-version",
            "1.0.0",
        ];
        args.extend_from_slice(extra);
        args.extend(["--", "true"]);
        args.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let operator = |extra: &[&str]| {
        let mut args = vec!["operator", "--metrics-address", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        args.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            run(&[
                "--lease-duration",
                "2500ms",
                "--renew-deadline",
                "1500ms",
                "--kill-grace",
                "900ms",
                "--retry-period",
                "300ms",
            ]),
            "whole number of seconds",
        ),
        (
            run(&["--lease-duration", "900ms"]),
            "whole number of seconds",
        ),
        (run(&["--retry-period", "0s"]), "must be greater than zero"),
        (
            run(&["--renew-deadline", "0s"]),
            "must be greater than zero",
        ),
        (
            run(&["--retry-period", "10s", "--renew-deadline", "5s"]),
            "--retry-period (10s) must be less than --renew-deadline",
        ),
        (
            operator(&["--lease-duration", "2500ms"]),
            "whole number of seconds",
        ),
        (
            operator(&["--ha-lease-duration", "1500ms"]),
            "whole number of seconds",
        ),
        (
            operator(&["--ha-retry-period", "0s"]),
            "must be greater than zero",
        ),
        (
            operator(&["--ha-renew-deadline", "20s"]),
            "--ha-renew-deadline (20s) < --ha-lease-duration (15s)",
        ),
        (
            operator(&["--ack-valid-for", "9s"]),
            "--ack-valid-for (9s) must be at least twice --ack-window (5s)",
        ),
    ];
    for (args, expected) in cases {
        let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_arbiter"))
            .args(&args)
            .env("KUBECONFIG", &env.kubeconfig)
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(20), run)
            .await
            .unwrap_or_else(|_| panic!("{args:?} was accepted: still running after 20 s"))
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert_eq!(
            stderr.matches(expected).count(),
            1,
            "{args:?}: the error is printed once: {stderr}"
        );
    }
    let candidates: Api<LeaseCandidate> = env.api();
    let leases: Api<Lease> = env.api();
    let lp = kube::api::ListParams::default();
    assert!(candidates.list(&lp).await.unwrap().items.is_empty());
    assert!(leases.list(&lp).await.unwrap().items.is_empty());
}

/// The agent alone stops (SIGSTOP to its process group: a hung or deadlocked agent looks the
/// same), while its workload would keep running: the workload's guard stops it at the last
/// renew + renew deadline + kill grace on its own clock, before the lease can go to anyone
/// else. (Today's main: the workload ran on, and the next holder started beside it.)
async fn a_stopped_agent_cannot_keep_its_workload_running(env: Arc<TestEnv>) {
    use nix::sys::signal::killpg;
    let op = operator(&env);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("workload.log");
    let mut a = Agent::spawn(&env.kubeconfig, &env.ns, "a", "stall", "1.30.0", &log);
    let a_term = lease::term(&wait_for_holder(&env, "stall", "a", DEADLINE).await);
    let _b = Agent::spawn(&env.kubeconfig, &env.ns, "b", "stall", "1.31.0", &log);
    op.wait_eligible(&env.ns, "b").await;
    let (cmd, grandchild) = eventually("a's workload and its child", DEADLINE, || async {
        let l = read_log(&log);
        Some((
            starts(&l).iter().find(|s| s.0 == "a")?.2,
            child_of(&l, "a")?,
        ))
    })
    .await;

    let agent_group = Pid::from_raw(a.pid());
    killpg(agent_group, Signal::SIGSTOP).unwrap();
    let stopped_at = now();
    let result = std::panic::AssertUnwindSafe(async {
        let stop = eventually(
            "a's workload to be stopped while its agent is stopped",
            DEADLINE,
            || async { stop_of(&read_log(&log), "a") },
        )
        .await;
        eventually(
            "a's workload and its grandchild to be gone",
            Duration::from_secs(5),
            || async { (!alive(cmd) && !alive(grandchild)).then_some(()) },
        )
        .await;
        // The last renew the API server accepted from a (the agent sent it no later).
        let leases: Api<Lease> = env.api();
        let l = leases.get("stall").await.unwrap();
        let spec = l.spec.clone().unwrap();
        let renewed = spec.renew_time.unwrap().0.as_millisecond() as f64 / 1000.0;
        // The guard's bound, plus the time a shell takes to run its trap.
        let bound = renewed + (RENEW_DEADLINE + KILL_GRACE).as_secs_f64() + 0.5;
        assert!(
            stop <= bound,
            "a's workload stopped at {stop:.3}, after its bound {bound:.3} (agent stopped at {stopped_at:.3})"
        );
        let b_start = eventually("b's workload to start", DEADLINE, || async {
            starts(&read_log(&log))
                .iter()
                .find(|s| s.0 == "b" && s.1 > a_term)
                .map(|s| s.3)
        })
        .await;
        assert!(
            b_start > stop,
            "overlap: b started at {b_start:.3}, a's workload stopped at {stop:.3}"
        );
        assert!(!alive(cmd) && !alive(grandchild), "a's workload came back");
    })
    .catch_unwind()
    .await;
    // Resumed, the agent finds its term over: it exits non-zero and starts nothing.
    killpg(agent_group, Signal::SIGCONT).unwrap();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    assert_eq!(a.wait_exit(DEADLINE).await, Some(1));
    let a_starts = starts(&read_log(&log))
        .iter()
        .filter(|s| s.0 == "a")
        .count();
    assert_eq!(a_starts, 1, "the resumed agent started nothing");
}

async fn two_agents_with_one_identity_are_reported(env: Arc<TestEnv>) {
    let op = operator(&env);
    // The operator watches the candidates before the agents' first writes: the stamp's
    // return within seconds is what it must see (later, the agents flip it every 30 s).
    op.wait_ready().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("workload.log");
    let _a = Agent::spawn(&env.kubeconfig, &env.ns, "twin", "twins", "1.30.0", &log);
    let _b = Agent::spawn(&env.kubeconfig, &env.ns, "twin", "twins", "1.30.0", &log);
    let candidates: Api<LeaseCandidate> = env.api();
    // The stamp returns (A, B, A) once an agent that saw the other's stamp writes, within
    // REFRESH_ON_NEW_OTHER (2 s) of its first sight of it (when that waited for the 30 s
    // contested refresh, detection came 40.3 s after the spawns on a slow machine).
    let message = eventually(
        "DuplicateIdentity=True on the shared candidate",
        DEADLINE,
        || async {
            let c = candidates.get("twin").await.ok()?;
            let cond = c
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "DuplicateIdentity" && c.status == "True")?;
            Some(cond.message)
        },
    )
    .await;
    assert!(
        message.contains("more than one live process uses this identity"),
        "{message}"
    );
    // Whatever the confusion, at most one workload runs at a time.
    let log_now = read_log(&log);
    let alive_workloads = starts(&log_now).iter().filter(|s| alive(s.2)).count();
    assert!(alive_workloads <= 1, "{log_now:?}");
}

/// An agent refreshes its candidate every 5 minutes (upstream's interval), not every 30 s: at
/// 30,000 candidates that is 100 writes a second instead of 1,000. Over 65 s (two refreshes
/// of the earlier 30 s interval) neither the holder's nor a standby's `renewTime` moves, and
/// nobody pinged them meanwhile (their agents only read them, every 30 s); both stay eligible.
async fn an_agent_alone_leaves_its_candidate_alone_between_refreshes(env: Arc<TestEnv>) {
    let op = operator(&env);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("workload.log");
    let a = Agent::spawn(&env.kubeconfig, &env.ns, "calm-a", "calm", "1.30.0", &log);
    wait_for_holder(&env, "calm", "calm-a", DEADLINE).await;
    let b = Agent::spawn(&env.kubeconfig, &env.ns, "calm-b", "calm", "1.31.0", &log);
    op.wait_eligible(&env.ns, "calm-b").await;
    let candidates: Api<LeaseCandidate> = env.api();
    let times = |c: &LeaseCandidate| (c.spec.renew_time.clone(), c.spec.ping_time.clone());
    let mut before = Vec::new();
    for name in ["calm-a", "calm-b"] {
        before.push(times(&candidates.get(name).await.unwrap()));
    }
    let until = tokio::time::Instant::now() + Duration::from_secs(65);
    while tokio::time::Instant::now() < until {
        for (name, was) in ["calm-a", "calm-b"].iter().zip(&before) {
            let now = times(&candidates.get(name).await.unwrap());
            assert_eq!(&now, was, "{name}'s renewTime or pingTime changed");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    wait_for_holder(&env, "calm", "calm-a", DEADLINE).await;
    op.wait_eligible(&env.ns, "calm-b").await;
    // Quiet because they are idle, not because they died.
    assert!(alive(a.pid()) && alive(b.pid()), "an agent exited");
}

/// A watch can hang on a dead connection while requests on fresh ones go through. An agent
/// whose candidate watch delivers events two minutes late still answers a ping within its 30 s
/// read of the candidate (from the API server's cache), not at its watch's pace nor at its
/// next refresh (5 minutes). No operator: the ping is written by hand.
async fn an_agent_whose_watch_lags_answers_a_ping_from_a_read(env: Arc<TestEnv>) {
    const LAG: Duration = Duration::from_secs(120);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("workload.log");
    let proxy = Proxy::start(apiserver(&env.kubeconfig)).await;
    // From the start: its requests are answered at once, its watches' events come 120 s late.
    proxy.lag_streams(LAG);
    let proxied = proxy.kubeconfig(&env.kubeconfig, dir.path());
    let _a = Agent::spawn(&proxied, &env.ns, "laggard", "lagging", "1.30.0", &log);
    let candidates: Api<LeaseCandidate> = env.api();
    eventually("the candidate to register", DEADLINE, || async {
        candidates.get_opt("laggard").await.ok().flatten()
    })
    .await;
    let answered = |ping: k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime| {
        let candidates = candidates.clone();
        async move {
            let c = candidates.get("laggard").await.ok()?;
            c.spec.renew_time.filter(|r| r.0 >= ping.0)
        }
    };
    let ping_now = || async {
        let ping = arbiter::lease::now();
        let patch = json!({ "spec": { "pingTime": ping } });
        candidates
            .patch(
                "laggard",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .unwrap();
        (ping, std::time::Instant::now())
    };
    // A first ping, answered however it reaches the agent (its first list, its watch before it
    // lags, or its read): the agent is up, and its watch is established from then on.
    let (first, _) = ping_now().await;
    eventually("the agent's first answer", DEADLINE, || {
        answered(first.clone())
    })
    .await;
    // Then ping until a ping is not answered within a second: it reached the agent's watch
    // once that watch had been silent long enough to lag.
    let mut attempts = 0;
    let (ping, pinged) = loop {
        let (ping, pinged) = ping_now().await;
        let mut quick = false;
        while pinged.elapsed() < Duration::from_secs(1) {
            if answered(ping.clone()).await.is_some() {
                quick = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if !quick {
            break (ping, pinged);
        }
        attempts += 1;
        assert!(
            attempts < 5,
            "every ping answered at once: the watch never lagged"
        );
    };
    // The read comes every 30 s; 45 s leaves room for its answer, and is far below the lag.
    eventually("the ping's answer", Duration::from_secs(45), || {
        answered(ping.clone())
    })
    .await;
    assert!(pinged.elapsed() < LAG, "answered only at the watch's pace");
}

/// The identities whose workload is running: more starts than stops logged.
fn running(log: &[crate::support::agent::Entry]) -> Vec<String> {
    use crate::support::agent::Entry;
    let mut count: std::collections::BTreeMap<String, i32> = Default::default();
    for e in log {
        match e {
            Entry::Start { id, .. } => *count.entry(id.clone()).or_default() += 1,
            Entry::Stop { id, .. } => *count.entry(id.clone()).or_default() -= 1,
            Entry::Child { .. } => {}
        }
    }
    count
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(id, _)| id)
        .collect()
}

/// Started while the API server cannot be reached, the agent neither exits nor hangs: it
/// retries registration with backoff, says so, and registers once the server is back.
async fn an_agent_waits_out_an_unreachable_api_server(env: Arc<TestEnv>) {
    let _op = operator(&env);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("workload.log");
    let proxy = Proxy::start(apiserver(&env.kubeconfig)).await;
    let proxied = proxy.kubeconfig(&env.kubeconfig, dir.path());
    proxy.cut();
    let mut a = Agent::spawn(&proxied, &env.ns, "late", "late", "1.0.0", &log);
    let agent_log = log.with_extension("late.agent.log");
    eventually("two logged registration retries", DEADLINE, || async {
        let text = std::fs::read_to_string(&agent_log).unwrap_or_default();
        (text.matches("cannot register the candidate yet").count() >= 2).then_some(())
    })
    .await;
    assert!(
        a.child.try_wait().unwrap().is_none(),
        "the agent gave up while the API server was unreachable"
    );
    proxy.restore();
    wait_for_holder(&env, "late", "late", DEADLINE).await;
    wait_started(&log, "late").await;
}

/// As a container's entrypoint the agent is PID 1, and the workload's orphans are reparented
/// to it: they must not pile up as zombies.
async fn as_pid_1_the_agent_reaps_orphans(env: Arc<TestEnv>) {
    let _op = operator(&env);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("workload.log");
    // Three orphans (each subshell exits at once, leaving its sleep to PID 1), then a mark
    // once they have certainly exited.
    let workload = r#"for i in 1 2 3; do (sleep 0.1 &); done; sleep 1; echo orphans-exited >> "$1"; exec sleep 1000"#;
    let args = agent_args_with(&env.ns, "init", "init", "1.0.0", &log, workload);
    let stderr = std::fs::File::create(log.with_extension("init.agent.log")).unwrap();
    let mut unshare = std::process::Command::new("unshare")
        .args([
            "--pid",
            "--fork",
            "--mount-proc",
            env!("CARGO_BIN_EXE_arbiter"),
        ])
        .args(&args)
        .env("KUBECONFIG", &env.kubeconfig)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("unshare (util-linux) starts the agent as PID 1 of a new pid namespace");
    let unshare_pid = unshare.id() as i32;
    let result = std::panic::AssertUnwindSafe(async {
        let agent = eventually("the agent (PID 1 inside)", DEADLINE, || async {
            children(unshare_pid).first().map(|(pid, _)| *pid)
        })
        .await;
        wait_for_holder(&env, "init", "init", DEADLINE).await;
        eventually("the orphans to have exited", DEADLINE, || async {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("orphans-exited")
                .then_some(())
        })
        .await;
        eventually(
            "no zombie children of the agent",
            Duration::from_secs(10),
            || async {
                let zombies: Vec<_> = children(agent)
                    .into_iter()
                    .filter(|(_, state)| state == "Z")
                    .collect();
                zombies.is_empty().then_some(())
            },
        )
        .await;
    })
    .catch_unwind()
    .await;
    // SIGTERM the agent (it stops its workload); its namespace dies with it.
    for (pid, _) in children(unshare_pid) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    }
    let what = || "unshare".to_string();
    crate::support::wait_child(&mut unshare, DEADLINE, what).await;
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// A hand edit of the Lease, made while its holder's agent is stalled (its workload runs until
/// the guard stops it at the renew deadline + kill grace).
#[derive(Clone, Copy, Debug, PartialEq)]
enum HandEdit {
    Delete,
    ClearHolder,
    /// `leaseDurationSeconds: 1`.
    LowerDuration,
    /// `arbiter.dev/holder-pod-uid` pointed at a pod that has stopped.
    ForgePodUid,
    /// The holder's candidate's `ownerReferences` pointed at a pod that has stopped (as
    /// `kubectl patch` does, or a replacement pod of the same name that registered and ended).
    RepointOwner,
    /// `holderIdentity: ""` with `arbiter.dev/released-by` naming the holder, by hand.
    ForgeRelease,
    /// The holder's candidate annotated `arbiter.dev/withdrawn: <its incarnation>` as the agent
    /// writes it (arbiter's field manager, which anyone may claim), then the holder cleared.
    ForgeWithdrawal,
    /// The holder cleared, then the active operator replica replaced (it shuts down, a standby
    /// with no memory of the lease takes over at once).
    ClearHolderAndFailover,
}

async fn deleting_the_lease_does_not_shorten_the_holders_term(env: Arc<TestEnv>) {
    hand_edit_does_not_shorten_the_term(env, HandEdit::Delete).await
}

async fn clearing_the_holder_does_not_shorten_its_term(env: Arc<TestEnv>) {
    hand_edit_does_not_shorten_the_term(env, HandEdit::ClearHolder).await
}

async fn lowering_the_lease_duration_does_not_shorten_the_term(env: Arc<TestEnv>) {
    hand_edit_does_not_shorten_the_term(env, HandEdit::LowerDuration).await
}

async fn forging_the_holder_pod_uid_does_not_shorten_the_term(env: Arc<TestEnv>) {
    hand_edit_does_not_shorten_the_term(env, HandEdit::ForgePodUid).await
}

/// Trust-boundary item 5: a term ends on the death of what took it, not of the pod its
/// candidate names now.
async fn re_pointing_the_holders_candidate_at_an_ended_pod_does_not_shorten_the_term(
    env: Arc<TestEnv>,
) {
    hand_edit_does_not_shorten_the_term(env, HandEdit::RepointOwner).await
}

async fn forging_a_withdrawal_does_not_shorten_the_term(env: Arc<TestEnv>) {
    hand_edit_does_not_shorten_the_term(env, HandEdit::ForgeWithdrawal).await
}

async fn forging_a_release_does_not_shorten_the_term(env: Arc<TestEnv>) {
    hand_edit_does_not_shorten_the_term(env, HandEdit::ForgeRelease).await
}

async fn clearing_the_holder_then_failing_over_does_not_shorten_its_term(env: Arc<TestEnv>) {
    hand_edit_does_not_shorten_the_term(env, HandEdit::ClearHolderAndFailover).await
}

/// Whatever the edit, the next holder's workload starts only after the edited-out holder's
/// workload has stopped: the arbiter waits out the holder's full lease duration from its last
/// record, by which time the guard has stopped the workload of the stalled agent. (Today's main
/// took each edit as the end of the term and elected the better candidate waiting for a
/// handover at once, while the old workload ran on.)
async fn hand_edit_does_not_shorten_the_term(env: Arc<TestEnv>, edit: HandEdit) {
    use crate::support::agent::{agent_args_with, slow_stop_workload};
    use kube::api::{DeleteParams, Patch, PatchParams};
    use nix::sys::signal::killpg;
    // Two replicas for the failover case (the first one is the active one).
    let mut ha = crate::support::operator::FAST_HA.to_vec();
    ha.extend(["--lease-duration", "20s"]);
    let mut first = Operator::start(&env, &ha);
    let leases: Api<Lease> = env.api();
    let active = eventually("an active operator", DEADLINE, || async {
        lease::holder(&leases.get("arbiter-operator").await.ok()?).map(str::to_string)
    })
    .await;
    let _second = (edit == HandEdit::ClearHolderAndFailover).then(|| Operator::start(&env, &ha));
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("workload.log");
    // A 20 s lease: b must register and the arbiter ask a to hand over while a's term still
    // runs (from a's stall), or there is no term left to shorten. With 10 s a loaded machine
    // sometimes let a's term end first.
    let spawn = |id: &str, version: &str| {
        let mut args = agent_args_with(&env.ns, id, "edit", version, &log, &slow_stop_workload());
        let at = args.iter().position(|a| a == "--lease-duration").unwrap() + 1;
        args[at] = "20s".into();
        Agent::spawn_args(&env.kubeconfig, id, &args, &log)
    };
    let mut a = spawn("a", "1.30.0");
    let a_term = lease::term(&wait_for_holder(&env, "edit", "a", DEADLINE).await);
    let cmd = eventually("a's workload", DEADLINE, || async {
        Some(starts(&read_log(&log)).iter().find(|s| s.0 == "a")?.2)
    })
    .await;
    // A pod that has certainly stopped, for the forged annotation.
    let stopped_pod = if matches!(edit, HandEdit::ForgePodUid | HandEdit::RepointOwner) {
        let si = StandIn::spawn(
            env.client.clone(),
            &env.ns,
            "done",
            BTreeMap::new(),
            1,
            "true",
            &[],
        )
        .await;
        si.wait_exit(DEADLINE).await;
        let pods: Api<k8s_openapi::api::core::v1::Pod> = env.api();
        eventually("the finished pod to be Succeeded", DEADLINE, || async {
            let p = pods.get("done").await.ok()?;
            (p.status?.phase.as_deref() == Some("Succeeded")).then_some(())
        })
        .await;
        Some((si.name.clone(), si.uid.clone()))
    } else {
        None
    };

    // a stalls; b, better (older), joins: the arbiter asks a to hand over, and a cannot.
    let agent_group = Pid::from_raw(a.pid());
    killpg(agent_group, Signal::SIGSTOP).unwrap();
    let _b = spawn("b", "1.29.0");
    let requested = eventually("a handover to b to be requested", DEADLINE, || async {
        let l = leases.get("edit").await.ok()?;
        (lease::preferred_holder(&l) == Some("b")).then_some(l)
    })
    .await;
    assert_eq!(
        lease::holder(&requested),
        Some("a"),
        "the edit must come while a's term still runs"
    );
    let pp = PatchParams::default();
    match edit {
        HandEdit::Delete => {
            leases
                .delete("edit", &DeleteParams::default())
                .await
                .unwrap();
        }
        HandEdit::ClearHolder => {
            let p = json!({ "spec": { "holderIdentity": "" } });
            leases.patch("edit", &pp, &Patch::Merge(&p)).await.unwrap();
        }
        HandEdit::LowerDuration => {
            let p = json!({ "spec": { "leaseDurationSeconds": 1 } });
            leases.patch("edit", &pp, &Patch::Merge(&p)).await.unwrap();
        }
        HandEdit::ForgePodUid => {
            let (_, uid) = stopped_pod.expect("made above");
            let p = json!({ "metadata": { "annotations": { "arbiter.dev/holder-pod-uid": uid } } });
            leases.patch("edit", &pp, &Patch::Merge(&p)).await.unwrap();
        }
        HandEdit::RepointOwner => {
            let (name, uid) = stopped_pod.expect("made above");
            let candidates: Api<LeaseCandidate> = env.api();
            let p = json!({ "metadata": { "ownerReferences": [
                { "apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid }
            ] } });
            candidates.patch("a", &pp, &Patch::Merge(&p)).await.unwrap();
        }
        HandEdit::ForgeRelease => {
            let p = json!({
                "metadata": { "annotations": { "arbiter.dev/released-by": "a" } },
                "spec": { "holderIdentity": "" },
            });
            leases.patch("edit", &pp, &Patch::Merge(&p)).await.unwrap();
        }
        HandEdit::ForgeWithdrawal => {
            let l = leases.get("edit").await.unwrap();
            let incarnation = kube::ResourceExt::annotations(&l)
                .get("arbiter.dev/holder-incarnation")
                .cloned()
                .expect("the holder's incarnation on the Lease");
            // Written as arbiter's own field manager, as the agent writes it: anyone who may
            // patch candidates can claim that name.
            let candidates: Api<LeaseCandidate> = env.api();
            let annotate = PatchParams {
                field_manager: Some(arbiter::api::FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            let p =
                json!({ "metadata": { "annotations": { "arbiter.dev/withdrawn": incarnation } } });
            candidates
                .patch("a", &annotate, &Patch::Merge(&p))
                .await
                .unwrap();
            let p = json!({ "spec": { "holderIdentity": "" } });
            leases.patch("edit", &pp, &Patch::Merge(&p)).await.unwrap();
        }
        HandEdit::ClearHolderAndFailover => {
            let p = json!({ "spec": { "holderIdentity": "" } });
            leases.patch("edit", &pp, &Patch::Merge(&p)).await.unwrap();
            // The active replica shuts down (a rolling update): it releases its own lease, and
            // the standby, which never saw this lease held, takes over at once.
            kill(Pid::from_raw(first.pid()), Signal::SIGTERM).unwrap();
            first.wait_exit(DEADLINE).await;
            eventually("the standby to take over", DEADLINE, || async {
                let l = leases.get("arbiter-operator").await.ok()?;
                lease::holder(&l).filter(|h| *h != active).map(|_| ())
            })
            .await;
        }
    }
    let result = std::panic::AssertUnwindSafe(async {
        let b_start = eventually("b's workload to start", DEADLINE, || async {
            starts(&read_log(&log))
                .iter()
                .find(|s| s.0 == "b")
                .map(|s| (s.3, s.1))
        })
        .await;
        let a_stop = stop_of(&read_log(&log), "a");
        assert!(
            a_stop.is_some_and(|stop| stop < b_start.0),
            "{edit:?}: b started at {:.3} while a's workload still ran (stopped at {a_stop:?})",
            b_start.0
        );
        assert!(!alive(cmd), "{edit:?}: a's workload is still running");
        assert!(b_start.1 > a_term, "terms only go up");
    })
    .catch_unwind()
    .await;
    killpg(agent_group, Signal::SIGCONT).unwrap();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    a.wait_exit(DEADLINE).await;
}

/// Deleting a Node object stops nothing on the machine, but the pod garbage collector then
/// marks its pods Failed (DeletionByPodGC) and deletes them. The holder's processes still run:
/// that is no proof, the next holder waits until the holder itself stops and gives the lease
/// back. (Today's main took the Failed phase as proof and elected the next holder at once.)
async fn a_pod_failed_by_the_garbage_collector_is_not_proof_of_a_stop(env: Arc<TestEnv>) {
    use crate::support::agent::{agent_args_with, slow_stop_workload};
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::api::{DeleteParams, PostParams};
    let op = operator(&env);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("workload.log");
    // A node of its own (kwok keeps it Ready), and a pod on it for the holder.
    let node_name = format!("gone-{}", env.ns);
    let nodes: Api<Node> = Api::all(env.client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": { "name": node_name, "labels": { "type": "kwok" } },
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let pods: Api<Pod> = env.api();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": "pa" },
        "spec": { "nodeName": node_name, "containers": [{ "name": "app", "image": "app" }] },
    }))
    .unwrap();
    let uid = pods
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    eventually("the pod to be Running", DEADLINE, || async {
        let p = pods.get("pa").await.ok()?;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    let mut args = agent_args_with(&env.ns, "pa", "gc", "1.30.0", &log, &slow_stop_workload());
    args.splice(1..1, ["--pod-uid".to_string(), uid.clone()]);
    let a = Agent::spawn_args(&env.kubeconfig, "pa", &args, &log);
    wait_for_holder(&env, "gc", "pa", DEADLINE).await;
    let args_b = agent_args_with(&env.ns, "b", "gc", "1.31.0", &log, &slow_stop_workload());
    let _b = Agent::spawn_args(&env.kubeconfig, "b", &args_b, &log);
    op.wait_eligible(&env.ns, "b").await;
    let cmd = eventually("a's workload", DEADLINE, || async {
        Some(starts(&read_log(&log)).iter().find(|s| s.0 == "pa")?.2)
    })
    .await;

    nodes
        .delete(&node_name, &DeleteParams::default())
        .await
        .unwrap();
    // The pod garbage collector waits 40 s for a node to come back, then fails and deletes
    // its pods.
    let gc_deadline = Duration::from_secs(120);
    eventually(
        "the garbage collector to delete the pod",
        gc_deadline,
        || async { pods.get_opt("pa").await.ok()?.is_none().then_some(()) },
    )
    .await;
    let b_start = eventually("b's workload to start", gc_deadline, || async {
        starts(&read_log(&log))
            .iter()
            .find(|s| s.0 == "b")
            .map(|s| s.3)
    })
    .await;
    let a_stop = stop_of(&read_log(&log), "pa");
    assert!(
        a_stop.is_some_and(|stop| stop < b_start),
        "b started at {b_start:.3} while the holder's workload still ran (stopped at {a_stop:?})"
    );
    assert!(!alive(cmd));
    // (pa handed the lease over and stands by again: stopped when the test ends.)
    drop(a);
}

/// The one case the guard cannot cover: the whole candidate (agent, guard and workload) is
/// frozen, as a paused container or VM is, past its lease; the next holder starts; then it
/// resumes. Its guard stops the workload at once, late, and the agent reports the overrun:
/// the operator raises DoubleHolder (condition, Warning Event, arbiter_double_holders_total).
async fn a_frozen_candidate_that_outlives_its_term_is_reported_as_a_double_holder(
    env: Arc<TestEnv>,
) {
    let op = operator(&env);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("workload.log");
    let mut a = Agent::spawn(&env.kubeconfig, &env.ns, "a", "freeze", "1.30.0", &log);
    let a_term = lease::term(&wait_for_holder(&env, "freeze", "a", DEADLINE).await);
    let _b = Agent::spawn(&env.kubeconfig, &env.ns, "b", "freeze", "1.31.0", &log);
    op.wait_eligible(&env.ns, "b").await;
    eventually("a's workload", DEADLINE, || async {
        starts(&read_log(&log))
            .iter()
            .find(|s| s.0 == "a")
            .map(|_| ())
    })
    .await;
    let frozen = descendants(a.pid());
    assert!(frozen.len() >= 3, "agent, guard and workload: {frozen:?}");
    for p in &frozen {
        let _ = kill(Pid::from_raw(*p), Signal::SIGSTOP);
    }
    let result = std::panic::AssertUnwindSafe(async {
        eventually("b's workload to start", DEADLINE, || async {
            starts(&read_log(&log))
                .iter()
                .find(|s| s.0 == "b" && s.1 > a_term)
                .map(|_| ())
        })
        .await;
    })
    .catch_unwind()
    .await;
    for p in &frozen {
        let _ = kill(Pid::from_raw(*p), Signal::SIGCONT);
    }
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    let candidates: Api<LeaseCandidate> = env.api();
    let message = eventually("DoubleHolder=True on a", DEADLINE, || async {
        let c = candidates.get("a").await.ok()?;
        c.status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "DoubleHolder" && c.status == "True")
            .map(|c| c.message)
    })
    .await;
    assert!(message.contains(&format!("term {a_term}")), "{message}");
    crate::support::wait_for_event(&env, "a", "DoubleHolder", DEADLINE).await;
    let metrics = op.http_get("/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("arbiter_double_holders_total ") && !l.ends_with(" 0")),
        "{metrics}"
    );
    assert_eq!(a.wait_exit(DEADLINE).await, Some(1));
}

/// `pid` and every process descended from it.
/// Trust-boundary item 8: the guard is killed (the OOM killer, a stray `kill -9`) while the
/// workload runs. The agent stops the workload (and its background child) at once, gives the
/// lease up and exits 1, rather than run on without a watchdog (a later stall of the agent
/// alone then let the workload outlive its term, or its agent's death orphan it for good).
async fn a_dead_guard_stops_the_workload_and_ends_the_term(env: Arc<TestEnv>) {
    let _op = operator(&env);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("workload.log");
    let mut a = Agent::spawn(&env.kubeconfig, &env.ns, "a", "guarded", "1.30.0", &log);
    wait_for_holder(&env, "guarded", "a", DEADLINE).await;
    let (_, _, cmd, _) = wait_started(&log, "a").await;
    let grandchild = eventually("the workload's child", DEADLINE, || async {
        child_of(&read_log(&log), "a")
    })
    .await;
    let guard = children(a.pid())
        .into_iter()
        .map(|(pid, _)| pid)
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|arg| arg == b"guard"))
        })
        .expect("the agent's guard process");
    kill(Pid::from_raw(guard), Signal::SIGKILL).unwrap();
    // Stopped within the kill grace (2 s) and a little.
    let code = a.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(code, Some(1), "the term ended on the guard's death");
    assert!(!alive(cmd), "the workload still runs without its guard");
    assert!(!alive(grandchild), "the workload's child still runs");
    assert!(
        stop_of(&read_log(&log), "a").is_some(),
        "the workload was stopped (SIGTERM), not left running"
    );
    let leases: Api<Lease> = env.api();
    let l = leases.get("guarded").await.unwrap();
    assert_eq!(lease::holder(&l), None, "the lease was given back");
}

/// After handing `lease` over, `agent` runs on: its candidate is registered again, by a new
/// process incarnation, and it does not hold the lease.
async fn stands_by_again(env: &TestEnv, agent: &mut Agent, lease_name: &str) {
    let candidates: Api<LeaseCandidate> = env.api();
    let leases: Api<Lease> = env.api();
    let id = agent.identity.clone();
    let holder = lease::holder(&leases.get(lease_name).await.unwrap()).map(str::to_string);
    assert_ne!(holder.as_deref(), Some(id.as_str()));
    eventually(&format!("{id} registered again"), DEADLINE, || async {
        let c = candidates.get_opt(&id).await.ok()??;
        let stamp = kube::ResourceExt::annotations(&c)
            .get(lease::INCARNATION_ANNOTATION)?
            .clone();
        // Not withdrawn: a live process stands behind it.
        (!kube::ResourceExt::annotations(&c).contains_key("arbiter.dev/withdrawn")).then_some(stamp)
    })
    .await;
    assert!(
        agent.child.try_wait().unwrap().is_none(),
        "{id} exited after handing over"
    );
}

fn descendants(pid: i32) -> Vec<i32> {
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        let children: Vec<i32> = children(out[i]).into_iter().map(|(c, _)| c).collect();
        out.extend(children);
        i += 1;
    }
    out
}

/// Issue 17's trace: two agents, `d1` (1.30.0, the holder) and `d2` (1.31.0); the Lease is
/// deleted by hand. `d1` stops its workload, exits 1 (its term is over) and withdraws its
/// candidate, marked with its incarnation. The arbiter must settle on the live `d2` once d1's
/// term has run out (the mark is no proof: anyone who may write candidates could forge it),
/// never ask it to hand over to the departed `d1`, and `d2` keeps the lease. (Before: `d2` was
/// elected and at once asked to hand over to the exited `d1`; it obeyed and exited, and the
/// Lease named a dead holder.)
async fn deleting_the_lease_settles_on_the_live_candidate(env: Arc<TestEnv>) {
    use kube::api::DeleteParams;
    let op = operator(&env);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("workload.log");
    let mut d1 = Agent::spawn(&env.kubeconfig, &env.ns, "d1", "settle", "1.30.0", &log);
    wait_for_holder(&env, "settle", "d1", DEADLINE).await;
    let mut d2 = Agent::spawn(&env.kubeconfig, &env.ns, "d2", "settle", "1.31.0", &log);
    op.wait_eligible(&env.ns, "d2").await;
    wait_started(&log, "d1").await;

    let leases: Api<Lease> = env.api();
    let history = crate::support::operator::record_lease(&env, "settle").await;
    // Deleted as last renewed: d1's term runs until that renewal plus the lease duration.
    let last_renewal = loop {
        let l = leases.get("settle").await.unwrap();
        let dp = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                resource_version: l.metadata.resource_version.clone(),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        match leases.delete("settle", &dp).await {
            Ok(_) => break l.spec.unwrap().renew_time.unwrap().0,
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => panic!("deleting the Lease: {e}"),
        }
    };
    let term_end = last_renewal.as_millisecond() as f64 / 1000.0 + LEASE_DURATION.as_secs_f64();
    assert_eq!(d1.wait_exit(DEADLINE).await, Some(1), "d1's term is over");
    let started = wait_started(&log, "d2").await;
    let d1_stop = stop_of(&read_log(&log), "d1");
    assert!(
        d1_stop.is_some_and(|stop| stop < started.3),
        "d2's workload started at {:.3} before d1's stopped ({d1_stop:?})",
        started.3
    );
    assert!(
        started.3 >= term_end,
        "d2's workload started {:.1}s before d1's term ran out: its withdrawal mark was taken as proof",
        term_end - started.3
    );
    // d2 goes on holding the same term.
    let term = started.1;
    let renewals = Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    eventually("d2 to renew its term three times", DEADLINE, || {
        let (leases, renewals) = (leases.clone(), renewals.clone());
        async move {
            let l = leases.get("settle").await.ok()?;
            assert_eq!(lease::holder(&l), Some("d2"), "d2 lost the lease");
            assert_eq!(lease::term(&l), term, "the lease moved on from d2's term");
            let mut seen = renewals.lock().unwrap();
            seen.insert(l.spec?.renew_time?.0);
            (seen.len() >= 3).then_some(())
        }
    })
    .await;
    let history = history.until_held("d2", term).await;
    assert!(
        history
            .iter()
            .all(|(_, preferred, _)| preferred.as_deref() != Some("d1")),
        "a handover to the departed d1 was requested: {history:?}"
    );
    assert!(d2.child.try_wait().unwrap().is_none(), "d2 exited");
    assert_eq!(running(&read_log(&log)), ["d2"]);
    // d1 withdrew: shown on its candidate, which is never elected again.
    let candidates: Api<LeaseCandidate> = env.api();
    eventually("d1 to be reported Withdrawn", DEADLINE, || async {
        let c = candidates.get_opt("d1").await.ok()??;
        c.status?
            .conditions
            .iter()
            .any(|c| c.type_ == "Eligible" && c.reason == "Withdrawn")
            .then_some(())
    })
    .await;
}

/// `arbiter handover`: a planned switchover from `h` to its equal `twin`, carried out by the
/// operator (h's workload stops before twin's starts; the command prints the new holder and
/// term); refused with exit 2 and the reason for a newer version, an unknown candidate, or the
/// holder itself.
async fn arbiter_handover_switches_over_to_an_equal_and_refuses_a_newer_version(env: Arc<TestEnv>) {
    let op = operator(&env);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("workload.log");
    let mut h = Agent::spawn(&env.kubeconfig, &env.ns, "h", "switch", "1.30.0", &log);
    let held = wait_for_holder(&env, "switch", "h", DEADLINE).await;
    let _twin = Agent::spawn(&env.kubeconfig, &env.ns, "twin", "switch", "1.30.0", &log);
    let _newer = Agent::spawn(&env.kubeconfig, &env.ns, "newer", "switch", "1.31.0", &log);
    op.wait_eligible(&env.ns, "twin").await;
    op.wait_eligible(&env.ns, "newer").await;
    wait_started(&log, "h").await;
    let handover = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_arbiter"))
            .args(["handover", "switch", "-n", &env.ns, "--timeout", "30s"])
            .args(args)
            .env("KUBECONFIG", &env.kubeconfig)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    for (to, why) in [
        ("newer", "never a newer version"),
        ("ghost", "not a candidate"),
        ("h", "already holds"),
    ] {
        let (code, _, stderr) = handover(&["--to", to]);
        assert_eq!(code, Some(2), "--to {to}: {stderr}");
        assert!(stderr.contains(why), "--to {to}: {stderr}");
    }
    let leases: Api<Lease> = env.api();
    let l = leases.get("switch").await.unwrap();
    assert_eq!(lease::holder(&l), Some("h"), "a refusal changes nothing");

    let (code, stdout, stderr) = handover(&["--to", "twin"]);
    assert_eq!(code, Some(0), "{stderr}");
    let new_term = lease::term(&held) + 1;
    assert!(
        stdout.contains(&format!("held by twin at term {new_term}")),
        "{stdout}"
    );
    let twin_start = wait_started(&log, "twin").await;
    let h_stop = stop_of(&read_log(&log), "h");
    assert!(
        h_stop.is_some_and(|stop| stop < twin_start.3),
        "twin's workload started before h's stopped ({h_stop:?})"
    );
    stands_by_again(&env, &mut h, "switch").await;
    let l = leases.get("switch").await.unwrap();
    assert!(
        !kube::ResourceExt::annotations(&l).contains_key(lease::HANDOVER_REQUEST_ANNOTATION),
        "the request is removed once carried out"
    );
}

/// A candidate left owned by a pod that declares the lease (an earlier process of this identity
/// ran in it, or someone set the owner), and a process of that identity outside any pod: the
/// arbiter would record that pod with each assignment, and the agent takes a term only in the
/// pod it was assigned in. Registering, the agent drops the pod from the candidate's owners, so
/// its terms are assigned without a pod, and it leads.
async fn an_agent_outside_a_pod_drops_a_pod_left_as_its_candidates_owner(env: Arc<TestEnv>) {
    let _op = operator(&env);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("workload.log");
    let pod = StandIn::spawn(
        env.client.clone(),
        &env.ns,
        "web-9",
        BTreeMap::from([("arbiter.dev/lease".to_string(), "solo".to_string())]),
        5,
        "sh",
        &["-c", "trap 'exit 0' TERM; while :; do sleep 0.05; done"],
    )
    .await;
    let owner = k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        ..Default::default()
    };
    crate::support::operator::create_candidate(
        &env,
        "x",
        "solo",
        "1.30.0",
        Some("1.30.0"),
        arbiter::api::OLDEST_EMULATION_VERSION,
        Some(owner),
    )
    .await;
    let _agent = Agent::spawn(&env.kubeconfig, &env.ns, "x", "solo", "1.30.0", &log);
    wait_started(&log, "x").await;
    let candidates: Api<LeaseCandidate> = env.api();
    let c = candidates.get("x").await.unwrap();
    assert!(
        c.metadata
            .owner_references
            .unwrap_or_default()
            .iter()
            .all(|o| o.kind != "Pod"),
        "the pod is no longer the candidate's owner"
    );
}

/// `--health-address`: `/healthz` answers 200 on the leader and on a standby, whose workload does
/// not run (a liveness probe on it must not restart standbys).
async fn the_health_endpoint_answers_on_a_standby_and_on_the_leader(env: Arc<TestEnv>) {
    let _op = operator(&env);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("workload.log");
    let with_health = |name: &str, version: &str| {
        let mut args = agent_args(&env.ns, name, "probed", version, &log);
        let at = args.iter().position(|a| a == "--").unwrap();
        args.splice(
            at..at,
            ["--health-address".to_string(), "127.0.0.1:0".to_string()],
        );
        Agent::spawn_args(&env.kubeconfig, name, &args, &log)
    };
    let leader = with_health("old", "1.30.0");
    let standby = with_health("new", "1.31.0");
    wait_for_holder(&env, "probed", "old", DEADLINE).await;
    wait_started(&log, "old").await;
    for agent in [&leader, &standby] {
        let response = healthz(agent).await;
        assert!(
            response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200"),
            "{}: {response}",
            agent.identity
        );
    }
    assert_eq!(
        running(&read_log(&log)),
        ["old"],
        "the standby's workload does not run"
    );
}

/// GETs /healthz from `agent` (its address is in its log).
async fn healthz(agent: &Agent) -> String {
    let logs = || std::fs::read_to_string(&agent.log).unwrap_or_default();
    crate::support::get_from_logged(logs, "serving /healthz", "/healthz").await
}
