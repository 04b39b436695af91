//! The injection webhook's own certificate authority and serving certificate, for installs
//! without cert-manager: a CA whose certificate goes in the webhook configuration's `caBundle`,
//! and a serving certificate for the webhook Service's DNS names, signed by it. Pure but for
//! the randomness of new keys: given the time, it makes certificates and says when to replace
//! them; the operator keeps them in a Secret (so every replica serves the same one) and keeps
//! the `caBundle` current.
//!
//! The certificates themselves are rcgen's (a well-kept crate for X.509); what is decided here
//! is only which names, how long, and when to rotate.

use std::time::Duration;

use jiff::Timestamp;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A CA and a serving certificate it signed, PEM-encoded.
#[derive(Clone, Debug)]
pub struct Issued {
    pub ca_pem: String,
    pub ca_key_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    /// When both stop being valid.
    pub not_after: Timestamp,
}

/// The names a client of Service `service` in `namespace` may use: what the API server dials is
/// `service.namespace.svc`.
pub fn names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        service.to_string(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

/// How long before its issue a certificate is valid from: the API server's clock may be behind
/// the issuing replica's.
pub const BACKDATE: Duration = Duration::from_secs(3600);

/// A new CA and serving certificate for `service` in `namespace`, valid from [`BACKDATE`]
/// before `now` (clocks differ) until `valid_for` after it.
pub fn issue(
    service: &str,
    namespace: &str,
    now: Timestamp,
    valid_for: Duration,
) -> Result<Issued, rcgen::Error> {
    let not_after = now + jiff::SignedDuration::try_from(valid_for).unwrap_or_default();
    let from = offset(now - jiff::SignedDuration::try_from(BACKDATE).unwrap_or_default());
    let until = offset(not_after);

    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name.push(
        DnType::CommonName,
        format!("arbiter webhook CA ({namespace})"),
    );
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.not_before = from;
    ca.not_after = until;
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let mut leaf = CertificateParams::new(names(service, namespace))?;
    leaf.distinguished_name
        .push(DnType::CommonName, format!("{service}.{namespace}.svc"));
    leaf.use_authority_key_identifier_extension = true;
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.not_before = from;
    leaf.not_after = until;
    let key = KeyPair::generate()?;
    let cert = leaf.signed_by(&key, &issuer)?;
    Ok(Issued {
        ca_pem: ca_cert.pem(),
        ca_key_pem: issuer.key().serialize_pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        not_after,
    })
}

/// Whether certificates valid until `not_after`, issued for `valid_for`, must be replaced at
/// `now`: once less than a third of their validity is left (and at once when expired).
pub fn due(not_after: Timestamp, valid_for: Duration, now: Timestamp) -> bool {
    let left = not_after.duration_since(now);
    left < jiff::SignedDuration::try_from(valid_for / 3).unwrap_or_default()
}

/// The `caBundle` that trusts the current CA and, while a rotation is under way, the one it
/// replaces (a replica may still serve a certificate of the previous CA).
pub fn ca_bundle(current: &str, previous: Option<&str>) -> String {
    match previous {
        Some(previous) if previous != current => format!("{current}{previous}"),
        _ => current.to_string(),
    }
}

/// When a PEM certificate starts and stops being valid, or `None` when it is not one.
pub fn validity(cert_pem: &str) -> Option<(Timestamp, Timestamp)> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()).ok()?;
    let cert = pem.parse_x509().ok()?;
    let v = cert.validity();
    Some((
        Timestamp::from_second(v.not_before.timestamp()).ok()?,
        Timestamp::from_second(v.not_after.timestamp()).ok()?,
    ))
}

/// Whether `cert_pem` is a certificate for `name`, whose key is `key_pem`, signed by the CA in
/// `ca_pem`: what a Secret edited by hand may no longer be.
pub fn whole(cert_pem: &str, key_pem: &str, ca_pem: &str, name: &str) -> bool {
    use x509_parser::extensions::GeneralName;
    let (Ok((_, cert)), Ok((_, ca))) = (
        x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()),
        x509_parser::pem::parse_x509_pem(ca_pem.as_bytes()),
    ) else {
        return false;
    };
    let (Ok(cert), Ok(ca)) = (cert.parse_x509(), ca.parse_x509()) else {
        return false;
    };
    let Ok(key) = KeyPair::from_pem(key_pem) else {
        return false;
    };
    let key_matches = cert.public_key().subject_public_key.data.as_ref() == key.public_key_raw();
    let signed = cert.verify_signature(Some(ca.public_key())).is_ok();
    let named = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .is_some_and(|san| {
            san.value
                .general_names
                .iter()
                .any(|n| matches!(n, GeneralName::DNSName(d) if *d == name))
        });
    key_matches && signed && named
}

/// The certificates of a PEM bundle that are still valid at `now`.
pub fn still_valid(bundle: &str, now: Timestamp) -> Vec<String> {
    const END: &str = "-----END CERTIFICATE-----";
    bundle
        .split_inclusive(END)
        .map(|c| format!("{}\n", c.trim_start()))
        .filter(|c| validity(c).is_some_and(|(_, until)| until > now))
        .collect()
}

