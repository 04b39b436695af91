//! The Kubernetes client every arbiter process uses.

use kube::{Client, Config};

/// A client from the environment (in-cluster, or `KUBECONFIG`), with kube's automatic retries
/// turned off: a request that fails must fail promptly to the caller, who owns the deadline (a
/// renew retried inside the client for minutes would outlive the lease it renews).
pub async fn connect() -> anyhow::Result<Client> {
    let mut config = Config::infer()
        .await
        .map_err(|e| anyhow::anyhow!("loading the Kubernetes client configuration: {e}"))?;
    config.default_retry = false;
    Client::try_from(config).map_err(|e| anyhow::anyhow!("building the Kubernetes client: {e}"))
}
