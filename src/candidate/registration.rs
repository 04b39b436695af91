//! The candidate's LeaseCandidate: created on start, kept fresh, pings answered, deleted on a
//! clean exit.

use std::time::Duration;

use anyhow::Context;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::Config;
use crate::api::{
    LEASE_DURATION_ANNOTATION, LeaseCandidate, LeaseCandidateSpec, OVERRAN_ANNOTATION,
    WITHDRAWN_ANNOTATION,
};
use crate::lease::INCARNATION_ANNOTATION;

/// How often the candidate refreshes `renewTime` on its own (it also answers every ping).
const REFRESH: Duration = Duration::from_secs(30);

/// Creates the LeaseCandidate, or updates the one a previous process of this identity left.
///
/// While the API server cannot be reached (connection refused or reset, a timeout, 5xx, 429),
/// it retries with backoff ([`crate::client::reconnect_backoff`]: 0.5 s doubling to 2 s, each jittered up to twice itself)
/// and logs each attempt; anything the API server refuses outright (no CRD, no RBAC, an invalid
/// candidate, a changed leaseName) fails at once.
pub async fn register(client: &Client, config: &Config, incarnation: &str) -> anyhow::Result<()> {
    let mut backoff = crate::client::reconnect_backoff();
    let mut attempt = 1u32;
    loop {
        let e = match try_register(client, config, incarnation).await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        let transient = e
            .chain()
            .any(|c| c.downcast_ref::<kube::Error>().is_some_and(is_transient));
        if !transient {
            return Err(e);
        }
        let wait = backoff.next().unwrap_or(crate::client::RECONNECT_AT_MOST);
        tracing::warn!(
            attempt,
            retry_in = ?wait,
            error = %format!("{e:#}"),
            "cannot register the candidate yet: the API server is unreachable; retrying"
        );
        tokio::time::sleep(wait).await;
        attempt += 1;
    }
}

/// An error worth retrying: the API server did not answer, or answered "not now".
fn is_transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code >= 500 || s.code == 429,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

async fn try_register(client: &Client, config: &Config, incarnation: &str) -> anyhow::Result<()> {
    let api: Api<LeaseCandidate> = Api::namespaced(client.clone(), &config.namespace);
    let declared = config.timings.lease_duration.as_secs().to_string();
    // Twice at most: a create that loses a race with another writer becomes an update.
    for _ in 0..2 {
        let renew_time = Some(MicroTime(jiff::Timestamp::now()));
        let existing = api.get_opt(&config.identity).await.map_err(|e| match &e {
            kube::Error::Api(s) if s.code == 404 => anyhow::anyhow!(
                "the LeaseCandidate API (arbiter.dev/v1alpha1) is not served: is arbiter's CRD installed? ({e})"
            ),
            _ => {
                let what = format!("reading LeaseCandidate {}/{}", config.namespace, config.identity);
                anyhow::Error::new(e).context(what)
            }
        })?;
        match existing {
            Some(existing) if existing.spec.lease_name != config.lease => anyhow::bail!(
                "LeaseCandidate {}/{} already exists for lease {:?}, and leaseName is immutable: delete it, or run with another identity",
                config.namespace,
                config.identity,
                existing.spec.lease_name
            ),
            Some(_) => {
                // A new process: an overrun reported by an earlier one is history (its Event
                // and metric remain). It may run in a new pod of the same name (a StatefulSet's
                // replacement): the candidate goes with this pod from now on.
                let owners = owner_references(config);
                let mut patch = json!({
                    "metadata": { "annotations": {
                        INCARNATION_ANNOTATION: incarnation,
                        OVERRAN_ANNOTATION: null,
                        WITHDRAWN_ANNOTATION: null,
                        LEASE_DURATION_ANNOTATION: declared,
                    } },
                    "spec": {
                        "binaryVersion": config.binary_version,
                        "emulationVersion": config.emulation_version,
                        "strategy": config.strategy,
                        "renewTime": renew_time,
                    },
                });
                if let Some(owners) = owners {
                    patch["metadata"]["ownerReferences"] = json!(owners);
                }
                api.patch(
                    &config.identity,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
            }
            None => {
                let spec = LeaseCandidateSpec {
                    lease_name: config.lease.clone(),
                    binary_version: config.binary_version.clone(),
                    emulation_version: config.emulation_version.clone(),
                    strategy: config.strategy.clone(),
                    ping_time: None,
                    renew_time,
                };
                let mut candidate = LeaseCandidate::new(&config.identity, spec);
                candidate.metadata.annotations = Some(
                    [
                        (INCARNATION_ANNOTATION.to_string(), incarnation.to_string()),
                        (LEASE_DURATION_ANNOTATION.to_string(), declared.clone()),
                    ]
                    .into(),
                );
                candidate.metadata.owner_references = owner_references(config);
                match api.create(&PostParams::default(), &candidate).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 409 => continue,
                    Err(kube::Error::Api(s)) if s.code == 422 => {
                        anyhow::bail!("the API server refused the candidate: {}", s.message)
                    }
                    Err(e) => {
                        return Err(anyhow::Error::new(e).context(format!(
                            "creating LeaseCandidate {}/{}",
                            config.namespace, config.identity
                        )));
                    }
                }
            }
        }
        tracing::info!(candidate = %config.identity, lease = %config.lease, "registered as a candidate");
        return Ok(());
    }
    anyhow::bail!(
        "LeaseCandidate {}/{} keeps changing under us",
        config.namespace,
        config.identity
    )
}