fn offset(t: Timestamp) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(t.as_second())
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    /// A TLS handshake in memory: a client that trusts `bundle` dials `name`, the server
    /// presents `issued`'s certificate.
    fn handshake(issued: &Issued, bundle: &str, name: &str) -> Result<(), rustls::Error> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(bundle.as_bytes()) {
            roots.add(ca.unwrap()).unwrap();
        }
        let client = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let chain = vec![CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).unwrap()];
        let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).unwrap();
        let server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        let name = ServerName::try_from(name.to_string()).unwrap();
        let mut c = rustls::ClientConnection::new(Arc::new(client), name)?;
        let mut s = rustls::ServerConnection::new(Arc::new(server))?;
        let mut buf = Vec::new();
        while c.is_handshaking() || s.is_handshaking() {
            buf.clear();
            c.write_tls(&mut buf).unwrap();
            s.read_tls(&mut buf.as_slice()).unwrap();
            s.process_new_packets()?;
            buf.clear();
            s.write_tls(&mut buf).unwrap();
            c.read_tls(&mut buf.as_slice()).unwrap();
            c.process_new_packets()?;
        }
        Ok(())
    }

    #[test]
    fn the_api_server_can_reach_the_service_by_its_name_with_the_ca_bundle() {
        let issued = issue("arbiter-webhook", "arbiter", Timestamp::now(), 365 * DAY).unwrap();
        handshake(&issued, &issued.ca_pem, "arbiter-webhook.arbiter.svc").unwrap();
        assert!(
            handshake(&issued, &issued.ca_pem, "other.arbiter.svc").is_err(),
            "a name it was not issued for"
        );
        let other = issue("arbiter-webhook", "arbiter", Timestamp::now(), DAY).unwrap();
        assert!(
            handshake(&issued, &other.ca_pem, "arbiter-webhook.arbiter.svc").is_err(),
            "another CA"
        );
        // During a rotation the bundle trusts both.
        let both = ca_bundle(&other.ca_pem, Some(&issued.ca_pem));
        handshake(&issued, &both, "arbiter-webhook.arbiter.svc").unwrap();
        handshake(&other, &both, "arbiter-webhook.arbiter.svc").unwrap();
        assert_eq!(
            ca_bundle(&issued.ca_pem, Some(&issued.ca_pem)),
            issued.ca_pem
        );
    }

    #[test]
    fn the_validity_is_read_back_from_the_certificate() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let issued = issue("s", "ns", now, DAY).unwrap();
        let (from, until) = validity(&issued.cert_pem).unwrap();
        assert_eq!(from, now - jiff::SignedDuration::from_hours(1));
        assert_eq!(until, issued.not_after);
        assert_eq!(validity(&issued.ca_pem).unwrap().1, issued.not_after);
        assert_eq!(validity("not a certificate"), None);
        assert_eq!(validity(&issued.key_pem), None);
    }

    #[test]
    fn a_certificate_is_whole_only_with_its_key_its_ca_and_its_name() {
        let now = Timestamp::now();
        let a = issue("svc", "ns", now, DAY).unwrap();
        let b = issue("svc", "ns", now, DAY).unwrap();
        let name = "svc.ns.svc";
        assert!(whole(&a.cert_pem, &a.key_pem, &a.ca_pem, name));
        assert!(
            !whole(&a.cert_pem, &b.key_pem, &a.ca_pem, name),
            "another key"
        );
        assert!(
            !whole(&a.cert_pem, &a.key_pem, &b.ca_pem, name),
            "another CA"
        );
        assert!(
            !whole(&a.cert_pem, &a.key_pem, &a.ca_pem, "other.ns.svc"),
            "another name"
        );
        assert!(!whole("junk", &a.key_pem, &a.ca_pem, name));
        assert!(!whole(&a.cert_pem, "junk", &a.ca_pem, name));
    }

    #[test]
    fn the_certificates_still_valid_are_kept_from_a_bundle() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let a = issue("s", "ns", now, DAY).unwrap();
        let b = issue("s", "ns", now, 2 * DAY).unwrap();
        let bundle = ca_bundle(&a.ca_pem, Some(&b.ca_pem));
        assert_eq!(
            still_valid(&bundle, now),
            [a.ca_pem.clone(), b.ca_pem.clone()]
        );
        let later = now + jiff::SignedDuration::from_hours(36);
        assert_eq!(still_valid(&bundle, later), vec![b.ca_pem]);
        assert!(still_valid("junk", now).is_empty());
    }

    #[test]
    fn certificates_are_replaced_with_a_third_of_their_validity_left() {
        let now = Timestamp::now();
        let year = 365 * DAY;
        let in_days = |d: i64| now + jiff::SignedDuration::from_hours(24 * d);
        assert!(!due(in_days(365), year, now), "new");
        assert!(!due(in_days(122), year, now), "more than a third left");
        assert!(due(in_days(121), year, now), "less than a third left");
        assert!(due(in_days(-1), year, now), "expired");
    }
}
