use super::*;
use crate::fake_api::{Answer, FakeApi};

/// A client whose API server records each request and answers `status`: a success, or a
/// conflict on the pod's uid precondition.
fn recording_client(status: u16) -> (Client, FakeApi) {
    let (client, api) = FakeApi::new(move |_| {
        Answer::status(
            status,
            "Conflict",
            "Precondition failed: UID in precondition: a, UID in object meta: b",
        )
    });
    (client, api)
}

fn key() -> LeaseKey {
    LeaseKey {
        namespace: "ns".into(),
        name: "l".into(),
    }
}

fn running_pod(uid: &str) -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some("web-0".into());
    p.metadata.uid = Some(uid.into());
    p
}

#[test]
fn a_pod_whose_containers_all_ended_runs_nothing() {
    let pod = |states: &[&str]| -> Pod {
        serde_json::from_value(serde_json::json!({"status": {"containerStatuses": states
            .iter()
            .map(|s| match *s {
                "running" => serde_json::json!({"name": "c", "ready": true, "restartCount": 1, "image": "i", "imageID": "", "state": {"running": {}}}),
                "waiting" => serde_json::json!({"name": "c", "ready": false, "restartCount": 1, "image": "i", "imageID": "", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}),
                _ => serde_json::json!({"name": "c", "ready": false, "restartCount": 1, "image": "i", "imageID": "", "state": {"terminated": {"exitCode": 137}}}),
            })
            .collect::<Vec<_>>()}}))
        .unwrap()
    };
    assert!(crate::cache::pod_facts::nothing_runs(&pod(&["waiting"])));
    assert!(crate::cache::pod_facts::nothing_runs(&pod(&[
        "terminated",
        "waiting"
    ])));
    assert!(!crate::cache::pod_facts::nothing_runs(&pod(&["running"])));
    assert!(!crate::cache::pod_facts::nothing_runs(&pod(&[
        "waiting", "running"
    ])));
    // No statuses reported: nothing is known, so it may run.
    assert!(!crate::cache::pod_facts::nothing_runs(&pod(&[])));
}

#[tokio::test]
async fn evictions_and_deletions_name_the_pods_uid() {
    for (policy, path) in [
        (OnDepose::Evict, "/api/v1/namespaces/ns/pods/web-0/eviction"),
        (OnDepose::Delete, "/api/v1/namespaces/ns/pods/web-0"),
    ] {
        let (client, seen) = recording_client(200);
        let mut d = Deposer::default();
        d.add(&key(), Target::new("web-0", "web-0", "uid-1", 0));
        let (outcomes, _) = d
            .attempt(
                &client,
                &key(),
                policy,
                |_| Some(running_pod("uid-1")),
                |_| true,
            )
            .await;
        assert!(matches!(outcomes[0].1, Outcome::Forced(_)), "{outcomes:?}");
        let seen = seen.requests();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(seen[0].path, path);
        let body: serde_json::Value = serde_json::from_str(&seen[0].body).unwrap();
        let preconditions = if policy == OnDepose::Evict {
            assert_eq!(body["kind"], "Eviction", "{body}");
            &body["deleteOptions"]["preconditions"]
        } else {
            &body["preconditions"]
        };
        assert_eq!(preconditions["uid"], "uid-1", "{body}");
    }
}

/// One pending deletion of pod `web-0` (uid-1, running), attempted against an API
/// server answering `status`, allowed by `may_force`.
async fn attempt_one(
    status: u16,
    may_force: impl Fn(&Pod) -> bool,
) -> (Deposer, Vec<(Target, Outcome)>, Option<Duration>, FakeApi) {
    let (client, seen) = recording_client(status);
    let mut d = Deposer::default();
    d.add(&key(), Target::new("web-0", "web-0", "uid-1", 0));
    let (outcomes, retry) = d
        .attempt(
            &client,
            &key(),
            OnDepose::Delete,
            |_| Some(running_pod("uid-1")),
            may_force,
        )
        .await;
    (d, outcomes, retry, seen)
}

#[tokio::test]
async fn a_pod_that_does_not_declare_the_lease_is_refused_and_left_alone() {
    let (d, outcomes, retry, seen) =
        attempt_one(200, |p| crate::cache::declared::declares(p, "l")).await;
    assert!(matches!(outcomes[0].1, Outcome::Refused), "{outcomes:?}");
    assert_eq!(retry, None, "not tried again");
    assert!(seen.requests().is_empty(), "nothing sent");
    assert_eq!(d.recorded(&key()), None);
}

#[tokio::test]
async fn a_replacement_pod_with_the_same_name_ends_the_target_untouched() {
    // The cache still shows the old pod; the server has a new one under the same name.
    let (d, outcomes, retry, seen) = attempt_one(409, |_| true).await;
    assert!(matches!(outcomes[0].1, Outcome::Stopped), "{outcomes:?}");
    assert_eq!(retry, None, "nothing left to retry");
    assert_eq!(seen.requests().len(), 1);
    assert_eq!(d.recorded(&key()), None);
}

