//! What one write costs kube-apiserver, by kind of request.
//!
//! On this machine the scale bench is bound by kube-apiserver's CPU (it shares two cores with
//! etcd, the operator and the simulator), so an election's cost is the CPU its writes take
//! there, not their number. For each kind of write an election or a candidate makes, this
//! sends [`REQUESTS`] identical requests, [`IN_FLIGHT`] at a time, round [`OBJECTS`] objects,
//! and divides kube-apiserver's CPU seconds over them (from `/proc`), less what it uses idle
//! in the same time, by their number. The bench's audit log is on, as in the scale runs, so its
//! cost is included. Numbers, printed, never asserted. One read is measured beside them: the
//! GET from the API server's cache that every agent makes every 30 s.

use std::path::Path;
use std::time::{Duration, Instant};

use arbiter::api::LeaseCandidate;
use futures::{StreamExt, stream};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ObjectReference};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, CustomResourceExt, ResourceExt};
use serde_json::json;

use crate::{scale, stats, support};

/// Requests of each kind.
const REQUESTS: usize = 2000;
/// Requests in flight at once.
const IN_FLIGHT: usize = 4;
/// Objects the updates go round.
const OBJECTS: usize = 200;
const NS: &str = "bench-write-cost";
/// How often the conditions' two list types are alternated.
const LIST_TYPE_ROUNDS: usize = 3;
/// How long kube-apiserver's idle CPU is measured.
const IDLE: Duration = Duration::from_secs(10);

/// The kinds of write measured, as an election or a candidate makes them.
#[derive(Clone, Copy)]
enum Kind {
    LeaseRenewal,
    LeaseCreate,
    EventCreate,
    ConfigMapUpdate,
    CandidateCreate,
    CandidatePatch,
    CandidateStatusPatch,
    CandidateStatusPatchTwo,
    /// Not a write: an agent's read of its candidate from the API server's cache.
    CandidateCachedGet,
}

impl Kind {
    const ALL: [Kind; 9] = [
        Kind::LeaseRenewal,
        Kind::LeaseCreate,
        Kind::EventCreate,
        Kind::ConfigMapUpdate,
        Kind::CandidateCreate,
        Kind::CandidatePatch,
        Kind::CandidateStatusPatch,
        Kind::CandidateStatusPatchTwo,
        Kind::CandidateCachedGet,
    ];

    fn describe(self) -> &'static str {
        match self {
            Kind::LeaseRenewal => "update leases (a holder's renewal, compare-and-swap)",
            Kind::LeaseCreate => "create leases (a lease's first election)",
            Kind::EventCreate => "create events",
            Kind::ConfigMapUpdate => "update configmaps (a term mark)",
            Kind::CandidateCreate => "create leasecandidates (a registration)",
            Kind::CandidatePatch => "patch leasecandidates (a ping, or its answer)",
            Kind::CandidateStatusPatch => {
                "patch leasecandidates/status (a candidate's six conditions, as earlier versions wrote them)"
            }
            Kind::CandidateStatusPatchTwo => {
                "patch leasecandidates/status (two conditions: Leader and Eligible only)"
            }
            Kind::CandidateCachedGet => {
                "get leasecandidates, resourceVersion=0 (not a write: an agent's 30 s read from the cache)"
            }
        }
    }
}

/// kube-apiserver's pid, from the `pids` file `cluster.sh up` writes beside the kubeconfig.
pub fn apiserver_pid(kubeconfig: &Path) -> Option<i32> {
    let pids = std::fs::read_to_string(kubeconfig.parent()?.join("pids")).ok()?;
    pids.lines().rev().find_map(|l| {
        let (name, pid) = l.split_once(' ')?;
        (name == "kube-apiserver").then(|| pid.trim().parse().ok())?
    })
}

