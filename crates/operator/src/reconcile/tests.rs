//! A reconcile's phases end to end without a cluster: the caches fed by hand
//! ([`crate::cache::feed`]), the API server a script ([`crate::fake_api`]). What is
//! checked is the requests a reconcile makes (the planned writes), never behaviour against a
//! real API server: that is the e2e suite's.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::ResourceExt;
use kube::runtime::events::Reporter;

use crate::report::Recorder;
use serde_json::{Value, json};

use super::Worker;
use crate::cache::feed::Feed;
use crate::fake_api::{Answer, FakeApi, Request};
use crate::key::LeaseKey;
use crate::metrics::Metrics;
use arbiter_api::{INCARNATION_ANNOTATION, LeaseCandidate};

/// A candidate `name` for lease `l` in namespace `ns` at `version`, as its agent registered it.
fn candidate(name: &str, version: &str, rv: u64) -> LeaseCandidate {
    let mut c = crate::test_candidate(name, "l");
    c.spec.binary_version = version.into();
    c.spec.emulation_version = Some(version.into());
    c.spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
    c.metadata.namespace = Some("ns".into());
    c.metadata.uid = Some(format!("uid-{name}"));
    c.metadata.resource_version = Some(rv.to_string());
    c.metadata.creation_timestamp = Some(Time(jiff::Timestamp::now()));
    c.metadata.annotations = Some(BTreeMap::from([(
        INCARNATION_ANNOTATION.to_string(),
        format!("{name}-1"),
    )]));
    c
}

/// The stand-in API server: candidates are answered as the test last gave them (a ping's
/// answer carries the ping and a new resource version), term marks start empty (unless the
/// test sets a shard), and whatever is created or written comes back as sent, with a resource
/// version.
struct Server {
    candidates: Arc<Mutex<BTreeMap<String, LeaseCandidate>>>,
    /// The last Lease created or written, as the server answered it.
    lease: Arc<Mutex<Option<Lease>>>,
    /// The pods a list returns.
    pods: Arc<Mutex<Vec<Pod>>>,
    /// The term marks a read of a shard returns (none: the shard does not exist).
    marks: Arc<Mutex<Option<BTreeMap<String, String>>>>,
    /// Labelling a pod fails (a server error).
    pod_patches_fail: Arc<std::sync::atomic::AtomicBool>,
    api: FakeApi,
}

