use std::sync::Arc;

use super::*;
use crate::fake_api::{Answer, FakeApi};

/// The candidates' status writes a report makes, by candidate name, against a stand-in
/// API server that accepts every write.
async fn status_writes(candidates: &[Arc<LeaseCandidate>], decision: &Decision) -> Vec<String> {
    status_writes_failing(candidates, decision, None).await.0
}

/// The same; the stand-in refuses `failing`'s status writes (they are still listed); and
/// whether every write went through.
async fn status_writes_failing(
    candidates: &[Arc<LeaseCandidate>],
    decision: &Decision,
    failing: Option<&'static str>,
) -> (Vec<String>, bool) {
    let (patched, complete, _) = reported(candidates, decision, failing).await;
    (patched, complete)
}

/// The same, with the Events the report returned.
async fn reported(
    candidates: &[Arc<LeaseCandidate>],
    decision: &Decision,
    failing: Option<&'static str>,
) -> (Vec<String>, bool, Notices) {
    let (client, api) = FakeApi::new(move |r| {
        let Some(rest) = r.path.split("/leasecandidates/").nth(1) else {
            // An Event, as created (none is sent by a report: see below).
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
    let key = LeaseKey {
        namespace: "ns".into(),
        name: "l".into(),
    };
    let r = LeaseReport {
        key: &key,
        candidates,
        decision,
        lease_exists: true,
        holder: Some("a"),
        term: 1,
        duplicates: &[],
        overruns: &[],
    };
    let mut notices = Notices::default();
    let reported = report(
        &client,
        &mut notices,
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
    let sent: Vec<String> = (api.requests().iter())
        .filter(|r| r.path.contains("/events"))
        .map(|r| r.path.clone())
        .collect();
    assert!(sent.is_empty(), "a report sends no Event itself: {sent:?}");
    (patched, reported.complete, notices)
}

/// Every candidate eligible, nothing to do.
fn decision() -> Decision {
    use arbiter_election::decide::{Liveness, Standing};
    Decision {
        action: Action::Nothing,
        strategy: arbiter_election::strategy::Resolution::Strategy(
            arbiter_api::OLDEST_EMULATION_VERSION.into(),
        ),
        standings: ["a", "b", "c"]
            .into_iter()
            .map(|n| (n.to_string(), Standing::Eligible(Liveness::Acked)))
            .collect(),
        skew_violations: vec![],
    }
}

/// `name`, with `conditions` as its status.
fn with_status(name: &str, conditions: Vec<Condition>) -> Arc<LeaseCandidate> {
    let mut c = crate::test_candidate(name, "l");
    c.metadata.namespace = Some("ns".into());
    c.metadata.uid = Some(format!("uid-{name}"));
    c.status = Some(arbiter_api::LeaseCandidateStatus {
        conditions,
        ..Default::default()
    });
    Arc::new(c)
}

/// An election writes no candidate's status: who holds the lease is the Lease's, and a
/// candidate with nothing to report carries no conditions. A problem is written on its
/// candidate only, once; an earlier version's `Leader` condition is dropped once.
#[tokio::test]
async fn only_a_candidate_whose_conditions_change_is_written() {
    let fresh = |n: &str| with_status(n, vec![]);
    let all = [fresh("a"), fresh("b"), fresh("c")];
    assert!(status_writes(&all, &decision()).await.is_empty());
    // b ignored a ping.
    let mut unresponsive = decision();
    unresponsive.standings.insert(
        "b".into(),
        arbiter_election::decide::Standing::Ineligible(
            arbiter_election::decide::Reason::Unresponsive,
        ),
    );
    assert_eq!(status_writes(&all, &unresponsive).await, ["b"]);
    let facts = conditions::LeaseFacts {
        term: 1,
        duplicates: &[],
        overruns: &[],
    };
    let b = with_status("b", conditions::conditions("b", &unresponsive, &facts, &[]));
    let reported = [fresh("a"), b.clone(), fresh("c")];
    assert!(
        status_writes(&reported, &unresponsive).await.is_empty(),
        "once"
    );
    // It answers again: its Eligible flips back, and stays.
    assert_eq!(status_writes(&reported, &decision()).await, ["b"]);
    // An earlier version's Leader condition.
    let old = Condition {
        type_: "Leader".into(),
        status: "True".into(),
        reason: "Holder".into(),
        message: "holds lease l at term 3".into(),
        observed_generation: None,
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::UNIX_EPOCH,
        ),
    };
    let upgraded = [with_status("a", vec![old]), fresh("b"), fresh("c")];
    assert_eq!(status_writes(&upgraded, &decision()).await, ["a"]);
    // A write that fails is reported as such (retried by the caller).
    assert_eq!(
        status_writes_failing(&all, &unresponsive, Some("b")).await,
        (vec!["b".to_string()], false)
    );
}

/// A report's Events come back as values, for the reconcile to send once the pass ends: the
/// report sends none itself.
#[tokio::test]
async fn a_reports_events_are_returned_not_sent() {
    let all = [
        with_status("a", vec![]),
        with_status("b", vec![]),
        with_status("c", vec![]),
    ];
    let mut handover = decision();
    handover.action = Action::RequestHandover { to: "b".into() };
    let (_, _, notices) = reported(&all, &handover, None).await;
    assert_eq!(notices.reasons(), ["HandoverRequested"]);
    let mut refused = decision();
    refused.action = Action::RefuseSwitchover {
        reason: "b is newer".into(),
    };
    let (patched, _, notices) = reported(&all, &refused, None).await;
    assert!(patched.is_empty(), "{patched:?}");
    assert_eq!(notices.reasons(), ["SwitchoverRefused"]);
}