/// Runs the write-cost bench.
pub async fn run(kubeconfig: &Path) {
    let Some(pid) = apiserver_pid(kubeconfig) else {
        println!("\nwrite cost: skipped (kube-apiserver's pid is not known for a reused cluster)");
        return;
    };
    let client = support::client_for(kubeconfig).await;
    arbiter::api::apply_crds(client.clone(), Duration::from_secs(30))
        .await
        .expect("installing the CRD");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut namespace = Namespace::default();
    namespace.metadata.name = Some(NS.into());
    let _ = namespaces.create(&PostParams::default(), &namespace).await;
    setup(&client).await;
    println!(
        "\nwrite cost: kube-apiserver CPU per request, {REQUESTS} requests of each kind, \
         {IN_FLIGHT} in flight, round {OBJECTS} objects"
    );
    // What kube-apiserver uses with nothing sent (the controller manager, kwok, the node).
    let before = stats::cpu_seconds(pid);
    tokio::time::sleep(IDLE).await;
    let idle = (stats::cpu_seconds(pid) - before) / IDLE.as_secs_f64();
    println!(
        "kube-apiserver idle, subtracted: {:.0}% of a core",
        idle * 100.0
    );
    println!(
        "| request | kube-apiserver CPU per request | ÷ a Lease renewal | requests per second | failed |"
    );
    println!("|---|---|---|---|---|");
    let mut renewal = None;
    for kind in Kind::ALL {
        let (per, elapsed, failed) = measure(&client, pid, idle, kind).await;
        let base = *renewal.get_or_insert(per);
        println!(
            "| {} | {:.2} ms | {:.2} | {:.0} | {failed} |",
            kind.describe(),
            per * 1000.0,
            per / base,
            REQUESTS as f64 / elapsed
        );
    }
    list_types(&client, pid, idle).await;
    let _ = namespaces.delete(NS, &DeleteParams::background()).await;
}

/// Sends [`REQUESTS`] requests of `kind`; returns kube-apiserver's CPU seconds per request
/// (less its idle CPU), the seconds they took, and how many failed.
async fn measure(client: &Client, pid: i32, idle: f64, kind: Kind) -> (f64, f64, usize) {
    let senders = prepare(client).await;
    let before = stats::cpu_seconds(pid);
    let started = Instant::now();
    let failed = send(client, kind, senders).await;
    let elapsed = started.elapsed().as_secs_f64();
    let per = (stats::cpu_seconds(pid) - before - idle * elapsed) / REQUESTS as f64;
    (per, elapsed, failed)
}

/// The writes on a LeaseCandidate with its conditions as the CRD declares them (an atomic
/// list) and as it declared them up to 1ee1c65 (a list-map keyed by `type`, installed by
/// another field manager; this build's CRD is then applied back as an upgraded operator
/// applies it), alternated [`LIST_TYPE_ROUNDS`] times so that the machine's drift falls on both.
async fn list_types(client: &Client, pid: i32, idle: f64) {
    const KINDS: [Kind; 3] = [
        Kind::CandidatePatch,
        Kind::CandidateStatusPatch,
        Kind::CandidateStatusPatchTwo,
    ];
    let mut sums = [[0.0; 2]; KINDS.len()];
    let mut failures = 0;
    for _ in 0..LIST_TYPE_ROUNDS {
        for (column, map) in [(0, true), (1, false)] {
            if let Err(e) = set_list_type(client, map).await {
                println!("\nconditions' list type: skipped ({e:#})");
                // Never leave the cluster with the list-map for the benches after this one.
                let restored = arbiter::api::apply_crds(client.clone(), Duration::from_secs(30));
                restored.await.expect("restoring this build's CRD");
                return;
            }
            // Unmeasured: the first write to each object under the other list type converts
            // its managed fields, a one-off cost of the switch, not of either list type.
            measure(client, pid, idle, Kind::CandidatePatch).await;
            for (row, kind) in KINDS.into_iter().enumerate() {
                let (per, _, failed) = measure(client, pid, idle, kind).await;
                sums[row][column] += per;
                failures += failed;
            }
        }
    }
    println!(
        "\nconditions as a list-map keyed by type (the CRD up to 1ee1c65) and as an atomic \
         list (now), {LIST_TYPE_ROUNDS} rounds alternated, mean kube-apiserver CPU per request \
         ({failures} requests failed)"
    );
    println!("| request | list-map | atomic | atomic ÷ list-map |");
    println!("|---|---|---|---|");
    for (row, kind) in KINDS.into_iter().enumerate() {
        let [map, atomic] = sums[row].map(|s| s / LIST_TYPE_ROUNDS as f64);
        println!(
            "| {} | {:.2} ms | {:.2} ms | {:.2} |",
            kind.describe(),
            map * 1000.0,
            atomic * 1000.0,
            atomic / map
        );
    }
}