impl Server {
    fn start(candidates: &[&LeaseCandidate]) -> (kube::Client, Server) {
        let known: BTreeMap<String, LeaseCandidate> = candidates
            .iter()
            .map(|c| (c.metadata.name.clone().unwrap(), (*c).clone()))
            .collect();
        let known = Arc::new(Mutex::new(known));
        let version = Arc::new(Mutex::new(100u64));
        let lease = Arc::new(Mutex::new(None));
        let pods: Arc<Mutex<Vec<Pod>>> = Arc::default();
        let marks: Arc<Mutex<Option<BTreeMap<String, String>>>> = Arc::default();
        let pod_patches_fail: Arc<std::sync::atomic::AtomicBool> = Arc::default();
        let (state, next, last, listed, shard, failing) = (
            known.clone(),
            version.clone(),
            lease.clone(),
            pods.clone(),
            marks.clone(),
            pod_patches_fail.clone(),
        );
        let (client, api) = FakeApi::new(move |r: &Request| {
            let mut next = next.lock().unwrap();
            *next += 1;
            let rv = next.to_string();
            let name = r.path.rsplit('/').next().unwrap_or_default().to_string();
            match (r.method.as_str(), r.path.as_str()) {
                ("PATCH", p) if p.contains("/leasecandidates/") && !p.ends_with("/status") => {
                    let mut known = state.lock().unwrap();
                    let c = known.get_mut(&name).expect("a known candidate");
                    let patch: Value = serde_json::from_str(&r.body).unwrap();
                    if let Some(at) = patch["spec"]["pingTime"].as_str() {
                        c.spec.ping_time = Some(MicroTime(at.parse().unwrap()));
                    }
                    c.metadata.resource_version = Some(rv);
                    Answer::ok(serde_json::to_value(&*c).unwrap())
                }
                ("PATCH", p) if p.ends_with("/status") => {
                    let name = p.trim_end_matches("/status").rsplit('/').next().unwrap();
                    Answer::ok(serde_json::to_value(&state.lock().unwrap()[name]).unwrap())
                }
                ("GET", p) if p.contains("/configmaps/") => match &*shard.lock().unwrap() {
                    Some(data) => Answer::ok(json!({
                        "apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv},
                        "data": data,
                    })),
                    None => Answer::status(404, "NotFound", "configmaps not found"),
                },
                ("POST", _) | ("PUT", _) => {
                    let mut obj: Value = serde_json::from_str(&r.body).unwrap();
                    obj["metadata"]["resourceVersion"] = json!(rv);
                    if r.path.contains("/leases") {
                        *last.lock().unwrap() = serde_json::from_value(obj.clone()).ok();
                    }
                    if let Ok(c) = serde_json::from_value::<LeaseCandidate>(obj.clone())
                        && r.path.contains("/leasecandidates")
                    {
                        state
                            .lock()
                            .unwrap()
                            .insert(c.metadata.name.clone().unwrap(), c);
                    }
                    Answer {
                        status: if r.method == "POST" { 201 } else { 200 },
                        body: obj.to_string(),
                    }
                }
                ("GET", p) if p.ends_with("/pods") => Answer::ok(json!({
                    "apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": rv},
                    "items": *listed.lock().unwrap(),
                })),
                // A label on a pod: the pod as patched (or an error, when the test says so).
                ("PATCH", p) if p.contains("/pods/") => {
                    match failing.load(std::sync::atomic::Ordering::SeqCst) {
                        true => Answer::status(500, "InternalError", "pod patches fail"),
                        false => Answer::echo(r, 200),
                    }
                }
                _ => Answer::status(404, "NotFound", "not scripted"),
            }
        });
        (
            client,
            Server {
                candidates: known,
                lease,
                pods,
                marks,
                pod_patches_fail,
                api,
            },
        )
    }

    /// Term marks in the shard, as if an earlier operator had written them.
    fn set_marks(&self, marks: &[(&str, i32)]) {
        let data = marks
            .iter()
            .map(|(lease, mark)| (lease.to_string(), mark.to_string()))
            .collect();
        *self.marks.lock().unwrap() = Some(data);
    }

    /// The candidate as the server has it now (after the arbiter's pings).
    fn candidate(&self, name: &str) -> LeaseCandidate {
        self.candidates.lock().unwrap()[name].clone()
    }

    /// The Lease as the server last answered a write of it.
    fn lease(&self) -> Lease {
        self.lease
            .lock()
            .unwrap()
            .clone()
            .expect("a Lease was written")
    }

    /// Requests whose method is `method` and whose path contains `path`.
    fn requests(&self, method: &str, path: &str) -> Vec<Request> {
        self.api
            .requests()
            .into_iter()
            .filter(|r| r.method == method && r.path.contains(path))
            .collect()
    }
}

fn key() -> LeaseKey {
    LeaseKey {
        namespace: "ns".into(),
        name: "l".into(),
    }
}

/// A worker on `feed`'s caches, talking to `client`, with `args` as its flags.
fn worker(client: kube::Client, feed: &Feed, args: &[&str]) -> Worker {
    let settings = crate::validated(args).expect("valid flags");
    let metrics = Arc::new(Metrics::default());
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "arbiter".into(),
            instance: None,
        },
    );
    Worker::new(client, feed.caches.clone(), recorder, settings, metrics)
}

/// An agent answers the arbiter's ping: it writes its candidate again (a new `renewTime`), and
/// the watch delivers that as it happens.
fn answers(feed: &mut Feed, server: &Server, name: &str) {
    let mut c = server.candidate(name);
    c.spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
    let rv: u64 = c
        .metadata
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();
    c.metadata.resource_version = Some((rv + 1000).to_string());
    feed.candidate(&c);
}

