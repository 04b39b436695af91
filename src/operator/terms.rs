//! The term high-water mark, so a term never goes backwards even if a Lease is deleted.
//!
//! Before the arbiter writes a Lease with term N it records N in the ConfigMap
//! `arbiter-terms` of the lease's namespace (key: the lease name), by compare-and-swap. If the
//! Lease write then fails, N is simply skipped: terms stay strictly increasing, gaps allowed.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};

pub const TERMS_CONFIGMAP: &str = "arbiter-terms";

/// Reserves the next term for `lease`: greater than both the recorded mark and `current`.
pub async fn reserve(
    client: Client,
    namespace: &str,
    lease: &str,
    current: i32,
) -> Result<i32, kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client, namespace);
    match api.get_opt(TERMS_CONFIGMAP).await? {
        None => {
            let next = current + 1;
            let mut cm = ConfigMap::default();
            cm.metadata.name = Some(TERMS_CONFIGMAP.into());
            cm.metadata.labels = Some(BTreeMap::from([(
                crate::lease::MANAGED_LABEL.into(),
                "true".into(),
            )]));
            cm.data = Some(BTreeMap::from([(lease.to_string(), next.to_string())]));
            api.create(&PostParams::default(), &cm).await?;
            Ok(next)
        }
        Some(mut cm) => {
            let recorded = cm
                .data
                .as_ref()
                .and_then(|d| d.get(lease))
                .and_then(|v| v.parse::<i32>().ok())
                .unwrap_or(0);
            let next = recorded.max(current) + 1;
            cm.data
                .get_or_insert_with(BTreeMap::new)
                .insert(lease.to_string(), next.to_string());
            // `cm` carries the resourceVersion it was read at: a concurrent writer gets 409.
            api.replace(&cm.name_any(), &PostParams::default(), &cm)
                .await?;
            Ok(next)
        }
    }
}