/// Declares the conditions a list-map (`map`) or an atomic list, and waits until a status
/// write is tracked that way (the API server picks a CRD's new schema up asynchronously).
async fn set_list_type(client: &Client, map: bool) -> anyhow::Result<()> {
    if map {
        // As the CRD was up to 1ee1c65, installed by another field manager than the
        // operator's (as `kubectl apply` or helm would have).
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        let path =
            "/spec/versions/0/schema/openAPIV3Schema/properties/status/properties/conditions";
        let patch = json!([
            {"op": "replace", "path": format!("{path}/x-kubernetes-list-type"), "value": "map"},
            {"op": "add", "path": format!("{path}/x-kubernetes-list-map-keys"), "value": ["type"]},
        ]);
        crds.patch(
            LeaseCandidate::crd_name(),
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(patch)?),
        )
        .await?;
    } else {
        // Back to this build's CRD the way an upgraded operator applies it (`--install-crds`).
        arbiter::api::apply_crds(client.clone(), Duration::from_secs(30)).await?;
    }
    // A list-map's managed fields name each condition by its key; an atomic list's do not.
    let candidates: Api<LeaseCandidate> = Api::namespaced(client.clone(), NS);
    let deadline = Instant::now() + Duration::from_secs(60);
    for flip in 0.. {
        let patch = json!({ "status": { "conditions": conditions(flip % 2 == 0) } });
        let c = candidates
            .patch_status("c0", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        let tracked = c.managed_fields().iter().any(|m| {
            m.subresource.as_deref() == Some("status")
                && m.fields_v1
                    .as_ref()
                    .is_some_and(|f| f.0.to_string().contains("k:{\\\"type\\\""))
        });
        if tracked == map {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the API server did not take the {} list up within 60 s",
            if map { "list-map" } else { "atomic" }
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    unreachable!()
}

/// [`OBJECTS`] Leases, LeaseCandidates and ConfigMaps to update.
async fn setup(client: &Client) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    let candidates: Api<LeaseCandidate> = Api::namespaced(client.clone(), NS);
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    stream::iter(0..OBJECTS)
        .for_each_concurrent(IN_FLIGHT, |i| {
            let (leases, candidates, maps) = (&leases, &candidates, &maps);
            async move {
                let pp = PostParams::default();
                let _ = leases.create(&pp, &lease(&format!("l{i}"))).await;
                let _ = candidates
                    .create(
                        &pp,
                        &scale::candidate(&format!("c{i}"), &format!("lease-of-c{i}")),
                    )
                    .await;
                let _ = maps.create(&pp, &config_map(&format!("m{i}"), 0)).await;
            }
        })
        .await;
}

/// One sender's objects (every [`IN_FLIGHT`]th), with the latest Lease and ConfigMap of each
/// for its compare-and-swap updates.
struct Sender {
    mine: Vec<usize>,
    leases: Vec<Option<Lease>>,
    maps: Vec<Option<ConfigMap>>,
}

/// Reads each sender's objects (before the CPU is counted).
async fn prepare(client: &Client) -> Vec<Sender> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let mut senders = Vec::new();
    for sender in 0..IN_FLIGHT {
        let mine: Vec<usize> = (sender..OBJECTS).step_by(IN_FLIGHT).collect();
        let mut s = Sender {
            mine,
            leases: Vec::new(),
            maps: Vec::new(),
        };
        for &i in &s.mine {
            s.leases.push(leases.get(&format!("l{i}")).await.ok());
            s.maps.push(maps.get(&format!("m{i}")).await.ok());
        }
        senders.push(s);
    }
    senders
}