/// The one Lease the reconcile created.
fn created(server: &Server) -> Lease {
    let created = server.requests("POST", "/leases");
    assert_eq!(created.len(), 1, "one Lease created");
    serde_json::from_str(&created[0].body).unwrap()
}

/// `old` (1.30.0) and `new` (1.31.0), both seen registering, `first` before the other; a
/// worker on them with `args` as its flags.
fn registered(first: &str, args: &[&str]) -> (Feed, Server, Worker) {
    let (old, new) = (candidate("old", "1.30.0", 1), candidate("new", "1.31.0", 2));
    let mut feed = Feed::new();
    let order = if first == "old" {
        [&old, &new]
    } else {
        [&new, &old]
    };
    for c in order {
        feed.candidate(c);
    }
    let (client, server) = Server::start(&[&old, &new]);
    let worker = worker(client, &feed, args);
    (feed, server, worker)
}

#[tokio::test]
async fn candidates_seen_registering_elect_the_oldest_at_once_its_term_reserved_first() {
    let (_, server, mut worker) = registered("new", &["--settle=0s"]);

    let done = worker.reconcile(&key()).await.unwrap();
    assert!(!done.electing, "elected");
    assert!(
        server.requests("PATCH", "/leasecandidates/").is_empty(),
        "no pings, no statuses (the Lease says who holds it): {:?}",
        server.api.requests()
    );
    let lease = created(&server);
    assert_eq!(arbiter_api::lease::holder(&lease), Some("old"));
    assert_eq!(arbiter_api::lease::term(&lease), 1);
    assert!(arbiter_api::lease::managed(&lease), "labelled as arbiter's");
    let order: Vec<String> = server
        .api
        .requests()
        .iter()
        .filter(|r| r.method == "POST")
        .map(|r| r.path.clone())
        .collect();
    let mark = order.iter().position(|p| p.contains("/configmaps"));
    let write = order.iter().position(|p| p.contains("/leases"));
    assert!(
        mark.is_some() && mark < write,
        "the term is reserved before the Lease names it: {order:?}"
    );
    // One Event for the election, on the new holder (sent in the background).
    let events = events_sent(&server, 1).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(
        events[0].contains("\"reason\":\"Elected\"")
            && events[0].contains("elected holder of lease l at term 1")
            && events[0].contains("\"name\":\"old\""),
        "{events:?}"
    );
}