/// The review's laundering sequence: an entry written by hand must not pass into the
/// record an assignment writes as arbiter's own.
#[test]
fn a_deposing_write_carries_on_only_what_arbiter_recorded() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
    let owned_by = |manager: &str| ManagedFieldsEntry {
        manager: Some(manager.into()),
        fields_v1: Some(FieldsV1(serde_json::json!({
            "f:metadata": { "f:annotations": { "f:arbiter.dev/pending-forced-exits": {} } },
        }))),
        ..ManagedFieldsEntry::default()
    };
    let deposed = Target::new("a", "a-pod", "uid-a", 0);
    let mut l = Lease::default();
    arbiter_api::lease::set_annotation(&mut l, PENDING_ANNOTATION, Some("x/standby/uid-s/0"));
    l.metadata.managed_fields = Some(vec![owned_by("kubectl-annotate")]);
    record_on(&mut l, Some(&deposed), |_| false);
    assert_eq!(
        l.annotations().get(PENDING_ANNOTATION).map(String::as_str),
        Some("a/a-pod/uid-a/0"),
        "the hand-written entry is dropped"
    );
    let mut ours = Lease::default();
    arbiter_api::lease::set_annotation(&mut ours, PENDING_ANNOTATION, Some("x/old/uid-o/1"));
    ours.metadata.managed_fields = Some(vec![owned_by(arbiter_api::FIELD_MANAGER)]);
    record_on(&mut ours, Some(&deposed), |_| false);
    assert_eq!(
        ours.annotations()
            .get(PENDING_ANNOTATION)
            .map(String::as_str),
        Some("a/a-pod/uid-a/0,x/old/uid-o/1")
    );
}

#[test]
fn a_deposing_write_records_the_deposed_pod_once_and_spares_the_new_holder() {
    let none = |_: &Target| false;
    let t = Target::new("web-0", "web-0", "uid-0", 2);
    let one = recorded_with(None, Some(&t), none).unwrap();
    assert_eq!(one, "web-0/web-0/uid-0/2");
    assert_eq!(recorded_with(Some(&one), Some(&t), none).unwrap(), one);
    let other = Target::new("web-1", "web-1", "uid-1", 0);
    let two = recorded_with(Some(&one), Some(&other), none).unwrap();
    assert_eq!(two, "web-0/web-0/uid-0/2,web-1/web-1/uid-1/0");
    // web-0 deposed again after a restart: the newer count stands, an older one never.
    let again = Target::new("web-0", "web-0", "uid-0", 3);
    let newer = recorded_with(Some(&two), Some(&again), none).unwrap();
    assert_eq!(newer, "web-0/web-0/uid-0/3,web-1/web-1/uid-1/0");
    assert_eq!(recorded_with(Some(&newer), Some(&t), none).unwrap(), newer);
    // web-1 is given the term: its pending forced exit goes with the same write.
    let spared = recorded_with(Some(&two), None, |t| t.candidate == "web-1");
    assert_eq!(spared.as_deref(), Some("web-0/web-0/uid-0/2"));
    assert_eq!(recorded_with(Some(&spared.unwrap()), None, |_| true), None);
}

#[test]
fn a_pod_deposed_again_after_a_restart_is_forced_out_again() {
    let key = key();
    let mut d = Deposer::default();
    d.done.insert(("uid-a".into(), 1));
    // Its first forced exit ended (at 1 restart); deposed again at 2.
    d.add(&key, Target::new("a", "a", "uid-a", 1));
    assert_eq!(d.recorded(&key), None);
    d.add(&key, Target::new("a", "a", "uid-a", 2));
    assert_eq!(d.recorded(&key).as_deref(), Some("a/a/uid-a/2"));
    // An annotation with the older count does not replace it.
    d.restore(&key, Some("a/a/uid-a/1"), |_| true);
    assert_eq!(d.recorded(&key).as_deref(), Some("a/a/uid-a/2"));
    // Given the term again: spared.
    d.spare(&key, |t| t.uid == "uid-a");
    assert_eq!(d.recorded(&key), None);
}

#[test]
fn pending_targets_round_trip_through_the_annotation() {
    let key = key();
    let mut d = Deposer::default();
    assert_eq!(d.recorded(&key), None);
    d.add(&key, Target::new("c-a", "pod-a", "uid-a", 2));
    d.add(&key, Target::new("c-b", "pod-b", "uid-b", 0));
    let recorded = d.recorded(&key).unwrap();
    assert_eq!(recorded, "c-a/pod-a/uid-a/2,c-b/pod-b/uid-b/0");
    let mut other = Deposer::default();
    other.restore(&key, Some(&recorded), |_| true);
    assert_eq!(other.recorded(&key).as_deref(), Some(recorded.as_str()));
    other.restore(&key, Some("garbage,a/b/c/notanumber,/x//1"), |_| true);
    let mut picky = Deposer::default();
    picky.restore(&key, Some(&recorded), |t| t.uid == "uid-b");
    assert_eq!(picky.recorded(&key).as_deref(), Some("c-b/pod-b/uid-b/0"));
    assert_eq!(other.recorded(&key).as_deref(), Some(recorded.as_str()));
    // A finished target is not brought back by a stale annotation.
    other.done.insert(("uid-a".into(), 2));
    let mut fresh = Deposer {
        done: other.done.clone(),
        ..Deposer::default()
    };
    fresh.restore(&key, Some(&recorded), |_| true);
    assert_eq!(fresh.recorded(&key).as_deref(), Some("c-b/pod-b/uid-b/0"));
}
