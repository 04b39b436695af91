//! `make bench`: numbers, printed, never asserted.
//!
//! - **failover**: the leaderless gap of arbiter against plain client-go leader election and
//!   upstream coordinated leader election, and of a controller-runtime manager via arbiter
//!   (the Go module's example) against the same manager under controller-runtime's own leader
//!   election, per scenario, over `--runs` rounds (default 20), with the ratio ours ÷ each
//!   baseline.
//! - **scale**: one operator arbitrating `--leases` leases (default 1000) × 3 simulated
//!   candidates: its peak RSS and CPU seconds, the API requests it makes per lease-hour in steady
//!   state (counted from the API server's audit log), and election latency when 10% of the
//!   holders renew together and then fail at once (a burst of re-elections all due together),
//!   beside kube-apiserver's CPU over that burst.
//!
//! It starts its own control plane with the `CoordinatedLeaderElection` gate and
//! `coordination.k8s.io/v1beta1` on (the upstream baseline needs them) and an audit log.
//!
//!   With `--unrelated-pods N`, N ordinary pods that are not candidates are created first and
//!   the operator watches every namespace. It also prints the API writes an election costs.
//! - **pods**: what `--pods` ordinary pods that are not candidates (default 5000) add to the
//!   memory of an operator watching every namespace.
//! - **neighbours**: a burst of `--burst` first elections (default 1,000) in one namespace
//!   while one holder fails in each of five others, over `--neighbour-rounds` rounds (default
//!   3), with the fair queue and with the queue it replaced: how long after expiry the five are
//!   re-elected.
//! - **write-cost**: kube-apiserver's CPU per request for each kind of write an election or a
//!   candidate makes (a Lease renewal, a term mark, a ping, a candidate's status, ...): what
//!   the scale bench's elections are bound by on this machine.
//!
//! `cargo test --release --test bench -- [--only failover|scale|pods|neighbours|write-cost]
//! [--runs N] [--burst N] [--neighbour-rounds N]
//! [--leases N,N] [--unrelated-pods N] [--window SECONDS] [--pods N] [--concurrency N]
//! [--ack-valid-for DURATION] [--before BIN]`;
//! `--before BIN` runs the scale bench with that build of the operator first, then with this
//! one (or `ARBITER_OPERATOR_BIN`), and prints the two side by side;
//! `ARBITER_OPERATOR_BIN` runs another build of the operator, and `ARBITER_BENCH_CRD` (a CRD
//! YAML file, e.g. that build's `crds/` file) has the scale bench install that CRD instead of
//! this build's; `--concurrency` and `--ack-valid-for` are passed to the scale bench's
//! operator (default: the operator's own defaults); `ARBITER_E2E_APISERVER_FLAGS` is added after the
//! bench's own kube-apiserver flags (`--profiling=true` to take its CPU profile during a run).

#[path = "../tests/support/mod.rs"]
#[allow(dead_code)]
mod support;

mod failover;
mod neighbours;
mod scale;
mod stats;
mod write_cost;

use std::collections::BTreeMap;
use std::time::Duration;