/// The Events the worker sent, once at least `n` were (or 5 s passed), and a moment more for
/// any beyond them.
async fn events_sent(server: &Server, n: usize) -> Vec<String> {
    let sent = || server.requests("POST", "/events");
    for _ in 0..500 {
        if sent().len() >= n {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    sent().into_iter().map(|r| r.body).collect()
}

#[tokio::test]
async fn candidates_known_only_from_a_list_are_pinged_and_elected_once_they_answer() {
    let (old, new) = (candidate("old", "1.30.0", 1), candidate("new", "1.31.0", 2));
    let mut feed = Feed::new();
    feed.listed(&[&new, &old]);
    let (client, server) = Server::start(&[&old, &new]);
    let mut worker = worker(client, &feed, &["--settle=0s"]);

    // Nothing heard from either: only the one that could win is pinged, and nothing else is
    // written (a first election's statuses wait for its outcome).
    let first = worker.reconcile(&key()).await.unwrap();
    assert!(first.electing, "the election is under way");
    let pinged: Vec<String> = server
        .requests("PATCH", "/leasecandidates/")
        .iter()
        .map(|r| r.path.rsplit('/').next().unwrap().to_string())
        .collect();
    assert_eq!(pinged, ["old"], "{:?}", server.api.requests());
    assert!(
        server.requests("POST", "/leases").is_empty(),
        "no Lease yet"
    );

    // `new` writes its candidate: that answers nothing, and it is not elected while `old`,
    // pinged, may still answer.
    answers(&mut feed, &server, "new");
    worker.reconcile(&key()).await.unwrap();
    assert!(
        server.requests("POST", "/leases").is_empty(),
        "waits for old"
    );

    // `old` answers: the oldest version gets the lease.
    answers(&mut feed, &server, "old");
    worker.reconcile(&key()).await.unwrap();
    assert_eq!(arbiter_api::lease::holder(&created(&server)), Some("old"));
}

/// The arbiter's Lease `l`, held by `holder` at `term`, renewed just now.
fn held_by(holder: &str, term: i32) -> Lease {
    let now = MicroTime(jiff::Timestamp::now());
    let mut l = Lease::default();
    l.metadata.name = Some("l".into());
    l.metadata.namespace = Some("ns".into());
    l.metadata.resource_version = Some("50".into());
    l.metadata.labels = Some(BTreeMap::from([(
        arbiter_api::lease::MANAGED_LABEL.to_string(),
        "true".to_string(),
    )]));
    l.spec = Some(k8s_openapi::api::coordination::v1::LeaseSpec {
        holder_identity: Some(holder.into()),
        lease_duration_seconds: Some(15),
        lease_transitions: Some(term),
        acquire_time: Some(now.clone()),
        renew_time: Some(now),
        strategy: Some(arbiter_api::OLDEST_EMULATION_VERSION.into()),
        ..Default::default()
    });
    l
}

/// The candidates the reconcile pinged (patched, not their status), in order.
fn pinged(server: &Server) -> Vec<String> {
    server
        .requests("PATCH", "/leasecandidates/")
        .iter()
        .filter(|r| !r.path.ends_with("/status"))
        .map(|r| r.path.rsplit('/').next().unwrap().to_string())
        .collect()
}

/// The Leases the reconcile wrote over the existing one.
fn replaced(server: &Server) -> Vec<Lease> {
    server
        .requests("PUT", "/leases/l")
        .iter()
        .map(|r| serde_json::from_str(&r.body).unwrap())
        .collect()
}

#[tokio::test]
async fn an_older_version_registering_beside_a_live_holder_asks_it_to_hand_over() {
    let (old, new) = (candidate("old", "1.30.0", 1), candidate("new", "1.31.0", 2));
    let mut feed = Feed::new();
    feed.candidate(&new);
    feed.lease(&held_by("new", 3));
    feed.candidate(&old);
    let (client, server) = Server::start(&[&old, &new]);
    // No settle before asking (its rule: election::decide's tests).
    let mut worker = worker(client, &feed, &["--settle=0s"]);

    // A live holder is stopped only for a candidate that answered a ping of this term.
    worker.reconcile(&key()).await.unwrap();
    assert_eq!(pinged(&server), ["old"]);
    assert!(
        replaced(&server).is_empty(),
        "no handover before the answer"
    );

    answers(&mut feed, &server, "old");
    worker.reconcile(&key()).await.unwrap();
    let written = replaced(&server);
    assert_eq!(written.len(), 1, "{:?}", server.api.requests());
    assert_eq!(
        arbiter_api::lease::preferred_holder(&written[0]),
        Some("old"),
        "the holder is asked to hand over"
    );
    assert_eq!(
        arbiter_api::lease::holder(&written[0]),
        Some("new"),
        "and keeps its term"
    );
    assert_eq!(arbiter_api::lease::term(&written[0]), 3);
    assert!(server.requests("POST", "/leases").is_empty());
}

#[tokio::test]
async fn a_live_holder_of_the_oldest_version_is_left_alone() {
    let (old, new) = (candidate("old", "1.30.0", 1), candidate("new", "1.31.0", 2));
    let mut feed = Feed::new();
    feed.candidate(&old);
    feed.lease(&held_by("old", 3));
    feed.candidate(&new);
    let (client, server) = Server::start(&[&old, &new]);
    let mut worker = worker(client, &feed, &[]);

    let done = worker.reconcile(&key()).await.unwrap();
    assert!(!done.electing);
    assert!(replaced(&server).is_empty(), "{:?}", server.api.requests());
    assert!(server.requests("POST", "/leases").is_empty());
    assert!(
        server
            .requests("PATCH", "/leasecandidates/")
            .iter()
            .all(|r| r.path.ends_with("/status")),
        "nobody pinged"
    );
}

/// Pod `name` (uid `uid`) running `arbiter run --lease l --identity {candidate}`, in `phase`.
fn agent_pod(name: &str, uid: &str, candidate: &str, phase: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": "1"},
        "spec": {"containers": [{
            "name": "app", "image": "app:1",
            "command": ["arbiter", "run", "--lease", "l", "--identity", candidate, "--", "app"],
        }]},
        "status": {"phase": phase},
    }))
    .unwrap()
}

