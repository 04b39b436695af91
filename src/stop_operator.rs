//! `arbiter stop-operator`: scales the operator's Deployment to zero and waits until its pods
//! are gone. The chart runs it as a `pre-delete` hook: `helm uninstall` deletes the operator's
//! ServiceAccount and RBAC together with its Deployment, so a replica told to stop then could
//! no longer release its HA Lease, and a reinstall waited a full lease duration for it. Stopped
//! first, the acting replica releases the Lease on SIGTERM (while it still may), and the next
//! install acts at once.
//!
//! It never holds an uninstall up: whatever happens (the Deployment is gone already, the wait
//! runs out), it says so and exits 0.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};

/// `arbiter stop-operator` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct Settings {
    /// The operator's Deployment.
    #[arg(long)]
    pub deployment: String,
    /// Its namespace (default: POD_NAMESPACE, else the kubeconfig context's).
    #[arg(short, long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// How long to wait for its pods to be gone (then it exits 0 all the same).
    #[arg(long, default_value = "60s", value_parser = crate::flags::positive_duration)]
    pub timeout: Duration,
}

/// How often the pods are listed while waiting.
const POLL: Duration = Duration::from_millis(500);

pub async fn run(settings: Settings) -> anyhow::Result<i32> {
    let client = match crate::client::connect().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("warning: {e:#}; not stopping the operator");
            return Ok(0);
        }
    };
    let ns = (settings.namespace.clone()).unwrap_or_else(|| client.default_namespace().to_string());
    let name = &settings.deployment;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let deployment = match deployments.get_opt(name).await {
        Ok(Some(d)) => d,
        Ok(None) => {
            eprintln!("deployment {ns}/{name} is gone already: nothing to stop");
            return Ok(0);
        }
        Err(e) => {
            eprintln!("warning: reading deployment {ns}/{name}: {e}; not stopping it");
            return Ok(0);
        }
    };
    let selector = deployment
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.as_ref())
        .map(|labels| {
            (labels.iter())
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    let scale = serde_json::json!({"spec": {"replicas": 0}});
    if let Err(e) = deployments
        .patch_scale(name, &PatchParams::default(), &Patch::Merge(&scale))
        .await
    {
        eprintln!("warning: scaling deployment {ns}/{name} to 0: {e}; not waiting");
        return Ok(0);
    }
    eprintln!("scaled deployment {ns}/{name} to 0; waiting for its pods to stop");
    if selector.is_empty() {
        eprintln!("warning: deployment {ns}/{name} selects its pods by no label: not waiting");
        return Ok(0);
    }
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let until = Instant::now() + settings.timeout;
    loop {
        match pods.list(&ListParams::default().labels(&selector)).await {
            Ok(list) if list.items.is_empty() => {
                eprintln!("the operator's pods are gone");
                return Ok(0);
            }
            Ok(list) if Instant::now() >= until => {
                eprintln!(
                    "warning: {} of the operator's pods still there after {:?}; going on",
                    list.items.len(),
                    settings.timeout
                );
                return Ok(0);
            }
            Err(e) if Instant::now() >= until => {
                eprintln!("warning: listing the operator's pods: {e}; going on");
                return Ok(0);
            }
            _ => tokio::time::sleep(POLL).await,
        }
    }
}