/// Answers pings and refreshes `renewTime`, forever. Returns only on error.
pub async fn keep_fresh(client: Client, config: Config, incarnation: String) -> anyhow::Error {
    let api: Api<LeaseCandidate> = Api::namespaced(client, &config.namespace);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={}", config.identity));
    let mut events = watcher(api.clone(), cfg)
        .backoff(crate::client::reconnect_backoff())
        .applied_objects()
        .boxed();
    let mut refresh = tokio::time::interval(REFRESH);
    refresh.tick().await;
    loop {
        let renew = tokio::select! {
            ev = events.next() => match ev {
                None => return anyhow::anyhow!("the watch on the candidate ended"),
                Some(Err(e)) => { tracing::debug!(error = %e, "candidate watch error (retrying)"); continue }
                // Answer a ping with renewTime >= pingTime, whatever this machine's clock says.
                Some(Ok(c)) => match (&c.spec.ping_time, &c.spec.renew_time) {
                    (Some(ping), renew) if renew.as_ref().is_none_or(|r| r.0 < ping.0) => {
                        tracing::debug!(candidate = %c.name_any(), "answering ping");
                        ping.0.max(jiff::Timestamp::now())
                    }
                    _ => continue,
                },
            },
            _ = refresh.tick() => jiff::Timestamp::now(),
        };
        let patch = json!({
            "metadata": { "annotations": { INCARNATION_ANNOTATION: incarnation } },
            "spec": { "renewTime": MicroTime(renew) },
        });
        if let Err(e) = api
            .patch(
                &config.identity,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            match &e {
                kube::Error::Api(s) if s.code == 404 => {
                    return anyhow::anyhow!("LeaseCandidate {} was deleted", config.identity);
                }
                _ => tracing::warn!(error = %e, "refreshing the candidate failed (retrying)"),
            }
        }
    }
}

/// Withdraws the candidate: deletes it, or, with `keep`, marks it withdrawn by `incarnation`
/// (and records `overran`, see [`crate::api::OVERRAN_ANNOTATION`]).
pub async fn withdraw(
    client: &Client,
    config: &Config,
    incarnation: &str,
    keep: bool,
    overran: Option<i32>,
) -> anyhow::Result<()> {
    let api: Api<LeaseCandidate> = Api::namespaced(client.clone(), &config.namespace);
    if !keep {
        return match api.delete(&config.identity, &DeleteParams::default()).await {
            Ok(_) => {
                tracing::info!(candidate = %config.identity, "withdrew the candidate");
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(anyhow::Error::new(e).context("deleting the candidate")),
        };
    }
    let patch = json!({ "metadata": { "annotations": {
        OVERRAN_ANNOTATION: overran.map(|t| t.to_string()),
        WITHDRAWN_ANNOTATION: incarnation,
    } } });
    // Written as arbiter's field manager: the operator counts only such a mark (a hand edit
    // must not pass for a withdrawal).
    let pp = PatchParams {
        field_manager: Some(crate::lease::FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    api.patch(&config.identity, &pp, &Patch::Merge(&patch))
        .await
        .context("marking the candidate withdrawn")?;
    tracing::info!(candidate = %config.identity, ?overran, "withdrew the candidate (kept, marked withdrawn: the term's work stopped)");
    Ok(())
}

/// The candidate's owner: the pod it runs in, when known.
fn owner_references(config: &Config) -> Option<Vec<OwnerReference>> {
    let (Some(pod), Some(uid)) = (&config.pod_name, &config.pod_uid) else {
        return None;
    };
    Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod.clone(),
        uid: uid.clone(),
        ..OwnerReference::default()
    }])
}