/// Sends [`REQUESTS`] requests of `kind`; returns how many failed. Each of the
/// [`IN_FLIGHT`] senders has its own objects, so that its compare-and-swaps do not conflict.
async fn send(client: &Client, kind: Kind, senders: Vec<Sender>) -> usize {
    let per_sender = REQUESTS / IN_FLIGHT;
    let results = futures::future::join_all(senders.into_iter().enumerate().map(|(sender, s)| {
        let client = client.clone();
        async move {
            let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
            let candidates: Api<LeaseCandidate> = Api::namespaced(client.clone(), NS);
            let maps: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
            let events: Api<Event> = Api::namespaced(client.clone(), NS);
            let Sender {
                mine,
                leases: mut latest_leases,
                maps: mut latest_maps,
            } = s;
            let pp = PostParams::default();
            let mut failed = 0;
            for r in 0..per_sender {
                let slot = r % mine.len();
                let i = mine[slot];
                let unique = format!("s{sender}-{r}-{}", std::process::id());
                let ok = match kind {
                    Kind::LeaseRenewal => match latest_leases[slot].take() {
                        Some(mut l) => {
                            l.spec.get_or_insert_with(Default::default).renew_time =
                                Some(arbiter::lease::now());
                            let written = leases.replace(&l.name_any(), &pp, &l).await.ok();
                            let ok = written.is_some();
                            latest_leases[slot] = written;
                            ok
                        }
                        None => false,
                    },
                    Kind::LeaseCreate => leases.create(&pp, &lease(&unique)).await.is_ok(),
                    Kind::EventCreate => events.create(&pp, &event(&unique, i)).await.is_ok(),
                    Kind::ConfigMapUpdate => match latest_maps[slot].take() {
                        Some(mut m) => {
                            m.data = config_map(&m.name_any(), r).data;
                            let written = maps.replace(&m.name_any(), &pp, &m).await.ok();
                            let ok = written.is_some();
                            latest_maps[slot] = written;
                            ok
                        }
                        None => false,
                    },
                    Kind::CandidateCreate => candidates
                        .create(
                            &pp,
                            &scale::candidate(&unique, &format!("lease-of-{unique}")),
                        )
                        .await
                        .is_ok(),
                    Kind::CandidatePatch => {
                        let patch = json!({ "spec": { "pingTime": arbiter::lease::now() } });
                        candidates
                            .patch(
                                &format!("c{i}"),
                                &PatchParams::default(),
                                &Patch::Merge(&patch),
                            )
                            .await
                            .is_ok()
                    }
                    Kind::CandidateCachedGet => candidates
                        .get_with(&format!("c{i}"), &kube::api::GetParams::any())
                        .await
                        .is_ok(),
                    Kind::CandidateStatusPatch | Kind::CandidateStatusPatchTwo => {
                        // Each pass round the objects flips the Leader condition: a real
                        // change each time (an unchanged status is not written to etcd).
                        let leader = (r / mine.len()) % 2 == 0;
                        let mut conditions = conditions(leader);
                        if let (Kind::CandidateStatusPatchTwo, Some(all)) =
                            (kind, conditions.as_array_mut())
                        {
                            all.truncate(2);
                        }
                        let patch = json!({ "status": { "conditions": conditions } });
                        candidates
                            .patch_status(
                                &format!("c{i}"),
                                &PatchParams::default(),
                                &Patch::Merge(&patch),
                            )
                            .await
                            .is_ok()
                    }
                };
                failed += usize::from(!ok);
            }
            failed
        }
    }))
    .await;
    results.into_iter().sum()
}

fn lease(name: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(format!("{name}-c0")),
            lease_duration_seconds: Some(60),
            renew_time: Some(arbiter::lease::now()),
            lease_transitions: Some(0),
            ..Default::default()
        }),
    }
}

/// A term shard's shape: one key per lease, its high-water mark.
fn config_map(name: &str, round: usize) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(
            (0..20)
                .map(|k| (format!("lease-{k}"), (round + k).to_string()))
                .collect(),
        ),
        ..Default::default()
    }
}

/// An Event as the operator's recorder creates it (`events.k8s.io/v1`).
fn event(name: &str, i: usize) -> Event {
    Event {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        event_time: Some(MicroTime(jiff::Timestamp::now())),
        action: Some("Elected".into()),
        reason: Some("Elected".into()),
        note: Some(format!("elected holder of lease l{i} at term 1")),
        type_: Some("Normal".into()),
        reporting_controller: Some("arbiter".into()),
        reporting_instance: Some("bench".into()),
        regarding: Some(ObjectReference {
            api_version: Some("arbiter.dev/v1alpha1".into()),
            kind: Some("LeaseCandidate".into()),
            name: Some(format!("c{i}")),
            namespace: Some(NS.into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The conditions the operator writes on a candidate (a holder's, or another's), Eligible and
/// Leader first.
fn conditions(leader: bool) -> serde_json::Value {
    let at = jiff::Timestamp::now().round(jiff::Unit::Second).unwrap();
    let condition = |type_: &str, status: bool, reason: &str, message: &str| {
        json!({
            "type": type_,
            "status": if status { "True" } else { "False" },
            "reason": reason,
            "message": message,
            "lastTransitionTime": at.to_string(),
        })
    };
    json!([
        condition("Eligible", true, "Eligible", "can be elected"),
        if leader {
            condition("Leader", true, "Holder", "holds lease l0 at term 1")
        } else {
            condition("Leader", false, "NotHolder", "does not hold lease l0")
        },
        condition("StrategyConflict", false, "NoConflict", "strategies agree"),
        condition(
            "SkewViolation",
            false,
            "WithinSkew",
            "within the allowed version skew"
        ),
        condition(
            "DuplicateIdentity",
            false,
            "UniqueIdentity",
            "one process uses this identity"
        ),
        condition(
            "DoubleHolder",
            false,
            "NoOverrun",
            "no workload of this candidate is known to have outlived its term"
        ),
    ])
}
