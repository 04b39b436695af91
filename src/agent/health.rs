//! `arbiter run --health-address`: `GET /healthz` answers 200 while this agent is a live
//! candidate (standing by or leading), and 503 before it has registered (an agent whose term
//! ends exits, so there is no later unhealthy state to report). It is meant for a container's
//! liveness probe when the workload's own probe would fail on a standby (whose workload does
//! not run): the kubelet then restarts a container whose agent cannot register, not every
//! standby.
//!
//! Served on its own task; if it ends, the process exits (its workload dies with it: its
//! parent-death signal), since a probe that cannot be answered would have the kubelet restart
//! the container anyway.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::sync::watch;

/// The router: `/healthz` from `healthy`.
pub fn router(healthy: watch::Receiver<bool>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .with_state(healthy)
}

async fn healthz(State(healthy): State<watch::Receiver<bool>>) -> (StatusCode, &'static str) {
    if *healthy.borrow() {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not a live candidate\n")
    }
}

/// Binds `address` (an error here is a start-up error) and serves `/healthz` on a task of its
/// own, which takes the process down if it ends.
pub async fn start(address: SocketAddr, healthy: watch::Receiver<bool>) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| anyhow::anyhow!("--health-address {address}: {e}"))?;
    tracing::info!(address = %listener.local_addr()?, "serving /healthz");
    tokio::spawn(async move {
        let ended = axum::serve(listener, router(healthy)).await;
        tracing::error!(?ended, "the /healthz server ended: exiting");
        std::process::exit(1);
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    use super::*;

    async fn status(healthy: bool) -> StatusCode {
        let (_tx, rx) = watch::channel(healthy);
        let request = Request::get("/healthz").body(Body::empty()).unwrap();
        router(rx).oneshot(request).await.unwrap().status()
    }

    #[tokio::test]
    async fn healthy_while_a_live_candidate_and_not_otherwise() {
        assert_eq!(status(true).await, StatusCode::OK);
        assert_eq!(status(false).await, StatusCode::SERVICE_UNAVAILABLE);
    }
}