use failover::{CASES, Scenario, System};
use futures::future::join_all;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use support::Cluster;
use support::operator::Operator;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let runs: usize = arg("--runs").and_then(|v| v.parse().ok()).unwrap_or(20);
    let leases: Vec<usize> = arg("--leases")
        .unwrap_or_else(|| "1000".into())
        .split(',')
        .filter_map(|v| v.parse().ok())
        .collect();
    let only = arg("--only");
    let window = Duration::from_secs(arg("--window").and_then(|v| v.parse().ok()).unwrap_or(180));
    let unrelated: usize = arg("--unrelated-pods")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let concurrency = arg("--concurrency");
    let ack_valid_for = arg("--ack-valid-for");
    let audit = scale::Audit::prepare();
    // Flags given in ARBITER_E2E_APISERVER_FLAGS come last (e.g. `--profiling=true`, to take
    // kube-apiserver's CPU profile during a run).
    let extra = std::env::var("ARBITER_E2E_APISERVER_FLAGS").unwrap_or_default();
    // SAFETY: no other thread exists yet.
    unsafe {
        std::env::set_var(
            "ARBITER_E2E_APISERVER_FLAGS",
            format!(
                "--feature-gates=CoordinatedLeaderElection=true \
                 --runtime-config=coordination.k8s.io/v1beta1=true {} {extra}",
                audit.flags()
            ),
        );
        std::env::remove_var("ARBITER_E2E_KUBECONFIG");
    }
    println!("bench on {}", stats::machine());
    // With the real node: the "crash, container restarts" case runs real pods.
    let cluster = Cluster::start_or_reuse_with_node();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        if only.as_deref().is_none_or(|o| o == "failover") {
            failover_bench(&cluster, runs).await;
        }
        if only.as_deref().is_none_or(|o| o == "pods") {
            let pods = arg("--pods").and_then(|v| v.parse().ok()).unwrap_or(5000);
            scale::unrelated_pods(&cluster.kubeconfig, pods).await;
        }
        if only.as_deref().is_none_or(|o| o == "write-cost") {
            write_cost::run(&cluster.kubeconfig).await;
        }
        if only.as_deref().is_none_or(|o| o == "neighbours") {
            let rounds = arg("--neighbour-rounds")
                .and_then(|v| v.parse().ok())
                .unwrap_or(3);
            let burst = arg("--burst").and_then(|v| v.parse().ok()).unwrap_or(1000);
            let client = support::client_for(&cluster.kubeconfig).await;
            arbiter::api::apply_crds(client, Duration::from_secs(30))
                .await
                .expect("installing the CRD");
            neighbours::run(&cluster.kubeconfig, rounds, burst).await;
        }
        if only.as_deref().is_none_or(|o| o == "scale") {
            for n in &leases {
                let setup = scale::Setup {
                    leases: *n,
                    unrelated,
                    window,
                    concurrency: concurrency.clone(),
                    ack_valid_for: ack_valid_for.clone(),
                    operator: None,
                };
                // `--before BIN`: that build first, then this one, and the two side by side.
                let before = match arg("--before") {
                    Some(bin) => {
                        let setup = scale::Setup {
                            operator: Some(bin.into()),
                            ..setup.clone()
                        };
                        scale::run(&cluster.kubeconfig, &audit, &setup).await
                    }
                    None => None,
                };
                let after = scale::run(&cluster.kubeconfig, &audit, &setup).await;
                if let (Some(b), Some(a)) = (before, after) {
                    scale::compare(*n, &b, &a);
                }
            }
        }
    });
}

async fn failover_bench(cluster: &Cluster, runs: usize) {
    let client = support::client_for(&cluster.kubeconfig).await;
    arbiter::api::apply_crds(client.clone(), Duration::from_secs(30))
        .await
        .expect("installing the CRD");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for system in [
        System::Arbiter,
        System::ClientGo,
        System::Upstream,
        System::GoPlain,
    ] {
        let mut ns = Namespace::default();
        ns.metadata.name = Some(system.namespace().into());
        let _ = namespaces.create(&PostParams::default(), &ns).await;
    }
    support::node::ready(&support::TestEnv {
        client: client.clone(),
        ns: System::Arbiter.namespace().into(),
        kubeconfig: cluster.kubeconfig.clone(),
    })
    .await;
    support::node::agent_service_account(&client, System::Arbiter.namespace()).await;
    let dir = tempfile::tempdir().unwrap();
    let env = failover::Env {
        client,
        kubeconfig: cluster.kubeconfig.clone(),
        lecandidate: failover::build_lecandidate(),
        dir: dir.path().to_path_buf(),
    };
    // One operator, default timings, for the arbiter cases.
    let _operator = Operator::start_with(&cluster.kubeconfig, System::Arbiter.namespace(), &[]);

    println!(
        "\nfailover: {runs} rounds of {} cases, run concurrently within a round",
        CASES.len()
    );
    let mut gaps = Samples::default();
    let mut failures = Vec::new();
    for round in 0..runs {
        let results = join_all(
            CASES
                .iter()
                .map(|&(system, scenario)| failover::sample(&env, system, scenario, round)),
        )
        .await;
        let mut line = format!("round {round:>2}:");
        for (&(system, scenario), r) in CASES.iter().zip(results) {
            match r {
                Ok(sample) => {
                    line += &format!(" {:.2}", sample.gap);
                    gaps.entry((scenario, system)).or_default().push(sample);
                }
                Err(e) => {
                    line += " -";
                    failures.push(format!("round {round} {system:?} {scenario:?}: {e}"));
                }
            }
        }
        println!("{line}");
    }
    for f in &failures {
        println!("no sample: {f}");
    }
    report(
        &gaps,
        "leaderless gap: old workload's end to new workload's start",
        |s| Some(s.gap),
    );
    report(
        &gaps,
        "time to a new leader: fault to new workload's start",
        |s| Some(s.to_new),
    );
    report(
        &gaps,
        "better candidate joins: its registration (its candidate first seen) to its workload's start",
        |s| s.from_registration,
    );
}

