//! The injection webhook: a mutating admission webhook that wraps the command of pods labelled
//! `arbiter.dev/inject: "true"` in the agent ([`crate::workloads::inject`]).
//!
//! - [`serve`]: every replica serves it over HTTPS, leader or not (an admission needs no
//!   election), with the certificate in a Secret, reloaded when the Secret changes;
//! - [`review`]: the answer to one admission review;
//! - [`binding`]: the Role and RoleBinding that give an injected pod's ServiceAccount the
//!   agent's rights (for its own leases only), made by the acting replica for the injected pods
//!   it sees, and removed once no injected pod uses them;
//! - [`certs`] and [`rotate`]: without cert-manager, the acting replica issues the webhook's CA
//!   and serving certificate into the Secret, rotates them before they expire, and keeps the
//!   webhook configuration's `caBundle` trusting what every replica serves.

pub mod binding;
pub mod certs;
pub mod review;
pub(crate) mod rotate;
pub(crate) mod serve;

use std::net::SocketAddr;
use std::time::Duration;

/// Who issues the webhook's certificate.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Certs {
    /// The acting operator replica: its own CA, rotated before expiry, and the `caBundle` of
    /// --webhook-configuration kept current.
    Managed,
    /// Someone else writes the Secret (`tls.crt`, `tls.key`) and the `caBundle`, e.g.
    /// cert-manager and its CA injector.
    External,
}

/// The webhook's flags (`arbiter operator --webhook-...`, `--inject-...`).
#[derive(clap::Args, Debug, Clone)]
#[group(id = "webhook")]
pub struct Settings {
    /// Serve the injection webhook (HTTPS, POST /inject) on this address, on every replica
    /// (off when unset; needs --inject-image).
    #[arg(long)]
    pub webhook_address: Option<SocketAddr>,
    /// The Secret in the operator's namespace that holds the webhook's certificate (`tls.crt`,
    /// `tls.key`, `ca.crt`); every replica serves what it holds.
    #[arg(long, default_value = "arbiter-webhook-tls")]
    pub webhook_secret: String,
    /// Who issues that certificate.
    #[arg(long, value_enum, default_value = "managed")]
    pub webhook_certs: Certs,
    /// The Service in front of the webhook: a managed certificate is issued for its names.
    #[arg(long, default_value = "arbiter-webhook")]
    pub webhook_service: String,
    /// The MutatingWebhookConfiguration whose `caBundle` a managed certificate's CA is kept in.
    #[arg(long, default_value = "arbiter-inject")]
    pub webhook_configuration: String,
    /// How long a managed certificate is valid (at least 1m); it is replaced once less than a
    /// third of that is left.
    #[arg(long, default_value = "90days", value_parser = cert_validity)]
    pub webhook_cert_validity: Duration,
    /// The arbiter image whose binary the injected init container copies into the pod (the
    /// operator's own image).
    #[arg(long, env = "ARBITER_IMAGE")]
    pub inject_image: Option<String>,
    /// The injected init container's imagePullPolicy (Always, IfNotPresent, Never; default:
    /// the cluster's, which is IfNotPresent for a tagged image).
    #[arg(long, value_parser = ["Always", "IfNotPresent", "Never"])]
    pub inject_image_pull_policy: Option<String>,
    /// Give each ServiceAccount injected pods run as an agent's rights in its namespace: a Role
    /// and RoleBinding `arbiter-agent-SA` (with `--instance`: `arbiter-agent:INSTANCE:SA`),
    /// made by the acting replica, whose Lease updates are limited to the leases those pods run
    /// for (without it, the ServiceAccount must have those rights already).
    #[arg(long)]
    pub inject_agent_rbac: bool,
    /// With the webhook on: a pod labelled arbiter.dev/inject that runs its command without the
    /// agent (created while no webhook configuration was installed) holds its lease's election
    /// (nobody new is given the lease while one runs), and the acting replica evicts such pods
    /// one at a time per lease so that their owners create them again through the webhook; the
    /// last one only once a wrapped candidate can take over. A pod with no controller is only
    /// reported. `false`: they are only reported, and run beside the holder.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub inject_evict_unwrapped: bool,
}

