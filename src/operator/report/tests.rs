use std::sync::Arc;

use kube::runtime::events::Reporter;

use super::*;
use crate::fake_api::{Answer, FakeApi};

/// The candidates' status writes a report makes, by candidate name, against a stand-in
/// API server that accepts every write.
async fn status_writes(
    candidates: &[Arc<LeaseCandidate>],
    holder: &str,
    term: i32,
    may_wait: MayWait,
) -> (Vec<String>, bool) {
    status_writes_failing(candidates, holder, term, may_wait, None).await
}

/// The same; the stand-in refuses `failing`'s status writes (they are still listed).
async fn status_writes_failing(
    candidates: &[Arc<LeaseCandidate>],
    holder: &str,
    term: i32,
    may_wait: MayWait,
    failing: Option<&'static str>,
) -> (Vec<String>, bool) {
    let (client, api) = FakeApi::new(move |r| {
        let Some(rest) = r.path.split("/leasecandidates/").nth(1) else {
            // An Event, as created.
            return Answer::echo(r, 200);
        };
        let name = rest.trim_end_matches("/status");
        if Some(name) == failing {
            return Answer::status(429, "TooManyRequests", "too many requests");
        }
        Answer::ok(json!({
            "apiVersion": "arbiter.dev/v1alpha1",
            "kind": "LeaseCandidate",
            "metadata": { "name": name, "namespace": "ns" },
            "spec": {
                "leaseName": "l",
                "binaryVersion": "1.30.0",
                "strategy": "OldestEmulationVersion"
            }
        }))
    });
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "arbiter".into(),
            instance: None,
        },
    );
    let key = LeaseKey {
        namespace: "ns".into(),
        name: "l".into(),
    };
    let r = LeaseReport {
        key: &key,
        candidates,
        decision: &decision(),
        lease_exists: true,
        holder: Some(holder),
        term,
        duplicates: &[],
        overruns: &[],
        may_wait,
    };
    let reported = report(
        &client,
        &recorder,
        &Metrics::default(),
        r,
        &mut Written::default(),
    )
    .await;
    let mut patched: Vec<String> = api
        .requests()
        .iter()
        .filter_map(|r| r.path.split("/leasecandidates/").nth(1))
        .map(|rest| rest.trim_end_matches("/status").to_string())
        .collect();
    patched.sort();
    (patched, reported.waiting)
}

/// Every candidate eligible, nothing to do.
fn decision() -> Decision {
    use crate::election::decide::{Liveness, Standing};
    Decision {
        action: Action::Nothing,
        strategy: crate::election::strategy::Resolution::Strategy(
            crate::api::OLDEST_EMULATION_VERSION.into(),
        ),
        standings: ["a", "b", "c"]
            .into_iter()
            .map(|n| (n.to_string(), Standing::Eligible(Liveness::Acked)))
            .collect(),
        skew_violations: vec![],
    }
}

/// `name`, with the status the arbiter wrote when `holder` held lease l at `term`.
fn reported_as(name: &str, holder: &str, term: i32) -> Arc<LeaseCandidate> {
    let mut c = crate::api::test_candidate(name, "l");
    c.metadata.namespace = Some("ns".into());
    c.metadata.uid = Some(format!("uid-{name}"));
    let facts = conditions::LeaseFacts {
        lease: "l",
        holder: Some(holder),
        term,
        duplicates: &[],
        overruns: &[],
    };
    c.status = Some(crate::api::LeaseCandidateStatus {
        conditions: conditions::conditions(name, &decision(), &facts),
        ..Default::default()
    });
    Arc::new(c)
}

/// A deposed holder's `Leader=False` waits while the worker is busy, and only behind the
/// new holder's `Leader=True` at a higher term; the new holder's never waits.
#[tokio::test]
async fn a_deposed_holders_status_waits_only_behind_the_new_holders() {
    let busy = MayWait {
        first: true,
        deposed: true,
    };
    let (a, c) = (reported_as("a", "a", 7), reported_as("c", "a", 7));
    // b was elected at term 8: its status changes, and a's.
    let b = reported_as("b", "a", 7);
    let all = [a.clone(), b.clone(), c.clone()];
    assert_eq!(
        status_writes(&all, "b", 8, busy).await,
        (vec!["b".to_string()], true),
        "a's waits"
    );
    assert_eq!(
        status_writes(&all, "b", 8, MayWait::default()).await,
        (vec!["a".to_string(), "b".to_string()], false),
        "nothing else due: both at once"
    );
    // b's write fails: a's is written too, not left for a replica taking over to find as
    // the only Leader=True.
    assert_eq!(
        status_writes_failing(&all, "b", 8, busy, Some("b")).await,
        (vec!["a".to_string(), "b".to_string()], false)
    );
    // b's Leader=True is on the server already: a's still waits.
    let b_reported = reported_as("b", "b", 8);
    assert_eq!(
        status_writes(&[a.clone(), b_reported.clone(), c.clone()], "b", 8, busy).await,
        (vec![], true)
    );
    // The holder's candidate is gone: no Leader=True at its term can be written, so a's
    // is written at once (else a replica taking over would remember a).
    assert_eq!(
        status_writes(&[a.clone(), c.clone()], "b", 8, busy).await,
        (vec!["a".to_string()], false)
    );
    // A Leader=True that names the term the Lease is at (a hand edit): not stale.
    assert_eq!(
        status_writes(
            &[reported_as("a", "a", 8), b_reported.clone(), c.clone()],
            "b",
            8,
            busy
        )
        .await,
        (vec!["a".to_string()], false)
    );
    // The Lease's term went down (deleted: 0; or lowered by hand): b is still reported at
    // its term, so a's waits behind it, and nothing is rewritten.
    assert_eq!(
        status_writes(&[a.clone(), b_reported, c], "b", 0, busy).await,
        (vec![], true)
    );
    // Deposed and unresponsive: a reason it cannot be elected is reported at once.
    let mut unresponsive = decision();
    unresponsive.standings.insert(
        "a".into(),
        crate::election::decide::Standing::Ineligible(
            crate::election::decide::Reason::Unresponsive,
        ),
    );
    let desired = conditions::conditions(
        "a",
        &unresponsive,
        &conditions::LeaseFacts {
            lease: "l",
            holder: Some("b"),
            term: 8,
            duplicates: &[],
            overruns: &[],
        },
    );
    let current = a.status.as_ref().unwrap().conditions.clone();
    let merged = conditions::merge(&current, desired).unwrap();
    assert!(!conditions::deposed_can_wait(&current, &merged));
}