/// `c` registered from pod `pod` (its owner).
fn in_pod(mut c: LeaseCandidate, pod: &Pod) -> LeaseCandidate {
    c.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: pod.metadata.name.clone().unwrap(),
            uid: pod.metadata.uid.clone().unwrap(),
            ..Default::default()
        },
    ]);
    c
}

/// `old` (1.30.0) registered from its pod `old-0`, running, and `new` (1.31.0) without one,
/// both seen registering; a worker on them that settles for no time.
fn old_in_a_pod_and_new() -> (Pod, Feed, Server, Worker) {
    let pod = agent_pod("old-0", "pod-old", "old", "Running");
    let old = in_pod(candidate("old", "1.30.0", 1), &pod);
    let new = candidate("new", "1.31.0", 2);
    let mut feed = Feed::new();
    feed.pod(&pod);
    feed.candidate(&old);
    feed.candidate(&new);
    let (client, server) = Server::start(&[&old, &new]);
    let worker = worker(client, &feed, &["--settle=0s"]);
    (pod, feed, server, worker)
}

#[tokio::test]
async fn the_stop_of_the_pod_a_term_was_assigned_in_ends_it_at_once() {
    let (_, mut feed, server, mut worker) = old_in_a_pod_and_new();

    worker.reconcile(&key()).await.unwrap();
    let lease = created(&server);
    assert_eq!(arbiter_api::lease::holder(&lease), Some("old"));
    assert_eq!(
        lease
            .annotations()
            .get(arbiter_api::lease::HOLDER_POD_ANNOTATION),
        Some(&"pod-old".to_string()),
        "the term is recorded with the pod it was assigned in"
    );
    feed.lease(&server.lease());

    // Its holder's term runs while its pod does.
    worker.reconcile(&key()).await.unwrap();
    assert!(replaced(&server).is_empty(), "{:?}", server.api.requests());

    // The kubelet reports the pod failed: the term is over, the next candidate elected.
    feed.pod(&agent_pod("old-0", "pod-old", "old", "Failed"));
    worker.reconcile(&key()).await.unwrap();
    let written = replaced(&server);
    assert_eq!(written.len(), 1, "{:?}", server.api.requests());
    assert_eq!(arbiter_api::lease::holder(&written[0]), Some("new"));
    assert_eq!(arbiter_api::lease::term(&written[0]), 2);
}

#[tokio::test]
async fn a_lease_deleted_by_hand_is_not_given_away_while_its_term_may_run() {
    let (mut feed, server, mut worker) = registered("old", &["--settle=0s"]);
    worker.reconcile(&key()).await.unwrap();
    let lease = server.lease();
    feed.lease(&lease);
    worker.reconcile(&key()).await.unwrap();

    // Someone deletes the Lease: the term remembered runs its course, nobody else is named.
    feed.lease_deleted(&lease);
    let waiting = worker.reconcile(&key()).await.unwrap();
    assert_eq!(
        server.requests("POST", "/leases").len(),
        1,
        "no new Lease yet"
    );
    assert!(waiting.electing, "waiting for the term");
    let again = waiting.after.expect("looked at again");
    assert!(
        again > std::time::Duration::from_secs(14)
            && again <= std::time::Duration::from_millis(15_200),
        "at the end of the term (15 s from its last record): {again:?}"
    );
}