impl Settings {
    /// Whether this install holds elections for, and evicts, pods that run unwrapped.
    pub(crate) fn enforces_injection(&self) -> bool {
        self.webhook_address.is_some() && self.inject_evict_unwrapped
    }
}

impl Settings {
    pub(crate) fn validate(&self) -> anyhow::Result<()> {
        if self.webhook_address.is_some() && self.inject_image.as_deref().unwrap_or("").is_empty() {
            arbiter_candidate::usage!(
                "--webhook-address needs --inject-image (or ARBITER_IMAGE): the image whose binary the injected init container copies"
            );
        }
        Ok(())
    }
}

fn cert_validity(s: &str) -> Result<Duration, String> {
    let d = arbiter_candidate::flags::positive_duration(s)?;
    if d < Duration::from_secs(60) {
        return Err(format!(
            "{s} is too short: at least 1m (a certificate is valid from an hour before it is issued, for clocks that differ)"
        ));
    }
    Ok(d)
}

/// Starts serving the webhook if `--webhook-address` is set: the future ends only with an error.
/// If the Secret exists, `pending` is set until its certificate loads (the replica is not ready
/// meanwhile). If it does not, the replica is ready at once: the acting replica issues the
/// first certificate, and during an upgrade from a release without the webhook, the replica that
/// acts is an old one, which only goes once a new one is ready.
pub(crate) async fn start(
    settings: &Settings,
    client: &kube::Client,
    namespace: &str,
    only: Vec<String>,
    instance: Option<String>,
    metrics: &crate::metrics::Metrics,
) -> anyhow::Result<Option<impl std::future::Future<Output = anyhow::Result<()>> + use<>>> {
    let Some(address) = settings.webhook_address else {
        return Ok(None);
    };
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client.clone(), namespace);
    let secret = settings.webhook_secret.clone();
    let exists = !matches!(secrets.get_opt(&secret).await, Ok(None));
    let pending = metrics.webhook_pending.clone();
    pending.store(exists, std::sync::atomic::Ordering::Relaxed);
    let webhook = std::sync::Arc::new(serve::Webhook {
        injection: review::Injection {
            image: settings.inject_image.clone().unwrap_or_default(),
            pull_policy: settings.inject_image_pull_policy.clone(),
            only,
            instance,
        },
        admissions: metrics.webhook_admissions.clone(),
    });
    Ok(Some(serve::serve(
        address, secrets, secret, webhook, pending,
    )))
}

/// What the acting replica keeps up for the webhook (the managed certificate, the agents'
/// RoleBindings): returns only if a watch it needs ended; pending when there is nothing to
/// keep.
pub(crate) async fn upkeep(
    settings: &Settings,
    client: kube::Client,
    namespace: String,
    scopes: Vec<Option<String>>,
    instance: Option<String>,
    arbitrated: crate::cache::namespaces::Arbitrated,
    reporter: kube::runtime::events::Reporter,
) {
    if settings.webhook_address.is_none() {
        return std::future::pending().await;
    }
    let certs = async {
        match settings.webhook_certs {
            Certs::Managed => rotate::maintain(client.clone(), namespace, settings.clone()).await,
            Certs::External => std::future::pending().await,
        }
    };
    let bindings = async {
        if settings.inject_agent_rbac {
            // One per namespace watched (or one for all): each keeps its namespaces' rights.
            let keeps = scopes.into_iter().map(|scope| {
                let keep = binding::keep(
                    client.clone(),
                    scope,
                    instance.clone(),
                    arbitrated.clone(),
                    reporter.clone(),
                );
                Box::pin(keep)
            });
            futures::future::select_all(keeps).await;
        } else {
            std::future::pending().await
        }
    };
    // Each runs for ever: one that ends (a watch that stopped) ends the replica's acting.
    tokio::select! {
        () = certs => {}
        () = bindings => {}
    }
}
