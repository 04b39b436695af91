//! Serving the webhook: HTTPS on every replica, with the certificate and key the Secret holds,
//! reloaded whenever the Secret changes (a rotation reaches every replica through its watch).
//! Until the Secret holds a certificate that loads, nothing listens and the replica is not
//! ready (so the webhook Service sends the API server only to replicas that serve).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use axum_server::tls_rustls::RustlsConfig;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DynamicObject};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::runtime::{WatchStreamExt, watcher};

use super::review;
use super::rotate::{CERT, KEY};
use crate::metrics::ResultLabels;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// What an admission needs. An admission has no side effect: anyone who can reach the port can
/// post a review, and gets only an answer.
pub(crate) struct Webhook {
    /// How to inject.
    pub injection: review::Injection,
    /// `arbiter_webhook_admissions_total`.
    pub admissions: Family<ResultLabels, Counter>,
}

/// Serves POST /inject on `address` once Secret `secret` holds a certificate; `pending` is
/// cleared from then on. Ends only with an error (the server or the watch stopped).
pub(crate) async fn serve(
    address: std::net::SocketAddr,
    secrets: Api<Secret>,
    secret: String,
    webhook: Arc<Webhook>,
    pending: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let app = Router::new()
        .route("/inject", post(admit))
        .with_state(webhook);
    let config = watcher::Config::default().fields(&format!("metadata.name={secret}"));
    let mut updates = watcher(secrets, config)
        .default_backoff()
        .applied_objects()
        .boxed();
    let mut next_pair = async || loop {
        match updates.next().await {
            Some(Ok(s)) => match pem_pair(&s) {
                Some(pair) => return Ok(pair),
                None => {
                    tracing::warn!(%secret, "the webhook Secret holds no tls.crt and tls.key yet")
                }
            },
            Some(Err(e)) => {
                tracing::warn!(error = %e, %secret, "watching the webhook Secret (retrying)")
            }
            None => anyhow::bail!("the watch of Secret {secret} ended"),
        }
    };
    let (tls, mut serving) = loop {
        let pair = next_pair().await?;
        match RustlsConfig::from_pem(pair.0.clone(), pair.1.clone()).await {
            Ok(tls) => break (tls, pair),
            Err(e) => {
                tracing::warn!(error = %e, %secret, "the webhook Secret's certificate does not load")
            }
        }
    };
    pending.store(false, Ordering::Relaxed);
    tracing::info!(%address, "serving the injection webhook");
    let server = axum_server::bind_rustls(address, tls.clone()).serve(app.into_make_service());
    tokio::pin!(server);
    loop {
        tokio::select! {
            r = &mut server => anyhow::bail!("the webhook server on {address} stopped: {r:?}"),
            pair = next_pair() => {
                let pair = pair?;
                if pair == serving {
                    continue;
                }
                match tls.reload_from_pem(pair.0.clone(), pair.1.clone()).await {
                    Ok(()) => {
                        tracing::info!(%secret, "serving the webhook's new certificate");
                        serving = pair;
                    }
                    Err(e) => tracing::warn!(error = %e, %secret, "the webhook Secret's new certificate does not load; serving the previous one"),
                }
            }
        }
    }
}

fn pem_pair(secret: &Secret) -> Option<(Vec<u8>, Vec<u8>)> {
    let data = secret.data.as_ref()?;
    Some((data.get(CERT)?.0.clone(), data.get(KEY)?.0.clone()))
}

/// One admission review: the injection's answer.
async fn admit(
    State(webhook): State<Arc<Webhook>>,
    body: axum::body::Bytes,
) -> Json<AdmissionReview<DynamicObject>> {
    let request: AdmissionRequest<Pod> = match serde_json::from_slice::<AdmissionReview<Pod>>(&body)
        .map_err(|e| e.to_string())
        .and_then(|r| {
            r.try_into()
                .map_err(|e: kube::core::admission::ConvertAdmissionReviewError| e.to_string())
        }) {
        Ok(r) => r,
        Err(e) => return Json(AdmissionResponse::invalid(format!("arbiter: {e}")).into_review()),
    };
    let response = review::review(&request, &webhook.injection);
    let namespace = request.namespace.clone().unwrap_or_default();
    let pod = request
        .object
        .as_ref()
        .map(|p| {
            p.metadata
                .generate_name
                .clone()
                .or(p.metadata.name.clone())
                .unwrap_or_default()
        })
        .unwrap_or_default();
    let result = match (response.allowed, response.patch.is_some()) {
        (true, true) => "injected",
        (true, false) => "unchanged",
        (false, _) => "refused",
    };
    webhook
        .admissions
        .get_or_create(&ResultLabels {
            result: result.into(),
        })
        .inc();
    if response.allowed {
        tracing::info!(%namespace, %pod, injected = response.patch.is_some(), "admitted a pod");
    } else {
        tracing::info!(%namespace, %pod, reason = %response.result.message, "refused a pod");
    }
    Json(response.into_review())
}