/// A replica that becomes active after its predecessor died between a Lease and the status
/// that reports its holder, the Lease since deleted by hand: nothing names a holder, but the
/// term mark says a term was handed out, so that unknown holder's term is waited out (a full
/// duration from this first look); the shard is read once. Without a mark (the test above),
/// the first election is at once.
#[tokio::test]
async fn a_term_mark_with_no_lease_and_no_reported_leader_is_waited_out() {
    let (_, server, mut worker) = registered("old", &["--settle=0s"]);
    server.set_marks(&[("l", 16)]);
    for _ in 0..2 {
        let waiting = worker.reconcile(&key()).await.unwrap();
        assert!(
            server.requests("POST", "/leases").is_empty(),
            "no Lease while an unknown holder's term may run"
        );
        assert!(waiting.electing, "waiting for the term");
        let again = waiting.after.expect("looked at again");
        assert!(
            again > std::time::Duration::from_secs(14)
                && again <= std::time::Duration::from_millis(15_200),
            "at the end of a full lease duration: {again:?}"
        );
    }
    assert_eq!(
        server.requests("GET", "/configmaps/").len(),
        1,
        "the shard read once"
    );
}

#[tokio::test]
async fn the_end_of_the_process_that_took_a_term_ends_it_at_once() {
    let written = process_ends_after_taking_the_term_in("pod-old").await;
    assert_eq!(written.len(), 1);
    assert_eq!(arbiter_api::lease::holder(&written[0]), Some("new"));
}

/// The same end, reported in the recorded pod, of a process that took the term in another pod
/// (a candidate's owner can be re-pointed at a pod that writes the incarnation it read off the
/// Lease as its termination message): no proof, the term runs on.
#[tokio::test]
async fn the_end_of_a_container_the_term_was_not_taken_in_proves_nothing() {
    let written = process_ends_after_taking_the_term_in("pod-elsewhere").await;
    assert!(written.is_empty(), "{written:?}");
}

/// `old` is elected in its pod, its agent takes the term in pod `taken_in`, then the recorded
/// pod's container ends with that process's termination message: the Leases written after.
async fn process_ends_after_taking_the_term_in(taken_in: &str) -> Vec<Lease> {
    let (pod, mut feed, server, mut worker) = old_in_a_pod_and_new();
    worker.reconcile(&key()).await.unwrap();
    feed.lease(&server.lease());
    worker.reconcile(&key()).await.unwrap();

    // The agent renews, stamping its incarnation and the pod it took the term in (as
    // arbiter's field manager writes them).
    let mut renewed: Value = serde_json::to_value(server.lease()).unwrap();
    renewed["metadata"]["resourceVersion"] = json!("900");
    renewed["metadata"]["annotations"][INCARNATION_ANNOTATION] = json!("old-1");
    renewed["metadata"]["annotations"][arbiter_api::lease::TAKEN_IN_POD_ANNOTATION] =
        json!(arbiter_api::lease::taken_in("old-1", taken_in));
    renewed["metadata"]["managedFields"] = json!([{
        "manager": arbiter_api::FIELD_MANAGER, "operation": "Update",
        "apiVersion": "coordination.k8s.io/v1", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:annotations": {
            format!("f:{INCARNATION_ANNOTATION}"): {},
            format!("f:{}", arbiter_api::lease::TAKEN_IN_POD_ANNOTATION): {},
        }}},
    }]);
    feed.lease(&serde_json::from_value(renewed).unwrap());
    worker.reconcile(&key()).await.unwrap();
    assert!(replaced(&server).is_empty(), "{:?}", server.api.requests());

    // Its container restarts; the kubelet reports the end with that process's message.
    let mut restarted: Value = serde_json::to_value(&pod).unwrap();
    restarted["metadata"]["resourceVersion"] = json!("2");
    restarted["status"]["containerStatuses"] = json!([{
        "name": "app", "image": "app:1", "imageID": "", "ready": false, "restartCount": 1,
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {
            "exitCode": 137,
            "message": arbiter_api::lease::termination_message("old-1"),
        }},
    }]);
    feed.pod(&serde_json::from_value(restarted).unwrap());
    worker.reconcile(&key()).await.unwrap();
    replaced(&server)
}

