//! arbiter's end-to-end tests, against a real control plane (see `e2e/cluster.sh`).
//!
//! One cluster is shared by every test; each test runs in a namespace of its own. The cluster is
//! started here and stopped at the end, unless `ARBITER_E2E_KUBECONFIG` names a running one.

mod agent;
mod chart;
mod control_plane;
mod crd;
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
    all
}

fn main() {
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
            arbiter::api::apply_crds(client, Duration::from_secs(30))
                .await
                .expect("installing the CRD");
        });
    }

    let trials = tests()
        .into_iter()
        .map(|(name, test)| {
            let kubeconfig = kubeconfig.clone();
            Trial::test(name, move || {
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
