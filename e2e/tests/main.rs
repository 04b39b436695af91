//! arbiter's end-to-end tests, against a real control plane (see `e2e/cluster.sh`).
//!
//! One cluster is shared by every test; each test runs in a namespace of its own. The cluster is
//! started here and stopped at the end, unless `ARBITER_E2E_KUBECONFIG` names a running one.

mod agent;
mod chart;
mod control_plane;
mod crd;
mod docs;
mod go_controllers;
mod inject;
mod operator;
mod real_node;
mod release;
mod single_active;
mod support;
mod tenants;
mod trust;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use libtest_mimic::{Arguments, Trial};
use support::{Cluster, TestEnv};

/// An end-to-end test: an async function given its own namespace.
pub type TestFn = fn(Arc<TestEnv>) -> Pin<Box<dyn Future<Output = ()> + Send>>;

/// `tests![module: f, g]` lists async test functions `f(env: Arc<TestEnv>)` as `module::f`, ....
#[macro_export]
macro_rules! tests {
    ($module:ident: $($name:ident),* $(,)?) => {
        pub fn tests() -> Vec<(&'static str, $crate::TestFn)> {
            vec![$((
                concat!(stringify!($module), "::", stringify!($name)),
                (|env| Box::pin($name(env))) as $crate::TestFn,
            )),*]
        }
    };
}

/// Every test, by name.
fn tests() -> Vec<(&'static str, TestFn)> {
    let mut all = Vec::new();
    all.extend(crd::tests());
    all.extend(control_plane::tests());
    all.extend(operator::tests());
    all.extend(agent::tests());
    all.extend(chart::tests());
    all.extend(single_active::tests());
    all.extend(real_node::tests());
    all.extend(inject::tests());
    all.extend(release::tests());
    all.extend(trust::tests());
    all.extend(tenants::tests());
    all.extend(docs::tests());
    all.extend(go_controllers::tests());
    all
}

/// The compatibility subset `make e2e-matrix` runs on every tested Kubernetes minor
/// (`ARBITER_E2E_SUBSET=compat`): what differs across minors. The CRD's schema and CEL rules
/// (semver among them) with valid and invalid versions; an election, a handover, an expiry and
/// the Lease's compare-and-swap; server-side apply's field managers; eviction; the chart's
/// install, upgrade, uninstall and `helm test`; the webhook's admission; on the real node the
/// kubelet's reports that prove a pod stopped and a container ended; and the Go module's lock
/// (client-go's informers and controller-runtime against each server).
const COMPAT: &[&str] = &[
    "crd::",
    "operator::single_candidate_is_elected",
    "operator::better_candidate_gets_the_lease_through_handover",
    "operator::expired_lease_goes_to_a_live_candidate",
    "operator::lapsed_holder_pod_still_running_is_evicted",
    "operator::clearing_the_operator_lease_does_not_make_two_arbiters",
    "operator::elections_write_no_status_and_one_event_each",
    "agent::graceful_handover_stops_the_old_workload_before_the_new_starts",
    "agent::clearing_the_holder_does_not_shorten_its_term",
    "chart::install_upgrade_uninstall",
    "single_active::deployment_gets_exactly_one_active_pod",
    "real_node::the_charts_operator_runs_in_the_cluster_and_fails_over",
    "real_node::a_deleted_agent_pods_workload_stops_before_the_next_starts",
    "real_node::a_crashed_agents_container_restart_hands_the_lease_on_without_waiting_for_expiry",
    "inject::an_injected_deployment_runs_one_command_at_a_time_through_updates_rollback_and_rotation",
    "inject::with_cert_manager_the_operator_serves_what_the_secret_holds_and_writes_neither",
    // client-go v0.37's informers (streaming lists where the server has them) and
    // controller-runtime against each server: the Go lock's handover, and its pods' reports.
    "go_controllers::a_rollback_hands_over_with_the_newer_replicas_reconciles_stopped_first",
    "go_controllers::go_managers_as_pods_hand_over_at_once_when_the_leader_pod_is_deleted_or_its_container_crashes",
];

/// Whether test `name` is in the subset `ARBITER_E2E_SUBSET` names (every test when unset).
fn selected(name: &str) -> bool {
    match std::env::var("ARBITER_E2E_SUBSET").as_deref() {
        Err(_) | Ok("") | Ok("all") => true,
        Ok("compat") => COMPAT
            .iter()
            .any(|c| name == *c || (c.ends_with("::") && name.starts_with(c))),
        Ok(other) => panic!("ARBITER_E2E_SUBSET={other}: it is `compat` or `all`"),
    }
}

/// Each selected test's name, or, with `ARBITER_E2E_REPEAT=N` (to hunt a flaky test: `N`
/// copies run side by side, each in its own namespace), `N` names `test#1` ... `test#N`.
fn repeated(name: &'static str) -> impl Iterator<Item = String> {
    let n: usize = match std::env::var("ARBITER_E2E_REPEAT").as_deref() {
        Err(_) | Ok("") => 0,
        Ok(n) => n
            .parse()
            .unwrap_or_else(|_| panic!("ARBITER_E2E_REPEAT={n}: a number")),
    };
    let names: Vec<String> = match n {
        0 | 1 => vec![name.to_string()],
        n => (1..=n).map(|i| format!("{name}#{i}")).collect(),
    };
    names.into_iter()
}

fn main() {
    // A renamed test must not drop out of the matrix unnoticed.
    let names: Vec<&str> = tests().iter().map(|(n, _)| *n).collect();
    for c in COMPAT {
        assert!(
            names
                .iter()
                .any(|n| n == c || (c.ends_with("::") && n.starts_with(c))),
            "the compatibility subset names {c}, which is no test"
        );
    }
    let mut args = Arguments::from_args();
    // The tests mostly wait on the API server, so run more of them than there are cores.
    args.test_threads.get_or_insert(6);
    let listing = args.list;
    let cluster = (!listing).then(Cluster::start_or_reuse_with_node);
    let kubeconfig: Option<Arc<PathBuf>> = cluster.as_ref().map(|c| Arc::new(c.kubeconfig.clone()));

    if let Some(path) = &kubeconfig {
        let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
        rt.block_on(async {
            let client = support::client_for(path).await;
            let version = client
                .apiserver_version()
                .await
                .expect("the server's version");
            eprintln!("[e2e] kube-apiserver {}", version.git_version);
            arbiter::api::apply_crds(client, Duration::from_secs(30))
                .await
                .expect("installing the CRD");
        });
    }

    let trials = tests()
        .into_iter()
        .filter(|(name, _)| selected(name))
        .flat_map(|(name, test)| repeated(name).map(move |shown| (name, shown, test)))
        .map(|(name, shown, test)| {
            let kubeconfig = kubeconfig.clone();
            Trial::test(shown, move || {
                let path = kubeconfig.expect("a cluster when running tests");
                let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
                let outcome = rt.block_on(async {
                    let env = Arc::new(TestEnv::new(&path, name).await);
                    let result = tokio::spawn(test(env.clone())).await;
                    if let Ok(env) = Arc::try_unwrap(env) {
                        env.cleanup().await;
                    }
                    result.map_err(|e| {
                        let msg = e.into_panic();
                        msg.downcast_ref::<String>()
                            .cloned()
                            .or_else(|| msg.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_else(|| "test panicked".into())
                            .into()
                    })
                });
                // A blocking task a failed test left behind (a stand-in waiting on a process
                // that still runs) must not hang the suite: the runtime is not waited for.
                rt.shutdown_timeout(Duration::from_secs(5));
                outcome
            })
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    drop(cluster);
    conclusion.exit();
}
