//! Managed certificates (`--webhook-certs managed`): the acting replica keeps a valid CA and
//! serving certificate in the webhook's Secret, and the webhook configuration's `caBundle`
//! trusting it.
//!
//! A CA leaves the `caBundle` only when it expires: what any replica serves stays trusted,
//! whichever replica put its CA there.
//!
//! A rotation puts the new CA into the `caBundle` (beside the current one) before it writes the
//! new certificate into the Secret, so that whichever certificate a replica serves while it
//! reloads, the API server trusts it. The CA it replaced stays in the bundle until it expires.
//! A crash between the two steps leaves a CA in the bundle that nothing serves (until it
//! expires); the next look issues again. The Secret is written with a compare-and-swap
//! on its resourceVersion, so two replicas that both believed they act cannot interleave
//! halves of two rotations.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};

use super::Settings;
use super::certs;

/// The Secret's keys (cert-manager's, plus the CA a rotation replaced).
pub(crate) const CERT: &str = "tls.crt";
pub(crate) const KEY: &str = "tls.key";
pub(crate) const CA: &str = "ca.crt";
const PREVIOUS_CA: &str = "ca-previous.crt";

/// How often the acting replica looks at the Secret and the `caBundle`.
const LOOK_EVERY: Duration = Duration::from_secs(20);

/// What the Secret holds, as far as a rotation cares.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Held {
    ca: String,
    previous: Option<String>,
    not_before: Timestamp,
    not_after: Timestamp,
}

/// The certificate in `secret`, if it holds a whole one for `name` (the name the API server
/// dials): a certificate for it whose dates parse, its key, and the CA that signed it.
pub(crate) fn held(secret: &Secret, name: &str) -> Option<Held> {
    let data = secret.data.as_ref()?;
    let text = |k: &str| {
        data.get(k)
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
    };
    let (cert, key, ca) = (text(CERT)?, text(KEY)?, text(CA)?);
    if !certs::whole(&cert, &key, &ca, name) {
        return None;
    }
    let (not_before, not_after) = certs::validity(&cert)?;
    Some(Held {
        ca,
        previous: text(PREVIOUS_CA),
        not_before,
        not_after,
    })
}

/// What to do at `now`.
#[derive(Debug, PartialEq)]
pub(crate) enum Plan {
    /// The certificate is good: the `caBundle` must be this.
    Keep { bundle: String },
    /// Issue a new one; `previous` is the CA to keep trusting meanwhile.
    Issue { previous: Option<String> },
}

pub(crate) fn plan(held: Option<&Held>, now: Timestamp) -> Plan {
    let Some(h) = held else {
        return Plan::Issue { previous: None };
    };
    let lifetime = Duration::try_from(h.not_after.duration_since(h.not_before))
        .unwrap_or_default()
        .saturating_sub(certs::BACKDATE);
    if h.not_before > now || certs::due(h.not_after, lifetime, now) {
        // Not yet valid (issued on a clock more than the backdate ahead of ours) or nearly
        // over: a new one.
        return Plan::Issue {
            previous: Some(h.ca.clone()).filter(|_| h.not_after > now),
        };
    }
    let previous = h
        .previous
        .as_deref()
        .filter(|p| certs::validity(p).is_some_and(|(_, until)| until > now));
    Plan::Keep {
        bundle: certs::ca_bundle(&h.ca, previous),
    }
}

