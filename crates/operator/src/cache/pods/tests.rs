use std::collections::BTreeMap;

use futures::FutureExt;

use super::*;

fn pod(name: &str, uid: &str, rv: u64, phase: &str) -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some(name.into());
    p.metadata.namespace = Some("ns".into());
    p.metadata.uid = Some(uid.into());
    p.metadata.resource_version = Some(rv.to_string());
    p.status = Some(k8s_openapi::api::core::v1::PodStatus {
        phase: Some(phase.into()),
        ..Default::default()
    });
    p
}

fn phase(p: &Pod) -> String {
    p.status.as_ref().unwrap().phase.clone().unwrap()
}

/// A cache following the uids in the returned set.
fn cache() -> (
    FollowedPods,
    mpsc::UnboundedReceiver<Fetch>,
    Arc<Mutex<HashSet<String>>>,
) {
    let followed: Arc<Mutex<HashSet<String>>> = Arc::default();
    let f = followed.clone();
    let (pods, rx) = FollowedPods::new(
        Arc::new(move |p: &Pod| f.lock().unwrap().contains(&p.uid().unwrap())),
        1,
        Gauge::default(),
    );
    (pods, rx, followed)
}

fn fetch_of(name: &str, uid: &str) -> Fetch {
    Fetch::Pod {
        namespace: "ns".into(),
        name: name.into(),
        uid: uid.into(),
    }
}

fn listed(pods: &FollowedPods, items: Vec<Pod>) {
    pods.apply_event(watcher::Event::Init);
    for p in items {
        pods.apply_event(watcher::Event::InitApply(p));
    }
    pods.apply_event(watcher::Event::InitDone);
}

#[test]
fn only_followed_pods_are_kept_and_a_kept_pod_is_followed_to_its_end() {
    let (pods, _rx, followed) = cache();
    followed.lock().unwrap().insert("u-a".into());
    listed(
        &pods,
        vec![pod("a", "u-a", 1, "Running"), pod("b", "u-b", 2, "Running")],
    );
    assert!(pods.get("ns", "a").is_some());
    assert!(pods.get("ns", "b").is_none());
    assert_eq!(pods.count(), 1);
    // An unfollowed pod's events are dropped, and say nothing.
    assert!(
        pods.apply_event(watcher::Event::Apply(pod("b", "u-b", 3, "Failed")))
            .is_none()
    );
    // Its candidate gone, the pod is still followed until it is deleted.
    followed.lock().unwrap().clear();
    let seen = pods.apply_event(watcher::Event::Apply(pod("a", "u-a", 4, "Failed")));
    assert_eq!(
        seen.map(|(p, d)| (phase(&p), d)),
        Some(("Failed".into(), false))
    );
    let seen = pods.apply_event(watcher::Event::Delete(pod("a", "u-a", 5, "Failed")));
    assert_eq!(seen.map(|(_, d)| d), Some(true));
    assert_eq!(pods.count(), 0);
}

#[test]
fn a_fetch_never_replaces_a_newer_pod_nor_brings_back_a_deleted_one() {
    let (pods, _rx, followed) = cache();
    listed(&pods, vec![]);
    followed
        .lock()
        .unwrap()
        .extend(["u-a".to_string(), "u-b".to_string()]);
    pods.apply_event(watcher::Event::Apply(pod("a", "u-a", 10, "Failed")));
    let fetch = fetch_of("a", "u-a");
    assert!(
        pods.done(&fetch, vec![pod("a", "u-a", 9, "Running")])
            .is_empty()
    );
    assert_eq!(phase(&pods.get("ns", "a").unwrap()), "Failed");
    // Deleted while a fetch that read it was on its way back.
    pods.apply_event(watcher::Event::Delete(pod("b", "u-b", 11, "Running")));
    let fetch = fetch_of("b", "u-b");
    assert!(
        pods.done(&fetch, vec![pod("b", "u-b", 8, "Running")])
            .is_empty()
    );
    assert!(pods.get("ns", "b").is_none());
    // A late deletion of an earlier same-name pod leaves the new one alone.
    followed.lock().unwrap().insert("u-b2".into());
    pods.done(
        &fetch_of("b", "u-b2"),
        vec![pod("b", "u-b2", 13, "Running")],
    );
    pods.apply_event(watcher::Event::Delete(pod("b", "u-b1", 14, "Running")));
    assert_eq!(
        pods.get("ns", "b").and_then(|p| p.uid()).as_deref(),
        Some("u-b2")
    );
    // A newer fetched pod is taken in.
    let fetch = fetch_of("a", "u-a");
    assert_eq!(
        pods.done(&fetch, vec![pod("a", "u-a", 12, "Succeeded")])
            .len(),
        1
    );
    assert_eq!(phase(&pods.get("ns", "a").unwrap()), "Succeeded");
}

