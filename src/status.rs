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
    /// Output format: `wide` adds every candidate, with why it is or is not eligible.
    #[arg(short, long, default_value = "table", value_parser = ["table", "wide", "json"])]
    pub output: String,
    /// Print again whenever something changes (checked every 2 s), until interrupted.
    #[arg(short, long)]
    pub watch: bool,
    /// Exit 1 when a lease has no live holder (NoHolder, NotRenewing) or a strategy conflict,
    /// for scripts (not with --watch).
    #[arg(long, conflicts_with = "watch")]
    pub exit_code: bool,
    /// The kubeconfig file, as kubectl's --kubeconfig (default: KUBECONFIG, ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig context, as kubectl's --context (default: the current one).
    #[arg(long)]
    pub context: Option<String>,
}

/// A candidate, for `-o wide` and JSON.
#[derive(Serialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CandidateStatus {
    pub name: String,
    pub binary_version: String,
    pub emulation_version: Option<String>,
    /// `False` when the operator reports that it cannot be elected (`Eligible=False`), else
    /// `True` (the operator writes a candidate's conditions only when it has a problem to
    /// report, or had one).
    pub eligible: String,
    /// Why it is or is not eligible: the condition's reason and message.
    pub reason: String,
    pub message: String,
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
    pub candidate_details: Vec<CandidateStatus>,
    pub preferred_holder: Option<String>,
    pub strategy: Option<String>,
    pub state: String,
    /// Seconds since the lease was created.
    pub age_seconds: i64,
}

pub async fn run(settings: Settings) -> anyhow::Result<i32> {
    let client =
        crate::client::connect_to(settings.kubeconfig.as_deref(), settings.context.as_deref())
            .await?;
    let mut last = String::new();
    loop {
        let rows = match collect(&client, &settings).await {
            Ok(rows) => rows,
            // A watch rides out an API server that is away for a while (it says so); a single
            // look fails.
            Err(e) if settings.watch => {
                eprintln!("error: {e:#} (retrying)");
                last.clear();
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let text = render(&rows, &settings)?;
        if !settings.watch {
            print!("{text}");
            return Ok(if settings.exit_code && rows.iter().any(unhealthy) {
                1
            } else {
                0
            });
        }
        if text != last {
            if !last.is_empty() {
                println!();
            }
            print!("{text}");
            last = text;
        }
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
}

/// A lease without a live holder, or in a strategy conflict (what `--exit-code` reports).
pub fn unhealthy(row: &LeaseStatus) -> bool {
    matches!(
        row.state.as_str(),
        "NoHolder" | "NotRenewing" | "StrategyConflict"
    )
}

fn render(rows: &[LeaseStatus], settings: &Settings) -> anyhow::Result<String> {
    Ok(match settings.output.as_str() {
        "json" => format!("{}\n", serde_json::to_string_pretty(rows)?),
        "wide" => format!(
            "{}\n{}",
            table(rows, settings.all_namespaces),
            candidates_table(rows, settings.all_namespaces)
        ),
        _ => table(rows, settings.all_namespaces),
    })
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
            crate::api::conditions::is_true(
                &s.conditions,
                crate::api::conditions::STRATEGY_CONFLICT,
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
    let mut details: Vec<CandidateStatus> =
        candidates.iter().map(|c| candidate_status(c)).collect();
    details.sort_by(|a, b| a.name.cmp(&b.name));
    LeaseStatus {
        namespace: l.namespace().unwrap_or_default(),
        lease: l.name_any(),
        term: lease::term(l),
        holder_version: holder_candidate.map(|c| c.spec.binary_version.clone()),
        holder,
        candidates: names,
        candidate_details: details,
        preferred_holder: preferred,
        strategy: lease::strategy(l).map(str::to_string),
        state,
        age_seconds: l
            .creation_timestamp()
            .map(|t| now.duration_since(t.0).as_secs())
            .unwrap_or(0),
    }
}

fn candidate_status(c: &LeaseCandidate) -> CandidateStatus {
    let eligible = c
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|x| x.type_ == "Eligible"));
    CandidateStatus {
        name: c.name_any(),
        binary_version: c.spec.binary_version.clone(),
        emulation_version: c.spec.emulation_version.clone(),
        eligible: eligible.map_or("True".into(), |e| e.status.clone()),
        reason: eligible.map_or("NothingReported".into(), |e| e.reason.clone()),
        message: eligible.map_or("no problem reported".into(), |e| e.message.clone()),
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

/// The candidates' table `-o wide` adds: each candidate, and why it is or is not eligible.
pub fn candidates_table(rows: &[LeaseStatus], with_namespace: bool) -> String {
    let mut lines: Vec<Vec<String>> = vec![
        [
            "LEASE",
            "CANDIDATE",
            "BINARY",
            "EMULATION",
            "ELIGIBLE",
            "WHY",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
    ];
    if with_namespace {
        lines[0].insert(0, "NAMESPACE".into());
    }
    for r in rows {
        for c in &r.candidate_details {
            let why = match c.message.as_str() {
                "" => c.reason.clone(),
                m => format!("{}: {m}", c.reason),
            };
            let mut line = vec![
                r.lease.clone(),
                c.name.clone(),
                c.binary_version.clone(),
                c.emulation_version.clone().unwrap_or_else(|| "-".into()),
                c.eligible.clone(),
                why,
            ];
            if with_namespace {
                line.insert(0, r.namespace.clone());
            }
            lines.push(line);
        }
    }
    if lines.len() == 1 {
        return "No candidates.\n".into();
    }
    aligned(lines)
}

/// Left-aligned columns, three spaces apart.
fn aligned(lines: Vec<Vec<String>>) -> String {
    let widths: Vec<usize> = (0..lines[0].len())
        .map(|i| lines.iter().map(|l| l[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
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
    if rows.is_empty() {
        return "No leases managed by arbiter found.\n".into();
    }
    aligned(lines)
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
            candidate_details: vec![
                CandidateStatus {
                    name: "a".into(),
                    binary_version: "1.30.0".into(),
                    emulation_version: Some("1.30.0".into()),
                    eligible: "True".into(),
                    reason: "Eligible".into(),
                    message: String::new(),
                },
                CandidateStatus {
                    name: "b".into(),
                    binary_version: "1.32.0".into(),
                    emulation_version: None,
                    eligible: "False".into(),
                    reason: "NoEmulationVersion".into(),
                    message: "OldestEmulationVersion needs an emulationVersion".into(),
                },
            ],
            preferred_holder: None,
            strategy: Some("OldestEmulationVersion".into()),
            state: "Held".into(),
            age_seconds: 300,
        };
        let out = table(std::slice::from_ref(&row), false);
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
        let wide = candidates_table(std::slice::from_ref(&row), true);
        let lines: Vec<&str> = wide.lines().collect();
        assert_eq!(
            lines,
            [
                "NAMESPACE   LEASE   CANDIDATE   BINARY   EMULATION   ELIGIBLE   WHY",
                "ns          demo    a           1.30.0   1.30.0      True       Eligible",
                "ns          demo    b           1.32.0   -           False      NoEmulationVersion: OldestEmulationVersion needs an emulationVersion",
            ],
            "{wide}"
        );
        assert!(!unhealthy(&row));
        let leaderless = LeaseStatus {
            state: "NoHolder".into(),
            ..row
        };
        assert!(unhealthy(&leaderless));
    }
}