/// Deployment `kv`, annotated single-active for lease `l`, selecting `app=kv`.
fn single_active_deployment() -> k8s_openapi::api::apps::v1::Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": "kv", "namespace": "ns", "uid": "uid-kv",
            "annotations": {
                crate::workloads::SINGLE_ACTIVE_ANNOTATION: "true",
                crate::workloads::LEASE_NAME_ANNOTATION: "l",
            }},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "kv"}},
            "template": {"metadata": {"labels": {"app": "kv"}},
                "spec": {"containers": [{"name": "kv", "image": "kv:1.0.0"}]}},
        },
    }))
    .unwrap()
}

/// A ready pod of `kv` running `image`.
fn kv_pod(name: &str, image: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
            "resourceVersion": "1", "labels": {"app": "kv"}},
        "spec": {"containers": [{"name": "kv", "image": image}]},
        "status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}]},
    }))
    .unwrap()
}

/// Workload `kv`'s pods kv-a (1.31.0) and kv-b (1.30.0), listed after a first reconcile that
/// must wait for them, made candidates by the operator, and those candidates delivered: the
/// next reconcile elects kv-b.
async fn kv_ready_to_elect() -> (Feed, Server, Worker) {
    let (a, b) = (kv_pod("kv-a", "kv:1.31.0"), kv_pod("kv-b", "kv:1.30.0"));
    let mut feed = Feed::new();
    feed.deployment(&single_active_deployment());
    let (client, server) = Server::start(&[]);
    let mut worker = worker(client, &feed, &["--settle=0s"]);

    // Nothing before the workload's pods are listed: a partial list could miss the active one.
    worker.reconcile(&key()).await.unwrap();
    assert!(
        server.api.requests().is_empty(),
        "{:?}",
        server.api.requests()
    );

    // Listed: the operator makes each pod a candidate (it is their agent).
    feed.list_pods(&[a.clone(), b.clone()]);
    *server.pods.lock().unwrap() = vec![a.clone(), b.clone()];
    worker.reconcile(&key()).await.unwrap();
    let made: Vec<LeaseCandidate> = server
        .requests("POST", "/leasecandidates")
        .iter()
        .map(|r| serde_json::from_str(&r.body).unwrap())
        .collect();
    assert_eq!(made.len(), 2, "{:?}", server.api.requests());
    assert!(server.requests("POST", "/leases").is_empty());

    // Its candidates arrive: the oldest version's pod gets the lease, owned by the workload,
    // and only then is it labelled active (the other standby).
    for (i, c) in made.iter().enumerate() {
        let mut c = c.clone();
        c.metadata.namespace = Some("ns".into());
        c.metadata.uid = Some(format!("uid-c{i}"));
        c.metadata.resource_version = Some(format!("{}", 10 + i));
        c.metadata.creation_timestamp = Some(Time(jiff::Timestamp::now()));
        feed.candidate(&c);
    }
    (feed, server, worker)
}

#[tokio::test]
async fn a_single_active_workload_s_oldest_pod_is_promoted_once_its_term_is_written() {
    let (_feed, server, mut worker) = kv_ready_to_elect().await;
    worker.reconcile(&key()).await.unwrap();
    let lease = created(&server);
    assert_eq!(arbiter_api::lease::holder(&lease), Some("kv-b"));
    assert_eq!(
        lease.owner_references().first().map(|o| o.name.as_str()),
        Some("kv")
    );
    let requests = server.api.requests();
    let written = requests
        .iter()
        .position(|r| r.method == "POST" && r.path.contains("/leases"))
        .unwrap();
    let active = requests.iter().position(|r| {
        r.method == "PATCH"
            && r.path.ends_with("/pods/kv-b")
            && r.body.contains(crate::workloads::ACTIVE)
    });
    assert!(
        active.is_some_and(|p| p > written),
        "kv-b labelled active after its term was written: {requests:?}"
    );
    assert!(
        !requests.iter().any(|r| r.path.ends_with("/pods/kv-a")
            && r.body
                .contains(&format!("\"{}\"", crate::workloads::ACTIVE))),
        "kv-a never labelled active"
    );
}