#[test]
fn a_candidates_pod_is_fetched_once_after_the_first_list_and_not_when_gone() {
    let (pods, mut rx, followed) = cache();
    // Before the first list: the list brings it.
    pods.need_pod("ns", "a", "u-a");
    assert!(rx.try_recv().is_err());
    listed(&pods, vec![]);
    followed.lock().unwrap().insert("u-a".into());
    pods.need_pod("ns", "a", "u-a");
    pods.need_pod("ns", "a", "u-a");
    let fetch = rx.try_recv().unwrap();
    assert!(rx.try_recv().is_err(), "asked twice");
    // Not found: remembered as gone, not asked again.
    assert!(pods.done(&fetch, vec![]).is_empty());
    pods.need_pod("ns", "a", "u-a");
    assert!(rx.try_recv().is_err());
    // A kept pod is not fetched.
    pods.apply_event(watcher::Event::Apply(pod("c", "u-c", 3, "Running")));
    followed.lock().unwrap().insert("u-c".into());
    pods.apply_event(watcher::Event::Apply(pod("c", "u-c", 4, "Running")));
    pods.need_pod("ns", "c", "u-c");
    assert!(rx.try_recv().is_err());
}

#[test]
fn a_workloads_pods_are_loaded_once_listed() {
    let (pods, mut rx, followed) = cache();
    let selector: Selector = BTreeMap::from([("app".to_string(), "web".to_string())])
        .into_iter()
        .collect();
    assert!(!pods.loaded("ns", &selector));
    pods.need_selected("ns", &selector);
    pods.need_selected("ns", &selector);
    let fetch = rx.try_recv().unwrap();
    assert!(rx.try_recv().is_err());
    followed.lock().unwrap().insert("u-w".into());
    let kept = pods.done(&fetch, vec![pod("w", "u-w", 1, "Running")]);
    assert_eq!(kept.len(), 1);
    assert!(pods.loaded("ns", &selector));
    assert_eq!(pods.in_namespace("ns").len(), 1);
    // Forgotten (the annotation removed): listed again when needed again, and a list that
    // was on its way when it was forgotten does not count.
    pods.forget_selected("ns", &selector);
    assert!(!pods.loaded("ns", &selector));
    pods.need_selected("ns", &selector);
    let on_its_way = rx.try_recv().unwrap();
    pods.forget_selected("ns", &selector);
    pods.done(&on_its_way, vec![]);
    assert!(!pods.loaded("ns", &selector));
    pods.need_selected("ns", &selector);
    let again = rx.try_recv().unwrap();
    pods.done(&again, vec![]);
    assert!(pods.loaded("ns", &selector));
    // A re-list keeps what is followed, including what was fetched.
    listed(
        &pods,
        vec![pod("w", "u-w", 2, "Running"), pod("x", "u-x", 2, "Running")],
    );
    assert_eq!(pods.in_namespace("ns").len(), 1);
    assert!(pods.wait_until_ready().now_or_never().is_some());
}

#[test]
fn each_namespaces_watch_relists_its_own_pods_and_all_must_list_before_ready() {
    let (pods, _rx) = FollowedPods::new(Arc::new(|_| true), 2, Gauge::default());
    let in_ns = |ns: &str, name: &str, uid: &str| {
        let mut p = pod(name, uid, 1, "Running");
        p.metadata.namespace = Some(ns.into());
        p
    };
    let list = |scope: &str, items: Vec<Pod>| {
        pods.apply_event_in(Some(scope), watcher::Event::Init);
        for p in items {
            pods.apply_event_in(Some(scope), watcher::Event::InitApply(p));
        }
        pods.apply_event_in(Some(scope), watcher::Event::InitDone);
    };
    list("a", vec![in_ns("a", "p", "u-a")]);
    assert!(
        pods.wait_until_ready().now_or_never().is_none(),
        "b has not listed"
    );
    list("b", vec![in_ns("b", "q", "u-b")]);
    assert!(pods.wait_until_ready().now_or_never().is_some());
    // a relists empty: b's pod stays.
    list("a", vec![]);
    assert!(pods.get("a", "p").is_none());
    assert!(pods.get("b", "q").is_some());
}
