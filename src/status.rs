//! `arbiter status`: the leases arbiter manages, their holders and candidates, as a table or
//! JSON. Also works as a kubectl plugin (`kubectl arbiter status`, via a `kubectl-arbiter` link).

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde::Serialize;

use crate::api::LeaseCandidate;
use crate::lease::{self, MANAGED_LABEL};

/// `arbiter status` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct Settings {
    /// Only this lease.
    pub lease: Option<String>,
    /// Namespace (default: the kubeconfig context's).
    #[arg(short, long)]
    pub namespace: Option<String>,
    /// All namespaces.
    #[arg(short = 'A', long, conflicts_with = "namespace")]
    pub all_namespaces: bool,
    /// Output format.
    #[arg(short, long, default_value = "table", value_parser = ["table", "json"])]
    pub output: String,
}

/// One row of the status table.
#[derive(Serialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LeaseStatus {
    pub namespace: String,
    pub lease: String,
    pub holder: Option<String>,
    pub term: i32,
    pub holder_version: Option<String>,
    pub candidates: Vec<String>,
    pub preferred_holder: Option<String>,
    pub strategy: Option<String>,
    pub state: String,
    /// Seconds since the lease was created.
    pub age_seconds: i64,
}

pub async fn run(settings: Settings) -> anyhow::Result<i32> {
    let client = crate::client::connect().await?;
    let rows = collect(&client, &settings).await?;
    if settings.output == "json" {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print!("{}", table(&rows, settings.all_namespaces));
    }
    Ok(0)
}

async fn collect(client: &Client, settings: &Settings) -> anyhow::Result<Vec<LeaseStatus>> {
    let ns = settings
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let (leases, candidates): (Api<Lease>, Api<LeaseCandidate>) = if settings.all_namespaces {
        (Api::all(client.clone()), Api::all(client.clone()))
    } else {
        (
            Api::namespaced(client.clone(), &ns),
            Api::namespaced(client.clone(), &ns),
        )
    };
    let leases = leases
        .list(&ListParams::default().labels(&format!("{MANAGED_LABEL}=true")))
        .await?;
    let candidates = candidates
        .list(&ListParams::default())
        .await
        .map_err(|e| match &e {
            kube::Error::Api(s) if s.code == 404 => {
                anyhow::anyhow!("the LeaseCandidate CRD is not installed")
            }
            _ => anyhow::anyhow!("listing LeaseCandidates: {e}"),
        })?;
    let mut by_lease: BTreeMap<(String, String), Vec<&LeaseCandidate>> = BTreeMap::new();
    for c in &candidates.items {
        by_lease
            .entry((c.namespace().unwrap_or_default(), c.spec.lease_name.clone()))
            .or_default()
            .push(c);
    }
    let now = jiff::Timestamp::now();
    let mut rows: Vec<LeaseStatus> = leases
        .items
        .iter()
        .filter(|l| settings.lease.as_ref().is_none_or(|n| *n == l.name_any()))
        .map(|l| {
            let key = (l.namespace().unwrap_or_default(), l.name_any());
            let cands = by_lease.get(&key).map(Vec::as_slice).unwrap_or_default();
            row(l, cands, now)
        })
        .collect();
    rows.sort_by(|a, b| (&a.namespace, &a.lease).cmp(&(&b.namespace, &b.lease)));
    Ok(rows)
}

fn row(l: &Lease, candidates: &[&LeaseCandidate], now: jiff::Timestamp) -> LeaseStatus {
    let holder = lease::holder(l).map(str::to_string);
    let preferred = lease::preferred_holder(l).map(str::to_string);
    let holder_candidate = holder
        .as_ref()
        .and_then(|h| candidates.iter().find(|c| c.name_any() == *h));
    let conflict = candidates.iter().any(|c| {
        c.status.as_ref().is_some_and(|s| {
            crate::operator::status::is_true(
                &s.conditions,
                crate::operator::status::STRATEGY_CONFLICT,
            )
        })
    });
    let spec = l.spec.clone().unwrap_or_default();
    let stale = match (&spec.renew_time, spec.lease_duration_seconds) {
        (Some(r), Some(d)) => now.duration_since(r.0).as_secs() > i64::from(d),
        _ => false,
    };
    let state = match (&holder, &preferred) {
        _ if conflict => "StrategyConflict".to_string(),
        (None, _)
            if lease::strategy(l).is_some_and(|s| s != crate::api::OLDEST_EMULATION_VERSION) =>
        {
            "ThirdParty".into()
        }
        (None, _) => "NoHolder".into(),
        (Some(_), Some(p)) => format!("HandingOverTo:{p}"),
        (Some(_), None) if stale => "NotRenewing".into(),
        (Some(_), None) => "Held".into(),
    };
    let mut names: Vec<String> = candidates.iter().map(|c| c.name_any()).collect();
    names.sort();
    LeaseStatus {
        namespace: l.namespace().unwrap_or_default(),
        lease: l.name_any(),
        term: lease::term(l),
        holder_version: holder_candidate.map(|c| c.spec.binary_version.clone()),
        holder,
        candidates: names,
        preferred_holder: preferred,
        strategy: lease::strategy(l).map(str::to_string),
        state,
        age_seconds: l
            .creation_timestamp()
            .map(|t| now.duration_since(t.0).as_secs())
            .unwrap_or(0),
    }
}

fn age(secs: i64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// The table `arbiter status` prints.
pub fn table(rows: &[LeaseStatus], with_namespace: bool) -> String {
    let mut lines: Vec<Vec<String>> = Vec::new();
    let mut header = vec![
        "LEASE",
        "HOLDER",
        "TERM",
        "HOLDER VERSION",
        "CANDIDATES",
        "PREFERRED",
        "STATE",
        "AGE",
    ];
    if with_namespace {
        header.insert(0, "NAMESPACE");
    }
    lines.push(header.iter().map(|s| s.to_string()).collect());
    for r in rows {
        let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        let mut line = vec![
            r.lease.clone(),
            dash(&r.holder),
            r.term.to_string(),
            dash(&r.holder_version),
            r.candidates.len().to_string(),
            dash(&r.preferred_holder),
            r.state.clone(),
            age(r.age_seconds),
        ];
        if with_namespace {
            line.insert(0, r.namespace.clone());
        }
        lines.push(line);
    }
    let widths: Vec<usize> = (0..lines[0].len())
        .map(|i| lines.iter().map(|l| l[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    if rows.is_empty() {
        out.push_str("No leases managed by arbiter found.\n");
        return out;
    }
    for l in lines {
        let cells: Vec<String> = l
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(cells.join("   ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns_and_dashes_missing_values() {
        let row = LeaseStatus {
            namespace: "ns".into(),
            lease: "demo".into(),
            holder: Some("a".into()),
            term: 3,
            holder_version: Some("1.30.0".into()),
            candidates: vec!["a".into(), "b".into()],
            preferred_holder: None,
            strategy: Some("OldestEmulationVersion".into()),
            state: "Held".into(),
            age_seconds: 300,
        };
        let out = table(&[row], false);
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[0].starts_with(
                "LEASE   HOLDER   TERM   HOLDER VERSION   CANDIDATES   PREFERRED   STATE   AGE"
            ),
            "{out}"
        );
        assert!(
            lines[1].starts_with(
                "demo    a        3      1.30.0           2            -           Held    5m"
            ),
            "{out}"
        );
        assert_eq!(table(&[], false), "No leases managed by arbiter found.\n");
    }
}