/// A pass that fails part way (here the role labels cannot be written after the term was)
/// still sends the Events it decided: the election is done, and reported.
#[tokio::test]
async fn a_pass_that_fails_part_way_still_sends_its_events() {
    let (_feed, server, mut worker) = kv_ready_to_elect().await;
    (server.pod_patches_fail).store(true, std::sync::atomic::Ordering::SeqCst);
    let failed = worker.reconcile(&key()).await;
    assert!(failed.is_err(), "the labelling failed the reconcile");
    assert_eq!(arbiter_api::lease::holder(&created(&server)), Some("kv-b"));
    let events = events_sent(&server, 1).await;
    assert!(
        events
            .iter()
            .any(|e| e.contains("\"reason\":\"Elected\"") && e.contains("pod kv-b")),
        "{events:?}"
    );
}

#[tokio::test]
async fn a_holder_that_stops_renewing_is_replaced_once_its_term_ran_out_on_the_arbiters_clock() {
    let args = ["--settle=0s", "--lease-duration=1s"];
    let (mut feed, server, mut worker) = registered("old", &args);
    worker.reconcile(&key()).await.unwrap();
    let lease = server.lease();
    assert_eq!(arbiter_api::lease::holder(&lease), Some("old"));
    feed.lease(&lease);

    // The holder never renews. Its term runs, on the arbiter's clock, from the record's
    // delivery: the worker is told to look again when it ends.
    let waiting = worker.reconcile(&key()).await.unwrap();
    assert!(replaced(&server).is_empty(), "{:?}", server.api.requests());
    let again = waiting.after.expect("looked at again");
    assert!(
        again <= std::time::Duration::from_millis(1_200),
        "at the end of the 1 s term: {again:?}"
    );

    // The arbiter's timer: the term is over. (The wait is the one the worker asked for, on
    // the monotonic clock the term is judged on.) No write before the successor proves it is
    // alive.
    tokio::time::sleep(again).await;
    let electing = worker.reconcile(&key()).await.unwrap();
    assert!(electing.electing);
    assert!(replaced(&server).is_empty(), "{:?}", server.api.requests());
    assert_eq!(pinged(&server), ["new"]);

    answers(&mut feed, &server, "new");
    worker.reconcile(&key()).await.unwrap();
    let written = replaced(&server);
    assert_eq!(written.len(), 1, "{:?}", server.api.requests());
    assert_eq!(arbiter_api::lease::holder(&written[0]), Some("new"));
    assert_eq!(arbiter_api::lease::term(&written[0]), 2);
}

/// A declared lease duration is a claim: one longer than a Lease can hold counts as the longest
/// a Lease can hold (what the agent's flag allows), so no deadline computed from it overflows.
#[test]
fn a_declared_duration_is_at_most_what_a_lease_holds() {
    use std::time::Duration;
    let declared = |d: &str| {
        let mut c = candidate("a", "1.30.0", 1);
        (c.metadata.annotations.get_or_insert_default())
            .insert(arbiter_api::LEASE_DURATION_ANNOTATION.into(), d.into());
        super::declared_duration(Some(&std::sync::Arc::new(c)))
    };
    assert_eq!(declared("40"), Duration::from_secs(40));
    assert_eq!(declared("x"), Duration::ZERO);
    let longest = Duration::from_secs(i32::MAX as u64);
    assert_eq!(declared("100000000000"), longest);
    assert_eq!(declared(&u64::MAX.to_string()), longest);
    assert!(std::time::Instant::now().checked_add(longest).is_some());
}