type Samples = BTreeMap<(Scenario, System), Vec<failover::Sample>>;

/// One table: per scenario and system, n, p50, p95, p99, max, and ours ÷ each baseline: the
/// agent's against client-go's and upstream's, controller-runtime's via arbiter against its
/// own leader election. `metric` is `None` for a sample that does not have it (a scenario's
/// row is left out when none has).
fn report(samples: &Samples, title: &str, metric: fn(&failover::Sample) -> Option<f64>) {
    println!("\n{title} (seconds)\n");
    println!(
        "| scenario | system | n | overlaps | p50 | p95 | p99 | max | ours ÷ this, p50 | ours ÷ this, p95 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    // Overlaps: samples where the new workload started before the old one ended.
    let summary = |scenario, system| {
        let s = samples.get(&(scenario, system))?;
        let v: Vec<f64> = s.iter().filter_map(metric).collect();
        (!v.is_empty()).then(|| (stats::summary(&v), s.iter().filter(|x| x.gap < 0.0).count()))
    };
    let ratio = |a: f64, b: f64| {
        if b > 0.0 {
            format!("{:.3}", a / b)
        } else {
            "-".into()
        }
    };
    let families = [
        (
            System::Arbiter,
            [System::ClientGo, System::Upstream].as_slice(),
        ),
        (System::GoArbiter, [System::GoPlain].as_slice()),
    ];
    for scenario in [
        Scenario::Graceful,
        Scenario::Preempt,
        Scenario::Crash,
        Scenario::CrashPodGone,
        Scenario::CrashContainerRestarts,
    ] {
        let mut first = true;
        for (ours_system, baselines) in families {
            let Some((ours, overlaps)) = summary(scenario, ours_system) else {
                continue;
            };
            let label = if std::mem::take(&mut first) {
                scenario.label()
            } else {
                ""
            };
            println!(
                "| {label} | {} | {} | {overlaps} | {:.2} | {:.2} | {:.2} | {:.2} | | |",
                ours_system.label(),
                ours.n,
                ours.p50,
                ours.p95,
                ours.p99,
                ours.max
            );
            // Pod-gone has no baseline of its own: the baselines can only wait for expiry.
            let base = if matches!(
                scenario,
                Scenario::CrashPodGone | Scenario::CrashContainerRestarts
            ) {
                Scenario::Crash
            } else {
                scenario
            };
            for &system in baselines {
                let Some((s, overlaps)) = summary(base, system) else {
                    continue;
                };
                let name = if base == scenario {
                    system.label().to_string()
                } else {
                    format!("{} ({})", system.label(), base.label())
                };
                println!(
                    "| | {name} | {} | {overlaps} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} |",
                    s.n,
                    s.p50,
                    s.p95,
                    s.p99,
                    s.max,
                    ratio(ours.p50, s.p50),
                    ratio(ours.p95, s.p95)
                );
            }
        }
    }
}
