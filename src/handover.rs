//! `arbiter handover LEASE [--to CANDIDATE]`: a planned switchover, as `patronictl switchover`
//! gives Postgres users.
//!
//! The command never writes the holder: it records the request on the Lease (annotation
//! [`lease::HANDOVER_REQUEST_ANNOTATION`]) and the operator carries it out through the ordinary
//! handover (preferred holder, the holder's release, assignment). It refuses at once (exit 2,
//! with the reason) when the rules would not let the target lead: unknown, not eligible (not
//! acknowledging, its pod not running, ...), already the holder, or at a newer version than the
//! rules elect. Then it waits and prints who holds the lease, the new term and the leaderless
//! gap it saw; if the operator refuses (the situation changed meanwhile), it says why (exit 2).

use std::time::{Duration, Instant};

use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::api::LeaseCandidate;
use crate::election::Version;
use crate::election::decide;
use crate::election::oldest_emulation::Ranked;
use crate::lease::{self, CasError, LeaseStore};

/// `arbiter handover` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct Settings {
    /// The lease to switch over.
    pub lease: String,
    /// The candidate to hand over to (default: the best other candidate the rules allow).
    #[arg(long)]
    pub to: Option<String>,
    /// Namespace (default: the kubeconfig context's).
    #[arg(short, long)]
    pub namespace: Option<String>,
    /// How long to wait for the new holder.
    #[arg(long, default_value = "60s", value_parser = crate::flags::positive_duration)]
    pub timeout: Duration,
    /// The kubeconfig file, as kubectl's --kubeconfig.
    #[arg(long)]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig context, as kubectl's --context.
    #[arg(long)]
    pub context: Option<String>,
}

/// A refusal: printed as `error: ...`, exit code 2.
fn refuse(why: String) -> anyhow::Result<i32> {
    eprintln!("error: {why}");
    Ok(2)
}

pub async fn run(settings: Settings) -> anyhow::Result<i32> {
    let client =
        crate::client::connect_to(settings.kubeconfig.as_deref(), settings.context.as_deref())
            .await?;
    let ns = settings
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let name = settings.lease.as_str();
    let store = LeaseStore::new(client.clone(), &ns);
    let Some(current) = store.get(name).await? else {
        return refuse(format!("lease {ns}/{name} does not exist"));
    };
    let Some(holder) = lease::holder(&current).map(str::to_string) else {
        return refuse(format!(
            "lease {ns}/{name} has no holder: nothing to hand over"
        ));
    };
    let candidates = candidates_of(&client, &ns, name).await?;
    if let Err(why) = check(&candidates, &holder, settings.to.as_deref()) {
        return refuse(format!("cannot hand lease {name} over: {why}"));
    }
    let term = lease::term(&current);
    if let Err(why) = request(&store, name, &holder, term, settings.to.as_deref()).await? {
        return refuse(why);
    }
    let target = settings.to.as_deref().unwrap_or("the best other candidate");
    eprintln!(
        "asked the operator to hand lease {name} over from {holder} (term {term}) to {target}"
    );

    let asked = Asked {
        name,
        holder: &holder,
        term,
        to: settings.to.as_deref(),
    };
    wait_for_switchover(&store, asked, settings.timeout).await
}

/// The switchover asked for: lease `name` from `holder` at `term` to `to` (none: the best
/// other candidate).
struct Asked<'a> {
    name: &'a str,
    holder: &'a str,
    term: i32,
    to: Option<&'a str>,
}

