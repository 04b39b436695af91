//! The Kubernetes client every arbiter process uses.

use kube::{Client, Config};

/// The User-Agent of every request arbiter makes: `arbiter/VERSION`.
pub const USER_AGENT: &str = concat!("arbiter/", env!("CARGO_PKG_VERSION"));

/// A client from the environment (in-cluster, or `KUBECONFIG`), with kube's automatic retries
/// turned off: a request that fails must fail promptly to the caller, who owns the deadline (a
/// renew retried inside the client for minutes would outlive the lease it renews).
pub async fn connect() -> anyhow::Result<Client> {
    let mut config = Config::infer()
        .await
        .map_err(|e| anyhow::anyhow!("loading the Kubernetes client configuration: {e}"))?;
    config.default_retry = false;
    // Name ourselves, so that API server logs and audit events tell arbiter's requests apart.
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(USER_AGENT),
    ));
    Client::try_from(config).map_err(|e| anyhow::anyhow!("building the Kubernetes client: {e}"))
}