/// Keeps the certificate and the `caBundle` current while the replica acts: never returns.
/// Failures are logged and retried at the next look.
pub(crate) async fn maintain(client: Client, namespace: String, settings: Settings) {
    // A certificate issued but not yet in the Secret: reused until it is, so that a Secret write
    // that keeps failing does not add a CA to the bundle at every look.
    let mut pending: Option<certs::Issued> = None;
    loop {
        if let Err(e) = look(&client, &namespace, &settings, &mut pending).await {
            tracing::warn!(error = %e, secret = %settings.webhook_secret, "keeping the webhook certificate current failed (retrying)");
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
}

async fn look(
    client: &Client,
    namespace: &str,
    settings: &Settings,
    pending: &mut Option<certs::Issued>,
) -> anyhow::Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let current = secrets.get_opt(&settings.webhook_secret).await?;
    let now = Timestamp::now();
    let name = format!("{}.{namespace}.svc", settings.webhook_service);
    let held = current.as_ref().and_then(|s| held(s, &name));
    match plan(held.as_ref(), now) {
        // Whatever the bundle trusts now and is still valid stays trusted, whoever put it there:
        // a replica that believed it acts may have just added a CA it is about to serve.
        Plan::Keep { bundle } => {
            set_bundle(client, &settings.webhook_configuration, &bundle, now).await
        }
        Plan::Issue { previous } => {
            let lifetime = settings.webhook_cert_validity;
            let issued = match pending.take() {
                Some(p) if !certs::due(p.not_after, lifetime, now) => p,
                _ => certs::issue(&settings.webhook_service, namespace, now, lifetime)?,
            };
            *pending = Some(issued.clone());
            let bundle = certs::ca_bundle(&issued.ca_pem, previous.as_deref());
            // Whatever the bundle trusts now and is still valid stays trusted too: the Secret
            // may have been deleted while the replicas still serve what it held.
            set_bundle(client, &settings.webhook_configuration, &bundle, now).await?;
            let data = [
                (CERT, Some(issued.cert_pem)),
                (KEY, Some(issued.key_pem)),
                (CA, Some(issued.ca_pem)),
                (PREVIOUS_CA, previous),
            ]
            .into_iter()
            .filter_map(|(k, v)| Some((k.to_string(), ByteString(v?.into_bytes()))))
            .collect::<BTreeMap<_, _>>();
            let mut secret = current.unwrap_or_else(|| Secret {
                type_: Some("kubernetes.io/tls".into()),
                ..Secret::default()
            });
            secret.metadata.name = Some(settings.webhook_secret.clone());
            secret
                .labels_mut()
                .insert("app.kubernetes.io/managed-by".into(), "arbiter".into());
            secret.data = Some(data);
            // The resourceVersion read above makes this a compare-and-swap.
            if secret.metadata.resource_version.is_some() {
                secrets
                    .replace(&settings.webhook_secret, &PostParams::default(), &secret)
                    .await?;
            } else {
                secrets.create(&PostParams::default(), &secret).await?;
            }
            *pending = None;
            tracing::info!(secret = %settings.webhook_secret, until = %issued.not_after, "issued the webhook's certificate");
            Ok(())
        }
    }
}

/// Sets the `caBundle` of every webhook in configuration `name` to `bundle` and the
/// certificates it holds already that are still valid at `now`, where that differs. A CA leaves
/// the bundle only when it expires.
async fn set_bundle(
    client: &Client,
    name: &str,
    bundle: &str,
    now: Timestamp,
) -> anyhow::Result<()> {
    let configs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let Some(config) = configs.get_opt(name).await? else {
        // Nothing calls the webhook then; the certificate is still kept, for when it exists.
        tracing::warn!(configuration = %name, "the MutatingWebhookConfiguration does not exist (--webhook-configuration): no caBundle to keep");
        return Ok(());
    };
    let ops: Vec<_> = config
        .webhooks
        .iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, w)| {
            let current = w
                .client_config
                .ca_bundle
                .as_ref()
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                .unwrap_or_default();
            let mut wanted = bundle.to_string();
            for kept in certs::still_valid(&current, now) {
                if !wanted.contains(kept.trim()) {
                    wanted.push_str(&kept);
                }
            }
            (current != wanted).then(|| {
                serde_json::json!({
                    "op": "add",
                    "path": format!("/webhooks/{i}/clientConfig/caBundle"),
                    "value": ByteString(wanted.into_bytes()),
                })
            })
        })
        .collect();
    if ops.is_empty() {
        return Ok(());
    }
    // The list is indexed: the patch applies only to the configuration as read.
    let mut ops = ops;
    ops.insert(
        0,
        serde_json::json!({"op": "test", "path": "/metadata/resourceVersion", "value": config.resource_version()}),
    );
    let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops))?;
    configs
        .patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await?;
    tracing::info!(configuration = %name, "set the webhook's caBundle");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    fn secret(issued: &certs::Issued, previous: Option<&str>) -> Secret {
        let mut data = BTreeMap::from([
            (
                CERT.to_string(),
                ByteString(issued.cert_pem.clone().into_bytes()),
            ),
            (
                KEY.to_string(),
                ByteString(issued.key_pem.clone().into_bytes()),
            ),
            (
                CA.to_string(),
                ByteString(issued.ca_pem.clone().into_bytes()),
            ),
        ]);
        if let Some(p) = previous {
            data.insert(PREVIOUS_CA.into(), ByteString(p.as_bytes().to_vec()));
        }
        Secret {
            data: Some(data),
            ..Secret::default()
        }
    }

    #[test]
    fn a_certificate_is_issued_when_none_is_whole_and_replaced_when_due() {
        let t0 = Timestamp::from_second(1_800_000_000).unwrap();
        let at = |days: i64| t0 + jiff::SignedDuration::from_hours(24 * days);
        assert_eq!(plan(None, t0), Plan::Issue { previous: None });
        let old = certs::issue("s", "ns", t0, 30 * DAY).unwrap();
        let mut partial = secret(&old, None);
        partial.data.as_mut().unwrap().remove(KEY);
        assert_eq!(held(&partial, "s.ns.svc"), None, "no key");

        let h = held(&secret(&old, None), "s.ns.svc").unwrap();
        assert_eq!(
            plan(Some(&h), at(1)),
            Plan::Keep {
                bundle: old.ca_pem.clone()
            }
        );
        assert_eq!(
            plan(Some(&h), at(21)),
            Plan::Issue {
                previous: Some(old.ca_pem.clone())
            },
            "less than a third left: the CA in use stays trusted during the rotation"
        );
        assert_eq!(
            plan(Some(&h), at(31)),
            Plan::Issue { previous: None },
            "expired: nothing serves it any more"
        );
        assert_eq!(
            plan(Some(&h), t0 - jiff::SignedDuration::from_hours(2)),
            Plan::Issue {
                previous: Some(old.ca_pem.clone())
            },
            "issued on a clock ahead of ours: not valid yet"
        );
    }

    #[test]
    fn after_a_rotation_the_bundle_trusts_the_replaced_ca_until_it_expires() {
        let t0 = Timestamp::from_second(1_800_000_000).unwrap();
        let at = |days: i64| t0 + jiff::SignedDuration::from_hours(24 * days);
        let old = certs::issue("s", "ns", t0, 30 * DAY).unwrap();
        let new = certs::issue("s", "ns", at(21), 30 * DAY).unwrap();
        let h = held(&secret(&new, Some(&old.ca_pem)), "s.ns.svc").unwrap();
        assert_eq!(
            plan(Some(&h), at(22)),
            Plan::Keep {
                bundle: format!("{}{}", new.ca_pem, old.ca_pem)
            }
        );
        assert_eq!(
            plan(Some(&h), at(31)),
            Plan::Keep {
                bundle: new.ca_pem.clone()
            }
        );
    }
}