/// Polls the Lease until the switchover happened (exit code 0), was refused (the operator's
/// reason), went wrong, or timed out (the request is then taken back).
async fn wait_for_switchover(
    store: &LeaseStore,
    asked: Asked<'_>,
    timeout: Duration,
) -> anyhow::Result<i32> {
    let Asked {
        name,
        holder,
        term,
        to,
    } = asked;
    let start = Instant::now();
    let value = lease::handover_request(holder, term, to);
    let mut released_at: Option<Instant> = None;
    loop {
        let Some(l) = store.get(name).await? else {
            anyhow::bail!("lease {name} was deleted while waiting");
        };
        let (now_holder, now_term) = (lease::holder(&l), lease::term(&l));
        if now_holder.is_none() {
            released_at.get_or_insert_with(Instant::now);
        }
        match now_holder {
            Some(h) if now_term > term && h == holder => {
                anyhow::bail!(
                    "{holder} holds lease {name} again, at term {now_term}: the switchover did not happen"
                )
            }
            Some(h) if now_term > term && to.is_some_and(|to| to != h) => {
                anyhow::bail!(
                    "lease {name} went to {h} at term {now_term}, not {}: the handover was abandoned (see the HandoverAbandoned Event)",
                    to.unwrap_or_default()
                )
            }
            Some(h) if now_term > term => {
                let gap = released_at
                    .map(|r| format!("{:.2} s", r.elapsed().as_secs_f64()))
                    .unwrap_or_else(|| "under 0.1 s".into());
                println!(
                    "lease {name}: held by {h} at term {now_term} (was {holder} at term {term}); leaderless for {gap} (from the release to the assignment, as seen here)"
                );
                return Ok(0);
            }
            _ => {}
        }
        let pending = l.annotations().get(lease::HANDOVER_REQUEST_ANNOTATION) == Some(&value);
        if !pending && now_holder == Some(holder) && now_term == term {
            return match l.annotations().get(lease::HANDOVER_REFUSED_ANNOTATION) {
                Some(why) => refuse(format!("the operator refused the switchover: {why}")),
                None => anyhow::bail!(
                    "the request was removed from lease {name} before the operator acted on it"
                ),
            };
        }
        if start.elapsed() > timeout {
            withdraw_request(store, name, &value).await;
            anyhow::bail!(
                "no new holder after {:?}; the request was taken back",
                timeout
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn candidates_of(
    client: &Client,
    ns: &str,
    lease: &str,
) -> anyhow::Result<Vec<LeaseCandidate>> {
    let api: Api<LeaseCandidate> = Api::namespaced(client.clone(), ns);
    Ok(api
        .list(&ListParams::default())
        .await
        .map_err(|e| anyhow::anyhow!("listing LeaseCandidates: {e}"))?
        .items
        .into_iter()
        .filter(|c| c.spec.lease_name == lease)
        .collect())
}

/// Whether the operator reports the candidate eligible (it reports only a candidate that is
/// not: `Eligible=False`), and if not, why.
fn eligibility(c: &LeaseCandidate) -> Result<(), String> {
    let condition = c
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|x| x.type_ == "Eligible"));
    match condition {
        Some(x) if x.status == "False" => Err(format!("{}: {}", x.reason, x.message)),
        _ => Ok(()),
    }
}

/// The command's own check, from what the operator reported (the operator checks again when it
/// acts, with the same rule, [`decide::switchover_target`]): the target is a candidate the
/// operator does not report ineligible, not the holder, and at the versions the rules elect.
pub fn check(candidates: &[LeaseCandidate], holder: &str, to: Option<&str>) -> Result<(), String> {
    if let Some(to) = to.filter(|to| *to != holder) {
        let Some(c) = candidates.iter().find(|c| c.name_any() == to) else {
            return Err(format!("{to} is not a candidate of this lease"));
        };
        eligibility(c).map_err(|why| format!("{to} is not eligible ({why})"))?;
    }
    // (name, emulation, binary, created) of the eligible candidates whose versions parse.
    let parsed: Vec<(String, Version, Version, jiff::Timestamp)> = candidates
        .iter()
        .filter(|c| eligibility(c).is_ok())
        .filter_map(|c| {
            Some((
                c.name_any(),
                Version::parse(c.spec.emulation_version.as_deref()?).ok()?,
                Version::parse(&c.spec.binary_version).ok()?,
                c.creation_timestamp().map_or(jiff::Timestamp::MAX, |t| t.0),
            ))
        })
        .collect();
    let ranked: Vec<Ranked> = parsed
        .iter()
        .map(|(name, emulation, binary, created)| Ranked {
            name,
            emulation,
            binary,
            created: *created,
        })
        .collect();
    let eligible: Vec<&Ranked> = ranked.iter().collect();
    decide::switchover_target(to, holder, &eligible).map(|_| ())
}

/// Records the request on the Lease (compare-and-swap), clearing an earlier refusal, if the
/// lease is still held by `holder` at `term` (the state that was checked).
async fn request(
    store: &LeaseStore,
    name: &str,
    holder: &str,
    term: i32,
    to: Option<&str>,
) -> anyhow::Result<Result<(), String>> {
    for _ in 0..5 {
        let Some(mut l) = store.get(name).await? else {
            return Ok(Err(format!("lease {name} was deleted")));
        };
        if (lease::holder(&l), lease::term(&l)) != (Some(holder), term) {
            return Ok(Err(format!(
                "lease {name} moved on meanwhile (now {} at term {}); check again",
                lease::holder(&l).unwrap_or("nobody"),
                lease::term(&l)
            )));
        }
        let value = lease::handover_request(holder, term, to);
        lease::set_annotation(&mut l, lease::HANDOVER_REQUEST_ANNOTATION, Some(&value));
        lease::set_annotation(&mut l, lease::HANDOVER_REFUSED_ANNOTATION, None);
        match store.replace(&l).await {
            Ok(_) => return Ok(Ok(())),
            Err(CasError::Conflict(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!("lease {name} kept changing; try again")
}

/// Takes our request back (on timeout), if it is still the one on the Lease.
async fn withdraw_request(store: &LeaseStore, name: &str, value: &str) {
    for _ in 0..5 {
        let Ok(Some(mut l)) = store.get(name).await else {
            return;
        };
        if l.annotations()
            .get(lease::HANDOVER_REQUEST_ANNOTATION)
            .map(String::as_str)
            != Some(value)
        {
            return;
        }
        lease::set_annotation(&mut l, lease::HANDOVER_REQUEST_ANNOTATION, None);
        match store.replace(&l).await {
            Err(CasError::Conflict(_)) => continue,
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{LeaseCandidateSpec, LeaseCandidateStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    fn candidate(name: &str, version: &str, eligible: Option<(&str, &str)>) -> LeaseCandidate {
        let mut c = LeaseCandidate::new(
            name,
            LeaseCandidateSpec {
                lease_name: "l".into(),
                binary_version: version.into(),
                emulation_version: Some(version.into()),
                strategy: crate::api::OLDEST_EMULATION_VERSION.into(),
                ping_time: None,
                renew_time: None,
            },
        );
        c.status = eligible.map(|(status, reason)| LeaseCandidateStatus {
            conditions: vec![Condition {
                type_: "Eligible".into(),
                status: status.into(),
                reason: reason.into(),
                message: "why".into(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    jiff::Timestamp::now(),
                ),
                observed_generation: None,
            }],
            ..LeaseCandidateStatus::default()
        });
        c
    }

    #[test]
    fn only_an_eligible_equal_may_take_over() {
        let ok = Some(("True", "Eligible"));
        let cands = [
            candidate("h", "1.30.0", ok),
            candidate("twin", "1.30.0", ok),
            candidate("newer", "1.31.0", ok),
            candidate("silent", "1.30.0", Some(("False", "Unresponsive"))),
            candidate("fresh", "1.30.0", None),
        ];
        assert_eq!(check(&cands, "h", Some("twin")), Ok(()));
        assert_eq!(
            check(&cands, "h", Some("fresh")),
            Ok(()),
            "nothing reported: no problem"
        );
        assert_eq!(check(&cands, "h", None), Ok(()));
        for (to, expected) in [
            ("h", "already holds"),
            ("ghost", "not a candidate"),
            ("silent", "not eligible (Unresponsive: why)"),
            ("newer", "never a newer version"),
        ] {
            let why = check(&cands, "h", Some(to)).unwrap_err();
            assert!(why.contains(expected), "{to}: {why}");
        }
        let alone = [cands[0].clone(), cands[2].clone()];
        assert!(
            check(&alone, "h", None)
                .unwrap_err()
                .contains("no other eligible")
        );
    }
}
